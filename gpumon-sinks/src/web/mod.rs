//! The live web view: one page that shows every GPU, live, without Prometheus or Grafana.
//!
//! [`WebSink`] is a [`Sink`]: every snapshot the agent exports goes to a bounded history (for
//! the charts) and, as a Server-Sent Event, to every open page. It serves, on one listener
//! (the HTTP server, limits, auth and TLS it shares with the Prometheus endpoint: `crate::http`):
//!
//! | path | what |
//! |---|---|
//! | `/` | the page: the sample's age and one state (live, stale, failed, waiting to reconnect), a card per device (`data-gpu-uuid`; MIG instances labelled by parent and profile) with live charts (utilisation, memory, power, temperature, SM clock) and a detail view, an overview of every device, host summary, findings grouped per kind, processes, training steps, a banner for simulated data |
//! | `/api/snapshot` | the latest snapshot, JSON (as `gpumon_core::Snapshot` serialises); 503 before the first and while the last sample failed |
//! | `/api/history?seconds=N` | charted values of the last N seconds (default 300), from a ring of [`WebConfig::history`] samples |
//! | `/api/stream` | `text/event-stream`: the latest snapshot at once, then one `snapshot` event per tick — the snapshot as the page draws it (NVLink totals, no per-link data, windows or GPM) |
//!
//! Every answer is gzip-compressed when the client accepts it; the live stream is one gzip
//! stream, flushed after every event, whose compressed events are made once per tick and view
//! and shared by every client (see `docs/web.md`).
//!
//! Tenants ([`WebConfig::tenants`]): a request with a tenant's credential gets that tenant's
//! view on every data route — the snapshot, the history (each point holds only the GPUs the
//! tenant held at that tick) and the live stream (rendered per tenant, sent only to its
//! clients) — as the Prometheus endpoint does; see `docs/tenancy.md`. In a browser, use Basic
//! credentials (a browser asks for them; `EventSource` then sends them along).
//!
//! Safety: GET and HEAD only; a Content-Security-Policy without inline script (`script-src
//! 'self'`); the page puts names into the DOM as text only. At most [`WebConfig::max_clients`]
//! live streams, each with a queue of [`WebConfig::client_buffer`] events: a client that falls
//! behind is disconnected and counted in the sink's `dropped` ([`gpumon_core::SinkStatus`]), so
//! sampling never waits for a browser.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpumon_sinks::web::{WebConfig, WebSink};
//! let mut config = WebConfig::default();
//! config.listen = Some("127.0.0.1:0".parse()?);
//! let sink = WebSink::from_config(&config)?;
//! println!("open http://{}/", sink.local_addr().unwrap());
//! # Ok(()) }
//! ```
//!
//! [`Sink`]: gpumon_core::Sink

mod assets;
mod config;
mod hub;
mod page;
mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

use gpumon_core::{BuildError, Snapshot, Telemetry};

pub use assets::{page_weight, page_weight_gzip};
pub use config::{WebConfig, DEFAULT_LISTEN};
pub use serve::CSP as CONTENT_SECURITY_POLICY;

use crate::http::access::Access;
use crate::http::server::{Server, Settings};
use crate::http::serving::Serving;
use crate::http::tenants;
use hub::Hub;

/// `SO_SNDBUF` of the web view's sockets: the page's largest file goes out in one go, and a live
/// client that stops reading holds at most this much (twice, as Linux counts) in the kernel.
const SEND_BUFFER: usize = 64 * 1024;

/// A cheap, cloneable view of a [`WebSink`]'s state: for tests, benchmarks and embedders.
#[derive(Clone)]
pub struct WebHandle {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for WebHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebHandle")
            .field("live_clients", &self.live_clients())
            .field("dropped_clients", &self.dropped_clients())
            .finish()
    }
}

impl WebHandle {
    /// Live streams open now.
    pub fn live_clients(&self) -> usize {
        self.hub.live_clients()
    }

    /// Live clients disconnected so far for being too slow.
    pub fn dropped_clients(&self) -> u64 {
        self.hub.dropped_clients()
    }

    /// Takes a snapshot in, as [`Sink::export`](gpumon_core::Sink::export) does (history, latest,
    /// one event per live client). Never waits.
    pub fn publish(&self, snapshot: Arc<Snapshot>) {
        self.hub.publish(snapshot);
    }

    /// Opens a live client in-process, as `/api/stream` does (`None` when
    /// [`WebConfig::max_clients`] are open): the events, as the bytes sent on the wire.
    pub fn subscribe(&self) -> Option<LiveClient> {
        self.hub.subscribe_as(None).ok().map(|c| LiveClient { rx: c.rx })
    }

    /// `/api/history?seconds=N` as JSON (every GPU: the admin's view).
    pub fn history_json(&self, seconds: f64) -> String {
        self.hub.history_json_for(seconds, None)
    }
}

/// An in-process live client ([`WebHandle::subscribe`]).
#[derive(Debug)]
pub struct LiveClient {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
}

impl LiveClient {
    /// The next queued event (Server-Sent Events text), if any; never waits.
    pub fn try_next(&mut self) -> Option<bytes::Bytes> {
        self.rx.try_recv().ok()
    }

    /// The next event; `None` once the client was disconnected (too slow) and drained.
    pub async fn next(&mut self) -> Option<bytes::Bytes> {
        self.rx.recv().await
    }
}

/// The web view sink. See the [module docs](self).
pub struct WebSink {
    hub: Arc<Hub>,
    serving: Serving,
}

impl std::fmt::Debug for WebSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSink")
            .field("local_addr", &self.local_addr())
            .field("shut_down", &self.serving.is_shut_down())
            .finish()
    }
}

impl WebSink {
    /// The sink described by `config`, listening on `config.listen` (default [`DEFAULT_LISTEN`]).
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] naming the key (`web.max_clients`, `web.tls.cert`, …);
    /// [`BuildError::Io`] when the address cannot be bound or a TLS file cannot be read.
    pub fn from_config(config: &WebConfig) -> Result<WebSink, BuildError> {
        config.validate()?;
        let tenants = tenants::resolve("web", config.auth.as_ref(), &config.tenants)?;
        let selectors = tenants.iter().map(|t| t.selector.clone()).collect();
        let sink = Self::with_hub(config, selectors);
        let listener = config.listener();
        let mut settings = Settings::new("web", "web view", &listener, Access::new(config.auth.clone(), tenants))?;
        settings.send_buffer = Some(SEND_BUFFER);
        let addr = listener.listen.unwrap_or(DEFAULT_LISTEN);
        let server = Server::bind(addr, settings, Arc::new(serve::Web(sink.hub.clone())))?;
        Ok(WebSink { serving: Serving::new(Some(server)), ..sink })
    }

    /// The sink without a listener (benchmarks, embedders serving [`WebHandle`] themselves).
    /// `auth`, `tls` and `tenants` belong to the listener and are not used; [`WebHandle`]
    /// serves the unscoped view.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] naming the key.
    pub fn without_listener(config: &WebConfig) -> Result<WebSink, BuildError> {
        config.validate()?;
        Ok(Self::with_hub(config, Vec::new()))
    }

    fn with_hub(config: &WebConfig, tenants: Vec<gpumon_core::attribution::TenantSelector>) -> WebSink {
        let hub = Arc::new(Hub::new(config.max_clients, config.client_buffer, config.history, tenants));
        WebSink { hub, serving: Serving::default() }
    }

    /// A handle on this sink's state; stays valid after the sink moves into an agent.
    pub fn handle(&self) -> WebHandle {
        WebHandle { hub: self.hub.clone() }
    }

    /// The address the listener is bound to (`None` without a listener).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.serving.local_addr()
    }
}

impl crate::http::serving::Published for Hub {
    fn sink_name(&self) -> &str {
        self.name
    }

    fn keep_telemetry(&self, telemetry: Telemetry) {
        self.set_telemetry(telemetry);
    }

    /// Publishing stores the tick and hands live clients their event without waiting: the runtime
    /// wakes for this sink only when a client is there to be served.
    fn take_snapshot(&self, snapshot: Arc<Snapshot>) {
        self.publish(snapshot);
    }
}

crate::http::serving::served_sink!(WebSink, hub);

#[cfg(test)]
mod tests;

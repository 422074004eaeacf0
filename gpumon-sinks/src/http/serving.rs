//! What a listening sink (the scrape endpoint, the web view) does alike at each call of `Sink`:
//! its server, if it has one, starts on the first call inside the runtime, answers until
//! `shutdown`, and then stops; an export after `shutdown` is refused.
//!
//! Without the `_http-server` feature (the Prometheus render handle alone) there is no server:
//! only the shutdown flag.
//!
//! The two sinks differ only in what they keep for their server ([`Published`]: the scrape
//! endpoint's snapshot, the web view's hub), so their `Sink` impl is written once, here
//! ([`served_sink!`]). The shape is vector's (shared/STYLE.md, "HTTP is written per sink"): what
//! every sink of a kind does alike lives once in `sinks/util`, and a sink holds only its own part.

use std::net::SocketAddr;
use std::sync::Arc;

use gpumon_core::{SinkError, Snapshot, Telemetry};

#[cfg(feature = "_http-server")]
use super::server::Server;

/// A sink's server (none without a listener) and whether the sink was shut down.
#[derive(Default)]
pub(crate) struct Serving {
    #[cfg(feature = "_http-server")]
    server: Option<Server>,
    shut_down: bool,
}

impl Serving {
    /// Serving through `server` once started.
    #[cfg(feature = "_http-server")]
    pub(crate) fn new(server: Option<Server>) -> Self {
        Serving { server, shut_down: false }
    }

    /// The address the listener is bound to (`None` without a listener).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "_http-server")]
        {
            self.server.as_ref().map(Server::local_addr)
        }
        #[cfg(not(feature = "_http-server"))]
        {
            None
        }
    }

    /// Starts the server if it has not started (a no-op without one).
    pub(crate) fn ensure_started(&self) {
        #[cfg(feature = "_http-server")]
        if let Some(server) = &self.server {
            server.ensure_started();
        }
    }

    /// [`SinkError::AlreadyShutdown`] once [`Serving::shutdown`] has run.
    pub(crate) fn check_open(&self) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        Ok(())
    }

    /// Whether the sink was shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// Stops the server; later exports are refused.
    pub(crate) fn shutdown(&mut self) {
        self.shut_down = true;
        #[cfg(feature = "_http-server")]
        if let Some(server) = &self.server {
            server.stop();
        }
    }
}

/// What a listening sink keeps for its server to answer from: the latest snapshot (the scrape
/// endpoint's [`PrometheusHandle`](crate::prometheus::PrometheusHandle)) or the history and live
/// clients (the web view's hub). Taking a snapshot in never waits: it runs on the sampling thread.
pub(crate) trait Published {
    /// The sink's name (`prometheus`, `web`).
    fn sink_name(&self) -> &str;
    /// Keeps the agent's telemetry, for the self-metrics and the status the server answers with.
    fn keep_telemetry(&self, telemetry: Telemetry);
    /// Takes the latest snapshot in.
    fn take_snapshot(&self, snapshot: Arc<Snapshot>);
}

/// The [`Sink`](gpumon_core::Sink) impl of a listening sink `$sink` whose field `serving` is its
/// [`Serving`] and whose field `$published` is its [`Published`] state: the server starts on the
/// first call inside the runtime (telemetry, healthcheck or export), an export only hands the
/// snapshot to the state, inline on the sampling thread (a scrape or a client reads it later,
/// and a tick wakes no other thread for the sink), and after `shutdown` exports are refused.
macro_rules! served_sink {
    ($sink:ty, $published:ident) => {
        // The state is reached by method calls (through an `Arc`, as the web view's hub is).
        use $crate::http::serving::Published as _;

        #[async_trait::async_trait]
        impl gpumon_core::Sink for $sink {
            fn name(&self) -> &str {
                self.$published.sink_name()
            }

            fn attach_telemetry(&mut self, telemetry: gpumon_core::Telemetry) {
                self.$published.keep_telemetry(telemetry);
                self.serving.ensure_started();
            }

            async fn export(
                &mut self,
                snapshot: std::sync::Arc<gpumon_core::Snapshot>,
            ) -> Result<(), gpumon_core::SinkError> {
                self.serving.check_open()?;
                self.$published.take_snapshot(snapshot);
                self.serving.ensure_started();
                Ok(())
            }

            /// Taking the snapshot in is all an export does: it runs on the sampling thread.
            fn exports_inline(&self) -> bool {
                true
            }

            fn export_inline(
                &mut self,
                snapshot: &std::sync::Arc<gpumon_core::Snapshot>,
            ) -> Result<gpumon_core::InlineExport, gpumon_core::SinkError> {
                self.serving.check_open()?;
                self.$published.take_snapshot(snapshot.clone());
                Ok(gpumon_core::InlineExport::Done)
            }

            async fn healthcheck(&mut self) -> Result<(), gpumon_core::SinkError> {
                self.serving.ensure_started();
                Ok(())
            }

            async fn shutdown(&mut self) -> Result<(), gpumon_core::SinkError> {
                self.serving.shutdown();
                Ok(())
            }
        }
    };
}
pub(crate) use served_sink;

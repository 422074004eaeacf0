//! `[web]`: the live web view's settings.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::http::access::Auth;
use crate::http::listener::{listener_config, ListenerConfig, TlsConfig};
use crate::http::tenants::TenantConfig;

/// The address used when [`WebConfig::listen`] is not set: `127.0.0.1:9401` (next to the
/// Prometheus endpoint's 9400, on loopback only; set `listen = "0.0.0.0:9401"` to expose it).
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 9401));

/// The web view's default [`WebConfig::max_connections`]: live streams hold their connections
/// open, so it is higher than a listener's 64.
const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Settings of the web view (`[web]` in the agent's config file).
///
/// Every field has a default; `WebConfig::default()` serves `127.0.0.1:9401` without auth or
/// TLS. The struct is `#[non_exhaustive]`: outside this crate, start from `WebConfig::default()`
/// and assign the fields you need.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WebConfig {
    /// Address of the page and its API. `None` means [`DEFAULT_LISTEN`]. Port 0 picks a free port
    /// ([`WebSink::local_addr`](super::WebSink::local_addr)).
    pub listen: Option<SocketAddr>,
    /// Require credentials on every path (the same forms as the Prometheus endpoint's). A browser
    /// asks for Basic credentials itself; `EventSource` then sends them along.
    pub auth: Option<Auth>,
    /// Tenants: each credential reads only its tenant's view, on every path
    /// (`[[web.tenants]]`; the same form as the Prometheus endpoint's, see
    /// [`TenantConfig`]). With tenants, a request without a credential gets `401` (unless no
    /// credential is configured at all).
    pub tenants: Vec<TenantConfig>,
    /// Serve HTTPS (feature `prometheus-tls`, shared with the Prometheus endpoint).
    pub tls: Option<TlsConfig>,
    /// Most live streams (`/api/stream`) at once (default 128), shared between the admin and
    /// the tenants (`docs/tenancy.md`, "Fair shares"); one more gets `503`.
    pub max_clients: usize,
    /// Snapshots queued for one live client (default 8). A client that falls this far behind is
    /// disconnected and counted as dropped (the sink's `dropped` count), so a slow browser never
    /// holds memory or delays sampling; its `EventSource` reconnects by itself.
    pub client_buffer: usize,
    /// Samples kept for `/api/history` and the charts (default 900: 15 minutes at 1 s).
    pub history: usize,
    /// Most connections at once, live streams included (default 256; at least `max_clients`).
    pub max_connections: usize,
    /// Time a client has to send a complete request head. Default 10 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub header_read_timeout: Duration,
    /// Longest a connection without a live stream may stay open. Default 60 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub connection_timeout: Duration,
    /// Largest request head accepted, bytes (default 16384).
    pub max_header_bytes: usize,
    /// Most header fields in a request (default 64).
    pub max_headers: usize,
}

impl Default for WebConfig {
    fn default() -> Self {
        let l = ListenerConfig { max_connections: DEFAULT_MAX_CONNECTIONS, ..ListenerConfig::default() };
        Self {
            listen: l.listen,
            auth: None,
            tenants: Vec::new(),
            tls: l.tls,
            max_clients: 128,
            client_buffer: 8,
            history: 900,
            max_connections: l.max_connections,
            header_read_timeout: l.header_read_timeout,
            connection_timeout: l.connection_timeout,
            max_header_bytes: l.max_header_bytes,
            max_headers: l.max_headers,
        }
    }
}

impl WebConfig {
    /// The web view's listener settings.
    pub(crate) fn listener(&self) -> ListenerConfig {
        listener_config!(self)
    }

    pub(crate) fn validate(&self) -> Result<(), gpumon_core::BuildError> {
        use gpumon_core::BuildError;
        let positive = [
            ("web.max_clients", self.max_clients),
            ("web.client_buffer", self.client_buffer),
            ("web.history", self.history),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(BuildError::invalid(name, "must be at least 1"));
            }
        }
        self.listener().validate("web")?;
        if self.max_connections < self.max_clients {
            return Err(BuildError::invalid(
                "web.max_connections",
                format!("must be at least web.max_clients ({})", self.max_clients),
            ));
        }
        if let Some(auth) = &self.auth {
            auth.validate("web")?;
        }
        Ok(())
    }
}

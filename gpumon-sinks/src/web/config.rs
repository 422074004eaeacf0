//! `[web]`: the live web view's settings.

use std::net::SocketAddr;

use serde::Deserialize;

use crate::http::access::Auth;
use crate::http::listener::{listener_section, ListenerConfig};
use crate::http::tenants::TenantConfig;

/// The address used when [`WebConfig::listen`] is not set: `127.0.0.1:9401` (next to the
/// Prometheus endpoint's 9400, on loopback only; set `listen = "0.0.0.0:9401"` to expose it).
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 9401));

/// The most samples [`WebConfig::history`] may keep: a day at 1 s. Each point holds every GPU's
/// charted values, so a history much longer than this would hold gigabytes on a large node (and
/// `10000000000` would abort the agent on allocation).
pub const MAX_HISTORY: usize = 86_400;

/// The web view's default [`WebConfig::max_connections`]: live streams hold their connections
/// open, so it is higher than a listener's 64.
const DEFAULT_MAX_CONNECTIONS: usize = 256;

listener_section! {
    /// Settings of the web view (`[web]` in the agent's config file): its own keys, then the
    /// listener's (shared with `[prometheus]`).
    ///
    /// Every field has a default; `WebConfig::default()` serves `127.0.0.1:9401` without auth or
    /// TLS. The struct is `#[non_exhaustive]`: outside this crate, start from `WebConfig::default()`
    /// and assign the fields you need.
    #[derive(Clone, Debug, PartialEq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    #[non_exhaustive]
    pub struct WebConfig {
        /// Require credentials on every path (the same forms as the Prometheus endpoint's). A
        /// browser asks for Basic credentials itself; `EventSource` then sends them along.
        pub auth: Option<Auth> = None,
        /// Tenants: each credential reads only its tenant's view, on every path
        /// (`[[web.tenants]]`; the same form as the Prometheus endpoint's, see
        /// [`TenantConfig`]). With tenants, a request without a credential gets `401` (unless no
        /// credential is configured at all).
        pub tenants: Vec<TenantConfig> = Vec::new(),
        /// Most live streams (`/api/stream`) at once (default 128), shared between the admin and
        /// the tenants (`docs/tenancy.md`, "Fair shares"); one more gets `503`.
        pub max_clients: usize = 128,
        /// Snapshots queued for one live client (default 8). A client that falls this far behind
        /// is disconnected and counted as dropped (the sink's `dropped` count), so a slow browser
        /// never holds memory or delays sampling; its `EventSource` reconnects by itself.
        pub client_buffer: usize = 8,
        /// Samples kept for `/api/history` and the charts (default 900: 15 minutes at 1 s; at
        /// most [`MAX_HISTORY`]).
        pub history: usize = 900,
    }
    listener defaults: ListenerConfig { max_connections: DEFAULT_MAX_CONNECTIONS, ..ListenerConfig::default() };
}

impl WebConfig {
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
        if self.history > MAX_HISTORY {
            return Err(BuildError::invalid(
                "web.history",
                format!("{} samples is more than the most kept, {MAX_HISTORY} (a day at 1 s)", self.history),
            ));
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

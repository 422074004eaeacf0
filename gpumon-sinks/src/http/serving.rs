//! What a listening sink (the scrape endpoint, the web view) does alike at each call of `Sink`:
//! its server, if it has one, starts on the first call inside the runtime, answers until
//! `shutdown`, and then stops; an export after `shutdown` is refused.
//!
//! Without the `_http-server` feature (the Prometheus render handle alone) there is no server:
//! only the shutdown flag.

use std::net::SocketAddr;

use gpumon_core::SinkError;

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

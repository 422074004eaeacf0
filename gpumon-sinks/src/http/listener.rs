//! One listener's settings: the address, TLS, and the limits a hostile client cannot get around.
//! The scrape endpoint (`[prometheus]`) and the web view (`[web]`) both serve through
//! [`server`](super::server) with a [`ListenerConfig`]; its defaults and its checks are here,
//! once.
//!
//! In the config file the keys stay flat in each section (`[prometheus] max_connections = 8`,
//! `[web] header_read_timeout = "5s"`), and so do the public fields of
//! [`PrometheusConfig`](crate::prometheus::PrometheusConfig) and
//! [`WebConfig`](crate::web::WebConfig): each config builds its `ListenerConfig` with
//! [`listener_config!`], in one place. Why not `#[serde(flatten)]` (shared/STYLE.md's wording):
//! serde does not support `flatten` together with `deny_unknown_fields`. It half works — a
//! misspelt key is still refused — but the error loses the list of expected keys, and every
//! error about a flattened key (`max_connections = "x"`) points at the `[prometheus]` header
//! without naming the key; the web view's own default (`max_connections = 256`) could not be
//! told apart from the endpoint's (64) either. Today's errors name the key and its line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gpumon_core::BuildError;
use serde::Deserialize;

/// TLS for a listener (the scrape endpoint, the web view): PEM files. Build one with
/// [`TlsConfig::new`] (the struct is `#[non_exhaustive]`). Needs the `prometheus-tls` feature.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TlsConfig {
    /// Certificate chain, PEM (leaf first).
    pub cert: PathBuf,
    /// Private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsConfig {
    /// TLS with this certificate chain and private key (PEM files).
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self { cert: cert.into(), key: key.into() }
    }
}

/// The settings of one listener. A section's fields of the same names are documented on its
/// config ([`PrometheusConfig`](crate::prometheus::PrometheusConfig),
/// [`WebConfig`](crate::web::WebConfig)).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ListenerConfig {
    /// Where to listen; `None`: the section's default address.
    pub(crate) listen: Option<SocketAddr>,
    /// Serve HTTPS.
    pub(crate) tls: Option<TlsConfig>,
    /// Most connections served at once.
    pub(crate) max_connections: usize,
    /// Time a client has to send a complete request head (also bounds the TLS handshake).
    pub(crate) header_read_timeout: Duration,
    /// Longest a connection may stay open (a live stream is exempt).
    pub(crate) connection_timeout: Duration,
    /// Largest request head accepted, bytes; larger heads get `431`.
    pub(crate) max_header_bytes: usize,
    /// Most header fields in a request.
    pub(crate) max_headers: usize,
}

impl Default for ListenerConfig {
    /// Every listener's defaults (the web view raises `max_connections`: its live streams hold
    /// connections open).
    fn default() -> Self {
        Self {
            listen: None,
            tls: None,
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(60),
            max_header_bytes: 16 * 1024,
            max_headers: 64,
        }
    }
}

impl ListenerConfig {
    /// Checks the limits of the listener configured under `section` (`prometheus`, `web`);
    /// every error names the key (`web.max_header_bytes`).
    pub(crate) fn validate(&self, section: &str) -> Result<(), BuildError> {
        let key = |name: &str| format!("{section}.{name}");
        if self.max_connections == 0 {
            return Err(BuildError::invalid(key("max_connections"), "must be at least 1"));
        }
        if self.header_read_timeout.is_zero() {
            return Err(BuildError::invalid(key("header_read_timeout"), "must be greater than zero"));
        }
        if self.connection_timeout.is_zero() {
            return Err(BuildError::invalid(key("connection_timeout"), "must be greater than zero"));
        }
        if self.max_header_bytes < 8192 {
            return Err(BuildError::invalid(key("max_header_bytes"), "must be at least 8192"));
        }
        if self.max_headers == 0 {
            return Err(BuildError::invalid(key("max_headers"), "must be at least 1"));
        }
        Ok(())
    }
}

/// The [`ListenerConfig`] of a config that declares the listener's keys flat (`listen`, `tls`,
/// `max_connections`, `header_read_timeout`, `connection_timeout`, `max_header_bytes`,
/// `max_headers`): the one place those fields are gathered.
macro_rules! listener_config {
    ($config:expr) => {{
        let c = $config;
        $crate::http::listener::ListenerConfig {
            listen: c.listen,
            tls: c.tls.clone(),
            max_connections: c.max_connections,
            header_read_timeout: c.header_read_timeout,
            connection_timeout: c.connection_timeout,
            max_header_bytes: c.max_header_bytes,
            max_headers: c.max_headers,
        }
    }};
}
pub(crate) use listener_config;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_section_and_key() {
        let bad = |l: ListenerConfig| l.validate("web").unwrap_err().to_string();
        let d = ListenerConfig::default;
        assert!(d().validate("prometheus").is_ok());
        assert!(bad(ListenerConfig { max_connections: 0, ..d() }).contains("`web.max_connections`"));
        assert!(
            bad(ListenerConfig { header_read_timeout: Duration::ZERO, ..d() }).contains("`web.header_read_timeout`")
        );
        assert!(bad(ListenerConfig { connection_timeout: Duration::ZERO, ..d() }).contains("`web.connection_timeout`"));
        let e = bad(ListenerConfig { max_header_bytes: 8191, ..d() });
        assert!(e.contains("`web.max_header_bytes`") && e.contains("8192"), "{e}");
        assert!(bad(ListenerConfig { max_headers: 0, ..d() }).contains("`web.max_headers`"));
    }
}

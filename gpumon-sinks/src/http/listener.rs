//! One listener's settings: the address, TLS, and the limits a hostile client cannot get around.
//! The scrape endpoint (`[prometheus]`) and the web view (`[web]`) both serve through
//! [`server`](super::server) with a [`ListenerConfig`]; its defaults and its checks are here,
//! once.
//!
//! In the config file the keys stay flat in each section (`[prometheus] max_connections = 8`,
//! `[web] header_read_timeout = "5s"`), and so do the public fields of
//! [`PrometheusConfig`](crate::prometheus::PrometheusConfig) and
//! [`WebConfig`](crate::web::WebConfig): both are declared with [`listener_section!`], which
//! writes the listener's fields, their docs, their defaults and the section's `ListenerConfig`
//! once. Why not `#[serde(flatten)]` (shared/STYLE.md's wording): serde does not support
//! `flatten` together with `deny_unknown_fields`. It half works — a misspelt key is still
//! refused — but the error loses the list of expected keys, and every error about a flattened
//! key (`max_connections = "x"`) points at the `[prometheus]` header without naming the key; the
//! web view's own default (`max_connections = 256`) could not be told apart from the endpoint's
//! (64) either. Today's errors name the key and its line.

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

/// Declares a section's config struct (`[prometheus]`, `[web]`) with its own fields followed by
/// the listener's keys, flat (`listen`, `tls`, `max_connections`, `header_read_timeout`,
/// `connection_timeout`, `max_header_bytes`, `max_headers`): the one place those public fields,
/// their docs and their serde attributes are written. It also writes the section's `Default`
/// (each own field's `= default`, the listener's from the `listener defaults` expression) and
/// `listener()`, the section's [`ListenerConfig`]. A plain struct, not `#[serde(flatten)]`, so
/// that serde's errors keep naming the key (the module docs say why).
macro_rules! listener_section {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_attr:meta])*
                pub $field:ident: $ty:ty = $default:expr,
            )*
        }
        listener defaults: $listener_defaults:expr;
    ) => {
        $(#[$attr])*
        pub struct $name {
            $(
                $(#[$field_attr])*
                pub $field: $ty,
            )*
            /// Address to listen on. `None` means the section's `DEFAULT_LISTEN` (`[prometheus]`
            /// `127.0.0.1:9400`, `[web]` `127.0.0.1:9401`: loopback only; set `listen =
            /// "0.0.0.0:9400"` to expose it). Port 0 picks a free port (the sink's `local_addr`).
            pub listen: Option<std::net::SocketAddr>,
            /// Serve HTTPS (feature `prometheus-tls`, for either listener).
            pub tls: Option<$crate::http::listener::TlsConfig>,
            /// Most connections served at once, live streams included (default 64; the web view's
            /// 256, at least its `max_clients`). When all are taken, the oldest idle connection
            /// (those that never completed a request first) is closed and its slot handed to the
            /// newcomer; only when every connection is busy answering does a newcomer wait (≤ 1 s).
            pub max_connections: usize,
            /// Time a client has to send a complete request head (and, on a kept-alive
            /// connection, the next one; also bounds the TLS handshake). Default 10 s.
            #[serde(deserialize_with = "crate::duration::deserialize")]
            pub header_read_timeout: std::time::Duration,
            /// Longest a connection may stay open, whatever it does (a live stream of the web view
            /// is exempt). Default 60 s.
            #[serde(deserialize_with = "crate::duration::deserialize")]
            pub connection_timeout: std::time::Duration,
            /// Largest request head accepted, bytes (default 16384, at least 8192); larger heads
            /// get `431`.
            pub max_header_bytes: usize,
            /// Most header fields in a request (default 64).
            pub max_headers: usize,
        }

        impl Default for $name {
            fn default() -> Self {
                let l: $crate::http::listener::ListenerConfig = $listener_defaults;
                Self {
                    $($field: $default,)*
                    listen: l.listen,
                    tls: l.tls,
                    max_connections: l.max_connections,
                    header_read_timeout: l.header_read_timeout,
                    connection_timeout: l.connection_timeout,
                    max_header_bytes: l.max_header_bytes,
                    max_headers: l.max_headers,
                }
            }
        }

        impl $name {
            /// This section's listener settings.
            pub(crate) fn listener(&self) -> $crate::http::listener::ListenerConfig {
                $crate::http::listener::ListenerConfig {
                    listen: self.listen,
                    tls: self.tls.clone(),
                    max_connections: self.max_connections,
                    header_read_timeout: self.header_read_timeout,
                    connection_timeout: self.connection_timeout,
                    max_header_bytes: self.max_header_bytes,
                    max_headers: self.max_headers,
                }
            }
        }
    };
}
pub(crate) use listener_section;

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

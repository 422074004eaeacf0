//! The HTTP layer, once: the client of the push sinks and the server of the scrape endpoint and
//! the web view. A sink describes only its own requests (push) or its own routes (serve); the
//! rest of talking HTTP is here.
//!
//! The client half (InfluxDB, Prometheus remote write, the Pushgateway, OTLP/HTTP; each words
//! its own errors):
//!
//! - [`client`]: [`HttpClient`](client::HttpClient) builds the reqwest client the same way for
//!   every sink (timeouts, `User-Agent`, TLS through [`crate::tls`], Basic/bearer/token auth,
//!   fixed headers) and sends with one send-and-classify: a 2xx is `Ok`; anything else an
//!   [`HttpError`](client::HttpError) with the status, `Retry-After` and a bounded snippet of the
//!   server's answer, or the cause of a request that got no answer.
//! - [`retry`]: the one retry policy — which failures are retried, held or refused
//!   ([`classify`](retry::classify) into a [`Failure`](retry::Failure)) and how long to wait
//!   ([`Backoff`](retry::Backoff): `Retry-After`, else jittered exponential backoff).
//!
//! The server half (the Prometheus scrape endpoint, `prometheus/serve.rs`, and the web view,
//! `web/serve.rs`, hold only their routes):
//!
//! - [`listener`]: one listener's configuration — address, [`TlsConfig`](listener::TlsConfig),
//!   connection and header limits, timeouts — with its defaults and its checks, for `[prometheus]`
//!   and `[web]` alike (their keys stay flat in each section; the module says why).
//! - `server`: the listener itself (feature `_http-server`): admission (the oldest idle
//!   connection makes room), header and connection timeouts, the TLS handshake, the serving loop,
//!   generic over a route `Handler`.
//! - [`access`] and [`tenants`], beside it: access control — the admin credential
//!   ([`Auth`](access::Auth)), the tenants' ([`TenantConfig`](tenants::TenantConfig)), and who a
//!   request is (admin, a tenant, or `401`).
//!
//! The shape is vector's (shared/STYLE.md, "HTTP is written per sink"): vector keeps its HTTP
//! client, TLS, auth and retry logic (`HttpRetryLogic`) once in `src/sinks/util/`, and a sink's
//! `service.rs` holds only its own request. The same entry says of the server: "The scrape
//! endpoint and the web view share a server through nine positional arguments; one listener
//! configuration, flattened into both configs, reads better." Here they share one
//! [`ListenerConfig`](listener::ListenerConfig); the keys are flattened in the config file, but
//! not with serde's `flatten` ([`listener`] says why).
//!
//! The client lives in `http/` rather than in `crate::delivery` because not every HTTP sink
//! batches: `delivery/` is the batching, outage buffer and background writer of InfluxDB and
//! remote write, and calls this layer through its `Transport`; the Pushgateway and OTLP/HTTP send
//! one request per export through it directly.

// Each HTTP sink uses part of the client (InfluxDB no bearer token, OTLP no backoff); only a
// build with all four uses all of it, and only there is anything unused really dead.
#[cfg(feature = "_http-client")]
#[cfg_attr(
    not(all(feature = "influxdb-http", feature = "remote-write", feature = "pushgateway", feature = "otlp")),
    allow(dead_code)
)]
pub(crate) mod client;
#[cfg(feature = "_http-client")]
#[cfg_attr(
    not(all(feature = "influxdb-http", feature = "remote-write", feature = "pushgateway", feature = "otlp")),
    allow(dead_code)
)]
pub(crate) mod retry;

#[cfg(all(test, feature = "_http-client"))]
pub(crate) mod test_server;

// The listener's configuration is parsed with `[prometheus]` even in a build without the server
// (feature `prometheus`: render handle only), so it is compiled with either. Every user of the
// server half enables `prometheus` (`web` implies `prometheus-http`): `_http-server` alone has no
// user, and nothing in it is really dead there.
#[cfg(any(feature = "prometheus", feature = "_http-server"))]
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) mod access;
#[cfg(any(feature = "prometheus", feature = "_http-server"))]
#[cfg_attr(not(feature = "prometheus"), allow(dead_code, unused_imports, unused_macros))]
pub(crate) mod listener;
#[cfg(any(feature = "prometheus", feature = "_http-server"))]
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) mod tenants;

#[cfg(feature = "_http-server")]
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) mod server;
#[cfg(feature = "prometheus")]
pub(crate) mod serving;
#[cfg(feature = "web")]
pub(crate) mod shares;

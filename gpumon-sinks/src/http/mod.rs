//! The HTTP client layer of the push sinks: InfluxDB, Prometheus remote write, the Pushgateway
//! and OTLP/HTTP each describe only their own request (URL, body, content type) and word their
//! own errors; everything else about talking HTTP is here, once.
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
//! The shape is vector's (shared/STYLE.md, "HTTP is written per sink"): vector keeps its HTTP
//! client, TLS, auth and retry logic (`HttpRetryLogic`) once in `src/sinks/util/`, and a sink's
//! `service.rs` holds only its own request. It lives in `http/` rather than in
//! [`crate::delivery`] because not every HTTP sink batches: `delivery/` is the batching, outage
//! buffer and background writer of InfluxDB and remote write, and calls this layer through its
//! `Transport`; the Pushgateway and OTLP/HTTP send one request per export through it directly.

pub(crate) mod client;
pub(crate) mod retry;

#[cfg(test)]
pub(crate) mod test_server;

//! # gpumon-sinks
//!
//! Where gpumon's snapshots go. Every sink implements [`gpumon_core::Sink`] and is behind its own
//! cargo feature, so an embedder compiles only what it uses:
//!
//! | feature | sink | pulls in |
//! |---|---|---|
//! | `stdout` (default) | [`stdout::StdoutSink`]: human lines or JSON lines | serde_json |
//! | `prometheus` | exposition rendering + render handle | prometheus-client |
//! | `prometheus-http` | `/metrics` scrape endpoint | hyper |
//! | `prometheus-tls` | TLS for the endpoint | rustls |
//! | `pushgateway` | Pushgateway pusher | reqwest |
//! | `influxdb` | line-protocol encoder | — |
//! | `influxdb-http` | InfluxDB v1/v2 writer | reqwest, flate2 |
//! | `otlp` | OTLP/HTTP via the OpenTelemetry SDK | opentelemetry, prost |
//! | `otlp-grpc` | OTLP/gRPC | tonic |
//! | `remote-write` | Prometheus remote write 1.0 | reqwest, prost, snap |
//! | `web` | [`web::WebSink`]: live page, JSON API, Server-Sent Events | hyper, serde_json, flate2 |
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "influxdb-http", feature = "remote-write"))]
pub(crate) mod delivery;

// The client half for the push sinks, the server half (and the listener's configuration, which
// `prometheus` alone parses too) for the scrape endpoint and the web view.
#[cfg(any(feature = "_http-client", feature = "_http-server", feature = "prometheus"))]
pub(crate) mod http;

#[cfg(any(feature = "_http-client", feature = "otlp", feature = "tls"))]
pub mod tls;

pub mod duration;

mod secret;
pub use secret::Secret;

#[cfg(feature = "stdout")]
#[cfg_attr(docsrs, doc(cfg(feature = "stdout")))]
pub mod stdout;

#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod prometheus;

#[cfg(feature = "influxdb")]
#[cfg_attr(docsrs, doc(cfg(feature = "influxdb")))]
pub mod influxdb;

#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub mod otlp;

#[cfg(feature = "remote-write")]
#[cfg_attr(docsrs, doc(cfg(feature = "remote-write")))]
pub mod remote_write;

// Property tests across every encoder (hostile names, any values); a build without an encoder
// (only `tls`, say) has nothing to run them on.
#[cfg(all(test, any(feature = "stdout", feature = "prometheus", feature = "influxdb", feature = "otlp")))]
mod props;
#[cfg(feature = "web")]
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub mod web;

#[cfg(feature = "prometheus-query")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus-query")))]
pub mod prometheus_query;

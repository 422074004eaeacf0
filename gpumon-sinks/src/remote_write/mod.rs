//! Prometheus remote write 1.0: push every snapshot to Grafana Mimir, Thanos Receive, Cortex,
//! VictoriaMetrics or Prometheus itself (`--web.enable-remote-write-receiver`).
//!
//! [`RemoteWriteSink`], configured by [`RemoteWriteConfig`] (`[remote_write]`, agent flag
//! `--remote-write-url`). The guide, with configurations for Mimir, VictoriaMetrics and
//! Prometheus: `docs/remote-write.md`.
//!
//! # What is sent
//!
//! **The scrape endpoint's series, exactly**: the same metric names and label sets in the same
//! [`Naming`](crate::prometheus::Naming) (native or dcgm), the derived series (findings), the
//! self-metrics, and `backend="mock"` on simulated data — the encoder and the exposition
//! renderer consume one walk of the series (`prometheus::series`, crate-private), so the two
//! cannot drift, and no text is rendered or parsed on the way to protobuf. Each series carries
//! one sample per snapshot at the **snapshot's time** (milliseconds), not the time of sending, so
//! samples buffered through an outage land where they belong. `external_labels` are added to
//! every series that lacks them; label names are sorted byte-wise and empty values left out, as
//! the specification requires.
//!
//! # Wire format
//!
//! `POST <url>` with a protobuf `WriteRequest` ([`encode::WriteRequest`]; the messages of the
//! specification, field for field) compressed with snappy's **block** format, and the headers
//! `Content-Encoding: snappy`, `Content-Type: application/x-protobuf`,
//! `X-Prometheus-Remote-Write-Version: 0.1.0` and `User-Agent: gpumon/<version>`. Basic or bearer
//! auth, extra headers (`X-Scope-OrgID`), and TLS through [`TlsConfig`](crate::tls::TlsConfig).
//!
//! # Delivery
//!
//! The InfluxDB writer's, shared (`delivery`, crate-private): batches of `batch_samples` samples or
//! `batch_interval` (default 2000 / 1 s; sealed at once when exports come about that far apart
//! or more), one request in flight, each bounded by `timeout`
//! (default 5 s). Network errors, 408, 429 and 5xx are retried with jittered exponential backoff
//! or after `Retry-After`; 401/403/404 pause for `retry_max`; **any other 4xx (a 400 for an
//! out-of-order or duplicate sample) drops the batch**: retrying cannot help, and a sender that
//! did would stall behind it forever. It is logged once with the receiver's message and counted
//! in [`RemoteWriteStats::samples_rejected`]. Through an outage the buffer holds up to
//! `buffer_max_samples` / `buffer_max_bytes`; beyond, the oldest batches are dropped and counted
//! ([`RemoteWriteStats::samples_dropped`], the agent's `SinkStatus::dropped`). `flush` and
//! `shutdown` send what is buffered within the agent's deadline. Delivery is at-least-once: a
//! batch whose response was lost is sent again, and receivers accept a repeated sample with the
//! same timestamp and value.

pub mod encode;

mod config;
mod sink;

pub use config::RemoteWriteConfig;
pub use sink::{RemoteWriteSink, RemoteWriteStats, RemoteWriteStatsHandle, PROTOCOL_VERSION};

#[cfg(test)]
mod tests;

//! `RemoteWriteSink`: the scrape endpoint's series, pushed as remote-write 1.0 requests through
//! the shared [`Delivery`](crate::delivery) writer.

use std::sync::Arc;

use gpumon_core::{BuildError, Sink, SinkError, Snapshot, Telemetry};

use super::config::RemoteWriteConfig;
use super::encode::{compress, Encoder};
use crate::delivery::{Delivery, DeliveryConfig, DeliveryShared, DeliveryStats, PostBatches, Unit};
use crate::http::client::{Auth, ClientConfig, HttpClient};
use crate::http::retry::Backoff;

/// The sink's name (status, logs, `Telemetry::record_dropped`).
const NAME: &str = "remote_write";

const UNIT: Unit = Unit { sink: NAME, service: "remote write", items: "samples" };

/// The remote-write protocol version sent in `X-Prometheus-Remote-Write-Version` (1.0 of the
/// specification still sends 0.1.0).
pub const PROTOCOL_VERSION: &str = "0.1.0";

/// A point-in-time copy of the sink's counters (see [`RemoteWriteSink::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoteWriteStats {
    /// Samples acknowledged by the receiver (2xx).
    pub samples_written: u64,
    /// Samples dropped because the outage buffer was full (oldest first); also reported to the
    /// agent's [`SinkStatus::dropped`](gpumon_core::SinkStatus::dropped).
    pub samples_dropped: u64,
    /// Samples the receiver refused for good (400 and other 4xx except 401/403/404/408/429):
    /// out-of-order or duplicate samples, bad labels. Not retried.
    pub samples_rejected: u64,
    /// Samples held right now (open batch, queued batches, the batch in flight).
    pub samples_buffered: u64,
    /// Bytes held right now (uncompressed protobuf).
    pub bytes_buffered: u64,
    /// Requests acknowledged.
    pub batches_written: u64,
    /// Requests sent (including retries).
    pub requests: u64,
    /// Requests that failed (network error or non-2xx).
    pub failed_requests: u64,
    /// The last write error (with the receiver's message), cleared by the next success.
    pub last_error: Option<String>,
}

impl From<DeliveryStats> for RemoteWriteStats {
    fn from(d: DeliveryStats) -> Self {
        RemoteWriteStats {
            samples_written: d.written,
            samples_dropped: d.dropped,
            samples_rejected: d.rejected,
            samples_buffered: d.buffered,
            bytes_buffered: d.bytes_buffered,
            batches_written: d.batches_written,
            requests: d.requests,
            failed_requests: d.failed_requests,
            last_error: d.last_error,
        }
    }
}

/// A cloneable view of a [`RemoteWriteSink`]'s counters that stays valid after the sink has been
/// moved into an agent.
#[derive(Clone, Debug)]
pub struct RemoteWriteStatsHandle(Arc<DeliveryShared>);

impl RemoteWriteStatsHandle {
    /// Copies the current counters.
    pub fn stats(&self) -> RemoteWriteStats {
        RemoteWriteStats::from(self.0.stats())
    }
}

/// Pushes every snapshot to a Prometheus remote-write receiver. See the [module
/// docs](crate::remote_write).
///
/// `export` never waits for the network: it encodes the snapshot into the open batch and returns
/// the current write error, if any.
pub struct RemoteWriteSink {
    delivery: Delivery,
    encoder: Encoder,
    telemetry: Option<Telemetry>,
    url: String,
}

impl std::fmt::Debug for RemoteWriteSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWriteSink")
            .field("url", &self.url)
            .field("delivery", &self.delivery)
            .finish_non_exhaustive()
    }
}

impl RemoteWriteSink {
    /// Builds the sink. Needs no runtime; the writer task starts on the first `export`.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`]/[`BuildError::InvalidEndpoint`] naming the offending key
    /// (see [`RemoteWriteConfig::validate`]), or [`BuildError::Io`] when the HTTP client cannot be
    /// built (e.g. an unreadable CA file).
    pub fn from_config(config: &RemoteWriteConfig) -> Result<Self, BuildError> {
        config.validate()?;
        let url = reqwest::Url::parse(&config.url)
            .map_err(|e| BuildError::InvalidEndpoint { endpoint: config.url.clone(), reason: e.to_string() })?;
        use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            // validate() checked both.
            if let (Ok(k), Ok(mut v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v.expose())) {
                v.set_sensitive(true);
                headers.insert(k, v);
            }
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"));
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("snappy"));
        headers.insert("x-prometheus-remote-write-version", HeaderValue::from_static(PROTOCOL_VERSION));
        let client = HttpClient::new(ClientConfig {
            key: NAME,
            tls: &config.tls,
            url: &url,
            timeout: Some(config.timeout),
            connect_timeout: config.timeout,
            auth: match &config.bearer_token {
                Some(token) if config.username.is_none() => Auth::Bearer(token.clone()),
                _ => Auth::basic(config.username.as_ref(), config.password.as_ref()),
            },
            headers,
        })?;
        let target = format!("POST {url}");
        // One snappy-compressed `WriteRequest`, with the headers the spec requires (the client's).
        let snappy: fn(&[u8]) -> Result<Vec<u8>, String> = |body| compress(body).map_err(|e| e.to_string());
        let transport = Arc::new(PostBatches { client, url, target, compression: Some(("snappy", snappy)) });
        let delivery_config = DeliveryConfig {
            batch_items: config.batch_samples,
            batch_interval: config.batch_interval,
            max_items: config.buffer_max_samples,
            max_bytes: config.buffer_max_bytes,
            spill_dir: None,
            backoff: Backoff { initial: config.retry_initial, max: config.retry_max },
        };
        let (delivery, _) = Delivery::new(delivery_config, transport, UNIT)
            .map_err(|e| BuildError::Io { what: "remote_write: outage buffer".into(), source: Box::new(e) })?;
        let encoder = Encoder::from_config(config);
        Ok(Self { delivery, encoder, telemetry: None, url: config.url.clone() })
    }

    /// Copies the counters (samples written, dropped, rejected, buffered, …).
    pub fn stats(&self) -> RemoteWriteStats {
        RemoteWriteStats::from(self.delivery.stats())
    }

    /// A cloneable handle on the counters, usable after the sink is moved into an agent.
    pub fn stats_handle(&self) -> RemoteWriteStatsHandle {
        RemoteWriteStatsHandle(self.delivery.shared())
    }
}

#[async_trait::async_trait]
impl Sink for RemoteWriteSink {
    fn name(&self) -> &str {
        NAME
    }

    /// Keeps the telemetry for the self-metrics (as the scrape endpoint shows them) and to report
    /// samples dropped from the outage buffer in the agent's status.
    fn attach_telemetry(&mut self, telemetry: Telemetry) {
        self.delivery.attach_telemetry(telemetry.clone());
        self.telemetry = Some(telemetry);
    }

    /// Receivers share no health endpoint (Prometheus `/-/ready`, Mimir `/ready`,
    /// VictoriaMetrics `/health`): the first write is the check. Starts the writer.
    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        self.delivery.start()
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        let (encoder, telemetry) = (&mut self.encoder, self.telemetry.as_ref());
        self.delivery.append(|open| encoder.encode(&snapshot, telemetry, open))
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        self.delivery.flush().await
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        self.delivery.shutdown().await
    }
}

//! The HTTP writer: `InfluxSink` (the `Sink` the agent calls) on the shared
//! [`Delivery`](crate::delivery) writer; this file holds the InfluxDB endpoint and transport.

use std::sync::Arc;

use gpumon_core::{BuildError, Sink, SinkError, Snapshot, Telemetry};

use super::config::{ApiVersion, InfluxConfig};
use super::encode::LineProtocolEncoder;
use crate::delivery::{Compression, Delivery, DeliveryConfig, DeliveryStats, PostBatches, Unit};
use crate::http::client::{Auth, ClientConfig, HttpClient};
use crate::http::retry::Backoff;

/// The sink's name (status, logs, `Telemetry::record_dropped`).
const NAME: &str = "influxdb";

/// A point-in-time copy of the writer's counters (see [`InfluxSink::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InfluxStats {
    /// Lines (points) acknowledged by the server.
    pub lines_written: u64,
    /// Lines dropped because the outage buffer was full (oldest first). Also added, as they
    /// happen, to the agent's [`SinkStatus::dropped`](gpumon_core::SinkStatus::dropped) for this
    /// sink (which counts these lines on top of the snapshots the agent's queue dropped).
    pub lines_dropped: u64,
    /// Lines the server refused for good (HTTP 400/413/422…: bad data); not retried.
    pub lines_rejected: u64,
    /// Lines held right now (open batch, queued batches, the batch in flight).
    pub lines_buffered: u64,
    /// Bytes of line protocol held right now.
    pub bytes_buffered: u64,
    /// Batches acknowledged.
    pub batches_written: u64,
    /// HTTP write requests sent (including retries).
    pub requests: u64,
    /// Requests that failed (network error or non-2xx).
    pub failed_requests: u64,
    /// Batches found in the spill directory at start-up and queued for replay.
    pub lines_replayed: u64,
    /// Spill-directory I/O errors.
    pub spill_errors: u64,
    /// Batches written to the spill directory (only while writes fail, and at shutdown).
    pub batches_spilled: u64,
    /// Unreadable or corrupt spill files found at start-up, renamed to `*.bad` and skipped.
    pub spill_quarantined: u64,
    /// The last write error (with the server's message), cleared by the next success.
    pub last_error: Option<String>,
}

/// A cloneable view of an [`InfluxSink`]'s counters that stays valid after the sink has been
/// moved into an agent.
#[derive(Clone, Debug)]
pub struct InfluxStatsHandle(Arc<crate::delivery::DeliveryShared>);

impl InfluxStatsHandle {
    /// Copies the current counters.
    pub fn stats(&self) -> InfluxStats {
        InfluxStats::from(self.0.stats())
    }
}

impl From<DeliveryStats> for InfluxStats {
    fn from(d: DeliveryStats) -> Self {
        InfluxStats {
            lines_written: d.written,
            lines_dropped: d.dropped,
            lines_rejected: d.rejected,
            lines_buffered: d.buffered,
            bytes_buffered: d.bytes_buffered,
            batches_written: d.batches_written,
            requests: d.requests,
            failed_requests: d.failed_requests,
            lines_replayed: d.replayed,
            spill_errors: d.spill_errors,
            batches_spilled: d.batches_spilled,
            spill_quarantined: d.spill_quarantined,
            last_error: d.last_error,
        }
    }
}

/// The InfluxDB sink: encodes each snapshot into a batch and returns at once; a background task
/// sends batches in order, retrying and buffering through outages. See the [module
/// docs](crate::influxdb) for the schema and the delivery guarantees.
///
/// `export` never waits for the network. While writes fail it still takes the snapshot (into the
/// bounded buffer) and returns the current write error, so the agent's
/// [`SinkStatus`](gpumon_core::SinkStatus) shows what the server said.
pub struct InfluxSink {
    delivery: Delivery,
    encoder: LineProtocolEncoder,
    /// Reused encode buffer (line protocol is text; the shared buffer holds bytes).
    scratch: String,
    transport: Arc<PostBatches>,
    ping_url: reqwest::Url,
}

impl std::fmt::Debug for InfluxSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InfluxSink")
            .field("write_url", &self.transport.url.as_str())
            .field("delivery", &self.delivery)
            .finish_non_exhaustive()
    }
}

fn endpoint_url(base: &reqwest::Url, path: &str) -> reqwest::Url {
    let mut url = base.clone();
    let joined = format!("{}{}", base.path().trim_end_matches('/'), path);
    url.set_path(&joined);
    url
}

const UNIT: Unit = Unit { sink: NAME, service: "InfluxDB", items: "lines" };

impl InfluxSink {
    /// Builds the sink from its configuration and replays whatever a previous run left in
    /// `spill_dir`. Needs no runtime; the writer task starts on the first `healthcheck` or
    /// `export`.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`]/[`BuildError::InvalidEndpoint`] naming the offending key
    /// (see [`InfluxConfig::validate`]), or [`BuildError::Io`] when the HTTP client cannot be built
    /// or the spill directory cannot be read.
    pub fn from_config(config: &InfluxConfig) -> Result<Self, BuildError> {
        let api = config.validate()?;
        let base = reqwest::Url::parse(&config.url)
            .map_err(|e| BuildError::InvalidEndpoint { endpoint: config.url.clone(), reason: e.to_string() })?;
        let mut write_url = match api {
            ApiVersion::V1 => endpoint_url(&base, "/write"),
            ApiVersion::V2 => endpoint_url(&base, "/api/v2/write"),
        };
        {
            let mut q = write_url.query_pairs_mut();
            match api {
                ApiVersion::V1 => {
                    q.append_pair("db", config.db.as_deref().unwrap_or_default());
                    if let Some(rp) = &config.rp {
                        q.append_pair("rp", rp);
                    }
                }
                ApiVersion::V2 => {
                    if let Some(org) = &config.org {
                        q.append_pair("org", org);
                    }
                    q.append_pair("bucket", config.bucket.as_deref().unwrap_or_default());
                }
            }
            q.append_pair("precision", "ns");
        }
        let mut headers = reqwest::header::HeaderMap::new();
        let text = reqwest::header::HeaderValue::from_static("text/plain; charset=utf-8");
        headers.insert(reqwest::header::CONTENT_TYPE, text);
        if config.gzip {
            headers.insert(reqwest::header::CONTENT_ENCODING, reqwest::header::HeaderValue::from_static("gzip"));
        }
        let client = HttpClient::new(ClientConfig {
            key: NAME,
            tls: &config.tls,
            url: &base,
            timeout: Some(config.timeout),
            connect_timeout: config.timeout,
            auth: match &config.token {
                Some(token) => Auth::Token(token.clone()),
                None => Auth::basic(config.username.as_ref(), config.password.as_ref()),
            },
            headers,
        })?;

        let mut encoder = LineProtocolEncoder::new(&config.measurement);
        for (k, v) in &config.tags {
            encoder = encoder.with_tag(k, v);
        }

        let delivery_config = DeliveryConfig {
            batch_items: config.batch_points,
            batch_interval: config.batch_interval,
            max_items: config.buffer_max_points,
            max_bytes: config.buffer_max_bytes,
            spill_dir: config.spill_dir.clone(),
            backoff: Backoff { initial: config.retry_initial, max: config.retry_max },
        };
        let target = format!("POST {}", redact_url(&write_url));
        let compression: Option<Compression> = if config.gzip { Some(("gzip", gzip)) } else { None };
        let transport = Arc::new(PostBatches { client, url: write_url, target, compression });
        // Runs at build time, before the sink is on a runtime: plain blocking I/O is fine here.
        let (delivery, replayed) =
            Delivery::new(delivery_config, transport.clone(), UNIT).map_err(|e| BuildError::Io {
                what: format!(
                    "influxdb.spill_dir: cannot use {}",
                    config.spill_dir.as_deref().unwrap_or(std::path::Path::new("")).display()
                ),
                source: Box::new(e),
            })?;
        if replayed > 0 {
            tracing::info!(sink = NAME, lines = replayed, "replaying batches left in the spill directory");
        }
        Ok(Self { delivery, encoder, scratch: String::new(), transport, ping_url: endpoint_url(&base, "/ping") })
    }

    /// Copies the writer's counters (lines written, dropped, rejected, buffered, …).
    pub fn stats(&self) -> InfluxStats {
        InfluxStats::from(self.delivery.stats())
    }

    /// A cloneable handle on the counters, usable after the sink is moved into an agent.
    pub fn stats_handle(&self) -> InfluxStatsHandle {
        InfluxStatsHandle(self.delivery.shared())
    }

    /// The encoder in use (its measurement names, extra tags).
    pub fn encoder(&self) -> &LineProtocolEncoder {
        &self.encoder
    }
}

#[async_trait::async_trait]
impl Sink for InfluxSink {
    fn name(&self) -> &str {
        NAME
    }

    /// Keeps the telemetry to report lines dropped from the outage buffer in the agent's
    /// [`SinkStatus::dropped`](gpumon_core::SinkStatus::dropped).
    fn attach_telemetry(&mut self, telemetry: Telemetry) {
        self.delivery.attach_telemetry(telemetry);
    }

    /// `GET /ping` (InfluxDB 1.x/2.x and VictoriaMetrics answer 204). Also starts the writer, so
    /// spilled batches are replayed right away.
    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        self.delivery.start()?;
        let ping = self.ping_url.clone();
        let probed = self.transport.client.probe(ping, None).await;
        probed.map_err(|e| SinkError::transient(e.message(&format!("GET {}", self.ping_url))))
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        let (encoder, scratch) = (&self.encoder, &mut self.scratch);
        self.delivery.append(|open| {
            scratch.clear();
            let encoded = encoder.encode_snapshot(&snapshot, scratch);
            if open.is_empty() {
                // The snapshot is the whole batch so far (as at rates no faster than the batch
                // interval): hand its bytes over instead of copying them; the open batch's empty
                // buffer becomes the next scratch.
                let spare = std::mem::replace(open, std::mem::take(scratch).into_bytes());
                *scratch = String::from_utf8(spare).unwrap_or_default();
            } else {
                open.extend_from_slice(scratch.as_bytes());
            }
            encoded.lines
        })
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        self.delivery.flush().await
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        self.delivery.shutdown().await
    }
}

/// Line protocol shrinks about tenfold; `fast` keeps the writer's CPU low.
fn gzip(body: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::fast());
    gz.write_all(body).and_then(|()| gz.finish()).map_err(|e| e.to_string())
}

/// The URL without its query (which may name databases but never carries secrets here; kept
/// short for messages).
fn redact_url(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn endpoint_urls_keep_path_prefixes() {
        let base = reqwest::Url::parse("http://proxy:80/influx/").unwrap();
        assert_eq!(endpoint_url(&base, "/write").as_str(), "http://proxy/influx/write");
        let base = reqwest::Url::parse("http://h:8086").unwrap();
        assert_eq!(endpoint_url(&base, "/api/v2/write").as_str(), "http://h:8086/api/v2/write");
    }

    #[test]
    fn urls_carry_the_api_parameters() {
        let mut c = InfluxConfig::v1("http://h:8086", "my db");
        c.rp = Some("week".into());
        let s = InfluxSink::from_config(&c).unwrap();
        assert_eq!(s.transport.url.as_str(), "http://h:8086/write?db=my+db&rp=week&precision=ns");
        assert_eq!(s.transport.target, "POST http://h:8086/write");
        let s = InfluxSink::from_config(&InfluxConfig::v2("http://h:8086", "o", "b", "t")).unwrap();
        assert_eq!(s.transport.url.as_str(), "http://h:8086/api/v2/write?org=o&bucket=b&precision=ns");
    }

    use crate::http::test_server::{Reply, TestServer};
    use gpumon_core::{DeviceInfo, DeviceSample, SystemInfo};

    /// One GPU reporting only `up`: one line per snapshot.
    fn snapshot() -> Arc<Snapshot> {
        let device = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-x", "X")));
        Arc::new(Snapshot::new(Arc::new(SystemInfo::new("h", "t")), vec![device]))
    }

    /// Only `flush` (or `batch_points`) seals a batch; fast retries unless a test says otherwise.
    fn config(url: &str) -> InfluxConfig {
        let mut c = InfluxConfig::v1(url, "db");
        c.batch_interval = Duration::from_secs(600);
        c.retry_initial = Duration::from_millis(10);
        c.retry_max = Duration::from_millis(50);
        c
    }

    async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gpumon-influx-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn writes_gzipped_line_protocol_with_the_configured_auth() {
        let server = TestServer::start(Reply::status(204)).await;
        let mut c = InfluxConfig::v2(&server.url, "o", "b", "t0k");
        c.batch_interval = Duration::from_secs(600);
        assert!(c.gzip, "gzip is the default");
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.healthcheck().await.unwrap();
        sink.export(snapshot()).await.unwrap();
        sink.flush().await.unwrap();
        let c =
            InfluxConfig { username: Some("u".into()), password: Some("p".into()), gzip: false, ..config(&server.url) };
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        sink.flush().await.unwrap();
        let received = server.received();
        let heads: Vec<&str> = received.iter().map(|(head, _)| head.as_str()).collect();
        assert!(heads[0].starts_with("get /ping ") && !heads[0].contains("authorization"), "{}", heads[0]);
        assert!(heads[1].starts_with("post /api/v2/write?org=o&bucket=b&precision=ns "), "{}", heads[1]);
        for h in ["authorization: token t0k", "content-encoding: gzip", "content-type: text/plain; charset=utf-8"] {
            assert!(heads[1].contains(h), "missing {h} in {}", heads[1]);
        }
        assert!(heads[2].contains("authorization: basic dtpw") && !heads[2].contains("gzip"), "{}", heads[2]);
        assert!(received[2].1.starts_with(b"gpu,"), "{:?}", String::from_utf8_lossy(&received[2].1));
    }

    /// After `shutdown` a healthcheck is refused without asking the server.
    #[tokio::test]
    async fn healthcheck_after_shutdown_is_refused() {
        let server = TestServer::start(Reply::status(204)).await;
        let mut sink = InfluxSink::from_config(&config(&server.url)).unwrap();
        sink.healthcheck().await.unwrap();
        sink.shutdown().await.unwrap();
        assert!(matches!(sink.healthcheck().await, Err(SinkError::AlreadyShutdown)));
        assert_eq!(server.requests(), 1, "only the first healthcheck pings");
    }

    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn writes_over_https_and_names_the_url_when_the_certificate_is_refused() {
        let server = TestServer::start_tls(Reply::status(204)).await;
        let ca = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/testdata/tls");
        let mut c = config(&server.url);
        c.tls = crate::tls::TlsConfig::with_ca_file(ca.join("ca.pem"));
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        sink.flush().await.unwrap();
        assert_eq!((sink.stats().lines_written, server.requests()), (1, 1));

        c.tls = crate::tls::TlsConfig::with_ca_file(ca.join("localhost.pem"));
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        let e = sink.flush().await.unwrap_err().to_string();
        assert!(e.contains(&format!("{}/write", server.url)) && e.contains("influxdb.tls.ca_file"), "{e}");
        assert_eq!(server.requests(), 1, "nothing reaches the server through a refused handshake");
    }

    #[tokio::test]
    async fn flush_does_not_cut_short_a_retry_after() {
        let server = TestServer::start(Reply::with(429, &["Retry-After: 30"], r#"{"error":"slow down"}"#)).await;
        let mut sink = InfluxSink::from_config(&config(&server.url)).unwrap();
        sink.export(snapshot()).await.unwrap();
        let e = sink.flush().await.unwrap_err().to_string();
        assert!(e.contains("429") && e.contains("slow down"), "{e}");
        assert_eq!(server.requests(), 1);

        sink.export(snapshot()).await.unwrap_err(); // takes the snapshot, reports the failure
        let started = Instant::now();
        let e = sink.flush().await.unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(1), "flush returns at once during the server's wait");
        assert!(e.starts_with("transient") && e.contains("Retry-After") && e.contains("2 lines buffered"), "{e}");
        assert!(e.contains("next attempt in 29.") || e.contains("next attempt in 30.0"), "{e}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(server.requests(), 1, "nothing is sent before Retry-After ends");
        assert_eq!(sink.stats().lines_buffered, 2);
    }

    #[tokio::test]
    async fn flush_does_not_cut_short_the_pause_after_an_auth_failure() {
        let server = TestServer::start(Reply::with(401, &[], r#"{"error":"authorization failed"}"#)).await;
        let mut c = config(&server.url);
        c.retry_max = Duration::from_secs(30);
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        let e = sink.flush().await.unwrap_err().to_string();
        assert!(e.starts_with("permanent") && e.contains("401"), "{e}");
        for _ in 0..3 {
            let e = sink.flush().await.unwrap_err().to_string();
            assert!(e.starts_with("permanent") && e.contains("retry_max") && e.contains("authorization failed"), "{e}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(server.requests(), 1, "a flush during the pause sends nothing");
        // Shutdown does not hammer either: it keeps (here: loses, no spill_dir) the data and says so.
        let e = sink.shutdown().await.unwrap_err().to_string();
        assert!(e.contains("1 lines not written"), "{e}");
        assert_eq!(server.requests(), 1);
    }

    #[tokio::test]
    async fn flush_retries_at_once_during_the_writers_own_backoff() {
        let server = TestServer::start(Reply::with(503, &[], "busy")).await;
        let mut c = config(&server.url);
        c.retry_initial = Duration::from_secs(20); // jittered: 0..=20 s
        c.retry_max = Duration::from_secs(60);
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        assert!(sink.flush().await.unwrap_err().to_string().contains("503"));
        server.set(Reply::status(204));
        let before = server.requests();
        sink.flush().await.expect("no server-requested wait: the flush tries again at once");
        assert!(server.requests() > before);
        assert_eq!(sink.stats().lines_written, 1);
    }

    #[tokio::test]
    async fn an_endless_error_body_is_cut_short() {
        let prefix = r#"{"error":"partial write: unable to parse 'gpu,x'"#;
        let server = TestServer::start(Reply::Endless { status: 400, prefix: prefix.to_owned() }).await;
        let mut c = config(&server.url);
        c.timeout = Duration::from_secs(30);
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        let started = Instant::now();
        // The refused batch is dropped, so there is nothing left to write. Reading the whole body
        // would last until the 30 s timeout and lose the server's message.
        sink.flush().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        let stats = sink.stats();
        let e = stats.last_error.clone().unwrap_or_default();
        assert!(e.contains("HTTP 400") && e.contains("unable to parse 'gpu,x'xxx"), "{e}");
        assert!(e.len() < 1000, "{e}");
        assert_eq!(stats.lines_rejected, 1);
    }

    #[tokio::test]
    async fn spill_files_are_written_only_for_what_could_not_be_sent() {
        let dir = temp_dir("only-on-failure");
        let server = TestServer::start(Reply::status(204)).await;
        let mut c = config(&server.url);
        c.spill_dir = Some(dir.clone());
        let mut sink = InfluxSink::from_config(&c).unwrap();
        let dir_mtime = || std::fs::metadata(&dir).unwrap().modified().unwrap();
        let created = dir_mtime();
        tokio::time::sleep(Duration::from_millis(50)).await;

        // Healthy server: no file is created (the directory itself is never modified).
        for _ in 0..5 {
            sink.export(snapshot()).await.unwrap();
            sink.flush().await.unwrap();
        }
        assert_eq!((server.requests(), sink.stats().batches_spilled), (5, 0));
        assert_eq!(dir_mtime(), created, "no spill file was written (and deleted) while writes succeed");

        // Failing server: the batch that could not be written is spilled.
        server.set(Reply::status(503));
        sink.export(snapshot()).await.unwrap();
        sink.flush().await.unwrap_err();
        sink.export(snapshot()).await.unwrap_err();
        sink.flush().await.unwrap_err();
        eventually("both unsent batches spilled", || files(&dir).len() == 2).await;
        assert!(files(&dir).iter().all(|f| f.ends_with("-1.lp")), "{:?}", files(&dir));
        assert_eq!(sink.stats().batches_spilled, 2);

        // Recovery: written, then deleted.
        server.set(Reply::status(204));
        sink.flush().await.unwrap();
        eventually("spill files deleted once written", || files(&dir).is_empty()).await;
        assert_eq!(sink.stats().lines_written, 7);

        // Shutdown during an outage spills what is left; the next start replays it.
        server.set(Reply::status(503));
        sink.export(snapshot()).await.unwrap();
        sink.export(snapshot()).await.unwrap();
        assert!(sink.shutdown().await.unwrap_err().to_string().contains("kept in the spill directory"));
        drop(sink);
        assert_eq!(files(&dir).len(), 1, "{:?}", files(&dir));
        let sink = InfluxSink::from_config(&c).unwrap();
        assert_eq!(sink.stats().lines_replayed, 2);
        drop(sink);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn drop_without_shutdown_spills_the_buffer() {
        let dir = temp_dir("drop");
        let mut c = config("http://127.0.0.1:9"); // never contacted: nothing is flushed
        c.spill_dir = Some(dir.clone());
        let mut sink = InfluxSink::from_config(&c).unwrap();
        sink.export(snapshot()).await.unwrap();
        sink.export(snapshot()).await.unwrap();
        assert!(files(&dir).is_empty(), "export writes nothing to disk");
        drop(sink);
        assert_eq!(InfluxSink::from_config(&c).unwrap().stats().lines_replayed, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_spill_file_does_not_stop_the_sink() {
        let dir = temp_dir("corrupt");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("00000000000000000001-1.lp"), "gpu,gpu=0 up=1i 1\n").unwrap();
        std::fs::write(dir.join("00000000000000000002-1.lp"), b"\xff\xfe garbage").unwrap();
        let mut c = config("http://127.0.0.1:9");
        c.spill_dir = Some(dir.clone());
        let sink = InfluxSink::from_config(&c).expect("a corrupt spill file is not fatal");
        let stats = sink.stats();
        assert_eq!((stats.lines_replayed, stats.spill_quarantined), (1, 1));
        drop(sink);
        assert!(files(&dir).contains(&"00000000000000000002-1.lp.bad".to_owned()), "{:?}", files(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn buffer_drops_show_in_the_agents_sink_status() {
        let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
        let mut lines = String::new();
        let request = gpumon_core::SampleRequest::default();
        let mut sample = gpumon_core::Sampler::sample(&sampler, &request).unwrap();
        // As the agent hands it to its sinks (the default families: no per-reason clock events).
        sample.retain_exported(request.metrics, request.metrics);
        let per_snapshot = super::super::encode_snapshot(&sample, &mut lines).lines;
        // Nothing listens there: every write fails, and the buffer holds one snapshot.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut c = config(&format!("http://127.0.0.1:{port}"));
        c.batch_points = per_snapshot;
        c.buffer_max_points = per_snapshot;
        let sink = InfluxSink::from_config(&c).unwrap();
        let stats = sink.stats_handle();
        let agent = gpumon_core::Agent::builder(sampler).scheduled(false).sink(sink).spawn().unwrap();
        for _ in 0..4 {
            let _ = agent.flush(Duration::from_secs(5)).await; // samples, exports, flushes (fails)
        }
        let dropped = stats.stats().lines_dropped;
        assert!(dropped >= 2 * per_snapshot as u64, "{:?}", stats.stats());
        let status = agent.sink_status().into_iter().find(|s| s.name == "influxdb").unwrap();
        assert_eq!(status.dropped, dropped, "{status:?}");
        let _ = agent.shutdown(Duration::from_secs(5)).await;
        let status = agent.sink_status().into_iter().find(|s| s.name == "influxdb").unwrap();
        assert_eq!(status.dropped, stats.stats().lines_dropped);
    }
}

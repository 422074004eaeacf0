//! The HTTP writer: `InfluxSink` (the `Sink` the agent calls) and its background writer task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpumon_core::{BuildError, Sink, SinkError, Snapshot};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::buffer::{Batch, Buffer};
use super::config::{ApiVersion, InfluxConfig};
use super::encode::LineProtocolEncoder;
use crate::retry::{parse_retry_after, Backoff};

/// A point-in-time copy of the writer's counters (see [`InfluxSink::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InfluxStats {
    /// Lines (points) acknowledged by the server.
    pub lines_written: u64,
    /// Lines dropped because the outage buffer was full (oldest first).
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
    /// The last write error (with the server's message), cleared by the next success.
    pub last_error: Option<String>,
}

/// A cloneable view of an [`InfluxSink`]'s counters that stays valid after the sink has been
/// moved into an agent.
#[derive(Clone, Debug)]
pub struct InfluxStatsHandle(Arc<Shared>);

impl InfluxStatsHandle {
    /// Copies the current counters.
    pub fn stats(&self) -> InfluxStats {
        self.0.stats()
    }
}

/// How a write failed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Failure {
    /// Network error, timeout, 5xx, 429, 408: retry with backoff (or after Retry-After).
    Retry { message: String, retry_after: Option<Duration> },
    /// 401/403/404: the data is fine but the server will not take it until someone fixes the
    /// credentials or creates the database. Keep the data; try again only after `retry_max`.
    Hold { message: String },
    /// Other 4xx: the batch itself was refused; retrying cannot help. Drop it and count it.
    Reject { message: String },
}

impl Failure {
    fn message(&self) -> &str {
        match self {
            Failure::Retry { message, .. } | Failure::Hold { message } | Failure::Reject { message } => message,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    lines_written: AtomicU64,
    lines_rejected: AtomicU64,
    batches_written: AtomicU64,
    requests: AtomicU64,
    failed_requests: AtomicU64,
    lines_replayed: AtomicU64,
}

#[derive(Debug)]
struct State {
    buffer: Buffer,
    /// The current failure, cleared by the next successful write.
    failure: Option<Failure>,
    /// Failed attempts so far (monotonic), so that `flush` can tell whether one failed after it
    /// started.
    attempts_failed: u64,
    /// Ask the writer to seal the open batch and try at once (ignoring the current backoff).
    kick: bool,
    /// Ask the writer to exit.
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the writer (a batch was sealed, a flush or stop was asked for).
    wake: Notify,
    /// The writer finished an attempt (for `flush` waiters).
    progress: Notify,
    counters: Counters,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stats(&self) -> InfluxStats {
        let c = &self.counters;
        let st = self.lock();
        InfluxStats {
            lines_written: c.lines_written.load(Ordering::Relaxed),
            lines_dropped: st.buffer.dropped_lines,
            lines_rejected: c.lines_rejected.load(Ordering::Relaxed),
            lines_buffered: st.buffer.lines() as u64,
            bytes_buffered: st.buffer.bytes() as u64,
            batches_written: c.batches_written.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            failed_requests: c.failed_requests.load(Ordering::Relaxed),
            lines_replayed: c.lines_replayed.load(Ordering::Relaxed),
            spill_errors: st.buffer.spill_errors,
            last_error: st.failure.as_ref().map(|f| f.message().to_owned()),
        }
    }
}

/// Where and how to write.
#[derive(Debug)]
struct Endpoint {
    write_url: reqwest::Url,
    ping_url: reqwest::Url,
    basic: Option<(String, Option<String>)>,
    token: Option<String>,
    gzip: bool,
}

/// The InfluxDB sink: encodes each snapshot into a batch and returns at once; a background task
/// sends batches in order, retrying and buffering through outages. See the [module
/// docs](crate::influxdb) for the schema and the delivery guarantees.
///
/// `export` never waits for the network. While writes fail it still takes the snapshot (into the
/// bounded buffer) and returns the current write error, so the agent's
/// [`SinkStatus`](gpumon_core::SinkStatus) shows what the server said.
pub struct InfluxSink {
    shared: Arc<Shared>,
    encoder: LineProtocolEncoder,
    endpoint: Arc<Endpoint>,
    client: reqwest::Client,
    batch_lines: usize,
    batch_interval: Duration,
    backoff: Backoff,
    writer: Option<JoinHandle<()>>,
    shut_down: bool,
}

impl std::fmt::Debug for InfluxSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InfluxSink")
            .field("write_url", &self.endpoint.write_url.as_str())
            .field("batch_lines", &self.batch_lines)
            .field("batch_interval", &self.batch_interval)
            .finish_non_exhaustive()
    }
}

fn endpoint_url(base: &reqwest::Url, path: &str) -> reqwest::Url {
    let mut url = base.clone();
    let joined = format!("{}{}", base.path().trim_end_matches('/'), path);
    url.set_path(&joined);
    url
}

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
        let endpoint = Endpoint {
            write_url,
            ping_url: endpoint_url(&base, "/ping"),
            basic: config.username.clone().map(|u| (u, config.password.clone())),
            token: config.token.clone(),
            gzip: config.gzip,
        };
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(50))
            .user_agent(concat!("gpumon/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| BuildError::Io { what: "influxdb: building the HTTP client".into(), source: Box::new(e) })?;

        let mut encoder = LineProtocolEncoder::new(&config.measurement);
        for (k, v) in &config.tags {
            encoder = encoder.with_tag(k, v);
        }

        let mut buffer = Buffer::new(config.buffer_max_points, config.buffer_max_bytes, config.spill_dir.clone());
        let replayed = buffer.load_spill().map_err(|e| BuildError::Io {
            what: format!(
                "influxdb.spill_dir: cannot use {}",
                config.spill_dir.as_deref().unwrap_or(std::path::Path::new("")).display()
            ),
            source: Box::new(e),
        })?;
        if replayed > 0 {
            tracing::info!(sink = "influxdb", lines = replayed, "replaying batches left in the spill directory");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State { buffer, failure: None, attempts_failed: 0, kick: replayed > 0, stop: false }),
            wake: Notify::new(),
            progress: Notify::new(),
            counters: Counters::default(),
        });
        shared.counters.lines_replayed.store(replayed as u64, Ordering::Relaxed);
        Ok(Self {
            shared,
            encoder,
            endpoint: Arc::new(endpoint),
            client,
            batch_lines: config.batch_points,
            batch_interval: config.batch_interval,
            backoff: Backoff { initial: config.retry_initial, max: config.retry_max },
            writer: None,
            shut_down: false,
        })
    }

    /// Copies the writer's counters (lines written, dropped, rejected, buffered, …).
    pub fn stats(&self) -> InfluxStats {
        self.shared.stats()
    }

    /// A cloneable handle on the counters, usable after the sink is moved into an agent.
    pub fn stats_handle(&self) -> InfluxStatsHandle {
        InfluxStatsHandle(self.shared.clone())
    }

    /// The encoder in use (its measurement names, extra tags).
    pub fn encoder(&self) -> &LineProtocolEncoder {
        &self.encoder
    }

    fn ensure_writer(&mut self) {
        if self.writer.is_some() {
            return;
        }
        let writer = Writer {
            shared: self.shared.clone(),
            endpoint: self.endpoint.clone(),
            client: self.client.clone(),
            batch_interval: self.batch_interval,
            backoff: self.backoff,
        };
        self.writer = Some(tokio::spawn(writer.run()));
    }

    fn current_error(&self) -> Result<(), SinkError> {
        let st = self.shared.lock();
        match &st.failure {
            None => Ok(()),
            Some(f) => {
                let held = st.buffer.lines();
                let message = format!("{} ({held} lines buffered)", f.message());
                Err(match f {
                    Failure::Retry { .. } => SinkError::transient(message),
                    Failure::Hold { .. } | Failure::Reject { .. } => SinkError::permanent(message),
                })
            }
        }
    }

    /// Seals the open batch, wakes the writer, and waits until everything is written or an
    /// attempt fails (returning that failure).
    async fn drain(&mut self) -> Result<(), SinkError> {
        self.ensure_writer();
        let started_failures = {
            let mut st = self.shared.lock();
            st.buffer.seal();
            st.kick = true;
            st.attempts_failed
        };
        self.shared.wake.notify_one();
        loop {
            let progressed = self.shared.progress.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            {
                let st = self.shared.lock();
                if st.buffer.is_empty() {
                    return Ok(());
                }
                if st.attempts_failed > started_failures {
                    drop(st);
                    return self.current_error().and(Err(SinkError::transient("write failed")));
                }
            }
            progressed.await;
        }
    }
}

#[async_trait::async_trait]
impl Sink for InfluxSink {
    fn name(&self) -> &str {
        "influxdb"
    }

    /// `GET /ping` (InfluxDB 1.x/2.x and VictoriaMetrics answer 204). Also starts the writer, so
    /// spilled batches are replayed right away.
    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.ensure_writer();
        let response = self
            .client
            .get(self.endpoint.ping_url.clone())
            .send()
            .await
            .map_err(|e| SinkError::transient(format!("GET {}: {}", self.endpoint.ping_url, error_chain(&e))))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(SinkError::transient(format!("GET {}: HTTP {}", self.endpoint.ping_url, response.status())))
        }
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.ensure_writer();
        let sealed = {
            let mut st = self.shared.lock();
            let b = &mut st.buffer;
            let encoded = self.encoder.encode_snapshot(&snapshot, &mut b.open);
            if encoded.lines > 0 && b.open_since.is_none() {
                b.open_since = Some(Instant::now());
            }
            b.open_lines += encoded.lines;
            let sealed = b.open_lines >= self.batch_lines;
            if sealed {
                b.seal();
            }
            let dropped = b.enforce_bounds();
            if dropped > 0 {
                tracing::debug!(sink = "influxdb", dropped, "outage buffer full; oldest lines dropped");
            }
            sealed || encoded.lines > 0
        };
        if sealed {
            self.shared.wake.notify_one();
        }
        self.current_error()
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Ok(());
        }
        self.drain().await
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        let drained = self.drain().await;
        let left = {
            let mut st = self.shared.lock();
            st.stop = true;
            st.buffer.seal();
            st.buffer.persist();
            st.buffer.lines()
        };
        self.shared.wake.notify_one();
        if let Some(writer) = self.writer.take() {
            // The writer exits after its current request (bounded by the request timeout); it
            // is not waited for beyond a moment, the spill files already hold what is unsent.
            let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
        }
        match drained {
            Ok(()) => Ok(()),
            Err(e) => {
                let spilled = self.shared.lock().buffer.spill_dir.is_some();
                let fate =
                    if spilled { "kept in the spill directory for the next start" } else { "lost (no spill_dir)" };
                Err(SinkError::transient(format!("{e}; {left} lines not written, {fate}")))
            }
        }
    }
}

impl Drop for InfluxSink {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.stop = true;
        st.buffer.seal();
        st.buffer.persist();
        drop(st);
        self.shared.wake.notify_one();
    }
}

/// The background task: sends sealed batches one at a time, in order.
struct Writer {
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
    client: reqwest::Client,
    batch_interval: Duration,
    backoff: Backoff,
}

enum Next {
    Send(Batch),
    Wait(Option<Instant>),
    Stop,
}

impl Writer {
    async fn run(self) {
        let mut attempt: u32 = 0;
        let mut not_before: Option<Instant> = None;
        let mut failing_since: Option<(Instant, u64)> = None;
        loop {
            let woken = self.shared.wake.notified();
            let next = {
                let mut st = self.shared.lock();
                let now = Instant::now();
                if std::mem::take(&mut st.kick) {
                    not_before = None;
                }
                if st.stop {
                    Next::Stop
                } else {
                    let b = &mut st.buffer;
                    if b.open_since.is_some_and(|t| now.duration_since(t) >= self.batch_interval) {
                        b.seal();
                    }
                    b.persist();
                    let ready = not_before.is_none_or(|t| now >= t);
                    match b.queue.pop_front() {
                        Some(batch) if ready => {
                            b.inflight = Some((batch.lines, batch.body.len()));
                            Next::Send(batch)
                        }
                        other => {
                            if let Some(batch) = other {
                                b.queue.push_front(batch);
                            }
                            let seal_at = b.open_since.map(|t| t + self.batch_interval);
                            let retry_at = if b.queue.is_empty() { None } else { not_before };
                            Next::Wait(match (seal_at, retry_at) {
                                (Some(a), Some(r)) => Some(a.min(r)),
                                (a, r) => a.or(r),
                            })
                        }
                    }
                }
            };
            match next {
                Next::Stop => return,
                Next::Wait(until) => match until {
                    Some(t) => {
                        let _ = tokio::time::timeout_at(t.into(), woken).await;
                    }
                    None => woken.await,
                },
                Next::Send(batch) => {
                    let result = self.send(&batch).await;
                    let c = &self.shared.counters;
                    c.requests.fetch_add(1, Ordering::Relaxed);
                    let mut st = self.shared.lock();
                    st.buffer.inflight = None;
                    match result {
                        Ok(()) => {
                            c.lines_written.fetch_add(batch.lines as u64, Ordering::Relaxed);
                            c.batches_written.fetch_add(1, Ordering::Relaxed);
                            st.buffer.remove_file(&batch);
                            if st.failure.take().is_some() {
                                if let Some((since, failures)) = failing_since.take() {
                                    tracing::info!(
                                        sink = "influxdb",
                                        failed_attempts = st.attempts_failed - failures,
                                        outage = ?since.elapsed(),
                                        buffered_lines = st.buffer.lines(),
                                        "writes to InfluxDB recovered"
                                    );
                                }
                            }
                            attempt = 0;
                            not_before = None;
                        }
                        Err(failure) => {
                            c.failed_requests.fetch_add(1, Ordering::Relaxed);
                            st.attempts_failed += 1;
                            if failing_since.is_none() {
                                failing_since = Some((Instant::now(), st.attempts_failed - 1));
                            }
                            // Log once per distinct failure, not per attempt.
                            if st.failure.as_ref().map(Failure::message) != Some(failure.message()) {
                                tracing::warn!(sink = "influxdb", error = %failure.message(), "InfluxDB write failed");
                            } else {
                                tracing::debug!(sink = "influxdb", error = %failure.message(), "InfluxDB write failed again");
                            }
                            match &failure {
                                Failure::Reject { .. } => {
                                    c.lines_rejected.fetch_add(batch.lines as u64, Ordering::Relaxed);
                                    st.buffer.remove_file(&batch);
                                }
                                Failure::Retry { retry_after, .. } => {
                                    let delay = retry_after
                                        .map(|d| d.min(Duration::from_secs(300)))
                                        .unwrap_or_else(|| self.backoff.delay(attempt));
                                    attempt = attempt.saturating_add(1);
                                    not_before = Some(Instant::now() + delay);
                                    st.buffer.queue.push_front(batch);
                                }
                                Failure::Hold { .. } => {
                                    not_before = Some(Instant::now() + self.backoff.max);
                                    st.buffer.queue.push_front(batch);
                                }
                            }
                            st.failure = Some(failure);
                        }
                    }
                    drop(st);
                    self.shared.progress.notify_waiters();
                }
            }
        }
    }

    async fn send(&self, batch: &Batch) -> Result<(), Failure> {
        let ep = &self.endpoint;
        let mut request =
            self.client.post(ep.write_url.clone()).header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8");
        let body = if ep.gzip {
            use std::io::Write as _;
            let mut gz =
                flate2::write::GzEncoder::new(Vec::with_capacity(batch.body.len() / 4), flate2::Compression::fast());
            gz.write_all(batch.body.as_bytes())
                .and_then(|()| gz.finish())
                .map_err(|e| Failure::Reject { message: format!("gzip: {e}") })?
        } else {
            batch.body.as_bytes().to_vec()
        };
        if ep.gzip {
            request = request.header(reqwest::header::CONTENT_ENCODING, "gzip");
        }
        if let Some((user, password)) = &ep.basic {
            request = request.basic_auth(user, password.as_ref());
        }
        if let Some(token) = &ep.token {
            request = request.header(reqwest::header::AUTHORIZATION, format!("Token {token}"));
        }
        let target = format!("POST {}", redact_url(&ep.write_url));
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| Failure::Retry { message: format!("{target}: {}", error_chain(&e)), retry_after: None })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let text = response.text().await.unwrap_or_default();
        let server = server_message(&text);
        let message = format!("{target}: HTTP {status}{}{server}", if server.is_empty() { "" } else { ": " });
        let code = status.as_u16();
        Err(match code {
            408 | 429 | 500..=599 => Failure::Retry { message, retry_after },
            401 | 403 | 404 => Failure::Hold { message },
            _ => Failure::Reject { message },
        })
    }
}

/// The server's error text: InfluxDB answers `{"error":"…"}`; VictoriaMetrics plain text.
fn server_message(body: &str) -> String {
    let body = body.trim();
    let inner = body
        .strip_prefix("{\"error\":\"")
        .and_then(|s| s.strip_suffix("\"}"))
        .map(|s| s.replace("\\\"", "\"").replace("\\\\", "\\"))
        .unwrap_or_else(|| body.to_owned());
    let mut s: String = inner.chars().take(500).collect();
    if inner.chars().count() > 500 {
        s.push('…');
    }
    s
}

/// The URL without its query (which may name databases but never carries secrets here; kept
/// short for messages).
fn redact_url(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// `error: source: source…` — reqwest's own Display hides the cause (e.g. "connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_are_unwrapped() {
        assert_eq!(server_message("{\"error\":\"authorization failed\"}\n"), "authorization failed");
        assert_eq!(server_message("plain text"), "plain text");
        assert!(server_message(&"x".repeat(2000)).ends_with('…'));
    }

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
        assert_eq!(s.endpoint.write_url.as_str(), "http://h:8086/write?db=my+db&rp=week&precision=ns");
        let s = InfluxSink::from_config(&InfluxConfig::v2("http://h:8086", "o", "b", "t")).unwrap();
        assert_eq!(s.endpoint.write_url.as_str(), "http://h:8086/api/v2/write?org=o&bucket=b&precision=ns");
        assert_eq!(s.endpoint.token.as_deref(), Some("t"));
    }
}

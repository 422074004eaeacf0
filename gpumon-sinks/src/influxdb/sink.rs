//! The HTTP writer: `InfluxSink` (the `Sink` the agent calls) and its background writer task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpumon_core::{BuildError, Sink, SinkError, Snapshot, Telemetry};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::buffer::{Buffer, SpillDone, SpillIo};
use super::config::{ApiVersion, InfluxConfig};
use super::encode::LineProtocolEncoder;
use crate::http_util::{error_chain, read_body_capped, retry_after, MAX_ERROR_BODY};
use crate::retry::Backoff;
use crate::tls::certificate_hint;

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

/// Why the writer waits before its next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PauseKind {
    /// Its own jittered exponential backoff (network error, or 5xx without `Retry-After`).
    Backoff,
    /// The server's `Retry-After`.
    RetryAfter,
    /// `retry_max` after 401/403/404.
    Hold,
}

#[derive(Clone, Copy, Debug)]
struct Pause {
    until: Instant,
    kind: PauseKind,
}

impl Pause {
    /// A wait the server asked for, still running: `flush` must not cut it short.
    fn server_requested(&self, now: Instant) -> bool {
        self.kind != PauseKind::Backoff && self.until > now
    }
}

#[derive(Debug)]
struct State {
    buffer: Buffer,
    /// The current failure, cleared by the next successful write.
    failure: Option<Failure>,
    /// Failed attempts so far (monotonic), so that `flush` can tell whether one failed after it
    /// started.
    attempts_failed: u64,
    /// When the writer may try again, and why it waits.
    pause: Option<Pause>,
    /// Ask the writer to seal the open batch and try at once — cutting short its own backoff, but
    /// not a wait the server asked for.
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
            batches_spilled: st.buffer.batches_spilled,
            spill_quarantined: st.buffer.quarantined,
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
    /// The agent's telemetry, to report buffer drops in the sink's status.
    telemetry: Option<Telemetry>,
    /// Dropped lines already reported through `telemetry`.
    drops_reported: u64,
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
        let builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(50))
            .user_agent(concat!("gpumon/", env!("CARGO_PKG_VERSION")));
        let client = crate::tls::reqwest_tls(builder, &config.tls, "influxdb.tls", &base)?
            .build()
            .map_err(|e| BuildError::Io { what: "influxdb: building the HTTP client".into(), source: Box::new(e) })?;

        let mut encoder = LineProtocolEncoder::new(&config.measurement);
        for (k, v) in &config.tags {
            encoder = encoder.with_tag(k, v);
        }

        let mut buffer = Buffer::new(config.buffer_max_points, config.buffer_max_bytes, config.spill_dir.clone());
        // Runs at build time, before the sink is on a runtime: plain blocking I/O is fine here.
        let replayed = buffer.load_spill().map_err(|e| BuildError::Io {
            what: format!(
                "influxdb.spill_dir: cannot use {}",
                config.spill_dir.as_deref().unwrap_or(std::path::Path::new("")).display()
            ),
            source: Box::new(e),
        })?;
        if replayed > 0 {
            tracing::info!(sink = NAME, lines = replayed, "replaying batches left in the spill directory");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buffer,
                failure: None,
                attempts_failed: 0,
                pause: None,
                kick: replayed > 0,
                stop: false,
            }),
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
            telemetry: None,
            drops_reported: 0,
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

    /// Reports buffer drops not yet reported to the agent (they show in its
    /// `SinkStatus::dropped`).
    fn report_drops(&mut self, dropped_total: u64) {
        if let Some(t) = &self.telemetry {
            let new = dropped_total.saturating_sub(self.drops_reported);
            if new > 0 {
                t.record_dropped(NAME, new);
                self.drops_reported = dropped_total;
            }
        }
    }

    /// Seals the open batch, wakes the writer, and waits until everything is written or an
    /// attempt fails (returning that failure).
    ///
    /// The writer tries at once, cutting short its own backoff — unless the server asked it to
    /// wait (`Retry-After`, or the `retry_max` pause after 401/403/404) and that wait is still
    /// running: then nothing is sent and the error says when the next attempt is due.
    async fn drain(&mut self) -> Result<(), SinkError> {
        self.ensure_writer();
        let started_failures = {
            let mut st = self.shared.lock();
            st.buffer.seal();
            let now = Instant::now();
            if let Some(pause) = st.pause.filter(|p| p.server_requested(now) && !st.buffer.is_empty()) {
                let failure = st.failure.as_ref().map_or("InfluxDB write failed", Failure::message);
                let wait = pause.until.saturating_duration_since(now).as_secs_f64();
                let why = match pause.kind {
                    PauseKind::RetryAfter => "the server asked to wait (Retry-After)",
                    _ => "after this error the writer retries only every `retry_max`",
                };
                let message = format!(
                    "{failure}; not retried before the next attempt in {wait:.1}s: {why} ({} lines buffered)",
                    st.buffer.lines()
                );
                return Err(match pause.kind {
                    PauseKind::Hold => SinkError::permanent(message),
                    _ => SinkError::transient(message),
                });
            }
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
        NAME
    }

    /// Keeps the telemetry to report lines dropped from the outage buffer in the agent's
    /// [`SinkStatus::dropped`](gpumon_core::SinkStatus::dropped).
    fn attach_telemetry(&mut self, telemetry: Telemetry) {
        self.telemetry = Some(telemetry);
    }

    /// `GET /ping` (InfluxDB 1.x/2.x and VictoriaMetrics answer 204). Also starts the writer, so
    /// spilled batches are replayed right away.
    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.ensure_writer();
        let response = self.client.get(self.endpoint.ping_url.clone()).send().await.map_err(|e| {
            let detail = error_chain(&e);
            let hint = certificate_hint(&detail, "influxdb.tls");
            SinkError::transient(format!("GET {}: {detail}{hint}", self.endpoint.ping_url))
        })?;
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
        let (wake, dropped_total) = {
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
                tracing::debug!(sink = NAME, dropped, "outage buffer full; oldest lines dropped");
            }
            // A dropped batch may leave a spill file for the writer to delete.
            (sealed || encoded.lines > 0 || !b.obsolete.is_empty(), b.dropped_lines)
        };
        if wake {
            self.shared.wake.notify_one();
        }
        self.report_drops(dropped_total);
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
        // Everything still buffered goes to the spill directory (off the runtime).
        let io = {
            let mut st = self.shared.lock();
            st.stop = true;
            st.buffer.seal();
            st.buffer.spill_io(true, true)
        };
        if let Some(io) = io {
            let done = run_spill_io(io).await;
            self.shared.lock().buffer.apply(done);
        }
        let (left, dropped_total) = {
            let st = self.shared.lock();
            (st.buffer.lines(), st.buffer.dropped_lines)
        };
        self.report_drops(dropped_total);
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
    /// Dropped without `shutdown`: spills what is still buffered, with blocking I/O (there is no
    /// `await` in a destructor; this happens once). After `shutdown` there is nothing left to do.
    fn drop(&mut self) {
        let io = {
            let mut st = self.shared.lock();
            st.stop = true;
            st.buffer.seal();
            st.buffer.spill_io(true, true)
        };
        if let Some(io) = io {
            let done = io.run();
            self.shared.lock().buffer.apply(done);
        }
        self.shared.wake.notify_one();
    }
}

/// Runs spill-file work on tokio's blocking pool.
async fn run_spill_io(io: SpillIo) -> SpillDone {
    tokio::task::spawn_blocking(move || io.run())
        .await
        .unwrap_or_else(|e| SpillDone::failed(format!("spill I/O task failed: {e}")))
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
    /// Send the batch now in flight (its body).
    Send(Arc<str>),
    Wait(Option<Instant>),
    Stop,
}

impl Writer {
    async fn run(self) {
        let mut attempt: u32 = 0;
        let mut failing_since: Option<(Instant, u64)> = None;
        loop {
            let woken = self.shared.wake.notified();
            let (next, io) = {
                let mut st = self.shared.lock();
                let now = Instant::now();
                if std::mem::take(&mut st.kick) && st.pause.is_some_and(|p| p.kind == PauseKind::Backoff) {
                    st.pause = None;
                }
                if st.stop {
                    // `shutdown` (or drop) spilled what is buffered; only deletions are left.
                    (Next::Stop, st.buffer.spill_io(false, false))
                } else {
                    // While writes fail, queued batches go to the spill directory too; while they
                    // succeed nothing is written to disk.
                    let failing = st.failure.is_some();
                    let ready = st.pause.is_none_or(|p| now >= p.until);
                    let retry_at = st.pause.map(|p| p.until);
                    let b = &mut st.buffer;
                    if b.open_since.is_some_and(|t| now.duration_since(t) >= self.batch_interval) {
                        b.seal();
                    }
                    let io = b.spill_io(failing, false);
                    let next = match b.queue.pop_front() {
                        Some(batch) if ready => {
                            let body = batch.body.clone();
                            b.inflight = Some(batch);
                            Next::Send(body)
                        }
                        other => {
                            if let Some(batch) = other {
                                b.queue.push_front(batch);
                            }
                            let seal_at = b.open_since.map(|t| t + self.batch_interval);
                            let retry_at = if b.queue.is_empty() { None } else { retry_at };
                            Next::Wait(match (seal_at, retry_at) {
                                (Some(a), Some(r)) => Some(a.min(r)),
                                (a, r) => a.or(r),
                            })
                        }
                    };
                    (next, io)
                }
            };
            // File I/O runs on the blocking pool, without the lock `export` needs.
            let mut again = false;
            if let Some(io) = io {
                let done = run_spill_io(io).await;
                again = self.shared.lock().buffer.apply(done);
            }
            match next {
                Next::Stop => {
                    if again {
                        let io = self.shared.lock().buffer.spill_io(false, false);
                        if let Some(io) = io {
                            let done = run_spill_io(io).await;
                            self.shared.lock().buffer.apply(done);
                        }
                    }
                    return;
                }
                Next::Wait(_) if again => {} // delete the files that became obsolete meanwhile
                Next::Wait(until) => match until {
                    Some(t) => {
                        let _ = tokio::time::timeout_at(t.into(), woken).await;
                    }
                    None => woken.await,
                },
                Next::Send(body) => {
                    let result = self.send(&body).await;
                    let c = &self.shared.counters;
                    c.requests.fetch_add(1, Ordering::Relaxed);
                    let mut st = self.shared.lock();
                    let Some(batch) = st.buffer.inflight.take() else { continue };
                    match result {
                        Ok(()) => {
                            c.lines_written.fetch_add(batch.lines as u64, Ordering::Relaxed);
                            c.batches_written.fetch_add(1, Ordering::Relaxed);
                            st.buffer.done_with(batch);
                            if st.failure.take().is_some() {
                                if let Some((since, failures)) = failing_since.take() {
                                    tracing::info!(
                                        sink = NAME,
                                        failed_attempts = st.attempts_failed - failures,
                                        outage = ?since.elapsed(),
                                        buffered_lines = st.buffer.lines(),
                                        "writes to InfluxDB recovered"
                                    );
                                }
                            }
                            attempt = 0;
                            st.pause = None;
                        }
                        Err(failure) => {
                            c.failed_requests.fetch_add(1, Ordering::Relaxed);
                            st.attempts_failed += 1;
                            if failing_since.is_none() {
                                failing_since = Some((Instant::now(), st.attempts_failed - 1));
                            }
                            // Log once per distinct failure, not per attempt.
                            if st.failure.as_ref().map(Failure::message) != Some(failure.message()) {
                                tracing::warn!(sink = NAME, error = %failure.message(), "InfluxDB write failed");
                            } else {
                                tracing::debug!(sink = NAME, error = %failure.message(), "InfluxDB write failed again");
                            }
                            match &failure {
                                Failure::Reject { .. } => {
                                    c.lines_rejected.fetch_add(batch.lines as u64, Ordering::Relaxed);
                                    st.buffer.done_with(batch);
                                    st.pause = None;
                                }
                                Failure::Retry { retry_after, .. } => {
                                    let (delay, kind) = match retry_after {
                                        Some(d) => ((*d).min(Duration::from_secs(300)), PauseKind::RetryAfter),
                                        None => (self.backoff.delay(attempt), PauseKind::Backoff),
                                    };
                                    attempt = attempt.saturating_add(1);
                                    st.pause = Some(Pause { until: Instant::now() + delay, kind });
                                    st.buffer.queue.push_front(batch);
                                }
                                Failure::Hold { .. } => {
                                    let until = Instant::now() + self.backoff.max;
                                    st.pause = Some(Pause { until, kind: PauseKind::Hold });
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

    async fn send(&self, body: &str) -> Result<(), Failure> {
        let ep = &self.endpoint;
        let mut request =
            self.client.post(ep.write_url.clone()).header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8");
        let body = if ep.gzip {
            use std::io::Write as _;
            let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::fast());
            gz.write_all(body.as_bytes())
                .and_then(|()| gz.finish())
                .map_err(|e| Failure::Reject { message: format!("gzip: {e}") })?
        } else {
            body.as_bytes().to_vec()
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
        let response = request.body(body).send().await.map_err(|e| {
            let detail = error_chain(&e);
            let hint = certificate_hint(&detail, "influxdb.tls");
            Failure::Retry { message: format!("{target}: {detail}{hint}"), retry_after: None }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = retry_after(&response);
        let text = read_body_capped(response, MAX_ERROR_BODY).await;
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

    use crate::http_util::test_server::{Reply, TestServer};
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
        let sample = gpumon_core::Sampler::sample(&sampler, &gpumon_core::SampleRequest::default()).unwrap();
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

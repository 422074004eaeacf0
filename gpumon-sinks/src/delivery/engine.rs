//! The background writer behind [`Delivery`]: moved here from the InfluxDB sink so that the
//! remote-write sink gets the same batching, retry and outage semantics (see the module docs of
//! [`crate::delivery`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpumon_core::{SinkError, Telemetry};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::buffer::{Batch, Buffer, SpillDone, SpillIo};
use crate::http::retry::{Backoff, Failure, Next as RetryNext, Retrier};

/// How one sealed batch goes on the wire: the sink's request, sent and classified by the shared
/// HTTP client ([`crate::http`]).
#[async_trait::async_trait]
pub(crate) trait Transport: Send + Sync + 'static {
    /// Sends one batch (the bytes the sink encoded, uncompressed; cloning them is free, so an
    /// uncompressed request can carry them as its body).
    async fn send(&self, body: &bytes::Bytes) -> Result<(), Failure>;
}

/// What a sink calls things, for its log lines and error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unit {
    /// The sink's name (status, logs, `Telemetry::record_dropped`).
    pub(crate) sink: &'static str,
    /// The server, in prose: "InfluxDB", "remote write".
    pub(crate) service: &'static str,
    /// What is counted: "lines", "samples".
    pub(crate) items: &'static str,
}

/// Batching, bounds and retry settings.
#[derive(Clone, Debug)]
pub(crate) struct DeliveryConfig {
    pub(crate) batch_items: usize,
    pub(crate) batch_interval: Duration,
    pub(crate) max_items: usize,
    pub(crate) max_bytes: usize,
    pub(crate) spill_dir: Option<PathBuf>,
    pub(crate) backoff: Backoff,
}

/// A point-in-time copy of the writer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeliveryStats {
    pub(crate) written: u64,
    pub(crate) dropped: u64,
    pub(crate) rejected: u64,
    pub(crate) buffered: u64,
    pub(crate) bytes_buffered: u64,
    pub(crate) batches_written: u64,
    pub(crate) requests: u64,
    pub(crate) failed_requests: u64,
    pub(crate) replayed: u64,
    pub(crate) spill_errors: u64,
    pub(crate) batches_spilled: u64,
    pub(crate) spill_quarantined: u64,
    pub(crate) last_error: Option<String>,
}

#[derive(Debug, Default)]
struct Counters {
    written: AtomicU64,
    rejected: AtomicU64,
    batches_written: AtomicU64,
    requests: AtomicU64,
    failed_requests: AtomicU64,
    replayed: AtomicU64,
}

/// Why the writer waits before its next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PauseKind {
    /// Its own jittered exponential backoff (network error, or 5xx without `Retry-After`).
    Backoff,
    /// The server's `Retry-After`.
    RetryAfter,
    /// `backoff.max` after 401/403/404 or an untrusted server certificate.
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

/// The state shared by the sink and its writer task.
#[derive(Debug)]
pub(crate) struct Shared {
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

    /// Copies the counters.
    pub(crate) fn stats(&self) -> DeliveryStats {
        let c = &self.counters;
        let st = self.lock();
        DeliveryStats {
            written: c.written.load(Ordering::Relaxed),
            dropped: st.buffer.dropped_lines,
            rejected: c.rejected.load(Ordering::Relaxed),
            buffered: st.buffer.lines() as u64,
            bytes_buffered: st.buffer.bytes() as u64,
            batches_written: c.batches_written.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            failed_requests: c.failed_requests.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            spill_errors: st.buffer.spill_errors,
            batches_spilled: st.buffer.batches_spilled,
            spill_quarantined: st.buffer.quarantined,
            last_error: st.failure.as_ref().map(|f| f.message().to_owned()),
        }
    }
}

/// The sink side of the writer: append, flush, shutdown. One per sink.
pub(crate) struct Delivery {
    shared: Arc<Shared>,
    transport: Arc<dyn Transport>,
    unit: Unit,
    batch_items: usize,
    batch_interval: Duration,
    backoff: Backoff,
    writer: Option<JoinHandle<()>>,
    shut_down: bool,
    /// The agent's telemetry, to report buffer drops in the sink's status.
    telemetry: Option<Telemetry>,
    /// Dropped items already reported through `telemetry`.
    drops_reported: u64,
    /// When [`Delivery::append`] last took data.
    last_append: Option<Instant>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("sink", &self.unit.sink)
            .field("batch_items", &self.batch_items)
            .field("batch_interval", &self.batch_interval)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// Builds the buffer and replays whatever a previous run left in the spill directory
    /// (blocking I/O: call it before the sink is on a runtime). Returns the items replayed.
    pub(crate) fn new(
        config: DeliveryConfig,
        transport: Arc<dyn Transport>,
        unit: Unit,
    ) -> std::io::Result<(Self, usize)> {
        let mut buffer = Buffer::new(config.max_items, config.max_bytes, config.spill_dir);
        buffer.sink = unit.sink;
        let replayed = buffer.load_spill()?;
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
        shared.counters.replayed.store(replayed as u64, Ordering::Relaxed);
        let delivery = Self {
            shared,
            transport,
            unit,
            batch_items: config.batch_items,
            batch_interval: config.batch_interval,
            backoff: config.backoff,
            writer: None,
            shut_down: false,
            telemetry: None,
            drops_reported: 0,
            last_append: None,
        };
        Ok((delivery, replayed))
    }

    /// The counters, shareable after the sink moved into an agent.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    pub(crate) fn stats(&self) -> DeliveryStats {
        self.shared.stats()
    }

    /// What a sink's healthcheck does first: refused after `shutdown`, else the writer is started
    /// (so batches spilled by an earlier run are replayed right away).
    pub(crate) fn start(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.ensure_writer();
        Ok(())
    }

    pub(crate) fn attach_telemetry(&mut self, telemetry: Telemetry) {
        self.telemetry = Some(telemetry);
    }

    /// Starts the writer task (needs a runtime) unless it runs already.
    pub(crate) fn ensure_writer(&mut self) {
        if self.writer.is_some() {
            return;
        }
        let writer = Writer {
            shared: self.shared.clone(),
            transport: self.transport.clone(),
            unit: self.unit,
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
                let message = format!("{} ({held} {} buffered)", f.message(), self.unit.items);
                Err(f.sink_error(message))
            }
        }
    }

    /// Reports buffer drops not yet reported to the agent (they show in its
    /// `SinkStatus::dropped`).
    fn report_drops(&mut self, dropped_total: u64) {
        if let Some(t) = &self.telemetry {
            let new = dropped_total.saturating_sub(self.drops_reported);
            if new > 0 {
                t.record_dropped(self.unit.sink, new);
                self.drops_reported = dropped_total;
            }
        }
    }

    /// Appends one snapshot: `encode` writes into the open batch and returns the items it wrote.
    /// Seals at `batch_items` — or at once when this append comes about a `batch_interval` or more
    /// after the previous one (nine tenths of it: exports on a schedule at that very interval
    /// arrive a little early or late): at such rates a batch would wait out the interval alone
    /// and then be sent alone anyway, so sealing now spares the data the wait.
    /// Enforces the bounds, wakes the writer; returns the current write error (the data is
    /// taken either way).
    pub(crate) fn append(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> usize) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.ensure_writer();
        let now = Instant::now();
        let slow = self.last_append.is_some_and(|t| now.duration_since(t) >= self.batch_interval * 9 / 10);
        self.last_append = Some(now);
        let (wake, dropped_total) = {
            let mut st = self.shared.lock();
            let b = &mut st.buffer;
            let items = encode(&mut b.open);
            if items > 0 && b.open_since.is_none() {
                b.open_since = Some(now);
            }
            b.open_lines += items;
            let sealed = b.open_lines >= self.batch_items || (slow && b.open_lines > 0);
            if sealed {
                b.seal();
            }
            let dropped = b.enforce_bounds();
            if dropped > 0 {
                tracing::debug!(sink = self.unit.sink, dropped, "outage buffer full; oldest data dropped");
            }
            // A dropped batch may leave a spill file for the writer to delete.
            (sealed || items > 0 || !b.obsolete.is_empty(), b.dropped_lines)
        };
        if wake {
            self.shared.wake.notify_one();
        }
        self.report_drops(dropped_total);
        self.current_error()
    }

    /// Seals the open batch, wakes the writer, and waits until everything is written or an
    /// attempt fails (returning that failure).
    ///
    /// The writer tries at once, cutting short its own backoff — unless the server asked it to
    /// wait (`Retry-After`, or the `retry_max` pause after a held failure) and that wait is still
    /// running: then nothing is sent and the error says when the next attempt is due.
    async fn drain(&mut self) -> Result<(), SinkError> {
        self.ensure_writer();
        let started_failures = {
            let mut st = self.shared.lock();
            st.buffer.seal();
            let now = Instant::now();
            if let Some(pause) = st.pause.filter(|p| p.server_requested(now) && !st.buffer.is_empty()) {
                let default = format!("{} write failed", self.unit.service);
                let failure = st.failure.as_ref().map_or(default.as_str(), Failure::message);
                let wait = pause.until.saturating_duration_since(now).as_secs_f64();
                let why = match pause.kind {
                    PauseKind::RetryAfter => "the server asked to wait (Retry-After)",
                    _ => "after this error the writer retries only every `retry_max`",
                };
                let message = format!(
                    "{failure}; not retried before the next attempt in {wait:.1}s: {why} ({} {} buffered)",
                    st.buffer.lines(),
                    self.unit.items
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

    /// [`Sink::flush`](gpumon_core::Sink::flush).
    pub(crate) async fn flush(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Ok(());
        }
        self.drain().await
    }

    /// [`Sink::shutdown`](gpumon_core::Sink::shutdown): drains once, spills what is left.
    pub(crate) async fn shutdown(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        let drained = self.drain().await;
        // Everything still buffered goes to the spill directory (off the runtime).
        let io = self.stop_and_seal();
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
                Err(SinkError::transient(format!("{e}; {left} {} not written, {fate}", self.unit.items)))
            }
        }
    }

    /// Tells the writer to stop and seals the buffer: the I/O that spills everything still
    /// buffered, in-flight batches included.
    fn stop_and_seal(&self) -> Option<SpillIo> {
        let mut st = self.shared.lock();
        st.stop = true;
        st.buffer.seal();
        st.buffer.spill_io(true, true)
    }
}

impl Drop for Delivery {
    /// Dropped without `shutdown`: spills what is still buffered, with blocking I/O (there is no
    /// `await` in a destructor; this happens once). After `shutdown` there is nothing left to do.
    fn drop(&mut self) {
        let io = self.stop_and_seal();
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
    transport: Arc<dyn Transport>,
    unit: Unit,
    batch_interval: Duration,
    backoff: Backoff,
}

enum Next {
    /// Send the batch now in flight (its body).
    Send(bytes::Bytes),
    Wait(Option<Instant>),
    Stop,
}

impl Writer {
    async fn run(self) {
        // The tries' backoff and the outage in progress: the Pushgateway's loop, in the background.
        let mut retrier = Retrier::new(self.backoff);
        loop {
            let woken = self.shared.wake.notified();
            let (next, io) = self.next_step(&mut self.shared.lock());
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
                    let result = self.transport.send(&body).await;
                    let c = &self.shared.counters;
                    c.requests.fetch_add(1, Ordering::Relaxed);
                    let mut st = self.shared.lock();
                    let Some(batch) = st.buffer.inflight.take() else { continue };
                    match result {
                        Ok(()) => self.written(&mut st, batch, &mut retrier),
                        Err(failure) => self.failed(&mut st, batch, failure, &mut retrier),
                    }
                    drop(st);
                    self.shared.progress.notify_waiters();
                }
            }
        }
    }

    /// Under the lock: what to do next, and the spill I/O to run first (outside the lock).
    fn next_step(&self, st: &mut State) -> (Next, Option<SpillIo>) {
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
    }

    /// A batch was written: count it, end an outage (saying how long it lasted).
    fn written(&self, st: &mut State, batch: Batch, retrier: &mut Retrier) {
        let (sink, service, c) = (self.unit.sink, self.unit.service, &self.shared.counters);
        c.written.fetch_add(batch.lines as u64, Ordering::Relaxed);
        c.batches_written.fetch_add(1, Ordering::Relaxed);
        st.buffer.done_with(batch);
        st.failure = None;
        if let Some(outage) = retrier.succeeded() {
            tracing::info!(
                sink,
                failed_attempts = outage.failed_tries,
                outage = ?outage.lasted,
                buffered = st.buffer.lines(),
                "writes to {service} recovered"
            );
        }
        st.pause = None;
        if st.buffer.drained_after_backlog() {
            // The backlog's batches are freed now, but the allocator keeps
            // the pages for reuse: without this the outage's high-water mark
            // stays as RSS (a 10 min outage: tens of MiB) until exit.
            tracing::debug!(sink, "outage buffer drained; returning freed memory to the system");
            tokio::task::spawn_blocking(super::release_freed_memory);
        }
    }

    /// A batch failed: count and log it (once per distinct failure), then drop it (refused),
    /// retry it after a backoff or the server's `Retry-After`, or hold it.
    fn failed(&self, st: &mut State, batch: Batch, failure: Failure, retrier: &mut Retrier) {
        let (sink, service, c) = (self.unit.sink, self.unit.service, &self.shared.counters);
        c.failed_requests.fetch_add(1, Ordering::Relaxed);
        st.attempts_failed += 1;
        let next = retrier.failed(&failure);
        // Log once per distinct failure, not per attempt.
        if retrier.log_once(failure.message()) {
            match next {
                RetryNext::Drop => tracing::warn!(
                    sink,
                    error = %failure.message(),
                    dropped = batch.lines,
                    "{service} write refused by the server; the batch is dropped, not retried"
                ),
                _ => tracing::warn!(sink, error = %failure.message(), "{service} write failed"),
            }
        } else {
            tracing::debug!(sink, error = %failure.message(), "{service} write failed again");
        }
        match next {
            RetryNext::Drop => {
                c.rejected.fetch_add(batch.lines as u64, Ordering::Relaxed);
                st.buffer.done_with(batch);
                st.pause = None;
            }
            RetryNext::Retry { delay, server_asked } => {
                let kind = if server_asked { PauseKind::RetryAfter } else { PauseKind::Backoff };
                st.pause = Some(Pause { until: Instant::now() + delay, kind });
                st.buffer.queue.push_front(batch);
            }
            RetryNext::Hold(wait) => {
                st.pause = Some(Pause { until: Instant::now() + wait, kind: PauseKind::Hold });
                st.buffer.queue.push_front(batch);
            }
        }
        st.failure = Some(failure);
    }
}

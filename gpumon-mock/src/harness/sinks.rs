//! Test sinks: [`RecordingSink`] keeps what it gets; [`FaultySink`] misbehaves on cue.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpumon_core::{Sink, SinkError, Snapshot};
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Record {
    snapshots: Mutex<Vec<Arc<Snapshot>>>,
    flushes: AtomicUsize,
    shutdowns: AtomicUsize,
    shut_down: AtomicBool,
    changed: Notify,
}

/// A sink that keeps every snapshot it is given. Clones share storage, so a test keeps one clone
/// and hands the other to the agent.
///
/// `shutdown` is idempotent; `export` after it returns [`SinkError::AlreadyShutdown`].
#[derive(Clone, Debug)]
pub struct RecordingSink {
    name: String,
    record: Arc<Record>,
}

impl Default for RecordingSink {
    fn default() -> Self {
        Self::new("recording")
    }
}

impl RecordingSink {
    /// An empty recorder called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), record: Arc::default() }
    }

    /// Every snapshot exported so far, in order.
    pub fn snapshots(&self) -> Vec<Arc<Snapshot>> {
        self.lock().clone()
    }

    /// The last snapshot exported.
    pub fn last(&self) -> Option<Arc<Snapshot>> {
        self.lock().last().cloned()
    }

    /// How many snapshots were exported.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was exported yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many times `flush` was called.
    pub fn flush_count(&self) -> usize {
        self.record.flushes.load(Ordering::SeqCst)
    }

    /// How many times `shutdown` was called.
    pub fn shutdown_count(&self) -> usize {
        self.record.shutdowns.load(Ordering::SeqCst)
    }

    /// Whether `shutdown` was called.
    pub fn is_shut_down(&self) -> bool {
        self.record.shut_down.load(Ordering::SeqCst)
    }

    /// Forgets the snapshots recorded so far.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Waits until at least `n` snapshots were exported; `false` if `timeout` passed first.
    /// Uses tokio time, so it works with paused time.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.record.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.len() >= n {
                return true;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return self.len() >= n;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Snapshot>>> {
        self.record.snapshots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, snapshot: Arc<Snapshot>) {
        self.lock().push(snapshot);
        self.record.changed.notify_waiters();
    }
}

#[async_trait::async_trait]
impl Sink for RecordingSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        if self.is_shut_down() {
            return Err(SinkError::AlreadyShutdown);
        }
        self.push(snapshot);
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        self.record.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        self.record.shutdowns.fetch_add(1, Ordering::SeqCst);
        self.record.shut_down.store(true, Ordering::SeqCst);
        self.record.changed.notify_waiters();
        Ok(())
    }
}

/// Which kind of error [`Behavior::Fail`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailKind {
    /// [`SinkError::Transient`] (retryable).
    Transient,
    /// [`SinkError::Permanent`].
    Permanent,
}

/// What one call of a [`FaultySink`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Behavior {
    /// Succeeds at once.
    Ok,
    /// Returns an error.
    Fail(FailKind),
    /// Never completes (pending forever).
    Stall,
    /// Sleeps (tokio time), then succeeds.
    Delay(Duration),
    /// Panics.
    Panic,
}

type Script = Arc<dyn Fn(usize) -> Behavior + Send + Sync>;

fn constant(b: Behavior) -> Script {
    Arc::new(move |_| b)
}

fn scripted(script: Vec<Behavior>) -> Script {
    Arc::new(move |i| script.get(i).copied().unwrap_or(Behavior::Ok))
}

/// How many calls a [`FaultySink`] received; shared with the test through
/// [`FaultySink::calls`].
#[derive(Debug, Default)]
pub struct FaultyCalls {
    exports: AtomicUsize,
    flushes: AtomicUsize,
    shutdowns: AtomicUsize,
    healthchecks: AtomicUsize,
}

impl FaultyCalls {
    /// `export` calls started.
    pub fn exports(&self) -> usize {
        self.exports.load(Ordering::SeqCst)
    }
    /// `flush` calls started.
    pub fn flushes(&self) -> usize {
        self.flushes.load(Ordering::SeqCst)
    }
    /// `shutdown` calls started.
    pub fn shutdowns(&self) -> usize {
        self.shutdowns.load(Ordering::SeqCst)
    }
    /// `healthcheck` calls started.
    pub fn healthchecks(&self) -> usize {
        self.healthchecks.load(Ordering::SeqCst)
    }
}

/// A sink that fails, stalls, sleeps or panics on cue — per call, for export, flush, shutdown
/// and healthcheck separately. Exports that succeed are recorded in [`FaultySink::recorder`].
///
/// ```
/// use std::time::Duration;
/// use gpumon_mock::{Behavior, FailKind, FaultySink};
///
/// // Fails every third export, and its shutdown never returns.
/// let sink = FaultySink::new("flaky")
///     .on_export(|i| if i % 3 == 2 { Behavior::Fail(FailKind::Transient) } else { Behavior::Ok })
///     .shutdown_behavior(Behavior::Stall);
/// let calls = sink.calls();
/// assert_eq!(calls.exports(), 0);
/// ```
#[derive(Clone)]
pub struct FaultySink {
    name: String,
    export: Script,
    flush: Script,
    shutdown: Script,
    healthcheck: Script,
    calls: Arc<FaultyCalls>,
    recorder: RecordingSink,
    shut_down: bool,
}

impl std::fmt::Debug for FaultySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultySink").field("name", &self.name).field("calls", &self.calls).finish_non_exhaustive()
    }
}

impl FaultySink {
    /// A sink called `name` whose every call succeeds until told otherwise.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            recorder: RecordingSink::new(name.clone()),
            name,
            export: constant(Behavior::Ok),
            flush: constant(Behavior::Ok),
            shutdown: constant(Behavior::Ok),
            healthcheck: constant(Behavior::Ok),
            calls: Arc::default(),
            shut_down: false,
        }
    }

    /// Export call `i` (from 0) behaves as `f(i)`.
    #[must_use]
    pub fn on_export(mut self, f: impl Fn(usize) -> Behavior + Send + Sync + 'static) -> Self {
        self.export = Arc::new(f);
        self
    }

    /// Export calls follow `script`; calls past its end succeed.
    #[must_use]
    pub fn export_script(mut self, script: Vec<Behavior>) -> Self {
        self.export = scripted(script);
        self
    }

    /// Every export behaves as `b`.
    #[must_use]
    pub fn export_behavior(mut self, b: Behavior) -> Self {
        self.export = constant(b);
        self
    }

    /// Flush call `i` behaves as `f(i)`.
    #[must_use]
    pub fn on_flush(mut self, f: impl Fn(usize) -> Behavior + Send + Sync + 'static) -> Self {
        self.flush = Arc::new(f);
        self
    }

    /// Every flush behaves as `b`.
    #[must_use]
    pub fn flush_behavior(mut self, b: Behavior) -> Self {
        self.flush = constant(b);
        self
    }

    /// Shutdown call `i` behaves as `f(i)`. Once one completes (even with an error), later calls
    /// return `Ok` at once: shutdown is idempotent.
    #[must_use]
    pub fn on_shutdown(mut self, f: impl Fn(usize) -> Behavior + Send + Sync + 'static) -> Self {
        self.shutdown = Arc::new(f);
        self
    }

    /// Every shutdown behaves as `b` (e.g. [`Behavior::Stall`] for a sink whose shutdown hangs).
    #[must_use]
    pub fn shutdown_behavior(mut self, b: Behavior) -> Self {
        self.shutdown = constant(b);
        self
    }

    /// Every healthcheck behaves as `b`.
    #[must_use]
    pub fn healthcheck_behavior(mut self, b: Behavior) -> Self {
        self.healthcheck = constant(b);
        self
    }

    /// Call counters, shared with every clone.
    pub fn calls(&self) -> Arc<FaultyCalls> {
        self.calls.clone()
    }

    /// The snapshots whose export succeeded (shared storage).
    pub fn recorder(&self) -> RecordingSink {
        self.recorder.clone()
    }

    async fn act(&self, what: &str, index: usize, b: Behavior) -> Result<(), SinkError> {
        match b {
            Behavior::Ok => Ok(()),
            Behavior::Fail(FailKind::Transient) => {
                Err(SinkError::transient(format!("{}: scripted transient failure of {what} #{index}", self.name)))
            }
            Behavior::Fail(FailKind::Permanent) => {
                Err(SinkError::permanent(format!("{}: scripted permanent failure of {what} #{index}", self.name)))
            }
            Behavior::Stall => std::future::pending().await,
            Behavior::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Behavior::Panic => panic!("{}: scripted panic in {what} #{index}", self.name),
        }
    }
}

#[async_trait::async_trait]
impl Sink for FaultySink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        let i = self.calls.exports.fetch_add(1, Ordering::SeqCst);
        self.act("export", i, (self.export)(i)).await?;
        self.recorder.push(snapshot);
        Ok(())
    }

    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        let i = self.calls.healthchecks.fetch_add(1, Ordering::SeqCst);
        self.act("healthcheck", i, (self.healthcheck)(i)).await
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        let i = self.calls.flushes.fetch_add(1, Ordering::SeqCst);
        self.recorder.record.flushes.fetch_add(1, Ordering::SeqCst);
        self.act("flush", i, (self.flush)(i)).await
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Ok(());
        }
        let i = self.calls.shutdowns.fetch_add(1, Ordering::SeqCst);
        let result = self.act("shutdown", i, (self.shutdown)(i)).await;
        self.shut_down = true;
        self.recorder.record.shutdowns.fetch_add(1, Ordering::SeqCst);
        self.recorder.record.shut_down.store(true, Ordering::SeqCst);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumon_core::SystemInfo;

    fn snap() -> Arc<Snapshot> {
        Arc::new(Snapshot::new(Arc::new(SystemInfo::new("h", "test")), Vec::new()))
    }

    #[tokio::test]
    async fn recording_sink_shares_storage_and_shuts_down_once() {
        let rec = RecordingSink::default();
        let mut sink = rec.clone();
        sink.export(snap()).await.unwrap();
        sink.flush().await.unwrap();
        assert_eq!((rec.len(), rec.flush_count()), (1, 1));
        sink.shutdown().await.unwrap();
        sink.shutdown().await.unwrap();
        assert!(rec.is_shut_down());
        assert_eq!(rec.shutdown_count(), 2);
        assert!(matches!(sink.export(snap()).await, Err(SinkError::AlreadyShutdown)));
        assert_eq!(rec.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_wakes_or_times_out() {
        let rec = RecordingSink::default();
        assert!(!rec.wait_for(1, Duration::from_secs(5)).await);
        let mut sink = rec.clone();
        let waiter = tokio::spawn({
            let rec = rec.clone();
            async move { rec.wait_for(2, Duration::from_secs(5)).await }
        });
        tokio::task::yield_now().await;
        sink.export(snap()).await.unwrap();
        sink.export(snap()).await.unwrap();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn faulty_sink_follows_its_script() {
        let mut sink = FaultySink::new("bad").export_script(vec![
            Behavior::Ok,
            Behavior::Fail(FailKind::Transient),
            Behavior::Fail(FailKind::Permanent),
            Behavior::Delay(Duration::from_secs(3)),
        ]);
        let calls = sink.calls();
        assert!(sink.export(snap()).await.is_ok());
        assert!(sink.export(snap()).await.unwrap_err().is_retryable());
        assert!(matches!(sink.export(snap()).await, Err(SinkError::Permanent(_))));
        let t = tokio::time::Instant::now();
        assert!(sink.export(snap()).await.is_ok());
        assert_eq!(t.elapsed(), Duration::from_secs(3));
        assert_eq!(calls.exports(), 4);
        assert_eq!(sink.recorder().len(), 2, "only successful exports are recorded");
        sink.shutdown().await.unwrap();
        sink.shutdown().await.unwrap();
        assert_eq!(calls.shutdowns(), 1);
        assert!(matches!(sink.export(snap()).await, Err(SinkError::AlreadyShutdown)));
    }

    #[tokio::test(start_paused = true)]
    async fn faulty_sink_stalls_and_panics() {
        let mut sink = FaultySink::new("stuck").export_behavior(Behavior::Stall).shutdown_behavior(Behavior::Panic);
        let r = tokio::time::timeout(Duration::from_secs(3600), sink.export(snap())).await;
        assert!(r.is_err(), "a stalled export never completes");
        let panicked = tokio::spawn(async move { sink.shutdown().await }).await;
        assert!(panicked.unwrap_err().is_panic());
    }
}

/// A sink that takes every snapshot and keeps nothing: the baseline for benchmarks of the
/// runtime, and a placeholder where an agent needs a sink but the output does not matter.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullSink;

#[async_trait::async_trait]
impl Sink for NullSink {
    fn name(&self) -> &str {
        "null"
    }
    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        std::hint::black_box(snapshot);
        Ok(())
    }
    async fn shutdown(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

//! One task per sink: the sink's queue, its timeouts, and panic isolation.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::model::Snapshot;
use crate::sink::{Sink, SinkError};
use crate::telemetry::{SinkState, SinkStatusCell};

use super::panic_message;
use super::queue::SinkQueue;
use super::sampling::Taken;
use super::SinkOptions;

/// What the agent asks of a worker, outside the data queue (so it is never dropped when the queue
/// overflows).
pub(crate) enum WorkerCommand {
    /// Export everything queued, then `snapshot` (the flush's own sample, or the
    /// sampling-failed snapshot when it failed), then flush.
    Flush { snapshot: Taken, reply: oneshot::Sender<Result<(), SinkError>> },
    /// Export everything queued, flush, shut down, exit.
    Shutdown { reply: oneshot::Sender<Result<(), SinkError>> },
}

/// A sink as the runtime holds it: its own task and, for a sink that exports inline
/// ([`Sink::exports_inline`]), the sampling thread, which only ever `try_lock`s it (a sink busy
/// on its task is never waited for; the tick goes through the queue instead).
pub(crate) type SharedSink = Arc<tokio::sync::Mutex<Box<dyn Sink>>>;

pub(crate) struct Worker {
    pub(crate) sink: SharedSink,
    pub(crate) calls: Calls,
    pub(crate) commands: mpsc::Receiver<WorkerCommand>,
    /// [`Sink::records_stage_inputs`]: which form of a flush's snapshot the sink gets.
    pub(crate) records_stage_inputs: bool,
}

/// What every call on a sink needs besides the sink: its queue, status, name and timeouts.
pub(crate) struct Calls {
    pub(crate) name: String,
    pub(crate) queue: Arc<SinkQueue>,
    pub(crate) status: SinkStatusCell,
    pub(crate) options: SinkOptions,
}

/// Runs one sink call under a timeout, turning a panic into [`SinkError::Panicked`].
async fn guarded(timeout: Duration, call: impl Future<Output = Result<(), SinkError>>) -> Result<(), SinkError> {
    match tokio::time::timeout(timeout, AssertUnwindSafe(call).catch_unwind()).await {
        Err(_) => Err(SinkError::Timeout(timeout)),
        Ok(Err(payload)) => Err(SinkError::Panicked(panic_message(&*payload))),
        Ok(Ok(result)) => result,
    }
}

impl Worker {
    pub(crate) async fn run(mut self) {
        let calls = &self.calls;
        // The sink is locked for each piece of work, so that an inline sink's ticks go inline
        // whenever its task is idle; snapshots are popped only under the lock, which keeps them in
        // order with the inline ones (see `Outlet::deliver`).
        {
            let mut sink = self.sink.lock().await;
            let health = guarded(calls.options.healthcheck_timeout, async { sink.healthcheck().await }).await;
            calls.queue.started();
            match &health {
                Ok(()) => calls.status.update(|s| s.healthy = Some(true)),
                Err(e) => {
                    tracing::warn!(sink = %calls.name, error = %e, "sink healthcheck failed; it will keep trying to export");
                    calls.status.update(|s| {
                        s.healthy = Some(false);
                        s.last_error = Some(e.to_string());
                    });
                }
            }
        }

        loop {
            tokio::select! {
                biased;
                command = self.commands.recv() => {
                    let mut sink = self.sink.lock().await;
                    match command {
                        Some(WorkerCommand::Flush { snapshot, reply }) => {
                            let drained = calls.drain(&mut sink).await;
                            let snapshot = snapshot.for_sink(self.records_stage_inputs).clone();
                            let exported = calls.export(&mut sink, snapshot).await;
                            calls.queue.take_flush_due();
                            let flushed = calls.flush(&mut sink).await;
                            // The caller learns about every failure of this flush, the export of
                            // the flush's own snapshot included: `--once` must not exit 0 when the
                            // only sample it took never arrived.
                            let _ = reply.send(drained.and(exported).and(flushed));
                        }
                        Some(WorkerCommand::Shutdown { reply }) => {
                            let result = calls.finish(&mut sink).await;
                            let _ = reply.send(result);
                            return;
                        }
                        None => {
                            // The agent is gone without asking for a shutdown (it was dropped):
                            // still flush and close the sink.
                            let _ = calls.finish(&mut sink).await;
                            return;
                        }
                    }
                }
                () = calls.queue.ready() => {
                    let mut sink = self.sink.lock().await;
                    let _ = calls.drain(&mut sink).await;
                    // An inline export asked for its I/O to be done here.
                    if calls.queue.take_flush_due() {
                        let _ = calls.flush(&mut sink).await;
                    }
                }
            }
        }
    }
}

impl Calls {
    /// Exports whatever is already queued; the first failure, if any, is returned.
    async fn drain(&self, sink: &mut Box<dyn Sink>) -> Result<(), SinkError> {
        let mut first_error = Ok(());
        while let Some(snapshot) = self.queue.try_pop() {
            let result = self.export(sink, snapshot).await;
            if first_error.is_ok() {
                first_error = result;
            }
        }
        first_error
    }

    async fn export(&self, sink: &mut Box<dyn Sink>, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        let result = guarded(self.options.export_timeout, async { sink.export(snapshot).await }).await;
        self.record(clone_result(&result), true);
        result
    }

    async fn flush(&self, sink: &mut Box<dyn Sink>) -> Result<(), SinkError> {
        let result = guarded(self.options.export_timeout, async { sink.flush().await }).await;
        self.record(clone_result(&result), false);
        result
    }

    async fn finish(&self, sink: &mut Box<dyn Sink>) -> Result<(), SinkError> {
        self.queue.close();
        let drained = self.drain(sink).await;
        let flushed = self.flush(sink).await;
        let shut = guarded(self.options.export_timeout, async { sink.shutdown().await }).await;
        self.record(clone_result(&shut), false);
        self.status.update(|s| s.state = SinkState::ShutDown);
        drained.and(flushed).and(shut)
    }

    /// Records a call's outcome in the sink's status (`exported`: it was an export).
    pub(crate) fn record(&self, result: Result<(), SinkError>, exported: bool) {
        record(&self.name, &self.status, result, exported);
    }
}

/// Records a sink call's outcome in its status; the first failure of a run is logged at warn,
/// repeats at debug (a sink that is down for an hour must not write 3 600 identical warnings).
pub(crate) fn record(name: &str, status: &SinkStatusCell, result: Result<(), SinkError>, exported: bool) {
    match result {
        Ok(()) => status.succeeded(exported),
        Err(e) => {
            let mut first = false;
            status.update(|s| first = s.consecutive_failures == 0);
            if first {
                tracing::warn!(sink = %name, error = %e, "sink call failed");
            } else {
                tracing::debug!(sink = %name, error = %e, "sink call failed again");
            }
            status.failed(&e, matches!(e, SinkError::Panicked(_)));
        }
    }
}

/// `SinkError` is not `Clone` (it may hold a boxed source); a status record only needs its text.
fn clone_result(r: &Result<(), SinkError>) -> Result<(), SinkError> {
    match r {
        Ok(()) => Ok(()),
        Err(SinkError::AlreadyShutdown) => Err(SinkError::AlreadyShutdown),
        Err(SinkError::Timeout(d)) => Err(SinkError::Timeout(*d)),
        Err(SinkError::Panicked(m)) => Err(SinkError::Panicked(m.clone())),
        Err(e @ SinkError::Permanent(_)) => Err(SinkError::permanent(e.to_string())),
        Err(e) => Err(SinkError::transient(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn guarded_times_out_and_catches_panics() {
        let r = guarded(Duration::from_secs(1), std::future::pending()).await;
        assert!(matches!(r, Err(SinkError::Timeout(d)) if d == Duration::from_secs(1)));
        let r = guarded(Duration::from_secs(1), async { panic!("boom") }).await;
        assert!(matches!(r, Err(SinkError::Panicked(m)) if m == "boom"));
        // A panic before the future exists (a synchronous `fn` returning a future) is caught
        // as long as the call is wrapped in an `async` block, as the worker does.
        fn sync_part_panics() -> std::future::Ready<Result<(), SinkError>> {
            panic!("sync part")
        }
        let r = guarded(Duration::from_secs(1), async { sync_part_panics().await }).await;
        assert!(matches!(r, Err(SinkError::Panicked(m)) if m == "sync part"));
        assert!(guarded(Duration::from_secs(1), async { Ok(()) }).await.is_ok());
    }
}

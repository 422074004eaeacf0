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
use super::SinkOptions;

/// What the agent asks of a worker, outside the data queue (so it is never dropped when the queue
/// overflows).
pub(crate) enum WorkerCommand {
    /// Export everything queued, then `snapshot` (the flush's own sample, or the
    /// sampling-failed snapshot when it failed), then flush.
    Flush { snapshot: Arc<Snapshot>, reply: oneshot::Sender<Result<(), SinkError>> },
    /// Export everything queued, flush, shut down, exit.
    Shutdown { reply: oneshot::Sender<Result<(), SinkError>> },
}

pub(crate) struct Worker {
    pub(crate) sink: Box<dyn Sink>,
    pub(crate) queue: Arc<SinkQueue>,
    pub(crate) commands: mpsc::Receiver<WorkerCommand>,
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
        let name = self.sink.name().to_owned();
        let sink = &mut self.sink;
        let health = guarded(self.options.healthcheck_timeout, async { sink.healthcheck().await }).await;
        match &health {
            Ok(()) => self.status.update(|s| s.healthy = Some(true)),
            Err(e) => {
                tracing::warn!(sink = %name, error = %e, "sink healthcheck failed; it will keep trying to export");
                self.status.update(|s| {
                    s.healthy = Some(false);
                    s.last_error = Some(e.to_string());
                });
            }
        }

        let queue = self.queue.clone();
        loop {
            tokio::select! {
                biased;
                command = self.commands.recv() => match command {
                    Some(WorkerCommand::Flush { snapshot, reply }) => {
                        let drained = self.drain().await;
                        let exported = self.export(snapshot).await;
                        let flushed = self.call_flush().await;
                        // The caller learns about every failure of this flush, the export of the
                        // flush's own snapshot included: `--once` must not exit 0 when the only
                        // sample it took never arrived.
                        let _ = reply.send(drained.and(exported).and(flushed));
                    }
                    Some(WorkerCommand::Shutdown { reply }) => {
                        let result = self.finish().await;
                        let _ = reply.send(result);
                        return;
                    }
                    None => {
                        // The agent is gone without asking for a shutdown (it was dropped):
                        // still flush and close the sink.
                        let _ = self.finish().await;
                        return;
                    }
                },
                Some(snapshot) = queue.pop() => {
                    let _ = self.export(snapshot).await;
                }
            }
        }
    }

    /// Exports whatever is already queued; the first failure, if any, is returned.
    async fn drain(&mut self) -> Result<(), SinkError> {
        let mut first_error = Ok(());
        while let Some(snapshot) = self.queue.try_pop() {
            let result = self.export(snapshot).await;
            if first_error.is_ok() {
                first_error = result;
            }
        }
        first_error
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        let sink = &mut self.sink;
        let result = guarded(self.options.export_timeout, async { sink.export(snapshot).await }).await;
        self.record(clone_result(&result), true);
        result
    }

    async fn call_flush(&mut self) -> Result<(), SinkError> {
        let sink = &mut self.sink;
        let result = guarded(self.options.export_timeout, async { sink.flush().await }).await;
        self.record(clone_result(&result), false);
        result
    }

    async fn finish(&mut self) -> Result<(), SinkError> {
        self.queue.close();
        let drained = self.drain().await;
        let flushed = self.call_flush().await;
        let sink = &mut self.sink;
        let shut = guarded(self.options.export_timeout, async { sink.shutdown().await }).await;
        self.record(clone_result(&shut), false);
        self.status.update(|s| s.state = SinkState::ShutDown);
        drained.and(flushed).and(shut)
    }

    fn record(&self, result: Result<(), SinkError>, exported: bool) {
        match result {
            Ok(()) => self.status.succeeded(exported),
            Err(e) => {
                let mut first = false;
                self.status.update(|s| first = s.consecutive_failures == 0);
                // Log the first failure of a run at warn, repeats at debug: a sink that is down
                // for an hour must not write 3 600 identical warnings.
                if first {
                    tracing::warn!(sink = %self.sink.name(), error = %e, "sink call failed");
                } else {
                    tracing::debug!(sink = %self.sink.name(), error = %e, "sink call failed again");
                }
                self.status.failed(&e, matches!(e, SinkError::Panicked(_)));
            }
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

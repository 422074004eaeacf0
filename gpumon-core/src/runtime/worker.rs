//! One task per sink: the sink's queue, its timeouts, and panic isolation.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::model::Snapshot;
use crate::sink::{Sink, SinkError};
use crate::telemetry::{SinkState, SinkStatusCell};

use super::SinkOptions;

/// What the agent asks of a worker, outside the data queue (so it is never dropped when the queue
/// overflows).
pub(crate) enum WorkerCommand {
    /// Export everything queued, then `snapshot` (if any), then flush.
    Flush { snapshot: Option<Arc<Snapshot>>, reply: oneshot::Sender<Result<(), SinkError>> },
    /// Export everything queued, flush, shut down, exit.
    Shutdown { reply: oneshot::Sender<Result<(), SinkError>> },
}

pub(crate) struct Worker {
    pub(crate) sink: Box<dyn Sink>,
    pub(crate) data: broadcast::Receiver<Arc<Snapshot>>,
    pub(crate) commands: mpsc::Receiver<WorkerCommand>,
    pub(crate) status: SinkStatusCell,
    pub(crate) options: SinkOptions,
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
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
        let health = guarded(self.options.healthcheck_timeout, self.sink.healthcheck()).await;
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

        let mut data_open = true;
        loop {
            tokio::select! {
                biased;
                command = self.commands.recv() => match command {
                    Some(WorkerCommand::Flush { snapshot, reply }) => {
                        self.drain().await;
                        if let Some(s) = snapshot {
                            self.export(s).await;
                        }
                        let result = self.call_flush().await;
                        let _ = reply.send(result);
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
                received = self.data.recv(), if data_open => match received {
                    Ok(snapshot) => self.export(snapshot).await,
                    Err(broadcast::error::RecvError::Lagged(n)) => self.dropped(n),
                    Err(broadcast::error::RecvError::Closed) => data_open = false,
                },
            }
        }
    }

    /// The agent already counted these drops when it published (see `Agent::publish`).
    fn dropped(&self, n: u64) {
        tracing::warn!(sink = %self.sink.name(), dropped = n, "sink fell behind; oldest snapshots dropped");
    }

    /// Exports whatever is already queued.
    async fn drain(&mut self) {
        loop {
            match self.data.try_recv() {
                Ok(snapshot) => self.export(snapshot).await,
                Err(broadcast::error::TryRecvError::Lagged(n)) => self.dropped(n),
                Err(_) => return,
            }
        }
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) {
        let result = guarded(self.options.export_timeout, self.sink.export(snapshot)).await;
        self.record(result, true);
    }

    async fn call_flush(&mut self) -> Result<(), SinkError> {
        let result = guarded(self.options.export_timeout, self.sink.flush()).await;
        self.record(clone_result(&result), false);
        result
    }

    async fn finish(&mut self) -> Result<(), SinkError> {
        self.drain().await;
        let flushed = self.call_flush().await;
        let shut = guarded(self.options.export_timeout, self.sink.shutdown()).await;
        self.record(clone_result(&shut), false);
        self.status.update(|s| s.state = SinkState::ShutDown);
        flushed.and(shut)
    }

    fn record(&self, result: Result<(), SinkError>, exported: bool) {
        match result {
            Ok(()) => self.status.succeeded(exported),
            Err(e) => {
                let first = self.status_consecutive() == 0;
                // Log the first failure of a run at warn, repeats at debug: a sink that is down
                // for an hour must not write 3 600 identical warnings.
                if first {
                    tracing::warn!(sink = %self.sink.name(), error = %e, "sink call failed");
                } else {
                    tracing::debug!(sink = %self.sink.name(), error = %e, "sink call failed again");
                }
                self.status.failed(&e);
            }
        }
    }

    fn status_consecutive(&self) -> u64 {
        let mut n = 0;
        self.status.update(|s| n = s.consecutive_failures);
        n
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
        assert!(guarded(Duration::from_secs(1), async { Ok(()) }).await.is_ok());
    }
}

//! The background task that keeps an [`AllocationCache`] filled from the kubelet.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;

use super::{
    list_allocations, AllocationCache, Allocations, AttributionStats, KubeletConfig, KubeletError, MIN_REFRESH,
};

type Reply = oneshot::Sender<Result<usize, KubeletError>>;

/// Starts refreshing `cache` from the kubelet every [`KubeletConfig::refresh`], the first time at
/// once, in a task of the current tokio runtime; the task stops when the returned handle is
/// dropped.
///
/// Each refresh is one [`list_allocations`] call. On success the cache holds exactly what the
/// kubelet listed and [`AttributionStats::kubelet_refreshes`] counts it. On failure:
/// - [`AttributionStats::kubelet_failures`] counts it and
///   [`AttributionStats::last_error`] keeps its message;
/// - a warning is logged when the refresher starts failing or fails differently (socket missing
///   → timeout), not on every refresh, and an info line when the kubelet answers again;
/// - the previous allocations stay while fewer than [`KubeletConfig::clear_after_failures`]
///   refreshes in a row have failed: a kubelet restart of a few seconds does not strip the pod
///   labels. At that bound they are **cleared**: pods may have left during the outage, and a
///   GPU credited to a pod that no longer holds it is worse than a GPU credited to nobody. The
///   first successful refresh fills the cache again, without a restart.
///
/// # Panics
/// Outside a tokio runtime with its time driver enabled, like [`tokio::spawn`].
pub fn spawn_refresher(
    config: KubeletConfig,
    cache: AllocationCache,
    stats: Arc<AttributionStats>,
) -> KubeletRefresher {
    let (requests, inbox) = mpsc::channel(4);
    let socket = config.socket.clone();
    let task = tokio::spawn(Refresher { config, cache, stats, failures: 0, failing: None }.run(inbox));
    KubeletRefresher { requests, task, socket }
}

/// Handle of the task started by [`spawn_refresher`]. Dropping it stops the task.
#[derive(Debug)]
pub struct KubeletRefresher {
    requests: mpsc::Sender<Reply>,
    task: tokio::task::JoinHandle<()>,
    socket: std::path::PathBuf,
}

impl KubeletRefresher {
    /// Refreshes now, outside the schedule, and waits for the outcome: the number of devices
    /// allocated to pods, or the failure (already counted and applied as a scheduled refresh's
    /// would be). The schedule restarts from now. For tests, and for an agent that wants
    /// attribution before its first sample.
    ///
    /// # Errors
    /// The refresh's [`KubeletError`], or [`KubeletError::Stopped`] if the task is gone.
    pub async fn refresh_now(&self) -> Result<usize, KubeletError> {
        let stopped = || KubeletError::Stopped { socket: self.socket.clone() };
        let (reply, outcome) = oneshot::channel();
        self.requests.send(reply).await.map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?
    }
}

impl Drop for KubeletRefresher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Refresher {
    config: KubeletConfig,
    cache: AllocationCache,
    stats: Arc<AttributionStats>,
    /// Failed refreshes in a row.
    failures: u32,
    /// The kind of the current failure, `None` while the kubelet answers (so a state change
    /// is logged once).
    failing: Option<&'static str>,
}

impl Refresher {
    async fn run(mut self, mut inbox: mpsc::Receiver<Reply>) {
        let mut ticker = tokio::time::interval(self.config.refresh.max(MIN_REFRESH));
        // A refresh that overran (a slow kubelet) pushes the schedule back instead of firing a
        // burst of catch-up calls at a struggling kubelet.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let reply = tokio::select! {
                _ = ticker.tick() => None,
                request = inbox.recv() => match request {
                    Some(reply) => Some(reply),
                    // The handle is gone (its drop aborts us anyway).
                    None => return,
                },
            };
            let outcome = self.refresh().await;
            if let Some(reply) = reply {
                ticker.reset();
                // The caller may have stopped waiting; the refresh counted all the same.
                let _ = reply.send(outcome);
            }
        }
    }

    async fn refresh(&mut self) -> Result<usize, KubeletError> {
        match list_allocations(&self.config).await {
            Ok(allocations) => {
                let devices = allocations.len();
                self.cache.store(allocations);
                self.stats.kubelet_refreshes.fetch_add(1, Ordering::Relaxed);
                if self.failing.take().is_some() {
                    tracing::info!(
                        socket = %self.config.socket.display(),
                        failed_refreshes = self.failures,
                        devices,
                        "kubelet pod-resources answers again; GPU→pod attribution restored"
                    );
                } else {
                    tracing::debug!(devices, "kubelet pod-resources refreshed");
                }
                self.failures = 0;
                Ok(devices)
            }
            Err(error) => {
                self.stats.record_failure(&self.stats.kubelet_failures, error.to_string());
                self.failures = self.failures.saturating_add(1);
                if self.failing.replace(error.kind()) != Some(error.kind()) {
                    tracing::warn!(%error, "kubelet pod-resources refresh failed; GPU→pod attribution may be stale");
                } else {
                    tracing::debug!(%error, failures = self.failures, "kubelet pod-resources refresh failed again");
                }
                if self.failures == self.config.clear_after_failures.max(1) {
                    self.cache.store(Allocations::new());
                    tracing::warn!(
                        socket = %self.config.socket.display(),
                        failures = self.failures,
                        "cleared GPU→pod allocations after repeated kubelet failures; GPUs carry no pod labels until it answers"
                    );
                }
                Err(error)
            }
        }
    }
}

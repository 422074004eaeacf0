//! The processes of a job someone outside the samples knows: `gpumon-agent run` started a
//! command, and that command and its descendants are one job, whoever owns them and whichever
//! launcher started them. The most trusted job information there is (issue #42, item 1): the
//! diagnosis compares each GPU running one of these processes with the others running one, and
//! with no other GPU.

use std::collections::HashSet;
use std::sync::{Arc, PoisonError, RwLock};

/// A shared, cheaply cloned set of the pids of one job, kept up to date by whoever watches the
/// job (`gpumon-agent run` reads its command's process tree after every sample) and read by the
/// [`Diagnoser`](super::Diagnoser) at every tick ([`Diagnoser::with_run_job`](super::Diagnoser::with_run_job)).
///
/// A GPU that lists one of these pids among its processes belongs to the job; the pids are the
/// ones NVML reports (the host's, from inside a container: a job whose pids NVML does not list
/// is on no GPU, and diagnosis falls back to the other job information).
///
/// ```
/// use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser, RunJob};
///
/// let job = RunJob::new();
/// let diagnoser = Diagnoser::new(DiagnoseConfig::default())?.with_run_job(job.clone());
/// // Later, as the job's processes are found (its command and every descendant):
/// job.set_pids([4242, 4250, 4251]);
/// assert!(job.contains(4250));
/// assert!(!job.contains(1));
/// # drop(diagnoser);
/// # Ok::<(), gpumon_core::diagnose::DiagnoseConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct RunJob {
    pids: Arc<RwLock<Arc<HashSet<u32>>>>,
}

impl RunJob {
    /// A job with no process known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the job's pids (the command's and every descendant's found so far).
    pub fn set_pids(&self, pids: impl IntoIterator<Item = u32>) {
        let pids: HashSet<u32> = pids.into_iter().collect();
        *self.pids.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(pids);
    }

    /// Whether `pid` is one of the job's.
    pub fn contains(&self, pid: u32) -> bool {
        self.pids().contains(&pid)
    }

    /// The pids as of now: one read of the lock, then no lock held while the set is read.
    pub(crate) fn pids(&self) -> Arc<HashSet<u32>> {
        self.pids.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

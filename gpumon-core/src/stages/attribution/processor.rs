//! The attribution stage: a [`Processor`] that sets every process's owner and every device's
//! owners from the caches, once per tick.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::procfs::{ProcOwners, DEFAULT_PASSWD_FILE, DEFAULT_PROC_ROOT};
use super::{AllocationCache, AttributionStats, AttributionSummary, SharedOwner};
use crate::model::Snapshot;
use crate::stages::Processor;

/// Settings of an [`Attributor`]: where processes are read, where user names come from, the
/// kubelet's allocations (if any) and the counters to report into.
///
/// ```
/// use std::sync::Arc;
/// use gpumon_core::attribution::{AllocationCache, AttributionConfig, AttributionStats};
///
/// let stats = Arc::new(AttributionStats::default());
/// let allocations = AllocationCache::new(); // filled by the kubelet client
/// let attributor = AttributionConfig::new()
///     .with_proc_root("/host/proc")
///     .with_passwd_file("/host/etc/passwd")
///     .with_allocations(allocations)
///     .with_stats(stats.clone())
///     .build();
/// # let _ = attributor;
/// ```
#[derive(Clone, Debug)]
pub struct AttributionConfig {
    proc_root: PathBuf,
    passwd_file: PathBuf,
    allocations: Option<AllocationCache>,
    stats: Arc<AttributionStats>,
}

impl Default for AttributionConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl AttributionConfig {
    /// `/proc`, `/etc/passwd`, no kubelet allocations, fresh counters.
    pub fn new() -> Self {
        Self {
            proc_root: PathBuf::from(DEFAULT_PROC_ROOT),
            passwd_file: PathBuf::from(DEFAULT_PASSWD_FILE),
            allocations: None,
            stats: Arc::default(),
        }
    }

    /// Where the host's `/proc` is mounted (default `/proc`).
    #[must_use]
    pub fn with_proc_root(mut self, proc_root: impl Into<PathBuf>) -> Self {
        self.proc_root = proc_root.into();
        self
    }

    /// The passwd file user names come from (default `/etc/passwd`; in a container, the host's,
    /// mounted somewhere).
    #[must_use]
    pub fn with_passwd_file(mut self, passwd_file: impl Into<PathBuf>) -> Self {
        self.passwd_file = passwd_file.into();
        self
    }

    /// GPU → pod allocations, refreshed elsewhere (the kubelet client); read once per tick.
    #[must_use]
    pub fn with_allocations(mut self, allocations: AllocationCache) -> Self {
        self.allocations = Some(allocations);
        self
    }

    /// The counters to report failures into, shared with the allocation refresher.
    #[must_use]
    pub fn with_stats(mut self, stats: Arc<AttributionStats>) -> Self {
        self.stats = stats;
        self
    }

    /// The counters this configuration reports into.
    pub fn stats(&self) -> &Arc<AttributionStats> {
        &self.stats
    }

    /// The processor.
    pub fn build(self) -> Attributor {
        Attributor {
            procs: ProcOwners::new(self.proc_root, self.passwd_file, self.stats.clone()),
            allocations: self.allocations,
            stats: self.stats,
            key: String::new(),
            last_summary: None,
        }
    }
}

/// Sets [`ProcessSample::owner`](crate::ProcessSample::owner) of every process and
/// [`DeviceSample::owners`](crate::DeviceSample::owners) of every device, and the snapshot's
/// [`AttributionSummary`].
///
/// A device's owners are the pods the kubelet allocated it to (looked up by the device's UUID —
/// a MIG instance's `MIG-…` UUID for a MIG instance — and, for device plugins configured to name
/// devices by index, by `"<index>"` or `"<index>:<MIG index>"`), then the distinct owners of its
/// processes, each once.
///
/// # Cost per tick
/// One read lock and `Arc` clone for the allocations; per process, its `stat` (one small read,
/// to tell a reused pid's new process from the old) and a hash lookup; `Arc` clones for the
/// owners. The only allocation in steady state
/// is each attributed device's `owners` vector, since every snapshot is new.
///
/// ```
/// use std::sync::Arc;
/// use gpumon_core::attribution::{AllocationCache, Allocations, AttributionConfig, Owner};
/// use gpumon_core::{DeviceInfo, DeviceSample, Processor, Snapshot, SystemInfo};
///
/// let mut pod = Owner::default();
/// pod.namespace = Some("team-a".into());
/// pod.pod = Some("train-0".into());
/// let mut allocations = Allocations::new();
/// allocations.insert("GPU-1::0", Arc::new(pod));
/// let cache = AllocationCache::new();
/// cache.store(allocations);
///
/// let mut attributor = AttributionConfig::new().with_allocations(cache).build();
/// let gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "NVIDIA H100 80GB HBM3")));
/// let mut snapshot = Snapshot::new(Arc::new(SystemInfo::new("node-1", "example")), vec![gpu]);
/// attributor.process(&mut snapshot);
/// assert_eq!(snapshot.devices[0].owner_labels().pod, Some("train-0"));
/// ```
#[derive(Debug)]
pub struct Attributor {
    procs: ProcOwners,
    allocations: Option<AllocationCache>,
    stats: Arc<AttributionStats>,
    /// Reused buffer for index-style device ids.
    key: String,
    /// The output attached last tick, shared again while the counters stand still.
    last_summary: Option<Arc<AttributionSummary>>,
}

impl Attributor {
    /// The counters this processor reports into.
    pub fn stats(&self) -> &Arc<AttributionStats> {
        &self.stats
    }
}

/// Adds `owner` unless an equal one is there (the same `Arc` for processes of one container and
/// user, since [`ProcOwners`] shares equal owners).
fn push_distinct(owners: &mut Vec<SharedOwner>, owner: &SharedOwner) {
    if !owners.iter().any(|o| Arc::ptr_eq(o, owner) || **o == **owner) {
        owners.push(owner.clone());
    }
}

impl Processor for Attributor {
    fn name(&self) -> &str {
        "attribution"
    }

    fn process(&mut self, snapshot: &mut Snapshot) {
        let allocations = self.allocations.as_ref().map(AllocationCache::load);
        self.procs.begin_tick();
        for device in &mut snapshot.devices {
            device.owners.clear();
            if let Some(allocations) = allocations.as_deref().filter(|a| !a.is_empty()) {
                let mut pods = allocations.owners(&device.info.uuid);
                if pods.is_empty() {
                    self.key.clear();
                    let _ = write!(self.key, "{}", device.info.index);
                    if let Some(mig) = &device.info.mig {
                        let _ = write!(self.key, ":{}", mig.mig_index);
                    }
                    pods = allocations.owners(&self.key);
                }
                for pod in pods {
                    push_distinct(&mut device.owners, pod);
                }
            }
            for process in &mut device.processes {
                process.owner = self.procs.owner(process.pid);
                process.parent_pid = self.procs.parent_pid(process.pid);
                if let Some(owner) = &process.owner {
                    push_distinct(&mut device.owners, owner);
                }
            }
        }
        self.procs.end_tick();
        let summary = AttributionSummary {
            proc_read_failures: self.stats.proc_read_failures.load(Ordering::Relaxed),
            kubelet_failures: self.allocations.as_ref().map(|_| self.stats.kubelet_failures.load(Ordering::Relaxed)),
        };
        // The counters rarely change: share last tick's output then (no allocation per tick).
        let output = match &self.last_summary {
            Some(last) if **last == summary => last.clone(),
            _ => Arc::new(summary),
        };
        self.last_summary = Some(output.clone());
        snapshot.outputs.insert(output);
    }
}

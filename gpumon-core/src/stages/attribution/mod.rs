//! Who uses which GPU: the owner of each GPU process (container, pod, Unix user) and the pod
//! each GPU is allocated to.
//!
//! Attribution is an enrichment on the processing stage ([`crate::Processor`]): a processor
//! reads caches that are refreshed on their own schedule (the process table under a
//! configurable proc root, the kubelet's pod-resources API) and sets
//! [`ProcessSample::owner`](crate::ProcessSample::owner) and
//! [`DeviceSample::owners`](crate::DeviceSample::owners). Sinks export the merged
//! [`OwnerLabels`] of a device on every one of its series, and a process's own owner on its
//! process series, so a query can `sum by (namespace)`.
//!
//! # A GPU held by several owners
//! A device's labels are merged over its owners, one label at a time: a label whose value every
//! owner agrees on keeps it; a label on which they disagree reads [`SHARED`]; a label no owner
//! knows is absent. Two pods of one namespace time-slicing a GPU therefore give
//! `namespace="team-a", pod="(shared)"`. `SHARED` cannot be a Kubernetes name (DNS-1123) nor a
//! Unix user name, so it never collides with a real owner.
//!
//! A process in a Kubernetes pod has no `container` label of its own (its cgroup gives the
//! container's id, kept in [`Owner::container_id`], not its name), so the kubelet's pod of a GPU
//! and that pod's processes agree on every label they both know: the GPU reads
//! `namespace`, `pod`, `container` from the kubelet and `user` from its processes.
//!
//! # Pieces
//! - [`cgroup`]: the pure parser of `/proc/<pid>/cgroup` (container runtimes, pods, units);
//! - [`procfs`]: [`ProcOwners`](procfs::ProcOwners), the per-pid owner cache over a proc root;
//! - [`Attributor`] (built from an [`AttributionConfig`]): the processor;
//! - [`AllocationCache`]: GPU → pod allocations, filled by the kubelet client.
//!
//! # Tenants
//! [`tenant`] scopes a snapshot to one tenant ([`TenantSelector`], [`Snapshot::scoped_to`]):
//! only the GPUs its processes (or pods) hold, and nothing that names another tenant.
//!
//! [`Snapshot::scoped_to`]: crate::Snapshot::scoped_to

use std::sync::Arc;

pub mod cgroup;
mod processor;
pub mod procfs;

pub use processor::{AttributionConfig, Attributor};
#[cfg(feature = "kubelet")]
#[cfg_attr(docsrs, doc(cfg(feature = "kubelet")))]
pub mod kubelet;

pub mod tenant;
pub use tenant::{Criterion, TenantSelector, TenantSelectorError};

mod owners;
pub use owners::{OwnerLabels, SHARED};

// The owner types live in the model (a sample carries them); attribution fills them in and
// computes their labels (`owners.rs`).
pub use crate::model::{ContainerRuntime, Owner, QosClass, SharedOwner};

/// GPU → pod allocations as the kubelet reported them, keyed by device UUID (`GPU-…` or
/// `MIG-…`). A device ID from the NVIDIA device plugin may carry a replica suffix
/// (`GPU-…::3` under time-slicing); [`insert`](Self::insert) strips it, so replicas of one GPU
/// given to several pods become several owners of that GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocations {
    by_uuid: std::collections::HashMap<String, Vec<SharedOwner>>,
}

impl Allocations {
    /// No allocations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `device_id` (a UUID, possibly with a `::N` replica suffix) is allocated to
    /// `owner`. The same owner twice on one device is kept once.
    pub fn insert(&mut self, device_id: &str, owner: SharedOwner) {
        let uuid = device_id.split_once("::").map_or(device_id, |(uuid, _)| uuid);
        let owners = self.by_uuid.entry(uuid.to_owned()).or_default();
        if !owners.iter().any(|o| **o == *owner) {
            owners.push(owner);
        }
    }

    /// The owners of device `uuid` (empty when it is allocated to no pod).
    pub fn owners(&self, uuid: &str) -> &[SharedOwner] {
        self.by_uuid.get(uuid).map_or(&[], Vec::as_slice)
    }

    /// Every allocated device's UUID with its owners, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[SharedOwner])> + '_ {
        self.by_uuid.iter().map(|(uuid, owners)| (uuid.as_str(), owners.as_slice()))
    }

    /// How many devices have at least one owner.
    pub fn len(&self) -> usize {
        self.by_uuid.len()
    }

    /// Whether no device is allocated.
    pub fn is_empty(&self) -> bool {
        self.by_uuid.is_empty()
    }
}

/// The latest [`Allocations`], shared between whatever refreshes them (the kubelet client, on
/// its own schedule) and the attribution processor, which only reads: a read is one lock and an
/// `Arc` clone, never I/O on the sampling path.
#[derive(Clone, Debug, Default)]
pub struct AllocationCache {
    current: Arc<std::sync::RwLock<Arc<Allocations>>>,
}

impl AllocationCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The latest allocations.
    pub fn load(&self) -> Arc<Allocations> {
        // A writer cannot panic while holding the lock (it only swaps an Arc), so poisoning
        // is impossible; recover the value anyway rather than panic on the sampling path.
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Replaces the allocations.
    pub fn store(&self, allocations: Allocations) {
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(allocations);
    }
}

/// Counters of the attribution sources, shared by the refreshers that fill the caches and
/// whatever reports them (self-metrics, `SinkStatus`-like status, logs). A failure is counted
/// here and attribution is simply absent for that refresh — never an error on the sampling path.
#[derive(Debug, Default)]
pub struct AttributionStats {
    /// Successful kubelet pod-resources `List` calls.
    pub kubelet_refreshes: std::sync::atomic::AtomicU64,
    /// Failed kubelet calls (socket missing, server down, timeout, bad reply).
    pub kubelet_failures: std::sync::atomic::AtomicU64,
    /// Processes whose `/proc/<pid>` entries could not be read (gone, no permission, garbage).
    pub proc_read_failures: std::sync::atomic::AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

impl AttributionStats {
    /// Adds one to `counter` (one of this struct's) and remembers `message` as the last error.
    pub fn record_failure(&self, counter: &std::sync::atomic::AtomicU64, message: impl Into<String>) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *crate::lock(&self.last_error) = Some(message.into());
    }

    /// The most recent failure's message, if any.
    pub fn last_error(&self) -> Option<String> {
        crate::lock(&self.last_error).clone()
    }
}

/// The attribution counters as of one tick, carried by the snapshot
/// (the attribution stage's [`StageOutput`](crate::StageOutput)) so that every sink exports them
/// as `attribution_failures{source}` ([`MetricId::AttributionFailures`](crate::MetricId)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct AttributionSummary {
    /// [`AttributionStats::proc_read_failures`] since the agent started.
    pub proc_read_failures: u64,
    /// [`AttributionStats::kubelet_failures`]; `None` when no kubelet source is configured.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub kubelet_failures: Option<u64>,
}

/// The key of the attribution stage's output (its JSON field).
pub(crate) const ATTRIBUTION_KEY: &str = "attribution";

impl crate::StageOutput for AttributionSummary {
    fn key(&self) -> &'static str {
        ATTRIBUTION_KEY
    }

    /// Failures per source ([`MetricId::AttributionFailures`](crate::MetricId)), about the host.
    /// No tenant view carries them: they are the operator's concern and about no tenant's GPUs.
    fn visit_series<'a>(&'a self, _: &'a crate::Snapshot, f: &mut dyn FnMut(crate::DerivedPoint<'a>)) {
        for (source, n) in self.failures() {
            let descriptor = crate::MetricId::AttributionFailures.descriptor();
            f(crate::DerivedPoint::new(descriptor, crate::Value::Int(n), None, &[source]));
        }
    }

    #[cfg(feature = "serde")]
    fn as_serialize(&self) -> Option<&dyn erased_serde::Serialize> {
        Some(self)
    }
}

impl AttributionSummary {
    /// The `source` label values and their failure counts, `proc` first.
    pub fn failures(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [("proc", Some(self.proc_read_failures)), ("kubelet", self.kubelet_failures)]
            .into_iter()
            .filter_map(|(source, n)| n.map(|n| (source, n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(ns: Option<&str>, pod: Option<&str>, user: Option<&str>) -> Owner {
        Owner {
            namespace: ns.map(Into::into),
            pod: pod.map(Into::into),
            user: user.map(Into::into),
            ..Owner::default()
        }
    }

    #[test]
    fn merge_keeps_agreement_marks_disagreement_and_skips_unknown() {
        let a = owner(Some("team-a"), Some("p1"), None);
        let b = owner(Some("team-a"), Some("p2"), Some("alice"));
        let m = OwnerLabels::merge([&a, &b]);
        assert_eq!(m.namespace, Some("team-a"));
        assert_eq!(m.pod, Some(SHARED));
        assert_eq!(m.container, None);
        assert_eq!(m.user, Some("alice"));
        assert_eq!(m.pairs().collect::<Vec<_>>(), [("namespace", "team-a"), ("pod", SHARED), ("user", "alice")]);
    }

    #[test]
    fn allocations_strip_replica_suffixes_and_dedupe() {
        let a = Arc::new(owner(Some("ns"), Some("p1"), None));
        let b = Arc::new(owner(Some("ns"), Some("p2"), None));
        let mut alloc = Allocations::new();
        alloc.insert("GPU-1::0", a.clone());
        alloc.insert("GPU-1::1", a.clone());
        alloc.insert("GPU-1::2", b.clone());
        alloc.insert("MIG-2", b);
        assert_eq!(alloc.owners("GPU-1").len(), 2);
        assert_eq!(alloc.owners("MIG-2").len(), 1);
        assert!(alloc.owners("GPU-9").is_empty());
        let cache = AllocationCache::new();
        assert!(cache.load().is_empty());
        cache.store(alloc);
        assert_eq!(cache.load().len(), 2);
    }

    #[test]
    fn merge_of_nothing_is_empty() {
        assert!(OwnerLabels::merge([]).is_empty());
        assert!(!OwnerLabels::merge([&owner(None, None, Some("bob"))]).is_empty());
    }
}

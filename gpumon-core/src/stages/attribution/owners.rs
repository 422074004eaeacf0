//! Owner labels: what a series says about who holds its GPU or its process — an [`Owner`]'s
//! own labels, a device's merged over its owners ([`DeviceSample::owner_labels`], see the
//! [module docs](super) for the merge), and the ones a point carries
//! ([`DeviceSample::point_owner_labels`]).
//!
//! The model holds the owners (`DeviceSample::owners`, `ProcessSample::owner`); how they become
//! labels is attribution's rule, so it lives here, as inherent methods the sinks call.

use crate::metric::Point;
use crate::model::{DeviceSample, Owner, ProcessSample};

/// The label value of a device label on which the device's owners disagree.
pub const SHARED: &str = "(shared)";

impl Owner {
    /// The exported labels of this one owner.
    pub fn labels(&self) -> OwnerLabels<'_> {
        OwnerLabels {
            namespace: self.namespace.as_deref(),
            pod: self.pod.as_deref(),
            container: self.container.as_deref(),
            user: self.user.as_deref(),
        }
    }
}

/// The owner labels a series carries, borrowed from the snapshot. Absent labels are `None` and
/// are not exported at all (no empty label values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnerLabels<'a> {
    /// `namespace` (`k8s.namespace.name` in OTLP).
    pub namespace: Option<&'a str>,
    /// `pod` (`k8s.pod.name`).
    pub pod: Option<&'a str>,
    /// `container` (`k8s.container.name` / `container.id` outside Kubernetes).
    pub container: Option<&'a str>,
    /// `user` (`user.name`).
    pub user: Option<&'a str>,
}

impl<'a> OwnerLabels<'a> {
    /// Exported label names, in the order [`pairs`](Self::pairs) yields them.
    pub const NAMES: [&'static str; 4] = ["namespace", "pod", "container", "user"];

    /// Merges the labels of several owners (see the module docs): agreement keeps the value,
    /// disagreement gives [`SHARED`], unknown everywhere stays `None`.
    pub fn merge<I>(owners: I) -> Self
    where
        I: IntoIterator<Item = &'a Owner>,
    {
        fn fold<'a>(acc: Option<Option<&'a str>>, next: Option<&'a str>) -> Option<Option<&'a str>> {
            match (acc, next) {
                (acc, None) => acc,
                (None, Some(v)) => Some(Some(v)),
                (Some(Some(a)), Some(v)) if a == v => Some(Some(a)),
                (Some(_), Some(_)) => Some(Some(SHARED)),
            }
        }
        let (mut ns, mut pod, mut ctr, mut user) = (None, None, None, None);
        for o in owners {
            ns = fold(ns, o.namespace.as_deref());
            pod = fold(pod, o.pod.as_deref());
            ctr = fold(ctr, o.container.as_deref());
            user = fold(user, o.user.as_deref());
        }
        Self { namespace: ns.flatten(), pod: pod.flatten(), container: ctr.flatten(), user: user.flatten() }
    }

    /// Whether no label is set.
    pub fn is_empty(&self) -> bool {
        self.pairs().next().is_none()
    }

    /// The `(name, value)` pairs that are set, in [`NAMES`](Self::NAMES) order.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &'a str)> + '_ {
        Self::NAMES
            .into_iter()
            .zip([self.namespace, self.pod, self.container, self.user])
            .filter_map(|(k, v)| v.map(|v| (k, v)))
    }
}

impl DeviceSample {
    /// The owner labels every series of this device carries: [`Self::owners`] merged, one label
    /// at a time (a disagreement reads [`SHARED`]).
    pub fn owner_labels(&self) -> OwnerLabels<'_> {
        OwnerLabels::merge(self.owners.iter().map(|o| &**o))
    }

    /// The owner labels of one of this device's points: a per-process point
    /// ([`Family::Processes`](crate::Family::Processes), labelled with its pid) carries its
    /// process's own owner, every other point the device's merged
    /// [`owner_labels`](Self::owner_labels).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::attribution::Owner;
    /// use gpumon_core::{DeviceInfo, DeviceSample, Family, ProcessSample};
    ///
    /// let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "GPU")));
    /// for (pid, user) in [(10, "alice"), (11, "bob")] {
    ///     let mut owner = Owner::default();
    ///     owner.user = Some(user.into());
    ///     let mut p = ProcessSample::new(pid);
    ///     p.memory_used = Some(1 << 30);
    ///     p.owner = Some(Arc::new(owner));
    ///     gpu.owners.push(p.owner.clone().unwrap());
    ///     gpu.processes.push(p);
    /// }
    /// gpu.visit_points(|p| {
    ///     let user = gpu.point_owner_labels(&p).user;
    ///     match p.id.family() {
    ///         Family::Processes => assert!(matches!(user, Some("alice" | "bob"))),
    ///         _ => assert_eq!(user, Some(gpumon_core::attribution::SHARED)),
    ///     }
    /// });
    /// ```
    pub fn point_owner_labels(&self, point: &Point<'_>) -> OwnerLabels<'_> {
        match self.process_of(point.id, point.label) {
            Some(process) => process.map(ProcessSample::owner_labels).unwrap_or_default(),
            None => self.owner_labels(),
        }
    }
}

impl ProcessSample {
    /// The owner labels of this process's series (none when its owner is unknown).
    pub fn owner_labels(&self) -> OwnerLabels<'_> {
        self.owner.as_deref().map(Owner::labels).unwrap_or_default()
    }
}

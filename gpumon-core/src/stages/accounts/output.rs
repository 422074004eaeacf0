//! [`AccountsOutput`], the accounts stage's output: per GPU, the counters of its current owner
//! as derived series (the `account_*` metrics of the catalogue), in every sink.

use std::sync::Arc;

use crate::metric::{DerivedPoint, MetricId, Value};
use crate::model::{DeviceInfo, Snapshot};
use crate::stages::diagnose::finding::FindingKind;
use crate::stages::report::KINDS;
use crate::stages::StageOutput;

/// The key of the accounts' output (its JSON field).
pub(crate) const ACCOUNTS_KEY: &str = "accounts";

/// One GPU's current owner's counters at one tick.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AccountRow {
    /// The GPU, as an index into the snapshot's devices.
    pub device: usize,
    /// The GPU (to find it again in a tenant's view).
    pub info: Arc<DeviceInfo>,
    /// The job whose steps drive the GPU, where known.
    pub job: Option<Arc<str>>,
    /// GPU-time observed, seconds.
    pub observed_seconds: f64,
    /// GPU-time allocated, seconds.
    pub allocated_seconds: f64,
    /// Idle GPU-time while allocated, seconds.
    pub idle_allocated_seconds: f64,
    /// Energy used, joules.
    pub energy_joules: Option<f64>,
    /// GPU-time lost per cause, seconds, in [`FindingKind::ALL`] order (only the causes in
    /// `causes` are exported).
    pub lost_seconds: [f64; KINDS],
    /// Bit `k`: cause `k` of [`FindingKind::ALL`] is exported.
    pub causes: u32,
}

impl AccountRow {
    /// The exported causes with their lost GPU-time, seconds.
    pub fn lost(&self) -> impl Iterator<Item = (FindingKind, f64)> + '_ {
        (0..KINDS).filter(|k| self.causes & (1 << k) != 0).map(|k| (FindingKind::ALL[k], self.lost_seconds[k]))
    }
}

/// `{"uuid", "job", "observed_seconds", …, "lost_seconds": {"<cause>": seconds}}`.
#[cfg(feature = "serde")]
impl serde::Serialize for AccountRow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Lost<'a>(&'a AccountRow);
        impl serde::Serialize for Lost<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_map(self.0.lost().map(|(kind, seconds)| (kind.name(), seconds)))
            }
        }
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("uuid", &self.info.uuid)?;
        if let Some(job) = &self.job {
            map.serialize_entry("job", &**job)?;
        }
        map.serialize_entry("observed_seconds", &self.observed_seconds)?;
        map.serialize_entry("allocated_seconds", &self.allocated_seconds)?;
        map.serialize_entry("idle_allocated_seconds", &self.idle_allocated_seconds)?;
        if let Some(e) = self.energy_joules {
            map.serialize_entry("energy_joules", &e)?;
        }
        map.serialize_entry("lost_seconds", &Lost(self))?;
        map.end()
    }
}

/// What the accounts stage attaches to each snapshot: one row per GPU.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct AccountsOutput {
    /// Per GPU, its current owner's counters.
    pub rows: Vec<AccountRow>,
}

impl StageOutput for AccountsOutput {
    fn key(&self) -> &'static str {
        ACCOUNTS_KEY
    }

    /// Per GPU: `account_observed`, `account_allocated`, `account_idle_allocated`,
    /// `account_energy` (with a reading) and `account_lost{cause}` per exported cause, each with
    /// a `job` label (empty, so not exported, when no run's steps drive the GPU). Sinks add the
    /// GPU's labels and its owner labels.
    fn visit_series<'a>(&'a self, _: &'a Snapshot, f: &mut dyn FnMut(DerivedPoint<'a>)) {
        for row in &self.rows {
            let job = row.job.as_deref().unwrap_or("");
            let device = Some(row.device);
            let mut point =
                |id: MetricId, v: f64| f(DerivedPoint::new(id.descriptor(), Value::Float(v), device, &[job]));
            point(MetricId::AccountObserved, row.observed_seconds);
            point(MetricId::AccountAllocated, row.allocated_seconds);
            point(MetricId::AccountIdleAllocated, row.idle_allocated_seconds);
            if let Some(e) = row.energy_joules {
                point(MetricId::AccountEnergy, e);
            }
            for (kind, seconds) in row.lost() {
                let labels = [kind.name(), job];
                f(DerivedPoint::new(MetricId::AccountLost.descriptor(), Value::Float(seconds), device, &labels));
            }
        }
    }

    /// A tenant sees the accounts of its own GPUs (its view holds only those).
    fn scoped(&self, view: &Snapshot) -> Option<Arc<dyn StageOutput>> {
        let rows = self
            .rows
            .iter()
            .filter_map(|r| view.position(&r.info.uuid).map(|device| AccountRow { device, ..r.clone() }))
            .collect();
        Some(Arc::new(AccountsOutput { rows }))
    }

    #[cfg(feature = "serde")]
    fn as_serialize(&self) -> Option<&dyn erased_serde::Serialize> {
        Some(self)
    }
}

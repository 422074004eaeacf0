//! GPU-time accounts: the run report's figures as monotonic counters, per GPU and owner, so
//! that a TSDB sums them over a fleet ("last week, which namespaces held GPUs idle, for how many
//! GPU-hours, and why?").
//!
//! [`Accounts`] is a [`Processor`] fed exactly as the [run report](crate::report) is: add it
//! after the [`Diagnoser`](crate::diagnose::Diagnoser) (it reads each tick's findings) and after
//! attribution (it reads each GPU's owners). Each tick it adds, per GPU, to the account of the
//! GPU's current **owner** — its merged owner labels (`namespace`, `pod`, `container`, `user`,
//! as every series of the GPU carries them) and the `job` of the training run whose steps drive
//! the GPU ([`Steps::for_gpu`](crate::steps::Steps::for_gpu)), where known:
//! - **observed**: the time the tick covers while the GPU is up;
//! - **allocated**: the same, on allocated ticks with a known utilisation level;
//! - **idle while allocated**: `(1 − level) × interval` on those ticks;
//! - **lost per cause**: what each open finding's interval cost;
//! - **energy**: the driver's energy counter's increase, else power × interval.
//!
//! Every figure uses the report's own arithmetic (the same functions, see
//! [`crate::report`]'s module docs for the definitions), so over a run the accounts of a GPU,
//! summed over its owners, equal its [`GpuReport`](crate::report::GpuReport) figures, and the
//! lost time summed over GPUs equals [`Overview::causes`](crate::report::Overview::causes) —
//! exactly for a GPU with one owner, to float rounding (the sums group differently) for a GPU
//! that changed hands. Energy follows the report's choice per GPU: the counter's increases once
//! the GPU's counter has given one, else power × interval.
//!
//! The output ([`AccountsOutput`]) exports, per GPU and tick, the counters of the GPU's current
//! owner: `gpumon_account_observed_seconds_total`, `…_allocated_seconds_total`,
//! `…_idle_allocated_seconds_total`, `…_lost_seconds_total{cause}` (only the causes this owner
//! was charged for or that are open) and `gpumon_account_energy_joules_total`, each with the
//! GPU's labels, its owner labels and `job`. An owner's counters start at 0 when the agent
//! starts and keep counting when the owner holds the GPU again; they reset when the agent
//! restarts, which PromQL's `increase()` handles. An owner who no longer holds the GPU is no
//! longer exported (its series goes stale).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, UNIX_EPOCH};
//! use gpumon_core::accounts::Accounts;
//! use gpumon_core::{DeviceInfo, DeviceSample, Processor, ProcessorContext, Snapshot, SystemInfo};
//!
//! let (mut accounts, handle) = Accounts::new();
//! accounts.attach(&ProcessorContext::new(Duration::from_secs(1)));
//! let info = Arc::new(DeviceInfo::new(0, "GPU-0", "NVIDIA H100 80GB HBM3"));
//! let system = Arc::new(SystemInfo::new("node-1", "example"));
//! for (tick, util) in [0.2, 0.4, 0.6].into_iter().enumerate() {
//!     let mut gpu = DeviceSample::new(info.clone());
//!     gpu.utilization.gpu = Some(util);
//!     gpu.memory.used = Some(40 << 30);
//!     gpu.memory.total = Some(80 << 30);
//!     let mut s = Snapshot::new(system.clone(), vec![gpu])
//!         .with_seq(tick as u64 + 1)
//!         .with_taken_at(UNIX_EPOCH + Duration::from_secs(tick as u64));
//!     accounts.process(&mut s);
//! }
//! let all = handle.accounts();
//! assert_eq!(all[0].observed_seconds, 2.0); // the first tick opens the run
//! assert!((all[0].idle_allocated_seconds - 1.0).abs() < 1e-12); // 0.6 + 0.4
//! ```

mod output;
#[cfg(test)]
mod tests;

pub use output::{AccountRow, AccountsOutput};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::attribution::OwnerLabels;
use crate::model::{DeviceSample, Snapshot};
use crate::stages::diagnose::finding::{FindingKind, Transition};
use crate::stages::diagnose::Thresholds;
use crate::stages::report::{idle_while_allocated, is_allocated, lost, peers_wait, slot, KINDS};
use crate::stages::{Processor, ProcessorContext};

/// Who held a GPU: the owner labels its series carry, and the job whose steps drove it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct AccountOwner {
    /// Kubernetes namespace.
    pub namespace: Option<Arc<str>>,
    /// Kubernetes pod.
    pub pod: Option<Arc<str>>,
    /// Container.
    pub container: Option<Arc<str>>,
    /// Unix user.
    pub user: Option<Arc<str>>,
    /// The training run (`job` of the step marks) that drove the GPU.
    pub job: Option<Arc<str>>,
}

impl AccountOwner {
    fn is(&self, labels: &OwnerLabels<'_>, job: Option<&str>) -> bool {
        let same = |mine: &Option<Arc<str>>, theirs: Option<&str>| mine.as_deref() == theirs;
        same(&self.namespace, labels.namespace)
            && same(&self.pod, labels.pod)
            && same(&self.container, labels.container)
            && same(&self.user, labels.user)
            && same(&self.job, job)
    }

    fn of(labels: &OwnerLabels<'_>, job: Option<&str>) -> Self {
        Self {
            namespace: labels.namespace.map(Arc::from),
            pod: labels.pod.map(Arc::from),
            container: labels.container.map(Arc::from),
            user: labels.user.map(Arc::from),
            job: job.map(Arc::from),
        }
    }
}

/// One owner's account on one GPU: what [`AccountsHandle::accounts`] returns.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Account {
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's NVML index.
    pub index: u32,
    /// Who held it.
    pub owner: AccountOwner,
    /// GPU-time observed, seconds.
    pub observed_seconds: f64,
    /// GPU-time allocated, seconds.
    pub allocated_seconds: f64,
    /// Idle GPU-time while allocated, seconds.
    pub idle_allocated_seconds: f64,
    /// Energy used, joules; `None` without a counter or power reading.
    pub energy_joules: Option<f64>,
    /// GPU-time lost per cause, seconds: each cause this owner was charged for or that was open
    /// while it held the GPU, in [`FindingKind::ALL`] order.
    pub lost_seconds: Vec<(FindingKind, f64)>,
}

/// One owner's running totals on one GPU.
#[derive(Clone, Debug)]
struct Totals {
    owner: AccountOwner,
    observed: f64,
    allocated: f64,
    idle: f64,
    counter_joules: f64,
    power_joules: f64,
    lost: [f64; KINDS],
    /// Bit `k`: cause `k` was open while this owner held the GPU (its series is exported).
    causes: u32,
}

impl Totals {
    fn new(owner: AccountOwner) -> Self {
        Self {
            owner,
            observed: 0.0,
            allocated: 0.0,
            idle: 0.0,
            counter_joules: 0.0,
            power_joules: 0.0,
            lost: [0.0; KINDS],
            causes: 0,
        }
    }
}

/// Everything kept for one GPU.
#[derive(Debug)]
struct GpuLedger {
    index: u32,
    /// Bit `k`: a finding of kind `k` (in [`FindingKind::ALL`] order) is open on the GPU.
    open: u32,
    last_counter: Option<f64>,
    /// The energy counter gave an increase: energy is the counter's (the report's choice).
    counter_seen: bool,
    power_seen: bool,
    /// Every owner seen on the GPU; `current` holds it now.
    owners: Vec<Totals>,
    current: usize,
}

impl GpuLedger {
    fn new(d: &DeviceSample) -> Self {
        Self {
            index: d.info.index,
            open: 0,
            last_counter: None,
            counter_seen: false,
            power_seen: false,
            owners: Vec::new(),
            current: 0,
        }
    }

    /// Makes the owner `labels` + `job` the current one (allocating only for a new owner).
    fn hold(&mut self, labels: &OwnerLabels<'_>, job: Option<&str>) {
        if self.owners.get(self.current).is_some_and(|t| t.owner.is(labels, job)) {
            return;
        }
        self.current = match self.owners.iter().position(|t| t.owner.is(labels, job)) {
            Some(at) => at,
            None => {
                self.owners.push(Totals::new(AccountOwner::of(labels, job)));
                self.owners.len() - 1
            }
        };
    }

    /// Adds one tick of `d` covering `span` seconds to the current owner, as the report's
    /// `GpuAcc::add` does; `peers_wait`: what the other GPUs waited for this one.
    fn add(&mut self, d: &DeviceSample, span: f64, allocated_ratio: f64, peers_wait: f64) {
        let open = self.open;
        let Some(t) = self.owners.get_mut(self.current) else { return };
        t.causes |= open;
        if !d.is_up() {
            self.last_counter = None;
            let hw = slot(FindingKind::HardwareErrors);
            if open & (1 << hw) != 0 {
                t.lost[hw] += span;
            }
            return;
        }
        t.observed += span;
        let level = crate::stages::diagnose::level_of(d);
        if let Some(p) = d.power.usage_watts.or(d.windows.power_watts.map(|w| w.mean)) {
            self.power_seen = true;
            t.power_joules += p * span;
        }
        if let Some(e) = d.power.energy_joules {
            if let Some(before) = self.last_counter {
                // A counter that went backwards was reset (driver reload): skip that step.
                if e >= before {
                    t.counter_joules += e - before;
                    self.counter_seen = true;
                }
            }
            self.last_counter = Some(e);
        }
        let busy = level.map(|l| l.clamp(0.0, 1.0));
        if let (true, Some(busy)) = (is_allocated(d, allocated_ratio), busy) {
            t.allocated += span;
            t.idle += (1.0 - busy) * span;
        }
        let mut bits = open;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            t.lost[k] += lost(FindingKind::ALL[k], d, busy, span, peers_wait);
        }
    }

    fn energy(&self, t: &Totals) -> Option<f64> {
        if self.counter_seen {
            Some(t.counter_joules)
        } else if self.power_seen {
            Some(t.power_joules)
        } else {
            None
        }
    }

    fn row(&self, device: usize, info: &Arc<crate::model::DeviceInfo>) -> Option<AccountRow> {
        let t = self.owners.get(self.current)?;
        Some(AccountRow {
            device,
            info: info.clone(),
            job: t.owner.job.clone(),
            observed_seconds: t.observed,
            allocated_seconds: t.allocated,
            idle_allocated_seconds: t.idle,
            energy_joules: self.energy(t),
            lost_seconds: t.lost,
            causes: t.causes | self.open,
        })
    }
}

#[derive(Debug)]
struct Ledger {
    interval: Duration,
    allocated_ratio: f64,
    last: Option<SystemTime>,
    gpus: HashMap<String, GpuLedger>,
}

impl Ledger {
    fn accounts(&self) -> Vec<Account> {
        let mut all: Vec<Account> = self
            .gpus
            .iter()
            .flat_map(|(uuid, g)| {
                g.owners.iter().map(move |t| Account {
                    uuid: uuid.clone(),
                    index: g.index,
                    owner: t.owner.clone(),
                    observed_seconds: t.observed,
                    allocated_seconds: t.allocated,
                    idle_allocated_seconds: t.idle,
                    energy_joules: g.energy(t),
                    lost_seconds: (0..KINDS)
                        .filter(|k| t.causes & (1 << k) != 0)
                        .map(|k| (FindingKind::ALL[k], t.lost[k]))
                        .collect(),
                })
            })
            .collect();
        all.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
        all
    }
}

/// Reads the accounts of an [`Accounts`] stage at any time, from any thread. Cloneable.
#[derive(Clone, Debug)]
pub struct AccountsHandle {
    ledger: Arc<Mutex<Ledger>>,
}

impl AccountsHandle {
    /// Every (GPU, owner) account so far, by GPU index then UUID, each GPU's owners in the
    /// order first seen.
    pub fn accounts(&self) -> Vec<Account> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner).accounts()
    }
}

/// The accounts processor. Add it after attribution and the diagnosis stage.
#[derive(Debug)]
pub struct Accounts {
    ledger: Arc<Mutex<Ledger>>,
}

impl Accounts {
    /// An accounts processor and the handle that reads it, with the default diagnosis
    /// thresholds for what counts as allocated (as [`RunReport::new`](crate::report::RunReport::new)).
    pub fn new() -> (Self, AccountsHandle) {
        let defaults = Thresholds::default();
        let ledger = Arc::new(Mutex::new(Ledger {
            interval: Duration::from_secs(1),
            allocated_ratio: defaults.allocated_memory_ratio,
            last: None,
            gpus: HashMap::new(),
        }));
        (Self { ledger: ledger.clone() }, AccountsHandle { ledger })
    }

    /// Uses `thresholds` for what counts as allocated, as the diagnosis stage and the report
    /// given the same do ([`RunReport::with_thresholds`](crate::report::RunReport::with_thresholds)).
    #[must_use]
    pub fn with_thresholds(self, thresholds: &Thresholds) -> Self {
        {
            let mut l = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
            l.allocated_ratio = thresholds.allocated_memory_ratio;
        }
        self
    }
}

/// The job of the training run driving device `d`, from this tick's steps.
fn job_of<'a>(snapshot: &'a Snapshot, d: &DeviceSample) -> Option<&'a str> {
    let steps = snapshot.output::<crate::steps::Steps>()?;
    steps.for_gpu(d.info.index).map(|run| run.job.as_str()).filter(|j| !j.is_empty())
}

impl Processor for Accounts {
    fn name(&self) -> &str {
        "accounts"
    }

    fn attach(&mut self, context: &ProcessorContext) {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner).interval = context.interval;
    }

    fn process(&mut self, snapshot: &mut Snapshot) {
        let mut guard = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let l = &mut *guard;
        // What this tick covers, as the report counts it: the time since the previous tick, at
        // most an interval; the first tick covers nothing.
        let interval = l.interval.as_secs_f64();
        let span = match l.last.map(|prev| snapshot.taken_at.duration_since(prev)) {
            Some(Ok(since)) => since.as_secs_f64().min(interval),
            Some(Err(_)) => interval,
            None => 0.0,
        };
        l.last = Some(snapshot.taken_at);
        let straggler = 1 << slot(FindingKind::Straggler);
        let idle: Vec<Option<f64>> = if l.gpus.values().any(|g| g.open & straggler != 0) {
            snapshot.devices.iter().map(|d| idle_while_allocated(d, span, l.allocated_ratio)).collect()
        } else {
            Vec::new()
        };
        let mut rows = Vec::with_capacity(snapshot.devices.len());
        for (at, d) in snapshot.devices.iter().enumerate() {
            let g = match l.gpus.get_mut(d.info.uuid.as_str()) {
                Some(g) => g,
                None => l.gpus.entry(d.info.uuid.clone()).or_insert_with(|| GpuLedger::new(d)),
            };
            g.hold(&d.owner_labels(), job_of(snapshot, d));
            let wait = if g.open & straggler != 0 { peers_wait(&snapshot.devices, &idle, at) } else { 0.0 };
            g.add(d, span, l.allocated_ratio, wait);
        }
        // The findings of this tick open and close the causes charged from the next tick on, as
        // the report charges them.
        if let Some(diagnosis) = snapshot.output::<crate::Diagnosis>() {
            for event in &diagnosis.events {
                let Some(g) = event.finding.uuid.as_deref().and_then(|u| l.gpus.get_mut(u)) else { continue };
                let bit = 1 << slot(event.finding.kind);
                match event.transition {
                    Transition::Raised => g.open |= bit,
                    Transition::Cleared => g.open &= !bit,
                }
            }
        }
        for (at, d) in snapshot.devices.iter().enumerate() {
            if let Some(row) = l.gpus.get(d.info.uuid.as_str()).and_then(|g| g.row(at, &d.info)) {
                rows.push(row);
            }
        }
        drop(guard);
        snapshot.attach(AccountsOutput { rows });
    }
}

//! Diagnosis: gpumon says *why* a GPU is underused, not only that it is.
//!
//! [`Diagnoser`] is a [`Processor`]: after every sample it asks each rule whether its
//! condition holds on each GPU at this tick ("utilisation collapses to near zero within the
//! interval while memory is allocated"), keeps the answers over a rolling window, and turns
//! them into [`Finding`]s with evidence and advice, attached to the snapshot as its
//! [`Diagnosis`]. Every sink exports them (see [`Snapshot::visit_derived`]).
//!
//! # Raising and clearing (the same for every rule)
//! With a window of `N` ticks (`window / interval`, rounded up), a finding is **raised** once its
//! condition held on at least `raise_share` (80 %) of the last `N` ticks, and **cleared** once it
//! held on at most `clear_share` (20 %) of them. A condition that starts to hold is therefore
//! reported within one window (after `ceil(0.8 N)` ticks), and one that hovers at a threshold —
//! holding on about half the ticks — neither raises nor clears: no flapping.
//! `hardware_errors` is raised on the first tick its condition holds (an error is news at once)
//! and cleared after a whole window without new errors.
//!
//! Evidence is formatted when a finding is raised or cleared, and again every third of the window
//! while it holds ([`Diagnoser::evidence_refresh_ticks`]): a held finding's evidence describes
//! the readings as of at most a third of a window ago, not those of the tick that raised it (its
//! `since` stays). Every other tick allocates nothing.
//!
//! # Example: feeding snapshots directly
//! The stage runs on tick time, so hours of simulated sampling take milliseconds:
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
//! use gpumon_core::{DeviceInfo, DeviceSample, FindingKind, Processor, ProcessorContext, Snapshot, SystemInfo};
//!
//! let mut diagnoser = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(10)))?;
//! diagnoser.attach(&ProcessorContext::new(Duration::from_secs(1)));
//!
//! let info = Arc::new(DeviceInfo::new(0, "GPU-0", "NVIDIA H100 80GB HBM3"));
//! let system = Arc::new(SystemInfo::new("node-1", "example"));
//! let mut last = None;
//! for tick in 0..20u64 {
//!     let mut gpu = DeviceSample::new(info.clone());
//!     gpu.memory.used = Some(78 << 30);
//!     gpu.memory.total = Some(80 << 30);
//!     gpu.utilization.gpu = Some(0.9);
//!     let mut snapshot = Snapshot::new(system.clone(), vec![gpu])
//!         .with_seq(tick + 1)
//!         .with_taken_at(std::time::UNIX_EPOCH + Duration::from_secs(tick));
//!     diagnoser.process(&mut snapshot);
//!     last = snapshot.output::<gpumon_core::Diagnosis>().cloned();
//! }
//! let active = last.unwrap().active;
//! assert_eq!(active.len(), 1);
//! assert_eq!(active[0].kind, FindingKind::NearOom); // 97.5 % of memory used
//! # Ok::<(), gpumon_core::diagnose::DiagnoseConfigError>(())
//! ```

mod config;
pub(crate) mod finding;
mod limits;
mod phases;
mod rules;
mod run_job;
mod window;

pub use config::{
    DiagnoseConfig, DiagnoseConfigError, Thresholds, DEFAULT_IDLE_GRACE, DEFAULT_WINDOW, MAX_WINDOW_TICKS,
};
pub use limits::{limitations, Limitation, Sampling, MIN_WINDOW_TICKS};
pub(crate) use rules::{level_of, sole_owner};
pub use run_job::RunJob;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::Snapshot;
use crate::stages::diagnose::finding::{Busy, Diagnosis, Finding, FindingCount, FindingKind};
use crate::stages::{Processor, ProcessorContext};

use rules::{Counters, Groups, Past, TickStats, KINDS};
use window::{Ring, Tallies};

/// One raised finding's bookkeeping.
#[derive(Clone, Debug)]
struct Raised {
    finding: Finding,
    raised_at: SystemTime,
    /// The diagnoser's tick at which its evidence was last formatted.
    formatted: u64,
}

/// The findings raised on one device. Every tick asks which kinds are raised; only a raise or a
/// clear needs the findings themselves, which are large (evidence, advice), so they live out of
/// line and a tick reads one word instead of nine findings' worth of cache lines.
#[derive(Debug, Default)]
struct RaisedSet {
    /// Bit `k` set: kind `k` (in [`FindingKind::ALL`] order) is raised.
    mask: u16,
    findings: Box<[Option<Raised>; KINDS]>,
}

impl RaisedSet {
    fn is_raised(&self, k: usize) -> bool {
        self.mask & (1 << k) != 0
    }

    fn raise(&mut self, k: usize, raised: Raised) {
        self.mask |= 1 << k;
        self.findings[k] = Some(raised);
    }

    fn clear(&mut self, k: usize) -> Option<Raised> {
        self.mask &= !(1 << k);
        self.findings[k].take()
    }

    fn iter(&self) -> impl Iterator<Item = &Raised> {
        self.findings.iter().flatten()
    }

    fn clear_all(&mut self) -> impl Iterator<Item = Raised> + '_ {
        self.mask = 0;
        self.findings.iter_mut().filter_map(Option::take)
    }
}

/// Everything diagnosis remembers about one device.
#[derive(Debug)]
struct Track {
    history: Ring<Past>,
    /// Running counts over `history` for the multi-tick rules.
    swings: rules::Swings,
    /// Which conditions held on each tick of the window, per kind.
    tallies: Tallies<KINDS>,
    raised: RaisedSet,
    counters: Counters,
    /// `seq` of the last snapshot the device was in.
    seen: u64,
    /// Ticks the GPU has held memory (this allocation), and whether it has run since.
    allocated_ticks: usize,
    ran: bool,
    /// Something ran on it since it was allocated (a reading above the idle peak): before, its
    /// job loads and compiles, and its idling says nothing of its peers (see `judge_device`).
    worked: bool,
    /// Driver utilisation samples per tick, averaged over recent ticks (exponentially): the
    /// driver's sampling period is the interval over it.
    driver_samples_per_tick: Option<f64>,
    /// Allocated at the last tick with no level to judge (a MIG instance without GPM): no rule
    /// that reads the level can hold on it. Logged once per device.
    unjudged: bool,
    unjudged_logged: bool,
    /// A level was read at the last tick but no GPM SM activity (before Hopper).
    no_sm_activity: bool,
    /// The bubbles verdict's hysteresis ([`rules::Latches`]).
    latches: rules::Latches,
}

/// The diagnosis stage. Add it to an agent with
/// [`AgentBuilder::processor`](crate::AgentBuilder::processor), or feed it snapshots directly.
#[derive(Debug)]
pub struct Diagnoser {
    config: DiagnoseConfig,
    ticks: usize,
    raise_at: usize,
    clear_at: usize,
    /// [`DiagnoseConfig::idle_grace`] in ticks.
    grace_ticks: usize,
    /// A held finding's evidence is formatted again after this many ticks (a third of the window).
    refresh_ticks: usize,
    tracks: HashMap<String, Track>,
    active: Arc<[Finding]>,
    raised_total: Arc<[FindingCount]>,
    /// Each GPU's "busy" over the window, as of the last tick (shared while it stays).
    busy: Busy,
    /// The output attached last tick: shared again while nothing was raised or cleared, so a
    /// quiet tick allocates nothing.
    last: Option<Arc<Diagnosis>>,
    /// Tick counter of its own, so snapshots without a `seq` (fed by hand) still work.
    tick: u64,
    /// Scratch, reused every tick: per device position, its stats; the job groups.
    scratch: Vec<TickStats>,
    groups: Groups,
    /// The sampling interval, seconds.
    interval_secs: f64,
    /// The processes of the job `gpumon-agent run` started, when it runs under one.
    run_job: Option<RunJob>,
}

impl Diagnoser {
    /// A diagnosis stage with `config`. Until [`Processor::attach`] tells it the interval it
    /// assumes 1 s ticks.
    ///
    /// # Errors
    /// [`DiagnoseConfigError`] naming the bad key.
    pub fn new(config: DiagnoseConfig) -> Result<Self, DiagnoseConfigError> {
        config.validate(None)?;
        let mut d = Self {
            config,
            ticks: 1,
            raise_at: 1,
            clear_at: 0,
            grace_ticks: 0,
            refresh_ticks: 1,
            tracks: HashMap::new(),
            active: Arc::from(Vec::new()),
            raised_total: Arc::from(Vec::new()),
            busy: Busy::default(),
            last: None,
            tick: 0,
            scratch: Vec::new(),
            groups: Groups::default(),
            interval_secs: 1.0,
            run_job: None,
        };
        d.set_interval(Duration::from_secs(1));
        d.busy.window_seconds = d.config.window.as_secs_f64();
        d.busy.level = d.config.thresholds.imbalance_busy;
        Ok(d)
    }

    /// Tells the diagnosis the processes of a job it cannot read from the samples (the command
    /// `gpumon-agent run` started, and its descendants): the GPUs running one of them are one
    /// job, compared with each other only — before step marks, owners or launchers say otherwise
    /// (see [`RunJob`]). The set is read at every tick, so pids found later count from then on.
    pub fn with_run_job(mut self, job: RunJob) -> Self {
        self.run_job = Some(job);
        self
    }

    /// The window in ticks, and the tick counts that raise and clear.
    pub fn window_ticks(&self) -> usize {
        self.ticks
    }

    /// Every how many ticks a held finding's evidence is formatted again from the readings of
    /// that tick and its window: `ceil(N / 3)` for a window of `N` ticks (every 10 s with the
    /// default 30 s window, whatever the interval). Only those ticks allocate while findings are
    /// held.
    pub fn evidence_refresh_ticks(&self) -> usize {
        self.refresh_ticks
    }

    /// How many ticks of a fully holding condition raise a finding (`ceil(raise_share × N)`).
    pub fn raise_after_ticks(&self) -> usize {
        self.raise_at
    }

    /// How many GPUs held memory at the last tick with no level to judge — neither utilisation
    /// nor GPM SM activity: MIG instances on GPUs without GPM (NVML reads no utilisation per
    /// instance). No rule that reads the level (starvation, bubbles, imbalance, idle while
    /// allocated, straggler, PCIe-bound) can hold on them; [`Sampling::without_level`] says so
    /// in the limitations.
    pub fn devices_without_level(&self) -> usize {
        self.tracks.values().filter(|t| t.unjudged && t.seen == self.tick).count()
    }

    /// How many GPUs read a level at the last tick but no GPM SM activity (GPUs before Hopper):
    /// `memory_bound` reads the level and the memory controller there
    /// ([`Sampling::without_sm_activity`] says so in the limitations).
    pub fn devices_without_sm_activity(&self) -> usize {
        self.tracks.values().filter(|t| t.no_sm_activity && t.seen == self.tick).count()
    }

    /// The settings.
    pub fn config(&self) -> &DiagnoseConfig {
        &self.config
    }

    fn set_interval(&mut self, interval: Duration) {
        let interval = interval.max(Duration::from_millis(1));
        self.interval_secs = interval.as_secs_f64();
        let n = window_ticks(self.config.window, interval).min(MAX_WINDOW_TICKS);
        self.ticks = n;
        self.raise_at = ((self.config.raise_share * n as f64).ceil() as usize).clamp(1, n);
        self.clear_at = ((self.config.clear_share * n as f64).floor() as usize).min(self.raise_at - 1);
        self.refresh_ticks = n.div_ceil(3).max(1);
        self.grace_ticks = (self.config.idle_grace.as_secs_f64() / interval.as_secs_f64()).ceil() as usize;
        // Windows are sized from the interval: start afresh.
        self.tracks.clear();
    }
}

impl Processor for Diagnoser {
    fn name(&self) -> &str {
        "diagnose"
    }

    fn attach(&mut self, context: &ProcessorContext) {
        if self.config.window < context.interval {
            tracing_warn_window(self.config.window, context.interval);
        }
        self.set_interval(context.interval);
    }

    fn process(&mut self, snapshot: &mut Snapshot) {
        self.tick += 1;
        // 1. Read every device once, into its job's group.
        self.read_devices(snapshot);
        // 2. Ask every rule, update the windows, raise and clear.
        let mut events = Vec::new();
        let mut changed = false;
        for position in 0..snapshot.devices.len() {
            changed |= self.judge_device(snapshot, position, &mut events);
        }
        // 3. Devices that left the snapshot take their findings with them.
        changed |= self.retire_gone(snapshot.taken_at, &mut events);
        // 4. Attach the diagnosis.
        self.publish(snapshot, events, changed);
    }
}

/// Whether a raised finding with `yes` holding ticks in its window clears.
/// `ceil(window / interval)`, at least 1 (saturating: a window of years is just too many).
fn window_ticks(window: Duration, interval: Duration) -> usize {
    (window.as_secs_f64() / interval.max(Duration::from_millis(1)).as_secs_f64()).ceil().max(1.0) as usize
}

fn clears(kind: FindingKind, yes: usize, clear_at: usize) -> bool {
    match kind {
        // An error stays news until a whole window has passed without another.
        FindingKind::HardwareErrors => yes == 0,
        _ => yes <= clear_at,
    }
}

#[cfg(feature = "runtime")]
fn tracing_warn_unjudged(uuid: &str, mig: bool) {
    let why = if mig {
        "a MIG instance: NVML reads no utilisation per instance, and it has no GPM"
    } else {
        "neither utilisation nor GPM SM activity is read"
    };
    tracing::warn!(
        gpu = uuid,
        "diagnosis cannot judge this GPU's level ({why}); only memory, clock and error rules apply to it"
    );
}

#[cfg(not(feature = "runtime"))]
fn tracing_warn_unjudged(_: &str, _: bool) {}

#[cfg(feature = "runtime")]
fn tracing_warn_window(window: Duration, interval: Duration) {
    tracing::warn!(?window, ?interval, "diagnosis window shorter than the sampling interval; using one tick");
}

#[cfg(not(feature = "runtime"))]
fn tracing_warn_window(_: Duration, _: Duration) {}

#[cfg(test)]
mod tests;

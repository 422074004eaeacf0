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
//! Evidence is formatted when a finding is raised or cleared, never on other ticks; steady-state
//! diagnosis allocates nothing.
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

pub(crate) mod finding;
mod limits;
mod rules;
mod window;

pub use limits::{limitations, Limitation, Sampling, MIN_WINDOW_TICKS};
pub(crate) use rules::{level_of, sole_owner};

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::Snapshot;
use crate::stages::diagnose::finding::{Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, Transition};
use crate::stages::steps::Steps;
use crate::stages::{Processor, ProcessorContext};

use rules::{Counters, Holds, HostContext, Past, TickStats, KINDS};
use window::{Extremes, Ring, Tallies};

/// Default diagnosis window: long enough that a few slow steps or one checkpoint save do not
/// raise anything, short enough that a starving job is named within half a minute.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// Most ticks one window may span (an hour at 100 ms): each GPU keeps one reading per tick of its
/// window, so a window of days at a short interval would ask for gigabytes.
pub const MAX_WINDOW_TICKS: usize = 36_000;

/// A bad diagnosis setting. The message names the configuration key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DiagnoseConfigError {
    /// A setting is out of range.
    #[error("diagnose.{key}: {reason}")]
    Invalid {
        /// The key, e.g. `window` or `thresholds.starvation_dip`.
        key: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A rule name that does not exist.
    #[error("diagnose.{key}: unknown rule `{name}` (known: {known})")]
    UnknownRule {
        /// The key that named it.
        key: String,
        /// The name given.
        name: String,
        /// Every rule name.
        known: String,
    },
}

macro_rules! thresholds {
    ($( $(#[$doc:meta])* $field:ident: $default:expr, )*) => {
        /// The numbers the rules compare against. Every value is a ratio in `0.0..=1.0`; each
        /// default comes with its reasoning (docs/diagnosis.md has the whole story).
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[cfg_attr(feature = "serde", derive(serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
        #[non_exhaustive]
        pub struct Thresholds { $( $(#[$doc])* pub $field: f64, )* }

        impl Default for Thresholds {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl Thresholds {
            /// Every threshold's name, in declaration order (the config keys).
            pub const NAMES: &'static [&'static str] = &[ $( stringify!($field), )* ];

            /// Sets the threshold named `name`.
            ///
            /// # Errors
            /// An unknown name or a value outside `0.0..=1.0`.
            pub fn set(&mut self, name: &str, value: f64) -> Result<(), DiagnoseConfigError> {
                match name {
                    $( stringify!($field) => self.$field = value, )*
                    _ => return Err(DiagnoseConfigError::Invalid {
                        key: format!("thresholds.{name}"),
                        reason: format!("unknown threshold (known: {})", Self::NAMES.join(", ")),
                    }),
                }
                self.validate()
            }

            /// Checks every value is a ratio and the pairs are ordered.
            ///
            /// # Errors
            /// The first bad key.
            pub fn validate(&self) -> Result<(), DiagnoseConfigError> {
                $(
                    if !(0.0..=1.0).contains(&self.$field) {
                        return Err(DiagnoseConfigError::Invalid {
                            key: concat!("thresholds.", stringify!($field)).to_owned(),
                            reason: format!("{} is not a ratio in 0.0..=1.0", self.$field),
                        });
                    }
                )*
                let ordered = |key: &str, low: f64, high: f64, what: &str| {
                    if low < high { Ok(()) } else {
                        Err(DiagnoseConfigError::Invalid { key: format!("thresholds.{key}"), reason: what.to_owned() })
                    }
                };
                ordered("starvation_dip", self.starvation_dip, self.starvation_peak, "must be below starvation_peak")?;
                ordered("imbalance_idle", self.imbalance_idle, self.imbalance_busy, "must be below imbalance_busy")?;
                ordered("near_oom_clear", self.near_oom_clear, self.near_oom_raise, "must be below near_oom_raise")?;
                // The pairs that bound one reading from both sides: out of order, the rule can
                // never hold, and a run would look healthy with it silently off.
                ordered(
                    "starvation_min_mean",
                    self.starvation_min_mean,
                    self.starvation_max_mean,
                    "must be below starvation_max_mean",
                )?;
                if self.idle_level > self.idle_peak {
                    return Err(DiagnoseConfigError::Invalid {
                        key: "thresholds.idle_level".to_owned(),
                        reason: "must not be above idle_peak (the interval's highest reading is at least its level)"
                            .to_owned(),
                    });
                }
                // A straggler reads above `imbalance_idle` and `straggler_gap` below peers that
                // are at most 100 % busy.
                ordered(
                    "straggler_gap",
                    self.straggler_gap,
                    1.0 - self.imbalance_idle,
                    "must be below 1 - imbalance_idle (a straggler reads above imbalance_idle and this far below its peers)",
                )?;
                Ok(())
            }
        }
    };
}

thresholds! {
    /// Memory used (ratio of total) from which a GPU counts as "allocated" — holding a job's
    /// work. 10 %: a CUDA context alone takes a few hundred MiB; a model takes gigabytes.
    allocated_memory_ratio: 0.10,
    /// Starvation: the interval's lowest utilisation is at or below this (the GPU fell idle).
    /// 10 %: a starved GPU drops to ~0 between batches; a busy one never does.
    starvation_dip: 0.10,
    /// Starvation: the interval's highest utilisation is at or above this (work does arrive).
    /// 60 %: tells "starved between bursts" from "barely used".
    starvation_peak: 0.60,
    /// Starvation: mean utilisation at or below this. 70 %: above it the loss is small.
    starvation_max_mean: 0.70,
    /// Starvation: mean utilisation at or above this. 15 %: below it the GPU mostly waits with
    /// short bursts — an inference server between requests looks the same, and NVML alone
    /// cannot tell a loader that starves a GPU that badly from one.
    starvation_min_mean: 0.15,
    /// Pipeline bubbles: mean utilisation at or below this. 85 %: stages idling in turn lose
    /// their idle share even when each is busy most of the time.
    bubbles_max_mean: 0.85,
    /// Starvation: the memory controller stays below this (busy memory means memory-bound).
    starvation_max_memory_controller: 0.50,
    /// Memory-bound: SM activity at or below this. 50 %: healthy training keeps SMs busier.
    memory_bound_max_sm_activity: 0.50,
    /// Memory-bound: DRAM bandwidth (or memory controller) at or above this. 70 %: near the
    /// practical peak of HBM.
    memory_bound_min_bandwidth: 0.70,
    /// Memory-bound where SM activity is not read (no GPM: before Hopper): the memory
    /// controller busy at least this share of the time, whatever the utilisation. Utilisation
    /// counts any kernel running, so a memory-bound kernel that runs all the time reads busy and
    /// the SM-activity test above cannot see it. 80 %: compute-bound training keeps the
    /// controller busy well under half the time; streaming kernels keep it busy nearly always.
    memory_bound_min_controller: 0.80,
    /// Imbalance: this GPU's utilisation at or below this. 25 %.
    imbalance_idle: 0.25,
    /// Imbalance: another allocated GPU's utilisation at or above this. 60 %.
    imbalance_busy: 0.60,
    /// Idle while allocated: utilisation at or below this. 5 %: housekeeping kernels only.
    idle_level: 0.05,
    /// Idle while allocated: the interval's highest utilisation at or below this.
    idle_peak: 0.15,
    /// Throttling: the SM clock below this share of its maximum. 90 %: boost clocks vary by a
    /// few percent without any throttling.
    throttle_clock_ratio: 0.90,
    /// Power throttling: power draw at or above this share of the limit.
    power_limit_ratio: 0.95,
    /// Near-OOM: memory used at or above this share raises. 95 %: allocators need headroom
    /// for fragmentation and a peak step.
    near_oom_raise: 0.95,
    /// Near-OOM: once raised, it holds until memory falls below this share (hysteresis).
    near_oom_clear: 0.92,
    /// PCIe-bound: traffic in one direction at or above this share of the link's bandwidth.
    /// 50 %: sustained, not bursty, copies.
    pcie_link_share: 0.50,
    /// PCIe-bound: utilisation at or below this (the GPU waits for the copies).
    pcie_max_level: 0.50,
    /// Straggler: the other allocated GPUs' mean utilisation at or above this (they are busy
    /// with the same work). 75 %.
    straggler_peers: 0.75,
    /// Straggler: this GPU at least this far below its peers' mean. 20 points: peers doing the
    /// same synchronous work stay within a few points of each other.
    straggler_gap: 0.20,
}

/// Settings of the diagnosis stage.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DiagnoseConfig {
    /// How long a condition must hold to raise a finding, and stop holding to clear it.
    /// Default [`DEFAULT_WINDOW`].
    pub window: Duration,
    /// Share of the window's ticks a condition must hold on to raise. Default 0.8.
    pub raise_share: f64,
    /// Share of the window's ticks at or below which an active finding clears. Default 0.2.
    pub clear_share: f64,
    /// Rules switched off.
    pub disabled: Vec<FindingKind>,
    /// The rules' thresholds.
    pub thresholds: Thresholds,
    /// How long a GPU may hold memory without having run before `idle_allocated` counts it:
    /// loading a model, compiling kernels and warming up hold the GPU idle for tens of
    /// seconds at the start of a job. A GPU that has run (utilisation at or above 50 %) since
    /// its memory was allocated gets no grace. Default [`DEFAULT_IDLE_GRACE`].
    pub idle_grace: Duration,
}

/// Default [`DiagnoseConfig::idle_grace`]: a minute, longer than a typical compile / warm-up
/// phase; with the default window a job that never runs is named about 1.5 minutes in.
pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(60);

impl Default for DiagnoseConfig {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            raise_share: 0.8,
            clear_share: 0.2,
            disabled: Vec::new(),
            thresholds: Thresholds::default(),
            idle_grace: DEFAULT_IDLE_GRACE,
        }
    }
}

impl DiagnoseConfig {
    /// Sets [`DiagnoseConfig::window`].
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Sets [`DiagnoseConfig::idle_grace`].
    #[must_use]
    pub fn with_idle_grace(mut self, grace: Duration) -> Self {
        self.idle_grace = grace;
        self
    }

    /// Sets [`DiagnoseConfig::thresholds`].
    #[must_use]
    pub fn with_thresholds(mut self, thresholds: Thresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// Switches off the rules named in `names` (stable snake_case kind names).
    ///
    /// # Errors
    /// [`DiagnoseConfigError::UnknownRule`] naming the first unknown name.
    pub fn disable_by_name<'a>(
        mut self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, DiagnoseConfigError> {
        for name in names {
            match FindingKind::from_name(name) {
                Some(kind) => self.disabled.push(kind),
                None => {
                    return Err(DiagnoseConfigError::UnknownRule {
                        key: "disable".to_owned(),
                        name: name.to_owned(),
                        known: FindingKind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>().join(", "),
                    })
                }
            }
        }
        Ok(self)
    }

    /// Checks the settings, and — when the sampling `interval` is known — that the window
    /// spans at least one tick.
    ///
    /// # Errors
    /// The first bad key.
    pub fn validate(&self, interval: Option<Duration>) -> Result<(), DiagnoseConfigError> {
        let invalid = |key: &str, reason: String| Err(DiagnoseConfigError::Invalid { key: key.to_owned(), reason });
        if self.window.is_zero() {
            return invalid("window", "must be greater than zero".to_owned());
        }
        if let Some(interval) = interval {
            if self.window < interval {
                return invalid(
                    "window",
                    format!("{:?} is shorter than the sampling interval {interval:?}", self.window),
                );
            }
            if window_ticks(self.window, interval) > MAX_WINDOW_TICKS {
                return invalid(
                    "window",
                    format!(
                        "{:?} spans more than {MAX_WINDOW_TICKS} ticks of the sampling interval {interval:?} \
                         (one reading per GPU and tick is kept)",
                        self.window
                    ),
                );
            }
        }
        if !(self.raise_share > 0.0 && self.raise_share <= 1.0) {
            return invalid("raise_share", format!("{} is not in (0, 1]", self.raise_share));
        }
        if !(self.clear_share >= 0.0 && self.clear_share < self.raise_share) {
            return invalid("clear_share", format!("{} must be in [0, raise_share)", self.clear_share));
        }
        self.thresholds.validate()
    }
}

/// One raised finding's bookkeeping.
#[derive(Clone, Debug)]
struct Raised {
    finding: Finding,
    raised_at: SystemTime,
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
    /// Running counts over `history` for the starvation rule.
    swings: rules::Swings,
    /// The lowest and highest reading over `history` (the steps' spread check).
    extremes: Extremes,
    /// Which conditions held on each tick of the window, per kind.
    tallies: Tallies<KINDS>,
    raised: RaisedSet,
    counters: Counters,
    /// `seq` of the last snapshot the device was in.
    seen: u64,
    /// Ticks the GPU has held memory (this allocation), and whether it has run since.
    allocated_ticks: usize,
    ran: bool,
    /// Driver utilisation samples per tick, averaged over recent ticks (exponentially): the
    /// driver's sampling period is the interval over it.
    driver_samples_per_tick: Option<f64>,
    /// Allocated at the last tick with no level to judge (a MIG instance without GPM): no rule
    /// that reads the level can hold on it. Logged once per device.
    unjudged: bool,
    unjudged_logged: bool,
    /// A level was read at the last tick but no GPM SM activity (before Hopper).
    no_sm_activity: bool,
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
    tracks: HashMap<String, Track>,
    active: Arc<[Finding]>,
    raised_total: Arc<[FindingCount]>,
    /// The output attached last tick: shared again while nothing was raised or cleared, so a
    /// quiet tick allocates nothing.
    last: Option<Arc<Diagnosis>>,
    /// Tick counter of its own, so snapshots without a `seq` (fed by hand) still work.
    tick: u64,
    /// Scratch, reused every tick: per device position, its stats.
    scratch: Vec<TickStats>,
    /// The sampling interval, seconds.
    interval_secs: f64,
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
            tracks: HashMap::new(),
            active: Arc::from(Vec::new()),
            raised_total: Arc::from(Vec::new()),
            last: None,
            tick: 0,
            scratch: Vec::new(),
            interval_secs: 1.0,
        };
        d.set_interval(Duration::from_secs(1));
        Ok(d)
    }

    /// The window in ticks, and the tick counts that raise and clear.
    pub fn window_ticks(&self) -> usize {
        self.ticks
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
        let tick = self.tick;
        let at = snapshot.taken_at;
        let t = self.config.thresholds;
        let (ticks, raise_at, clear_at, grace_ticks) = (self.ticks, self.raise_at, self.clear_at, self.grace_ticks);

        // 1. Read every device once; note the busiest allocated GPUs for the comparisons.
        self.scratch.clear();
        let mut host = HostContext::default();
        // For the lone busy GPU its peers wait for (see `TickStats::paces_peers`): allocated GPUs
        // with a level, those busy throughout (and the last of them not slowed), those cycling.
        let (mut with_level, mut busy_throughout_n, mut cycling) = (0usize, 0usize, 0usize);
        let mut unslowed_busy: Option<usize> = None;
        for (position, d) in snapshot.devices.iter().enumerate() {
            let track = match self.tracks.get_mut(d.info.uuid.as_str()) {
                Some(track) => track,
                None => self.tracks.entry(d.info.uuid.clone()).or_insert_with(|| Track {
                    history: Ring::new(ticks),
                    swings: rules::Swings::default(),
                    extremes: Extremes::default(),
                    tallies: Tallies::new(ticks),
                    raised: RaisedSet::default(),
                    counters: Counters::default(),
                    seen: 0,
                    allocated_ticks: 0,
                    ran: false,
                    driver_samples_per_tick: None,
                    unjudged: false,
                    unjudged_logged: false,
                    no_sm_activity: false,
                }),
            };
            track.seen = tick;
            let mut stats = TickStats::read(d, at, &mut track.counters);
            if let Some(w) = d.windows.gpu_utilization {
                // A tenth per tick: steady within a few seconds of ticks, whatever the interval.
                let n = f64::from(w.count);
                let avg = track.driver_samples_per_tick.map_or(n, |a| a + (n - a) * 0.1);
                track.driver_samples_per_tick = Some(avg);
            }
            stats.driver_period = track.driver_samples_per_tick.filter(|a| *a > 0.01).map(|a| self.interval_secs / a);
            if let Some(run) = snapshot.output::<Steps>().and_then(|s| s.for_gpu(d.info.index)) {
                stats.step_level = run.reported_utilization(&d.info.uuid);
                stats.step_secs = run.last_duration.map(|d| d.as_secs_f64());
            }
            track.unjudged = stats.allocated(&t) && stats.level.is_none();
            track.no_sm_activity = stats.level.is_some() && stats.sm_activity.is_none();
            if track.unjudged && !track.unjudged_logged {
                track.unjudged_logged = true;
                tracing_warn_unjudged(&d.info.uuid, d.info.mig.is_some());
            }
            if stats.allocated(&t) {
                if let Some(level) = stats.level {
                    host.offer(level, position);
                    if level >= t.imbalance_busy {
                        host.offer_busy_owner(stats.owner);
                    }
                }
                // Busy throughout the window so far and busy now, with its clocks held down.
                // This tick included, as the rules count it: a GPU its peers wait for is known
                // by the tick their starvation could first hold (see `MIN_PATTERN_TICKS`).
                let mut window = track.swings;
                window.entered(stats.swing(false, &t));
                let busy_throughout = window.busy_throughout() && stats.busy_now(&t);
                stats.pending_busy = window.busy_so_far();
                host.pending_busy += usize::from(stats.pending_busy);
                stats.slowed_busy = busy_throughout && stats.held_down(&t);
                host.slowed += usize::from(stats.slowed_busy);
                if !busy_throughout && position < 128 {
                    host.not_busy_throughout |= 1 << position;
                }
                if stats.level.is_some() {
                    with_level += 1;
                    if busy_throughout {
                        busy_throughout_n += 1;
                        if !stats.slowed_busy {
                            unslowed_busy = Some(position);
                        }
                    } else if window.busy_and_idle() {
                        cycling += 1;
                    }
                }
                if stats.util.is_some() {
                    host.readable += 1;
                    host.busy_now += usize::from(stats.busy_now(&t));
                }
            }
            self.scratch.push(stats);
        }
        // One GPU busy throughout, with no slowdown reason, while every other allocated GPU (two
        // at least) goes busy and idle in turn: in a synchronous job they wait for it at every
        // step. Two or more busy GPUs, or a peer that does not cycle, is more than one job's
        // pattern (a busy job next to a starving one): nothing is inferred then.
        if let Some(position) = unslowed_busy {
            if host.slowed == 0 && busy_throughout_n == 1 && with_level >= 3 && cycling == with_level - 1 {
                self.scratch[position].paces_peers = true;
                host.slowed += 1;
            }
        }

        // 2. Ask every rule, update the windows, raise and clear.
        let enabled: Holds = std::array::from_fn(|k| !self.config.disabled.contains(&FindingKind::ALL[k]));
        let mut events = Vec::new();
        let mut changed = false;
        let mut new_counts: Option<Vec<FindingCount>> = None;
        for (position, d) in snapshot.devices.iter().enumerate() {
            let Some(track) = self.tracks.get_mut(d.info.uuid.as_str()) else { continue };
            let stats = self.scratch[position];
            let active: Holds = std::array::from_fn(|k| track.raised.is_raised(k));
            let allocated = stats.allocated(&t);
            if allocated {
                track.allocated_ticks = track.allocated_ticks.saturating_add(1);
                track.ran |= stats.level.is_some_and(|l| l >= 0.5);
            } else {
                track.allocated_ticks = 0;
                track.ran = false;
            }
            // In ticks, like the window: a stage fed snapshots faster than real time (a replay,
            // a test) keeps the same semantics.
            let past_grace = track.ran || track.allocated_ticks > grace_ticks;
            let together =
                allocated && host.idle_together(stats.util.is_some(), stats.idle_now(&t), stats.busy_now(&t));
            let holds = rules::evaluate(
                &stats,
                &track.history,
                &track.swings,
                &track.extremes,
                &host,
                position,
                &active,
                together,
                past_grace,
                &t,
            );
            track.swings.entered(stats.swing(together, &t));
            let (low, high) = stats.reading_extremes();
            track.extremes.entered(low, high);
            if let Some(left) = track.history.push(stats.past(together)) {
                track.swings.left(left.swing(&t));
                track.extremes.left();
            }
            track.tallies.push(std::array::from_fn(|k| holds[k] && enabled[k]));
            for (k, &kind) in FindingKind::ALL.iter().enumerate() {
                let enabled = enabled[k];
                let yes = track.tallies.yes(k);
                let raise = match kind {
                    FindingKind::HardwareErrors => holds[k],
                    _ => yes >= raise_at,
                };
                if !track.raised.is_raised(k) && enabled && raise && rules::confirm_raise(kind, &track.history) {
                    let peer = host
                        .busiest_other(position)
                        .map(|(l, p)| (snapshot.devices[p].info.index, snapshot.devices[p].info.uuid.as_str(), l));
                    let held = track.tallies.trailing_yes(k).max(1);
                    let since = track.history.iter().rev().nth(held - 1).map_or(at, |s| s.at);
                    let window = (yes, track.history.iter().count());
                    let mut evidence = rules::evidence(kind, &stats, &track.history, peer, window, &t);
                    // A slowed GPU busy throughout, with peers that are not: they wait for it.
                    let slowed_finding = stats.slowed_busy
                        && matches!(
                            kind,
                            FindingKind::ThermalThrottling
                                | FindingKind::PowerThrottling
                                | FindingKind::ExternalSlowdown
                        );
                    let pacing_finding = stats.paces_peers && kind == FindingKind::Straggler;
                    if slowed_finding || pacing_finding {
                        let waiting: Vec<String> = (0..snapshot.devices.len().min(128))
                            .filter(|&p| p != position && host.not_busy_throughout & (1 << p) != 0)
                            .map(|p| snapshot.devices[p].info.index.to_string())
                            .collect();
                        if !waiting.is_empty() {
                            let _ = write!(
                                evidence,
                                "; busy on every tick while GPU(s) {} are not: in a synchronous job they wait \
                                 for it at every step (no starvation, pipeline bubbles or straggler is named on \
                                 them meanwhile)",
                                waiting.join(", ")
                            );
                            if pacing_finding {
                                // Nothing on the GPU says why it is slower, and nothing says it
                                // shares the others' job: both readings, the second's cause.
                                evidence.push_str(
                                    "; no slowdown reason is active on it: another process on it, a larger share of \
                                     the work or a slower link would do this — or it runs a job of its own, and the \
                                     others idle for a cause of theirs (e.g. starving data loaders)",
                                );
                            }
                        }
                    }
                    // With a step tracker before this stage: the step time and the GPU's idle
                    // share of it, the number a starving loader costs.
                    if kind == FindingKind::DataloaderStarvation {
                        if let Some(step) =
                            snapshot.output::<Steps>().and_then(|s| s.evidence_for(d.info.index, &d.info.uuid))
                        {
                            evidence.push_str("; ");
                            evidence.push_str(&step);
                        }
                    }
                    let finding = Finding::new(
                        kind,
                        rules::severity(kind),
                        Some((d.info.index, d.info.uuid.as_str())),
                        since,
                        evidence,
                        rules::advice_for(kind, &track.history, &t),
                    );
                    events.push(FindingEvent {
                        transition: Transition::Raised,
                        finding: finding.clone(),
                        held_for: None,
                    });
                    track.raised.raise(k, Raised { finding, raised_at: at });
                    changed = true;
                    let counts = new_counts.get_or_insert_with(|| self.raised_total.to_vec());
                    match counts.iter_mut().find(|c| c.kind == kind) {
                        Some(c) => c.raised += 1,
                        None => counts.push(FindingCount { kind, raised: 1 }),
                    }
                } else if track.raised.is_raised(k) && (!enabled || clears(kind, yes, clear_at)) {
                    if let Some(r) = track.raised.clear(k) {
                        let mut finding = r.finding;
                        let window = (yes, track.history.iter().count());
                        finding.evidence = format!(
                            "no longer holds; now: {}",
                            rules::evidence(kind, &stats, &track.history, None, window, &t)
                        );
                        let held_for = at.duration_since(r.raised_at).ok();
                        events.push(FindingEvent { transition: Transition::Cleared, finding, held_for });
                        changed = true;
                    }
                }
            }
        }

        // 3. Devices that left the snapshot (lost from the bus and forgotten by the backend,
        //    or filtered away) take their findings with them.
        let before = self.tracks.len();
        self.tracks.retain(|_, track| {
            if track.seen == tick {
                return true;
            }
            for r in track.raised.clear_all() {
                let mut finding = r.finding;
                finding.evidence = "the GPU is no longer in the snapshot".to_owned();
                let held_for = at.duration_since(r.raised_at).ok();
                events.push(FindingEvent { transition: Transition::Cleared, finding, held_for });
            }
            false
        });
        changed |= self.tracks.len() != before;

        if changed {
            let mut active: Vec<Finding> =
                self.tracks.values().flat_map(|t| t.raised.iter().map(|r| r.finding.clone())).collect();
            active.sort_by(|a, b| (a.gpu, a.kind, &a.uuid).cmp(&(b.gpu, b.kind, &b.uuid)));
            self.active = Arc::from(active);
        }
        if let Some(mut counts) = new_counts {
            counts.sort_by_key(|c| c.kind);
            self.raised_total = Arc::from(counts);
        }
        let output = match &self.last {
            Some(last)
                if events.is_empty()
                    && last.events.is_empty()
                    && Arc::ptr_eq(&last.active, &self.active)
                    && Arc::ptr_eq(&last.raised_total, &self.raised_total) =>
            {
                last.clone()
            }
            _ => Arc::new(Diagnosis { active: self.active.clone(), events, raised_total: self.raised_total.clone() }),
        };
        self.last = Some(output.clone());
        snapshot.outputs.insert(output);
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

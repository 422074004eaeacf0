//! The diagnosis stage's settings: the window, the raise and clear shares, the rules switched
//! off and the thresholds the rules compare against.

use std::time::Duration;

use super::finding::FindingKind;
use super::window_ticks;

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
    /// Starvation: mean utilisation at or below this. 82 %: a GPU busy at ~97 % while it runs
    /// and idle 15 % of the time or more (the share from which a wait is named) reads at most
    /// this.
    starvation_max_mean: 0.82,
    /// Starvation: mean utilisation at or above this. 15 %: below it the GPU mostly waits with
    /// short bursts — an inference server between requests looks the same, and NVML alone
    /// cannot tell a loader that starves a GPU that badly from one.
    starvation_min_mean: 0.15,
    /// Pipeline bubbles: a GPU of the job whose mean utilisation is at or below this may be a
    /// stage waiting on the others (a possible stage beside one that bubbles). 85 %: stages
    /// idling in turn lose their idle share even when each is busy most of the time. The GPU
    /// named for bubbles must read a wait worth naming itself: `starvation_max_mean`.
    bubbles_max_mean: 0.85,
    /// Starvation: the memory controller stays below this (busy memory means memory-bound).
    /// 70 %: training keeps the controller 30-60 % busy while it computes; a GPU streaming
    /// memory keeps it busier (`memory_bound_min_bandwidth`).
    starvation_max_memory_controller: 0.70,
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
    /// PCIe-bound: traffic in the busier direction, as a share of the link's bandwidth, while
    /// the SMs wait (see `pcie_bound` in `rules/host_waits.rs`), at or above this. 50 %: the
    /// link, not the GPU, sets the pace of those waits.
    pcie_link_share: 0.50,
    /// PCIe-bound: the window's mean utilisation at or below this: the GPU waits for the copies
    /// a share of the time worth naming (85 %: 15 % of the time, the share from which a wait
    /// is named).
    pcie_max_level: 0.85,
    /// Straggler: the mean utilisation of the other GPUs of its job at or above this: they spin
    /// in the collective while they wait for it, and read busy nearly all the time. 85 %:
    /// pipeline stages, which each idle their bubbles (15 % of the time or more when worth
    /// naming), read less, and so does a job whose ranks all starve.
    straggler_peers: 0.85,
    /// Straggler: this GPU at least this far below its peers' mean, on average over the window.
    /// 10 points: peers doing the same synchronous work stay within a few points of each other,
    /// and a rank 17 points behind costs its job 17 % (issue #42: 80 % among peers at 97 %).
    /// Also how far under the lone GPU busy throughout its job's other GPUs must read for it to
    /// be taken for the one they all wait for (a straggler too).
    straggler_gap: 0.10,
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

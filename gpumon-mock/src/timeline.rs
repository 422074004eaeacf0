//! Workloads described the way a person describes a job — phases over time with waveforms —
//! and the driver's own utilisation sampling, independent of how often gpumon samples.
//!
//! The tick-based [`Workload`](crate::Workload)s are functions of the tick: whatever the
//! interval, each tick's high-resolution window holds the shape the workload was written for.
//! The built-in scenarios (`gpumon-mock/profiles/scenarios/`) and the corpus are written in phases. A real
//! driver samples utilisation at its own period (NVML: "between 1 second and 1/6 second
//! depending on the product"), each sample the busy share of the period before it, and
//! `nvmlDeviceGetSamples` returns the samples taken since the last call: at a 100 ms interval
//! with a 1/6 s period most windows hold one sample or none; at 2 s, twelve. A [`Phase`] list
//! describes what the GPU does in simulated seconds; [`DriverSampler`] turns it into the samples
//! a driver with period `driver_period` would have taken in each interval — one, none or ten.
//!
//! ```toml
//! driver_period_ms = 167        # the driver's sampling period (default 1/6 s)
//!
//! [[phases]]                   # a 40 s compile / warm-up: memory held, nothing runs
//! until_s = 40
//! shape = "steady"
//! busy = 0.0
//! memory = 0.6
//!
//! [[phases]]                   # then a loader-starved job: 0.4 s of compute per 1 s step
//! from_s = 40
//! shape = "square"
//! busy_s = 0.4
//! idle_s = 0.6
//! jitter = 0.1
//! memory = 0.7
//! memory_controller = 0.15
//! ```

use serde::Deserialize;

use crate::error::ConfigError;

/// The default driver sampling period: 1/6 s, the fastest NVML documents.
pub const DEFAULT_DRIVER_PERIOD_S: f64 = 1.0 / 6.0;

/// How utilisation moves within a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Shape {
    /// `busy` throughout.
    #[default]
    Steady,
    /// Cycles of `busy_s` at `busy` then `idle_s` at `idle` (a step: compute, then wait).
    Square,
    /// `busy`, with a dip to `idle` of `dip_s` every `period_s` (checkpoints, evaluation).
    Dips,
    /// Short bursts: `busy_s` at `busy` every `busy_s + idle_s`, idle otherwise (inference).
    Bursts,
    /// From `idle` at the phase's start to `busy` at its end (`until_s` needed).
    Ramp,
    /// Cycles of `step_s` seconds, busy during the `pattern` stretches and idle otherwise: a
    /// schedule computed elsewhere (the simulator's pipeline stages, lockstep ranks, offload
    /// steps). Jitter stretches or shrinks the whole pattern within its cycle.
    Pattern,
}

/// One stretch of a GPU's life: what it runs from `from_s` until `until_s`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Phase {
    /// The physical GPUs it applies to; every GPU when absent.
    #[serde(default)]
    pub gpus: Option<Vec<u32>>,
    /// Start, simulated seconds since the first tick. A phase from 0 (the default) was already
    /// running before it: the first sample finds the job under way.
    #[serde(default)]
    pub from_s: f64,
    /// End (exclusive); open-ended when absent.
    #[serde(default)]
    pub until_s: Option<f64>,
    /// The waveform.
    #[serde(default)]
    pub shape: Shape,
    /// Utilisation while running, ratio. Default 0.95.
    #[serde(default = "defaults::busy")]
    pub busy: f64,
    /// Utilisation while waiting, ratio. Default 0.01.
    #[serde(default = "defaults::idle")]
    pub idle: f64,
    /// `square`/`bursts`: seconds at `busy` per cycle.
    #[serde(default = "defaults::one")]
    pub busy_s: f64,
    /// `square`/`bursts`: seconds at `idle` per cycle.
    #[serde(default = "defaults::one")]
    pub idle_s: f64,
    /// `dips`: seconds between dips.
    #[serde(default = "defaults::period")]
    pub period_s: f64,
    /// `dips`: how long a dip lasts.
    #[serde(default = "defaults::dip")]
    pub dip_s: f64,
    /// Relative jitter of each cycle's busy time (0.1: ±10 %), drawn per cycle.
    #[serde(default)]
    pub jitter: f64,
    /// Seconds the waveform is shifted by.
    #[serde(default)]
    pub offset_s: f64,
    /// Extra shift per GPU index (pipeline stages idle in turn: GPU `i` is `i × stagger_s` late).
    #[serde(default)]
    pub stagger_s: f64,
    /// Memory used, share of the usable memory. Default 0.7.
    #[serde(default = "defaults::memory")]
    pub memory: f64,
    /// Memory used at `until_s`: it moves linearly from `memory` over the phase (a cache or a
    /// fragmenting allocator that only grows). Needs `until_s`.
    #[serde(default)]
    pub memory_end: Option<f64>,
    /// Memory controller utilisation while running, ratio; default 45 % of the utilisation.
    #[serde(default)]
    pub memory_controller: Option<f64>,
    /// GPM SM activity, ratio; default 90 % of the utilisation.
    #[serde(default)]
    pub sm_activity: Option<f64>,
    /// GPM DRAM bandwidth, ratio; default the memory controller's.
    #[serde(default)]
    pub dram: Option<f64>,
    /// SM clock, share of its maximum. Default 0.97.
    #[serde(default = "defaults::clock")]
    pub sm_clock: f64,
    /// Clock-event reasons set in this phase, by name (`sw_power_cap`, `hw_slowdown`,
    /// `hw_thermal_slowdown`, `sw_thermal_slowdown`, `hw_power_brake_slowdown`, `gpu_idle`).
    /// As on a real GPU, `sw_power_cap` reads only while the draw is at the limit (≥ 97 % of
    /// it): in a dip the cap lifts. An interval with no activity at all adds `gpu_idle` (and
    /// the SM clock drops to idle).
    #[serde(default)]
    pub reasons: Vec<String>,
    /// GPU temperature, °C; default idle + 35 °C × utilisation.
    #[serde(default)]
    pub temperature_c: Option<f64>,
    /// Temperature at `until_s`, °C: it moves linearly from `temperature_c` over the phase
    /// (cooling that fails). Needs `until_s` and `temperature_c`. Whatever the phase says, a GPU
    /// reads at most 1 °C below its shutdown temperature.
    #[serde(default)]
    pub temperature_end_c: Option<f64>,
    /// Power at full utilisation, share of the limit. Default 0.9.
    #[serde(default = "defaults::power")]
    pub power: f64,
    /// PCIe receive traffic, share of the link's bandwidth. Default 0.02.
    #[serde(default = "defaults::pcie")]
    pub pcie_rx: f64,
    /// The GPU is lost (fell off the bus) during this phase.
    #[serde(default)]
    pub lost: bool,
    /// The job marks its training steps (the steps socket, the Python callback): a step ends
    /// with every cycle of a `square` or `bursts` phase, and every `step_s` in other shapes.
    /// [`MockFleet::step_marks`](crate::MockFleet::step_marks) says when.
    #[serde(default)]
    pub steps: bool,
    /// Step length for `steps` in shapes without cycles, seconds, and the cycle of a
    /// `pattern`. Default 1.
    #[serde(default = "defaults::one")]
    pub step_s: f64,
    /// `pattern`: the busy stretches of one cycle, `[start_s, end_s]` from the cycle's start,
    /// in order, within `0..=step_s`.
    #[serde(default)]
    pub pattern: Vec<[f64; 2]>,
    /// Draws each cycle's jitter from this key instead of the GPU index: GPUs of one job in
    /// lockstep share it, so their steps stretch together.
    #[serde(default)]
    pub jitter_key: Option<u64>,
    /// PCIe receive traffic while the GPU idles, share of the link's bandwidth (`pcie_rx`
    /// while it runs): copies that the SMs wait for (ZeRO offload). The reading is the
    /// instant's, as NVML's 20 ms counter.
    #[serde(default)]
    pub pcie_rx_idle: Option<f64>,
}

impl Default for Phase {
    /// A steady phase over the whole run with every default (what an empty `[[phases]]` says).
    fn default() -> Self {
        Self {
            gpus: None,
            from_s: 0.0,
            until_s: None,
            shape: Shape::Steady,
            busy: defaults::busy(),
            idle: defaults::idle(),
            busy_s: defaults::one(),
            idle_s: defaults::one(),
            period_s: defaults::period(),
            dip_s: defaults::dip(),
            jitter: 0.0,
            offset_s: 0.0,
            stagger_s: 0.0,
            memory: defaults::memory(),
            memory_end: None,
            memory_controller: None,
            sm_activity: None,
            dram: None,
            sm_clock: defaults::clock(),
            reasons: Vec::new(),
            temperature_c: None,
            temperature_end_c: None,
            power: defaults::power(),
            pcie_rx: defaults::pcie(),
            lost: false,
            steps: false,
            step_s: defaults::one(),
            pattern: Vec::new(),
            jitter_key: None,
            pcie_rx_idle: None,
        }
    }
}

mod defaults {
    pub(super) fn busy() -> f64 {
        0.95
    }
    pub(super) fn idle() -> f64 {
        0.01
    }
    pub(super) fn one() -> f64 {
        1.0
    }
    pub(super) fn period() -> f64 {
        60.0
    }
    pub(super) fn dip() -> f64 {
        5.0
    }
    pub(super) fn memory() -> f64 {
        0.7
    }
    pub(super) fn clock() -> f64 {
        0.97
    }
    pub(super) fn power() -> f64 {
        0.9
    }
    pub(super) fn pcie() -> f64 {
        0.02
    }
}

impl Phase {
    /// Checks the phase; `i` is its position for the error's key.
    pub(crate) fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("phases[{i}].{k}");
        let ratio = |k: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::invalid(key(k), format!("{v} is not a ratio in 0..=1")))
            }
        };
        ratio("busy", self.busy)?;
        ratio("idle", self.idle)?;
        ratio("memory", self.memory)?;
        ratio("sm_clock", self.sm_clock)?;
        ratio("power", self.power)?;
        ratio("pcie_rx", self.pcie_rx)?;
        ratio("jitter", self.jitter)?;
        for (k, v) in
            [("memory_controller", self.memory_controller), ("sm_activity", self.sm_activity), ("dram", self.dram)]
        {
            if let Some(v) = v {
                ratio(k, v)?;
            }
        }
        for (k, v) in [
            ("busy_s", self.busy_s),
            ("idle_s", self.idle_s),
            ("period_s", self.period_s),
            ("dip_s", self.dip_s),
            ("step_s", self.step_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::invalid(key(k), format!("{v} is not a duration in seconds")));
            }
        }
        if matches!(self.shape, Shape::Square | Shape::Bursts) && self.busy_s + self.idle_s <= 0.0 {
            return Err(ConfigError::invalid(key("busy_s"), "busy_s + idle_s must be above 0"));
        }
        if self.steps && self.step_period() <= 0.0 {
            return Err(ConfigError::invalid(key("step_s"), "steps need a step length above 0"));
        }
        if self.shape == Shape::Dips && self.period_s <= 0.0 {
            return Err(ConfigError::invalid(key("period_s"), "must be above 0"));
        }
        if self.shape == Shape::Pattern {
            self.validate_pattern().map_err(|reason| ConfigError::invalid(key("pattern"), reason))?;
        }
        if let Some(v) = self.pcie_rx_idle {
            ratio("pcie_rx_idle", v)?;
        }
        if self.shape == Shape::Ramp && self.until_s.is_none() {
            return Err(ConfigError::invalid(key("until_s"), "a ramp needs an end"));
        }
        if let Some(until) = self.until_s {
            if until <= self.from_s {
                return Err(ConfigError::invalid(
                    key("until_s"),
                    format!("{until} is not after from_s {}", self.from_s),
                ));
            }
        }
        // Values that move over the phase: `x` at `from_s` to `x_end` at `until_s`.
        if let Some(m) = self.memory_end {
            ratio("memory_end", m)?;
        }
        for (k, end) in [("memory_end", self.memory_end), ("temperature_end_c", self.temperature_end_c)] {
            if end.is_some() && self.until_s.is_none() {
                return Err(ConfigError::invalid(key(k), "moves until the phase's end: needs until_s"));
            }
        }
        if self.temperature_end_c.is_some() && self.temperature_c.is_none() {
            return Err(ConfigError::invalid(key("temperature_end_c"), "moves from temperature_c: set it too"));
        }
        self.reason_bits().map_err(|name| {
            ConfigError::invalid(
                key("reasons"),
                format!(
                    "unknown reason `{name}` (known: {})",
                    REASONS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        Ok(())
    }

    /// A pattern's stretches are in order, within its cycle, and the cycle is above 0.
    fn validate_pattern(&self) -> Result<(), String> {
        if !(self.step_s.is_finite() && self.step_s > 0.0) {
            return Err(format!("a pattern needs step_s above 0, not {}", self.step_s));
        }
        let mut last = 0.0;
        for &[a, b] in &self.pattern {
            if !(a >= last && b > a && b <= self.step_s + 1e-9) {
                return Err(format!("[{a}, {b}] is not an ordered stretch within 0..={} after {last}", self.step_s));
            }
            last = b;
        }
        Ok(())
    }

    /// Whether it applies to physical GPU `gpu` at simulated time `t`.
    pub(crate) fn covers(&self, gpu: u32, t: f64) -> bool {
        let started = t >= self.from_s || (self.from_s <= 0.0 && t < 0.0);
        self.gpus.as_ref().is_none_or(|g| g.contains(&gpu)) && started && self.until_s.is_none_or(|u| t < u)
    }

    /// Memory used at `t` (`memory`, moving to `memory_end`).
    pub(crate) fn memory_at(&self, t: f64) -> f64 {
        self.moving(self.memory, self.memory_end, t)
    }

    /// Temperature at `t`, when the phase sets one (`temperature_c`, moving to `temperature_end_c`).
    pub(crate) fn temperature_at(&self, t: f64) -> Option<f64> {
        self.temperature_c.map(|c| self.moving(c, self.temperature_end_c, t))
    }

    /// `start` at `from_s`, moving linearly to `end` at `until_s`; `start` throughout without an end.
    fn moving(&self, start: f64, end: Option<f64>, t: f64) -> f64 {
        match (end, self.until_s) {
            (Some(end), Some(until)) => {
                start + (end - start) * ((t - self.from_s) / (until - self.from_s)).clamp(0.0, 1.0)
            }
            _ => start,
        }
    }

    /// The clock-event reason bits it names; `Err(name)` for an unknown one.
    pub(crate) fn reason_bits(&self) -> Result<u64, &str> {
        self.reasons.iter().try_fold(0u64, |bits, name| {
            REASONS.iter().find(|(n, _)| *n == name.as_str()).map(|(_, b)| bits | b).ok_or(name.as_str())
        })
    }

    /// How long one marked step lasts: a cycle of `square`/`bursts`, else `step_s`.
    fn step_period(&self) -> f64 {
        match self.shape {
            Shape::Square | Shape::Bursts => self.busy_s + self.idle_s,
            _ => self.step_s,
        }
    }

    /// Utilisation at instant `t` on GPU `gpu` (`seed` draws the per-cycle jitter).
    pub(crate) fn level_at(&self, seed: u64, gpu: u32, t: f64) -> f64 {
        let local = t - self.from_s - self.offset_s - f64::from(gpu) * self.stagger_s;
        match self.shape {
            Shape::Steady => self.busy,
            Shape::Ramp => {
                let span = self.until_s.map_or(1.0, |u| u - self.from_s).max(1e-9);
                let share = ((t - self.from_s) / span).clamp(0.0, 1.0);
                self.idle + (self.busy - self.idle) * share
            }
            Shape::Square | Shape::Bursts => {
                let cycle = self.busy_s + self.idle_s;
                let c = (local / cycle).floor();
                let into = local - c * cycle;
                let u = unit(seed, gpu, c as i64) * 2.0 - 1.0;
                let busy_len = (self.busy_s * (1.0 + self.jitter * u)).clamp(0.0, cycle);
                if into < busy_len {
                    self.busy
                } else {
                    self.idle
                }
            }
            Shape::Pattern => {
                let (c, into) = self.cycle_of(local);
                let f = self.pattern_stretch(seed, gpu, c);
                let busy = self.pattern.iter().any(|&[a, b]| into >= a * f && into < (b * f).min(self.step_s));
                if busy {
                    self.busy
                } else {
                    self.idle
                }
            }
            Shape::Dips => {
                let c = (local / self.period_s).floor();
                let into = local - c * self.period_s;
                if into < self.dip_s {
                    self.idle
                } else {
                    self.busy
                }
            }
        }
    }
}

impl Phase {
    /// The cycle `local` (seconds into the waveform) falls in, and how far into it.
    fn cycle_of(&self, local: f64) -> (f64, f64) {
        let c = (local / self.step_s).floor();
        (c, local - c * self.step_s)
    }

    /// How much cycle `c` of a pattern is stretched (1 ± jitter), drawn per cycle from the
    /// jitter key (a lockstep job's) or the GPU.
    fn pattern_stretch(&self, seed: u64, gpu: u32, c: f64) -> f64 {
        let who = self.jitter_key.map_or(u64::from(gpu), |k| k ^ 0x4A17_7E2B);
        let u = unit(seed, who as u32 ^ (who >> 32) as u32, c as i64) * 2.0 - 1.0;
        1.0 + self.jitter * u
    }

    /// The busy time of a `pattern` phase on GPU `gpu` within `(a, b]` (simulated seconds),
    /// exactly: the stretches' overlaps with the span, at `busy`, the rest at `idle`.
    pub(crate) fn pattern_mean(&self, seed: u64, gpu: u32, a: f64, b: f64) -> f64 {
        let share = self.pattern_busy_share(seed, gpu, a, b);
        self.idle + (self.busy - self.idle) * share
    }

    /// The share of `(a, b]` a `pattern` phase on GPU `gpu` spends in its busy stretches, each
    /// cycle stretched by its jitter as [`level_at`](Self::level_at) plays it.
    pub(crate) fn pattern_busy_share(&self, seed: u64, gpu: u32, a: f64, b: f64) -> f64 {
        let shift = self.from_s + self.offset_s + f64::from(gpu) * self.stagger_s;
        let (la, lb) = (a - shift, b - shift);
        let mut busy = 0.0;
        let mut c = (la / self.step_s).floor();
        while c * self.step_s < lb {
            let origin = c * self.step_s;
            let f = self.pattern_stretch(seed, gpu, c);
            for &[s, e] in &self.pattern {
                let (s, e) = (origin + s * f, origin + (e * f).min(self.step_s));
                busy += (e.min(lb) - s.max(la)).max(0.0);
            }
            c += 1.0;
        }
        let span = (b - a).max(1e-12);
        (busy / span).clamp(0.0, 1.0)
    }
}

/// Clock-event reasons by name, as NVML's `nvmlClocksEventReason*` constants.
const REASONS: &[(&str, u64)] = &[
    ("gpu_idle", gpumon_core::ClockEventReasons::GPU_IDLE),
    ("sw_power_cap", gpumon_core::ClockEventReasons::SW_POWER_CAP),
    ("hw_slowdown", gpumon_core::ClockEventReasons::HW_SLOWDOWN),
    ("sw_thermal_slowdown", gpumon_core::ClockEventReasons::SW_THERMAL_SLOWDOWN),
    ("hw_thermal_slowdown", gpumon_core::ClockEventReasons::HW_THERMAL_SLOWDOWN),
    ("hw_power_brake_slowdown", gpumon_core::ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN),
];

/// A uniform draw in `0..1` from (seed, gpu, n): the same every time.
fn unit(seed: u64, gpu: u32, n: i64) -> f64 {
    let mut x = seed ^ (u64::from(gpu) << 40) ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// One GPU's timeline: the phases that name it, and how its driver samples utilisation.
#[derive(Clone, Debug)]
pub(crate) struct GpuTimeline {
    pub(crate) gpu: u32,
    pub(crate) phases: Vec<Phase>,
    pub(crate) seed: u64,
    /// The driver's sampling period, seconds.
    pub(crate) period: f64,
    /// Where this GPU's driver samples fall within a period: drivers do not sample in step with
    /// gpumon's ticks, nor with each other.
    pub(crate) phase_offset: f64,
}

/// What a GPU does at one tick, as the timeline says.
#[derive(Clone, Debug)]
pub(crate) struct TimelineTick<'a> {
    /// The phase in force at the end of the interval (`None`: no job, the GPU is idle and empty).
    pub(crate) phase: Option<&'a Phase>,
    /// The latest driver sample at or before the end of the interval (what
    /// `nvmlDeviceGetUtilizationRates` returns).
    pub(crate) latest: f64,
    /// The driver samples taken within the interval, oldest first.
    pub(crate) window: Vec<f64>,
    /// The true busy share of the interval (what energy and GPM activity follow).
    pub(crate) activity: f64,
    /// The utilisation at the interval's end instant (what a 20 ms counter such as PCIe
    /// throughput sees of the busy/idle cycle).
    pub(crate) instant: f64,
}

impl GpuTimeline {
    /// The phase in force at `t` (the last one listed that covers it).
    pub(crate) fn phase_at(&self, t: f64) -> Option<&Phase> {
        self.phases.iter().rev().find(|p| p.covers(self.gpu, t))
    }

    /// When the job on this GPU marked the end of a step within `(a, b]`, oldest first: the
    /// ends of the cycles of phases with `steps`, while the phase is in force.
    pub(crate) fn step_marks(&self, a: f64, b: f64) -> Vec<f64> {
        let mut marks = Vec::new();
        for phase in self.phases.iter().filter(|p| p.steps) {
            let period = phase.step_period();
            let origin = phase.from_s + phase.offset_s + f64::from(self.gpu) * phase.stagger_s;
            // The first cycle end after `a`; cycles end at origin + n × period, n ≥ 1.
            let mut n = ((a - origin) / period).floor().max(0.0) + 1.0;
            loop {
                let at = origin + n * period;
                if at > b {
                    break;
                }
                if at > a && self.phase_at(at).is_some_and(|p| std::ptr::eq(p, phase)) {
                    marks.push(at);
                }
                n += 1.0;
            }
        }
        marks.sort_by(f64::total_cmp);
        marks
    }

    fn level_at(&self, t: f64) -> f64 {
        self.phase_at(t).map_or(0.0, |p| p.level_at(self.seed, self.gpu, t))
    }

    /// The mean utilisation over `(a, b]`: what one driver sample reports.
    fn mean_over(&self, a: f64, b: f64) -> f64 {
        // A pattern in force over the whole span: exact (its stretches may be milliseconds
        // long, a pipeline's micro-batches, finer than any fixed grid of points).
        if let (Some(p), Some(q)) = (self.phase_at(a + 1e-9), self.phase_at(b)) {
            if std::ptr::eq(p, q) && p.shape == Shape::Pattern {
                return p.pattern_mean(self.seed, self.gpu, a, b);
            }
        }
        // Midpoint rule over 32 points: a square wave's share is off by at most 1/32 of the
        // span, well inside the rules' margins (10 % dip, 60 % peak).
        const N: usize = 32;
        let step = (b - a) / N as f64;
        (0..N).map(|k| self.level_at(a + (k as f64 + 0.5) * step)).sum::<f64>() / N as f64
    }

    /// The driver sample taken at `s`, floored to the driver's 1 % resolution.
    fn sample(&self, s: f64) -> f64 {
        (self.mean_over(s - self.period, s) * 100.0).floor().clamp(0.0, 100.0) / 100.0
    }

    /// The interval `(end - interval, end]`.
    pub(crate) fn tick(&self, end: f64, interval: f64) -> TimelineTick<'_> {
        let p = self.period;
        let last_k = ((end - self.phase_offset) / p).floor();
        let latest = self.sample(last_k * p + self.phase_offset);
        let mut window = Vec::new();
        let mut k = last_k;
        // Oldest first; every sample of the interval up to a bound on the work: 4 096 samples
        // are 11 min at the fastest driver (1/6 s), past which a window holds the interval's
        // last 11 min. A bound of 64 made windows of intervals over 10.7 s hold only their last
        // seconds: the level and the measured driver period were the tail's.
        while window.len() < MAX_WINDOW_SAMPLES {
            let s = k * p + self.phase_offset;
            if s <= end - interval {
                break;
            }
            window.push(s);
            k -= 1.0;
        }
        window.reverse();
        let window = window.into_iter().map(|s| self.sample(s)).collect();
        let activity = self.mean_over(end - interval, end);
        TimelineTick { phase: self.phase_at(end), latest, window, activity, instant: self.level_at(end) }
    }
}

/// Most driver samples one interval's window holds in the mock (a bound on work; see
/// `Timeline::tick`).
const MAX_WINDOW_SAMPLES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    fn square(busy_s: f64, idle_s: f64) -> Phase {
        toml::from_str(&format!("shape = \"square\"\nbusy_s = {busy_s}\nidle_s = {idle_s}\nbusy = 0.9\nidle = 0.0"))
            .unwrap()
    }

    fn timeline(phases: Vec<Phase>, period: f64) -> GpuTimeline {
        GpuTimeline { gpu: 0, phases, seed: 1, period, phase_offset: 0.01 }
    }

    #[test]
    fn each_interval_holds_the_samples_the_driver_took_in_it() {
        let t = timeline(vec![square(0.5, 0.5)], 1.0 / 6.0);
        // 100 ms ticks: 0 or 1 sample each, 6 per 6 ticks; 2 s ticks: 12.
        let counts: Vec<usize> = (1..=60).map(|k| t.tick(k as f64 * 0.1, 0.1).window.len()).collect();
        assert!(counts.iter().all(|&n| n <= 1), "{counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), 36);
        assert_eq!(t.tick(10.0, 2.0).window.len(), 12);
        // Long intervals hold the whole interval, not its last seconds: 30 s is 180 samples.
        assert_eq!(t.tick(60.0, 30.0).window.len(), 180);
        // 1 s driver period at 100 ms: nine windows in ten are empty.
        let slow = timeline(vec![square(0.5, 0.5)], 1.0);
        let empty = (1..=100).filter(|&k| slow.tick(k as f64 * 0.1, 0.1).window.is_empty()).count();
        assert_eq!(empty, 90);
    }

    #[test]
    fn a_sample_is_the_busy_share_of_the_period_before_it() {
        // 0.5 s busy / 0.5 s idle sampled every 1 s: every sample averages a whole cycle.
        let t = timeline(vec![square(0.5, 0.5)], 1.0);
        // (From the third second: the first sample also covers the time before the job.)
        for k in 3..20 {
            let v = t.tick(k as f64, 1.0).latest;
            assert!((v - 0.45).abs() <= 0.02, "{v}");
        }
        // Sampled every 1/6 s the same job swings between ~0 and ~0.9.
        let fast = timeline(vec![square(0.5, 0.5)], 1.0 / 6.0);
        let w = fast.tick(10.0, 2.0).window;
        assert!(w.iter().any(|&v| v <= 0.05) && w.iter().any(|&v| v >= 0.85), "{w:?}");
    }

    #[test]
    fn phases_follow_each_other_and_stagger_by_gpu() {
        let warm: Phase = toml::from_str("until_s = 40\nbusy = 0.0").unwrap();
        let run: Phase = toml::from_str("from_s = 40\nbusy = 0.9").unwrap();
        let t = timeline(vec![warm, run], 1.0 / 6.0);
        assert_eq!(t.tick(20.0, 1.0).activity, 0.0);
        assert!((t.tick(60.0, 1.0).activity - 0.9).abs() < 1e-9);
        let mut staggered = square(1.0, 3.0);
        staggered.stagger_s = 1.0;
        let g0 = GpuTimeline { gpu: 0, ..timeline(vec![staggered.clone()], 0.1) };
        let g1 = GpuTimeline { gpu: 1, ..timeline(vec![staggered], 0.1) };
        assert!(g0.level_at(0.5) > 0.5 && g1.level_at(0.5) < 0.5);
        assert!(g0.level_at(1.5) < 0.5 && g1.level_at(1.5) > 0.5);
    }

    #[test]
    fn memory_and_temperature_move_over_the_phase() {
        let p: Phase =
            toml::from_str("from_s = 10\nuntil_s = 30\nmemory = 0.9\nmemory_end = 0.99\ntemperature_c = 60.0\ntemperature_end_c = 80.0")
                .unwrap();
        p.validate(0).unwrap();
        assert_eq!(p.memory_at(10.0), 0.9);
        assert!((p.memory_at(20.0) - 0.945).abs() < 1e-12);
        assert_eq!(p.memory_at(30.0), 0.99);
        assert_eq!(p.temperature_at(20.0), Some(70.0));
        // Without an end they stay put.
        let flat: Phase = toml::from_str("memory = 0.5\ntemperature_c = 50.0").unwrap();
        assert_eq!((flat.memory_at(1e6), flat.temperature_at(1e6)), (0.5, Some(50.0)));
        assert_eq!(toml::from_str::<Phase>("busy = 0.5").unwrap().temperature_at(3.0), None);
    }

    #[test]
    fn a_phase_from_zero_was_running_before_the_first_sample() {
        let t = timeline(vec![toml::from_str("busy = 0.9").unwrap()], 1.0 / 6.0);
        let first = t.tick(0.0, 1.0);
        assert!(first.phase.is_some() && (first.activity - 0.9).abs() < 1e-9, "{first:?}");
        // A phase that starts later does not reach back.
        let later = timeline(vec![toml::from_str("from_s = 5\nbusy = 0.9").unwrap()], 1.0 / 6.0);
        assert!(later.tick(0.0, 1.0).phase.is_none() && later.tick(4.0, 1.0).activity == 0.0);
    }

    #[test]
    fn bad_phases_name_the_key() {
        let mut p = square(0.5, 0.5);
        p.busy = 1.5;
        assert!(p.validate(2).unwrap_err().to_string().contains("phases[2].busy"));
        let mut p = square(0.5, 0.5);
        p.reasons = vec!["too_hot".into()];
        assert!(p.validate(0).unwrap_err().to_string().contains("unknown reason `too_hot`"));
        let ramp: Phase = toml::from_str("shape = \"ramp\"").unwrap();
        assert!(ramp.validate(0).unwrap_err().to_string().contains("until_s"));
        let err = |src: &str| toml::from_str::<Phase>(src).unwrap().validate(1).unwrap_err().to_string();
        assert!(err("until_s = 9\nmemory_end = 1.2").contains("phases[1].memory_end"));
        let open = err("memory_end = 0.9");
        assert!(open.contains("phases[1].memory_end") && open.contains("until_s"), "{open}");
        assert!(err("temperature_c = 60.0\ntemperature_end_c = 80.0").contains("phases[1].temperature_end_c"));
        let no_start = err("until_s = 9\ntemperature_end_c = 80.0");
        assert!(no_start.contains("phases[1].temperature_end_c") && no_start.contains("temperature_c"), "{no_start}");
    }
}

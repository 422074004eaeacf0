//! Settings under which a rule cannot work, said rather than left silent.
//!
//! A rule that reads a family nobody samples, a window too short for the pattern it looks for, or
//! a host with too few GPUs to compare never raises anything, and a run that raised nothing looks
//! healthy. [`limitations`] lists, from the diagnosis settings and what is sampled, each such
//! case: the rules it concerns, why, and what to change. The agent prints them at start-up and
//! the run report ([`crate::report`]) lists them in its overview.
//!
//! Rules switched off in the configuration ([`DiagnoseConfig::disabled`]) are not limitations:
//! nothing is expected of them.

use std::fmt;
use std::time::Duration;

use super::DiagnoseConfig;
use crate::metric::{Family, MetricSet};
use crate::stages::diagnose::finding::{FindingKind, Severity};

/// Fewest ticks per window for the rules that read a pattern across ticks (starvation and
/// pipeline bubbles need five readings and four changes between busy and idle).
pub const MIN_WINDOW_TICKS: usize = 5;

/// What a run samples, for [`limitations`]: the interval and the metric families, and what is
/// known of the host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    interval: Duration,
    metrics: MetricSet,
    devices: Option<usize>,
    driver_period: Option<Duration>,
    step_marks: bool,
    without_sm_activity: usize,
    without_level: usize,
}

impl Sampling {
    /// Sampling every `interval`, the families in `metrics`; the device count and the driver's
    /// sampling period unknown, no step marks.
    pub fn new(interval: Duration, metrics: MetricSet) -> Self {
        Self {
            interval,
            metrics,
            devices: None,
            driver_period: None,
            step_marks: false,
            without_sm_activity: 0,
            without_level: 0,
        }
    }

    /// The number of GPUs diagnosed, when known (rules that compare GPUs need several).
    #[must_use]
    pub fn devices(mut self, devices: usize) -> Self {
        self.devices = Some(devices);
        self
    }

    /// The driver's utilisation sampling period, when measured (see
    /// [`Overview::driver_sample_period_seconds`](crate::report::Overview::driver_sample_period_seconds)).
    #[must_use]
    pub fn driver_period(mut self, period: Duration) -> Self {
        self.driver_period = Some(period);
        self
    }

    /// Whether training steps are marked (the steps socket or the Python callback is on).
    #[must_use]
    pub fn step_marks(mut self, on: bool) -> Self {
        self.step_marks = on;
        self
    }

    /// How many of the GPUs diagnosed read a level but no GPM SM activity (GPM: Hopper and
    /// later), when known: `memory_bound` reads the level in its place there (see
    /// [`limitations`]).
    #[must_use]
    pub fn without_sm_activity(mut self, gpus: usize) -> Self {
        self.without_sm_activity = gpus;
        self
    }

    /// How many GPUs held memory with no level to read — neither utilisation nor GPM SM
    /// activity: MIG instances without GPM, for which NVML reads no utilisation (see
    /// [`Diagnoser::devices_without_level`](super::Diagnoser::devices_without_level)).
    #[must_use]
    pub fn without_level(mut self, gpus: usize) -> Self {
        self.without_level = gpus;
        self
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The families sampled.
    pub fn metrics(&self) -> MetricSet {
        self.metrics
    }
}

/// One setting under which rules cannot work (or miss a known kind of case).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Limitation {
    /// The rules concerned (enabled ones only).
    pub rules: Vec<FindingKind>,
    /// [`Severity::Warning`]: these rules cannot raise anything under these settings.
    /// [`Severity::Info`]: they work, but miss a kind of case no setting reveals.
    pub severity: Severity,
    /// Why, in one line.
    pub reason: String,
    /// What to do about it, in one line.
    pub remedy: String,
}

impl fmt::Display for Limitation {
    /// `rule[, rule…]: reason; remedy`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(rule.name())?;
        }
        write!(f, ": {}; {}", self.reason, self.remedy)
    }
}

/// Every limitation of diagnosing with `config` under `sampling`, in a stable order; empty when
/// every enabled rule can work. Pure: call it at start-up and again when more is known (the
/// device count, the measured driver period).
///
/// What is checked, per enabled rule:
/// - the families it reads: utilisation (or the high-resolution window) for every utilisation
///   rule, memory (or processes) for "allocated", PCIe throughput and link for `pcie_bound`,
///   clock-event reasons (and clocks, power, temperature) for the throttling rules, GPM or the
///   memory controller for `memory_bound`, the error counters for `hardware_errors`;
/// - the window: fewer than [`MIN_WINDOW_TICKS`] ticks (`ceil(window / interval)`) and
///   `dataloader_starvation` / `pipeline_bubbles` cannot see busy and idle in turn across ticks;
/// - the device count, when known: `imbalance` and `pipeline_bubbles` need 2 GPUs, `straggler` 3;
/// - the driver: busy and idle stretches shorter than its utilisation sampling period (NVML:
///   1/6 s to 1 s by product; measured when given) are averaged away for `dataloader_starvation`,
///   and at intervals longer than the stages' idle stretch `pipeline_bubbles` reads as starvation.
///
/// ```
/// use std::time::Duration;
/// use gpumon_core::diagnose::{limitations, DiagnoseConfig, Sampling};
/// use gpumon_core::{FindingKind, MetricSet, Severity};
///
/// // The defaults: PCIe throughput is opt-in, so `pcie_bound` cannot work.
/// let sampling = Sampling::new(Duration::from_secs(1), MetricSet::default().with_stage_inputs());
/// let found = limitations(&DiagnoseConfig::default(), &sampling);
/// let pcie = found.iter().find(|l| l.rules == [FindingKind::PcieBound]).unwrap();
/// assert_eq!(pcie.severity, Severity::Warning);
/// assert!(pcie.remedy.contains("--enable pcie_throughput"));
///
/// // Switched off, it is no longer a limitation.
/// let config = DiagnoseConfig::default().disable_by_name(["pcie_bound"])?;
/// assert!(limitations(&config, &sampling).iter().all(|l| !l.rules.contains(&FindingKind::PcieBound)));
/// # Ok::<(), gpumon_core::diagnose::DiagnoseConfigError>(())
/// ```
pub fn limitations(config: &DiagnoseConfig, sampling: &Sampling) -> Vec<Limitation> {
    let on = |k: FindingKind| !config.disabled.contains(&k);
    let mut out = Vec::new();
    let mut add = |rules: &[FindingKind], severity: Severity, reason: String, remedy: String| {
        let rules: Vec<FindingKind> = rules.iter().copied().filter(|&k| on(k)).collect();
        if !rules.is_empty() {
            out.push(Limitation { rules, severity, reason, remedy });
        }
    };
    level_and_memory_families(config, sampling, &mut add);
    clock_and_error_families(sampling, &mut add);
    window_host_and_driver(config, sampling, &mut add);
    out
}

type Add<'a> = dyn FnMut(&[FindingKind], Severity, String, String) + 'a;

/// The families the level, memory and PCIe rules read.
fn level_and_memory_families(config: &DiagnoseConfig, sampling: &Sampling, add: &mut Add<'_>) {
    use FindingKind as K;
    let has = |f: Family| sampling.metrics.contains(f);
    let level = has(Family::Utilization) || has(Family::HighResolution);
    let level_rules = [K::DataloaderStarvation, K::PipelineBubbles, K::Imbalance, K::IdleAllocated, K::Straggler];
    if !level {
        add(
            &[&level_rules[..], &[K::PcieBound]].concat(),
            Severity::Warning,
            "GPU utilisation is not sampled (neither `utilization` nor `high_resolution`)".into(),
            "--enable utilization".into(),
        );
    }
    if !has(Family::Memory) && !has(Family::Processes) {
        add(
            &level_rules,
            Severity::Warning,
            "no GPU counts as allocated: neither memory nor processes is sampled".into(),
            "--enable memory".into(),
        );
    }
    if !has(Family::Memory) {
        add(&[K::NearOom], Severity::Warning, "memory is not sampled".into(), "--enable memory".into());
    }
    let pcie = match (has(Family::PcieThroughput), has(Family::PcieLink)) {
        (true, true) => None,
        (false, true) => Some(("throughput is", "--enable pcie_throughput")),
        (true, false) => Some(("link (generation, width) is", "--enable pcie_link")),
        (false, false) => Some(("throughput and link are", "--enable pcie_throughput --enable pcie_link")),
    };
    if let Some((what, flags)) = pcie {
        add(
            &[K::PcieBound],
            Severity::Warning,
            format!("PCIe {what} not sampled"),
            format!("{flags} (or switch the rule off: diagnose.disable = [\"pcie_bound\"])"),
        );
    }
    if !has(Family::Gpm) && !has(Family::Utilization) && !has(Family::HighResolution) {
        add(
            &[K::MemoryBound],
            Severity::Warning,
            "neither GPM (DRAM bandwidth) nor the memory-controller utilisation is sampled".into(),
            "--enable gpm or --enable utilization".into(),
        );
    }
    // Without GPM the level stands in for SM activity, and utilisation counts any kernel
    // running: a memory-bound kernel that runs all the time reads busy.
    let no_sm_activity = if !has(Family::Gpm) {
        Some("GPM is not sampled".to_owned())
    } else if sampling.without_sm_activity > 0 {
        Some(format!("{} GPU(s) read no GPM SM activity (GPM: Hopper and later)", sampling.without_sm_activity))
    } else {
        None
    };
    if let (Some(why), true) = (no_sm_activity, level) {
        add(
            &[K::MemoryBound],
            Severity::Info,
            format!(
                "{why}: a memory-bound kernel that keeps the GPU busy is found only from the memory controller busy on \
                 ≥ {:.0} % of the time (time busy, not bandwidth)",
                config.thresholds.memory_bound_min_controller * 100.0
            ),
            if has(Family::Gpm) {
                "confirm memory-bound kernels on those GPUs with a profiler (Nsight Compute's memory throughput)".into()
            } else {
                "--enable gpm (Hopper and later); elsewhere confirm with a profiler (Nsight Compute)".into()
            },
        );
    }
    if sampling.without_level > 0 {
        add(
            &[&level_rules[..], &[K::PcieBound]].concat(),
            Severity::Warning,
            format!(
                "{} GPU(s) held memory with no level to judge — MIG instances: NVML reads no utilisation per instance, and \
                 only Hopper and later have GPM SM activity to stand in",
                sampling.without_level
            ),
            "on Hopper --enable gpm; elsewhere judge the instances by their processes (--enable processes)".into(),
        );
    }
}

/// The families the clock and error rules read.
fn clock_and_error_families(sampling: &Sampling, add: &mut Add<'_>) {
    use FindingKind as K;
    let has = |f: Family| sampling.metrics.contains(f);
    if !has(Family::ClockEvents) {
        add(
            &[K::ThermalThrottling, K::PowerThrottling, K::ExternalSlowdown],
            Severity::Warning,
            "clock-event (throttle) reasons are not sampled".into(),
            "--enable clock_events".into(),
        );
    } else if !has(Family::Clocks) {
        add(
            &[K::ThermalThrottling, K::PowerThrottling, K::ExternalSlowdown],
            Severity::Info,
            "SM clocks are not sampled: a throttle reason alone raises, without checking the clock is held below its maximum"
                .into(),
            "--enable clocks".into(),
        );
    }
    if !has(Family::Power) {
        add(
            &[K::PowerThrottling],
            Severity::Warning,
            "power draw and limit are not sampled".into(),
            "--enable power".into(),
        );
    }
    if !has(Family::Temperature) {
        add(
            &[K::ExternalSlowdown],
            Severity::Warning,
            "temperature is not sampled: a slowdown on a cool GPU cannot be told from a hot one".into(),
            "--enable temperature".into(),
        );
    }
    if ![Family::Ecc, Family::Xid, Family::RemappedRows, Family::Nvlink].into_iter().any(has) {
        add(
            &[K::HardwareErrors],
            Severity::Info,
            "no error counters are sampled (ECC, XID, remapped rows, NVLink): only a lost GPU raises it".into(),
            "--enable ecc --enable xid --enable remapped_rows".into(),
        );
    }
}

/// The window, the device count and the driver's sampling period.
fn window_host_and_driver(config: &DiagnoseConfig, sampling: &Sampling, add: &mut Add<'_>) {
    use FindingKind as K;
    let has = |f: Family| sampling.metrics.contains(f);
    let level = has(Family::Utilization) || has(Family::HighResolution);
    // The window.
    let interval = sampling.interval.max(Duration::from_millis(1));
    let ticks = (config.window.as_secs_f64() / interval.as_secs_f64()).ceil().max(1.0) as usize;
    if level && ticks < MIN_WINDOW_TICKS {
        add(
            &[K::DataloaderStarvation, K::PipelineBubbles],
            Severity::Warning,
            format!(
                "the window holds {ticks} tick(s) (window {:?} / interval {:?}); busy and idle in turn across ticks needs at least {MIN_WINDOW_TICKS}",
                config.window, sampling.interval
            ),
            format!("--diagnose-window {} or longer, or a shorter --interval", secs(interval * MIN_WINDOW_TICKS as u32)),
        );
    }

    // The host.
    if let Some(n) = sampling.devices {
        if n < 2 {
            add(
                &[K::Imbalance, K::PipelineBubbles],
                Severity::Info,
                format!("{n} GPU diagnosed: these compare a GPU with the others (at least 2)"),
                "watch every GPU of the job (--devices)".into(),
            );
        }
        if n < 3 {
            add(
                &[K::Straggler],
                Severity::Info,
                format!("{n} GPU(s) diagnosed: a straggler falls behind a group of at least 2 peers (3 GPUs)"),
                "watch every GPU of the job (--devices); with 2 GPUs, one far behind is `imbalance`".into(),
            );
        }
    }

    // The driver.
    if level {
        let period = match sampling.driver_period {
            Some(p) => format!("measured here: {}", secs(p)),
            None => "between 1/6 s and 1 s by product".to_owned(),
        };
        add(
            &[K::DataloaderStarvation],
            Severity::Info,
            format!(
                "busy or idle stretches shorter than the driver's utilisation sampling period ({period}) are averaged away, \
                 and stretches not much longer are seen only where a sample falls within them: with steps a whole number \
                 of periods long, every sample of a GPU falls at the same point of its steps, and only the GPUs whose \
                 samples catch the idle part are found"
            ),
            if sampling.step_marks {
                "step marks are read: the idle share within steps (gpumon_step_utilization_ratio) shows them".into()
            } else {
                "mark training steps (--steps-socket or the Python callback): the idle share within steps shows them"
                    .into()
            },
        );
        if sampling.devices.is_none_or(|n| n >= 2) {
            add(
                &[K::PipelineBubbles],
                Severity::Info,
                format!(
                    "told from dataloader_starvation only when the stages' idle stretches are longer than the interval ({})",
                    secs(sampling.interval)
                ),
                "a shorter --interval when stages idle in turn for less than that".into(),
            );
        }
    }
}

/// A duration as a short, flag-ready text: `100ms`, `1.5s`, `30s`.
fn secs(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 1000.0 {
        format!("{}ms", ms.round() as u64)
    } else if (ms / 1e3).fract().abs() < 1e-9 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}s", format!("{:.2}", d.as_secs_f64()).trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_of(found: &[Limitation]) -> Vec<(Vec<FindingKind>, Severity)> {
        found.iter().map(|l| (l.rules.clone(), l.severity)).collect()
    }

    fn has_rule(found: &[Limitation], kind: FindingKind, severity: Severity) -> bool {
        found.iter().any(|l| l.severity == severity && l.rules.contains(&kind))
    }

    #[test]
    fn every_family_and_enough_ticks_leave_only_the_driver_caveats() {
        let sampling = Sampling::new(Duration::from_secs(1), MetricSet::everything()).devices(8);
        let found = limitations(&DiagnoseConfig::default(), &sampling);
        assert_eq!(
            rules_of(&found),
            vec![
                (vec![FindingKind::DataloaderStarvation], Severity::Info),
                (vec![FindingKind::PipelineBubbles], Severity::Info),
            ],
            "{found:#?}"
        );
        assert!(found[0].reason.contains("between 1/6 s and 1 s"), "{}", found[0]);
        assert!(found[0].remedy.contains("--steps-socket"), "{}", found[0]);
    }

    #[test]
    fn the_default_families_leave_pcie_bound_unable_to_work() {
        let found = limitations(
            &DiagnoseConfig::default(),
            &Sampling::new(Duration::from_secs(1), MetricSet::default().with_stage_inputs()),
        );
        let warnings: Vec<_> = found.iter().filter(|l| l.severity == Severity::Warning).collect();
        assert_eq!(warnings.len(), 1, "{found:#?}");
        assert_eq!(warnings[0].rules, [FindingKind::PcieBound]);
        assert_eq!(warnings[0].reason, "PCIe throughput is not sampled");
        assert!(warnings[0]
            .to_string()
            .starts_with("pcie_bound: PCIe throughput is not sampled; --enable pcie_throughput"));
    }

    #[test]
    fn missing_families_name_the_rules_that_read_them() {
        let i = Duration::from_secs(1);
        let all = MetricSet::everything();
        let config = DiagnoseConfig::default();
        let check = |without: &[Family], kind: FindingKind, needle: &str| {
            let metrics = without.iter().fold(all, |m, &f| m.without(f));
            let found = limitations(&config, &Sampling::new(i, metrics).devices(8));
            let l = found
                .iter()
                .find(|l| l.severity == Severity::Warning && l.rules.contains(&kind))
                .unwrap_or_else(|| panic!("{kind} without {without:?}: {found:#?}"));
            assert!(l.remedy.contains(needle), "{l}");
        };
        check(&[Family::ClockEvents], FindingKind::ThermalThrottling, "--enable clock_events");
        check(&[Family::ClockEvents], FindingKind::ExternalSlowdown, "--enable clock_events");
        check(&[Family::Power], FindingKind::PowerThrottling, "--enable power");
        check(&[Family::Memory], FindingKind::NearOom, "--enable memory");
        check(&[Family::Memory, Family::Processes], FindingKind::IdleAllocated, "--enable memory");
        check(&[Family::PcieLink], FindingKind::PcieBound, "--enable pcie_link");
        check(&[Family::Utilization, Family::HighResolution], FindingKind::DataloaderStarvation, "utilization");
        check(&[Family::Gpm, Family::Utilization, Family::HighResolution], FindingKind::MemoryBound, "--enable gpm");
        check(&[Family::Temperature], FindingKind::ExternalSlowdown, "--enable temperature");
        // Memory gone but processes sampled: a process on the GPU still counts as allocated.
        let found = limitations(&config, &Sampling::new(i, all.without(Family::Memory)).devices(8));
        assert!(!has_rule(&found, FindingKind::IdleAllocated, Severity::Warning), "{found:#?}");
        assert!(has_rule(&found, FindingKind::NearOom, Severity::Warning));
        // Only GPM gone: the memory controller still serves memory_bound.
        let found = limitations(&config, &Sampling::new(i, all.without(Family::Gpm)).devices(8));
        assert!(!has_rule(&found, FindingKind::MemoryBound, Severity::Warning), "{found:#?}");
        // Clock reasons without clocks: the rules work, less strictly.
        let found = limitations(&config, &Sampling::new(i, all.without(Family::Clocks)).devices(8));
        assert!(has_rule(&found, FindingKind::ThermalThrottling, Severity::Info), "{found:#?}");
        assert!(!has_rule(&found, FindingKind::ThermalThrottling, Severity::Warning));
    }

    #[test]
    fn a_window_of_fewer_than_five_ticks_is_said_with_the_window_that_would_do() {
        let config = DiagnoseConfig::default().with_window(Duration::from_secs(2));
        let at = |ms: u64| {
            limitations(&config, &Sampling::new(Duration::from_millis(ms), MetricSet::everything()).devices(8))
        };
        // 2 s / 500 ms = 4 ticks: too few. 2 s / 400 ms = 5: enough.
        let found = at(500);
        let l = found.iter().find(|l| l.reason.contains("window holds")).expect("a window limitation");
        assert_eq!(l.rules, [FindingKind::DataloaderStarvation, FindingKind::PipelineBubbles]);
        assert_eq!(l.severity, Severity::Warning);
        assert!(l.reason.contains("holds 4 tick(s)"), "{l}");
        assert!(l.remedy.contains("--diagnose-window 2.5s"), "{l}");
        assert!(at(400).iter().all(|l| !l.reason.contains("window holds")));
        // The boundary at sub-second intervals: 1 s / 250 ms = 4.
        let config = DiagnoseConfig::default().with_window(Duration::from_secs(1));
        let found = limitations(&config, &Sampling::new(Duration::from_millis(250), MetricSet::everything()));
        let l = found.iter().find(|l| l.reason.contains("window holds")).expect("a window limitation");
        assert!(l.remedy.contains("--diagnose-window 1.25s"), "{l}");
    }

    #[test]
    fn too_few_gpus_for_the_rules_that_compare_them() {
        let config = DiagnoseConfig::default();
        let with =
            |n: usize| limitations(&config, &Sampling::new(Duration::from_secs(1), MetricSet::everything()).devices(n));
        let one = with(1);
        assert!(has_rule(&one, FindingKind::Imbalance, Severity::Info));
        assert!(has_rule(&one, FindingKind::Straggler, Severity::Info));
        assert!(one.iter().any(|l| l.rules.contains(&FindingKind::PipelineBubbles) && l.reason.contains("1 GPU")));
        let two = with(2);
        assert!(!has_rule(&two, FindingKind::Imbalance, Severity::Info), "{two:#?}");
        assert!(has_rule(&two, FindingKind::Straggler, Severity::Info));
        let three = with(3);
        assert!(!has_rule(&three, FindingKind::Straggler, Severity::Info), "{three:#?}");
        // Unknown count: nothing said about it.
        let unknown = limitations(&config, &Sampling::new(Duration::from_secs(1), MetricSet::everything()));
        assert!(!has_rule(&unknown, FindingKind::Imbalance, Severity::Info));
    }

    #[test]
    fn a_measured_driver_period_and_step_marks_change_what_is_said() {
        let config = DiagnoseConfig::default();
        let base = Sampling::new(Duration::from_millis(100), MetricSet::everything()).devices(8);
        let starvation = |s: Sampling| {
            limitations(&config, &s).into_iter().find(|l| l.rules == [FindingKind::DataloaderStarvation]).unwrap()
        };
        let l = starvation(base.driver_period(Duration::from_secs(1)));
        assert!(l.reason.contains("(measured here: 1s)"), "{l}");
        let l = starvation(base.driver_period(Duration::from_millis(167)));
        assert!(l.reason.contains("(measured here: 167ms)"), "{l}");
        let l = starvation(base.step_marks(true));
        assert!(l.remedy.starts_with("step marks are read"), "{l}");
    }

    #[test]
    fn gpus_without_gpm_or_without_any_level_are_said() {
        let config = DiagnoseConfig::default();
        let base = Sampling::new(Duration::from_secs(1), MetricSet::everything()).devices(4);
        assert!(!has_rule(&limitations(&config, &base), FindingKind::MemoryBound, Severity::Info));
        // A100s: GPM sampled, none read.
        let found = limitations(&config, &base.without_sm_activity(4));
        let l = found.iter().find(|l| l.rules == [FindingKind::MemoryBound]).expect("a memory_bound limitation");
        assert_eq!(l.severity, Severity::Info);
        assert!(l.reason.starts_with("4 GPU(s) read no GPM SM activity"), "{l}");
        assert!(l.reason.contains("busy on ≥ 80 % of the time"), "{l}");
        // GPM not sampled at all.
        let found =
            limitations(&config, &Sampling::new(Duration::from_secs(1), MetricSet::everything().without(Family::Gpm)));
        let l = found.iter().find(|l| l.rules == [FindingKind::MemoryBound]).expect("a memory_bound limitation");
        assert!(l.remedy.contains("--enable gpm"), "{l}");
        // MIG instances with no level: every rule that reads it, as a warning.
        let found = limitations(&config, &base.without_level(7));
        let l = found.iter().find(|l| l.reason.contains("no level to judge")).expect("a MIG limitation");
        assert_eq!(l.severity, Severity::Warning);
        assert!(l.reason.starts_with("7 GPU(s) held memory"), "{l}");
        assert!(l.rules.contains(&FindingKind::IdleAllocated) && l.rules.contains(&FindingKind::DataloaderStarvation));
    }

    #[test]
    fn disabled_rules_are_not_limitations() {
        let config = DiagnoseConfig::default()
            .disable_by_name(["pcie_bound", "dataloader_starvation", "pipeline_bubbles", "imbalance", "straggler"])
            .unwrap();
        let found = limitations(
            &config,
            &Sampling::new(Duration::from_millis(500), MetricSet::default().with_stage_inputs()).devices(1),
        );
        assert!(found.is_empty(), "{found:#?}");
        // A limitation that concerns several rules keeps only the enabled ones.
        let config = DiagnoseConfig::default().disable_by_name(["thermal_throttling"]).unwrap();
        let found = limitations(
            &config,
            &Sampling::new(Duration::from_secs(1), MetricSet::everything().without(Family::ClockEvents)),
        );
        let l = found.iter().find(|l| l.reason.contains("clock-event")).unwrap();
        assert_eq!(l.rules, [FindingKind::PowerThrottling, FindingKind::ExternalSlowdown]);
    }
}

//! What changed between two runs: [`compare`] two [`Report`]s (a run before a fix and the same
//! run after it) into a [`Comparison`] — step time (median, p95), utilisation, GPU-time idle
//! while allocated, energy per step, and the findings raised and gone.
//!
//! Each measure is a [`Change`] with both values, the difference and the ratio, and whether it
//! went the good way; `Display` writes the few lines a person reads, the main change first.
//!
//! ```
//! use gpumon_core::report::compare::{compare, Measure};
//! # use gpumon_core::report::Report;
//! # fn reports() -> (Report, Report) { unimplemented!() }
//! # if false {
//! let (before, after) = reports();
//! let c = compare(&before, &after);
//! if let Some(step) = c.change(Measure::StepTimeMedian) {
//!     println!("step time {:+.1} %", step.relative_percent().unwrap_or(0.0));
//! }
//! println!("{c}");
//! # }
//! ```

use std::fmt;

use super::Report;
use crate::stages::diagnose::finding::FindingKind;

/// A figure compared between two runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Measure {
    /// Median step time over every run's steps, seconds (lower is better).
    StepTimeMedian,
    /// 95th percentile of step time, seconds (lower is better).
    StepTimeP95,
    /// Mean GPU utilisation over the report's GPUs, weighted by their samples, ratio (higher is
    /// better).
    Utilization,
    /// Share of the allocated GPU-time spent idle, ratio (lower is better).
    IdleWhileAllocated,
    /// Energy the report's GPUs used per step, joules (lower is better).
    EnergyPerStep,
}

impl Measure {
    /// Every measure, in the order printed.
    pub const ALL: [Measure; 5] = [
        Measure::StepTimeMedian,
        Measure::StepTimeP95,
        Measure::Utilization,
        Measure::IdleWhileAllocated,
        Measure::EnergyPerStep,
    ];

    /// The measure's name as a person reads it.
    pub fn label(self) -> &'static str {
        match self {
            Measure::StepTimeMedian => "step time median",
            Measure::StepTimeP95 => "step time p95",
            Measure::Utilization => "utilisation",
            Measure::IdleWhileAllocated => "idle while allocated",
            Measure::EnergyPerStep => "energy per step",
        }
    }

    /// Whether a higher value is the better one.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Measure::Utilization)
    }

    /// Whether the value is a ratio (printed in percent, its change in points).
    pub fn is_ratio(self) -> bool {
        matches!(self, Measure::Utilization | Measure::IdleWhileAllocated)
    }

    fn of(self, r: &Report) -> Option<f64> {
        let steps = r.steps.as_ref();
        match self {
            Measure::StepTimeMedian => steps?.duration_median_seconds,
            Measure::StepTimeP95 => steps?.duration_p95_seconds,
            Measure::Utilization => utilization(r),
            Measure::IdleWhileAllocated => {
                let o = &r.overview;
                (o.allocated_seconds > 0.0).then(|| o.idle_allocated_seconds / o.allocated_seconds)
            }
            Measure::EnergyPerStep => steps?.energy_per_step_joules,
        }
    }

    fn write_value(self, f: &mut fmt::Formatter<'_>, v: f64) -> fmt::Result {
        match self {
            Measure::StepTimeMedian | Measure::StepTimeP95 => write!(f, "{v:.3} s"),
            Measure::Utilization | Measure::IdleWhileAllocated => write!(f, "{:.1} %", v * 100.0),
            Measure::EnergyPerStep => write!(f, "{v:.1} J"),
        }
    }
}

/// Mean utilisation over the GPUs, weighted by their samples.
fn utilization(r: &Report) -> Option<f64> {
    let (sum, n) = r
        .gpus
        .iter()
        .filter_map(|g| Some((g.utilization_mean?, g.samples)))
        .fold((0.0, 0u64), |(sum, n), (mean, samples)| (sum + mean * samples as f64, n + samples));
    (n > 0).then(|| sum / n as f64)
}

/// One measure in both runs.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Change {
    /// What is compared.
    pub measure: Measure,
    /// The value before.
    pub before: f64,
    /// The value after.
    pub after: f64,
    /// `after − before`.
    pub difference: f64,
    /// `after / before − 1`; `None` when `before` is 0.
    pub relative: Option<f64>,
    /// Whether it went the good way (`None`: unchanged).
    pub improved: Option<bool>,
}

impl Change {
    fn new(measure: Measure, before: f64, after: f64) -> Self {
        let difference = after - before;
        let relative = (before != 0.0).then(|| after / before - 1.0);
        // A change below 0.5 % of the value (or 0.1 point of a ratio) is noise.
        let threshold = if measure.is_ratio() { 0.001 } else { before.abs() * 0.005 };
        let improved = (difference.abs() > threshold).then(|| (difference > 0.0) == measure.higher_is_better());
        Self { measure, before, after, difference, relative, improved }
    }

    /// The relative change in percent (`−41.7` for 1.2 s → 0.7 s).
    pub fn relative_percent(&self) -> Option<f64> {
        self.relative.map(|r| r * 100.0)
    }

    /// How large the change is, for ordering: the relative change, or for a ratio its
    /// difference in points over the larger value.
    fn size(&self) -> f64 {
        if self.measure.is_ratio() {
            let larger = self.before.max(self.after);
            if larger > 0.0 {
                self.difference.abs() / larger
            } else {
                0.0
            }
        } else {
            self.relative.map_or(0.0, f64::abs)
        }
    }
}

/// One run as the comparison names it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct RunSide {
    /// The host.
    pub hostname: String,
    /// The backend (`"mock"`: simulated GPUs).
    pub backend: String,
    /// GPUs in the report.
    pub gpus: usize,
    /// Wall time, seconds.
    pub wall_seconds: f64,
    /// Steps reported.
    pub steps: u64,
}

impl RunSide {
    fn of(r: &Report) -> Self {
        Self {
            hostname: r.hostname.clone(),
            backend: r.backend.clone(),
            gpus: r.gpus.len(),
            wall_seconds: r.wall_seconds,
            steps: r.steps.as_ref().map_or(0, |s| s.steps),
        }
    }
}

/// What changed between two runs: [`compare`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Comparison {
    /// The run before.
    pub before: RunSide,
    /// The run after.
    pub after: RunSide,
    /// Every measure both runs have, in [`Measure::ALL`] order.
    pub changes: Vec<Change>,
    /// The measures one run lacks (no steps marked, no utilisation, no energy readings).
    pub missing: Vec<Measure>,
    /// The largest change that went either way: the step time median when both runs marked
    /// steps and it moved, else the largest relative change.
    pub main: Option<Measure>,
    /// Kinds of finding raised before and not after.
    pub findings_gone: Vec<FindingKind>,
    /// Kinds raised after and not before.
    pub findings_new: Vec<FindingKind>,
    /// Kinds raised in both runs.
    pub findings_kept: Vec<FindingKind>,
    /// Per kind raised in either run, the GPU-time it cost in each.
    pub findings_lost: Vec<FindingLoss>,
}

/// The GPU-time one kind of finding cost in each run: [`Comparison::findings_lost`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FindingLoss {
    /// The kind.
    pub kind: FindingKind,
    /// GPU-time lost in the run before, seconds.
    pub before_gpu_seconds: f64,
    /// GPU-time lost in the run after, seconds.
    pub after_gpu_seconds: f64,
}

impl Comparison {
    /// The change of `measure`, when both runs have it.
    pub fn change(&self, measure: Measure) -> Option<&Change> {
        self.changes.iter().find(|c| c.measure == measure)
    }

    /// GPU-time findings of `kind` cost in the run before and the run after, seconds.
    pub fn lost(&self, kind: FindingKind) -> (f64, f64) {
        self.findings_lost
            .iter()
            .find(|l| l.kind == kind)
            .map_or((0.0, 0.0), |l| (l.before_gpu_seconds, l.after_gpu_seconds))
    }
}

/// Compares the run `before` with the run `after`.
pub fn compare(before: &Report, after: &Report) -> Comparison {
    let mut changes = Vec::new();
    let mut missing = Vec::new();
    for m in Measure::ALL {
        match (m.of(before), m.of(after)) {
            (Some(b), Some(a)) if b.is_finite() && a.is_finite() => changes.push(Change::new(m, b, a)),
            _ => missing.push(m),
        }
    }
    let moved = |c: &&Change| c.improved.is_some();
    let main = changes
        .iter()
        .filter(moved)
        .find(|c| c.measure == Measure::StepTimeMedian)
        .or_else(|| changes.iter().filter(moved).max_by(|a, b| a.size().total_cmp(&b.size())))
        .map(|c| c.measure);
    let kinds = |r: &Report| r.overview.causes.iter().map(|c| c.kind).collect::<Vec<_>>();
    let (kb, ka) = (kinds(before), kinds(after));
    let lost_in =
        |r: &Report, k: FindingKind| r.overview.causes.iter().find(|c| c.kind == k).map_or(0.0, |c| c.lost_gpu_seconds);
    let mut lost = Vec::new();
    for k in kb.iter().chain(ka.iter()) {
        if !lost.iter().any(|l: &FindingLoss| l.kind == *k) {
            lost.push(FindingLoss {
                kind: *k,
                before_gpu_seconds: lost_in(before, *k),
                after_gpu_seconds: lost_in(after, *k),
            });
        }
    }
    Comparison {
        before: RunSide::of(before),
        after: RunSide::of(after),
        changes,
        missing,
        main,
        findings_gone: kb.iter().filter(|k| !ka.contains(k)).copied().collect(),
        findings_new: ka.iter().filter(|k| !kb.contains(k)).copied().collect(),
        findings_kept: kb.iter().filter(|k| ka.contains(k)).copied().collect(),
        findings_lost: lost,
    }
}

/// `−41.7 %` / `+40.2 points`, and the word for its direction.
fn write_delta(f: &mut fmt::Formatter<'_>, c: &Change) -> fmt::Result {
    if c.measure.is_ratio() {
        write!(f, "{:+.1} points", c.difference * 100.0)?;
    } else {
        match c.relative_percent() {
            Some(p) => write!(f, "{p:+.1} %")?,
            None => write!(f, "{:+.3}", c.difference)?,
        }
    }
    match c.improved {
        Some(true) => f.write_str(" (better)"),
        Some(false) => f.write_str(" (worse)"),
        None => f.write_str(" (unchanged)"),
    }
}

/// `before → after`, `separator`, the difference (`write_delta`), and the end of the line.
fn write_change(f: &mut fmt::Formatter<'_>, c: &Change, separator: &str) -> fmt::Result {
    c.measure.write_value(f, c.before)?;
    f.write_str(" → ")?;
    c.measure.write_value(f, c.after)?;
    f.write_str(separator)?;
    write_delta(f, c)?;
    writeln!(f)
}

fn write_kinds(
    f: &mut fmt::Formatter<'_>,
    label: &str,
    kinds: &[FindingKind],
    c: &Comparison,
    cost: impl Fn((f64, f64)) -> String,
) -> fmt::Result {
    write!(f, "  {label:<22}")?;
    if kinds.is_empty() {
        return writeln!(f, "none");
    }
    let named: Vec<String> = kinds.iter().map(|k| format!("{} ({})", k.name(), cost(c.lost(*k)))).collect();
    writeln!(f, "{}", named.join(", "))
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: &RunSide| {
            let simulated = super::backend_note(&s.backend);
            format!("host {}{simulated}, {} GPU(s), {:.1} s, {} step(s)", s.hostname, s.gpus, s.wall_seconds, s.steps)
        };
        writeln!(f, "gpumon compare")?;
        writeln!(f, "  before                {}", side(&self.before))?;
        writeln!(f, "  after                 {}", side(&self.after))?;
        if super::backend_note(&self.before.backend) != super::backend_note(&self.after.backend) {
            writeln!(
                f,
                "  note                  one run's data is simulated or replayed and the other's is not: \
                 the changes below are not a measurement of one job"
            )?;
        }
        match self.main.and_then(|m| self.change(m)) {
            Some(c) => {
                write!(f, "  main change           {} ", c.measure.label())?;
                write_change(f, c, ", ")?;
            }
            None => writeln!(f, "  main change           none measurable")?,
        }
        for c in &self.changes {
            write!(f, "  {:<22}", c.measure.label())?;
            write_change(f, c, "  ")?;
        }
        if !self.missing.is_empty() {
            let names: Vec<&str> = self.missing.iter().map(|m| m.label()).collect();
            writeln!(f, "  not in both runs      {}", names.join(", "))?;
        }
        write_kinds(f, "findings gone", &self.findings_gone, self, |(b, _)| format!("{b:.1} GPU-s lost before"))?;
        write_kinds(f, "findings new", &self.findings_new, self, |(_, a)| format!("{a:.1} GPU-s lost after"))?;
        write_kinds(f, "findings in both", &self.findings_kept, self, |(b, a)| format!("{b:.1} → {a:.1} GPU-s lost"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CauseReport, GpuReport, Overview, StepsReport, REPORT_FORMAT};
    use super::*;

    fn gpu(util: f64, samples: u64) -> GpuReport {
        GpuReport {
            index: 0,
            uuid: "GPU-0".into(),
            name: "H100".into(),
            samples,
            observed_seconds: samples as f64,
            utilization_mean: Some(util),
            utilization_p5: None,
            utilization_p95: None,
            memory_peak_bytes: None,
            memory_total_bytes: None,
            power_mean_watts: None,
            energy_joules: None,
            energy_source: None,
            idle_allocated_ticks: 0,
            allocated_seconds: 0.0,
            idle_allocated_seconds: 0.0,
            findings: Vec::new(),
        }
    }

    fn cause(kind: FindingKind, lost: f64) -> CauseReport {
        CauseReport { kind, gpus: 1, raised: 1, active_gpu_seconds: lost, lost_gpu_seconds: lost }
    }

    fn report(
        median: f64,
        p95: f64,
        gpus: Vec<GpuReport>,
        idle: (f64, f64),
        energy: f64,
        causes: Vec<CauseReport>,
    ) -> Report {
        Report {
            format: REPORT_FORMAT,
            hostname: "node-1".into(),
            backend: "nvml".into(),
            ticks: 10,
            interval_seconds: 1.0,
            wall_seconds: 9.0,
            overview: Overview {
                gpus: gpus.len(),
                allocated_seconds: idle.1,
                idle_allocated_seconds: idle.0,
                main_cause: causes.first().cloned(),
                causes,
                ..Overview::default()
            },
            gpus,
            host_findings: Vec::new(),
            steps: Some(StepsReport {
                steps: 10,
                duration_median_seconds: Some(median),
                duration_p95_seconds: Some(p95),
                duration_mean_seconds: Some(median),
                energy_per_step_joules: Some(energy),
                marks_rejected: None,
                runs: Vec::new(),
            }),
        }
    }

    #[test]
    fn a_fixed_starvation_names_the_step_time_and_the_finding_gone() {
        let before = report(
            1.2,
            1.3,
            vec![gpu(0.30, 10), gpu(0.40, 30)],
            (62.0, 100.0),
            900.0,
            vec![cause(FindingKind::DataloaderStarvation, 55.0), cause(FindingKind::NearOom, 0.0)],
        );
        let after = report(0.45, 0.5, vec![gpu(0.95, 40)], (5.0, 100.0), 320.0, vec![cause(FindingKind::NearOom, 0.0)]);
        let c = compare(&before, &after);
        assert_eq!(c.main, Some(Measure::StepTimeMedian));
        let step = c.change(Measure::StepTimeMedian).unwrap();
        assert!((step.relative_percent().unwrap() - (0.45 / 1.2 - 1.0) * 100.0).abs() < 1e-9);
        assert_eq!(step.improved, Some(true));
        // Weighted by samples: (0.30 × 10 + 0.40 × 30) / 40.
        let util = c.change(Measure::Utilization).unwrap();
        assert!((util.before - 0.375).abs() < 1e-12, "{}", util.before);
        assert_eq!(util.improved, Some(true));
        let idle = c.change(Measure::IdleWhileAllocated).unwrap();
        assert!((idle.before - 0.62).abs() < 1e-12 && (idle.after - 0.05).abs() < 1e-12);
        assert_eq!(idle.improved, Some(true));
        assert_eq!(c.change(Measure::EnergyPerStep).unwrap().improved, Some(true));
        assert_eq!(c.findings_gone, vec![FindingKind::DataloaderStarvation]);
        assert_eq!(c.findings_kept, vec![FindingKind::NearOom]);
        assert!(c.findings_new.is_empty());
        assert_eq!(c.lost(FindingKind::DataloaderStarvation), (55.0, 0.0));

        let text = c.to_string();
        assert!(
            text.contains("  main change           step time median 1.200 s → 0.450 s, -62.5 % (better)"),
            "{text}"
        );
        assert!(text.contains("  utilisation           37.5 % → 95.0 %  +57.5 points (better)"), "{text}");
        assert!(text.contains("  findings gone         dataloader_starvation (55.0 GPU-s lost before)"), "{text}");
        assert!(text.contains("  findings new          none"), "{text}");
    }

    #[test]
    fn the_header_says_which_run_was_not_read_from_gpus_and_warns_when_they_differ() {
        let run = |backend: &str| {
            let mut r = report(0.5, 0.6, vec![gpu(0.9, 10)], (1.0, 10.0), 100.0, Vec::new());
            r.backend = backend.into();
            r
        };
        let note = "  note                  one run's data is simulated or replayed";
        let text = compare(&run("nvml"), &run("mock")).to_string();
        assert!(text.contains("  before                host node-1, 1 GPU(s)"), "{text}");
        assert!(text.contains("  after                 host node-1 (MOCK backend: simulated GPUs), "), "{text}");
        assert!(text.contains(note), "{text}");
        let text = compare(&run("replay"), &run("replay")).to_string();
        assert!(text.contains("host node-1 (REPLAY of a recorded trace, not live GPUs), "), "{text}");
        assert!(!text.contains(note), "both replayed: {text}");
        // A report from before the field (no backend) reads as live data, like `nvml`.
        assert!(!compare(&run(""), &run("nvml")).to_string().contains(note));
        assert!(run("replay")
            .to_string()
            .starts_with("gpumon run report: host node-1 (REPLAY of a recorded trace, not live GPUs), 10 tick(s)"));
    }

    #[test]
    fn a_regression_is_worse_and_new_findings_are_named() {
        let before = report(0.5, 0.6, vec![gpu(0.9, 10)], (1.0, 10.0), 100.0, Vec::new());
        let after = report(0.8, 2.0, vec![gpu(0.5, 10)], (5.0, 10.0), 160.0, vec![cause(FindingKind::Straggler, 3.0)]);
        let c = compare(&before, &after);
        for m in Measure::ALL {
            assert_eq!(c.change(m).unwrap().improved, Some(false), "{m:?}");
        }
        assert_eq!(c.findings_new, vec![FindingKind::Straggler]);
        assert!(c.to_string().contains("straggler (3.0 GPU-s lost after)"));
    }

    #[test]
    fn without_steps_the_step_measures_are_missing_and_utilisation_leads() {
        let mut before = report(1.0, 1.0, vec![gpu(0.2, 10)], (8.0, 10.0), 1.0, Vec::new());
        let mut after = report(1.0, 1.0, vec![gpu(0.6, 10)], (4.0, 10.0), 1.0, Vec::new());
        before.steps = None;
        after.steps = None;
        let c = compare(&before, &after);
        assert_eq!(c.missing, vec![Measure::StepTimeMedian, Measure::StepTimeP95, Measure::EnergyPerStep]);
        // Utilisation moved by 40 points of 60 %, idle by 40 of 80 %: utilisation is larger.
        assert_eq!(c.main, Some(Measure::Utilization));
        assert!(c.to_string().contains("not in both runs      step time median, step time p95, energy per step"));
    }

    #[test]
    fn the_same_run_twice_is_unchanged() {
        let r = report(1.0, 1.2, vec![gpu(0.5, 10)], (5.0, 10.0), 10.0, Vec::new());
        let c = compare(&r, &r);
        assert!(c.changes.iter().all(|c| c.improved.is_none()));
        assert_eq!(c.main, None);
        assert!(c.to_string().contains("main change           none measurable"));
    }
}

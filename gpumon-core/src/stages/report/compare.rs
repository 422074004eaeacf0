//! What changed between two runs: [`compare`] two [`Report`]s (a run before a fix and the same
//! run after it) into a [`Comparison`] — step time (median, p95), utilisation, GPU-time idle
//! while allocated, energy per step, and the findings raised and gone.
//!
//! Each measure is a [`Change`] with both values, the difference and the ratio, and whether it
//! went the good way; `Display` writes the few lines a person reads, the main change first.
//! [`compare_runs`] reads what `gpumon-agent run` adds to a report ([`RunRecord`]: how the
//! command ended, which GPUs were watched, the diagnosis window) and adds [`Note`]s where the
//! two runs cannot be compared as they stand: different GPUs or interval, a run shorter than
//! its diagnosis window, a command that failed in one run only, simulated against live data.
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
use crate::stages::diagnose::DEFAULT_WINDOW;

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
    /// For a replay (`backend` `"replay"`), the backend that recorded the trace, when the report
    /// says ([`RunRecord::recorded_backend`]).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub recorded_backend: Option<String>,
    /// How the command ended, when the report says ([`RunRecord::command`]).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub command: Option<CommandOutcome>,
    /// The sampling interval, seconds.
    #[cfg_attr(feature = "serde", serde(default))]
    pub interval_seconds: f64,
    /// The GPUs' models (names), each once, sorted.
    #[cfg_attr(feature = "serde", serde(default))]
    pub gpu_models: Vec<String>,
    /// The diagnosis window, seconds: the report's ([`RunRecord::diagnosis_window_seconds`]),
    /// else the default ([`DEFAULT_WINDOW`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub diagnosis_window_seconds: f64,
}

impl RunSide {
    fn of(run: &RunRecord) -> Self {
        let r = &run.report;
        let mut models: Vec<String> = r.gpus.iter().map(|g| g.name.clone()).collect();
        models.sort();
        models.dedup();
        Self {
            hostname: r.hostname.clone(),
            backend: r.backend.clone(),
            gpus: r.gpus.len(),
            wall_seconds: r.wall_seconds,
            steps: r.steps.as_ref().map_or(0, |s| s.steps),
            recorded_backend: run.recorded_backend.clone(),
            command: run.command.clone(),
            interval_seconds: r.interval_seconds,
            gpu_models: models,
            diagnosis_window_seconds: run.diagnosis_window_seconds.unwrap_or(DEFAULT_WINDOW.as_secs_f64()),
        }
    }

    /// Where the data came from.
    fn source(&self) -> Source {
        match (self.backend.as_str(), self.recorded_backend.as_deref()) {
            ("mock", _) | (crate::REPLAY_BACKEND, Some("mock")) => Source::Simulated,
            (crate::REPLAY_BACKEND, None) => Source::ReplayOfUnknown,
            _ => Source::Gpus,
        }
    }

    /// Shorter than its diagnosis window: a finding had no time to be raised.
    fn too_short(&self) -> bool {
        self.wall_seconds < self.diagnosis_window_seconds
    }

    /// ` (MOCK backend: simulated GPUs)`, ` (REPLAY of a trace recorded on the MOCK backend: …)`.
    fn data_note(&self) -> String {
        match (self.backend.as_str(), self.recorded_backend.as_deref()) {
            (crate::REPLAY_BACKEND, Some("mock")) => {
                " (REPLAY of a trace recorded on the MOCK backend: simulated GPUs)".to_owned()
            }
            (crate::REPLAY_BACKEND, Some(b)) if !b.is_empty() => format!(" (REPLAY of a trace recorded on {b})"),
            (backend, _) => super::backend_note(backend).to_owned(),
        }
    }
}

/// Where a run's data came from, for [`NoteKind::DataSource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Read from GPUs, live or replayed from a trace recorded on them.
    Gpus,
    /// The mock backend, live or replayed.
    Simulated,
    /// A replay whose report does not name the backend that recorded the trace.
    ReplayOfUnknown,
}

/// How the run's command ended: `gpumon-agent run`'s `command` key ([`RunRecord::command`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct CommandOutcome {
    /// Its exit code, when it exited.
    #[cfg_attr(feature = "serde", serde(default))]
    pub exit_code: Option<i32>,
    /// The signal that killed it, when one did.
    #[cfg_attr(feature = "serde", serde(default))]
    pub signal: Option<i32>,
    /// That signal's name (`SIGKILL`), when known.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub signal_name: Option<String>,
    /// The status a shell gives it (the exit code, or 128 + the signal): what `run` exits with.
    pub status: u8,
}

impl CommandOutcome {
    /// A command that exited with `code` (a shell's status: its low 8 bits).
    pub fn exited(code: i32) -> Self {
        Self { exit_code: Some(code), signal: None, signal_name: None, status: u8::try_from(code & 0xff).unwrap_or(1) }
    }

    /// A command killed by `signal` (`name`: `SIGKILL`, when known).
    pub fn killed(signal: i32, name: Option<&str>) -> Self {
        Self {
            exit_code: None,
            signal: Some(signal),
            signal_name: name.map(str::to_owned),
            status: u8::try_from(128 + signal).unwrap_or(255),
        }
    }

    /// Whether it exited with code 0.
    pub fn succeeded(&self) -> bool {
        self.status == 0
    }
}

/// `exited with code 3`, `was killed by signal 9 (SIGKILL)`.
impl fmt::Display for CommandOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.exit_code, self.signal) {
            (Some(code), _) => write!(f, "exited with code {code}"),
            (None, Some(signal)) => {
                write!(f, "was killed by signal {signal}")?;
                match &self.signal_name {
                    Some(name) => write!(f, " ({name})"),
                    None => Ok(()),
                }
            }
            (None, None) => write!(f, "ended with status {}", self.status),
        }
    }
}

/// Which GPUs a run report is about: `gpumon-agent run`'s `watched` key ([`RunRecord::watched`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Watched {
    /// The job's GPUs, or every GPU sampled.
    pub scope: WatchScope,
    /// The GPUs' indices.
    pub gpus: Vec<u32>,
    /// Why every GPU sampled, when so (the job's processes were not seen on any GPU: …).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub reason: Option<String>,
}

impl Watched {
    /// A report about `gpus` (indices) in `scope`; `reason`: why, for [`WatchScope::EveryGpu`].
    pub fn new(scope: WatchScope, gpus: Vec<u32>, reason: Option<String>) -> Self {
        Self { scope, gpus, reason }
    }
}

/// [`Watched::scope`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum WatchScope {
    /// The GPUs the job's processes were seen on.
    JobGpus,
    /// Every GPU sampled (the job's processes were not seen on any).
    EveryGpu,
}

/// A run report as `gpumon-agent run` writes it in JSON: the [`Report`]'s keys, and beside them
/// what `run` knows of the run. Each added key is optional, so that a report from before them
/// (or the agent's own `--report-format json`) reads as one.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct RunRecord {
    /// The report.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub report: Report,
    /// How the command ended.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub command: Option<CommandOutcome>,
    /// Which GPUs the report is about.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub watched: Option<Watched>,
    /// The diagnosis window, seconds: a finding needs that long to be raised.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub diagnosis_window_seconds: Option<f64>,
    /// For a replay, the backend that recorded the trace (`nvml`, `mock`: simulated).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub recorded_backend: Option<String>,
}

impl RunRecord {
    /// `report` with nothing beside it.
    pub fn new(report: Report) -> Self {
        Self { report, command: None, watched: None, diagnosis_window_seconds: None, recorded_backend: None }
    }

    /// Sets [`RunRecord::command`].
    #[must_use]
    pub fn with_command(mut self, command: CommandOutcome) -> Self {
        self.command = Some(command);
        self
    }

    /// Sets [`RunRecord::watched`].
    #[must_use]
    pub fn with_watched(mut self, watched: Watched) -> Self {
        self.watched = Some(watched);
        self
    }

    /// Sets [`RunRecord::diagnosis_window_seconds`].
    #[must_use]
    pub fn with_diagnosis_window(mut self, window: std::time::Duration) -> Self {
        self.diagnosis_window_seconds = Some(window.as_secs_f64());
        self
    }

    /// Sets [`RunRecord::recorded_backend`].
    #[must_use]
    pub fn with_recorded_backend(mut self, backend: impl Into<String>) -> Self {
        self.recorded_backend = Some(backend.into());
        self
    }
}

/// Why two runs' figures are not one job measured twice: [`Comparison::notes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum NoteKind {
    /// One run's data is simulated (mock, live or replayed) and the other's read from GPUs.
    DataSource,
    /// The runs' reports are about a different number of GPUs.
    GpuCount,
    /// The runs' GPUs are of different models.
    GpuModel,
    /// The runs sampled at different intervals.
    Interval,
    /// A run was shorter than its diagnosis window: a finding had no time to be raised in it.
    ShortRun,
    /// The command failed in one run and not in the other.
    CommandFailed,
}

/// One caveat of a comparison: [`Comparison::notes`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Note {
    /// What kind.
    pub kind: NoteKind,
    /// What a person reads.
    pub text: String,
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
    /// steps and it moved (by more than 0.5 %), else the largest relative change — energy per
    /// step only when both reports are about as many GPUs of the same models.
    pub main: Option<Measure>,
    /// Kinds of finding raised before and not after.
    pub findings_gone: Vec<FindingKind>,
    /// Kinds raised after and not before.
    pub findings_new: Vec<FindingKind>,
    /// Kinds raised in both runs.
    pub findings_kept: Vec<FindingKind>,
    /// Per kind raised in either run, the GPU-time it cost in each.
    pub findings_lost: Vec<FindingLoss>,
    /// Kinds raised in one run only, where the other run was shorter than its diagnosis window:
    /// their absence there says nothing (neither gone nor new).
    #[cfg_attr(feature = "serde", serde(default))]
    pub findings_unsettled: Vec<FindingKind>,
    /// Why the runs are not one job measured twice (different GPUs, …); empty when they are.
    #[cfg_attr(feature = "serde", serde(default))]
    pub notes: Vec<Note>,
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

/// Compares the run `before` with the run `after` (reports with nothing beside them: see
/// [`compare_runs`]).
pub fn compare(before: &Report, after: &Report) -> Comparison {
    compare_runs(&RunRecord::new(before.clone()), &RunRecord::new(after.clone()))
}

/// Compares the run `before` with the run `after`, with the notes on what makes them differ
/// beyond the job ([`Comparison::notes`]).
pub fn compare_runs(before_run: &RunRecord, after_run: &RunRecord) -> Comparison {
    let (before, after) = (&before_run.report, &after_run.report);
    let (side_before, side_after) = (RunSide::of(before_run), RunSide::of(after_run));
    let same_gpus = side_before.gpus == side_after.gpus && side_before.gpu_models == side_after.gpu_models;
    let mut changes = Vec::new();
    let mut missing = Vec::new();
    for m in Measure::ALL {
        match (m.of(before), m.of(after)) {
            (Some(b), Some(a)) if b.is_finite() && a.is_finite() => changes.push(Change::new(m, b, a)),
            _ => missing.push(m),
        }
    }
    let moved = |c: &&Change| c.improved.is_some();
    // Energy per step of other GPUs measures the GPUs, not the fix: it does not lead then.
    let comparable = |c: &&Change| same_gpus || c.measure != Measure::EnergyPerStep;
    let main = changes
        .iter()
        .filter(moved)
        .find(|c| c.measure == Measure::StepTimeMedian)
        .or_else(|| changes.iter().filter(moved).filter(comparable).max_by(|a, b| a.size().total_cmp(&b.size())))
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
    // A kind raised in one run only says something only when the other run lasted its window.
    let mut unsettled = Vec::new();
    let mut one_sided = |raised: &[FindingKind], other: &[FindingKind], other_short: bool| {
        let only: Vec<FindingKind> = raised.iter().filter(|k| !other.contains(k)).copied().collect();
        if other_short {
            unsettled.extend(only);
            Vec::new()
        } else {
            only
        }
    };
    let findings_gone = one_sided(&kb, &ka, side_after.too_short());
    let findings_new = one_sided(&ka, &kb, side_before.too_short());
    let notes = notes(&side_before, &side_after);
    Comparison {
        before: side_before,
        after: side_after,
        changes,
        missing,
        main,
        findings_gone,
        findings_new,
        findings_kept: kb.iter().filter(|k| ka.contains(k)).copied().collect(),
        findings_lost: lost,
        findings_unsettled: unsettled,
        notes,
    }
}

/// The caveats of comparing `before` with `after`.
fn notes(before: &RunSide, after: &RunSide) -> Vec<Note> {
    let mut notes = Vec::new();
    let mut note = |kind, text: String| notes.push(Note { kind, text });
    let (sb, sa) = (before.source(), after.source());
    if sb != sa {
        let says = |s: Source| match s {
            Source::Gpus => "read from GPUs",
            Source::Simulated => "simulated (mock backend)",
            Source::ReplayOfUnknown => "replayed from a trace whose backend the report does not name",
        };
        note(
            NoteKind::DataSource,
            format!(
                "the data before is {}, after {}: the changes below are not a measurement of one job",
                says(sb),
                says(sa)
            ),
        );
    }
    if before.gpus != after.gpus {
        note(
            NoteKind::GpuCount,
            format!(
                "the reports are about {} GPU(s) before and {} after: GPU-time and energy per step are of other GPUs",
                before.gpus, after.gpus
            ),
        );
    } else if before.gpu_models != after.gpu_models {
        note(
            NoteKind::GpuModel,
            format!(
                "the GPUs are of other models ({} before, {} after): step time and energy are of other hardware",
                before.gpu_models.join(", "),
                after.gpu_models.join(", ")
            ),
        );
    }
    if (before.interval_seconds - after.interval_seconds).abs() > 1e-9 {
        note(
            NoteKind::Interval,
            format!(
                "sampled every {} s before and every {} s after: utilisation and idle time are averaged over other intervals",
                before.interval_seconds, after.interval_seconds
            ),
        );
    }
    for (name, s) in [("before", before), ("after", after)] {
        if s.too_short() {
            note(
                NoteKind::ShortRun,
                format!(
                    "the run {name} lasted {:.1} s, shorter than its diagnosis window ({:.0} s): a finding had no time to be raised in it",
                    s.wall_seconds, s.diagnosis_window_seconds
                ),
            );
        }
    }
    let failed = |s: &RunSide| s.command.as_ref().is_some_and(|c| !c.succeeded());
    for (name, s, other) in [("before", before, after), ("after", after, before)] {
        if let (true, false, Some(c)) = (failed(s), failed(other), &s.command) {
            note(
                NoteKind::CommandFailed,
                format!("the command {c} in the run {name}, not in the other: its figures may be of a part of the job"),
            );
        }
    }
    notes
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
            let data = s.data_note();
            let command = s.command.as_ref().map(|c| format!(", the command {c}")).unwrap_or_default();
            format!(
                "host {}{data}, {} GPU(s), {:.1} s, {} step(s){command}",
                s.hostname, s.gpus, s.wall_seconds, s.steps
            )
        };
        writeln!(f, "gpumon compare")?;
        writeln!(f, "  before                {}", side(&self.before))?;
        writeln!(f, "  after                 {}", side(&self.after))?;
        for note in &self.notes {
            writeln!(f, "  note                  {}", note.text)?;
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
        write_kinds(f, "findings in both", &self.findings_kept, self, |(b, a)| format!("{b:.1} → {a:.1} GPU-s lost"))?;
        if !self.findings_unsettled.is_empty() {
            let named: Vec<&str> = self.findings_unsettled.iter().map(|k| k.name()).collect();
            writeln!(
                f,
                "  findings not compared {} (raised in one run only; the other was shorter than its diagnosis window)",
                named.join(", ")
            )?;
        }
        Ok(())
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
            // Longer than the default diagnosis window: its findings had time to be raised.
            wall_seconds: 60.0,
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
        let note = "  note                  the data before is read from GPUs, after simulated (mock backend): \
                    the changes below are not a measurement of one job";
        let text = compare(&run("nvml"), &run("mock")).to_string();
        assert!(text.contains("  before                host node-1, 1 GPU(s)"), "{text}");
        assert!(text.contains("  after                 host node-1 (MOCK backend: simulated GPUs), "), "{text}");
        assert!(text.contains(note), "{text}");
        let text = compare(&run("replay"), &run("replay")).to_string();
        assert!(text.contains("host node-1 (REPLAY of a recorded trace, not live GPUs), "), "{text}");
        assert!(!text.contains("  note "), "both replayed: {text}");
        // A report from before the field (no backend) reads as live data, like `nvml`.
        assert!(!compare(&run(""), &run("nvml")).to_string().contains("  note "));
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

    /// A replay of a mock trace is simulated too: the report names the recorded backend.
    #[test]
    fn a_mock_run_and_the_replay_of_its_trace_are_both_simulated() {
        let run = |backend: &str| {
            let mut r = report(0.5, 0.6, vec![gpu(0.9, 10)], (1.0, 10.0), 100.0, Vec::new());
            r.backend = backend.into();
            RunRecord::new(r)
        };
        let replay_of = |recorded: &str| run("replay").with_recorded_backend(recorded);
        let c = compare_runs(&run("mock"), &replay_of("mock"));
        assert!(c.notes.is_empty(), "{c}");
        let text = c.to_string();
        assert!(text.contains("  after                 host node-1 (REPLAY of a trace recorded on the MOCK backend: simulated GPUs), "), "{text}");
        // A replay of GPUs against the mock: one is simulated.
        let c = compare_runs(&replay_of("nvml"), &run("mock"));
        assert_eq!(c.notes.iter().map(|n| n.kind).collect::<Vec<_>>(), [NoteKind::DataSource]);
        assert!(c.to_string().contains("the data before is read from GPUs, after simulated (mock backend)"), "{c}");
        // A replay of GPUs against live GPUs: both measured.
        assert!(compare_runs(&replay_of("nvml"), &run("nvml")).notes.is_empty());
        // A replay whose report does not say what recorded it: said.
        let c = compare_runs(&run("replay"), &run("mock"));
        assert!(
            c.to_string().contains("the data before is replayed from a trace whose backend the report does not name"),
            "{c}"
        );
    }

    /// The reviewer's case: 4 GPUs for 60 s against 1 GPU for 6 s, the same step time.
    #[test]
    fn runs_of_other_gpus_or_shorter_than_their_window_say_so_and_claim_no_finding_gone() {
        let four: Vec<GpuReport> = (0..4).map(|_| gpu(0.4, 60)).collect();
        let before = report(1.0, 1.1, four, (30.0, 240.0), 800.0, vec![cause(FindingKind::DataloaderStarvation, 40.0)]);
        let mut after = report(1.0, 1.1, vec![gpu(0.4, 6)], (3.0, 6.0), 200.0, Vec::new());
        after.wall_seconds = 6.0;
        after.interval_seconds = 0.5;
        let c = compare_runs(&RunRecord::new(before.clone()), &RunRecord::new(after.clone()));
        let kinds: Vec<NoteKind> = c.notes.iter().map(|n| n.kind).collect();
        assert_eq!(kinds, [NoteKind::GpuCount, NoteKind::Interval, NoteKind::ShortRun], "{c}");
        // The step time did not move; energy per step of 4 GPUs against 1 does not lead.
        assert_eq!(c.change(Measure::EnergyPerStep).unwrap().improved, Some(true));
        assert_ne!(c.main, Some(Measure::EnergyPerStep), "{c}");
        assert!(c.findings_gone.is_empty(), "{c}");
        assert_eq!(c.findings_unsettled, [FindingKind::DataloaderStarvation]);
        let text = c.to_string();
        assert!(text.contains("  note                  the reports are about 4 GPU(s) before and 1 after"), "{text}");
        assert!(text.contains("  note                  sampled every 1 s before and every 0.5 s after"), "{text}");
        assert!(
            text.contains(
                "  note                  the run after lasted 6.0 s, shorter than its diagnosis window (30 s)"
            ),
            "{text}"
        );
        assert!(text.contains("  findings gone         none"), "{text}");
        assert!(text.contains("  findings not compared dataloader_starvation (raised in one run only;"), "{text}");
        // The window the report names counts, not the default.
        let c = compare_runs(
            &RunRecord::new(before.clone()),
            &RunRecord::new(after.clone()).with_diagnosis_window(std::time::Duration::from_secs(4)),
        );
        assert_eq!(c.findings_gone, [FindingKind::DataloaderStarvation]);
        assert!(!c.notes.iter().any(|n| n.kind == NoteKind::ShortRun), "{c}");
        // The same count of other models.
        let mut h200 = gpu(0.4, 60);
        h200.name = "H200".into();
        let mut other = before.clone();
        other.gpus[0] = h200;
        let c = compare(&before, &other);
        assert_eq!(c.notes.iter().map(|n| n.kind).collect::<Vec<_>>(), [NoteKind::GpuModel], "{c}");
        assert!(c.to_string().contains("the GPUs are of other models (H100 before, H100, H200 after)"), "{c}");
    }

    #[test]
    fn a_command_that_failed_in_one_run_only_is_noted() {
        let r = report(1.0, 1.2, vec![gpu(0.5, 10)], (5.0, 10.0), 10.0, Vec::new());
        let ok = RunRecord::new(r.clone()).with_command(CommandOutcome::exited(0));
        let killed = RunRecord::new(r.clone()).with_command(CommandOutcome::killed(9, Some("SIGKILL")));
        let c = compare_runs(&ok, &killed);
        assert_eq!(c.notes.iter().map(|n| n.kind).collect::<Vec<_>>(), [NoteKind::CommandFailed]);
        let text = c.to_string();
        assert!(
            text.contains("  note                  the command was killed by signal 9 (SIGKILL) in the run after, not in the other"),
            "{text}"
        );
        assert!(text.contains(", 10 step(s), the command exited with code 0\n"), "{text}");
        let failed = RunRecord::new(r.clone()).with_command(CommandOutcome::exited(3));
        assert!(compare_runs(&failed, &killed).notes.is_empty(), "both failed: nothing between them");
        // A report without the key (older, or the agent's own) is not taken as failed.
        assert!(compare_runs(&RunRecord::new(r), &ok).notes.is_empty());
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_run_record_reads_with_and_without_run_s_keys() {
        let r = report(1.0, 1.2, vec![gpu(0.5, 10)], (5.0, 10.0), 10.0, Vec::new());
        let record = RunRecord::new(r.clone())
            .with_command(CommandOutcome::killed(15, Some("SIGTERM")))
            .with_watched(Watched::new(WatchScope::JobGpus, vec![1, 2], None))
            .with_diagnosis_window(std::time::Duration::from_secs(30));
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json["command"],
            serde_json::json!({"exit_code": null, "signal": 15, "signal_name": "SIGTERM", "status": 143})
        );
        assert_eq!(json["watched"], serde_json::json!({"scope": "job_gpus", "gpus": [1, 2]}));
        assert_eq!(json["format"], 1, "the report's keys at the top");
        assert_eq!(serde_json::from_value::<RunRecord>(json).unwrap(), record);
        let plain = serde_json::to_value(&r).unwrap();
        assert_eq!(serde_json::from_value::<RunRecord>(plain).unwrap(), RunRecord::new(r));
    }
}

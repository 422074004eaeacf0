//! The report's data: what [`RunReport`](super::RunReport) hands back, serialisable.

use std::time::SystemTime;

use crate::stages::diagnose::finding::{FindingKind, Severity};
use crate::stages::diagnose::Limitation;

/// Where a GPU's energy figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum EnergySource {
    /// Increases of the driver's energy counter (exact).
    Counter,
    /// Power draw × interval, summed over the ticks (an estimate).
    IntegratedPower,
}

/// One finding as the run saw it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FindingReport {
    /// What was found.
    pub kind: FindingKind,
    /// How urgent it is.
    pub severity: Severity,
    /// The tick that raised it.
    #[cfg_attr(feature = "serde", serde(with = "crate::model::unix_nanos"))]
    pub raised_at: SystemTime,
    /// How long it held: from the raising tick to the clearing tick, or to the last tick of the
    /// run when it was still active.
    pub held_seconds: f64,
    /// Still active when the run ended.
    pub active_at_exit: bool,
    /// GPU-time this cause cost while it held, seconds (see the [module docs](super) for what
    /// each kind counts).
    pub lost_gpu_seconds: f64,
    /// The numbers that raised it.
    pub evidence: String,
    /// What to do about it.
    pub advice: String,
}

/// The summary of one GPU over the run.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct GpuReport {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Ticks on which the GPU was in the snapshot and up.
    pub samples: u64,
    /// GPU-time those ticks cover, seconds: each tick the time since the previous tick, at most
    /// the interval (the sample taken at exit covers only the part of an interval the run
    /// lasted; the run's first tick covers none). 0 in a report from before this field.
    #[cfg_attr(feature = "serde", serde(default))]
    pub observed_seconds: f64,
    /// Mean utilisation (ratio 0–1), over the ticks that reported it.
    pub utilization_mean: Option<f64>,
    /// 5th percentile of utilisation (ratio, 0.001 resolution).
    pub utilization_p5: Option<f64>,
    /// 95th percentile of utilisation (ratio, 0.001 resolution).
    pub utilization_p95: Option<f64>,
    /// Highest memory used, bytes.
    pub memory_peak_bytes: Option<u64>,
    /// Total memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Mean power draw, watts.
    pub power_mean_watts: Option<f64>,
    /// Energy used during the run, joules.
    pub energy_joules: Option<f64>,
    /// Where [`GpuReport::energy_joules`] comes from.
    pub energy_source: Option<EnergySource>,
    /// Whole ticks idle (level ≤ `idle_level`) while allocated.
    pub idle_allocated_ticks: u64,
    /// GPU-time allocated (what the ticks allocated with a known level cover, see
    /// [`GpuReport::observed_seconds`]), seconds.
    pub allocated_seconds: f64,
    /// Idle GPU-time while allocated: `(1 − level) × interval` summed over the allocated
    /// ticks, seconds — idle time within intervals counts, not only whole idle ticks.
    pub idle_allocated_seconds: f64,
    /// Every finding raised on this GPU, in the order raised.
    pub findings: Vec<FindingReport>,
}

/// The whole run's summary: what [`ReportHandle::report`](super::ReportHandle::report) returns.
///
/// `Display` writes the human summary; with the `serde` feature it serialises to JSON.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Report {
    /// The version of this JSON form ([`REPORT_FORMAT`] when written by this gpumon; 0 in a
    /// report written before versions), so that a reader refuses a form it would misread.
    #[cfg_attr(feature = "serde", serde(default))]
    pub format: u32,
    /// Host name of the last snapshot.
    pub hostname: String,
    /// The backend of the last snapshot ([`SystemInfo::backend`](crate::SystemInfo::backend)):
    /// `"mock"` for simulated GPUs, which the human form says; empty in a report from before
    /// this field.
    #[cfg_attr(feature = "serde", serde(default))]
    pub backend: String,
    /// Ticks (snapshots) seen.
    pub ticks: u64,
    /// The sampling interval, seconds.
    pub interval_seconds: f64,
    /// Wall time from the first to the last tick, seconds.
    pub wall_seconds: f64,
    /// The whole run at a glance: what the human form prints first.
    #[cfg_attr(feature = "serde", serde(default))]
    pub overview: Overview,
    /// Per GPU, ordered by index (then UUID).
    pub gpus: Vec<GpuReport>,
    /// Findings about the host rather than one GPU.
    pub host_findings: Vec<FindingReport>,
    /// The training steps marked during the run (the step tracker's reported steps); `None`
    /// when no step was reported.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub steps: Option<StepsReport>,
}

/// The version of the report's JSON form, [`Report::format`]: raised when a field changes
/// meaning or goes away (adding a field does not raise it).
pub const REPORT_FORMAT: u32 = 1;

/// The training steps of a run: every run (job, rank) together, then each run.
///
/// Steps are every step the tracker saw completed with a known duration (docs: [`crate::steps`]):
/// each step it reported one by one ([`RunSteps::reported`](crate::steps::RunSteps::reported),
/// at most 64 a tick, the latest) with its own duration, and those a loop marked faster than that
/// ([`RunSteps::completed`](crate::steps::RunSteps::completed) less the reported ones, or the
/// steps not reported with `every_n` over 1) at their mean, the rest of the tick's
/// [`completed_duration`](crate::steps::RunSteps::completed_duration). So the figures do not
/// depend on the sampling interval. The median and p95 are nearest-rank over those steps. **Energy per step** is, per GPU in the
/// report, the mean energy of the reported steps that had a reading for it, summed over those GPUs: the
/// energy the job's GPUs used per step (the tracker gives every run the figures of every GPU,
/// so the runs' steps are pooled per GPU rather than added).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct StepsReport {
    /// Steps completed, over every run.
    pub steps: u64,
    /// Median step time over every run's steps, seconds.
    pub duration_median_seconds: Option<f64>,
    /// 95th percentile of step time over every run's steps, seconds.
    pub duration_p95_seconds: Option<f64>,
    /// Mean step time, seconds.
    pub duration_mean_seconds: Option<f64>,
    /// Energy the report's GPUs used per step, joules (see above); `None` without readings.
    pub energy_per_step_joules: Option<f64>,
    /// Marks the steps socket dropped during the run, per reason (its `gpumon_steps_rejected_total`):
    /// steps these marks would have ended are not in the figures above. `None` without a steps
    /// socket. A run whose every mark was dropped has a steps part with 0 steps and these counts.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub marks_rejected: Option<crate::steps::StepRejections>,
    /// Per run, in the order first seen.
    pub runs: Vec<RunStepsReport>,
}

/// One run's (job, rank) steps: [`StepsReport::runs`].
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct RunStepsReport {
    /// The job name.
    pub job: String,
    /// The rank, if any.
    pub rank: Option<u32>,
    /// Steps completed.
    pub steps: u64,
    /// The first step number completed.
    pub first_step: Option<u64>,
    /// The last step number completed.
    pub last_step: Option<u64>,
    /// Median step time, seconds.
    pub duration_median_seconds: Option<f64>,
    /// 95th percentile of step time, seconds.
    pub duration_p95_seconds: Option<f64>,
    /// Mean step time, seconds.
    pub duration_mean_seconds: Option<f64>,
    /// Energy the report's GPUs used per step of this run, joules.
    pub energy_per_step_joules: Option<f64>,
}

/// The run at a glance, over every GPU: [`Report::overview`].
///
/// GPU-time is seconds of one GPU: eight GPUs over a minute are 480 GPU-seconds
/// (divide by 3 600 for GPU-hours).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Overview {
    /// GPUs seen during the run.
    pub gpus: usize,
    /// GPU-time observed: the sum of [`GpuReport::observed_seconds`] (each tick up covers the
    /// time since the previous tick, at most an interval), seconds.
    pub gpu_seconds: f64,
    /// GPU-time allocated, seconds (the sum of [`GpuReport::allocated_seconds`]).
    pub allocated_seconds: f64,
    /// Idle GPU-time while allocated, seconds (the sum of
    /// [`GpuReport::idle_allocated_seconds`]).
    pub idle_allocated_seconds: f64,
    /// The cause that cost the most GPU-time (when none cost any, the one held longest); the
    /// first of [`Overview::causes`]. `None` when nothing was raised on any GPU.
    pub main_cause: Option<CauseReport>,
    /// Per kind raised on any GPU, the time it held and the time it cost; most costly first.
    pub causes: Vec<CauseReport>,
    /// The driver's utilisation sampling period measured from the high-resolution windows,
    /// seconds; `None` without any driver sample.
    pub driver_sample_period_seconds: Option<f64>,
    /// Settings under which rules cannot work (see [`limitations`](crate::diagnose::limitations));
    /// empty when none, or when the report was not told the settings
    /// ([`RunReport::with_diagnosis`](super::RunReport::with_diagnosis)).
    pub limitations: Vec<Limitation>,
    /// The diagnosis window the findings were judged over, seconds; `None` when the report was
    /// not told the settings. A run shorter than it could not raise a finding, and its report
    /// says so where the main cause would be ([`Report::shorter_than_window`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub diagnosis_window_seconds: Option<f64>,
}

/// One kind of finding over the whole run.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct CauseReport {
    /// The kind.
    pub kind: FindingKind,
    /// GPUs it was raised on.
    pub gpus: usize,
    /// Times it was raised, over every GPU.
    pub raised: usize,
    /// GPU-time it held: the sum of its findings' [`FindingReport::held_seconds`], seconds.
    pub active_gpu_seconds: f64,
    /// GPU-time it cost: the sum of its findings' [`FindingReport::lost_gpu_seconds`], seconds.
    pub lost_gpu_seconds: f64,
}

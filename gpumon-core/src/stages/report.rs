//! The run report: "run my job under gpumon and tell me what went wrong".
//!
//! [`RunReport`] is a [`Processor`] that accumulates, per GPU, what a user wants to know after a
//! run — utilisation (mean, p5, p95), peak memory, mean power, energy used, the GPU-time spent
//! idle while memory was allocated — and every finding the diagnosis stage raised, with how long
//! it held. Add it **after** the [`Diagnoser`](crate::diagnose::Diagnoser) (processors run in
//! the order they were added, and the report reads the diagnosis events of each tick), keep the
//! [`ReportHandle`], and call [`ReportHandle::report`] when the run ends.
//!
//! The report opens with an [`Overview`] of the whole run — GPUs, wall time, GPU-time idle
//! while allocated, the main cause with the GPU-time it cost, the time lost per cause, the
//! driver's measured sampling period and the settings under which rules cannot work — then one
//! [`GpuReport`] per GPU.
//!
//! What is measured, exactly ("interval" below is the time a tick covers: the sampling
//! interval, or the time since the previous tick when that is shorter — the sample taken at exit
//! covers only the part of an interval the run lasted; the first tick opens the run and covers
//! no time, so a run's GPU-time is its wall time × GPUs when no tick came late):
//! - **Utilisation** is the diagnosis "level": the driver's high-resolution mean over the
//!   interval when the sample carries one, else the instantaneous `utilization.gpu`. Percentiles
//!   come from a fixed histogram of 1 001 bins (0.1 % wide, nearest rank), allocated once per
//!   GPU, so accumulating allocates nothing per tick.
//! - **Energy** is the sum of the increases of the driver's energy counter between consecutive
//!   ticks; without that counter (or with fewer than two readings), power × interval summed
//!   over the ticks. [`GpuReport::energy_source`] says which.
//! - **Allocated** ticks are those on which memory used is at least `allocated_memory_ratio`
//!   (10 %) of the total, or a process is on the GPU — the diagnosis' own test, with its
//!   thresholds (see [`RunReport::with_thresholds`]) — and a utilisation level is known.
//! - **Idle while allocated** is GPU-time: on each allocated tick, `(1 − level) × interval`.
//!   A GPU busy 38 % of an interval and idle the rest counts 62 % of that interval, however
//!   short its idle stretches; a whole idle tick counts (nearly) the whole interval.
//!   [`GpuReport::idle_allocated_ticks`] still counts the ticks at or below `idle_level` (5 %).
//! - **Findings**: each raise is one entry; its held time runs from the tick that raised it to
//!   the tick that cleared it, or — still active — to the last tick seen. Each interval after
//!   the raising tick, up to and including the clearing one, is charged to the finding.
//! - **Time lost** ([`FindingReport::lost_gpu_seconds`], summed per kind in
//!   [`Overview::causes`]) is what each charged interval cost, by kind of cause:
//!   - utilisation causes (`dataloader_starvation`, `pipeline_bubbles`, `idle_allocated`,
//!     `imbalance`, `pcie_bound`): the idle GPU-time, `(1 − level) × interval`;
//!   - `straggler`: its own idle GPU-time, plus its peers' wait for it — each other allocated
//!     GPU's idle time beyond the straggler's own (what all ranks idle for alike, the loader or
//!     the host, is not the straggler's); GPUs of another owner (attribution on) are not peers;
//!   - `memory_bound`: the idle SM time, `(1 − SM activity) × interval` (GPM's SM activity, else
//!     the level, as the rule reads it);
//!   - slowdowns (`thermal_throttling`, `power_throttling`, `external_slowdown`): busy time ×
//!     clock reduction, `level × (1 − SM clock / max SM clock) × interval` (nothing without the
//!     clocks);
//!   - `hardware_errors`: the whole interval while the GPU is lost (nothing while it runs);
//!   - `near_oom`: nothing — a risk, not a loss.
//!
//!   Causes can hold at once on one GPU (a straggler that is also hot), so the per-cause
//!   figures do not add up to the idle total. The **main cause** is the kind that lost the most
//!   GPU-time (when none lost any, the one held longest).
//! - **Driver sampling period**: the driver samples utilisation at its own period (NVML: 1/6 s
//!   to 1 s by product) and each tick's high-resolution window holds the samples taken since
//!   the last tick. The period is the GPU-time from each GPU's first window on, divided by the
//!   driver samples those windows held.
//! - **Limitations** are [`limitations`] of the settings given
//!   with [`RunReport::with_diagnosis`], with the device count seen, the measured period, and
//!   step marks when steps were seen (a replay's trace carries the recorded steps).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, UNIX_EPOCH};
//! use gpumon_core::report::RunReport;
//! use gpumon_core::{DeviceInfo, DeviceSample, Processor, ProcessorContext, Snapshot, SystemInfo};
//!
//! let (mut report, handle) = RunReport::new();
//! report.attach(&ProcessorContext::new(Duration::from_secs(1)));
//! let info = Arc::new(DeviceInfo::new(0, "GPU-0", "NVIDIA H100 80GB HBM3"));
//! let system = Arc::new(SystemInfo::new("node-1", "example"));
//! for (tick, util) in [0.2, 0.4, 0.6].into_iter().enumerate() {
//!     let mut gpu = DeviceSample::new(info.clone());
//!     gpu.utilization.gpu = Some(util);
//!     gpu.power.usage_watts = Some(300.0);
//!     let mut s = Snapshot::new(system.clone(), vec![gpu])
//!         .with_seq(tick as u64 + 1)
//!         .with_taken_at(UNIX_EPOCH + Duration::from_secs(tick as u64));
//!     report.process(&mut s);
//! }
//! let r = handle.report();
//! assert_eq!(r.gpus[0].samples, 3);
//! // No counter: 300 W over the 2 s the ticks cover (the first opens the run).
//! assert_eq!(r.gpus[0].energy_joules, Some(600.0));
//! println!("{r}"); // the human summary
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::model::{DeviceSample, Snapshot};
use crate::stages::diagnose::finding::{FindingEvent, FindingKind, Severity, Transition};
use crate::stages::diagnose::{limitations, DiagnoseConfig, Limitation, Sampling, Thresholds};
use crate::stages::{Processor, ProcessorContext};

/// Histogram bins per unit of utilisation: 0.1 % resolution.
const BINS_PER_UNIT: usize = 1000;

/// How many finding kinds there are: one bit each in [`GpuAcc::open`].
const KINDS: usize = FindingKind::ALL.len();
const _: () = assert!(KINDS <= 32, "GpuAcc::open is a u32");

/// Position of `kind` in [`FindingKind::ALL`].
fn slot(kind: FindingKind) -> usize {
    FindingKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

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
    /// GPU-time this cause cost while it held, seconds (see the [module docs](self) for what
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

/// The whole run's summary: what [`ReportHandle::report`] returns.
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

/// Nearest-rank percentile `p` (0–100) of `sorted` — (value, how many times), ascending by
/// value — over `total` values.
fn nearest_rank(sorted: &[(f64, u64)], total: u64, p: f64) -> Option<f64> {
    let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for &(value, n) in sorted {
        seen += n;
        if seen >= rank {
            return Some(value);
        }
    }
    sorted.last().map(|&(value, _)| value)
}

/// Per GPU UUID, the energy summed over the steps that had a reading, and how many had one.
type StepEnergy = HashMap<String, (f64, u64)>;

/// The energy per step of `energy` over the GPUs `keep` accepts.
fn energy_per_step(energy: &[&StepEnergy], keep: &dyn Fn(&str) -> bool) -> Option<f64> {
    let mut pooled: HashMap<&str, (f64, u64)> = HashMap::new();
    for e in energy {
        for (uuid, (sum, n)) in e.iter() {
            if keep(uuid) {
                let p = pooled.entry(uuid.as_str()).or_default();
                p.0 += sum;
                p.1 += n;
            }
        }
    }
    let per_gpu = pooled.values().filter(|(_, n)| *n > 0).map(|(sum, n)| sum / *n as f64);
    per_gpu.fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

/// One run's steps as accumulated.
#[derive(Debug)]
struct RunAcc {
    job: String,
    rank: Option<u32>,
    /// Step times, seconds, each with how many steps took it: the steps completed at one tick
    /// share one duration, reported or not (a loop marking faster than the tracker reports).
    durations: Vec<(f64, u64)>,
    first_step: Option<u64>,
    last_step: Option<u64>,
    energy: StepEnergy,
}

impl RunAcc {
    /// Takes one tick of the run: every step it completed counts (`completed`), each reported
    /// step with its own duration and the rest (a loop marking more than 64 steps a tick) at
    /// their mean; the reported ones give the energy of the GPUs `sampled` accepts (those of
    /// this snapshot: a replay of some of a trace's GPUs has the others' figures in its steps).
    /// A run from a trace written before `completed` existed counts the reported steps.
    fn add_tick(&mut self, run: &crate::steps::RunSteps, sampled: &dyn Fn(&str) -> bool) {
        match (run.completed, run.last_step) {
            (n, Some(last)) if n > 0 => {
                let before = self.durations.len();
                self.durations.extend(run.reported.iter().map(|r| (r.duration.as_secs_f64(), 1)));
                let reported = &self.durations[before..];
                let rest = n.saturating_sub(reported.len() as u64);
                if rest > 0 {
                    // Traces written before `completed_duration` carry the tick's mean in
                    // `last_duration`.
                    let mean = match run.completed_duration {
                        Some(total) => {
                            let took: f64 = reported.iter().map(|&(d, _)| d).sum();
                            Some((total.as_secs_f64() - took).max(0.0) / rest as f64)
                        }
                        None => run.last_duration.map(|d| d.as_secs_f64()),
                    };
                    if let Some(mean) = mean {
                        self.durations.push((mean, rest));
                    }
                }
                self.first_step.get_or_insert(last.saturating_sub(n - 1));
                self.last_step = Some(last);
            }
            _ => {
                for step in &run.reported {
                    self.durations.push((step.duration.as_secs_f64(), 1));
                    self.first_step.get_or_insert(step.step);
                    self.last_step = Some(step.step);
                }
            }
        }
        for step in &run.reported {
            self.add_energy(step, sampled);
        }
    }

    fn add_energy(&mut self, step: &crate::steps::StepReport, sampled: &dyn Fn(&str) -> bool) {
        for d in step.devices.iter().filter(|d| sampled(&d.uuid)) {
            if let Some(e) = d.energy_joules.filter(|e| e.is_finite()) {
                let slot = match self.energy.get_mut(d.uuid.as_str()) {
                    Some(slot) => slot,
                    None => self.energy.entry(d.uuid.clone()).or_default(),
                };
                slot.0 += e;
                slot.1 += 1;
            }
        }
    }
}

/// Median, p95 and mean of `durations`.
fn duration_stats(durations: &[(f64, u64)]) -> (Option<f64>, Option<f64>, Option<f64>) {
    let mut sorted = durations.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = sorted.iter().map(|&(_, n)| n).sum();
    if total == 0 {
        return (None, None, None);
    }
    let mean = sorted.iter().map(|&(d, n)| d * n as f64).sum::<f64>() / total as f64;
    (nearest_rank(&sorted, total, 50.0), nearest_rank(&sorted, total, 95.0), Some(mean))
}

/// How many steps `durations` holds.
fn step_count(durations: &[(f64, u64)]) -> u64 {
    durations.iter().map(|&(_, n)| n).sum()
}

fn steps_report(
    runs: &[RunAcc],
    rejected: Option<crate::steps::StepRejections>,
    keep: &dyn Fn(&str) -> bool,
) -> Option<StepsReport> {
    let all: Vec<(f64, u64)> = runs.iter().flat_map(|r| r.durations.iter().copied()).collect();
    let steps = step_count(&all);
    if steps == 0 && rejected.is_none_or(|r| r.total() == 0) {
        return None;
    }
    let (median, p95, mean) = duration_stats(&all);
    let energies: Vec<&StepEnergy> = runs.iter().map(|r| &r.energy).collect();
    Some(StepsReport {
        steps,
        duration_median_seconds: median,
        duration_p95_seconds: p95,
        duration_mean_seconds: mean,
        energy_per_step_joules: energy_per_step(&energies, keep),
        marks_rejected: rejected,
        runs: runs
            .iter()
            .filter(|r| !r.durations.is_empty())
            .map(|r| {
                let (median, p95, mean) = duration_stats(&r.durations);
                RunStepsReport {
                    job: r.job.clone(),
                    rank: r.rank,
                    steps: step_count(&r.durations),
                    first_step: r.first_step,
                    last_step: r.last_step,
                    duration_median_seconds: median,
                    duration_p95_seconds: p95,
                    duration_mean_seconds: mean,
                    energy_per_step_joules: energy_per_step(&[&r.energy], keep),
                }
            })
            .collect(),
    })
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
    /// Settings under which rules cannot work (see [`limitations`]);
    /// empty when none, or when the report was not told the settings
    /// ([`RunReport::with_diagnosis`]).
    pub limitations: Vec<Limitation>,
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

/// A fixed histogram of ratios in `0.0..=1.0`.
#[derive(Clone, Debug)]
struct Histogram {
    bins: Box<[u32]>,
    count: u64,
}

impl Histogram {
    fn new() -> Self {
        Self { bins: vec![0; BINS_PER_UNIT + 1].into_boxed_slice(), count: 0 }
    }

    fn add(&mut self, v: f64) {
        let bin = (v.clamp(0.0, 1.0) * BINS_PER_UNIT as f64).round() as usize;
        self.bins[bin.min(BINS_PER_UNIT)] = self.bins[bin.min(BINS_PER_UNIT)].saturating_add(1);
        self.count += 1;
    }

    /// Nearest-rank percentile `p` (0–100): the smallest value with at least `ceil(p/100 × n)`
    /// values at or below it.
    fn percentile(&self, p: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (bin, &n) in self.bins.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return Some(bin as f64 / BINS_PER_UNIT as f64);
            }
        }
        Some(1.0)
    }
}

/// A finding raised on this run, still open or closed.
#[derive(Clone, Debug)]
struct Held {
    report: FindingReport,
    open: bool,
}

/// Everything accumulated for one GPU.
#[derive(Debug)]
struct GpuAcc {
    index: u32,
    name: String,
    samples: u64,
    observed_seconds: f64,
    util: Histogram,
    util_sum: f64,
    memory_peak: Option<u64>,
    memory_total: Option<u64>,
    power_sum: f64,
    power_n: u64,
    power_integral: f64,
    last_counter: Option<f64>,
    counter_joules: f64,
    counter_deltas: u64,
    idle_ticks: u64,
    allocated_seconds: f64,
    idle_seconds: f64,
    /// Driver samples in the high-resolution windows, and the ticks since the first window.
    driver_samples: u64,
    driver_ticks: u64,
    /// Whether the GPU ever read a level, ever read GPM's SM activity, and held memory on a
    /// tick with no level (a MIG instance without GPM): for the limitations.
    level_seen: bool,
    sm_activity_seen: bool,
    held_without_level: bool,
    findings: Vec<Held>,
    /// Bit `k` set: a finding of kind `k` (in [`FindingKind::ALL`] order) is open, and
    /// `open_at[k]` is its position in `findings`.
    open: u32,
    open_at: [usize; KINDS],
}

impl GpuAcc {
    fn new(d: &DeviceSample) -> Self {
        Self {
            index: d.info.index,
            name: d.info.name.clone(),
            samples: 0,
            observed_seconds: 0.0,
            util: Histogram::new(),
            util_sum: 0.0,
            memory_peak: None,
            memory_total: None,
            power_sum: 0.0,
            power_n: 0,
            power_integral: 0.0,
            last_counter: None,
            counter_joules: 0.0,
            counter_deltas: 0,
            idle_ticks: 0,
            allocated_seconds: 0.0,
            idle_seconds: 0.0,
            driver_samples: 0,
            driver_ticks: 0,
            level_seen: false,
            sm_activity_seen: false,
            held_without_level: false,
            findings: Vec::new(),
            open: 0,
            open_at: [0; KINDS],
        }
    }

    /// Adds one tick of `d` covering `interval` seconds; `peers_wait`: what the other GPUs
    /// waited for this one, charged to an open `straggler` (see [`peers_wait`]).
    fn add(&mut self, d: &DeviceSample, interval: f64, idle_level: f64, allocated_ratio: f64, peers_wait: f64) {
        if !d.is_up() {
            // A lost GPU breaks the energy counter's chain: a reset may restart it.
            self.last_counter = None;
            self.charge(|kind| if kind == FindingKind::HardwareErrors { interval } else { 0.0 });
            return;
        }
        self.samples += 1;
        self.observed_seconds += interval;
        let level = crate::stages::diagnose::level_of(d);
        self.level_seen |= level.is_some();
        self.sm_activity_seen |= d.gpm.sm_activity.is_some();
        if let Some(l) = level {
            self.util.add(l);
            self.util_sum += l;
        }
        if let Some(w) = d.windows.gpu_utilization {
            self.driver_samples += u64::from(w.count);
        }
        if self.driver_samples > 0 {
            self.driver_ticks += 1;
        }
        let total = d.memory.total.or(d.info.memory_total_bytes);
        if total.is_some() {
            self.memory_total = total;
        }
        if let Some(used) = d.memory.used {
            self.memory_peak = Some(self.memory_peak.map_or(used, |p| p.max(used)));
        }
        if let Some(p) = d.power.usage_watts.or(d.windows.power_watts.map(|w| w.mean)) {
            self.power_sum += p;
            self.power_n += 1;
            self.power_integral += p * interval;
        }
        if let Some(e) = d.power.energy_joules {
            if let Some(before) = self.last_counter {
                // A counter that went backwards was reset (driver reload): skip that step.
                if e >= before {
                    self.counter_joules += e - before;
                    self.counter_deltas += 1;
                }
            }
            self.last_counter = Some(e);
        }
        let allocated = is_allocated(d, allocated_ratio);
        let busy = level.map(|l| l.clamp(0.0, 1.0));
        self.held_without_level |= allocated && busy.is_none();
        if let (true, Some(busy)) = (allocated, busy) {
            self.allocated_seconds += interval;
            self.idle_seconds += (1.0 - busy) * interval;
            if busy <= idle_level {
                self.idle_ticks += 1;
            }
        }
        if self.open != 0 {
            self.charge(|kind| lost(kind, d, busy, interval, peers_wait));
        }
    }

    /// Adds `cost(kind)` to each open finding's lost time.
    fn charge(&mut self, cost: impl Fn(FindingKind) -> f64) {
        let mut bits = self.open;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(h) = self.findings.get_mut(self.open_at[k]) {
                h.report.lost_gpu_seconds += cost(FindingKind::ALL[k]);
            }
        }
    }

    fn event(&mut self, event: &FindingEvent, at: SystemTime) {
        let k = slot(event.finding.kind);
        match event.transition {
            Transition::Raised => {
                if self.open & (1 << k) != 0 {
                    // Raised again without a clear in between: the earlier one ends here.
                    if let Some(h) = self.findings.get_mut(self.open_at[k]) {
                        close(h, at, None);
                    }
                }
                self.open |= 1 << k;
                self.open_at[k] = self.findings.len();
                self.findings.push(raised(event, at));
            }
            Transition::Cleared => {
                if self.open & (1 << k) != 0 {
                    self.open &= !(1 << k);
                    if let Some(h) = self.findings.get_mut(self.open_at[k]) {
                        close(h, at, event.held_for);
                    }
                }
            }
        }
    }

    fn report(&self, uuid: &str, last: Option<SystemTime>) -> GpuReport {
        let n = self.util.count;
        let (energy, source) = if self.counter_deltas > 0 {
            (Some(self.counter_joules), Some(EnergySource::Counter))
        } else if self.power_n > 0 {
            (Some(self.power_integral), Some(EnergySource::IntegratedPower))
        } else {
            (None, None)
        };
        GpuReport {
            index: self.index,
            uuid: uuid.to_owned(),
            name: self.name.clone(),
            samples: self.samples,
            observed_seconds: self.observed_seconds,
            utilization_mean: (n > 0).then(|| self.util_sum / n as f64),
            utilization_p5: self.util.percentile(5.0),
            utilization_p95: self.util.percentile(95.0),
            memory_peak_bytes: self.memory_peak,
            memory_total_bytes: self.memory_total,
            power_mean_watts: (self.power_n > 0).then(|| self.power_sum / self.power_n as f64),
            energy_joules: energy,
            energy_source: source,
            idle_allocated_ticks: self.idle_ticks,
            allocated_seconds: self.allocated_seconds,
            idle_allocated_seconds: self.idle_seconds,
            findings: self.findings.iter().map(|h| finish(h, last)).collect(),
        }
    }
}

/// Whether `d` is allocated: memory used at least `ratio` of the total, or a process on it
/// (the diagnosis' own test).
fn is_allocated(d: &DeviceSample, ratio: f64) -> bool {
    let total = d.memory.total.or(d.info.memory_total_bytes);
    !d.processes.is_empty()
        || matches!((d.memory.used, total), (Some(u), Some(t)) if t > 0 && u as f64 / t as f64 >= ratio)
}

/// The GPU-time `d` idled over `span` seconds while allocated; `None` when it is down, not
/// allocated or without a level.
fn idle_while_allocated(d: &DeviceSample, span: f64, ratio: f64) -> Option<f64> {
    if !d.is_up() || !is_allocated(d, ratio) {
        return None;
    }
    crate::stages::diagnose::level_of(d).map(|l| (1.0 - l.clamp(0.0, 1.0)) * span)
}

/// What the other GPUs waited this tick for the GPU at `at`: each other allocated GPU's idle
/// time beyond the GPU's own. In a synchronous step every rank idles for what they all share
/// (the loader, the host) and, beyond that, for the slowest rank: that part is the straggler's.
/// GPUs of another owner (attribution on, each GPU's processes of one owner) are not its peers.
/// `idle`: [`idle_while_allocated`] of each device, in the snapshot's order.
fn peers_wait(devices: &[DeviceSample], idle: &[Option<f64>], at: usize) -> f64 {
    let own = idle.get(at).copied().flatten().unwrap_or(0.0);
    let owner = devices.get(at).and_then(crate::stages::diagnose::sole_owner);
    let same_job = |d: &DeviceSample| match (owner, crate::stages::diagnose::sole_owner(d)) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    devices
        .iter()
        .zip(idle)
        .enumerate()
        .filter(|&(j, (d, _))| j != at && same_job(d))
        .filter_map(|(_, (_, peer))| *peer)
        .map(|peer| (peer - own).max(0.0))
        .sum()
}

/// The GPU-time one interval of an open finding of `kind` cost, on a GPU that is up with
/// utilisation level `busy`; `peers_wait`: what the other GPUs waited for it (see the module
/// docs).
fn lost(kind: FindingKind, d: &DeviceSample, busy: Option<f64>, interval: f64, peers_wait: f64) -> f64 {
    use FindingKind as K;
    match kind {
        K::DataloaderStarvation
        | K::PipelineBubbles
        | K::StarvationOrBubbles
        | K::IdleAllocated
        | K::Imbalance
        | K::PcieBound => busy.map_or(0.0, |b| (1.0 - b) * interval),
        K::Straggler => busy.map_or(0.0, |b| (1.0 - b) * interval) + peers_wait,
        K::MemoryBound => d.gpm.sm_activity.or(busy).map_or(0.0, |sm| (1.0 - sm.clamp(0.0, 1.0)) * interval),
        K::ThermalThrottling | K::PowerThrottling | K::ExternalSlowdown => {
            match (busy, d.clocks.sm, d.info.max_clocks.sm) {
                (Some(b), Some(clock), Some(max)) if max > 0.0 => b * (1.0 - clock / max).clamp(0.0, 1.0) * interval,
                _ => 0.0,
            }
        }
        K::NearOom | K::HardwareErrors => 0.0,
    }
}

/// A new entry for a raised finding.
fn raised(event: &FindingEvent, at: SystemTime) -> Held {
    let f = &event.finding;
    Held {
        report: FindingReport {
            kind: f.kind,
            severity: f.severity,
            raised_at: at,
            held_seconds: 0.0,
            active_at_exit: false,
            lost_gpu_seconds: 0.0,
            evidence: f.evidence.clone(),
            advice: f.advice.clone(),
        },
        open: true,
    }
}

/// Closes `h` at `at` (or after `held_for`, as the diagnosis measured it).
fn close(h: &mut Held, at: SystemTime, held_for: Option<Duration>) {
    h.open = false;
    h.report.held_seconds =
        held_for.or_else(|| at.duration_since(h.report.raised_at).ok()).map_or(0.0, |d| d.as_secs_f64());
}

/// A finding's entry as of `last`: open ones are held until the last tick.
fn finish(h: &Held, last: Option<SystemTime>) -> FindingReport {
    let mut r = h.report.clone();
    if h.open {
        r.active_at_exit = true;
        r.held_seconds = last.and_then(|l| l.duration_since(r.raised_at).ok()).map_or(0.0, |d| d.as_secs_f64());
    }
    r
}

#[derive(Debug)]
struct State {
    interval: Duration,
    idle_level: f64,
    allocated_ratio: f64,
    /// The settings to list the limitations of ([`RunReport::with_diagnosis`]).
    diagnosis: Option<(DiagnoseConfig, Sampling)>,
    hostname: String,
    backend: String,
    ticks: u64,
    first: Option<SystemTime>,
    last: Option<SystemTime>,
    gpus: HashMap<String, GpuAcc>,
    host_findings: Vec<Held>,
    runs: Vec<RunAcc>,
    /// The steps socket's dropped marks as of the latest tick (counted since the agent began).
    rejected: Option<crate::steps::StepRejections>,
}

impl State {
    fn report(&self, keep: &dyn Fn(&str) -> bool) -> Report {
        let interval = self.interval.as_secs_f64();
        let mut gpus: Vec<GpuReport> =
            self.gpus.iter().filter(|(u, _)| keep(u)).map(|(u, g)| g.report(u, self.last)).collect();
        gpus.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
        let wall = match (self.first, self.last) {
            (Some(a), Some(b)) => b.duration_since(a).map_or(0.0, |d| d.as_secs_f64()),
            _ => 0.0,
        };
        let overview = self.overview(&gpus, interval, keep);
        Report {
            format: REPORT_FORMAT,
            hostname: self.hostname.clone(),
            backend: self.backend.clone(),
            ticks: self.ticks,
            interval_seconds: interval,
            wall_seconds: wall,
            overview,
            gpus,
            host_findings: self.host_findings.iter().map(|h| finish(h, self.last)).collect(),
            steps: steps_report(&self.runs, self.rejected, keep),
        }
    }

    fn overview(&self, gpus: &[GpuReport], interval: f64, keep: &dyn Fn(&str) -> bool) -> Overview {
        let mut causes: Vec<CauseReport> = Vec::new();
        for g in gpus {
            for (i, f) in g.findings.iter().enumerate() {
                let first_on_gpu = !g.findings[..i].iter().any(|e| e.kind == f.kind);
                let c = match causes.iter_mut().find(|c| c.kind == f.kind) {
                    Some(c) => c,
                    None => {
                        causes.push(CauseReport {
                            kind: f.kind,
                            gpus: 0,
                            raised: 0,
                            active_gpu_seconds: 0.0,
                            lost_gpu_seconds: 0.0,
                        });
                        causes.last_mut().expect("just pushed")
                    }
                };
                c.gpus += usize::from(first_on_gpu);
                c.raised += 1;
                c.active_gpu_seconds += f.held_seconds;
                c.lost_gpu_seconds += f.lost_gpu_seconds;
            }
        }
        causes.sort_by(|a, b| {
            b.lost_gpu_seconds
                .total_cmp(&a.lost_gpu_seconds)
                .then(b.active_gpu_seconds.total_cmp(&a.active_gpu_seconds))
                .then(a.kind.cmp(&b.kind))
        });
        let (samples, ticks) = self
            .gpus
            .iter()
            .filter(|(u, _)| keep(u))
            .fold((0u64, 0u64), |(s, t), (_, g)| (s + g.driver_samples, t + g.driver_ticks));
        let period = (samples > 0).then(|| ticks as f64 * interval / samples as f64);
        let kept = || self.gpus.iter().filter(|(u, _)| keep(u)).map(|(_, g)| g);
        let without_level = kept().filter(|g| g.held_without_level && !g.level_seen).count();
        let without_sm_activity = kept().filter(|g| g.level_seen && !g.sm_activity_seen).count();
        let limitations = match &self.diagnosis {
            Some((config, sampling)) => {
                let mut sampling = sampling.without_level(without_level).without_sm_activity(without_sm_activity);
                // Steps seen are steps marked, whatever the settings said: a replay runs no
                // tracker, and its trace carries the recorded steps.
                if !self.runs.is_empty() {
                    sampling = sampling.step_marks(true);
                }
                if !gpus.is_empty() {
                    sampling = sampling.devices(gpus.len());
                }
                if let Some(p) = period.filter(|p| p.is_finite()) {
                    sampling = sampling.driver_period(Duration::from_secs_f64(p));
                }
                limitations(config, &sampling)
            }
            None => Vec::new(),
        };
        Overview {
            gpus: gpus.len(),
            // Folded from +0.0: a float sum of nothing is −0.0, printed "-0.0" for a run without GPUs.
            gpu_seconds: gpus.iter().fold(0.0, |sum, g| sum + g.observed_seconds),
            allocated_seconds: gpus.iter().fold(0.0, |sum, g| sum + g.allocated_seconds),
            idle_allocated_seconds: gpus.iter().fold(0.0, |sum, g| sum + g.idle_allocated_seconds),
            main_cause: causes.first().cloned(),
            causes,
            driver_sample_period_seconds: period,
            limitations,
        }
    }
}

/// Reads the summary of a [`RunReport`] at any time, from any thread. Cloneable.
#[derive(Clone, Debug)]
pub struct ReportHandle {
    state: Arc<Mutex<State>>,
}

impl ReportHandle {
    /// The summary so far: every GPU seen, and every finding with its held time (findings
    /// still active count until the last tick).
    pub fn report(&self) -> Report {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).report(&|_| true)
    }

    /// The summary so far over the GPUs `keep` accepts (by UUID) only — the GPUs of one job,
    /// say: the overview, the driver period and the steps' energy count those GPUs; the
    /// findings about the host and the step times are the run's.
    pub fn report_of(&self, keep: impl Fn(&str) -> bool) -> Report {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).report(&keep)
    }
}

/// The run-report processor. Add it after the diagnosis stage.
#[derive(Debug)]
pub struct RunReport {
    state: Arc<Mutex<State>>,
}

impl RunReport {
    /// A report processor and the handle that reads it. Idle-while-allocated uses the default
    /// diagnosis thresholds (5 % utilisation, 10 % of memory); until [`Processor::attach`] tells
    /// it the interval it assumes 1 s ticks.
    pub fn new() -> (Self, ReportHandle) {
        let defaults = Thresholds::default();
        let state = Arc::new(Mutex::new(State {
            interval: Duration::from_secs(1),
            idle_level: defaults.idle_level,
            allocated_ratio: defaults.allocated_memory_ratio,
            diagnosis: None,
            hostname: String::new(),
            backend: String::new(),
            ticks: 0,
            first: None,
            last: None,
            gpus: HashMap::new(),
            host_findings: Vec::new(),
            runs: Vec::new(),
            rejected: None,
        }));
        (Self { state: state.clone() }, ReportHandle { state })
    }

    /// Uses `thresholds.idle_level` and `thresholds.allocated_memory_ratio` to decide what
    /// counts as idle while allocated, so the report agrees with a tuned diagnosis stage.
    #[must_use]
    pub fn with_thresholds(self, thresholds: &Thresholds) -> Self {
        {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.idle_level = thresholds.idle_level;
            s.allocated_ratio = thresholds.allocated_memory_ratio;
        }
        self
    }

    /// Uses `config`'s thresholds (as [`RunReport::with_thresholds`]) and lists in the overview
    /// the [`limitations`] of diagnosing with `config` under
    /// `sampling` — with the number of GPUs seen and the measured driver sampling period when
    /// the report is read.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gpumon_core::diagnose::{DiagnoseConfig, Sampling};
    /// use gpumon_core::report::RunReport;
    /// use gpumon_core::{FindingKind, MetricSet};
    ///
    /// let config = DiagnoseConfig::default();
    /// let sampling = Sampling::new(Duration::from_secs(1), MetricSet::default());
    /// let (report, handle) = RunReport::new();
    /// let _report = report.with_diagnosis(&config, sampling);
    /// // PCIe throughput is opt-in: pcie_bound cannot work, and the report says so.
    /// let limits = handle.report().overview.limitations;
    /// assert!(limits.iter().any(|l| l.rules == [FindingKind::PcieBound]));
    /// ```
    #[must_use]
    pub fn with_diagnosis(self, config: &DiagnoseConfig, sampling: Sampling) -> Self {
        let this = self.with_thresholds(&config.thresholds);
        this.state.lock().unwrap_or_else(PoisonError::into_inner).diagnosis = Some((config.clone(), sampling));
        this
    }
}

impl Processor for RunReport {
    fn name(&self) -> &str {
        "report"
    }

    fn attach(&mut self, context: &ProcessorContext) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).interval = context.interval;
    }

    fn process(&mut self, snapshot: &mut Snapshot) {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &mut *guard;
        s.ticks += 1;
        // What this tick covers: the time since the previous tick, at most an interval (less
        // when it came sooner: the sample taken at exit, a flush). The first tick opens the run
        // and covers nothing: its readings describe the driver's window before the run began.
        // So GPU-time is wall time × GPUs (gaps longer than an interval aside): a run of 1.3 s
        // at a 5 s interval is 1.3 GPU-s per GPU, not one or two whole intervals.
        let interval = s.interval.as_secs_f64();
        let span = match s.last.map(|prev| snapshot.taken_at.duration_since(prev)) {
            Some(Ok(since)) => since.as_secs_f64().min(interval),
            // A clock that stepped back: one interval, as a tick on schedule would cover.
            Some(Err(_)) => interval,
            None => 0.0,
        };
        s.first.get_or_insert(snapshot.taken_at);
        s.last = Some(snapshot.taken_at);
        if s.hostname != snapshot.system.hostname {
            s.hostname.clone_from(&snapshot.system.hostname);
        }
        if s.backend != snapshot.system.backend {
            s.backend.clone_from(&snapshot.system.backend);
        }
        // A straggler is charged its peers' wait, read from every GPU's idle time this tick:
        // worked out only while one is open.
        let straggler = 1 << slot(FindingKind::Straggler);
        let idle: Vec<Option<f64>> = if s.gpus.values().any(|g| g.open & straggler != 0) {
            snapshot.devices.iter().map(|d| idle_while_allocated(d, span, s.allocated_ratio)).collect()
        } else {
            Vec::new()
        };
        for (at, d) in snapshot.devices.iter().enumerate() {
            let acc = match s.gpus.get_mut(d.info.uuid.as_str()) {
                Some(acc) => acc,
                None => s.gpus.entry(d.info.uuid.clone()).or_insert_with(|| GpuAcc::new(d)),
            };
            let wait = if acc.open & straggler != 0 { peers_wait(&snapshot.devices, &idle, at) } else { 0.0 };
            acc.add(d, span, s.idle_level, s.allocated_ratio, wait);
        }
        if let Some(steps) = snapshot.output::<crate::steps::Steps>() {
            if steps.rejected.is_some() {
                s.rejected = steps.rejected;
            }
            for run in steps.runs.iter().filter(|r| r.completed > 0 || !r.reported.is_empty()) {
                let at = match s.runs.iter().position(|a| a.job == run.job && a.rank == run.rank) {
                    Some(at) => at,
                    None => {
                        s.runs.push(RunAcc {
                            job: run.job.clone(),
                            rank: run.rank,
                            durations: Vec::new(),
                            first_step: None,
                            last_step: None,
                            energy: HashMap::new(),
                        });
                        s.runs.len() - 1
                    }
                };
                s.runs[at].add_tick(run, &|uuid| snapshot.position(uuid).is_some());
            }
        }
        let Some(diagnosis) = snapshot.output::<crate::Diagnosis>() else { return };
        let at = snapshot.taken_at;
        for event in &diagnosis.events {
            match event.finding.uuid.as_deref() {
                Some(u) => {
                    if let Some(g) = s.gpus.get_mut(u) {
                        g.event(event, at);
                    }
                }
                None => match event.transition {
                    Transition::Raised => s.host_findings.push(raised(event, at)),
                    Transition::Cleared => {
                        let kind = event.finding.kind;
                        if let Some(h) = s.host_findings.iter_mut().rev().find(|h| h.open && h.report.kind == kind) {
                            close(h, at, event.held_for);
                        }
                    }
                },
            }
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / 1_073_741_824.0
}

/// `1.234 GPU-h (4442.4 GPU-s)`.
fn gpu_time(seconds: f64) -> String {
    format!("{:.3} GPU-h ({seconds:.1} GPU-s)", seconds / 3600.0)
}

fn percent_of(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole * 100.0
    } else {
        0.0
    }
}

fn write_overview(f: &mut fmt::Formatter<'_>, r: &Report) -> fmt::Result {
    let o = &r.overview;
    writeln!(f, "overview")?;
    writeln!(
        f,
        "  GPUs                  {}, wall time {:.1} s, {} observed",
        o.gpus,
        r.wall_seconds,
        gpu_time(o.gpu_seconds)
    )?;
    writeln!(
        f,
        "  idle while allocated  {} of {:.1} GPU-s allocated ({:.1} %)",
        gpu_time(o.idle_allocated_seconds),
        o.allocated_seconds,
        percent_of(o.idle_allocated_seconds, o.allocated_seconds)
    )?;
    match &o.main_cause {
        Some(c) => writeln!(
            f,
            "  main cause            {} on {} GPU(s): {} lost",
            c.kind,
            c.gpus,
            gpu_time(c.lost_gpu_seconds)
        )?,
        None => writeln!(f, "  main cause            none: no finding was raised on any GPU")?,
    }
    if !o.causes.is_empty() {
        writeln!(f, "  time lost per cause   (GPU-time; causes can hold at once, so they overlap)")?;
        for c in &o.causes {
            writeln!(
                f,
                "    {:<22} {:>8.1} GPU-s lost, held {:.1} GPU-s on {} GPU(s), raised {} time(s)",
                c.kind.name(),
                c.lost_gpu_seconds,
                c.active_gpu_seconds,
                c.gpus,
                c.raised
            )?;
        }
    }
    match o.driver_sample_period_seconds {
        Some(p) => writeln!(
            f,
            "  driver sampling       utilisation every {p:.3} s ({:.1} sample(s) per interval)",
            r.interval_seconds / p
        )?,
        None => writeln!(f, "  driver sampling       unknown (no high-resolution utilisation samples)")?,
    }
    if o.limitations.is_empty() {
        writeln!(f, "  limitations           none")?;
    } else {
        writeln!(f, "  limitations:")?;
        for l in &o.limitations {
            writeln!(f, "    [{}] {l}", l.severity)?;
        }
    }
    Ok(())
}

/// `median 1.203 s, p95 1.290 s, mean 1.210 s`.
fn write_step_times(
    f: &mut fmt::Formatter<'_>,
    median: Option<f64>,
    p95: Option<f64>,
    mean: Option<f64>,
    energy: Option<f64>,
) -> fmt::Result {
    if let (Some(median), Some(p95), Some(mean)) = (median, p95, mean) {
        write!(f, "step time median {median:.3} s, p95 {p95:.3} s, mean {mean:.3} s")?;
    }
    if let Some(e) = energy {
        write!(f, "; {e:.1} J per step")?;
    }
    writeln!(f)
}

fn write_steps(f: &mut fmt::Formatter<'_>, s: &StepsReport) -> fmt::Result {
    write!(f, "steps                   {} step(s)", s.steps)?;
    if s.steps > 0 {
        f.write_str(", ")?;
    }
    write_step_times(
        f,
        s.duration_median_seconds,
        s.duration_p95_seconds,
        s.duration_mean_seconds,
        s.energy_per_step_joules,
    )?;
    for r in &s.runs {
        let mut name = String::new();
        crate::stages::text::push_one_line(&mut name, &r.job);
        if let Some(rank) = r.rank {
            name.push_str(&format!(" rank {rank}"));
        }
        write!(f, "  {name:<21} {} step(s)", r.steps)?;
        if let (Some(a), Some(b)) = (r.first_step, r.last_step) {
            write!(f, " ({a}–{b})")?;
        }
        f.write_str(", ")?;
        write_step_times(f, r.duration_median_seconds, r.duration_p95_seconds, r.duration_mean_seconds, None)?;
    }
    if let Some(rejected) = s.marks_rejected.filter(|r| r.total() > 0) {
        write_marks_rejected(f, &rejected)?;
    }
    Ok(())
}

/// `  marks dropped         10 refused, 1 malformed` and what a refused mark usually is.
fn write_marks_rejected(f: &mut fmt::Formatter<'_>, rejected: &crate::steps::StepRejections) -> fmt::Result {
    use crate::steps::Rejection;
    let mut parts = Vec::new();
    for reason in Rejection::ALL {
        let n = rejected.get(reason);
        if n > 0 {
            parts.push(format!("{n} {}", reason.name()));
        }
    }
    writeln!(f, "  marks dropped         {} (not in the step figures)", parts.join(", "))?;
    if rejected.refused > 0 {
        writeln!(
            f,
            "    refused: a step number not above the run's last (numbering restarted, e.g. each epoch: mark a step count that only grows, or a new job name per epoch), a bad job name, or too many runs"
        )?;
    }
    Ok(())
}

fn write_finding(f: &mut fmt::Formatter<'_>, r: &FindingReport) -> fmt::Result {
    write!(f, "    {} ({}) held {:.1} s, {:.1} GPU-s lost", r.kind, r.severity, r.held_seconds, r.lost_gpu_seconds)?;
    if r.active_at_exit {
        f.write_str(", still active at exit")?;
    }
    writeln!(f)?;
    if !r.evidence.is_empty() {
        writeln!(f, "      evidence: {}", r.evidence)?;
    }
    writeln!(f, "      advice: {}", r.advice)
}

/// What a report's or comparison's header says of data that was not read from a GPU just now:
/// simulated (the mock) or played back from a recorded trace.
pub(crate) fn backend_note(backend: &str) -> &'static str {
    match backend {
        "mock" => " (MOCK backend: simulated GPUs)",
        crate::REPLAY_BACKEND => " (REPLAY of a recorded trace, not live GPUs)",
        _ => "",
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let simulated = backend_note(&self.backend);
        writeln!(
            f,
            "gpumon run report: host {}{simulated}, {} tick(s) over {:.1} s, interval {} s",
            self.hostname, self.ticks, self.wall_seconds, self.interval_seconds
        )?;
        if self.ticks == 0 {
            // Nothing reached the report: every sample failed (no NVML, with a sink that must
            // not get simulated data), or the run ended before the first. Zeros would read as
            // a run that idled no GPU; say what happened instead.
            return writeln!(
                f,
                "  no sample was taken during the run: the GPU backend was unavailable throughout, or the run \
                 ended before the first sample (the log says which); nothing is reported, steps included"
            );
        }
        write_overview(f, self)?;
        if let Some(steps) = &self.steps {
            write_steps(f, steps)?;
        }
        for g in &self.gpus {
            writeln!(f, "GPU {} {} ({}), {} sample(s)", g.index, g.name, g.uuid, g.samples)?;
            match (g.utilization_mean, g.utilization_p5, g.utilization_p95) {
                (Some(m), Some(p5), Some(p95)) => writeln!(
                    f,
                    "  utilisation   mean {:.1} %, p5 {:.1} %, p95 {:.1} %",
                    m * 100.0,
                    p5 * 100.0,
                    p95 * 100.0
                )?,
                _ => writeln!(f, "  utilisation   not reported")?,
            }
            match (g.memory_peak_bytes, g.memory_total_bytes) {
                (Some(p), Some(t)) => writeln!(f, "  memory        peak {:.1} GiB of {:.1} GiB", gib(p), gib(t))?,
                (Some(p), None) => writeln!(f, "  memory        peak {:.1} GiB", gib(p))?,
                _ => writeln!(f, "  memory        not reported")?,
            }
            match g.power_mean_watts {
                Some(p) => write!(f, "  power         mean {p:.0} W")?,
                None => write!(f, "  power         not reported")?,
            }
            if let (Some(e), Some(src)) = (g.energy_joules, g.energy_source) {
                let how = match src {
                    EnergySource::Counter => "energy counter",
                    EnergySource::IntegratedPower => "power × interval",
                };
                write!(f, "; energy {:.1} kJ ({:.3} kWh, from {how})", e / 1e3, e / 3.6e6)?;
            }
            writeln!(f)?;
            writeln!(
                f,
                "  idle while allocated  {:.1} s of {:.1} s allocated ({:.1} %; {} whole idle tick(s))",
                g.idle_allocated_seconds,
                g.allocated_seconds,
                percent_of(g.idle_allocated_seconds, g.allocated_seconds),
                g.idle_allocated_ticks
            )?;
            if g.findings.is_empty() {
                writeln!(f, "  findings      none")?;
            } else {
                writeln!(f, "  findings:")?;
                for r in &g.findings {
                    write_finding(f, r)?;
                }
            }
        }
        if !self.host_findings.is_empty() {
            writeln!(f, "host findings:")?;
            for r in &self.host_findings {
                write_finding(f, r)?;
            }
        }
        Ok(())
    }
}

pub mod compare;

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::model::{DeviceInfo, DeviceState, SystemInfo};
    use crate::stages::diagnose::finding::{Diagnosis, Finding, FindingEvent};
    use crate::stages::diagnose::{DiagnoseConfig, Diagnoser};

    const GIB: u64 = 1 << 30;

    fn info(index: u32) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo::new(index, format!("GPU-{index}"), "NVIDIA H100 80GB HBM3"))
    }

    fn snapshot(tick: u64, interval: Duration, devices: Vec<DeviceSample>) -> Snapshot {
        Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), devices)
            .with_seq(tick + 1)
            .with_taken_at(UNIX_EPOCH + interval * tick as u32)
    }

    fn attached(interval: Duration) -> (RunReport, ReportHandle) {
        let (mut r, h) = RunReport::new();
        r.attach(&ProcessorContext::new(interval));
        (r, h)
    }

    #[test]
    fn utilisation_mean_and_percentiles_match_a_sort_of_the_inputs() {
        let interval = Duration::from_millis(500);
        let (mut report, handle) = attached(interval);
        let gpu = info(0);
        // 200 values on the 0.1 % grid, in a scrambled order, some repeated.
        let values: Vec<f64> = (0..200u64).map(|i| ((i * 37 + 11) % 1001) as f64 / 1000.0).collect();
        for (tick, &u) in values.iter().enumerate() {
            let mut d = DeviceSample::new(gpu.clone());
            d.utilization.gpu = Some(u);
            report.process(&mut snapshot(tick as u64, interval, vec![d]));
        }
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let nearest_rank = |p: f64| sorted[((p / 100.0 * sorted.len() as f64).ceil() as usize).max(1) - 1];
        let mean = values.iter().sum::<f64>() / values.len() as f64;

        let r = handle.report();
        assert_eq!(r.ticks, 200);
        assert_eq!(r.gpus.len(), 1);
        let g = &r.gpus[0];
        assert_eq!(g.samples, 200);
        assert!((g.utilization_mean.unwrap() - mean).abs() < 1e-12, "{:?} vs {mean}", g.utilization_mean);
        assert_eq!(g.utilization_p5, Some(nearest_rank(5.0)));
        assert_eq!(g.utilization_p95, Some(nearest_rank(95.0)));
        assert!(g.utilization_p5 < g.utilization_p95);
        assert_eq!(r.wall_seconds, 199.0 * 0.5);
    }

    #[test]
    fn the_high_resolution_mean_wins_over_the_instantaneous_value() {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let mut d = DeviceSample::new(info(0));
        d.utilization.gpu = Some(0.9);
        d.windows.gpu_utilization = Some(crate::model::WindowStats { min: 0.0, max: 0.9, mean: 0.3, count: 6 });
        report.process(&mut snapshot(0, interval, vec![d]));
        assert_eq!(handle.report().gpus[0].utilization_mean, Some(0.3));
    }

    #[test]
    fn energy_sums_counter_increases_and_skips_a_reset() {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let counter = [5_000.0, 5_300.0, 5_750.0, 120.0, 420.0, 420.0];
        for (tick, &e) in counter.iter().enumerate() {
            let mut d = DeviceSample::new(info(0));
            d.power.energy_joules = Some(e);
            d.power.usage_watts = Some(310.0);
            report.process(&mut snapshot(tick as u64, interval, vec![d]));
        }
        let expected: f64 = counter.windows(2).filter(|w| w[1] >= w[0]).map(|w| w[1] - w[0]).sum();
        let g = &handle.report().gpus[0];
        assert_eq!(g.energy_joules, Some(expected));
        assert_eq!(g.energy_source, Some(EnergySource::Counter));
        assert_eq!(g.power_mean_watts, Some(310.0));
    }

    #[test]
    fn energy_without_a_counter_integrates_power_over_the_interval() {
        let interval = Duration::from_millis(250);
        let (mut report, handle) = attached(interval);
        let power = [100.0, 250.0, 400.0, 175.5];
        for (tick, &p) in power.iter().enumerate() {
            let mut d = DeviceSample::new(info(0));
            d.power.usage_watts = Some(p);
            report.process(&mut snapshot(tick as u64, interval, vec![d]));
        }
        let g = &handle.report().gpus[0];
        // The first tick opens the run: each later one covers the 0.25 s since the one before.
        let expected: f64 = power[1..].iter().map(|p| p * 0.25).sum();
        assert_eq!(g.energy_joules, Some(expected));
        assert_eq!(g.energy_source, Some(EnergySource::IntegratedPower));
        assert_eq!(g.power_mean_watts, Some(power.iter().sum::<f64>() / 4.0));
    }

    #[test]
    fn idle_while_allocated_counts_idle_ticks_with_memory_held_and_the_peak() {
        let interval = Duration::from_millis(100);
        let (mut report, handle) = attached(interval);
        let total = 80 * GIB;
        // (utilisation, memory used): idle+allocated, busy+allocated, idle+empty, boundaries.
        let ticks =
            [(0.0, 40 * GIB), (0.9, 79 * GIB), (0.01, GIB), (0.05, 8 * GIB), (0.051, 60 * GIB), (0.03, 9 * GIB)];
        for (tick, &(u, used)) in ticks.iter().enumerate() {
            let mut d = DeviceSample::new(info(3));
            d.utilization.gpu = Some(u);
            d.memory.used = Some(used);
            d.memory.total = Some(total);
            report.process(&mut snapshot(tick as u64, interval, vec![d]));
        }
        let is_allocated = |used: u64| used as f64 / total as f64 >= 0.10;
        let idle = ticks.iter().filter(|&&(u, used)| is_allocated(used) && u <= 0.05).count() as u64;
        // Time: the first tick opens the run and covers none; each later one covers 0.1 s.
        let allocated: Vec<f64> = ticks[1..].iter().filter(|(_, used)| is_allocated(*used)).map(|t| t.0).collect();
        let g = &handle.report().gpus[0];
        assert_eq!(g.index, 3);
        assert_eq!(g.idle_allocated_ticks, idle);
        assert!((g.allocated_seconds - allocated.len() as f64 * 0.1).abs() < 1e-12, "{}", g.allocated_seconds);
        let idle_seconds: f64 = allocated.iter().map(|u| (1.0 - u) * 0.1).sum();
        assert!(
            (g.idle_allocated_seconds - idle_seconds).abs() < 1e-12,
            "{} vs {idle_seconds}",
            g.idle_allocated_seconds
        );
        assert_eq!(g.memory_peak_bytes, ticks.iter().map(|t| t.1).max());
        assert_eq!(g.memory_total_bytes, Some(total));
    }

    /// A run of `gpumon-agent run -- sleep 1` at a 5 s interval: the first tick opens it, the
    /// sample taken at exit 1.3 s later covers those 1.3 s — not 10 GPU-s of two intervals, nor
    /// 6.3 of one and a bit.
    #[test]
    fn a_tick_sooner_than_the_interval_covers_only_the_time_since_the_previous_one() {
        let interval = Duration::from_secs(5);
        let (mut report, handle) = attached(interval);
        let gpu = info(0);
        let first = snapshot(0, interval, vec![allocated(&gpu, 0.0, 0)]);
        let exit = first.clone().with_seq(2).with_taken_at(first.taken_at + Duration::from_millis(1300));
        let mut at_exit = exit.clone();
        at_exit.devices = vec![allocated(&gpu, 0.0, 0)];
        report.process(&mut first.clone());
        report.process(&mut at_exit);
        let r = handle.report();
        let g = &r.gpus[0];
        assert_eq!(g.samples, 2);
        assert!((g.observed_seconds - 1.3).abs() < 1e-9, "{}", g.observed_seconds);
        assert!((g.observed_seconds - r.wall_seconds).abs() < 1e-9, "one GPU: GPU-time is wall time");
        assert!((g.allocated_seconds - 1.3).abs() < 1e-9, "{}", g.allocated_seconds);
        assert!((g.idle_allocated_seconds - 1.3).abs() < 1e-9, "idle both ticks: {}", g.idle_allocated_seconds);
        assert!((r.overview.gpu_seconds - 1.3).abs() < 1e-9, "{}", r.overview.gpu_seconds);
        // A tick on the grid covers its interval; a second snapshot at the same instant, none.
        let mut same = at_exit.clone().with_seq(3);
        same.devices = vec![allocated(&gpu, 0.0, 0)];
        report.process(&mut same);
        assert!((handle.report().gpus[0].observed_seconds - 1.3).abs() < 1e-9);
    }

    /// A sample allocated (40 of 80 GiB) whose high-resolution window reads `mean`, with `count`
    /// driver samples (none: no window).
    fn allocated(info: &Arc<DeviceInfo>, mean: f64, count: u32) -> DeviceSample {
        let mut d = DeviceSample::new(info.clone());
        d.utilization.gpu = Some(mean);
        d.memory.used = Some(40 * GIB);
        d.memory.total = Some(80 * GIB);
        if count > 0 {
            d.windows.gpu_utilization = Some(crate::model::WindowStats { min: 0.0, max: 1.0, mean, count });
        }
        d
    }

    #[test]
    fn idle_within_intervals_counts_not_only_whole_idle_ticks() {
        // The issue's case: a GPU busy 38 % of every interval in short stretches never has a
        // whole idle tick, yet is idle 62 % of the time.
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let (a, b) = (info(0), info(1));
        // 51 ticks: the first opens the run, the 50 after it cover 50 s.
        for tick in 0..=50u64 {
            let busy_twin = allocated(&b, 0.9, 6);
            report.process(&mut snapshot(tick, interval, vec![allocated(&a, 0.38, 6), busy_twin]));
        }
        let r = handle.report();
        let g = &r.gpus[0];
        assert_eq!(g.idle_allocated_ticks, 0);
        assert!((g.idle_allocated_seconds - 31.0).abs() < 1e-9, "{}", g.idle_allocated_seconds);
        assert_eq!(g.allocated_seconds, 50.0);
        let o = &r.overview;
        assert_eq!(o.gpus, 2);
        assert_eq!(o.gpu_seconds, 100.0);
        assert_eq!(o.allocated_seconds, 100.0);
        assert!((o.idle_allocated_seconds - 36.0).abs() < 1e-9, "31 + 50 × 0.1: {}", o.idle_allocated_seconds);
        let text = r.to_string();
        assert!(
            text.contains("idle while allocated  31.0 s of 50.0 s allocated (62.0 %; 0 whole idle tick(s))"),
            "{text}"
        );
        assert!(
            text.contains("idle while allocated  0.010 GPU-h (36.0 GPU-s) of 100.0 GPU-s allocated (36.0 %)"),
            "{text}"
        );
    }

    #[test]
    fn time_lost_is_counted_per_cause_and_the_costliest_is_the_main_one() {
        let interval = Duration::from_millis(500);
        let (mut report, handle) = attached(interval);
        let starved = info(0);
        let mut hot = DeviceInfo::new(1, "GPU-1", "NVIDIA H100 80GB HBM3");
        hot.max_clocks.sm = Some(2000e6);
        let hot = Arc::new(hot);
        let membound = info(2);
        let lost = info(3);
        let last = 12u64;
        for tick in 0..=last {
            let mut s0 = allocated(&starved, 0.4, 3);
            s0.gpm.sm_activity = Some(0.9); // read by memory_bound only
            let mut s1 = allocated(&hot, 1.0, 3);
            s1.clocks.sm = Some(1500e6);
            let mut s2 = allocated(&membound, 0.95, 3);
            s2.gpm.sm_activity = Some(0.3);
            let mut s3 = allocated(&lost, 0.8, 3);
            if (8..=9).contains(&tick) {
                s3.state = DeviceState::Lost;
            }
            let mut s = snapshot(tick, interval, vec![s0, s1, s2, s3]);
            let mut events = Vec::new();
            let raise = |kind, uuid| event(Transition::Raised, kind, Some(uuid), None);
            match tick {
                1 => {
                    events.push(raise(FindingKind::ThermalThrottling, "GPU-1"));
                    events.push(raise(FindingKind::NearOom, "GPU-1"));
                    events.push(raise(FindingKind::MemoryBound, "GPU-2"));
                }
                2 => events.push(raise(FindingKind::DataloaderStarvation, "GPU-0")),
                6 => events.push(event(Transition::Cleared, FindingKind::DataloaderStarvation, Some("GPU-0"), None)),
                7 => events.push(raise(FindingKind::HardwareErrors, "GPU-3")),
                _ => {}
            }
            s.attach(Diagnosis { events, ..Diagnosis::default() });
            report.process(&mut s);
        }
        let r = handle.report();
        let lost_of = |gpu: usize, kind| {
            let f = r.gpus[gpu].findings.iter().find(|f| f.kind == kind).unwrap();
            f.lost_gpu_seconds
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // Charged from the tick after the raise to the clearing tick: ticks 3–6, idle 60 %.
        assert!(close(lost_of(0, FindingKind::DataloaderStarvation), 4.0 * 0.6 * 0.5));
        // Busy 100 % at 75 % of the max clock: a quarter of ticks 2–12.
        assert!(close(lost_of(1, FindingKind::ThermalThrottling), 11.0 * 0.25 * 0.5));
        assert_eq!(lost_of(1, FindingKind::NearOom), 0.0);
        // SM activity 30 %, whatever the utilisation.
        assert!(close(lost_of(2, FindingKind::MemoryBound), 11.0 * 0.7 * 0.5));
        // The two ticks the GPU was lost, whole.
        assert!(close(lost_of(3, FindingKind::HardwareErrors), 2.0 * 0.5));

        let kinds: Vec<_> = r.overview.causes.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                FindingKind::MemoryBound,
                FindingKind::ThermalThrottling,
                FindingKind::DataloaderStarvation,
                FindingKind::HardwareErrors,
                FindingKind::NearOom
            ]
        );
        let main = r.overview.main_cause.as_ref().unwrap();
        assert_eq!((main.kind, main.gpus, main.raised), (FindingKind::MemoryBound, 1, 1));
        assert!(close(main.active_gpu_seconds, 11.0 * 0.5));
        let starvation = &r.overview.causes[2];
        assert!(close(starvation.active_gpu_seconds, 4.0 * 0.5), "{starvation:?}");
        let text = r.to_string();
        assert!(
            text.contains("main cause            memory_bound on 1 GPU(s): 0.001 GPU-h (3.9 GPU-s) lost"),
            "{text}"
        );
        assert!(text.contains("    dataloader_starvation       1.2 GPU-s lost, held 2.0 GPU-s on 1 GPU(s)"), "{text}");
        assert!(text.contains("dataloader_starvation (warning) held 2.0 s, 1.2 GPU-s lost"), "{text}");
    }

    /// Ticks 0..=`last` at 1 s of `devices()`, with a `straggler` on GPU `uuid` raised at tick
    /// `raised` (and cleared at `cleared`): the straggler's time lost.
    fn straggler_lost(
        last: u64,
        uuid: &str,
        raised: u64,
        cleared: Option<u64>,
        devices: impl Fn() -> Vec<DeviceSample>,
    ) -> (f64, Report) {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        for tick in 0..=last {
            let mut s = snapshot(tick, interval, devices());
            let events = match tick {
                t if t == raised => vec![event(Transition::Raised, FindingKind::Straggler, Some(uuid), None)],
                t if Some(t) == cleared => vec![event(Transition::Cleared, FindingKind::Straggler, Some(uuid), None)],
                _ => Vec::new(),
            };
            s.attach(Diagnosis { events, ..Diagnosis::default() });
            report.process(&mut s);
        }
        let r = handle.report();
        let lost = r
            .gpus
            .iter()
            .flat_map(|g| &g.findings)
            .find(|f| f.kind == FindingKind::Straggler)
            .unwrap()
            .lost_gpu_seconds;
        (lost, r)
    }

    #[test]
    fn a_straggler_is_charged_its_peers_wait_beyond_its_own_idle() {
        // GPU 3 busy 95 % (idle 5 %); GPUs 0-2, its peers, idle 45 %: 40 points of that is the
        // wait for GPU 3, the 5 they share with it is not. GPU 4 runs another user's job and
        // idles 90 %: not a peer. GPU 5 holds no memory: not allocated, not a peer.
        let gpus: Vec<_> = (0..6).map(info).collect();
        let owned = |mut d: DeviceSample, uid: u32| {
            let mut p = crate::model::ProcessSample::new(1000 + d.info.index);
            p.owner = Some(Arc::new(crate::model::Owner { uid: Some(uid), ..Default::default() }));
            d.processes = vec![p];
            d
        };
        let (lost, r) = straggler_lost(10, "GPU-3", 2, Some(6), || {
            let mut devices: Vec<_> = (0..3).map(|g| owned(allocated(&gpus[g], 0.55, 6), 1)).collect();
            devices.push(owned(allocated(&gpus[3], 0.95, 6), 1));
            devices.push(owned(allocated(&gpus[4], 0.1, 6), 2));
            let mut free = DeviceSample::new(gpus[5].clone());
            free.utilization.gpu = Some(0.0);
            devices.push(free);
            devices
        });
        // Charged ticks 3-6: its own 5 % and three peers' 40 % each.
        let expected = 4.0 * (0.05 + 3.0 * 0.40);
        assert!((lost - expected).abs() < 1e-9, "{lost} != {expected}");
        assert_eq!(r.overview.main_cause.as_ref().unwrap().kind, FindingKind::Straggler);
    }

    #[test]
    fn a_straggler_behind_busy_peers_is_charged_its_own_idle() {
        // GPU 2 at 50 % behind two peers at 90 %: they idle less than it does, so nothing of
        // theirs is a wait for it; its own idle half is the loss.
        let gpus: Vec<_> = (0..3).map(info).collect();
        let (lost, _) = straggler_lost(6, "GPU-2", 1, None, || {
            vec![allocated(&gpus[0], 0.9, 6), allocated(&gpus[1], 0.9, 6), allocated(&gpus[2], 0.5, 6)]
        });
        assert!((lost - 5.0 * 0.5).abs() < 1e-9, "{lost}");
    }

    #[test]
    fn one_cause_on_several_gpus_adds_up_and_without_loss_the_longest_held_leads() {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let gpus = [info(0), info(1)];
        for tick in 0..10u64 {
            let mut s = snapshot(tick, interval, gpus.iter().map(|g| allocated(g, 0.9, 0)).collect());
            let mut events = Vec::new();
            if tick == 2 || tick == 5 {
                events.push(event(Transition::Raised, FindingKind::NearOom, Some("GPU-0"), None));
            }
            if tick == 4 {
                events.push(event(Transition::Cleared, FindingKind::NearOom, Some("GPU-0"), None));
                events.push(event(Transition::Raised, FindingKind::NearOom, Some("GPU-1"), None));
            }
            if tick == 3 {
                events.push(event(Transition::Raised, FindingKind::PowerThrottling, Some("GPU-1"), None));
            }
            s.attach(Diagnosis { events, ..Diagnosis::default() });
            report.process(&mut s);
        }
        let o = handle.report().overview;
        // Power throttling without the clocks costs nothing known; near_oom never costs.
        assert!(o.causes.iter().all(|c| c.lost_gpu_seconds == 0.0), "{o:#?}");
        let main = o.main_cause.unwrap();
        assert_eq!((main.kind, main.gpus, main.raised), (FindingKind::NearOom, 2, 3));
        // GPU 0: 2 s (ticks 2–4) + 4 s (5–9, open); GPU 1: 5 s (4–9, open).
        assert_eq!(main.active_gpu_seconds, 2.0 + 4.0 + 5.0);
        assert_eq!(o.causes[1].kind, FindingKind::PowerThrottling);
        assert_eq!(o.causes[1].active_gpu_seconds, 6.0);
        // No high-resolution windows: the driver's period is not known.
        assert_eq!(o.driver_sample_period_seconds, None);
    }

    #[test]
    fn the_driver_sampling_period_is_measured_from_the_windows() {
        // A 1 s driver under a 100 ms interval: one sample every tenth tick, none between.
        let interval = Duration::from_millis(100);
        let (mut report, handle) = attached(interval);
        let gpu = info(0);
        for tick in 0..100u64 {
            let count = u32::from(tick % 10 == 3);
            report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, count)]));
        }
        let period = handle.report().overview.driver_sample_period_seconds.unwrap();
        // From the first window (tick 3) on: 97 ticks, 10 samples.
        assert!((period - 0.97).abs() < 1e-9, "{period}");

        // A 1/6 s driver under a 1 s interval: six a tick.
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        for tick in 0..20u64 {
            report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, 6)]));
        }
        let r = handle.report();
        let period = r.overview.driver_sample_period_seconds.unwrap();
        assert!((period - 1.0 / 6.0).abs() < 1e-9, "{period}");
        assert!(r.to_string().contains("utilisation every 0.167 s (6.0 sample(s) per interval)"), "{r}");
    }

    #[test]
    fn the_settings_given_are_listed_with_the_gpus_seen_and_the_measured_period() {
        use crate::metric::MetricSet;
        use crate::stages::diagnose::Sampling;
        let interval = Duration::from_millis(100);
        let (report, handle) = RunReport::new();
        let mut report =
            report.with_diagnosis(&DiagnoseConfig::default(), Sampling::new(interval, MetricSet::default()));
        report.attach(&ProcessorContext::new(interval));
        // Before any tick: the settings alone.
        let before = handle.report().overview.limitations;
        assert!(before.iter().any(|l| l.rules == [FindingKind::PcieBound]), "{before:#?}");
        assert!(!before.iter().any(|l| l.rules.contains(&FindingKind::Imbalance)), "device count unknown yet");
        let gpu = info(0);
        for tick in 0..60u64 {
            let count = u32::from(tick % 5 == 0); // every 500 ms
            report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, count)]));
        }
        let r = handle.report();
        let limits = &r.overview.limitations;
        // One GPU: the rules that compare GPUs cannot work.
        assert!(
            limits.iter().any(|l| l.rules.contains(&FindingKind::Imbalance) && l.reason.contains("1 GPU")),
            "{limits:#?}"
        );
        let starvation = limits.iter().find(|l| l.rules == [FindingKind::DataloaderStarvation]).unwrap();
        assert!(starvation.reason.contains("(measured here: 500ms)"), "{starvation}");
        let text = r.to_string();
        assert!(
            text.contains(
                "  limitations:\n    [warning] pcie_bound: PCIe throughput is not sampled; --enable pcie_throughput"
            ),
            "{text}"
        );
        #[cfg(feature = "serde")]
        {
            let v = serde_json::to_value(&r).unwrap();
            let l = &v["overview"]["limitations"];
            assert!(
                l.as_array().unwrap().iter().any(|l| l["rules"][0] == "pcie_bound" && l["severity"] == "warning"),
                "{l}"
            );
        }
    }

    #[test]
    fn tuned_thresholds_change_what_counts_as_idle() {
        let interval = Duration::from_secs(1);
        let (report, handle) = RunReport::new();
        let mut t = Thresholds::default();
        // The peak first: the level may not be above it.
        t.set("idle_peak", 0.25).unwrap();
        t.set("idle_level", 0.2).unwrap();
        let mut report = report.with_thresholds(&t);
        report.attach(&ProcessorContext::new(interval));
        let mut d = DeviceSample::new(info(0));
        d.utilization.gpu = Some(0.15);
        d.memory.used = Some(40 * GIB);
        d.memory.total = Some(80 * GIB);
        report.process(&mut snapshot(0, interval, vec![d]));
        assert_eq!(handle.report().gpus[0].idle_allocated_ticks, 1);
    }

    #[test]
    fn a_lost_gpu_is_not_sampled_while_lost() {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        for tick in 0..5u64 {
            let mut d = DeviceSample::new(info(0));
            if tick == 2 {
                d.state = DeviceState::Lost;
            } else {
                d.utilization.gpu = Some(0.5);
            }
            report.process(&mut snapshot(tick, interval, vec![d]));
        }
        let r = handle.report();
        assert_eq!((r.ticks, r.gpus[0].samples), (5, 4));
    }

    fn event(transition: Transition, kind: FindingKind, uuid: Option<&str>, held: Option<Duration>) -> FindingEvent {
        let device = uuid.map(|u| (0, u));
        FindingEvent {
            transition,
            finding: Finding::new(kind, Severity::Warning, device, UNIX_EPOCH, "ev", "do this"),
            held_for: held,
        }
    }

    #[test]
    fn findings_are_held_from_raise_to_clear_or_to_the_last_tick() {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let (raise_1, clear_1, raise_2, host_raise, last) = (2u64, 5u64, 7u64, 4u64, 10u64);
        for tick in 0..=last {
            let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(0))]);
            let mut events = Vec::new();
            if tick == raise_1 || tick == raise_2 {
                events.push(event(Transition::Raised, FindingKind::Imbalance, Some("GPU-0"), None));
            }
            if tick == clear_1 {
                let held = interval * (clear_1 - raise_1) as u32;
                events.push(event(Transition::Cleared, FindingKind::Imbalance, Some("GPU-0"), Some(held)));
            }
            if tick == host_raise {
                events.push(event(Transition::Raised, FindingKind::PcieBound, None, None));
            }
            s.attach(Diagnosis { events, ..Diagnosis::default() });
            report.process(&mut s);
        }
        let r = handle.report();
        let f = &r.gpus[0].findings;
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].kind, f[0].active_at_exit), (FindingKind::Imbalance, false));
        assert_eq!(f[0].held_seconds, (clear_1 - raise_1) as f64);
        assert_eq!(f[0].raised_at, UNIX_EPOCH + Duration::from_secs(raise_1));
        assert!(f[1].active_at_exit);
        assert_eq!(f[1].held_seconds, (last - raise_2) as f64);
        assert_eq!(f[1].advice, "do this");
        assert_eq!(r.host_findings.len(), 1);
        assert_eq!(r.host_findings[0].held_seconds, (last - host_raise) as f64);
        // Reading the report does not close anything: later ticks extend an open finding.
        let mut s = snapshot(last + 3, interval, vec![DeviceSample::new(info(0))]);
        report.process(&mut s);
        assert_eq!(handle.report().gpus[0].findings[1].held_seconds, (last + 3 - raise_2) as f64);
    }

    #[test]
    fn after_the_diagnoser_it_reports_the_raised_finding() {
        let interval = Duration::from_secs(1);
        let context = ProcessorContext::new(interval);
        let mut diagnoser = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(10))).unwrap();
        diagnoser.attach(&context);
        let (mut report, handle) = attached(interval);
        let last = 20u64;
        let mut raised_tick = None;
        for tick in 0..=last {
            let mut d = DeviceSample::new(info(0));
            d.memory.used = Some(78 * GIB);
            d.memory.total = Some(80 * GIB);
            d.utilization.gpu = Some(0.9);
            let mut s = snapshot(tick, interval, vec![d]);
            diagnoser.process(&mut s);
            if s.output::<crate::Diagnosis>().is_some_and(|dg| !dg.events.is_empty()) {
                raised_tick.get_or_insert(tick);
            }
            report.process(&mut s);
        }
        let raised = raised_tick.expect("near_oom raised");
        // Raised after ceil(0.8 × 10) = 8 holding ticks: tick index 7.
        assert_eq!(raised, diagnoser.raise_after_ticks() as u64 - 1);
        let f = &handle.report().gpus[0].findings;
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::NearOom);
        assert!(f[0].active_at_exit);
        assert_eq!(f[0].held_seconds, (last - raised) as f64);
        assert!(f[0].evidence.contains("97.5 %"), "{}", f[0].evidence);
    }

    #[test]
    fn steps_pool_the_runs_per_gpu_and_a_report_of_some_gpus_counts_only_theirs() {
        use crate::steps::{DeviceStep, RunSteps, StepReport, Steps};
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let step = |n: u64, secs: f64| {
            let mut r = StepReport::new(n, Duration::from_secs_f64(secs));
            for (uuid, joules) in [("GPU-0", 100.0), ("GPU-1", 50.0)] {
                let mut d = DeviceStep::new(uuid);
                d.energy_joules = Some(joules);
                r.devices.push(d);
            }
            r
        };
        for (tick, (slow, fast)) in [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)].into_iter().enumerate() {
            let n = tick as u64 + 2;
            let mut rank0 = RunSteps::new("train", Some(0));
            rank0.reported.push(step(n, slow));
            let mut rank1 = RunSteps::new("train", Some(1));
            rank1.reported.push(step(n, fast));
            let mut s = snapshot(tick as u64, interval, vec![DeviceSample::new(info(0)), DeviceSample::new(info(1))]);
            s.attach(Steps { runs: vec![rank0, rank1], rejected: None });
            report.process(&mut s);
        }
        let r = handle.report();
        assert_eq!(r.format, REPORT_FORMAT);
        let steps = r.steps.expect("steps");
        assert_eq!(steps.steps, 6);
        // Nearest rank over [1, 1, 1, 1, 2, 3].
        assert_eq!((steps.duration_median_seconds, steps.duration_p95_seconds), (Some(1.0), Some(3.0)));
        assert_eq!(steps.duration_mean_seconds, Some(9.0 / 6.0));
        // Both runs carry both GPUs' figures: per step the job's GPUs used 100 J + 50 J, not twice.
        assert_eq!(steps.energy_per_step_joules, Some(150.0));
        let ranks: Vec<_> = steps.runs.iter().map(|r| (r.rank, r.steps, r.first_step, r.last_step)).collect();
        assert_eq!(ranks, [(Some(0), 3, Some(2), Some(4)), (Some(1), 3, Some(2), Some(4))]);
        assert_eq!(steps.runs[0].duration_median_seconds, Some(2.0));
        assert_eq!(steps.runs[0].energy_per_step_joules, Some(150.0));

        let only = handle.report_of(|uuid| uuid == "GPU-0");
        assert_eq!(only.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(), ["GPU-0"]);
        assert_eq!(only.overview.gpus, 1);
        // Three ticks a second apart: 2 s of GPU-0 (the first tick opens the run).
        assert_eq!(only.overview.gpu_seconds, 2.0);
        assert_eq!(only.steps.expect("steps").energy_per_step_joules, Some(100.0));
        assert_eq!(handle.report().overview.gpus, 2);
    }

    /// A loop marking 1 000 steps a second: the tracker reports the latest 64 of each tick, and
    /// the report still counts every step completed, from the first.
    #[test]
    fn the_report_counts_every_completed_step_not_only_the_reported_ones() {
        use crate::steps::{RunSteps, StepReport, Steps};
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        let ms = Duration::from_millis(1);
        // (tick, steps completed, the last one, each step's time): the last tick, one slow step.
        for (tick, completed, last, took) in [(1u64, 999u64, 999u64, ms), (2, 1000, 1999, ms), (3, 1, 2000, 500 * ms)] {
            let mut run = RunSteps::new("fast", Some(0));
            run.last_step = Some(last);
            run.last_duration = Some(took);
            run.completed = completed;
            let from = last + 1 - completed.min(64);
            run.reported = (from..=last).map(|n| StepReport::new(n, took)).collect();
            let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(0))]);
            s.attach(Steps { runs: vec![run], rejected: None });
            report.process(&mut s);
        }
        let steps = handle.report().steps.expect("steps");
        assert_eq!(steps.steps, 2000);
        let run = &steps.runs[0];
        assert_eq!((run.steps, run.first_step, run.last_step), (2000, Some(1), Some(2000)));
        // Weighted by steps: 1 999 steps of 1 ms and one of 0.5 s.
        assert_eq!((run.duration_median_seconds, run.duration_p95_seconds), (Some(0.001), Some(0.001)));
        let mean = (1999.0 * 0.001 + 0.5) / 2000.0;
        assert!((run.duration_mean_seconds.unwrap() - mean).abs() < 1e-12, "{:?}", run.duration_mean_seconds);
    }

    #[test]
    fn a_run_without_a_sample_says_so_and_has_no_negative_zero() {
        let (_report, handle) = attached(Duration::from_secs(1));
        let r = handle.report();
        assert_eq!(r.ticks, 0);
        let o = &r.overview;
        for v in [o.gpu_seconds, o.allocated_seconds, o.idle_allocated_seconds] {
            assert!(v == 0.0 && v.is_sign_positive(), "{v:?}");
        }
        let text = r.to_string();
        assert!(text.contains("no sample was taken during the run"), "{text}");
        assert!(!text.contains("-0.0") && !text.contains("GPU-h"), "{text}");
    }

    #[test]
    fn human_and_json_forms_carry_the_numbers() {
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        for tick in 0..4u64 {
            let mut d = DeviceSample::new(info(0));
            d.utilization.gpu = Some(0.25 * tick as f64);
            d.memory.used = Some(40 * GIB);
            d.memory.total = Some(80 * GIB);
            d.power.usage_watts = Some(200.0);
            let mut s = snapshot(tick, interval, vec![d]);
            if tick == 1 {
                s.attach(Diagnosis {
                    events: vec![event(Transition::Raised, FindingKind::IdleAllocated, Some("GPU-0"), None)],
                    ..Diagnosis::default()
                });
            }
            report.process(&mut s);
        }
        let r = handle.report();
        let text = r.to_string();
        assert!(text.contains("GPU 0 NVIDIA H100 80GB HBM3 (GPU-0), 4 sample(s)"), "{text}");
        assert!(text.contains("mean 37.5 %, p5 0.0 %, p95 75.0 %"), "{text}");
        assert!(text.contains("peak 40.0 GiB of 80.0 GiB"), "{text}");
        // 200 W over the 3 s after the first tick.
        assert!(text.contains("energy 0.6 kJ"), "{text}");
        assert!(
            text.starts_with("gpumon run report: host node-1, 4 tick(s) over 3.0 s, interval 1 s\noverview\n"),
            "{text}"
        );
        assert!(
            text.contains("  GPUs                  1, wall time 3.0 s, 0.001 GPU-h (3.0 GPU-s) observed"),
            "{text}"
        );
        // Charged on ticks 2 and 3, idle 50 % and 25 %.
        assert!(text.contains("idle_allocated (warning) held 2.0 s, 0.8 GPU-s lost, still active at exit"), "{text}");
        assert!(
            text.contains("main cause            idle_allocated on 1 GPU(s): 0.000 GPU-h (0.8 GPU-s) lost"),
            "{text}"
        );
        assert!(text.contains("driver sampling       unknown"), "{text}");
        assert!(text.contains("limitations           none"), "{text}");
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_string(&r).unwrap();
            let back: Report = serde_json::from_str(&json).unwrap();
            assert_eq!(back, r);
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(v["gpus"][0]["findings"][0]["kind"], "idle_allocated");
            assert_eq!(v["gpus"][0]["energy_source"], "integrated_power");
            assert_eq!(v["gpus"][0]["findings"][0]["lost_gpu_seconds"], 0.75);
            let o = &v["overview"];
            assert_eq!(o["gpus"], 1);
            assert_eq!(o["gpu_seconds"], 3.0);
            assert_eq!(o["allocated_seconds"], 3.0);
            // Ticks 1–3, idle 75 %, 50 % and 25 % of a second each.
            assert_eq!(o["idle_allocated_seconds"], 1.5);
            assert_eq!(o["main_cause"]["kind"], "idle_allocated");
            assert_eq!(o["main_cause"]["lost_gpu_seconds"], 0.75);
            assert_eq!(o["causes"][0]["active_gpu_seconds"], 2.0);
            assert_eq!(o["driver_sample_period_seconds"], serde_json::Value::Null);
            assert_eq!(o["limitations"], serde_json::json!([]));
        }
    }

    /// The marks of steps_slow10.py (30 steps, every 10th 1.5 s, the rest 0.2 s) through the real
    /// tracker at a 100 ms, 1 s and 5 s interval: the step times are the steps', not the ticks'.
    #[test]
    fn step_time_percentiles_are_over_the_steps_at_any_interval() {
        use crate::steps::{StepConfig, StepTracker};
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut marks = vec![(0u64, Duration::ZERO)];
        for n in 1..=30u64 {
            let took = if n % 10 == 0 { Duration::from_millis(1500) } else { Duration::from_millis(200) };
            let (_, before) = marks[marks.len() - 1];
            marks.push((n, before + took));
        }
        let end = marks[marks.len() - 1].1;
        for interval in [Duration::from_millis(100), Duration::from_secs(1), Duration::from_secs(5)] {
            let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
            let (mut report, handle) = attached(interval);
            let mut next = marks.iter().peekable();
            let mut tick = 0u32;
            loop {
                // Each mark is read at the first tick at least 1 ms after it.
                let at = interval * tick;
                while let Some((n, when)) = next.next_if(|(_, when)| *when + Duration::from_millis(1) <= at) {
                    steps.record_at("s", Some(0), *n, t0 + *when).unwrap();
                }
                let mut s =
                    Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), vec![DeviceSample::new(info(0))])
                        .with_seq(u64::from(tick) + 1)
                        .with_taken_at(t0 + at);
                tracker.process(&mut s);
                report.process(&mut s);
                if at > end + interval {
                    break;
                }
                tick += 1;
            }
            let steps = handle.report().steps.expect("steps");
            let round = |v: Option<f64>| v.map(|v| (v * 1000.0).round() / 1000.0);
            assert_eq!(steps.steps, 30, "{interval:?}");
            assert_eq!(
                (
                    round(steps.duration_median_seconds),
                    round(steps.duration_p95_seconds),
                    round(steps.duration_mean_seconds)
                ),
                (Some(0.2), Some(1.5), Some(0.33)),
                "at {interval:?}"
            );
        }
    }

    /// A replay of some of a trace's GPUs (`--devices`): the recorded steps carry every GPU's
    /// figures, the energy per step is the sampled GPUs' only.
    #[test]
    fn energy_per_step_counts_only_the_gpus_of_the_snapshot() {
        use crate::steps::{DeviceStep, RunSteps, StepReport, Steps};
        let interval = Duration::from_secs(1);
        let (mut report, handle) = attached(interval);
        for tick in 1..=3u64 {
            let mut run = RunSteps::new("train", Some(0));
            let mut step = StepReport::new(tick, interval);
            for gpu in 0..4u32 {
                let mut d = DeviceStep::new(format!("GPU-{gpu}"));
                d.energy_joules = Some(80.0 + f64::from(gpu));
                step.devices.push(d);
            }
            run.reported.push(step);
            let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(1))]);
            s.attach(Steps { runs: vec![run], rejected: None });
            report.process(&mut s);
        }
        let steps = handle.report().steps.expect("steps");
        assert_eq!(steps.energy_per_step_joules, Some(81.0));
        assert_eq!(steps.runs[0].energy_per_step_joules, Some(81.0));
    }

    /// Marks the steps socket dropped (numbering restarted: refused; a bad line: malformed) are
    /// counted in the report, also when no step was reported at all.
    #[test]
    fn the_report_counts_the_marks_dropped_by_reason() {
        use crate::steps::{RunSteps, StepRejections, StepReport, Steps};
        let interval = Duration::from_secs(1);
        let rejected = StepRejections { refused: 10, malformed: 1, ..StepRejections::default() };
        let (mut report, handle) = attached(interval);
        for tick in 1..=2u64 {
            let mut run = RunSteps::new("train", Some(0));
            run.reported.push(StepReport::new(tick + 1, interval));
            let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(0))]);
            s.attach(Steps { runs: vec![run], rejected: Some(rejected) });
            report.process(&mut s);
        }
        let r = handle.report();
        assert_eq!(r.steps.as_ref().and_then(|s| s.marks_rejected), Some(rejected));
        let text = r.to_string();
        assert!(text.contains("  marks dropped         1 malformed, 10 refused (not in the step figures)\n"), "{text}");
        assert!(text.contains("numbering restarted"), "{text}");

        let (mut report, handle) = attached(interval);
        let mut s = snapshot(1, interval, vec![DeviceSample::new(info(0))]);
        s.attach(Steps { runs: Vec::new(), rejected: Some(rejected) });
        report.process(&mut s);
        let steps = handle.report().steps.expect("a steps part for the dropped marks");
        assert_eq!((steps.steps, steps.marks_rejected), (0, Some(rejected)));
        let text = handle.report().to_string();
        assert!(
            text.contains("steps                   0 step(s)\n  marks dropped         1 malformed, 10 refused"),
            "{text}"
        );
        #[cfg(feature = "serde")]
        {
            let v = serde_json::to_value(handle.report()).unwrap();
            assert_eq!(v["steps"]["marks_rejected"]["refused"], 10);
            assert_eq!(v["steps"]["marks_rejected"]["malformed"], 1);
        }
    }
}

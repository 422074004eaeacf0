//! The step tracker's output: [`Steps`] and its parts, the serialisable figures of each run, and
//! [`Steps`] as a stage output: its series (`training_step`, `step_duration`,
//! the per-GPU figures of the last reported step, `steps_rejected`) and its events (each step
//! reported at this tick).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::{Peer, Rejection, StepRejections};
use crate::metric::{DerivedPoint, MetricId, Value};
use crate::model::Snapshot;
use crate::stages::{Event, EventField, EventRow, EventValue, StageOutput};

/// What the step tracker attached to one snapshot ([`Steps`] output).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Steps {
    /// One entry per registered run, in registration order.
    pub runs: Vec<RunSteps>,
    /// Marks from other processes dropped so far; `None` without a steps socket.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub rejected: Option<StepRejections>,
}

/// One training run at one tick.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct RunSteps {
    /// The job name (the `job` label).
    pub job: String,
    /// The rank, if any.
    pub rank: Option<u32>,
    /// The rank as the `rank` label writes it: decimal, or empty (label omitted) without one.
    pub rank_label: String,
    /// The last completed step the tracker has read; `None` before the first.
    pub last_step: Option<u64>,
    /// How long the last completed step took: from the mark before it to its own (see the
    /// module docs for a loop marking more than 64 steps per tick).
    #[cfg_attr(feature = "serde", serde(with = "opt_secs"))]
    pub last_duration: Option<Duration>,
    /// The latest reported step (it stays until the next one is reported).
    pub last: Option<StepReport>,
    /// The steps reported at this tick, oldest first (usually none or one).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub reported: Vec<StepReport>,
    /// Steps completed at this tick whose duration is known, reported or not: `reported` holds
    /// at most the latest 64 of them (and, with `every_n` over 1, only every n-th), so a loop
    /// marking faster than that is counted here, each step taking `last_duration`.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "is_zero"))]
    pub completed: u64,
    /// How long the `completed` steps took together: from the start of the first of them to
    /// the last mark. The steps not in `reported` took this less the reported steps' durations;
    /// `None` when none completed (and in traces written before it existed).
    #[cfg_attr(feature = "serde", serde(with = "opt_secs", skip_serializing_if = "Option::is_none"))]
    pub completed_duration: Option<Duration>,
    /// The process that registered the run through the steps socket (with the pid of its
    /// latest mark); `None` for a run made in the sampling process. A tenant sees the runs whose
    /// process is one of its own.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub registered_by: Option<Peer>,
    /// The indices of this snapshot's GPUs the run drives (a MIG instance gives its parent's
    /// index): those its marks named (the steps socket's `gpu` key), else — a run marked from
    /// another process ([`StepRegistry::record`], the steps socket) that named none — GPU `r`
    /// for rank `r` when the snapshot has it. Its reported steps carry figures for those GPUs
    /// only, and [`Steps::for_gpu`] attributes the run to them. `None` for a run that named no
    /// GPU and has no rank, or whose rank is no sampled GPU's index, and for a run made in the
    /// sampling process ([`StepRegistry::run`]: the Python `Monitor`, which chose the GPUs it
    /// samples): its reports cover every sampled GPU. Empty when the GPUs named are not among
    /// the sampled ones.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub gpus: Option<Vec<u32>>,
}

/// The figures of one reported step.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct StepReport {
    /// The step number.
    pub step: u64,
    /// How long it took.
    #[cfg_attr(feature = "serde", serde(with = "secs"))]
    pub duration: Duration,
    /// [`Snapshot::seq`] of the first sample the figures come from.
    pub first_seq: u64,
    /// [`Snapshot::seq`] of the last sample the figures come from (the one covering its end).
    pub last_seq: u64,
    /// Per GPU, in snapshot order.
    pub devices: Vec<DeviceStep>,
}

/// One GPU's figures over one step.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct DeviceStep {
    /// The GPU's UUID.
    pub uuid: String,
    /// Mean GPU utilisation over the step, ratio.
    pub utilization_mean: Option<f64>,
    /// Highest GPU utilisation seen over the step, ratio.
    pub utilization_max: Option<f64>,
    /// Highest framebuffer memory used over the step, bytes.
    pub memory_peak_bytes: Option<u64>,
    /// Energy used over the step, joules.
    pub energy_joules: Option<f64>,
}

impl RunSteps {
    /// A run with no step yet (`rank_label` from `rank`).
    pub fn new(job: impl Into<String>, rank: Option<u32>) -> Self {
        Self { job: job.into(), rank, rank_label: rank.map(|r| r.to_string()).unwrap_or_default(), ..Self::default() }
    }
}

impl RunSteps {
    /// The mean utilisation of GPU `uuid` over the steps reported at this tick; `None` when none
    /// was reported or none had a reading.
    pub fn reported_utilization(&self, uuid: &str) -> Option<f64> {
        let (sum, n) = self
            .reported
            .iter()
            .filter_map(|s| s.devices.iter().find(|d| d.uuid == uuid)?.utilization_mean)
            .fold((0.0, 0u32), |(sum, n), u| (sum + u, n + 1));
        (n > 0).then(|| sum / f64::from(n))
    }
}

impl StepReport {
    /// The report of step `step`, which took `duration`; no samples, no GPU.
    pub fn new(step: u64, duration: Duration) -> Self {
        Self { step, duration, ..Self::default() }
    }
}

impl DeviceStep {
    /// The figures of the GPU `uuid`, all absent.
    pub fn new(uuid: impl Into<String>) -> Self {
        Self { uuid: uuid.into(), ..Self::default() }
    }
}

impl Steps {
    /// The run (`job`, `rank`), if registered.
    pub fn run(&self, job: &str, rank: Option<u32>) -> Option<&RunSteps> {
        self.runs.iter().find(|r| r.job == job && r.rank == rank)
    }

    /// The run whose steps GPU `index` (`uuid`) works on: the run whose marks named the GPU
    /// ([`RunSteps::gpus`]: the client resolved its `CUDA_VISIBLE_DEVICES`); else, among the
    /// runs whose marks named no GPU, the run whose rank is the GPU's index (ranks are *local*
    /// ranks, and rank `r` drives entry `r` of `CUDA_VISIBLE_DEVICES`, as
    /// `torch.cuda.set_device(local_rank)` does — GPU `r` when the variable is unset); else,
    /// when only one run is registered and it named no GPU, that run (a single training loop —
    /// the Python `Monitor`, which samples only its rank's own GPUs); else such a run without a
    /// rank. `None` when no run fits: a GPU that no marked loop drives has no steps. A run that
    /// named GPUs is never taken for another GPU.
    pub fn for_gpu(&self, index: u32) -> Option<&RunSteps> {
        let unnamed = || self.runs.iter().filter(|r| r.gpus.is_none());
        self.runs
            .iter()
            .find(|r| r.gpus.as_ref().is_some_and(|g| g.contains(&index)))
            .or_else(|| unnamed().find(|r| r.rank == Some(index)))
            .or_else(|| if self.runs.len() == 1 { unnamed().next() } else { None })
            .or_else(|| unnamed().find(|r| r.rank.is_none()))
    }

    /// The mean utilisation of GPU `index` (`uuid`) over the steps its run (see
    /// [`Steps::for_gpu`]) reported at this tick; `None` when none was reported or none had a
    /// reading. What diagnosis weighs a step by.
    pub fn reported_utilization(&self, index: u32, uuid: &str) -> Option<f64> {
        self.for_gpu(index)?.reported_utilization(uuid)
    }

    /// What the last reported step of GPU `index`'s run (see [`Steps::for_gpu`]) says about it,
    /// for a finding's evidence: `step 42 of train rank 3 took 1.25 s, 0.44 s of it idle (65 %
    /// mean utilisation)` — the idle share `(1 − mean utilisation) × duration` is the time the
    /// GPU waited between steps. `None` when its run has reported no step with figures for it.
    pub fn evidence_for(&self, index: u32, uuid: &str) -> Option<String> {
        let run = self.for_gpu(index)?;
        let last = run.last.as_ref()?;
        let gpu = last.devices.iter().find(|d| d.uuid == uuid)?;
        let mean = gpu.utilization_mean?;
        let secs = last.duration.as_secs_f64();
        let rank = run.rank.map(|r| format!(" rank {r}")).unwrap_or_default();
        Some(format!(
            "step {} of {}{rank} took {secs:.2} s, {:.2} s of it idle ({:.0} % mean utilisation)",
            last.step,
            run.job,
            (1.0 - mean).clamp(0.0, 1.0) * secs,
            mean * 100.0
        ))
    }
}

#[cfg(feature = "serde")]
mod secs {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v: f64 = serde::Deserialize::deserialize(d)?;
        Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "serde")]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(feature = "serde")]
mod opt_secs {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let v: Option<f64> = serde::Deserialize::deserialize(d)?;
        v.map(|v| Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)).transpose()
    }
}

/// The key of the step tracker's output (its JSON field).
pub(crate) const STEPS_KEY: &str = "steps";

impl StageOutput for Steps {
    fn key(&self) -> &'static str {
        STEPS_KEY
    }

    /// Per run the last step and its duration, per GPU the figures of the last reported step,
    /// and the marks the steps socket dropped per reason. An empty `rank` label value means "no
    /// rank" (sinks omit the label).
    fn visit_series<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(DerivedPoint<'a>)) {
        if let Some(rejected) = &self.rejected {
            for reason in Rejection::ALL {
                let value = Value::Int(rejected.get(reason));
                f(DerivedPoint::new(MetricId::StepsRejected.descriptor(), value, None, &[reason.name()]));
            }
        }
        for run in &self.runs {
            let labels = [run.job.as_str(), run.rank_label.as_str()];
            let mut point =
                |id: MetricId, value: Value, device| f(DerivedPoint::new(id.descriptor(), value, device, &labels));
            if let Some(step) = run.last_step {
                point(MetricId::TrainingStep, Value::Int(step), None);
            }
            if let Some(d) = run.last_duration {
                point(MetricId::StepDuration, Value::Float(d.as_secs_f64()), None);
            }
            let Some(last) = &run.last else { continue };
            for gpu in &last.devices {
                let Some(i) = snapshot.position(&gpu.uuid) else { continue };
                let device = Some(i);
                if let Some(v) = gpu.utilization_mean {
                    point(MetricId::StepUtilization, Value::Float(v), device);
                }
                if let Some(v) = gpu.utilization_max {
                    point(MetricId::StepUtilizationMax, Value::Float(v), device);
                }
                if let Some(v) = gpu.memory_peak_bytes {
                    point(MetricId::StepMemoryPeak, Value::Int(v), device);
                }
                if let Some(v) = gpu.energy_joules {
                    point(MetricId::StepEnergy, Value::Float(v), device);
                }
            }
        }
    }

    /// One `step` event per step reported at this tick: tags `job`, `rank`; fields `step`,
    /// `duration_seconds`; one row per GPU of the step the snapshot carries, with
    /// `utilization_mean`, `utilization_max`, `energy_joules`, `memory_peak_bytes` where known.
    /// Several steps of one run in one tick are a nanosecond apart (the last at the snapshot's
    /// time), so that each is a point of its own.
    fn visit_events<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(&Event<'_>)) {
        for run in &self.runs {
            let n = run.reported.len();
            for (i, report) in run.reported.iter().enumerate() {
                let before = u64::try_from(n - 1 - i).unwrap_or(0);
                let at = snapshot.taken_at.checked_sub(Duration::from_nanos(before)).unwrap_or(snapshot.taken_at);
                let fields: [EventField<'_>; 2] = [
                    ("step", EventValue::Int(i64::try_from(report.step).unwrap_or(i64::MAX))),
                    ("duration_seconds", EventValue::Float(report.duration.as_secs_f64())),
                ];
                let rows = |row: &mut dyn FnMut(EventRow<'_>)| {
                    for gpu in &report.devices {
                        let Some(device) = snapshot.position(&gpu.uuid) else { continue };
                        let mut fields: [EventField<'_>; 4] = [("", EventValue::Int(0)); 4];
                        let mut n = 0;
                        let figures = [
                            ("utilization_mean", gpu.utilization_mean),
                            ("utilization_max", gpu.utilization_max),
                            ("energy_joules", gpu.energy_joules),
                        ];
                        for (key, v) in figures {
                            if let Some(v) = v.filter(|v| v.is_finite()) {
                                fields[n] = (key, EventValue::Float(v));
                                n += 1;
                            }
                        }
                        if let Some(v) = gpu.memory_peak_bytes {
                            fields[n] = ("memory_peak_bytes", EventValue::Int(i64::try_from(v).unwrap_or(i64::MAX)));
                            n += 1;
                        }
                        row(EventRow { device, fields: &fields[..n] });
                    }
                };
                let text = |out: &mut String| write_step_line(out, snapshot, run, report);
                f(&Event {
                    name: "step",
                    at,
                    device: None,
                    tags: &[("job", run.job.as_str()), ("rank", run.rank_label.as_str())],
                    fields: &fields,
                    rows: &rows,
                    text: &text,
                });
            }
        }
    }

    /// A tenant sees the runs registered by its own processes: a run's
    /// [`registered_by`](RunSteps::registered_by) pid is one of the processes in `view` (which
    /// holds only the tenant's) and that process's owner has the run's uid — so a pid reused by
    /// another user's process does not hand it the run. Each run keeps only the figures of
    /// the view's GPUs. Runs made in the sampling process (no peer) and the rejection counters
    /// (every user's) stay out.
    fn scoped(&self, view: &Snapshot) -> Option<Arc<dyn StageOutput>> {
        let own: HashSet<(u32, u32)> = view
            .devices
            .iter()
            .flat_map(|d| &d.processes)
            .filter_map(|p| Some((p.pid, p.owner.as_deref()?.uid?)))
            .collect();
        let gpus: HashSet<&str> = view.devices.iter().map(|d| d.info.uuid.as_str()).collect();
        let keep_gpus = |report: &StepReport| {
            let mut report = report.clone();
            report.devices.retain(|g| gpus.contains(g.uuid.as_str()));
            report
        };
        let runs: Vec<RunSteps> = self
            .runs
            .iter()
            .filter(|r| r.registered_by.is_some_and(|p| p.pid.is_some_and(|pid| own.contains(&(pid, p.uid)))))
            .map(|r| RunSteps {
                last: r.last.as_ref().map(keep_gpus),
                reported: r.reported.iter().map(keep_gpus).collect(),
                ..r.clone()
            })
            .collect();
        if runs.is_empty() {
            return None;
        }
        Some(Arc::new(Steps { runs, rejected: None }))
    }

    #[cfg(feature = "serde")]
    fn as_serialize(&self) -> Option<&dyn erased_serde::Serialize> {
        Some(self)
    }
}

/// One reported training step as a human line:
/// `STEP job rank R step N in 1.250s | GPU0 util 87% (max 99%) mem 40960 MB energy 512.0 J | …`
/// (`rank R` only for a run with a rank; a figure the samples did not have is left out; GPUs
/// the snapshot does not carry are skipped).
fn write_step_line(out: &mut String, snapshot: &Snapshot, run: &RunSteps, report: &StepReport) {
    out.push_str("STEP ");
    crate::stages::text::push_one_line(out, &run.job);
    if let Some(rank) = run.rank {
        let _ = write!(out, " rank {rank}");
    }
    let _ = write!(out, " step {} in {:.3}s", report.step, report.duration.as_secs_f64());
    for gpu in &report.devices {
        let Some(device) = snapshot.device(&gpu.uuid) else { continue };
        let _ = write!(out, " | GPU{}", device.info.index);
        if let Some(mean) = gpu.utilization_mean {
            let _ = write!(out, " util {:.0}%", mean * 100.0);
            if let Some(max) = gpu.utilization_max {
                let _ = write!(out, " (max {:.0}%)", max * 100.0);
            }
        }
        if let Some(peak) = gpu.memory_peak_bytes {
            let _ = write!(out, " mem {} MB", peak / (1024 * 1024));
        }
        if let Some(e) = gpu.energy_joules {
            let _ = write!(out, " energy {e:.1} J");
        }
    }
}

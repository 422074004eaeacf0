//! [`Steps`] as the step tracker's stage output: its series (`training_step`, `step_duration`,
//! the per-GPU figures of the last reported step, `steps_rejected`) and its events (each step
//! reported at this tick).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::{Rejection, RunSteps, StepReport, Steps};
use crate::metric::{DerivedPoint, MetricId, Value};
use crate::model::Snapshot;
use crate::stages::{Event, EventField, EventRow, EventValue, StageOutput};

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

//! Step figures of a run: durations, percentiles and energy per step, from the steps stage's marks.

use std::collections::HashMap;

use super::model::{RunStepsReport, StepsReport};

/// Nearest-rank percentile `p` (0–100) of `sorted` — (value, how many times), ascending by
/// value — over `total` values.
pub(super) fn nearest_rank(sorted: &[(f64, u64)], total: u64, p: f64) -> Option<f64> {
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
pub(super) fn energy_per_step(energy: &[&StepEnergy], keep: &dyn Fn(&str) -> bool) -> Option<f64> {
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
pub(super) struct RunAcc {
    pub(super) job: String,
    pub(super) rank: Option<u32>,
    /// Step times, seconds, each with how many steps took it: the steps completed at one tick
    /// share one duration, reported or not (a loop marking faster than the tracker reports).
    pub(super) durations: Vec<(f64, u64)>,
    pub(super) first_step: Option<u64>,
    pub(super) last_step: Option<u64>,
    pub(super) energy: StepEnergy,
}

impl RunAcc {
    /// Takes one tick of the run: every step it completed counts (`completed`), each reported
    /// step with its own duration and the rest (a loop marking more than 64 steps a tick) at
    /// their mean; the reported ones give the energy of the GPUs `sampled` accepts (those of
    /// this snapshot: a replay of some of a trace's GPUs has the others' figures in its steps).
    /// A run from a trace written before `completed` existed counts the reported steps.
    pub(super) fn add_tick(&mut self, run: &crate::steps::RunSteps, sampled: &dyn Fn(&str) -> bool) {
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

    pub(super) fn add_energy(&mut self, step: &crate::steps::StepReport, sampled: &dyn Fn(&str) -> bool) {
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
pub(super) fn duration_stats(durations: &[(f64, u64)]) -> (Option<f64>, Option<f64>, Option<f64>) {
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
pub(super) fn step_count(durations: &[(f64, u64)]) -> u64 {
    durations.iter().map(|&(_, n)| n).sum()
}

pub(super) fn steps_report(
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

//! The sampling side of the steps hand-off: [`StepTracker`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{DeviceStep, RunCell, RunSteps, StepConfig, StepRegistry, StepReport, Steps, MARK_SLOTS};
use crate::model::{DeviceSample, Snapshot};
use crate::stages::Processor;

/// Most steps of one run reported at one tick; when a loop marks more per interval than this
/// (with `every_n` 1), the most recent ones are reported. Bounds the work and the event volume.
pub(super) const MAX_REPORTS_PER_TICK: u64 = MARK_SLOTS as u64;

/// The [`Processor`] that turns step marks into per-step GPU figures ([`Steps`](crate::steps::Steps) output).
/// Made by [`StepTracker::new`] together with its [`StepRegistry`]; `name()` is `"steps"`.
#[derive(Debug)]
pub struct StepTracker {
    config: StepConfig,
    registry: StepRegistry,
    runs: Vec<RunState>,
    /// The registry's generation `runs` mirrors (runs are added and evicted).
    generation: Option<u64>,
    prev: Option<Prev>,
}

/// The previous tick, for energy baselines.
#[derive(Debug)]
struct Prev {
    at: u64,
    energy: Vec<(String, Option<f64>)>,
}

impl Prev {
    fn energy(&self, uuid: &str) -> Option<f64> {
        self.energy.iter().find(|(u, _)| u == uuid).and_then(|(_, e)| *e)
    }
}

#[derive(Debug)]
struct RunState {
    cell: Arc<RunCell>,
    /// Last step consumed.
    seen: Option<u64>,
    /// Unix nanos when the step in progress started; 0 = unknown.
    start: u64,
    acc: Acc,
    last_duration: Option<Duration>,
    last: Option<StepReport>,
}

/// Running figures over the samples overlapping the step in progress. Online, so a long step
/// costs no memory.
#[derive(Debug, Default)]
struct Acc {
    samples: u32,
    first_seq: u64,
    last_seq: u64,
    /// `taken_at` of the sample before the first one (the start of the covered time).
    base_at: Option<u64>,
    last_at: u64,
    devices: Vec<DevAcc>,
}

#[derive(Debug)]
struct DevAcc {
    uuid: String,
    /// Each sample's mean utilisation times its weight: the share of its interval that falls
    /// within the step (see [`share_before`]).
    util_sum: f64,
    util_weight: f64,
    util_max: Option<f64>,
    mem_peak: Option<u64>,
    energy_base: Option<f64>,
    energy_last: Option<f64>,
}

fn max_opt<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b > a { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

impl Acc {
    fn restart(&mut self, snapshot: &Snapshot, prev: Option<&Prev>, weight: f64) {
        self.samples = 0;
        self.devices.clear();
        self.add(snapshot, prev, weight);
    }

    /// Adds a sample, its utilisation weighted by `weight`: the share of its interval within
    /// the step (1 for a sample wholly inside it).
    fn add(&mut self, snapshot: &Snapshot, prev: Option<&Prev>, weight: f64) {
        if self.samples == 0 {
            self.first_seq = snapshot.seq;
            self.base_at = prev.map(|p| p.at);
        }
        self.samples += 1;
        self.last_seq = snapshot.seq;
        self.last_at = snapshot.timestamp_nanos();
        for device in &snapshot.devices {
            let uuid = device.info.uuid.as_str();
            let i = match self.devices.iter().position(|d| d.uuid == uuid) {
                Some(i) => i,
                None => {
                    self.devices.push(DevAcc {
                        uuid: uuid.to_owned(),
                        util_sum: 0.0,
                        util_weight: 0.0,
                        util_max: None,
                        mem_peak: None,
                        energy_base: prev.and_then(|p| p.energy(uuid)),
                        energy_last: None,
                    });
                    self.devices.len() - 1
                }
            };
            self.devices[i].add(device, weight);
        }
    }

    fn figures(&self, duration: Duration) -> Vec<DeviceStep> {
        let covered = self.base_at.map(|b| self.last_at.saturating_sub(b));
        self.devices
            .iter()
            .map(|d| {
                let energy = match (d.energy_base, d.energy_last, covered) {
                    (Some(base), Some(last), Some(covered)) if last >= base && covered > 0 => {
                        let share = (duration.as_nanos() as f64 / covered as f64).min(1.0);
                        Some((last - base) * share)
                    }
                    _ => None,
                };
                DeviceStep {
                    uuid: d.uuid.clone(),
                    utilization_mean: (d.util_weight > 0.0).then(|| d.util_sum / d.util_weight),
                    utilization_max: d.util_max,
                    memory_peak_bytes: d.mem_peak,
                    energy_joules: energy,
                }
            })
            .collect()
    }
}

impl DevAcc {
    fn add(&mut self, device: &DeviceSample, weight: f64) {
        let window = device.windows.gpu_utilization;
        if let Some(mean) = window.map(|w| w.mean).or(device.utilization.gpu) {
            self.util_sum += mean * weight;
            self.util_weight += weight;
        }
        self.util_max = max_opt(self.util_max, window.map(|w| w.max).or(device.utilization.gpu));
        self.mem_peak = max_opt(self.mem_peak, device.memory.used);
        if let Some(e) = device.power.energy_joules {
            self.energy_last = Some(e);
        }
    }
}

/// The share of a sample's interval (from the previous sample's time to `taken`, Unix nanos)
/// before the mark at `mark`: what of its utilisation belongs to the step the mark ends; the
/// rest belongs to the step it starts. `None` without a previous sample or with the mark
/// outside the interval: the sample then counts whole in both.
fn share_before(prev: Option<&Prev>, taken: u64, mark: u64) -> Option<f64> {
    let p = prev?;
    (taken > p.at && mark > p.at && mark <= taken).then(|| (mark - p.at) as f64 / (taken - p.at) as f64)
}

/// The durations of the steps completed at one tick, from the marks' times ([`RunCell::marked_at`]):
/// a step whose mark and whose previous step's mark are both still kept took the time between
/// them; the steps between two kept marks (older ones overwritten by a loop marking more than
/// [`MARK_SLOTS`] steps a tick, or numbers the loop skipped) share that stretch evenly.
#[derive(Debug)]
struct StepTimes {
    /// `(last step of the stretch, each step's duration)`, ascending; the first stretch starts
    /// at the first step completed.
    stretches: Vec<(u64, Duration)>,
}

impl StepTimes {
    /// The `k` steps up to `last`, the first of which started at `start`; `at` is the last mark.
    fn read(cell: &RunCell, last: u64, k: u64, start: u64, at: u64) -> Self {
        let first = last + 1 - k;
        let mut stretches = Vec::new();
        // (step, time) of the previous boundary: the end of step `first − 1` is `start` (step
        // numbers wrap here, for a first step 0; `s − prev.0` is then `s + 1`).
        let mut prev = (first.wrapping_sub(1), start);
        let kept_from = first.max(last.saturating_sub(MARK_SLOTS as u64 - 1));
        for s in kept_from..=last {
            let time = if s == last { Some(at) } else { cell.marked_at(s) };
            // A mark older than the previous boundary (concurrent callers) is not a boundary.
            if let Some(time) = time.filter(|t| *t >= prev.1) {
                let steps = s.wrapping_sub(prev.0);
                stretches.push((s, Duration::from_nanos((time - prev.1) / steps)));
                prev = (s, time);
            }
        }
        Self { stretches }
    }

    /// How long step `s` (one of the steps read) took.
    fn of(&self, s: u64) -> Duration {
        let at = self.stretches.partition_point(|(end, _)| *end < s);
        self.stretches.get(at).or(self.stretches.last()).map_or(Duration::ZERO, |(_, d)| *d)
    }
}

impl StepTracker {
    pub(super) fn with(config: StepConfig, registry: StepRegistry) -> Self {
        Self { config, registry, runs: Vec::new(), generation: None, prev: None }
    }

    /// The registry this tracker reads (another handle to the one [`StepTracker::new`] returned).
    pub fn registry(&self) -> &StepRegistry {
        &self.registry
    }

    /// The configuration.
    pub fn config(&self) -> StepConfig {
        self.config
    }

    /// Keeps this tick's time and energy counters as the next tick's baseline.
    fn remember(&mut self, snapshot: &Snapshot) {
        let prev = self.prev.get_or_insert_with(|| Prev { at: 0, energy: Vec::new() });
        prev.at = snapshot.timestamp_nanos();
        prev.energy.clear();
        prev.energy.extend(snapshot.devices.iter().map(|d| (d.info.uuid.clone(), d.power.energy_joules)));
    }

    /// Mirrors the registry's table: new runs get a fresh state, evicted runs' states go, and
    /// every other run keeps its state (matched by cell, not by position).
    fn sync_runs(&mut self) {
        let shared = &self.registry.shared;
        if self.generation == Some(shared.generation.load(Ordering::Acquire)) {
            return;
        }
        let runs = shared.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.generation = Some(shared.generation.load(Ordering::Acquire));
        let mut old = std::mem::take(&mut self.runs);
        for cell in runs.iter() {
            let state = match old.iter().position(|s| Arc::ptr_eq(&s.cell, cell)) {
                Some(i) => old.swap_remove(i),
                None => RunState {
                    cell: Arc::clone(cell),
                    seen: None,
                    start: cell.created,
                    acc: Acc::default(),
                    last_duration: None,
                    last: None,
                },
            };
            self.runs.push(state);
        }
    }
}

impl RunState {
    /// The steps this sample completes, up to `last` (marked at `at`): the sample is added to
    /// the period, and each completed step due a report (every `every_n`th) gets one.
    fn complete(&mut self, snapshot: &Snapshot, prev: Option<&Prev>, every_n: u64, last: u64, at: u64) -> Completed {
        // This sample covers the end of the step(s): it belongs to them, and also to
        // the step that began at the mark — each by the share of its interval on its side of
        // the mark. A loop's wait sits at that boundary (the loader's, between the mark and the
        // next batch's kernels): counted whole in both steps, it read each step idler than it
        // was (fit-set seed 0x83 of the simulator: 81 % busy by the steps, 87 % by the readings).
        let before = share_before(prev, snapshot.timestamp_nanos(), at);
        self.acc.add(snapshot, prev, before.unwrap_or(1.0));
        // Steps completed since the last report; in the first period, every step
        // from the first one marked (a mark of the first one may not be the latest).
        let mut k = match self.seen {
            Some(seen) => last - seen,
            None => self.cell.first().map_or(1, |first| last.saturating_sub(first) + 1),
        };
        let mut start = self.start;
        if start == 0 && self.seen.is_none() {
            // No creation time (a run registered over the steps socket): the first
            // mark starts the steps after it, which are all reported; only the
            // first step's own start is unknown.
            let first_at = self.cell.first_at.load(Ordering::Acquire);
            if let Some(first) = self.cell.first().filter(|f| last > *f && first_at != 0) {
                start = first_at;
                k = last - first;
            }
        }
        let durations = (start != 0).then(|| StepTimes::read(&self.cell, last, k, start, at));
        self.last_duration = durations.as_ref().map(|d| d.of(last));
        let mut done = Completed { share_before: before, ..Completed::default() };
        if let Some(durations) = durations {
            done.count = k;
            done.duration = Some(Duration::from_nanos(at.saturating_sub(start)));
            let first = last + 1 - k;
            let from = first.max(last.saturating_sub(MAX_REPORTS_PER_TICK - 1));
            let mut single: Option<Acc> = None;
            let mut s = from.div_ceil(every_n) * every_n;
            while s <= last {
                let duration = durations.of(s);
                let report = if s == first {
                    StepReport {
                        step: s,
                        duration,
                        first_seq: self.acc.first_seq,
                        last_seq: self.acc.last_seq,
                        devices: self.acc.figures(duration),
                    }
                } else {
                    // Later steps of the same period overlap only this sample.
                    let one = single.get_or_insert_with(|| {
                        let mut a = Acc::default();
                        a.restart(snapshot, prev, 1.0);
                        a
                    });
                    StepReport {
                        step: s,
                        duration,
                        first_seq: one.first_seq,
                        last_seq: one.last_seq,
                        devices: one.figures(duration),
                    }
                };
                done.reports.push(report);
                s += every_n;
            }
        }
        done
    }
}

/// What [`RunState::complete`] found in one sample: the reports due, how many steps completed
/// and the time they took together (none when the period's start is unknown).
#[derive(Default)]
struct Completed {
    reports: Vec<StepReport>,
    count: u64,
    duration: Option<Duration>,
    /// The share of the sample's interval before the last mark (see [`share_before`]): the
    /// rest is the next step's.
    share_before: Option<f64>,
}

impl Processor for StepTracker {
    fn name(&self) -> &str {
        "steps"
    }

    fn process(&mut self, snapshot: &mut Snapshot) {
        self.sync_runs();
        let rejected = self.registry.rejections();
        if self.runs.is_empty() {
            if rejected.is_some() {
                snapshot.outputs.insert(Arc::new(Steps { runs: Vec::new(), rejected }));
            }
            self.remember(snapshot);
            return;
        }
        let t = snapshot.timestamp_nanos();
        let every_n = self.config.every_n;
        let prev = self.prev.as_ref();
        let mut out = Vec::with_capacity(self.runs.len());
        for run in &mut self.runs {
            let stored = run.cell.step.load(Ordering::Acquire);
            let at = run.cell.at.load(Ordering::Acquire);
            let marked = stored.checked_sub(1).filter(|s| run.seen.is_none_or(|seen| *s > seen));
            let gpus = run.cell.gpus();
            // Marks from another process without `gpu`: rank r drives GPU r when this snapshot
            // has it (docs/steps.md); else the run is every GPU's that no other run drives
            // (`Steps::for_gpu`). A run of the sampling process covers what it chose to sample.
            let rank_gpu = run.cell.rank.filter(|r| {
                gpus.is_none() && run.cell.marked_elsewhere() && snapshot.devices.iter().any(|d| d.info.index == *r)
            });
            let mut done = Completed::default();
            match marked {
                Some(last) if at <= t => {
                    done = run.complete(snapshot, prev, every_n, last, at);
                    // Figures for the GPUs the run drives only: another job's GPUs (or another
                    // rank's) are not this run's steps, nor its energy.
                    let drives = |info: &crate::model::DeviceInfo| match (&gpus, rank_gpu) {
                        (Some(named), _) => named.allows(info),
                        (None, Some(rank)) => info.index == rank,
                        (None, None) => true,
                    };
                    // A run that drives every GPU keeps every report whole (no per-device scan).
                    if gpus.is_some() || rank_gpu.is_some() {
                        for report in &mut done.reports {
                            report
                                .devices
                                .retain(|d| snapshot.devices.iter().any(|s| s.info.uuid == d.uuid && drives(&s.info)));
                        }
                    }
                    if let Some(r) = done.reports.last() {
                        run.last = Some(r.clone());
                    }
                    run.seen = Some(last);
                    run.start = at;
                    run.acc.restart(snapshot, prev, done.share_before.map_or(1.0, |before| 1.0 - before));
                }
                _ => run.acc.add(snapshot, prev, 1.0),
            }
            out.push(RunSteps {
                job: run.cell.job.to_string(),
                rank: run.cell.rank,
                rank_label: run.cell.rank_label.to_string(),
                last_step: run.seen,
                last_duration: run.last_duration,
                last: run.last.clone(),
                reported: done.reports,
                completed: done.count,
                completed_duration: done.duration,
                registered_by: run.cell.peer(),
                gpus: match (&gpus, rank_gpu) {
                    (Some(named), _) => {
                        let mut indices: Vec<u32> =
                            snapshot.devices.iter().filter(|d| named.allows(&d.info)).map(|d| d.info.index).collect();
                        indices.sort_unstable();
                        indices.dedup();
                        Some(indices)
                    }
                    (None, Some(rank)) => Some(vec![rank]),
                    (None, None) => None,
                },
            });
        }
        snapshot.outputs.insert(Arc::new(Steps { runs: out, rejected }));
        self.remember(snapshot);
    }
}

//! [`RunReport`], the processor, its shared state, and [`ReportHandle`] to read it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::model::Snapshot;
use crate::stages::diagnose::finding::{FindingKind, Transition};
use crate::stages::diagnose::{limitations, DiagnoseConfig, Sampling, Thresholds};
use crate::stages::{Processor, ProcessorContext};

use super::accumulate::{close, finish, idle_while_allocated, peers_wait, raised, slot, GpuAcc, Held};
use super::model::{CauseReport, GpuReport, Overview, Report, REPORT_FORMAT};
use super::step_figures::{steps_report, RunAcc};

#[derive(Debug)]
pub(super) struct State {
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
            diagnosis_window_seconds: self.diagnosis.as_ref().map(|(config, _)| config.window.as_secs_f64()),
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
    /// let sampling = Sampling::new(Duration::from_secs(1), MetricSet::default().with_stage_inputs());
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

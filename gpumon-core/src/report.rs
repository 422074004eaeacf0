//! The run report: "run my job under gpumon and tell me what went wrong".
//!
//! [`RunReport`] is a [`Processor`] that accumulates, per GPU, what a user wants to know after a
//! run — utilisation (mean, p5, p95), peak memory, mean power, energy used, the GPU-time spent
//! idle while memory was allocated — and every finding the diagnosis stage raised, with how long
//! it held. Add it **after** the [`Diagnoser`](crate::diagnose::Diagnoser) (processors run in
//! the order they were added, and the report reads the diagnosis events of each tick), keep the
//! [`ReportHandle`], and call [`ReportHandle::report`] when the run ends.
//!
//! What is measured, exactly:
//! - **Utilisation** is the diagnosis "level": the driver's high-resolution mean over the
//!   interval when the sample carries one, else the instantaneous `utilization.gpu`. Percentiles
//!   come from a fixed histogram of 1 001 bins (0.1 % wide, nearest rank), allocated once per
//!   GPU, so accumulating allocates nothing per tick.
//! - **Energy** is the sum of the increases of the driver's energy counter between consecutive
//!   ticks; without that counter (or with fewer than two readings), power × interval summed
//!   over the ticks. [`GpuReport::energy_source`] says which.
//! - **Idle while allocated** counts ticks whose level is at or below `idle_level` (5 %) while
//!   memory used is at least `allocated_memory_ratio` (10 %) of the total — the diagnosis
//!   thresholds, see [`RunReport::with_thresholds`] — times the interval.
//! - **Findings**: each raise is one entry; its held time runs from the tick that raised it to
//!   the tick that cleared it, or — still active — to the last tick seen.
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
//! assert_eq!(r.gpus[0].energy_joules, Some(900.0)); // no counter: 3 ticks × 300 W × 1 s
//! println!("{r}"); // the human summary
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::diagnose::Thresholds;
use crate::finding::{FindingKind, Severity, Transition};
use crate::model::{DeviceSample, Snapshot};
use crate::processor::{Processor, ProcessorContext};

/// Histogram bins per unit of utilisation: 0.1 % resolution.
const BINS_PER_UNIT: usize = 1000;

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
    /// Ticks idle (level ≤ `idle_level`) while memory was allocated.
    pub idle_allocated_ticks: u64,
    /// Those ticks × the interval, seconds of GPU time.
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
    /// Host name of the last snapshot.
    pub hostname: String,
    /// Ticks (snapshots) seen.
    pub ticks: u64,
    /// The sampling interval, seconds.
    pub interval_seconds: f64,
    /// Wall time from the first to the last tick, seconds.
    pub wall_seconds: f64,
    /// Per GPU, ordered by index (then UUID).
    pub gpus: Vec<GpuReport>,
    /// Findings about the host rather than one GPU.
    pub host_findings: Vec<FindingReport>,
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
    findings: Vec<Held>,
}

impl GpuAcc {
    fn new(d: &DeviceSample) -> Self {
        Self {
            index: d.info.index,
            name: d.info.name.clone(),
            samples: 0,
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
            findings: Vec::new(),
        }
    }

    fn add(&mut self, d: &DeviceSample, interval: f64, idle_level: f64, allocated_ratio: f64) {
        if !d.is_up() {
            // A lost GPU breaks the energy counter's chain: a reset may restart it.
            self.last_counter = None;
            return;
        }
        self.samples += 1;
        let level = d.windows.gpu_utilization.map(|w| w.mean).or(d.utilization.gpu);
        if let Some(l) = level {
            self.util.add(l);
            self.util_sum += l;
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
        let allocated =
            matches!((d.memory.used, total), (Some(u), Some(t)) if t > 0 && u as f64 / t as f64 >= allocated_ratio);
        if allocated && level.is_some_and(|l| l <= idle_level) {
            self.idle_ticks += 1;
        }
    }

    fn report(&self, uuid: &str, interval: f64, last: Option<SystemTime>) -> GpuReport {
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
            utilization_mean: (n > 0).then(|| self.util_sum / n as f64),
            utilization_p5: self.util.percentile(5.0),
            utilization_p95: self.util.percentile(95.0),
            memory_peak_bytes: self.memory_peak,
            memory_total_bytes: self.memory_total,
            power_mean_watts: (self.power_n > 0).then(|| self.power_sum / self.power_n as f64),
            energy_joules: energy,
            energy_source: source,
            idle_allocated_ticks: self.idle_ticks,
            idle_allocated_seconds: self.idle_ticks as f64 * interval,
            findings: self.findings.iter().map(|h| finish(h, last)).collect(),
        }
    }
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
    hostname: String,
    ticks: u64,
    first: Option<SystemTime>,
    last: Option<SystemTime>,
    gpus: HashMap<String, GpuAcc>,
    host_findings: Vec<Held>,
}

impl State {
    fn findings_of(&mut self, uuid: Option<&str>) -> Option<&mut Vec<Held>> {
        match uuid {
            None => Some(&mut self.host_findings),
            Some(u) => self.gpus.get_mut(u).map(|g| &mut g.findings),
        }
    }

    fn report(&self) -> Report {
        let interval = self.interval.as_secs_f64();
        let mut gpus: Vec<GpuReport> = self.gpus.iter().map(|(u, g)| g.report(u, interval, self.last)).collect();
        gpus.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
        let wall = match (self.first, self.last) {
            (Some(a), Some(b)) => b.duration_since(a).map_or(0.0, |d| d.as_secs_f64()),
            _ => 0.0,
        };
        Report {
            hostname: self.hostname.clone(),
            ticks: self.ticks,
            interval_seconds: interval,
            wall_seconds: wall,
            gpus,
            host_findings: self.host_findings.iter().map(|h| finish(h, self.last)).collect(),
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
        self.state.lock().unwrap_or_else(PoisonError::into_inner).report()
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
            hostname: String::new(),
            ticks: 0,
            first: None,
            last: None,
            gpus: HashMap::new(),
            host_findings: Vec::new(),
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
        s.first.get_or_insert(snapshot.taken_at);
        s.last = Some(snapshot.taken_at);
        if s.hostname != snapshot.system.hostname {
            s.hostname.clone_from(&snapshot.system.hostname);
        }
        let interval = s.interval.as_secs_f64();
        for d in &snapshot.devices {
            let acc = match s.gpus.get_mut(d.info.uuid.as_str()) {
                Some(acc) => acc,
                None => s.gpus.entry(d.info.uuid.clone()).or_insert_with(|| GpuAcc::new(d)),
            };
            acc.add(d, interval, s.idle_level, s.allocated_ratio);
        }
        let Some(diagnosis) = &snapshot.diagnosis else { return };
        let at = snapshot.taken_at;
        for event in &diagnosis.events {
            let f = &event.finding;
            let Some(list) = s.findings_of(f.uuid.as_deref()) else { continue };
            match event.transition {
                Transition::Raised => list.push(Held {
                    report: FindingReport {
                        kind: f.kind,
                        severity: f.severity,
                        raised_at: at,
                        held_seconds: 0.0,
                        active_at_exit: false,
                        evidence: f.evidence.clone(),
                        advice: f.advice.clone(),
                    },
                    open: true,
                }),
                Transition::Cleared => {
                    if let Some(h) = list.iter_mut().rev().find(|h| h.open && h.report.kind == f.kind) {
                        h.open = false;
                        h.report.held_seconds = event
                            .held_for
                            .or_else(|| at.duration_since(h.report.raised_at).ok())
                            .map_or(0.0, |d| d.as_secs_f64());
                    }
                }
            }
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / 1_073_741_824.0
}

fn write_finding(f: &mut fmt::Formatter<'_>, r: &FindingReport) -> fmt::Result {
    write!(f, "    {} ({}) held {:.1} s", r.kind, r.severity, r.held_seconds)?;
    if r.active_at_exit {
        f.write_str(", still active at exit")?;
    }
    writeln!(f)?;
    if !r.evidence.is_empty() {
        writeln!(f, "      evidence: {}", r.evidence)?;
    }
    writeln!(f, "      advice: {}", r.advice)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "gpumon run report: host {}, {} tick(s) over {:.1} s, interval {} s",
            self.hostname, self.ticks, self.wall_seconds, self.interval_seconds
        )?;
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
                "  idle while allocated  {:.1} s ({} tick(s))",
                g.idle_allocated_seconds, g.idle_allocated_ticks
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

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::diagnose::{DiagnoseConfig, Diagnoser};
    use crate::finding::{Diagnosis, Finding, FindingEvent};
    use crate::model::{DeviceInfo, DeviceState, SystemInfo};

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
        let expected: f64 = power.iter().map(|p| p * 0.25).sum();
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
        let idle = ticks.iter().filter(|(u, used)| *u <= 0.05 && *used as f64 / total as f64 >= 0.10).count() as u64;
        let g = &handle.report().gpus[0];
        assert_eq!(g.index, 3);
        assert_eq!(g.idle_allocated_ticks, idle);
        assert_eq!(g.idle_allocated_seconds, idle as f64 * 0.1);
        assert_eq!(g.memory_peak_bytes, ticks.iter().map(|t| t.1).max());
        assert_eq!(g.memory_total_bytes, Some(total));
    }

    #[test]
    fn tuned_thresholds_change_what_counts_as_idle() {
        let interval = Duration::from_secs(1);
        let (report, handle) = RunReport::new();
        let mut t = Thresholds::default();
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
            s.diagnosis = Some(Diagnosis { events, ..Diagnosis::default() });
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
            if s.diagnosis.as_ref().is_some_and(|dg| !dg.events.is_empty()) {
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
                s.diagnosis = Some(Diagnosis {
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
        assert!(text.contains("energy 0.8 kJ"), "{text}");
        assert!(text.contains("idle_allocated (warning) held 2.0 s, still active at exit"), "{text}");
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_string(&r).unwrap();
            let back: Report = serde_json::from_str(&json).unwrap();
            assert_eq!(back, r);
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(v["gpus"][0]["findings"][0]["kind"], "idle_allocated");
            assert_eq!(v["gpus"][0]["energy_source"], "integrated_power");
        }
    }
}

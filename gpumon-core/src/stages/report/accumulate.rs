//! Per-GPU accumulation: utilisation histogram, idle while allocated, findings held and the time they lost.

use std::time::{Duration, SystemTime};

use crate::model::DeviceSample;
use crate::stages::diagnose::finding::{FindingEvent, FindingKind, Transition};

use super::model::{EnergySource, FindingReport, GpuReport};

/// Histogram bins per unit of utilisation: 0.1 % resolution.
pub(super) const BINS_PER_UNIT: usize = 1000;

/// How many finding kinds there are: one bit each in [`GpuAcc::open`].
pub(crate) const KINDS: usize = FindingKind::ALL.len();
const _: () = assert!(KINDS <= 32, "GpuAcc::open is a u32");

/// Position of `kind` in [`FindingKind::ALL`].
pub(crate) fn slot(kind: FindingKind) -> usize {
    FindingKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

/// A fixed histogram of ratios in `0.0..=1.0`.
#[derive(Clone, Debug)]
pub(super) struct Histogram {
    pub(super) bins: Box<[u32]>,
    pub(super) count: u64,
}

impl Histogram {
    pub(super) fn new() -> Self {
        Self { bins: vec![0; BINS_PER_UNIT + 1].into_boxed_slice(), count: 0 }
    }

    pub(super) fn add(&mut self, v: f64) {
        let bin = (v.clamp(0.0, 1.0) * BINS_PER_UNIT as f64).round() as usize;
        self.bins[bin.min(BINS_PER_UNIT)] = self.bins[bin.min(BINS_PER_UNIT)].saturating_add(1);
        self.count += 1;
    }

    /// Nearest-rank percentile `p` (0–100): the smallest value with at least `ceil(p/100 × n)`
    /// values at or below it.
    pub(super) fn percentile(&self, p: f64) -> Option<f64> {
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
pub(super) struct Held {
    pub(super) report: FindingReport,
    pub(super) open: bool,
}

/// Everything accumulated for one GPU.
#[derive(Debug)]
pub(super) struct GpuAcc {
    pub(super) index: u32,
    pub(super) name: String,
    pub(super) samples: u64,
    pub(super) observed_seconds: f64,
    pub(super) util: Histogram,
    pub(super) util_sum: f64,
    pub(super) memory_peak: Option<u64>,
    pub(super) memory_total: Option<u64>,
    pub(super) power_sum: f64,
    pub(super) power_n: u64,
    pub(super) power_integral: f64,
    pub(super) last_counter: Option<f64>,
    pub(super) counter_joules: f64,
    pub(super) counter_deltas: u64,
    pub(super) idle_ticks: u64,
    pub(super) allocated_seconds: f64,
    pub(super) idle_seconds: f64,
    /// Driver samples in the high-resolution windows, and the ticks since the first window.
    pub(super) driver_samples: u64,
    pub(super) driver_ticks: u64,
    /// Whether the GPU ever read a level, ever read GPM's SM activity, and held memory on a
    /// tick with no level (a MIG instance without GPM): for the limitations.
    pub(super) level_seen: bool,
    pub(super) sm_activity_seen: bool,
    pub(super) held_without_level: bool,
    pub(super) findings: Vec<Held>,
    /// Bit `k` set: a finding of kind `k` (in [`FindingKind::ALL`] order) is open, and
    /// `open_at[k]` is its position in `findings`.
    pub(super) open: u32,
    pub(super) open_at: [usize; KINDS],
}

impl GpuAcc {
    pub(super) fn new(d: &DeviceSample) -> Self {
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
    pub(super) fn add(
        &mut self,
        d: &DeviceSample,
        interval: f64,
        idle_level: f64,
        allocated_ratio: f64,
        peers_wait: f64,
    ) {
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
    pub(super) fn charge(&mut self, cost: impl Fn(FindingKind) -> f64) {
        let mut bits = self.open;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(h) = self.findings.get_mut(self.open_at[k]) {
                h.report.lost_gpu_seconds += cost(FindingKind::ALL[k]);
            }
        }
    }

    pub(super) fn event(&mut self, event: &FindingEvent, at: SystemTime) {
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

    pub(super) fn report(&self, uuid: &str, last: Option<SystemTime>) -> GpuReport {
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
pub(crate) fn is_allocated(d: &DeviceSample, ratio: f64) -> bool {
    let total = d.memory.total.or(d.info.memory_total_bytes);
    !d.processes.is_empty()
        || matches!((d.memory.used, total), (Some(u), Some(t)) if t > 0 && u as f64 / t as f64 >= ratio)
}

/// The GPU-time `d` idled over `span` seconds while allocated; `None` when it is down, not
/// allocated or without a level.
pub(crate) fn idle_while_allocated(d: &DeviceSample, span: f64, ratio: f64) -> Option<f64> {
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
pub(crate) fn peers_wait(devices: &[DeviceSample], idle: &[Option<f64>], at: usize) -> f64 {
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
pub(crate) fn lost(kind: FindingKind, d: &DeviceSample, busy: Option<f64>, interval: f64, peers_wait: f64) -> f64 {
    use FindingKind as K;
    match kind {
        K::DataloaderStarvation
        | K::PipelineBubbles
        | K::StarvationOrBubbles
        | K::IdleAllocated
        | K::Imbalance
        | K::ImbalanceOrOwnJob
        // Whether the GPUs it falls behind wait for it is what cannot be told: its own idle
        // time only.
        | K::StragglerOrOwnJob
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
pub(super) fn raised(event: &FindingEvent, at: SystemTime) -> Held {
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
pub(super) fn close(h: &mut Held, at: SystemTime, held_for: Option<Duration>) {
    h.open = false;
    h.report.held_seconds =
        held_for.or_else(|| at.duration_since(h.report.raised_at).ok()).map_or(0.0, |d| d.as_secs_f64());
}

/// A finding's entry as of `last`: open ones are held until the last tick.
pub(super) fn finish(h: &Held, last: Option<SystemTime>) -> FindingReport {
    let mut r = h.report.clone();
    if h.open {
        r.active_at_exit = true;
        r.held_seconds = last.and_then(|l| l.duration_since(r.raised_at).ok()).map_or(0.0, |d| d.as_secs_f64());
    }
    r
}

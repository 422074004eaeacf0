//! The rules: what each finding looks at on one tick, and how it explains itself.
//!
//! Every rule answers one question per device and tick — "does my condition hold now?" — from
//! [`TickStats`] (the few numbers diagnosis needs, copied out of the sample) and the host
//! context (the busiest other GPU). The window keeps a smaller [`Past`] of each tick: what
//! evidence and the multi-tick rules read back. Turning those answers into raised and cleared findings
//! (the window, the hysteresis) is the job of `mod.rs`, the same for every rule.

use std::fmt::Write as _;
use std::time::SystemTime;

use crate::model::{ClockEventReasons, DeviceSample};
use crate::stages::diagnose::finding::{FindingKind, Severity};

use super::window::{Extremes, Ring};
use super::Thresholds;

/// What diagnosis reads from one device at one tick. Read once per device per tick into a
/// scratch vector reused from tick to tick; the window keeps its smaller [`Past`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct TickStats {
    pub(crate) at: SystemTime,
    pub(crate) up: bool,
    /// Runtime-suspended: present, asleep, nothing to judge (not a lost GPU).
    pub(crate) asleep: bool,
    /// Utilisation over the interval: the high-resolution mean when the driver buffered
    /// samples, else the instantaneous value.
    pub(crate) level: Option<f64>,
    /// Instantaneous utilisation.
    pub(crate) util: Option<f64>,
    pub(crate) hires_min: Option<f64>,
    pub(crate) hires_max: Option<f64>,
    pub(crate) memory_controller: Option<f64>,
    pub(crate) sm_activity: Option<f64>,
    pub(crate) dram: Option<f64>,
    pub(crate) memory_used: Option<u64>,
    pub(crate) memory_total: Option<u64>,
    pub(crate) power: Option<f64>,
    pub(crate) power_limit: Option<f64>,
    pub(crate) temperature: Option<f64>,
    pub(crate) temperature_slowdown: Option<f64>,
    pub(crate) sm_clock: Option<f64>,
    pub(crate) sm_clock_max: Option<f64>,
    pub(crate) reasons: Option<u64>,
    pub(crate) pcie_peak_bytes_per_second: Option<f64>,
    pub(crate) pcie_link_bytes_per_second: Option<f64>,
    /// Processes on the device, when processes are sampled.
    pub(crate) processes: Option<usize>,
    /// New uncorrected ECC errors since the previous tick.
    pub(crate) ecc_new: u64,
    /// New XID events since the previous tick, and the code of the last one.
    pub(crate) xid_new: u64,
    pub(crate) xid_code: Option<u64>,
    /// A row remapping is pending or failed.
    pub(crate) remap_trouble: bool,
    /// New NVLink CRC / replay / recovery errors (all links) since the previous tick.
    pub(crate) nvlink_errors_new: u64,
    /// NVLink links down this tick.
    pub(crate) nvlink_down: u64,
    /// The GPU's mean utilisation over the training steps its run reported at this tick (see
    /// [`Steps::for_gpu`](crate::steps::Steps::for_gpu)); `None` without a step reported.
    pub(crate) step_level: Option<f64>,
    /// How long the run's last step took, seconds, when the GPU's run marks steps.
    pub(crate) step_secs: Option<f64>,
    /// The driver's utilisation sampling period as observed (the interval over the driver
    /// samples per interval, averaged over recent ticks); `None` before any was seen.
    pub(crate) driver_period: Option<f64>,
    /// Busy on every tick of its window while its clocks are held down (thermal, power or
    /// external slowdown): a GPU the others may be waiting for (see [`HostContext::slowed`]).
    pub(crate) slowed_busy: bool,
    /// Busy on every tick of its window, with no slowdown reason, while every other allocated
    /// GPU (two at least) goes busy and idle in turn: the one GPU the others wait for at each
    /// step (another process on it, a larger share of the work), named `straggler`.
    pub(crate) paces_peers: bool,
    /// The level is GPM's SM activity: the device reads no utilisation (a MIG instance).
    pub(crate) level_from_gpm: bool,
    /// Busy on every reading of its window so far, with fewer readings than "busy throughout"
    /// needs: possibly a GPU its peers wait for (see [`HostContext::pending_busy`]).
    pub(crate) pending_busy: bool,
    /// Who runs on the GPU, when processes are sampled with attribution and every process on
    /// it has the same known owner (a hash of it); `None` otherwise.
    pub(crate) owner: Option<u64>,
}

/// What the window keeps of one tick: the numbers evidence averages and the multi-tick rules
/// read back, and nothing that only the current tick needs.
///
/// Kept small on purpose. The window holds `window / interval` of these per GPU (300 at 100 ms),
/// and until it is full every tick writes one where the process never wrote before: a cache miss
/// per line, a page fault per page. This is 168 bytes on x86-64; [`TickStats`], with its
/// `Option<f64>`s, 424 (a test holds that it is more than twice the size).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Past {
    pub(crate) at: SystemTime,
    pub(crate) util: Reading,
    pub(crate) level: Reading,
    pub(crate) hires_min: Reading,
    pub(crate) hires_max: Reading,
    pub(crate) memory_controller: Reading,
    pub(crate) sm_activity: Reading,
    pub(crate) dram: Reading,
    pub(crate) power: Reading,
    pub(crate) sm_clock: Reading,
    pub(crate) pcie_peak_bytes_per_second: Reading,
    pub(crate) temperature: Reading,
    /// Bytes, exact in an `f64` up to 8 PiB.
    pub(crate) memory_used: Reading,
    /// Clock-event reason bits; 0 when none were read (no bit is set either way).
    pub(crate) reasons: u64,
    pub(crate) ecc_new: u64,
    pub(crate) xid_new: u64,
    pub(crate) nvlink_errors_new: u64,
    /// The code of the tick's last XID, when it had one.
    pub(crate) xid_code: Reading,
    /// The mean utilisation of the steps reported at the tick.
    pub(crate) step_level: Reading,
    pub(crate) remap_trouble: bool,
    /// The latest reading was near idle and so were most other allocated GPUs' (see
    /// [`Swings`]): idle *together*, as data-parallel ranks starved by their loaders are.
    pub(crate) idle_together: bool,
}

impl Past {
    fn has_reason(&self, bits: u64) -> bool {
        self.reasons & bits != 0
    }
}

/// An `Option<f64>` in 8 bytes instead of 16: NaN stands for "not read". A NaN reading from a
/// backend is not a number to average either, so it reads back as absent too.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading(f64);

impl Reading {
    pub(crate) fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }
}

impl From<Option<f64>> for Reading {
    fn from(v: Option<f64>) -> Self {
        Reading(v.unwrap_or(f64::NAN))
    }
}

/// Counters kept from one tick to the next to turn totals into "new since last tick".
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    ecc_uncorrected: Option<u64>,
    xid_total: Option<u64>,
    nvlink_errors: Option<u64>,
}

impl TickStats {
    pub(crate) fn read(d: &DeviceSample, at: SystemTime, counters: &mut Counters) -> Self {
        let info = &*d.info;
        let hires = d.windows.gpu_utilization;
        // NVML reads no utilisation for a MIG instance (nor for a GPU sampled without it); GPM's
        // SM activity, where there is GPM (Hopper and later, MIG instances included), is the
        // level then. It reads at or below utilisation (the share of SMs busy, not whether any
        // kernel runs): an idle instance reads idle either way, and a busy one reads busy or
        // less — no rule raises on it what utilisation would not have.
        let level_from_gpm = d.utilization.gpu.is_none() && hires.is_none() && d.gpm.sm_activity.is_some();
        let util = if level_from_gpm { d.gpm.sm_activity } else { d.utilization.gpu };
        let link = match (d.pcie.link_generation, d.pcie.link_width) {
            (Some(g), Some(w)) => lane_bytes_per_second(g).map(|b| b * f64::from(w)),
            _ => None,
        };
        let pcie_peak = match (d.pcie.tx_bytes_per_second, d.pcie.rx_bytes_per_second) {
            (Some(t), Some(r)) => Some(t.max(r)),
            (t, r) => t.or(r),
        };
        let ecc = d.ecc.uncorrected;
        let ecc_new = match (counters.ecc_uncorrected, ecc) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => 0,
        };
        if ecc.is_some() {
            counters.ecc_uncorrected = ecc;
        }
        let xid_total = d.xid_errors.iter().map(|x| x.count).sum::<u64>();
        // The first tick has no "before": errors seen before diagnosis started are history, not
        // news (the ECC and XID totals stay visible in their own series).
        let xid_new = if d.is_up() {
            let new = counters.xid_total.map_or(0, |before| xid_total.saturating_sub(before));
            counters.xid_total = Some(xid_total);
            new
        } else {
            0
        };
        let xid_code = d.xid_errors.iter().max_by_key(|x| x.last_seen).map(|x| x.code);
        // NVLink error counters, like ECC: only growth is news.
        let nvlink_errors = d.nvlink.as_ref().map(|n| n.total_errors());
        let nvlink_errors_new = match (counters.nvlink_errors, nvlink_errors) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => 0,
        };
        if nvlink_errors.is_some() {
            counters.nvlink_errors = nvlink_errors;
        }
        let nvlink_down = d.nvlink.as_ref().map_or(0, |n| n.links.len() as u64 - n.links_up());
        Self {
            at,
            up: d.is_up(),
            asleep: d.state == crate::model::DeviceState::Suspended,
            level: level_of(d),
            util,
            hires_min: hires.map(|w| w.min),
            hires_max: hires.map(|w| w.max),
            memory_controller: d.windows.memory_utilization.map(|w| w.mean).or(d.utilization.memory),
            sm_activity: d.gpm.sm_activity,
            dram: d.gpm.dram_bandwidth,
            memory_used: d.memory.used,
            memory_total: d.memory.total.or(info.memory_total_bytes),
            power: d.windows.power_watts.map(|w| w.mean).or(d.power.usage_watts),
            power_limit: d.power.limit_watts,
            temperature: d.temperature.gpu,
            temperature_slowdown: info.temperature_slowdown_celsius,
            sm_clock: d.clocks.sm,
            sm_clock_max: info.max_clocks.sm,
            reasons: d.clock_event_reasons.map(|r| r.0),
            pcie_peak_bytes_per_second: pcie_peak,
            pcie_link_bytes_per_second: link,
            processes: if d.processes.is_empty() { None } else { Some(d.processes.len()) },
            ecc_new,
            xid_new,
            xid_code,
            remap_trouble: d.ecc.remapped_rows_pending == Some(true) || d.ecc.remapped_rows_failure == Some(true),
            nvlink_errors_new,
            nvlink_down,
            step_level: None,
            step_secs: None,
            driver_period: None,
            slowed_busy: false,
            paces_peers: false,
            level_from_gpm,
            pending_busy: false,
            owner: sole_owner(d).map(owner_hash),
        }
    }

    /// What the window keeps of this tick; `idle_together` from the host's other GPUs.
    /// This tick's lowest and highest reading for [`Extremes`]: its driver samples' within the
    /// interval, else the latest reading (NaN is none).
    pub(crate) fn reading_extremes(&self) -> (Option<f64>, Option<f64>) {
        let real = |v: Option<f64>| v.filter(|v| !v.is_nan());
        (real(self.hires_min.or(self.util)), real(self.hires_max.or(self.util)))
    }

    pub(crate) fn past(&self, idle_together: bool) -> Past {
        Past {
            at: self.at,
            util: self.util.into(),
            level: self.level.into(),
            hires_min: self.hires_min.into(),
            hires_max: self.hires_max.into(),
            memory_controller: self.memory_controller.into(),
            sm_activity: self.sm_activity.into(),
            dram: self.dram.into(),
            power: self.power.into(),
            sm_clock: self.sm_clock.into(),
            pcie_peak_bytes_per_second: self.pcie_peak_bytes_per_second.into(),
            temperature: self.temperature.into(),
            memory_used: self.memory_used.map(|b| b as f64).into(),
            reasons: self.reasons.unwrap_or(0),
            ecc_new: self.ecc_new,
            xid_new: self.xid_new,
            nvlink_errors_new: self.nvlink_errors_new,
            xid_code: self.xid_code.map(|c| c as f64).into(),
            remap_trouble: self.remap_trouble,
            step_level: self.step_level.into(),
            idle_together,
        }
    }

    /// Whether the latest driver sample says the GPU is near idle (the starvation dip).
    pub(crate) fn idle_now(&self, t: &Thresholds) -> bool {
        self.util.is_some_and(|u| u <= t.starvation_dip)
    }

    /// Whether the latest driver sample says the GPU is busy (the starvation peak).
    pub(crate) fn busy_now(&self, t: &Thresholds) -> bool {
        self.util.is_some_and(|u| u >= t.starvation_peak)
    }

    pub(crate) fn memory_ratio(&self) -> Option<f64> {
        match (self.memory_used, self.memory_total) {
            (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
            _ => None,
        }
    }

    /// Work is on the GPU: enough memory is held, or a process is attached.
    pub(crate) fn allocated(&self, t: &Thresholds) -> bool {
        self.up
            && (self.memory_ratio().is_some_and(|r| r >= t.allocated_memory_ratio)
                || self.processes.is_some_and(|n| n > 0))
    }

    fn sm_clock_reduced(&self, t: &Thresholds) -> bool {
        match (self.sm_clock, self.sm_clock_max) {
            (Some(c), Some(max)) if max > 0.0 => c < t.throttle_clock_ratio * max,
            // Without the maximum, the reason bits alone have to do.
            _ => true,
        }
    }

    fn has_reason(&self, bits: u64) -> bool {
        self.reasons.is_some_and(|r| r & bits != 0)
    }

    /// A slowdown reason (thermal, power cap, HW slowdown or power brake) is active and the SM
    /// clock is reduced: the GPU runs slower than it could, whatever the cause. The three
    /// throttling rules tell the causes apart; this is what they share.
    pub(crate) fn held_down(&self, t: &Thresholds) -> bool {
        self.has_reason(
            ClockEventReasons::SW_THERMAL_SLOWDOWN
                | ClockEventReasons::HW_THERMAL_SLOWDOWN
                | ClockEventReasons::HW_SLOWDOWN
                | ClockEventReasons::SW_POWER_CAP
                | ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN,
        ) && self.sm_clock_reduced(t)
    }

    /// The GPU's run marks steps shorter than [`TURN_PERIODS`] driver periods (the observed
    /// one, else the slowest NVML documents, 1 s): too short to tell idling together from idling
    /// in turn. `false` without steps.
    pub(crate) fn steps_too_short_for_turns(&self) -> bool {
        self.step_secs.is_some_and(|step| step < TURN_PERIODS * self.driver_period.unwrap_or(1.0))
    }
}

/// A GPU's level at one tick, as every rule reads it — the driver's high-resolution mean over
/// the interval, else the latest utilisation, else (no utilisation: a MIG instance) GPM's SM
/// activity — and as the run report reads it too.
pub(crate) fn level_of(d: &DeviceSample) -> Option<f64> {
    d.windows.gpu_utilization.map(|w| w.mean).or(d.utilization.gpu).or(d.gpm.sm_activity)
}

/// The owner every process on the GPU shares, when each has a known one (attribution on);
/// `None` without processes, with an unknown owner, or with several. The run report reads it
/// too (a straggler's peers).
pub(crate) fn sole_owner(d: &DeviceSample) -> Option<&crate::model::Owner> {
    let mut owner: Option<&crate::model::Owner> = None;
    for p in &d.processes {
        let o = p.owner.as_deref().filter(|o| !o.is_unknown())?;
        match owner {
            Some(seen) if seen != o => return None,
            _ => owner = Some(o),
        }
    }
    owner
}

/// A hash of [`sole_owner`]: what a tick keeps of it, to compare GPUs without cloning owners.
fn owner_hash(owner: &crate::model::Owner) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    owner.hash(&mut h);
    h.finish()
}

/// Bytes per second one PCIe lane carries at generation `generation` (after encoding).
fn lane_bytes_per_second(generation: u32) -> Option<f64> {
    let gbps = match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => return None,
    };
    Some(gbps * 1e9)
}

/// What the rest of the host is doing, for rules that compare GPUs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HostContext {
    /// The two busiest allocated GPUs: (level, position in the snapshot).
    pub(crate) busiest: Option<(f64, usize)>,
    pub(crate) second: Option<(f64, usize)>,
    /// Sum and count of every allocated GPU's level: the peers' mean for the straggler rule.
    pub(crate) sum: f64,
    pub(crate) n: usize,
    /// Allocated GPUs with a reading now, and how many of them read busy now.
    pub(crate) readable: usize,
    pub(crate) busy_now: usize,
    /// Allocated GPUs the others wait for: busy on every tick of their window with their clocks
    /// held down ([`TickStats::slowed_busy`]), or the lone such GPU among cycling peers
    /// ([`TickStats::paces_peers`]). Data-parallel ranks wait at every step for the slowest
    /// one: while one is never idle, the others' idle stretches are that wait — not their
    /// loaders, not pipeline bubbles, not a straggler of their own.
    pub(crate) slowed: usize,
    /// Positions (below 128) of the allocated GPUs that are not busy throughout their window:
    /// those a slowed GPU's evidence names as waiting for it.
    pub(crate) not_busy_throughout: u128,
    /// The owners of the allocated GPUs at or above `imbalance_busy` (up to four distinct
    /// ones), how many such GPUs had no sole owner, and whether more owners were seen: an idle
    /// GPU is behind a busy one of *its own job* only when they may share an owner.
    pub(crate) busy_owners: [u64; 4],
    pub(crate) busy_owners_n: usize,
    pub(crate) busy_without_owner: usize,
    pub(crate) busy_owners_overflow: bool,
    /// Allocated GPUs busy on every reading so far, too few readings yet to be "busy
    /// throughout" ([`TickStats::pending_busy`]): until they have enough, whether the others
    /// wait for one of them is not known, and starvation and bubbles are not judged on them.
    pub(crate) pending_busy: usize,
}

impl HostContext {
    /// The mean level of the allocated GPUs other than one at `level`, when there are at least
    /// two of them (a group to fall behind).
    pub(crate) fn peers_mean(&self, level: f64) -> Option<f64> {
        (self.n >= 3).then(|| (self.sum - level) / (self.n - 1) as f64)
    }

    /// Whether this GPU reads near idle now (`self_idle`) while most other allocated GPUs do
    /// *not* read busy — idle together. Not "all others idle": each GPU's driver samples at its
    /// own moments, so ranks idle together read idle or in-between a sample apart, while
    /// pipeline stages idle in turn see the others busy. With no other GPU, idleness is
    /// "together" by definition. `self_busy`: this GPU reads busy (it is counted in `busy_now`).
    pub(crate) fn idle_together(&self, self_readable: bool, self_idle: bool, self_busy: bool) -> bool {
        let others = self.readable - usize::from(self_readable);
        let others_busy = self.busy_now - usize::from(self_busy);
        self_idle && (others == 0 || others_busy * 2 < others)
    }

    pub(crate) fn offer(&mut self, level: f64, position: usize) {
        self.sum += level;
        self.n += 1;
        if self.busiest.is_none_or(|(l, _)| level > l) {
            self.second = self.busiest;
            self.busiest = Some((level, position));
        } else if self.second.is_none_or(|(l, _)| level > l) {
            self.second = Some((level, position));
        }
    }

    /// Whether another allocated GPU than this one (`self_slowed`: this one is
    /// [`TickStats::slowed_busy`] or [`TickStats::paces_peers`]) is busy throughout while the
    /// others wait for it: this GPU waits for it.
    pub(crate) fn waits_for_slowed_peer(&self, self_slowed: bool) -> bool {
        self.slowed > usize::from(self_slowed)
    }

    /// Notes the owner of a busy allocated GPU (see [`HostContext::busy_owners`]).
    pub(crate) fn offer_busy_owner(&mut self, owner: Option<u64>) {
        match owner {
            None => self.busy_without_owner += 1,
            Some(o) if self.busy_owners[..self.busy_owners_n].contains(&o) => {}
            Some(o) if self.busy_owners_n < self.busy_owners.len() => {
                self.busy_owners[self.busy_owners_n] = o;
                self.busy_owners_n += 1;
            }
            Some(_) => self.busy_owners_overflow = true,
        }
    }

    /// Whether a busy GPU may belong to the same job as a GPU owned by `owner`: always, unless
    /// both owners are known and differ (another user's or container's job on a shared node).
    pub(crate) fn busy_may_share_job(&self, owner: Option<u64>) -> bool {
        match owner {
            None => true,
            Some(o) => {
                self.busy_without_owner > 0
                    || self.busy_owners_overflow
                    || self.busy_owners[..self.busy_owners_n].contains(&o)
            }
        }
    }

    /// The busiest allocated GPU other than the one at `position`.
    pub(crate) fn busiest_other(&self, position: usize) -> Option<(f64, usize)> {
        match self.busiest {
            Some((_, p)) if p == position => self.second,
            other => other,
        }
    }
}

/// Which conditions hold on one device at one tick, in [`FindingKind::ALL`] order.
pub(crate) type Holds = [bool; KINDS];
/// How many kinds there are.
pub(crate) const KINDS: usize = 12;

/// Position of `kind` in [`Holds`].
pub(crate) fn slot(kind: FindingKind) -> usize {
    FindingKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

/// Evaluates every rule for one device. `swings` sums up this device's earlier ticks (for the
/// rules that need more than one tick); `active` says which findings are raised now (for the
/// per-tick hysteresis of threshold rules); `together`: the GPU reads idle now and so do most
/// other allocated GPUs; `past_grace`: it has run, or held memory longer than the idle grace.
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate(
    s: &TickStats,
    history: &Ring<Past>,
    swings: &Swings,
    extremes: &Extremes,
    host: &HostContext,
    position: usize,
    active: &Holds,
    together: bool,
    past_grace: bool,
    t: &Thresholds,
) -> Holds {
    use FindingKind as K;
    let mut holds = [false; KINDS];
    if s.asleep {
        return holds;
    }
    if !s.up {
        holds[slot(K::HardwareErrors)] = true;
        return holds;
    }
    let level = s.level;
    let allocated = s.allocated(t);
    let mut all = *swings;
    all.entered(s.swing(together, t));
    // The level over the window, not this interval's: one interval of a cycle longer than it
    // is all busy or all idle.
    let mean = all.mean();

    // The level over the window too: a GPU whose copies saturate the link between compute
    // bursts reads busy on the short intervals within a burst, and the bursts are what the
    // copies hold back (the rule held only on the idle intervals, never on 80 % of them).
    let pcie_bound = match (s.pcie_peak_bytes_per_second, s.pcie_link_bytes_per_second, mean.or(level)) {
        (Some(peak), Some(link), Some(l)) if link > 0.0 => peak >= t.pcie_link_share * link && l <= t.pcie_max_level,
        _ => false,
    };

    let memory_bound = match s.sm_activity.or(level) {
        Some(sm) => {
            sm <= t.memory_bound_max_sm_activity
                && (s.dram.is_some_and(|d| d >= t.memory_bound_min_bandwidth)
                    || s.memory_controller.is_some_and(|m| m >= t.memory_bound_min_bandwidth))
        }
        None => false,
    } || (s.sm_activity.is_none()
        // Without GPM, the level stands in for SM activity, and a memory-bound kernel that runs
        // all the time reads busy: the memory controller, busy nearly all the time, decides.
        && level.is_some()
        && s.memory_controller.is_some_and(|m| m >= t.memory_bound_min_controller));

    // Starvation is busy and idle in turn. Within one interval when the driver's buffer holds
    // enough samples to show both; across the window's ticks otherwise — whatever the number
    // of samples per interval (one, none: the latest reading), the window's low and high
    // readings are both common.
    let within_interval = match (s.hires_min, s.hires_max) {
        (Some(min), Some(max)) => min <= t.starvation_dip && max >= t.starvation_peak,
        _ => false,
    };
    // Across ticks, the GPU must also go back and forth: a long evaluation pause is as low and
    // as high over the window, once each.
    let cycling = (within_interval || (all.busy_and_idle() && back_and_forth(history, s.swing(together, t), t)))
        && !memory_bound
        && !pcie_bound
        && s.memory_controller.is_none_or(|m| m < t.starvation_max_memory_controller);
    // Idle *together* (data-parallel ranks waiting on their loaders, steps in lockstep) or *in
    // turn* (pipeline stages waiting on each other): told apart by whether the other GPUs read
    // idle at the ticks this one does.
    //
    // Each GPU's latest reading was taken at its own moment, up to a driver period from the
    // others'. When the steps are shorter than a few periods, their idle stretches are within
    // that spread, and "together" or "in turn" cannot be told: the steps decide (starvation),
    // and its evidence names pipeline bubbles as what would look the same.
    let staggered = !s.steps_too_short_for_turns() && all.staggered();
    // One GPU persistently behind a group of busy peers doing the same work (a straggler, not
    // a loader: a starving loader holds back every rank of a data-parallel job alike).
    let behind_peers = match (level, level.and_then(|l| host.peers_mean(l))) {
        (Some(l), Some(peers)) => peers >= t.straggler_peers && l > t.imbalance_idle && l <= peers - t.straggler_gap,
        _ => false,
    };
    let band = t.starvation_min_mean..=t.starvation_max_mean;
    // With step marks: the share of each step the GPU spent idle, whatever the sampling shows.
    // A loop whose steps keep the GPU busy 15-70 % of the time waits on its host (input, CPU
    // work) for the rest — also when the driver's sampling period averages every idle stretch
    // away, which no reading can show.
    //
    // But steps 72 % idle are what a steady light job reports too (small kernels, a CPU-bound
    // loop): starvation is idle *stretches*, and those show in the readings as a spread — a
    // driver sample within a wait reads lower than one within a batch, also when each sample
    // averages several steps (the part of a step it catches moves). A steady job's readings
    // stay within a point or two. Read from the window last, once the rest holds.
    let from_steps = all.step_mean().is_some_and(|m| band.contains(&m))
        && !memory_bound
        && !pcie_bound
        && !behind_peers
        && s.memory_controller.is_none_or(|m| m < t.starvation_max_memory_controller)
        && readings_spread(extremes, s) >= STEP_MIN_SPREAD;
    // Waiting for a slowed peer (see `HostContext::slowed`): the idle stretches and the lower
    // level are the wait at each step, and the slowed GPU's finding names the cause.
    let waits = host.waits_for_slowed_peer(s.slowed_busy || s.paces_peers);
    // Not while another GPU is busy on every reading so far but has too few readings to tell
    // whether it is busy throughout — what this GPU would be waiting for: a short window would
    // raise starvation before that is known.
    let judged = host.pending_busy == usize::from(s.pending_busy);
    let starved = allocated
        && judged
        && !waits
        && !staggered
        && ((cycling && mean.is_some_and(|m| band.contains(&m))) || from_steps);
    let bubbles =
        allocated && judged && !waits && cycling && staggered && mean.is_some_and(|m| m <= t.bubbles_max_mean);

    // A busy peer of another owner (attribution on, processes sampled) is another job: an idle
    // GPU next to it is idle, not behind it.
    let busy_peer = host
        .busiest_other(position)
        .filter(|(l, _)| *l >= t.imbalance_busy)
        .filter(|_| host.busy_may_share_job(s.owner));
    let imbalance = allocated && level.is_some_and(|l| l <= t.imbalance_idle) && busy_peer.is_some();
    // A job that has not run yet (loading, compiling) gets a grace period; one that ran and
    // stopped, or has held the GPU idle for longer, does not.
    let idle_allocated = allocated
        && past_grace
        // Nothing ran within the window: a server answering a burst of requests now and then
        // is idle most of the time, but not idle.
        && all.active == 0
        && !imbalance
        && busy_peer.is_none()
        && level.is_some_and(|l| l <= t.idle_level)
        && s.hires_max.is_none_or(|m| m <= t.idle_peak);
    // Behind its peers, or the lone GPU they all wait for (busy throughout while each of them
    // idles at every step): in both, every synchronous step waits for this one.
    let straggler = (allocated && !waits && !imbalance && !starved && !bubbles && behind_peers) || s.paces_peers;

    let thermal_reason = s.has_reason(ClockEventReasons::SW_THERMAL_SLOWDOWN | ClockEventReasons::HW_THERMAL_SLOWDOWN)
        || (s.has_reason(ClockEventReasons::HW_SLOWDOWN)
            && matches!((s.temperature, s.temperature_slowdown), (Some(c), Some(slow)) if c >= slow - 5.0));
    let thermal = thermal_reason && s.sm_clock_reduced(t);
    let power = !thermal
        && s.has_reason(ClockEventReasons::SW_POWER_CAP | ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN)
        && matches!((s.power, s.power_limit), (Some(p), Some(l)) if l > 0.0 && p >= t.power_limit_ratio * l)
        && s.sm_clock_reduced(t);

    // Told to slow down from outside the GPU (the board's HW slowdown input, a power brake from
    // the chassis or PSU) while it is cool and below its power limit.
    let cool = matches!((s.temperature, s.temperature_slowdown), (Some(c), Some(slow)) if c < slow - 5.0);
    let external = !thermal
        && !power
        && cool
        && s.has_reason(ClockEventReasons::HW_SLOWDOWN | ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN)
        && s.sm_clock_reduced(t);

    // Hysteresis on the level itself: once raised, near-OOM holds down to the lower mark.
    let oom_mark = if active[slot(K::NearOom)] { t.near_oom_clear } else { t.near_oom_raise };
    let near_oom = s.memory_ratio().is_some_and(|r| r >= oom_mark);

    // A link that is down costs bandwidth but is not by itself news every tick; its going down
    // shows as a recovery error (rising counters), which is.
    let hardware = s.ecc_new > 0 || s.xid_new > 0 || s.remap_trouble || s.nvlink_errors_new > 0;

    holds[slot(K::DataloaderStarvation)] = starved;
    holds[slot(K::MemoryBound)] = memory_bound;
    holds[slot(K::Imbalance)] = imbalance;
    holds[slot(K::IdleAllocated)] = idle_allocated;
    holds[slot(K::ThermalThrottling)] = thermal;
    holds[slot(K::PowerThrottling)] = power;
    holds[slot(K::NearOom)] = near_oom;
    holds[slot(K::PcieBound)] = pcie_bound;
    holds[slot(K::HardwareErrors)] = hardware;
    holds[slot(K::Straggler)] = straggler;
    holds[slot(K::ExternalSlowdown)] = external;
    holds[slot(K::PipelineBubbles)] = bubbles;
    holds
}

/// One tick's part in [`Swings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SwingReading {
    /// The interval's lowest driver sample (else the latest reading) was near idle.
    low: bool,
    /// Its highest (else the latest) was busy.
    high: bool,
    /// Its highest was above the idle peak: something ran.
    active: bool,
    /// The interval's level, in millionths.
    level_micros: i64,
    /// The latest reading was near idle …
    idle_now: bool,
    /// … and so were most other allocated GPUs'.
    idle_together: bool,
    /// The mean utilisation of the steps reported at the tick, in millionths.
    step_micros: Option<i64>,
}

/// A reading from the numbers a tick keeps; `None` without any utilisation. A NaN is no number:
/// [`Reading`] keeps it as absent, and in and out must agree.
fn swing_reading(
    util: Option<f64>,
    hires_min: Option<f64>,
    hires_max: Option<f64>,
    level: Option<f64>,
    idle_together: bool,
    step_level: Option<f64>,
    t: &Thresholds,
) -> Option<SwingReading> {
    let ok = |v: Option<f64>| v.filter(|v| !v.is_nan());
    let (util, hires_min, hires_max, level) = (ok(util), ok(hires_min), ok(hires_max), ok(level));
    let lo = hires_min.or(util)?;
    let hi = hires_max.or(util)?;
    let level = level.or(util)?;
    let idle_now = util.is_some_and(|u| u <= t.starvation_dip);
    Some(SwingReading {
        low: lo <= t.starvation_dip,
        high: hi >= t.starvation_peak,
        active: hi > t.idle_peak,
        level_micros: micros(level),
        idle_now,
        idle_together: idle_now && idle_together,
        step_micros: ok(step_level).map(micros),
    })
}

impl TickStats {
    /// This tick's part in the swings.
    pub(crate) fn swing(&self, idle_together: bool, t: &Thresholds) -> Option<SwingReading> {
        swing_reading(self.util, self.hires_min, self.hires_max, self.level, idle_together, self.step_level, t)
    }
}

impl Past {
    /// The part it played in the swings (with the thresholds it was counted in with).
    pub(crate) fn swing(&self, t: &Thresholds) -> Option<SwingReading> {
        swing_reading(
            self.util.get(),
            self.hires_min.get(),
            self.hires_max.get(),
            self.level.get(),
            self.idle_together,
            self.step_level.get(),
            t,
        )
    }
}

/// Whether the readings went from idle to busy or back at least four times over the window
/// (this tick included): two cycles or more. An interval whose own samples hold both counts as
/// one change. Read from the window only when the counts already show the pattern (a starving
/// GPU), so a healthy tick never scans.
fn back_and_forth(history: &Ring<Past>, now: Option<SwingReading>, t: &Thresholds) -> bool {
    let mut last: Option<bool> = None;
    let mut changes = 0;
    for r in history.iter().map(|h| h.swing(t)).chain([now]).flatten() {
        let state = match (r.low, r.high) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            (true, true) => {
                changes += 1;
                None
            }
            (false, false) => continue,
        };
        if let (Some(l), Some(s)) = (last, state) {
            changes += usize::from(l != s);
        }
        last = state.or(last);
        if changes >= 4 {
            return true;
        }
    }
    false
}

/// The spread of the window's driver readings (this tick's included): the highest sample (else
/// latest reading) less the lowest. 0 without any reading.
fn readings_spread(window: &Extremes, now: &TickStats) -> f64 {
    let ((lo, hi), (now_lo, now_hi)) = (window.get(), now.reading_extremes());
    let either = |a: Option<f64>, b: Option<f64>, pick: fn(f64, f64) -> f64| match (a, b) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    };
    match (either(lo, now_lo, f64::min), either(hi, now_hi, f64::max)) {
        (Some(lo), Some(hi)) if hi >= lo => hi - lo,
        _ => 0.0,
    }
}

/// Busy and idle in turn across the window's ticks, whatever each interval holds: kept up to
/// date as ticks enter and leave the window rather than re-read from it every tick (a 60 s
/// window at 100 ms is 600 ticks per GPU per tick, most of the diagnosis stage's cost when it
/// was read).
///
/// A tick counts as *low* when its lowest driver sample — or, with none in the interval, the
/// latest reading — is at or below the dip, and *high* when its highest is at or above the
/// peak. With ten samples per interval a starving GPU's ticks are both low and high; with one,
/// they alternate; with a driver period longer than the interval, the latest reading repeats
/// and still alternates at the driver's pace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Swings {
    /// Ticks with a reading in the window.
    n: usize,
    low: usize,
    high: usize,
    /// Ticks on which something ran (a reading above the idle peak).
    active: usize,
    /// Sum of the ticks' levels, in millionths: integers add and subtract exactly, so the
    /// running sum never drifts from the window's.
    sum_micros: i64,
    /// Ticks whose latest reading was near idle, and those of them when most other allocated
    /// GPUs' were too.
    idle_now: usize,
    idle_together: usize,
    /// Ticks at which steps were reported, and the sum of their steps' mean utilisation, in
    /// millionths.
    steps: usize,
    step_sum_micros: i64,
}

impl Swings {
    /// Readings in the window (for tests).
    #[cfg(test)]
    pub(crate) fn readings(&self) -> usize {
        self.n
    }

    /// Counts a tick in (it entered the window).
    pub(crate) fn entered(&mut self, r: Option<SwingReading>) {
        if let Some(r) = r {
            self.n += 1;
            self.low += usize::from(r.low);
            self.high += usize::from(r.high);
            self.active += usize::from(r.active);
            self.sum_micros += r.level_micros;
            self.idle_now += usize::from(r.idle_now);
            self.idle_together += usize::from(r.idle_together);
            if let Some(m) = r.step_micros {
                self.steps += 1;
                self.step_sum_micros += m;
            }
        }
    }

    /// Counts a tick out (it left the window); the reading must be the one counted in.
    pub(crate) fn left(&mut self, r: Option<SwingReading>) {
        if let Some(r) = r {
            self.n -= 1;
            self.low -= usize::from(r.low);
            self.high -= usize::from(r.high);
            self.active -= usize::from(r.active);
            self.sum_micros -= r.level_micros;
            self.idle_now -= usize::from(r.idle_now);
            self.idle_together -= usize::from(r.idle_together);
            if let Some(m) = r.step_micros {
                self.steps -= 1;
                self.step_sum_micros -= m;
            }
        }
    }

    /// At least a tenth of the ticks low and a tenth high; five ticks at least (fewer show no
    /// pattern).
    pub(crate) fn busy_and_idle(&self) -> bool {
        if self.n < MIN_PATTERN_TICKS {
            return false;
        }
        let share = |k: usize| k as f64 / self.n as f64;
        // A tenth each: a driver sample that straddles a busy/idle edge reads in between, so
        // when a busy or idle stretch is not much longer than the driver's period few readings
        // are clearly either. Enough, with the back-and-forth check and the mean's bounds:
        // healthy work never reads idle, and a pause (checkpoint, evaluation) is one cycle.
        share(self.low) >= 0.1 && share(self.high) >= 0.1
    }

    /// Busy on every reading so far, too few of them yet for [`Swings::busy_throughout`].
    pub(crate) fn busy_so_far(&self) -> bool {
        self.n > 0 && self.n < MIN_PATTERN_TICKS && self.low == 0 && self.high == self.n
    }

    /// Busy on every tick of the window: no tick low, nine in ten or more high, and five ticks
    /// at least.
    pub(crate) fn busy_throughout(&self) -> bool {
        self.n >= MIN_PATTERN_TICKS && self.low == 0 && self.high * 10 >= self.n * 9
    }

    /// The mean level over the window's ticks.
    fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum_micros as f64 / 1e6 / self.n as f64)
    }

    /// The mean utilisation of the marked steps over the window, once at least
    /// [`MIN_STEP_TICKS`] ticks reported steps.
    fn step_mean(&self) -> Option<f64> {
        (self.steps >= MIN_STEP_TICKS).then(|| self.step_sum_micros as f64 / 1e6 / self.steps as f64)
    }

    /// Idle in turn rather than together: of at least three ticks this GPU read idle, fewer
    /// than half had most other GPUs idle too.
    fn staggered(&self) -> bool {
        self.idle_now >= 3 && self.idle_together * 2 < self.idle_now
    }
}

/// Readings a window needs before it shows a pattern across ticks: busy and idle in turn, busy
/// throughout ([`super::MIN_WINDOW_TICKS`], the same five).
const MIN_PATTERN_TICKS: usize = super::MIN_WINDOW_TICKS;

/// How many driver sampling periods a step must span for idle stretches to be told together or
/// in turn.
const TURN_PERIODS: f64 = 4.0;

/// The spread of the window's readings (highest less lowest) the steps need before they decide
/// starvation: 5 points. A steady job's driver readings stay within a point or two; a loop that
/// idles in stretches spreads its readings by the part of a step each sample catches — at least
/// 7 points with 0.3 s steps under a 1 s driver, 20 with 0.2 s steps under a 1/6 s one. A
/// driver period that is a whole number of steps flattens even those (each sample holds whole
/// steps): nothing can tell such a loop from steady light work, and nothing is raised.
const STEP_MIN_SPREAD: f64 = 0.05;

/// Ticks with reported steps the window needs before the steps decide starvation: one slow
/// step (a checkpoint, an evaluation) must not.
const MIN_STEP_TICKS: usize = 3;

fn micros(u: f64) -> i64 {
    // A ratio, so far inside i64 (NaN never gets here: `Swings` skips it).
    (u * 1e6).round() as i64
}

/// Extra rule-specific check at the moment a finding would be raised.
pub(crate) fn confirm_raise(kind: FindingKind, history: &Ring<Past>) -> bool {
    match kind {
        // "Almost full *and not shrinking*": a job that is freeing memory is not about to OOM.
        FindingKind::NearOom => match (history.first(), history.last()) {
            (Some(first), Some(last)) => match (first.memory_used.get(), last.memory_used.get()) {
                (Some(a), Some(b)) => b >= a,
                _ => true,
            },
            _ => true,
        },
        _ => true,
    }
}

/// Each kind's severity.
pub(crate) fn severity(kind: FindingKind) -> Severity {
    use FindingKind as K;
    match kind {
        K::HardwareErrors => Severity::Critical,
        K::MemoryBound | K::PowerThrottling | K::PipelineBubbles => Severity::Info,
        _ => Severity::Warning,
    }
}

/// Mean length, seconds, of the window's idle stretches (consecutive ticks whose readings were
/// all near idle: low and not busy), and how many there were; `None` without one. A tick
/// that reads both idle and busy (a loader's gap within the interval) breaks a stretch, so gaps
/// between batches shorter than the interval count as none.
pub(crate) fn idle_stretches(history: &Ring<Past>, t: &Thresholds) -> Option<(f64, usize)> {
    let (first, last) = (history.first()?, history.last()?);
    let n = history.iter().count();
    let span = last.at.duration_since(first.at).ok()?.as_secs_f64();
    if n < 2 || span <= 0.0 {
        return None;
    }
    let interval = span / (n - 1) as f64;
    let (mut runs, mut ticks, mut current) = (0usize, 0usize, 0usize);
    for r in history.iter().map(|h| h.swing(t)) {
        if r.is_some_and(|r| r.low && !r.high) {
            current += 1;
        } else if current > 0 {
            runs += 1;
            ticks += current;
            current = 0;
        }
    }
    if current > 0 {
        runs += 1;
        ticks += current;
    }
    (runs > 0).then(|| (ticks as f64 * interval / runs as f64, runs))
}

/// Idle stretches this long or longer (mean over the window) are named as what they most
/// likely are: a host phase of the loop — in-loop evaluation, RL rollouts on the CPU, a
/// checkpoint — rather than a loader's gap between batches. 3 s: the corpus' starving loaders
/// wait 0.1–2.25 s per step; an evaluation pass takes seconds. Both stay `dataloader_starvation`
/// (a loader that stalls for seconds, loading a shard, reads the same): only the evidence and
/// the advice change.
pub(crate) const LONG_IDLE_SECS: f64 = 3.0;

/// The advice for a finding raised on a GPU with `history` as its window: the kind's, or for
/// `dataloader_starvation` the reading its pattern fits — long idle stretches (a host phase or
/// a stalling loader), no marked steps (a training loop or a server idling between requests),
/// marked steps (a training loop whose loader starves it).
pub(crate) fn advice_for(kind: FindingKind, history: &Ring<Past>, t: &Thresholds) -> &'static str {
    if kind != FindingKind::DataloaderStarvation {
        return advice(kind);
    }
    if idle_stretches(history, t).is_some_and(|(secs, _)| secs >= LONG_IDLE_SECS) {
        return "The GPU idles for seconds at a time: if the loop runs an evaluation pass, RL rollouts on the CPU or checkpoints between training steps, that is the idle time (by design; overlap it or move it off the training GPUs if it matters). Otherwise the loader stalls between bursts (e.g. loading the next shard): prefetch it in the background, and raise num_workers.";
    }
    if history.iter().any(|h| h.step_level.get().is_some()) {
        return advice(kind);
    }
    "The GPU waits for input: raise the data loader's num_workers, use pinned memory (pin_memory=True) and prefetching, and move decoding/augmentation off the critical path. If this GPU serves requests rather than trains, it idles between requests by design and there is nothing to fix."
}

/// One sentence of advice per kind (docs/diagnosis.md says more).
pub(crate) fn advice(kind: FindingKind) -> &'static str {
    use FindingKind as K;
    match kind {
        K::DataloaderStarvation => {
            "The GPU waits for input: raise the data loader's num_workers, use pinned memory (pin_memory=True) and prefetching, and move decoding/augmentation off the critical path."
        }
        K::MemoryBound => {
            "Kernels wait on memory bandwidth: use fused kernels (e.g. flash attention), mixed precision (bf16/fp16) and larger batches to raise arithmetic intensity."
        }
        K::Imbalance => {
            "Work is not spread evenly: check the data/model sharding and that every rank gets its share (DistributedSampler, balanced pipeline stages). On a shared node this GPU may instead hold another job idle (a paused notebook, a finished run): check who owns its processes (--enable processes with attribution tells owners apart) and release it."
        }
        K::IdleAllocated => {
            "Memory is held but nothing runs: a stalled or finished job still owns the GPU — check for deadlocked ranks, a paused notebook, or release the device."
        }
        K::ThermalThrottling => {
            "The GPU slows itself down to cool: check airflow, fans and inlet temperature, and the chassis' cooling capacity."
        }
        K::PowerThrottling => {
            "Clocks are held at the power limit: raise the limit if the board allows (nvidia-smi -pl), or accept it as the cost of a capped node."
        }
        K::NearOom => {
            "Device memory is almost full: reduce the batch size, enable activation checkpointing, or shard the optimizer state (ZeRO/FSDP) before the job fails."
        }
        K::PcieBound => {
            "Host-device copies saturate the PCIe link: keep data on the GPU, use pinned memory with non_blocking copies, and overlap transfers with compute."
        }
        K::HardwareErrors => {
            "The hardware reports errors: drain the GPU, check nvidia-smi -q and the kernel log for XIDs, and reset or replace it."
        }
        K::Straggler => {
            "This GPU runs behind its peers doing the same work, and every synchronous step waits for it: check its clocks, PCIe link and NVLink, its share of the data, and for other processes on it."
        }
        K::ExternalSlowdown => {
            "The GPU is told to slow down from outside while cool and below its power limit (HW slowdown or power brake): check the node's power supplies, the chassis/BMC event log and the rack's power capping."
        }
        K::PipelineBubbles => {
            "The GPUs idle in turn, not together: pipeline-parallel bubbles — use more micro-batches per step or an interleaved schedule. If this is data-parallel training, the data loaders starve the ranks unevenly: raise num_workers."
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Evidence: formatted only when a finding is raised or cleared.

/// Window means and extremes of the numbers evidence quotes.
#[derive(Default)]
struct Summary {
    level: Mean,
    hires_min: Mean,
    hires_max: Mean,
    memory_controller: Mean,
    sm_activity: Mean,
    dram: Mean,
    power: Mean,
    temperature_max: Option<f64>,
    sm_clock: Mean,
    pcie: Mean,
    reason_ticks: usize,
    ticks: usize,
}

#[derive(Default, Clone, Copy)]
struct Mean {
    sum: f64,
    n: usize,
}

impl Mean {
    fn add(&mut self, v: Reading) {
        if let Some(v) = v.get() {
            self.sum += v;
            self.n += 1;
        }
    }
    fn get(self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
}

fn summarize(history: &Ring<Past>, reason_bits: u64) -> Summary {
    let mut s = Summary::default();
    for h in history.iter() {
        s.ticks += 1;
        s.level.add(h.level);
        s.hires_min.add(h.hires_min);
        s.hires_max.add(h.hires_max);
        s.memory_controller.add(h.memory_controller);
        s.sm_activity.add(h.sm_activity);
        s.dram.add(h.dram);
        s.power.add(h.power);
        s.sm_clock.add(h.sm_clock);
        s.pcie.add(h.pcie_peak_bytes_per_second);
        if let Some(t) = h.temperature.get() {
            s.temperature_max = Some(s.temperature_max.map_or(t, |m: f64| m.max(t)));
        }
        if h.has_reason(reason_bits) {
            s.reason_ticks += 1;
        }
    }
    s
}

fn pct(out: &mut String, label: &str, v: Option<f64>) {
    if let Some(v) = v {
        if !out.is_empty() {
            out.push_str(", ");
        }
        let _ = write!(out, "{label} {:.0} %", v * 100.0);
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / 1_073_741_824.0
}

fn memory_phrase(out: &mut String, s: &TickStats) {
    if let Some(used) = s.memory_used {
        if !out.is_empty() {
            out.push_str(", ");
        }
        match s.memory_total {
            Some(total) => {
                let _ = write!(out, "{:.1} GiB of {:.1} GiB allocated", gib(used), gib(total));
            }
            None => {
                let _ = write!(out, "{:.1} GiB allocated", gib(used));
            }
        }
    }
}

/// "temperature up to T °C (slowdown at S °C)", as far as it was read.
fn temperature_phrase(out: &mut String, s: &Summary, now: &TickStats) {
    if let Some(t) = s.temperature_max {
        let _ = write!(out, "temperature up to {t:.0} °C");
        if let Some(slow) = now.temperature_slowdown {
            let _ = write!(out, " (slowdown at {slow:.0} °C)");
        }
    }
}

/// `lead` then "power P W of a L W limit", when both were read.
fn power_phrase(out: &mut String, lead: &str, s: &Summary, now: &TickStats) {
    if let (Some(p), Some(l)) = (s.power.get(), now.power_limit) {
        let _ = write!(out, "{lead}power {p:.0} W of a {l:.0} W limit");
    }
}

/// ", SM clock C MHz of M MHz max", as far as it was read; then ", {reasons} active on n of N
/// ticks": the clock-held-down findings' closing words.
fn held_down_phrase(out: &mut String, s: &Summary, now: &TickStats, reasons: &str) {
    if let Some(c) = s.sm_clock.get() {
        let _ = write!(out, ", SM clock {:.0} MHz", c / 1e6);
        if let Some(max) = now.sm_clock_max {
            let _ = write!(out, " of {:.0} MHz max", max / 1e6);
        }
    }
    let _ = write!(out, ", {reasons} active on {} of {} ticks", s.reason_ticks, s.ticks);
}

/// The evidence sentence for `kind` on a device, from this tick's stats `now` and its window
/// `history` (newest last, `now` included). `peer` names the busiest other GPU for imbalance:
/// (index, uuid, level).
pub(crate) fn evidence(
    kind: FindingKind,
    now: &TickStats,
    history: &Ring<Past>,
    peer: Option<(u32, &str, f64)>,
    held: (usize, usize),
    t: &Thresholds,
) -> String {
    use FindingKind as K;
    if history.last().is_none() {
        return String::new();
    }
    let reasons = match kind {
        K::ExternalSlowdown => ClockEventReasons::HW_SLOWDOWN | ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN,
        K::ThermalThrottling => {
            ClockEventReasons::SW_THERMAL_SLOWDOWN
                | ClockEventReasons::HW_THERMAL_SLOWDOWN
                | ClockEventReasons::HW_SLOWDOWN
        }
        K::PowerThrottling => ClockEventReasons::SW_POWER_CAP | ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN,
        _ => 0,
    };
    let s = summarize(history, reasons);
    let secs = match (history.first(), history.last()) {
        (Some(a), Some(b)) => b.at.duration_since(a.at).map(|d| d.as_secs_f64()).unwrap_or(0.0),
        _ => 0.0,
    };
    let mut out = String::with_capacity(160);
    match kind {
        K::DataloaderStarvation | K::PipelineBubbles => {
            pct(&mut out, "utilisation mean", s.level.get());
            if let (Some(min), Some(max)) = (s.hires_min.get(), s.hires_max.get()) {
                let _ = write!(out, ", min {:.0} % / max {:.0} % within the interval", min * 100.0, max * 100.0);
            }
            let mut sw = Swings::default();
            history.iter().for_each(|h| sw.entered(h.swing(t)));
            if sw.n > 0 {
                let share = |k: usize| k as f64 * 100.0 / sw.n as f64;
                let _ = write!(
                    out,
                    // Each tick's low and high are its interval's minimum and maximum, so one
                    // tick can count for both: said as dips and peaks within ticks, not as a tick
                    // "idle" and "busy" at once.
                    ", dipped to ≤ {:.0} % within {:.0} % of the ticks and peaked at ≥ {:.0} % within {:.0} % of them",
                    t.starvation_dip * 100.0,
                    share(sw.low),
                    t.starvation_peak * 100.0,
                    share(sw.high)
                );
            }
            if let Some((secs, runs)) = idle_stretches(history, t) {
                let _ = write!(out, ", idle in {runs} stretch(es) of {secs:.1} s on average");
                if kind == K::DataloaderStarvation && secs >= LONG_IDLE_SECS {
                    out.push_str(
                        " — seconds at a time: a host phase (evaluation, rollouts, checkpoints) idles a GPU this way \
                         by design, as does a loader that stalls",
                    );
                }
            }
            if sw.idle_now > 0 {
                let _ = write!(
                    out,
                    ", the other GPUs idle at the same time on {} of its {} idle readings",
                    sw.idle_together, sw.idle_now
                );
            }
            if let Some(m) = sw.step_mean() {
                let _ = write!(
                    out,
                    ", its marked steps {:.0} % busy on average ({:.0} % of each step idle, {} ticks with steps)",
                    m * 100.0,
                    (1.0 - m).clamp(0.0, 1.0) * 100.0,
                    sw.steps
                );
                if kind == K::DataloaderStarvation && (sw.low == 0 || now.steps_too_short_for_turns()) {
                    // Decided from the steps: the readings cannot show whether the GPUs idle
                    // together or in turn.
                    out.push_str(
                        "; its steps are too short for the driver's sampling to show whether the GPUs idle \
                         together or in turn, so the steps decided: if this GPU is a pipeline stage, these may be \
                         pipeline bubbles",
                    );
                }
            }
            memory_phrase(&mut out, now);
            pct(&mut out, "memory controller", s.memory_controller.get());
        }
        K::Straggler => {
            pct(&mut out, "utilisation", s.level.get());
            // The GPU its peers wait for is the busiest; the finding names them as waiting instead.
            if let Some((index, uuid, level)) = peer.filter(|_| !now.paces_peers) {
                let _ = write!(out, " while its peers run at up to {:.0} % (GPU {index}, {uuid})", level * 100.0);
            }
            if let Some(c) = s.sm_clock.get() {
                let _ = write!(out, ", SM clock {:.0} MHz", c / 1e6);
            }
        }
        K::ExternalSlowdown => {
            temperature_phrase(&mut out, &s, now);
            power_phrase(&mut out, ", ", &s, now);
            held_down_phrase(&mut out, &s, now, "HW slowdown / power brake");
        }
        K::MemoryBound => {
            pct(&mut out, "SM activity", s.sm_activity.get().or(s.level.get()));
            pct(&mut out, "DRAM bandwidth", s.dram.get());
            pct(&mut out, "memory controller", s.memory_controller.get());
        }
        K::Imbalance => {
            pct(&mut out, "utilisation", s.level.get());
            if let Some((index, uuid, level)) = peer {
                let _ = write!(out, " while GPU {index} ({uuid}) runs at {:.0} %", level * 100.0);
            }
            memory_phrase(&mut out, now);
        }
        K::IdleAllocated => {
            // The rule's own test, and how often it held: a bursty GPU idle on most ticks has a
            // window mean above the idle level, and saying only the mean would contradict it.
            let _ = write!(out, "utilisation at most {:.0} % on {} of {} ticks", t.idle_level * 100.0, held.0, held.1);
            pct(&mut out, "window mean", s.level.get());
            memory_phrase(&mut out, now);
            if let Some(n) = now.processes {
                let _ = write!(out, ", {n} process(es) attached");
            }
        }
        K::ThermalThrottling | K::PowerThrottling => {
            if kind == K::ThermalThrottling {
                temperature_phrase(&mut out, &s, now);
            } else {
                power_phrase(&mut out, "", &s, now);
            }
            held_down_phrase(&mut out, &s, now, "slowdown reasons");
        }
        K::NearOom => {
            if let (Some(r), Some(used)) = (now.memory_ratio(), now.memory_used) {
                let _ = write!(out, "memory {:.1} % used ({:.1} GiB)", r * 100.0, gib(used));
                if let Some(first) = history.first().and_then(|f| f.memory_used.get()) {
                    let delta = used as f64 - first;
                    let _ = write!(out, ", {:+.2} GiB over {secs:.0} s", delta / 1_073_741_824.0);
                }
            }
        }
        K::PcieBound => {
            if let Some(p) = s.pcie.get() {
                let _ = write!(out, "PCIe traffic {:.1} GB/s", p / 1e9);
                if let Some(link) = now.pcie_link_bytes_per_second {
                    let _ = write!(out, " ({:.0} % of the link)", p / link * 100.0);
                }
            }
            pct(&mut out, "utilisation", s.level.get());
        }
        K::HardwareErrors => {
            if !now.up {
                out.push_str("the GPU is lost (fell off the bus or needs a reset)");
            } else {
                let ecc: u64 = history.iter().map(|h| h.ecc_new).sum();
                let xid: u64 = history.iter().map(|h| h.xid_new).sum();
                if ecc > 0 {
                    let _ = write!(out, "{ecc} new uncorrected ECC error(s)");
                }
                if xid > 0 {
                    if !out.is_empty() {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "{xid} new XID event(s)");
                    if let Some(code) = history.iter().rev().find(|h| h.xid_new > 0).and_then(|h| h.xid_code.get()) {
                        let code = code as u64;
                        let _ = write!(out, " (last XID {code})");
                    }
                }
                let nvlink: u64 = history.iter().map(|h| h.nvlink_errors_new).sum();
                if nvlink > 0 {
                    if !out.is_empty() {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "{nvlink} new NVLink CRC/replay/recovery error(s)");
                    if now.nvlink_down > 0 {
                        let _ = write!(out, ", {} NVLink link(s) down", now.nvlink_down);
                    }
                }
                if history.iter().any(|h| h.remap_trouble) {
                    if !out.is_empty() {
                        out.push_str(", ");
                    }
                    out.push_str("row remapping pending or failed");
                }
                if out.is_empty() {
                    out.push_str("no new hardware errors");
                }
            }
        }
    }
    if now.level_from_gpm
        && matches!(
            kind,
            K::DataloaderStarvation
                | K::PipelineBubbles
                | K::Straggler
                | K::Imbalance
                | K::IdleAllocated
                | K::PcieBound
        )
    {
        out.push_str("; the level is GPM SM activity (NVML reads no utilisation for this device)");
    }
    if !matches!(kind, K::NearOom | K::HardwareErrors) && secs > 0.0 {
        let _ = write!(out, " (over the last {secs:.0} s)");
    }
    out
}

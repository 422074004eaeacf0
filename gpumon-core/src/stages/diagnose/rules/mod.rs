//! The rules: what each finding looks at on one tick, and how it explains itself.
//!
//! Every rule answers one question per device and tick — "does my condition hold now?" — from
//! [`TickStats`] (the few numbers diagnosis needs, copied out of the sample), the window's
//! running counts ([`Swings`]) and the GPUs of its job ([`PeerGroup`]). The window keeps a
//! smaller [`Past`] of each tick: what evidence and the multi-tick rules read back. Turning
//! those answers into raised and cleared findings (the window, the hysteresis) is the job of
//! the stage (`phases.rs`), the same for every rule.
//!
//! The rules come in families, one file each:
//! - [`hardware`]: limits of the GPU itself — clocks held down, memory, errors;
//! - [`peers`]: comparisons between the GPUs of one job — imbalance, straggler, or with no job
//!   known the two named with their look-alike (a job of its own) — and the job groups
//!   themselves;
//! - [`host_waits`]: a GPU waiting on something outside it — its input, the other pipeline
//!   stages (or one of the two, when the data cannot tell), host-device copies, nothing.
//!
//! [`evidence`] and [`advice`] say what a raised finding shows and what to do about it.

mod advice;
pub(crate) mod evidence;
mod hardware;
pub(crate) mod host_waits;
mod latches;
pub(crate) mod peers;
mod swings;

use std::time::SystemTime;

use crate::model::{ClockEventReasons, DeviceSample};
use crate::stages::diagnose::finding::{FindingKind, Severity};

use super::window::Ring;
use super::Thresholds;
pub(crate) use host_waits::Wait;
pub(crate) use latches::Latches;

pub(crate) use advice::{advice, advice_for};
pub(crate) use evidence::evidence;
pub(crate) use peers::{peer_gap, Groups, JobKey, PeerGroup};
pub(crate) use swings::{Swings, TURN_PERIODS};

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
    /// The process every process on the GPU was started by, when attribution read one for each
    /// and it is the same (see [`sole_launcher`]); `None` otherwise.
    pub(crate) launcher: Option<u32>,
    /// Traffic in the busier PCIe direction as a share of the link's bandwidth.
    pub(crate) pcie_share: Option<f64>,
    /// Who the GPU works for (see [`peers`]); its group's index in this tick's [`Groups`].
    pub(crate) job: JobKey,
    pub(crate) group: usize,
    /// Busy and idle in turn over its window (this tick included): a possible stage or rank
    /// idling with others.
    pub(crate) cycling: bool,
    /// Busy on every tick of its window, this one included: it never idles.
    pub(crate) busy_throughout: bool,
    /// Its window's mean level is at or below `bubbles_max_mean` (see
    /// [`PeerGroup::waiting_some`]).
    pub(crate) waiting_some: bool,
    /// It waits some ([`TickStats::waiting_some`]) and nothing shows its waits: it is not seen
    /// going busy and idle across the window's ticks, nor within this interval (see
    /// [`PeerGroup::waiting_unseen`]).
    pub(crate) waiting_unseen: bool,
    /// The peers' mean level less its own this tick, when its job's other GPUs are busy (see
    /// [`peer_gap`]).
    pub(crate) peer_gap: Option<f64>,
    /// The share of its job's other GPUs that can idle (not busy throughout) reading idle now;
    /// `None` without such a GPU (see [`PeerGroup::peers_idle`]).
    pub(crate) peers_idle: Option<f64>,
    /// The mean level of its job's other allocated GPUs this tick; `None` without one.
    pub(crate) peers_level: Option<f64>,
    /// The mean last marked step time of its job's other allocated GPUs that mark steps,
    /// seconds; `None` without one, or without steps of its own.
    pub(crate) peers_step_secs: Option<f64>,
    /// Its window's mean level, this tick included (see [`PeerGroup::peers_spread`]).
    pub(crate) window_mean: Option<f64>,
    /// Not allocated, or something ran on it since it was (a reading above the idle peak).
    /// Before, its job loads and compiles, every GPU of it idle at once: those ticks say nothing
    /// of how its steps wait (its level, its link while it waits, whether it idles with its
    /// peers or in turn), and the window counts them apart ([`Swings`]: a GPU that loaded
    /// during the window was not busy throughout it).
    pub(crate) worked: bool,
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
    /// PCIe traffic as a share of the link (see [`TickStats::pcie_share`]).
    pub(crate) pcie_share: Reading,
    /// The gap to the job's busy peers (see [`TickStats::peer_gap`]).
    pub(crate) peer_gap: Reading,
    /// The share of the job's other GPUs idle now (see [`TickStats::peers_idle`]).
    pub(crate) peers_idle: Reading,
    /// The job's other GPUs' mean level (see [`TickStats::peers_level`]).
    pub(crate) peers_level: Reading,
    pub(crate) remap_trouble: bool,
    /// See [`TickStats::worked`].
    pub(crate) worked: bool,
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
        // The share of what the link can carry: its maximum generation and width where the
        // device says them. The current ones train down while the GPU idles and up with
        // traffic, and are read at another instant than the traffic (the counters' interval):
        // a share of the current link can read 10× the link, a burst of copies read beside a
        // link still at generation 1.
        let link = match (
            d.info.pcie_max_link_generation.or(d.pcie.link_generation),
            d.info.pcie_max_link_width.or(d.pcie.link_width),
        ) {
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
            launcher: sole_launcher(d),
            pcie_share: match (pcie_peak, link) {
                (Some(p), Some(l)) if l > 0.0 => Some(p / l),
                _ => None,
            },
            job: JobKey::Assumed,
            group: 0,
            cycling: false,
            busy_throughout: false,
            waiting_some: false,
            waiting_unseen: false,
            peer_gap: None,
            peers_idle: None,
            peers_level: None,
            peers_step_secs: None,
            window_mean: None,
            worked: true,
        }
    }

    /// What the window keeps of this tick; `idle_together` from its job's other GPUs.
    pub(crate) fn past(&self) -> Past {
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
            worked: self.worked,
            step_level: self.step_level.into(),
            pcie_share: self.pcie_share.into(),
            peer_gap: self.peer_gap.into(),
            peers_idle: self.peers_idle.into(),
            peers_level: self.peers_level.into(),
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

    /// The busy and idle stretches of each marked step, seconds: the last step's time split by
    /// the latest reported steps' mean utilisation in `history`. `None` without marked steps.
    pub(crate) fn marked_stretches(&self, history: &Ring<Past>) -> Option<(f64, f64)> {
        let level = history.iter().rev().find_map(|h| h.step_level.get())?.clamp(0.0, 1.0);
        let step = self.step_secs?;
        Some((step * level, step * (1.0 - level)))
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

/// The parent every process on the GPU shares, when attribution read one for each: the
/// launcher (`torchrun`, `deepspeed`, `mpirun`) that started a job's ranks. Not pid 1 (or 0):
/// processes whose launcher died are left to init, or to a subreaper, whatever job they ran.
pub(crate) fn sole_launcher(d: &DeviceSample) -> Option<u32> {
    let mut launcher = None;
    for p in &d.processes {
        let parent = p.parent_pid.filter(|&pid| pid > 1)?;
        match launcher {
            Some(seen) if seen != parent => return None,
            _ => launcher = Some(parent),
        }
    }
    launcher
}

/// A hash of [`sole_owner`]: what a tick keeps of it, to compare GPUs without cloning owners.
pub(crate) fn owner_hash(owner: &crate::model::Owner) -> u64 {
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

/// Which conditions hold on one device at one tick, in [`FindingKind::ALL`] order.
pub(crate) type Holds = [bool; KINDS];
/// How many kinds there are.
pub(crate) const KINDS: usize = 15;

/// Position of `kind` in [`Holds`].
pub(crate) fn slot(kind: FindingKind) -> usize {
    FindingKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

/// What every rule reads about one device at one tick.
pub(crate) struct RuleInput<'a> {
    pub(crate) s: &'a TickStats,
    /// The device's window before this tick (newest last).
    pub(crate) history: &'a Ring<Past>,
    /// The window's running counts, this tick included.
    pub(crate) window: Swings,
    /// The GPUs of its job (see [`peers`]).
    pub(crate) group: &'a PeerGroup,
    /// Its position in the snapshot.
    pub(crate) position: usize,
    /// The findings raised on it now (for the per-tick hysteresis of threshold rules).
    pub(crate) active: &'a Holds,
    /// It has run, or held memory longer than the idle grace.
    pub(crate) past_grace: bool,
    /// What its window showed at earlier ticks that holds at a looser bound since: the
    /// hysteresis of the busy-and-idle pattern and of the in-turn test.
    pub(crate) latches: Latches,
    pub(crate) t: &'a Thresholds,
}

/// Evaluates every rule for one device: the hardware limits, the peer comparisons, the host-side
/// waits, in that order (each family reads what the ones before concluded).
pub(crate) fn evaluate(input: &RuleInput<'_>) -> (Holds, Wait) {
    use FindingKind as K;
    let (s, t) = (input.s, input.t);
    let mut holds = [false; KINDS];
    if s.asleep {
        return (holds, Wait::None);
    }
    if !s.up {
        holds[slot(K::HardwareErrors)] = true;
        return (holds, Wait::None);
    }
    let limits = hardware::judge(s, input.active, t);
    let peers = peers::judge(input);
    let waits = host_waits::judge(input, limits.memory_bound, &peers);
    let waiting = !matches!(waits.wait, Wait::None);
    // Behind its peers, or the lone GPU they all wait for (busy throughout while each of them
    // idles at every step): in both, every synchronous step waits for this one.
    let waits_for_slowed = input.group.waits_for_slowed_peer(s.slowed_busy || s.paces_peers, s.memory_ratio());
    let straggler = (s.allocated(t)
        && !waits_for_slowed
        && !peers.imbalance
        && !peers.imbalance_or_own_job
        && !waiting
        && peers.behind)
        || s.paces_peers;
    // Which GPUs it falls behind is an assumption when nothing says which job it runs: a job of
    // its own beside them reads the same, and an independent single-GPU job is never named a
    // straggler on an assumption — both readings are named.
    let job_known = input.group.job.known();

    holds[slot(K::DataloaderStarvation)] = waits.wait == Wait::Starved;
    holds[slot(K::MemoryBound)] = limits.memory_bound;
    holds[slot(K::Imbalance)] = peers.imbalance;
    holds[slot(K::IdleAllocated)] = waits.idle_allocated;
    holds[slot(K::ThermalThrottling)] = limits.thermal;
    holds[slot(K::PowerThrottling)] = limits.power;
    holds[slot(K::NearOom)] = limits.near_oom;
    holds[slot(K::PcieBound)] = waits.pcie_bound;
    holds[slot(K::HardwareErrors)] = limits.errors;
    holds[slot(K::Straggler)] = straggler && job_known;
    holds[slot(K::ExternalSlowdown)] = limits.external;
    holds[slot(K::PipelineBubbles)] = waits.wait == Wait::Bubbles;
    holds[slot(K::StarvationOrBubbles)] = matches!(waits.wait, Wait::CannotTell(_));
    holds[slot(K::StragglerOrOwnJob)] = straggler && !job_known;
    holds[slot(K::ImbalanceOrOwnJob)] = peers.imbalance_or_own_job;
    (holds, waits.wait)
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
        K::MemoryBound | K::PowerThrottling | K::PipelineBubbles | K::StarvationOrBubbles => Severity::Info,
        _ => Severity::Warning,
    }
}

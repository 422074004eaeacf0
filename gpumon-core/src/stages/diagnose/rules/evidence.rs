//! Evidence: the numbers behind a finding, in words. Formatted only when a finding is raised
//! or cleared, never on other ticks.

use std::fmt::Write as _;

use super::advice::LONG_IDLE_SECS;
use super::host_waits::{Undecided, IN_TURN, TOGETHER};
use super::peers::{JobKey, STEPS_SLOWER};
use super::swings::{idle_stretches, Swings, TURN_PERIODS};
use super::{Past, Reading, TickStats};
use crate::model::ClockEventReasons;
use crate::stages::diagnose::finding::FindingKind;
use crate::stages::diagnose::window::Ring;
use crate::stages::diagnose::Thresholds;

/// How far apart (highest less lowest, over the window) a marked GPU's readings may be for its
/// evidence to call them flat: 5 points. A steady job's driver readings stay within a point or
/// two; a loop that idles in stretches spreads them by the part of a step each sample catches —
/// at least 7 points with 0.3 s steps under a 1 s driver — unless the driver's period is a
/// whole number of steps (each sample holds whole steps). Flat, the idle share its steps show
/// may be a loader's short waits or host work between small kernels: the evidence names both.
/// (The steps decide whatever the spread, issue #42 item 5; it once had to be this wide.)
const FLAT_SPREAD: f64 = 0.05;

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
    /// The lowest and highest driver reading over the window (high-resolution samples, else
    /// the latest readings): how far the readings spread.
    readings_low: Option<f64>,
    readings_high: Option<f64>,
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
        if let Some(low) = h.hires_min.get().or(h.util.get()) {
            s.readings_low = Some(s.readings_low.map_or(low, |m: f64| m.min(low)));
        }
        if let Some(high) = h.hires_max.get().or(h.util.get()) {
            s.readings_high = Some(s.readings_high.map_or(high, |m: f64| m.max(high)));
        }
    }
    s
}

fn pct(out: &mut String, label: &str, v: Option<f64>) {
    if let Some(v) = v {
        if !out.is_empty() && !out.ends_with(' ') {
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

/// What evidence says about a GPU's job and peers, besides its own numbers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerContext<'a> {
    /// The busiest other GPU of its job: (index, uuid, level).
    pub(crate) peer: Option<(u32, &'a str, f64)>,
    /// Who it works for, as far as gpumon can tell.
    pub(crate) job: JobKey,
    /// Why starvation and bubbles could not be told apart, for `starvation_or_bubbles`.
    pub(crate) undecided: Option<Undecided>,
}

/// The evidence sentence for `kind` on a device, from this tick's stats `now` and its window
/// `history` (newest last, `now` included); `held`: ticks the condition held, of the window's.
pub(crate) fn evidence(
    kind: FindingKind,
    now: &TickStats,
    history: &Ring<Past>,
    peers: &PeerContext<'_>,
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
        K::DataloaderStarvation | K::PipelineBubbles | K::StarvationOrBubbles => {
            waits(&mut out, kind, now, history, &s, peers, t);
        }
        K::Straggler => {
            straggler(&mut out, now, history, &s, peers, t);
            job_phrase(&mut out, peers.job);
        }
        K::StragglerOrOwnJob => {
            straggler(&mut out, now, history, &s, peers, t);
            out.insert_str(0, "cannot tell a straggler from a job of its own: ");
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
        K::Imbalance | K::ImbalanceOrOwnJob => {
            pct(&mut out, "utilisation", s.level.get());
            if let Some((index, uuid, level)) = peers.peer {
                let _ = write!(out, " while GPU {index} ({uuid}) runs at {:.0} %", level * 100.0);
            }
            memory_phrase(&mut out, now);
            if kind == K::ImbalanceOrOwnJob {
                out.insert_str(0, "cannot tell imbalance from a job of its own: ");
                out.push_str(
                    "; no process is read on it and no job information (no step marks naming a job, no process owners): if \
                     the busy GPU runs its job, the work is split unevenly; if it runs a job of its own, that job idles \
                     on its own (waiting for input, or nothing left to run)",
                );
            } else {
                job_phrase(&mut out, peers.job);
            }
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
        K::NearOom => near_oom(&mut out, now, history, secs),
        K::PcieBound => pcie(&mut out, history, &s, now),
        K::HardwareErrors => hardware_errors(&mut out, now, history),
    }
    closing(&mut out, kind, now, secs);
    out
}

/// The level-source note and the window's span, where they apply.
fn closing(out: &mut String, kind: FindingKind, now: &TickStats, secs: f64) {
    use FindingKind as K;
    let level_rule = !matches!(
        kind,
        K::MemoryBound
            | K::ThermalThrottling
            | K::PowerThrottling
            | K::ExternalSlowdown
            | K::NearOom
            | K::HardwareErrors
    );
    if now.level_from_gpm && level_rule {
        out.push_str("; the level is GPM SM activity (NVML reads no utilisation for this device)");
    }
    if !matches!(kind, K::NearOom | K::HardwareErrors) && secs > 0.0 {
        let _ = write!(out, " (over the last {secs:.0} s)");
    }
}

/// "; assuming the GPUs with work belong to one job", when nothing said which job.
fn job_phrase(out: &mut String, job: JobKey) {
    if job == JobKey::Run {
        out.push_str("; its job: the command gpumon-agent run started (its processes run on this GPU)");
    } else if !job.known() {
        out.push_str(
            "; no job information (no step marks naming a job, no process owners, no launcher common to its processes): assuming the GPUs with \
             work belong to one job",
        );
    }
}

/// The share of the window each reading of `starvation_or_bubbles` explains, when it is known
/// (issue #42, item 4): `idle`, the window's idle share; `with_peers`, the share of the job's
/// other GPUs reading idle at the ticks this one read idle. Idle while they idle too is a
/// shared wait (ranks waiting for input); idle while they compute is a turn (a stage's bubble).
/// With no job known every idle moment is one or the other, whichever the other GPUs are; with
/// readings too coarse to pair, how it splits is not known and nothing is said.
fn shares_phrase(out: &mut String, why: Option<Undecided>, idle: f64, with_peers: Option<f64>) {
    match (why, with_peers) {
        (Some(Undecided::NoJobKnown | Undecided::OthersWaitUnseen), _) => {
            let _ = write!(
                out,
                "its idle {:.0} % of the window is all one or the other — bubbles if those GPUs are its job's \
                 stages, its own loader's waits if not; ",
                idle * 100.0
            );
        }
        (Some(Undecided::Mixed), Some(together)) => {
            let together = together.clamp(0.0, 1.0);
            let _ = write!(
                out,
                "of the window, about {:.0} % idle while the job's other GPUs idled too (as ranks waiting for \
                 input do) and {:.0} % idle while they computed (as a pipeline stage's bubbles do); ",
                idle * together * 100.0,
                idle * (1.0 - together) * 100.0
            );
        }
        _ => {}
    }
}

/// Starvation, bubbles, or the two undecided: the level, the swings, the idle stretches, how
/// the other GPUs of the job idled, the marked steps and the region the readings can show.
fn waits(
    out: &mut String,
    kind: FindingKind,
    now: &TickStats,
    history: &Ring<Past>,
    s: &Summary,
    peers: &PeerContext<'_>,
    t: &Thresholds,
) {
    use FindingKind as K;
    let mut sw = Swings::default();
    history.iter().for_each(|h| sw.entered(h.swing(t)));
    if kind == K::StarvationOrBubbles {
        out.push_str("cannot tell data loader starvation from pipeline bubbles: ");
        match peers.undecided {
            Some(Undecided::NoJobKnown) => out.push_str(
                "it idles in turn with another GPU, but nothing says they run one job (another job starving on \
                 its own reads the same as the next pipeline stage); ",
            ),
            Some(Undecided::TooShortToSee) => out.push_str(
                "other GPUs of its job go busy and idle too, and its readings cannot show whether they idle at \
                 the same moments (data-parallel ranks waiting for input) or in turn (pipeline stages): its idle \
                 stretches are too short for the driver's sampling period, or too few readings were clearly \
                 idle and clearly busy; ",
            ),
            Some(Undecided::OthersWaitUnseen) => out.push_str(
                "other GPUs with work wait a share of the time too, in stretches too short for the driver's \
                 sampling to show, and nothing says they run its job (the next stages of a pipeline read so, as \
                 do other jobs); ",
            ),
            Some(Undecided::Mixed) => out.push_str(
                "the other GPUs of its job idle partly with it and partly in turn: neither data-parallel ranks \
                 waiting together nor pipeline stages waiting in turn reads clearly; ",
            ),
            Some(Undecided::WaitsOnOtherPart) => out.push_str(
                "it waits alone while the other GPUs of its job, holding other memory than it, compute: a \
                 pipeline stage waiting for a slower stage reads so, as does a GPU whose own loader starves it \
                 beside work its job's marks or owner join to it; ",
            ),
            Some(Undecided::ReadingsDisagree) => {
                out.push_str(
                    "its latest readings idle in turn with the other GPUs of its job, but its intervals' levels \
                     rise and fall with theirs",
                );
                if let Some(r) = sw.level_correlation() {
                    let _ = write!(out, " (correlation {r:.2})");
                }
                out.push_str(
                    ": data-parallel ranks waiting at the same moments read so when the driver samples each GPU \
                     at other instants, pipeline stages do not; ",
                );
            }
            Some(Undecided::SameMemory) => out.push_str(
                "its readings idle in turn with the other GPUs of its job, but every GPU of the job holds the \
                 same share of its memory, as data-parallel replicas do: ranks whose loaders stall at different \
                 moments read in turn too (one waits for its input while the others spin in the collective), and \
                 a pipeline's stages mostly hold their own layers and micro-batches in flight; ",
            ),
            None => {}
        }
        if let Some(level) = s.level.get() {
            shares_phrase(out, peers.undecided, 1.0 - level.clamp(0.0, 1.0), sw.peers_idle_when_idle());
        }
    }
    pct(out, "utilisation mean", s.level.get());
    if let (Some(min), Some(max)) = (s.hires_min.get(), s.hires_max.get()) {
        let _ = write!(out, ", min {:.0} % / max {:.0} % within the interval", min * 100.0, max * 100.0);
    }
    if sw.readings() > 0 {
        let share = |k: usize| k as f64 * 100.0 / sw.readings() as f64;
        let (low, high) = sw.low_high();
        let _ = write!(
            out,
            // Each tick's low and high are its interval's minimum and maximum, so one tick can
            // count for both: said as dips and peaks within ticks, not as a tick "idle" and
            // "busy" at once.
            ", dipped to ≤ {:.0} % within {:.0} % of the ticks and peaked at ≥ {:.0} % within {:.0} % of them",
            t.starvation_dip * 100.0,
            share(low),
            t.starvation_peak * 100.0,
            share(high)
        );
    }
    if let Some((secs, runs, _)) = idle_stretches(history, t) {
        let _ = write!(out, ", idle in {runs} stretch(es) of {secs:.1} s on average");
        if kind == K::DataloaderStarvation && secs >= LONG_IDLE_SECS {
            out.push_str(
                " — seconds at a time: a host phase (evaluation, rollouts, checkpoints) idles a GPU this way \
                 by design, as does a loader that stalls",
            );
        }
    }
    if let Some(c) = sw.co_idling() {
        let _ = write!(
            out,
            ", the other GPUs of its job idle {:.0} points more often when it idles than when it is busy \
             ({})",
            c * 100.0,
            if c >= TOGETHER {
                "together"
            } else if c <= IN_TURN {
                "in turn"
            } else {
                "neither clearly"
            }
        );
    }
    if let Some(m) = sw.step_mean() {
        let _ = write!(
            out,
            ", its marked steps {:.0} % busy on average ({:.0} % of each step idle, {} ticks with steps)",
            m * 100.0,
            (1.0 - m).clamp(0.0, 1.0) * 100.0,
            sw.step_ticks()
        );
        // Marked steps decide however little the readings vary (issue #42): a step 60 % idle
        // waits on its host for 60 % of the time. Flat readings say how: the idle is spread too
        // thinly for the driver to show, which a loader's short waits and a loop bound by its
        // CPU (host work between small kernels) both read as. The evidence names both.
        if let (Some(low), Some(high)) = (s.readings_low, s.readings_high) {
            if high - low < FLAT_SPREAD {
                let _ = write!(
                    out,
                    ", its readings flat (within {:.0} points): the idle is spread thinner than the driver's \
                     sampling shows — waits on input shorter than its period, or host work between small \
                     kernels (a loop bound by its CPU: larger batches, CUDA graphs or torch.compile help there)",
                    (high - low) * 100.0
                );
            }
        }
    }
    memory_phrase(out, now);
    pct(out, "memory controller", s.memory_controller.get());
    region_phrase(out, now, history, t);
    if kind == K::DataloaderStarvation && now.steps_too_short_for_turns() {
        out.push_str("; if this GPU is a pipeline stage, these may be pipeline bubbles");
    }
    if kind != K::DataloaderStarvation {
        job_phrase(out, peers.job);
    }
}

/// What the readings of this GPU can show, computed from its own numbers: the driver's
/// measured sampling period against its shortest busy or idle stretch (from its marked steps,
/// else from the readings), and whether its steps are long enough to tell GPUs idling together
/// from idling in turn. Said in the evidence of the waiting kinds, so the run report carries it.
pub(crate) fn region_phrase(out: &mut String, now: &TickStats, history: &Ring<Past>, t: &Thresholds) {
    let period = now.driver_period;
    match period {
        Some(p) => {
            let _ = write!(out, "; the driver samples utilisation every {p:.2} s (measured)");
        }
        None => out.push_str("; the driver's sampling period is not measured (NVML: 1/6 s to 1 s)"),
    }
    let shortest = match (now.step_secs, now.marked_stretches(history)) {
        (Some(step), Some((busy, idle))) => {
            let _ = write!(out, ", its steps {step:.2} s with busy and idle stretches of {busy:.2} s and {idle:.2} s");
            Some(busy.min(idle))
        }
        _ => idle_stretches(history, t).map(|(secs, ..)| secs),
    };
    let period = period.unwrap_or(1.0);
    match (shortest, now.step_secs) {
        (Some(short), marked) if short < period => {
            let _ = write!(
                out,
                ": stretches shorter than the sampling period are averaged away, so the readings cannot show \
                 this cause{}",
                if marked.is_some() { " (the marked steps decide)" } else { "" }
            );
        }
        (_, Some(step)) if step < TURN_PERIODS * period => {
            let _ = write!(
                out,
                ": steps shorter than {TURN_PERIODS:.0} sampling periods cannot show whether GPUs idle together or \
                 in turn"
            );
        }
        (Some(_), _) => out.push_str(": long enough for the readings to show"),
        (None, _) => {}
    }
}

/// A straggler: its level against its job's peers over the window.
fn straggler(
    out: &mut String,
    now: &TickStats,
    history: &Ring<Past>,
    s: &Summary,
    peers: &PeerContext<'_>,
    t: &Thresholds,
) {
    pct(out, "utilisation", s.level.get());
    // The GPU its peers wait for is the busiest; the finding names them as waiting instead.
    if !now.paces_peers {
        let mut sw = Swings::default();
        history.iter().for_each(|h| sw.entered(h.swing(t)));
        if let Some(gap) = sw.peer_gap_mean() {
            let _ = write!(
                out,
                ", {:.0} points below the mean of its job's other GPUs on average over {} ticks",
                gap * 100.0,
                sw.peer_gap_ticks()
            );
        }
        if let Some((index, uuid, level)) = peers.peer {
            let _ = write!(out, " (they run at up to {:.0} %: GPU {index}, {uuid})", level * 100.0);
        }
    }
    // The step times only where they name it (a rank behind on its level alone, in lockstep,
    // reports its peers' step time: "0 % longer" would say nothing).
    if let (Some(own), Some(theirs)) = (now.step_secs, now.peers_step_secs) {
        if theirs > 0.0 && own >= theirs * (1.0 + STEPS_SLOWER) {
            let _ = write!(
                out,
                ", its last marked step {own:.2} s against {theirs:.2} s for its job's other ranks ({:.0} % longer)",
                (own / theirs - 1.0) * 100.0
            );
        }
    }
    if let Some(c) = s.sm_clock.get() {
        let _ = write!(out, ", SM clock {:.0} MHz", c / 1e6);
    }
    // With the job assumed, its peers are the GPUs holding the same memory (`peer_gap`), and
    // the finding is `straggler_or_own_job`: both readings are said.
    if !peers.job.known() {
        out.push_str(
            "; no job information (no step marks naming a job, no process owners, no launcher common to its processes): if the GPUs \
             holding the same share of memory as it (data-parallel replicas) run its job, it holds them back at every step; if it \
             runs a job of its own, it waits on its own work (input, host-side steps)",
        );
    }
}

fn near_oom(out: &mut String, now: &TickStats, history: &Ring<Past>, secs: f64) {
    if let (Some(r), Some(used)) = (now.memory_ratio(), now.memory_used) {
        let _ = write!(out, "memory {:.1} % used ({:.1} GiB)", r * 100.0, gib(used));
        if let Some(first) = history.first().and_then(|f| f.memory_used.get()) {
            let delta = used as f64 - first;
            let _ = write!(out, ", {:+.2} GiB over {secs:.0} s", delta / 1_073_741_824.0);
        }
    }
}

/// PCIe-bound: the window's mean traffic and link share, and the level meanwhile.
fn pcie(out: &mut String, history: &Ring<Past>, s: &Summary, now: &TickStats) {
    if let Some(p) = s.pcie.get() {
        let _ = write!(out, "PCIe traffic {:.1} GB/s on average", p / 1e9);
        let (sum, n) =
            history.iter().filter_map(|h| h.pcie_share.get()).fold((0.0, 0usize), |(a, n), v| (a + v, n + 1));
        if n > 0 {
            let _ = write!(out, " ({:.0} % of the link)", sum / n as f64 * 100.0);
        } else if let Some(link) = now.pcie_link_bytes_per_second {
            let _ = write!(out, " ({:.0} % of the link)", p / link * 100.0);
        }
    }
    pct(out, "utilisation", s.level.get());
    out.push_str(" meanwhile: the GPU waits for its copies");
}

fn hardware_errors(out: &mut String, now: &TickStats, history: &Ring<Past>) {
    if !now.up {
        out.push_str("the GPU is lost (fell off the bus or needs a reset)");
        return;
    }
    let part = |out: &mut String| {
        if !out.is_empty() {
            out.push_str(", ");
        }
    };
    let ecc: u64 = history.iter().map(|h| h.ecc_new).sum();
    let xid: u64 = history.iter().map(|h| h.xid_new).sum();
    if ecc > 0 {
        let _ = write!(out, "{ecc} new uncorrected ECC error(s)");
    }
    if xid > 0 {
        part(out);
        let _ = write!(out, "{xid} new XID event(s)");
        if let Some(code) = history.iter().rev().find(|h| h.xid_new > 0).and_then(|h| h.xid_code.get()) {
            let code = code as u64;
            let _ = write!(out, " (last XID {code})");
        }
    }
    let nvlink: u64 = history.iter().map(|h| h.nvlink_errors_new).sum();
    if nvlink > 0 {
        part(out);
        let _ = write!(out, "{nvlink} new NVLink CRC/replay/recovery error(s)");
        if now.nvlink_down > 0 {
            let _ = write!(out, ", {} NVLink link(s) down", now.nvlink_down);
        }
    }
    if history.iter().any(|h| h.remap_trouble) {
        part(out);
        out.push_str("row remapping pending or failed");
    }
    if out.is_empty() {
        out.push_str("no new hardware errors");
    }
}

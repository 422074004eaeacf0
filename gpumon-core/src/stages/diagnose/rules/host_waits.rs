//! Rules for a GPU that waits on something outside it: its input (`dataloader_starvation`),
//! the other stages of its pipeline (`pipeline_bubbles`), one of the two where the data cannot
//! tell which (`starvation_or_bubbles`), host-device copies (`pcie_bound`), or nothing at all
//! (`idle_allocated`).

use super::peers::PeerHolds;
use super::swings::{back_and_forth, idle_stretches, one_pause, Swings};
use super::{Past, RuleInput, TickStats};
use crate::stages::diagnose::window::Ring;
use crate::stages::diagnose::Thresholds;

/// What a GPU that goes busy and idle in turn is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Not such a GPU (or one whose wait another finding explains).
    None,
    /// Its input: idle together with the other GPUs of its job, or alone in it.
    Starved,
    /// The other stages: idle in turn with the other GPUs of its (known) job.
    Bubbles,
    /// One of the two, and the data cannot tell which (see [`Undecided`]).
    CannotTell(Undecided),
}

/// Why the data cannot tell starvation from pipeline bubbles on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undecided {
    /// It idles in turn with other GPUs, but nothing says they belong to its job: another job
    /// starving on its own looks the same as the next pipeline stage.
    NoJobKnown,
    /// Other GPUs of its job go busy and idle too, but the readings cannot show whether they
    /// idle at the same moments (data-parallel ranks waiting for input) or in turn (pipeline
    /// stages): its idle stretches are shorter than the driver's sampling period, or too few
    /// of its readings were clearly idle and clearly busy.
    TooShortToSee,
    /// They idle partly together, partly in turn: neither pattern is clear.
    Mixed,
    /// It waits alone beside busy GPUs of its known job that all hold other memory than it
    /// ([`PeerGroup::waits_on_another_part`]): another part of its job it waits for (an uneven
    /// pipeline's slowest stage), or its own input.
    WaitsOnOtherPart,
    /// The latest readings say in turn, the intervals' levels say together (they rise and fall
    /// with the peers', [`LEVELS_MOVE_TOGETHER`]): the driver samples each GPU at its own
    /// moments, so ranks waiting at once can read idle at different ticks.
    ReadingsDisagree,
    /// The readings say in turn, but every GPU of its job holds the same share of memory as
    /// the others ([`PeerGroup::holds_one_memory`]): data-parallel replicas do (the same model,
    /// optimizer state and batch), and ranks whose loaders stall at different steps read in
    /// turn — one waits for its input while the others, done, spin in the collective. A
    /// pipeline's stages hold their own layers and micro-batches in flight, so mostly other
    /// memory; a balanced GPipe's may not.
    SameMemory,
    /// Nothing says which GPUs run its job, and none of the others is seen going busy and
    /// idle, but some wait a share worth naming in stretches too short to read: the next stages
    /// of its pipeline, or other jobs.
    OthersWaitUnseen,
}

/// What the host-side-wait rules conclude on one GPU.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitHolds {
    pub(crate) pcie_bound: bool,
    pub(crate) wait: Wait,
    pub(crate) idle_allocated: bool,
}

/// PCIe-bound, judged over the window: the share of the link the copies take (in the busier
/// direction) *while the SMs wait*, and a window whose mean level shows the waiting. One tick's
/// reading says little: offload traffic comes in bursts between compute phases, so an
/// instantaneous reading holds on some ticks only (61 % in a ZeRO-offload job keeping the link
/// 85 % busy), and a window mean dilutes the bursts by the compute time between them.
///
/// The link while the SMs wait is read on the ticks whose latest reading was idle, and
/// estimated from the window: its mean share over its idle share (1 − mean level), the
/// traffic put where the waiting is. The two disagree when the utilisation reading (the
/// driver's last sample, up to a period old) and the link's (an instant) fall on different
/// sides of a short wait: the higher one holds. But traffic clearly heavier while the SMs
/// compute than while they wait is not what they wait for (prefetching, overlapped offload) —
/// when the waits are long enough for one tick's two readings to fall within the same wait
/// (`waits_outlast_readings`, asked only then). Waits near the driver's period are read busy
/// at the instants their copies run, and idle once they are done: the traffic seems to follow
/// the compute, and only the window's estimate tells.
pub(crate) fn pcie_bound(window: &Swings, t: &Thresholds, waits_outlast_readings: impl FnOnce() -> bool) -> bool {
    let Some(level) = window.mean() else { return false };
    if level > t.pcie_max_level {
        return false;
    }
    let read = window.idle_pcie_share_mean();
    if let (Some(waiting), Some(computing)) = (read, window.busy_pcie_share_mean()) {
        if computing > waiting + 0.1 && waits_outlast_readings() {
            return false;
        }
    }
    let estimated = window.pcie_share_mean().map(|share| share / (1.0 - level).max(1e-9));
    let while_waiting = match (read, estimated) {
        (Some(read), Some(estimated)) => Some(read.max(estimated)),
        (read, estimated) => read.or(estimated),
    };
    while_waiting.is_some_and(|share| share >= t.pcie_link_share)
}

/// Whether its waits last long enough for a tick's utilisation reading and its link reading to
/// fall within the same wait: two of the driver's sampling periods (the utilisation reading is
/// the latest sample, up to a period old and a period long; one second when unmeasured, NVML's
/// longest). The wait is its marked steps' idle share of a step when they are marked, else its
/// idle stretches over the readings — two ticks long at least, since one tick read idle
/// throughout says only that the wait covered the samples within it.
fn waits_outlast_readings(now: &TickStats, history: &Ring<Past>, t: &Thresholds) -> bool {
    let period = now.driver_period.unwrap_or(1.0);
    let wait = now
        .marked_stretches(history)
        .map(|(_, idle)| idle)
        .or_else(|| idle_stretches(history, t).filter(|&(_, runs, ticks)| ticks >= 2 * runs).map(|(secs, ..)| secs));
    wait.is_some_and(|secs| secs >= 2.0 * period)
}

/// Starvation, bubbles or the undecided pair, the link and idleness (see the module docs).
pub(crate) fn judge(input: &RuleInput<'_>, memory_bound: bool, peers: &PeerHolds) -> WaitHolds {
    let (s, t, all) = (input.s, input.t, &input.window);
    let allocated = s.allocated(t);
    let pcie = pcie_bound(all, t, || waits_outlast_readings(s, input.history, t));
    // The level over the window, not this interval's: one interval of a cycle longer than it
    // is all busy or all idle.
    let mean = all.mean();
    // Copies fill the link while it idles: it waits for them, not for its input (PCIe-bound
    // when the waits are long enough to name).
    let copies_while_idle = all.idle_pcie_share_mean().is_some_and(|share| share >= t.pcie_link_share);
    let quiet_memory = !memory_bound
        && !pcie
        && !copies_while_idle
        && s.memory_controller.is_none_or(|m| m < t.starvation_max_memory_controller);
    // Starvation is busy and idle in turn. Within one interval when the driver's buffer holds
    // enough samples to show both; across the window's ticks otherwise — whatever the number
    // of samples per interval (one, none: the latest reading), the window's low and high
    // readings are both common. Across ticks, the GPU must also go back and forth: a long
    // evaluation pause is as low and as high over the window, once each.
    let within_interval = match (s.hires_min, s.hires_max) {
        (Some(min), Some(max)) => min <= t.starvation_dip && max >= t.starvation_peak,
        _ => false,
    };
    // Once seen, the pattern holds down to half its idle readings (`Latches::pattern`).
    let pattern = input.latches.pattern(all);
    let cycling = quiet_memory && (within_interval || (pattern && back_and_forth(input.history, s.swing(t), t)));
    let band = t.starvation_min_mean..=t.starvation_max_mean;
    // With step marks: the share of each step the GPU spent idle, whatever the sampling shows.
    // A loop whose steps keep the GPU busy 15-70 % of the time waits on its host (input, CPU
    // work) for the rest — also when the driver's sampling period averages every idle stretch
    // away, which no reading can show.
    //
    // But steps 72 % idle are what a steady light job reports too (small kernels, a CPU-bound
    // loop): starvation is idle *stretches*, and those show in the readings as a spread. With
    // readings flat to within `STEP_MIN_SPREAD`, nothing tells the two apart (the hand corpus'
    // steady marked jobs must stay quiet), and nothing is raised.
    //
    // The band's lower edge is not asked of marked steps: it keeps quiet a GPU that mostly waits
    // with short bursts, which without marks may be a server between requests — a loop marking
    // its training steps is not one, and steps 85 % idle are a loader starving it (on the fit
    // set, once each step's figures stopped counting the sample at its boundary in full:
    // recall 0.880 → 0.909 over 16 000 GPU-runs, precision unchanged).
    let from_steps = all.step_mean().is_some_and(|m| m > 0.0 && m <= t.starvation_max_mean)
        && all.most_steps_wait()
        && quiet_memory
        && !peers.behind;
    // Waiting for a slowed peer (see `PeerGroup::slowed`): the idle stretches and the lower
    // level are the wait at each step, and the slowed GPU's finding names the cause. Not while
    // another GPU is busy on every reading so far but has too few readings to tell whether it
    // is busy throughout — what this GPU would be waiting for.
    let waits = input.group.waits_for_slowed_peer(s.slowed_busy || s.paces_peers, s.memory_ratio());
    let judged = input.group.pending_busy == usize::from(s.pending_busy);
    // Behind peers that spin while they wait for it: a straggler, not a loader (a starving
    // loader holds back every rank alike).
    // One pause (a checkpoint save, an evaluation pass) that alone brings the level into the
    // band is no starving loader: the rest of the window is busy.
    let starving = !peers.behind
        && ((cycling
            && mean.is_some_and(|m| band.contains(&m))
            && !one_pause(input.history, t, t.starvation_max_mean))
            || from_steps);
    // Bubbles worth naming are a wait worth naming: a stage busy at ~97 % while it runs and
    // idle 15 % of the time reads at most `starvation_max_mean`, as a starving GPU does.
    // (`bubbles_max_mean`, higher, says which of its peers may be stages.) Behind replicas that spin while it idles, it is their straggler: they read busy at its
    // idle moments, as a pipeline's next stage would (fit set: data-parallel stragglers named
    // bubbles on the ticks they read so, late to be named stragglers — straggler recall 0.870
    // → 0.913, precision 0.984 → 0.955; bubbles 0.952 / 0.888 → 0.959 / 0.881).
    let bubbling = cycling && !peers.behind && mean.is_some_and(|m| m <= t.starvation_max_mean);
    let wait = if !allocated || !judged || waits { Wait::None } else { classify(input, starving, bubbling) };
    // A job that has not run yet (loading, compiling) gets a grace period; one that ran and
    // stopped, or has held the GPU idle for longer, does not. Nothing ran within the window: a
    // server answering a burst of requests now and then is idle most of the time, but not idle.
    let idle_allocated = allocated
        && input.past_grace
        && all.active() == 0
        && !peers.imbalance
        && !peers.imbalance_or_own_job
        && (!peers.busy_peer || !input.group.job.known())
        && s.level.is_some_and(|l| l <= t.idle_level)
        && s.hires_max.is_none_or(|m| m <= t.idle_peak);
    WaitHolds { pcie_bound: pcie, wait, idle_allocated }
}

/// Idle *together* (data-parallel ranks waiting on their loaders, steps in lockstep) or *in
/// turn* (pipeline stages waiting on each other): told apart by whether the other GPUs of the
/// job that go busy and idle read idle at the ticks this one does, more than at the ticks it
/// reads busy ([`Swings::co_idling`]).
///
/// - No other GPU of the job goes busy and idle: nothing to be a stage of (a GPU busy
///   throughout is no stage: it never idles) — starvation, when its level is in the band;
///   both named, in a known job whose busy GPUs all hold other memory than it (it waits for
///   another part of its job, or for its own input: [`PeerGroup::waits_on_another_part`]).
/// - Together (co-idling at least [`TOGETHER`]): starvation.
/// - In turn (at most [`IN_TURN`]): bubbles, with the job known, the intervals' levels not
///   moving with the peers' (else both named, [`Undecided::ReadingsDisagree`]) and its GPUs
///   not all holding one memory (else both named, [`Undecided::SameMemory`]); with the job
///   assumed both named (other jobs' GPUs, each starving on its own, read the same as the next
///   stages).
/// - Neither clear, or not readable (stretches shorter than the driver's period, too few clear
///   readings): both named — the readings cannot tell, and the evidence says why.
fn classify(input: &RuleInput<'_>, starving: bool, bubbling: bool) -> Wait {
    let (s, group) = (input.s, input.group);
    // Possible stages or ranks beside it: with the job known, its other GPUs that wait a share
    // worth naming (seen going busy and idle or not: stretches shorter than the driver's
    // period read flat); with the job assumed, only those seen going busy and idle — the
    // others may be anyone's.
    let peers = if group.job.known() {
        group.waiting_some.saturating_sub(usize::from(s.waiting_some))
    } else {
        group.cycling_peers(s.cycling)
    };
    if peers == 0 && (starving || bubbling) && group.waits_on_another_part(s.memory_ratio()) {
        // Alone in waiting beside busy GPUs of its known job that all hold other memory: it waits for another part of its job — an uneven pipeline's slowest stage —
        // or for its own input, if what the job's marks or owner join runs apart from it (a
        // data-parallel rank waiting alone would be its replicas' straggler). Both are named.
        // (Fit set, once stages held their own memory: 4 such stages, called stragglers before,
        // called starved without this.)
        return Wait::CannotTell(Undecided::WaitsOnOtherPart);
    }
    if peers == 0 {
        // With the job assumed and none of the others seen going busy and idle, some of them
        // may still wait a share worth naming, in stretches shorter than the driver's period
        // (read flat, within the interval too): the next stages of a pipeline whose bubbles
        // this GPU's idle stretches are, or other jobs. Nothing says which, and a pipeline
        // stage called starved sends its owner to the loader: both are named. Not when their
        // waits show within the interval (the driver's buffer holds dips and peaks): ranks
        // starving with it read so. (Fit set, 16 000 GPU-runs: starvation precision
        // 0.968 → 0.980, 13 starving GPUs moved to "cannot tell", 9 pipeline stages and
        // stragglers no longer called starved.)
        let others_wait = group.waiting_unseen.saturating_sub(usize::from(s.waiting_unseen)) > 0;
        return match (starving, bubbling && others_wait && !group.job.known()) {
            (true, true) => Wait::CannotTell(Undecided::OthersWaitUnseen),
            (true, false) => Wait::Starved,
            (false, _) => Wait::None,
        };
    }
    if !(starving || bubbling) {
        return Wait::None;
    }
    if s.steps_too_short_for_turns() {
        // Its marked steps are shorter than a few driver periods: the readings cannot show
        // whether the job's other GPUs idle at the same moments, whatever few clear readings
        // the window holds.
        return Wait::CannotTell(Undecided::TooShortToSee);
    }
    match input.window.co_idling() {
        Some(c) if c >= TOGETHER => {
            if starving {
                Wait::Starved
            } else {
                Wait::None
            }
        }
        Some(c) if c <= input.latches.in_turn_bound() => {
            if !bubbling {
                Wait::None
            } else if !group.job.known() {
                Wait::CannotTell(Undecided::NoJobKnown)
            } else if input.window.level_correlation().is_some_and(|r| r >= LEVELS_MOVE_TOGETHER) {
                // The latest readings idle in turn, but the intervals' levels rise and fall with
                // the peers': ranks in lockstep whose driver samples fall at other moments read
                // so (one reads the wait, the other the compute after it), pipeline stages do not.
                Wait::CannotTell(Undecided::ReadingsDisagree)
            } else if group.holds_one_memory() {
                // In turn, but the job's GPUs hold one memory, as replicas do
                // (`Undecided::SameMemory`). Fit set, 48 000 GPU-runs: every one of the 46
                // GPU-runs wrongly called bubbles was a data-parallel rank starving, its job's
                // GPUs holding one memory; with this, bubbles 0.875 / 0.915 → 1.000 / 0.914 (3
                // stages of balanced GPipe pipelines named both instead).
                Wait::CannotTell(Undecided::SameMemory)
            } else {
                Wait::Bubbles
            }
        }
        Some(_) => Wait::CannotTell(Undecided::Mixed),
        // A window too short to hold three clear idle and three clear busy readings (an
        // interval holding several driver samples reads in between at its end): the intervals'
        // own means, every sample of them, still say whether the job's GPUs wait at the same
        // moments. Only there: on the fit set, with windows of 15 ticks and more, it traded
        // more wrong starvation for fewer "cannot tell".
        None if input.history.capacity() < SHORT_WINDOW_TICKS => match input.window.level_correlation() {
            Some(r) if r >= TOGETHER_LEVELS => {
                if starving {
                    Wait::Starved
                } else {
                    Wait::None
                }
            }
            Some(r) if r <= IN_TURN_LEVELS && bubbling && group.job.known() => Wait::Bubbles,
            Some(r) if r <= IN_TURN_LEVELS && bubbling => Wait::CannotTell(Undecided::NoJobKnown),
            Some(_) => Wait::CannotTell(Undecided::Mixed),
            None => Wait::CannotTell(Undecided::TooShortToSee),
        },
        None => Wait::CannotTell(Undecided::TooShortToSee),
    }
}

/// Windows shorter than this many ticks fall back on the intervals' levels to tell together
/// from in turn: four times the three clear readings per side co-idling needs.
const SHORT_WINDOW_TICKS: usize = 12;

/// Correlation of the intervals' levels with the peers' ([`Swings::level_correlation`]) from
/// which GPUs wait together, and up to which in turn: the fallback when too few readings are
/// clearly idle or busy to compare them.
pub(crate) const TOGETHER_LEVELS: f64 = 0.9;
pub(crate) const IN_TURN_LEVELS: f64 = 0.3;

/// Correlation of the intervals' levels with the peers' from which GPUs whose latest readings
/// idle in turn are not taken for pipeline stages: each interval's level reads every driver
/// sample in it, so it follows a shared wait whatever moments the samples fall at. Tuned on the
/// fit set (16 000 GPU-runs, with the busy-and-idle and bubbles-level changes of the same
/// commit): without it pipeline bubbles read 0.875 / 0.843 (91 named), at 0.5 0.988 / 0.833
/// (80), at 0.7 0.945 / 0.835 (86) — the wrong ones data-parallel ranks starving in lockstep,
/// whose levels correlate 0.5–0.97 with their peers'. Not lower: a 1F1B staircase's last stage
/// shares the step-boundary dip with the stages before it, and its levels correlate up to
/// 0.64 with theirs (`tests/staircase.rs`).
pub(crate) const LEVELS_MOVE_TOGETHER: f64 = 0.7;

/// Co-idling ([`Swings::co_idling`]) from which GPUs idle *together*: at the moments it idles,
/// most of its peers do too, and at the moments it is busy, few do.
pub(crate) const TOGETHER: f64 = 0.65;

/// Co-idling up to which GPUs idle *in turn*: its peers idle little more when it idles than
/// when it is busy (pipeline stages: as often or less; a staircase's neighbours share part of
/// each bubble). 0.2 before; 0.3 on the fit set once the driver's period was measured right
/// and lockstep ranks sampled at other moments were told by their levels: pipeline bubbles
/// 0.977 / 0.848 (84 named) → 0.952 / 0.888 (119), starvation unchanged.
pub(crate) const IN_TURN: f64 = 0.3;

/// Co-idling up to which a GPU whose verdict was already bubbles keeps reading in turn: the
/// in-turn bound's hysteresis ([`super::Latches`]), as the pattern's
/// (`Swings::still_busy_and_idle`). A pipeline stage whose
/// neighbours share part of each of its bubbles (a staircase) reads co-idling near 0.3, one
/// reading more or less in or out of the window moving it across: its verdict went from bubbles
/// to "neither clearly" and back from tick to tick, and neither held on 80 % of the window's
/// ticks within two windows of its onset (fit set, 48 000 GPU-runs: most of the pipeline stages
/// named late). Once read in turn, it stays in turn until co-idling passes this. Fit set, with
/// the pattern's hysteresis: bubbles 1.000 / 0.920 → 1.000 / 0.932, nothing else moved.
pub(crate) const IN_TURN_HELD: f64 = 0.35;

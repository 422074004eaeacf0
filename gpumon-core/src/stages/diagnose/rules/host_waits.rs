//! Rules for a GPU that waits on something outside it: its input (`dataloader_starvation`),
//! the other stages of its pipeline (`pipeline_bubbles`), one of the two where the data cannot
//! tell which (`starvation_or_bubbles`), host-device copies (`pcie_bound`), or nothing at all
//! (`idle_allocated`).

use super::peers::PeerHolds;
use super::swings::{back_and_forth, readings_spread, Swings, STEP_MIN_SPREAD};
use super::RuleInput;
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
}

/// What the host-side-wait rules conclude on one GPU.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitHolds {
    pub(crate) pcie_bound: bool,
    pub(crate) wait: Wait,
    pub(crate) idle_allocated: bool,
}

/// PCIe-bound, judged over the window: the mean share of the link the copies took (in the
/// busier direction) while the GPU's mean level stays low — the SM waits for the copies. One
/// tick's reading says little: offload traffic comes in bursts between compute phases, so an
/// instantaneous reading holds on some ticks only (61 % in a ZeRO-offload job keeping the link
/// 85 % busy), though the copies hold the GPU back throughout.
pub(crate) fn pcie_bound(window: &Swings, t: &Thresholds) -> bool {
    match (window.pcie_share_mean(), window.mean()) {
        (Some(share), Some(level)) => share >= t.pcie_link_share && level <= t.pcie_max_level,
        _ => false,
    }
}

/// Starvation, bubbles or the undecided pair, the link and idleness (see the module docs).
pub(crate) fn judge(input: &RuleInput<'_>, memory_bound: bool, peers: &PeerHolds) -> WaitHolds {
    let (s, t, all) = (input.s, input.t, &input.window);
    let allocated = s.allocated(t);
    let pcie = pcie_bound(all, t);
    // The level over the window, not this interval's: one interval of a cycle longer than it
    // is all busy or all idle.
    let mean = all.mean();
    let quiet_memory =
        !memory_bound && !pcie && s.memory_controller.is_none_or(|m| m < t.starvation_max_memory_controller);
    // Starvation is busy and idle in turn. Within one interval when the driver's buffer holds
    // enough samples to show both; across the window's ticks otherwise — whatever the number
    // of samples per interval (one, none: the latest reading), the window's low and high
    // readings are both common. Across ticks, the GPU must also go back and forth: a long
    // evaluation pause is as low and as high over the window, once each.
    let within_interval = match (s.hires_min, s.hires_max) {
        (Some(min), Some(max)) => min <= t.starvation_dip && max >= t.starvation_peak,
        _ => false,
    };
    let cycling = quiet_memory
        && (within_interval || (all.busy_and_idle() && back_and_forth(input.history, s.swing(input.together, t), t)));
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
    let from_steps = all.step_mean().is_some_and(|m| band.contains(&m))
        && quiet_memory
        && !peers.behind
        && readings_spread(input.extremes, s) >= STEP_MIN_SPREAD;
    // Waiting for a slowed peer (see `PeerGroup::slowed`): the idle stretches and the lower
    // level are the wait at each step, and the slowed GPU's finding names the cause. Not while
    // another GPU is busy on every reading so far but has too few readings to tell whether it
    // is busy throughout — what this GPU would be waiting for.
    let waits = input.group.waits_for_slowed_peer(s.slowed_busy || s.paces_peers);
    let judged = input.group.pending_busy == usize::from(s.pending_busy);
    let starving = (cycling && mean.is_some_and(|m| band.contains(&m))) || from_steps;
    let bubbling = cycling && mean.is_some_and(|m| m <= t.bubbles_max_mean);
    let wait = if !allocated || !judged || waits { Wait::None } else { classify(input, starving, bubbling) };
    // A job that has not run yet (loading, compiling) gets a grace period; one that ran and
    // stopped, or has held the GPU idle for longer, does not. Nothing ran within the window: a
    // server answering a burst of requests now and then is idle most of the time, but not idle.
    let idle_allocated = allocated
        && input.past_grace
        && all.active() == 0
        && !peers.imbalance
        && !peers.busy_peer
        && s.level.is_some_and(|l| l <= t.idle_level)
        && s.hires_max.is_none_or(|m| m <= t.idle_peak);
    WaitHolds { pcie_bound: pcie, wait, idle_allocated }
}

/// Idle *together* (data-parallel ranks waiting on their loaders, steps in lockstep) or *in
/// turn* (pipeline stages waiting on each other): told apart by whether the other GPUs of the
/// job read idle at the ticks this one does.
///
/// - No other GPU of the job cycles: nothing to be a stage of (a GPU busy throughout is no
///   stage: it never idles) — starvation, when its level is in the band.
/// - Steps shorter than [`super::TURN_PERIODS`] driver periods: together and in turn read the
///   same; the steps decide, and the evidence names bubbles as the look-alike.
/// - In turn, with the job known or three GPUs cycling: bubbles; else both named.
/// - Together: starvation.
fn classify(input: &RuleInput<'_>, starving: bool, bubbling: bool) -> Wait {
    let s = input.s;
    let alone = input.group.cycling_peers(s.cycling) == 0;
    if alone {
        return if starving { Wait::Starved } else { Wait::None };
    }
    if s.steps_too_short_for_turns() {
        // Together and in turn read the same: the steps decide (the hand corpus' marked
        // data-parallel ranks), and the evidence names bubbles as the look-alike.
        return if starving { Wait::Starved } else { Wait::None };
    }
    if input.window.staggered() {
        // In turn with the job assumed: three or more GPUs cycling in turn are a pipeline's
        // pattern; two may as well be two jobs each starving on its own.
        let stages = input.group.cycling_peers(s.cycling) + 1;
        if !bubbling {
            Wait::None
        } else if input.group.job.known() || stages >= 3 {
            Wait::Bubbles
        } else {
            Wait::CannotTell(Undecided::NoJobKnown)
        }
    } else if starving {
        Wait::Starved
    } else {
        Wait::None
    }
}

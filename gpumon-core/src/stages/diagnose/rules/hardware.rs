//! Rules for limits of the hardware itself: clocks held down (`thermal_throttling`,
//! `power_throttling`, `external_slowdown`), memory (`near_oom`, `memory_bound`) and errors
//! (`hardware_errors`). Each reads one GPU at one tick; none compares GPUs.

use super::{slot, Holds, TickStats};
use crate::model::ClockEventReasons;
use crate::stages::diagnose::finding::FindingKind;
use crate::stages::diagnose::Thresholds;

/// What the hardware-limit rules conclude on one GPU at one tick.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LimitHolds {
    pub(crate) memory_bound: bool,
    pub(crate) thermal: bool,
    pub(crate) power: bool,
    pub(crate) external: bool,
    pub(crate) near_oom: bool,
    pub(crate) errors: bool,
}

/// Every hardware-limit rule on `s`; `active`: the findings raised now (near-OOM's hysteresis).
pub(crate) fn judge(s: &TickStats, active: &Holds, t: &Thresholds) -> LimitHolds {
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
    let oom_mark = if active[slot(FindingKind::NearOom)] { t.near_oom_clear } else { t.near_oom_raise };
    let near_oom = s.memory_ratio().is_some_and(|r| r >= oom_mark);
    // A link that is down costs bandwidth but is not by itself news every tick; its going down
    // shows as a recovery error (rising counters), which is.
    let errors = s.ecc_new > 0 || s.xid_new > 0 || s.remap_trouble || s.nvlink_errors_new > 0;
    LimitHolds { memory_bound: memory_bound(s, t), thermal, power, external, near_oom, errors }
}

/// SM activity low while DRAM bandwidth (or the memory controller) is near its peak.
fn memory_bound(s: &TickStats, t: &Thresholds) -> bool {
    let level = s.level;
    let low_sm = match s.sm_activity.or(level) {
        Some(sm) => {
            sm <= t.memory_bound_max_sm_activity
                && (s.dram.is_some_and(|d| d >= t.memory_bound_min_bandwidth)
                    || s.memory_controller.is_some_and(|m| m >= t.memory_bound_min_bandwidth))
        }
        None => false,
    };
    // Without GPM, the level stands in for SM activity, and a memory-bound kernel that runs
    // all the time reads busy: the memory controller, busy nearly all the time, decides.
    low_sm
        || (s.sm_activity.is_none()
            && level.is_some()
            && s.memory_controller.is_some_and(|m| m >= t.memory_bound_min_controller))
}

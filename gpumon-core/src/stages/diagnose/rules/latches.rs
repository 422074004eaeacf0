//! The bubbles verdict's hysteresis, per GPU: a verdict reached at one bound holds until a
//! looser one is lost, as a thermostat's switch does. Stages sitting at either bound flipped
//! verdict tick by tick, and none held on enough of the window's ticks to be raised within two
//! windows (fit set, 48 000 GPU-runs: 15 of the 31 pipeline stages missed were named late).

use super::host_waits::{Wait, IN_TURN, IN_TURN_HELD};
use super::Swings;

/// What a GPU's window has shown that holds at a looser bound since. Kept on its track and
/// cleared when the GPU is released: a job starting on it later owes nothing to the last one's
/// verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Latches {
    /// A full window showed busy and idle in turn ([`Swings::busy_and_idle`]), and every window
    /// since has kept half the idle readings that asks for ([`Swings::still_busy_and_idle`]).
    pattern_seen: bool,
    /// Its verdict was pipeline bubbles, and its co-idling has stayed within [`IN_TURN_HELD`]
    /// since.
    turns_seen: bool,
}

impl Latches {
    /// The busy-and-idle pattern over `window`, at the bound this GPU is held to.
    pub(crate) fn pattern(self, window: &Swings) -> bool {
        window.busy_and_idle() || (self.pattern_seen && window.still_busy_and_idle())
    }

    /// The co-idling up to which this GPU reads in turn: [`IN_TURN`], or [`IN_TURN_HELD`] once
    /// its verdict was bubbles.
    pub(crate) fn in_turn_bound(self) -> f64 {
        if self.turns_seen {
            IN_TURN_HELD
        } else {
            IN_TURN
        }
    }

    /// After a tick's verdict `wait` on `window` (this tick included). The pattern is latched
    /// from a `full` window only: while it fills, one idle reading among twenty is a twentieth.
    pub(crate) fn update(&mut self, window: &Swings, full: bool, wait: Wait) {
        self.pattern_seen = (full && window.busy_and_idle()) || (self.pattern_seen && window.still_busy_and_idle());
        self.turns_seen =
            wait == Wait::Bubbles || (self.turns_seen && window.co_idling().is_some_and(|c| c <= IN_TURN_HELD));
    }
}

//! The window's running counts: busy and idle in turn, idle together or in turn, the level,
//! the marked steps, the link share and the gap to the peers — kept up to date as ticks enter
//! and leave the window rather than re-read from it.

use super::{Past, TickStats};
use crate::stages::diagnose::window::Ring;
use crate::stages::diagnose::Thresholds;

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
    /// The latest reading was near idle.
    idle_now: bool,
    /// The mean utilisation of the steps reported at the tick, in millionths.
    step_micros: Option<i64>,
    /// The PCIe link share, in millionths.
    pcie_micros: Option<i64>,
    /// The gap to the job's busy peers, in millionths.
    gap_micros: Option<i64>,
    /// The latest reading was busy.
    busy_now: bool,
    /// The steps reported at the tick were idle a share worth naming (their mean utilisation
    /// at or below `starvation_max_mean`).
    step_waits: bool,
    /// The share of the job's other GPUs that can idle (not busy throughout) reading idle
    /// now, in millionths; `None` without such a GPU.
    peers_idle_micros: Option<i64>,
    /// The mean level of the job's other GPUs this tick, in millionths; `None` without one.
    peers_level_micros: Option<i64>,
    /// Nothing had run on it yet (its job loading): the tick is counted apart, in
    /// [`Swings::loading`], and in nothing else.
    loading: bool,
}

/// The numbers of one tick a [`SwingReading`] is made of (a tick's or its [`Past`]'s).
struct SwingInputs {
    util: Option<f64>,
    hires_min: Option<f64>,
    hires_max: Option<f64>,
    level: Option<f64>,
    step_level: Option<f64>,
    pcie_share: Option<f64>,
    peer_gap: Option<f64>,
    peers_idle: Option<f64>,
    peers_level: Option<f64>,
    worked: bool,
}

/// A reading from the numbers a tick keeps; `None` without any utilisation. A NaN is no number:
/// [`Reading`] keeps it as absent, and in and out must agree.
fn swing_reading(i: SwingInputs, t: &Thresholds) -> Option<SwingReading> {
    let ok = |v: Option<f64>| v.filter(|v| !v.is_nan());
    let (util, hires_min, hires_max, level) = (ok(i.util), ok(i.hires_min), ok(i.hires_max), ok(i.level));
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
        step_micros: ok(i.step_level).map(micros),
        pcie_micros: ok(i.pcie_share).map(micros),
        gap_micros: ok(i.peer_gap).map(micros),
        busy_now: util.is_some_and(|u| u >= t.starvation_peak),
        step_waits: ok(i.step_level).is_some_and(|m| m <= t.starvation_max_mean),
        peers_idle_micros: ok(i.peers_idle).map(micros),
        peers_level_micros: ok(i.peers_level).map(micros),
        loading: !i.worked,
    })
}

impl TickStats {
    /// This tick's part in the swings.
    pub(crate) fn swing(&self, t: &Thresholds) -> Option<SwingReading> {
        let inputs = SwingInputs {
            util: self.util,
            hires_min: self.hires_min,
            hires_max: self.hires_max,
            level: self.level,
            step_level: self.step_level,
            pcie_share: self.pcie_share,
            peer_gap: self.peer_gap,
            peers_idle: self.peers_idle,
            peers_level: self.peers_level,
            worked: self.worked,
        };
        swing_reading(inputs, t)
    }
}

impl Past {
    /// The part it played in the swings (with the thresholds it was counted in with).
    pub(crate) fn swing(&self, t: &Thresholds) -> Option<SwingReading> {
        let inputs = SwingInputs {
            util: self.util.get(),
            hires_min: self.hires_min.get(),
            hires_max: self.hires_max.get(),
            level: self.level.get(),
            step_level: self.step_level.get(),
            pcie_share: self.pcie_share.get(),
            peer_gap: self.peer_gap.get(),
            peers_idle: self.peers_idle.get(),
            peers_level: self.peers_level.get(),
            worked: self.worked,
        };
        swing_reading(inputs, t)
    }
}

/// Whether the readings went from idle to busy or back at least four times over the window
/// (this tick included): two cycles or more. An interval whose own samples hold both counts as
/// one change. Read from the window only when the counts already show the pattern (a starving
/// GPU), so a healthy tick never scans.
pub(crate) fn back_and_forth(history: &Ring<Past>, now: Option<SwingReading>, t: &Thresholds) -> bool {
    let mut last: Option<bool> = None;
    let mut changes = 0;
    for r in history.iter().map(|h| h.swing(t)).chain([now]).flatten().filter(|r| !r.loading) {
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
    /// Ticks whose latest reading was near idle.
    idle_now: usize,
    /// Ticks at which steps were reported, and the sum of their steps' mean utilisation, in
    /// millionths.
    steps: usize,
    step_sum_micros: i64,
    /// … and those whose steps were idle a share worth naming.
    steps_waiting: usize,
    /// Ticks with a link share read, and its sum; ticks with a gap to busy peers, and its sum
    /// (millionths).
    pcie: usize,
    pcie_sum_micros: i64,
    gaps: usize,
    gap_sum_micros: i64,
    /// Ticks whose latest reading was idle with a link share read, and the share's sum: the
    /// link while the SMs wait (millionths).
    idle_pcie: usize,
    idle_pcie_sum_micros: i64,
    /// The same over the ticks it read busy: the link while the SMs compute.
    busy_pcie: usize,
    busy_pcie_sum_micros: i64,
    /// Whether the job's other GPUs idle with this one: over the ticks it read idle, and over
    /// those it read busy, how many had peers that can idle and the sum of the share of them
    /// reading idle (millionths).
    co_idle: usize,
    co_idle_sum_micros: i64,
    co_busy: usize,
    co_busy_sum_micros: i64,
    /// Its level (x) against its peers' mean level (y), tick by tick: count and sums of x, y,
    /// x², y² and xy (millionths; products in millionths squared), for their correlation.
    co_level: CoLevel,
    /// Ticks before anything ran on it (its job loading, compiling; see
    /// [`TickStats::worked`](super::TickStats::worked)): counted in nothing else — they say
    /// nothing of how its steps wait — but a GPU that spent part of the window loading was not
    /// busy throughout it.
    loading: usize,
}

/// Running sums for the correlation of a GPU's level with its peers' (see
/// [`Swings::level_correlation`]). Integers add and subtract exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CoLevel {
    n: i64,
    x: i64,
    y: i64,
    xx: i128,
    yy: i128,
    xy: i128,
}

impl CoLevel {
    fn add(&mut self, x: i64, y: i64, sign: i64) {
        self.n += sign;
        self.x += sign * x;
        self.y += sign * y;
        let s = i128::from(sign);
        self.xx += s * i128::from(x) * i128::from(x);
        self.yy += s * i128::from(y) * i128::from(y);
        self.xy += s * i128::from(x) * i128::from(y);
    }
}

impl Swings {
    /// Readings in the window.
    pub(crate) fn readings(&self) -> usize {
        self.n
    }

    /// Ticks on which something ran.
    pub(crate) fn active(&self) -> usize {
        self.active
    }

    /// Ticks low and high.
    pub(crate) fn low_high(&self) -> (usize, usize) {
        (self.low, self.high)
    }

    /// Ticks with marked steps.
    pub(crate) fn step_ticks(&self) -> usize {
        self.steps
    }

    /// Most ticks with marked steps had steps idle a share worth naming: the waiting is the
    /// rule, not a slow step or two (a checkpoint, an evaluation) pulling the mean down.
    pub(crate) fn most_steps_wait(&self) -> bool {
        self.steps_waiting * 2 > self.steps
    }

    /// The mean PCIe link share over the ticks that read it.
    pub(crate) fn pcie_share_mean(&self) -> Option<f64> {
        (self.pcie > 0).then(|| self.pcie_sum_micros as f64 / 1e6 / self.pcie as f64)
    }

    /// The mean gap to the job's busy peers over the ticks they were busy, and how many.
    pub(crate) fn peer_gap_mean(&self) -> Option<f64> {
        (self.gaps >= MIN_PATTERN_TICKS).then(|| self.gap_sum_micros as f64 / 1e6 / self.gaps as f64)
    }

    pub(crate) fn peer_gap_ticks(&self) -> usize {
        self.gaps
    }

    /// The mean link share over the ticks the GPU read idle (its SMs waiting), once at least
    /// [`MIN_SIDE_TICKS`] did.
    pub(crate) fn idle_pcie_share_mean(&self) -> Option<f64> {
        (self.idle_pcie >= MIN_SIDE_TICKS).then(|| self.idle_pcie_sum_micros as f64 / 1e6 / self.idle_pcie as f64)
    }

    /// The mean link share over the ticks the GPU read busy (its SMs computing), once at least
    /// [`MIN_SIDE_TICKS`] did.
    pub(crate) fn busy_pcie_share_mean(&self) -> Option<f64> {
        (self.busy_pcie >= MIN_SIDE_TICKS).then(|| self.busy_pcie_sum_micros as f64 / 1e6 / self.busy_pcie as f64)
    }

    /// The correlation of its level (the interval's mean) with its job's other GPUs' mean level,
    /// tick by tick over the window: near 1 for ranks in lockstep, whose intervals hold the
    /// same share of waiting, lower for pipeline stages, whose waits fall at other moments.
    /// It reads every driver sample of an interval, where [`Swings::co_idling`] reads the
    /// latest one. `None` with fewer than [`MIN_PATTERN_TICKS`] ticks, or with levels that
    /// hardly move (a standard deviation under 5 points, its own or its peers'): nothing to
    /// correlate.
    pub(crate) fn level_correlation(&self) -> Option<f64> {
        let c = &self.co_level;
        if c.n < MIN_PATTERN_TICKS as i64 {
            return None;
        }
        let n = i128::from(c.n);
        let (x, y) = (i128::from(c.x), i128::from(c.y));
        // n² × variance and n² × covariance, in millionths squared.
        let (vx, vy, cov) = (n * c.xx - x * x, n * c.yy - y * y, n * c.xy - x * y);
        let floor = (n as f64 * 0.05e6).powi(2);
        if (vx as f64) < floor || (vy as f64) < floor {
            return None;
        }
        Some(cov as f64 / ((vx as f64).sqrt() * (vy as f64).sqrt()))
    }

    /// Whether the job's other GPUs idle *with* this one: the share of them reading idle at
    /// the ticks it read idle, less that share at the ticks it read busy. Near 1 for
    /// data-parallel ranks in lockstep (they wait for their input at the same moments), near 0
    /// or below for pipeline stages and unrelated jobs (they idle at other moments). `None`
    /// until it read idle and busy on [`MIN_SIDE_TICKS`] ticks each with such peers.
    pub(crate) fn co_idling(&self) -> Option<f64> {
        (self.co_idle >= MIN_SIDE_TICKS && self.co_busy >= MIN_SIDE_TICKS).then(|| {
            let idle = self.co_idle_sum_micros as f64 / 1e6 / self.co_idle as f64;
            let busy = self.co_busy_sum_micros as f64 / 1e6 / self.co_busy as f64;
            idle - busy
        })
    }

    /// The share of the job's other GPUs reading idle at the ticks this one read idle, on
    /// average (the idle side of [`Swings::co_idling`]); `None` before [`MIN_SIDE_TICKS`] such
    /// ticks.
    pub(crate) fn peers_idle_when_idle(&self) -> Option<f64> {
        (self.co_idle >= MIN_SIDE_TICKS).then(|| self.co_idle_sum_micros as f64 / 1e6 / self.co_idle as f64)
    }

    /// Counts a tick in (it entered the window).
    pub(crate) fn entered(&mut self, r: Option<SwingReading>) {
        if r.is_some_and(|r| r.loading) {
            self.loading += 1;
        } else if let Some(r) = r {
            self.n += 1;
            self.low += usize::from(r.low);
            self.high += usize::from(r.high);
            self.active += usize::from(r.active);
            self.sum_micros += r.level_micros;
            self.idle_now += usize::from(r.idle_now);
            if let Some(m) = r.step_micros {
                self.steps += 1;
                self.step_sum_micros += m;
                self.steps_waiting += usize::from(r.step_waits);
            }
            if let Some(m) = r.pcie_micros {
                self.pcie += 1;
                self.pcie_sum_micros += m;
            }
            if let Some(m) = r.gap_micros {
                self.gaps += 1;
                self.gap_sum_micros += m;
            }
            if let (true, Some(m)) = (r.idle_now, r.pcie_micros) {
                self.idle_pcie += 1;
                self.idle_pcie_sum_micros += m;
            }
            if let (true, Some(m)) = (r.busy_now, r.pcie_micros) {
                self.busy_pcie += 1;
                self.busy_pcie_sum_micros += m;
            }

            if let Some(y) = r.peers_level_micros {
                self.co_level.add(r.level_micros, y, 1);
            }
            if let Some(m) = r.peers_idle_micros {
                if r.idle_now {
                    self.co_idle += 1;
                    self.co_idle_sum_micros += m;
                } else if r.busy_now {
                    self.co_busy += 1;
                    self.co_busy_sum_micros += m;
                }
            }
        }
    }

    /// Counts a tick out (it left the window); the reading must be the one counted in.
    pub(crate) fn left(&mut self, r: Option<SwingReading>) {
        if r.is_some_and(|r| r.loading) {
            self.loading -= 1;
        } else if let Some(r) = r {
            self.n -= 1;
            self.low -= usize::from(r.low);
            self.high -= usize::from(r.high);
            self.active -= usize::from(r.active);
            self.sum_micros -= r.level_micros;
            self.idle_now -= usize::from(r.idle_now);
            if let Some(m) = r.step_micros {
                self.steps -= 1;
                self.step_sum_micros -= m;
                self.steps_waiting -= usize::from(r.step_waits);
            }
            if let Some(m) = r.pcie_micros {
                self.pcie -= 1;
                self.pcie_sum_micros -= m;
            }
            if let Some(m) = r.gap_micros {
                self.gaps -= 1;
                self.gap_sum_micros -= m;
            }
            if let (true, Some(m)) = (r.idle_now, r.pcie_micros) {
                self.idle_pcie -= 1;
                self.idle_pcie_sum_micros -= m;
            }
            if let (true, Some(m)) = (r.busy_now, r.pcie_micros) {
                self.busy_pcie -= 1;
                self.busy_pcie_sum_micros -= m;
            }

            if let Some(y) = r.peers_level_micros {
                self.co_level.add(r.level_micros, y, -1);
            }
            if let Some(m) = r.peers_idle_micros {
                if r.idle_now {
                    self.co_idle -= 1;
                    self.co_idle_sum_micros -= m;
                } else if r.busy_now {
                    self.co_busy -= 1;
                    self.co_busy_sum_micros -= m;
                }
            }
        }
    }

    /// At least a twentieth of the ticks low and a tenth high; five ticks at least (fewer show
    /// no pattern).
    pub(crate) fn busy_and_idle(&self) -> bool {
        // A tenth busy, a twentieth idle: a driver sample that straddles a busy/idle edge reads
        // in between, so when a busy or idle stretch is not much longer than the driver's period
        // few readings are clearly either — a pipeline stage whose one bubble per step lasts a
        // period or two reads clearly idle on one tick in twelve to twenty (on the fit set, a
        // tenth missed a third of the stages in the shown region). Enough, with the
        // back-and-forth check and the mean's bounds: healthy work never reads idle, and a pause
        // (checkpoint, evaluation) is one cycle.
        self.busy_and_idle_with(0.05)
    }

    /// Half the idle readings [`Swings::busy_and_idle`] asks for (a fortieth of the ticks), and
    /// as many busy ones: the pattern's lower bound once it was seen. A stage whose one bubble
    /// per step lasts about a driver period reads clearly idle on about a twentieth of its
    /// ticks, one reading more or less as each enters or leaves the window: at one bound, the
    /// pattern held on some ticks and not the next, and the rules built on it held on too few
    /// of the window's ticks to be raised within two windows (fit set, 48 000 GPU-runs: 15 of
    /// the 31 pipeline stages missed were named late). A pattern seen holds until its idle
    /// readings fall below this, as a thermostat's switch does; readings that never reached the
    /// upper bound never count. Fit set: bubbles recall 0.911 → 0.920, nothing else moved (a
    /// thirtieth without the hysteresis: 0.917, and straggler precision 0.950 → 0.898 — more
    /// GPUs counted as cycling for the pacing test).
    pub(crate) fn still_busy_and_idle(&self) -> bool {
        self.busy_and_idle_with(0.025)
    }

    /// At least `idle_share` of the ticks low and a tenth high, over five ticks at least (fewer
    /// show no pattern): [`Swings::busy_and_idle`] and its held bound.
    fn busy_and_idle_with(&self, idle_share: f64) -> bool {
        if self.n < MIN_PATTERN_TICKS {
            return false;
        }
        let share = |k: usize| k as f64 / self.n as f64;
        share(self.low) >= idle_share && share(self.high) >= 0.1
    }

    /// Busy on every reading so far, too few of them yet for [`Swings::busy_throughout`].
    pub(crate) fn busy_so_far(&self) -> bool {
        self.n > 0 && self.n < MIN_PATTERN_TICKS && self.low == 0 && self.high == self.n
    }

    /// Busy on every tick of the window: no tick low, nine in ten or more high, and five ticks
    /// at least.
    pub(crate) fn busy_throughout(&self) -> bool {
        self.n >= MIN_PATTERN_TICKS && self.loading == 0 && self.low == 0 && self.high * 10 >= self.n * 9
    }

    /// The mean level over the window's ticks.
    pub(crate) fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum_micros as f64 / 1e6 / self.n as f64)
    }

    /// The mean utilisation of the marked steps over the window, once at least
    /// [`MIN_STEP_TICKS`] ticks reported steps.
    pub(crate) fn step_mean(&self) -> Option<f64> {
        (self.steps >= MIN_STEP_TICKS).then(|| self.step_sum_micros as f64 / 1e6 / self.steps as f64)
    }
}

/// Readings a window needs before it shows a pattern across ticks: busy and idle in turn, busy
/// throughout ([`super::MIN_WINDOW_TICKS`], the same five).
const MIN_PATTERN_TICKS: usize = crate::stages::diagnose::MIN_WINDOW_TICKS;

/// How many driver sampling periods a step must span for idle stretches to be told together or
/// in turn.
pub(crate) const TURN_PERIODS: f64 = 4.0;

/// Ticks on each side (idle, busy) a comparison of the two needs: fewer say nothing.
const MIN_SIDE_TICKS: usize = 3;

/// Ticks with reported steps the window needs before the steps decide starvation: one slow
/// step (a checkpoint, an evaluation) must not.
const MIN_STEP_TICKS: usize = 3;

fn micros(u: f64) -> i64 {
    // A ratio, so far inside i64 (NaN never gets here: `Swings` skips it).
    (u * 1e6).round() as i64
}

/// Whether one pause explains the window's idling: its longest idle stretch (consecutive ticks
/// reading idle, two or more) holds at least [`PAUSE_SHARE`] of the window's idle ticks, and
/// without it the window's level is above `max_mean`. A checkpoint save or an evaluation pass
/// idles every GPU of a job at once, as a starving loader does, but once: a loader starves
/// the job at every step, in stretches of like length.
pub(crate) fn one_pause(history: &Ring<Past>, t: &Thresholds, max_mean: f64) -> bool {
    let (mut idle, mut longest, mut longest_end, mut current) = (0usize, 0usize, 0usize, 0usize);
    for (i, r) in history.iter().map(|h| h.swing(t)).enumerate() {
        if r.is_some_and(|r| r.low && !r.high && !r.loading) {
            idle += 1;
            current += 1;
            if current > longest {
                (longest, longest_end) = (current, i);
            }
        } else {
            current = 0;
        }
    }
    if longest < 2 || (longest as f64) < PAUSE_SHARE * idle as f64 {
        return false;
    }
    let pause = (longest_end + 1 - longest)..=longest_end;
    let (mut sum, mut n) = (0.0, 0usize);
    for (i, level) in history.iter().map(|h| h.level.get().filter(|_| h.worked)).enumerate() {
        if let Some(level) = level.filter(|_| !pause.contains(&i)) {
            sum += level;
            n += 1;
        }
    }
    n > 0 && sum / n as f64 > max_mean
}

/// The share of a window's idle ticks one stretch must hold to be a pause ([`one_pause`]).
pub(crate) const PAUSE_SHARE: f64 = 0.5;

/// Mean length, seconds, of the window's idle stretches (consecutive ticks whose readings were
/// all near idle: low and not busy), how many there were, and how many ticks they hold in all;
/// `None` without one. A tick
/// that reads both idle and busy (a loader's gap within the interval) breaks a stretch, so gaps
/// between batches shorter than the interval count as none.
pub(crate) fn idle_stretches(history: &Ring<Past>, t: &Thresholds) -> Option<(f64, usize, usize)> {
    let (first, last) = (history.first()?, history.last()?);
    let n = history.iter().count();
    let span = last.at.duration_since(first.at).ok()?.as_secs_f64();
    if n < 2 || span <= 0.0 {
        return None;
    }
    let interval = span / (n - 1) as f64;
    let (mut runs, mut ticks, mut current) = (0usize, 0usize, 0usize);
    for r in history.iter().map(|h| h.swing(t)) {
        if r.is_some_and(|r| r.low && !r.high && !r.loading) {
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
    (runs > 0).then(|| (ticks as f64 * interval / runs as f64, runs, ticks))
}

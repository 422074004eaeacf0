//! The diagnosis stage's phases, one tick at a time: read every device into its job's group,
//! judge each device (ask the rules, update its window, raise and clear), retire the devices
//! that left, publish the diagnosis.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use super::finding::{BusyGpu, Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, Transition};
use super::rules::evidence::PeerContext;
use super::rules::host_waits::{Undecided, Wait};
use super::rules::{self, Counters, Holds, JobKey, PeerGroup, RuleInput, TickStats};
use super::window::{Ring, Tallies};
use super::{clears, tracing_warn_unjudged, Diagnoser, Raised, RaisedSet, Track};
use crate::model::{DeviceSample, Snapshot};
use crate::stages::steps::Steps;

impl Diagnoser {
    /// Phase 1: reads every device once into the scratch stats, and sums each job's GPUs up
    /// into its [`PeerGroup`] for the rules that compare peers.
    pub(super) fn read_devices(&mut self, snapshot: &Snapshot) {
        let t = self.config.thresholds;
        self.scratch.clear();
        self.groups.clear();
        let steps = snapshot.output::<Steps>();
        // One read of the run's pids per tick (a clone of an `Arc`), none without a run.
        let run = self.run_job.as_ref().map(super::RunJob::pids);
        self.groups.index_processes(&snapshot.devices);
        for (position, d) in snapshot.devices.iter().enumerate() {
            let mut stats = self.read_device(d, snapshot.taken_at, steps);
            stats.job = job_of(d, &stats, run.as_deref(), steps, &self.groups);
            stats.group = self.groups.index_of(stats.job);
            if stats.allocated(&t) {
                let Some(track) = self.tracks.get(d.info.uuid.as_str()) else { continue };
                let group = &mut self.groups.groups[stats.group];
                offer(group, &mut stats, &track.swings, position, &t);
            }
            self.scratch.push(stats);
        }
        self.groups.index_replicas(&self.scratch, &t);
        // The lone busy GPU its job's other GPUs wait for (see `TickStats::paces_peers`).
        for g in 0..self.groups.groups.len() {
            if let Some(position) = self.groups.groups[g].pacing_gpu(t.straggler_gap) {
                self.scratch[position].paces_peers = true;
                self.groups.groups[g].slowed += 1;
                self.groups.groups[g].offer_slowed_memory(self.scratch[position].memory_ratio());
            }
        }
    }

    /// One device's stats at this tick; makes its track on first sight.
    fn read_device(&mut self, d: &DeviceSample, at: SystemTime, steps: Option<&Steps>) -> TickStats {
        let (ticks, tick, t) = (self.ticks, self.tick, self.config.thresholds);
        // Looked up by reference first: cloning the UUID for `entry` would allocate on every
        // tick of every GPU (tests/alloc_steady.rs).
        let track = match self.tracks.get_mut(d.info.uuid.as_str()) {
            Some(track) => track,
            None => self.tracks.entry(d.info.uuid.clone()).or_insert_with(|| Track::new(ticks)),
        };
        track.seen = tick;
        let mut stats = TickStats::read(d, at, &mut track.counters);
        // Whether anything ran on it since it was allocated (see `TickStats::worked`).
        if stats.allocated(&t) {
            track.worked |= stats.hires_max.or(stats.util).is_some_and(|u| u > t.idle_peak);
            stats.worked = track.worked;
        } else {
            track.worked = false;
        }
        // Driver samples per tick: a tick without a window once the GPU has given one took no
        // new sample (NVML has none newer than the last read when the driver's period is longer
        // than the interval) — it counts as none. Counting only the ticks with a window read a
        // 0.8 s driver sampled every 0.33 s as a 0.33 s one.
        // A tick whose read failed says nothing of the driver (the next read brings its samples):
        // the failures are scanned only on a tick without a window.
        let samples = match d.windows.gpu_utilization {
            Some(w) => Some(f64::from(w.count)),
            None if d.errors.iter().any(|e| e.family == crate::metric::Family::HighResolution) => None,
            None => track.driver_samples_per_tick.map(|_| 0.0),
        };
        if let Some(n) = samples {
            // A tenth per tick: steady within a few seconds of ticks, whatever the interval.
            let avg = track.driver_samples_per_tick.map_or(n, |a| a + (n - a) * 0.1);
            track.driver_samples_per_tick = Some(avg);
        }
        // At most NVML's longest period (1 s): samples stopping altogether (the family no longer
        // read) are no slower driver.
        stats.driver_period = track
            .driver_samples_per_tick
            .filter(|a| *a > 0.01)
            .map(|a| (self.interval_secs / a).min(MAX_DRIVER_PERIOD_S));
        if let Some(run) = steps.and_then(|s| s.for_gpu(d.info.index)) {
            stats.step_level = run.reported_utilization(&d.info.uuid);
            stats.step_secs = run.last_duration.map(|d| d.as_secs_f64());
        }
        track.unjudged = stats.allocated(&t) && stats.level.is_none();
        track.no_sm_activity = stats.level.is_some() && stats.sm_activity.is_none();
        if track.unjudged && !track.unjudged_logged {
            track.unjudged_logged = true;
            tracing_warn_unjudged(&d.info.uuid, d.info.mig.is_some());
        }
        stats
    }

    /// Phase 2 for the device at `position`: asks every rule, updates its window, raises and
    /// clears its findings. Whether anything was raised or cleared.
    pub(super) fn judge_device(
        &mut self,
        snapshot: &Snapshot,
        position: usize,
        events: &mut Vec<FindingEvent>,
    ) -> bool {
        let d = &snapshot.devices[position];
        let t = self.config.thresholds;
        let (grace_ticks, raise_at, clear_at) = (self.grace_ticks, self.raise_at, self.clear_at);
        let (tick, refresh_ticks) = (self.tick, self.refresh_ticks as u64);
        let Some(track) = self.tracks.get_mut(d.info.uuid.as_str()) else { return false };
        let group = &self.groups.groups[self.scratch[position].group];
        let mut stats = self.scratch[position];
        stats.peer_gap = rules::peer_gap(&stats, position, &self.groups, &t, self.ticks);
        let allocated = stats.allocated(&t);
        if allocated {
            track.allocated_ticks = track.allocated_ticks.saturating_add(1);
            track.ran |= stats.level.is_some_and(|l| l >= 0.5);
        } else {
            track.allocated_ticks = 0;
            track.ran = false;
            // A job starting on it later owes nothing to this one's verdicts.
            track.latches = rules::Latches::default();
        }
        // In ticks, like the window: a stage fed snapshots faster than real time (a replay, a
        // test) keeps the same semantics.
        let past_grace = track.ran || track.allocated_ticks > grace_ticks;
        let counted = stats.util.is_some() && !stats.busy_throughout;
        // Whether it idles with its peers or in turn is read once something ran on it: before,
        // the job loads and compiles, every GPU of it idle at once — which says nothing of its
        // steps and, in the window, would read as idling together for a window's length.
        let compared = allocated && stats.worked;
        stats.peers_idle = if compared { group.peers_idle(counted, stats.idle_now(&t)) } else { None };
        stats.peers_level = match stats.level {
            Some(level) if compared && group.n >= 2 => Some((group.sum - level) / (group.n - 1) as f64),
            _ => None,
        };
        stats.peers_step_secs = stats.step_secs.filter(|_| compared).and_then(|own| group.peers_step_secs(own));
        let active: Holds = std::array::from_fn(|k| track.raised.is_raised(k));
        let mut window = track.swings;
        window.entered(stats.swing(&t));
        let input = RuleInput {
            s: &stats,
            history: &track.history,
            window,
            group,
            position,
            active: &active,
            past_grace,
            latches: track.latches,
            t: &t,
        };
        let (holds, wait) = rules::evaluate(&input);
        track.latches.update(&window, window.readings() >= self.ticks, wait);
        let undecided = match wait {
            Wait::CannotTell(why) => Some(why),
            _ => None,
        };
        track.swings = window;
        if let Some(left) = track.history.push(stats.past()) {
            track.swings.left(left.swing(&t));
        }
        let enabled: Holds = std::array::from_fn(|k| !self.config.disabled.contains(&FindingKind::ALL[k]));
        track.tallies.push(std::array::from_fn(|k| holds[k] && enabled[k]));
        let mut changed = false;
        for (k, &kind) in FindingKind::ALL.iter().enumerate() {
            let yes = track.tallies.yes(k);
            let raise = match kind {
                FindingKind::HardwareErrors => holds[k],
                _ => yes >= raise_at,
            };
            if !track.raised.is_raised(k) && enabled[k] && raise && rules::confirm_raise(kind, &track.history) {
                let ctx = Judged { stats: &stats, group, position, undecided, t: &t };
                let (finding, raised) = raise_finding(snapshot, track, kind, k, &ctx, tick);
                events.push(FindingEvent { transition: Transition::Raised, finding, held_for: None });
                track.raised.raise(k, raised);
                count_raise(&mut self.raised_total, kind);
                changed = true;
            } else if track.raised.is_raised(k) && (!enabled[k] || clears(kind, yes, clear_at)) {
                if let Some(r) = track.raised.clear(k) {
                    let peers = PeerContext { peer: None, job: stats.job, undecided };
                    let window = (yes, track.history.iter().count());
                    let now = rules::evidence(kind, &stats, &track.history, &peers, window, &t);
                    let mut finding = r.finding;
                    finding.evidence = format!("no longer holds; now: {now}");
                    let held_for = snapshot.taken_at.duration_since(r.raised_at).ok();
                    events.push(FindingEvent { transition: Transition::Cleared, finding, held_for });
                    changed = true;
                }
            } else if track.raised.findings[k].as_ref().is_some_and(|r| tick >= r.formatted + refresh_ticks) {
                // Held: its evidence as of now (the window up to this tick), not as it was raised.
                let ctx = Judged { stats: &stats, group, position, undecided, t: &t };
                let evidence = evidence_now(snapshot, track, kind, k, &ctx);
                if let Some(r) = track.raised.findings[k].as_mut() {
                    r.formatted = tick;
                    if r.finding.evidence != evidence {
                        r.finding.evidence = evidence;
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    /// Phase 3: devices that left the snapshot (lost from the bus and forgotten by the backend,
    /// or filtered away) take their findings with them. Whether any left.
    pub(super) fn retire_gone(&mut self, at: SystemTime, events: &mut Vec<FindingEvent>) -> bool {
        let (before, tick) = (self.tracks.len(), self.tick);
        self.tracks.retain(|_, track| {
            if track.seen == tick {
                return true;
            }
            for r in track.raised.clear_all() {
                let mut finding = r.finding;
                finding.evidence = "the GPU is no longer in the snapshot".to_owned();
                let held_for = at.duration_since(r.raised_at).ok();
                events.push(FindingEvent { transition: Transition::Cleared, finding, held_for });
            }
            false
        });
        self.tracks.len() != before
    }

    /// Phase 4: attaches the diagnosis — the last one again while nothing changed, so a quiet
    /// tick allocates nothing.
    pub(super) fn publish(&mut self, snapshot: &mut Snapshot, events: Vec<FindingEvent>, changed: bool) {
        let busy_changed = self.update_busy(snapshot);
        if changed {
            let mut active: Vec<Finding> =
                self.tracks.values().flat_map(|t| t.raised.iter().map(|r| r.finding.clone())).collect();
            active.sort_by(|a, b| (a.gpu, a.kind, &a.uuid).cmp(&(b.gpu, b.kind, &b.uuid)));
            self.active = Arc::from(active);
        }
        let output = match &self.last {
            Some(last)
                if events.is_empty()
                    && last.events.is_empty()
                    && Arc::ptr_eq(&last.active, &self.active)
                    && Arc::ptr_eq(&last.raised_total, &self.raised_total)
                    && !busy_changed =>
            {
                last.clone()
            }
            _ => Arc::new(Diagnosis {
                active: self.active.clone(),
                events,
                raised_total: self.raised_total.clone(),
                busy: Some(self.busy.clone()),
            }),
        };
        self.last = Some(output.clone());
        snapshot.outputs.insert(output);
    }

    /// Each GPU of the snapshot with a level in its window: busy when the window's mean level
    /// reaches `imbalance_busy` ([`super::finding::Busy`]). Whether any verdict changed since
    /// the last tick; the list is rebuilt only then, so a steady tick allocates nothing.
    fn update_busy(&mut self, snapshot: &Snapshot) -> bool {
        let level = self.busy.level;
        let tracks = &self.tracks;
        let judged = snapshot.devices.iter().filter_map(|d| {
            let mean = tracks.get(d.info.uuid.as_str()).and_then(|t| t.swings.mean())?;
            Some((d.info.uuid.as_str(), mean >= level))
        });
        let old = &self.busy.gpus;
        let mut n = 0;
        for (uuid, busy) in judged.clone() {
            if old.get(n).is_none_or(|g| g.uuid != uuid || g.busy != busy) {
                n = usize::MAX;
                break;
            }
            n += 1;
        }
        if n == old.len() {
            return false;
        }
        self.busy.gpus = judged.map(|(uuid, busy)| BusyGpu::new(uuid, busy)).collect::<Vec<_>>().into();
        true
    }
}

impl Track {
    fn new(ticks: usize) -> Self {
        Track {
            history: Ring::new(ticks),
            swings: rules::Swings::default(),
            tallies: Tallies::new(ticks),
            raised: RaisedSet::default(),
            counters: Counters::default(),
            seen: 0,
            allocated_ticks: 0,
            ran: false,
            worked: false,
            driver_samples_per_tick: None,
            unjudged: false,
            unjudged_logged: false,
            no_sm_activity: false,
            latches: rules::Latches::default(),
        }
    }
}

/// Who the GPU works for, in order of trust: one of its processes is `gpumon-agent run`'s
/// command or a descendant (`run`, the job's pids); its run's step marks name a job; every
/// process on it has one known owner, and one parent (its launcher) where attribution read it;
/// every process on it has one parent; its one process drives other GPUs too; else assumed (see
/// [`rules::peers`]).
fn job_of(
    d: &DeviceSample,
    stats: &TickStats,
    run: Option<&HashSet<u32>>,
    steps: Option<&Steps>,
    groups: &rules::Groups,
) -> JobKey {
    use std::hash::{Hash, Hasher};
    if run.is_some_and(|pids| d.processes.iter().any(|p| pids.contains(&p.pid))) {
        return JobKey::Run;
    }
    if let Some(run) = steps.and_then(|s| s.for_gpu(d.info.index)) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        run.job.hash(&mut h);
        return JobKey::Marked(h.finish());
    }
    // One owner is one job only as far as the owner goes: a pod or a container is one, but two
    // jobs one user started on a bare-metal node have the same owner (the user, a login
    // session). Their launchers tell them apart, so the launcher refines the owner: GPUs of
    // one owner and one launcher are one job.
    match (stats.owner, stats.launcher) {
        (Some(owner), launcher) => JobKey::Owned(owner, launcher),
        (None, Some(launcher)) => JobKey::Launched(launcher),
        (None, None) => groups.shared_process(d).map_or(JobKey::Assumed, JobKey::Process),
    }
}

/// Counts an allocated GPU into its job's group: its level, whether it is busy throughout,
/// cycling, slowed or not yet known.
fn offer(group: &mut PeerGroup, stats: &mut TickStats, swings: &rules::Swings, position: usize, t: &super::Thresholds) {
    if let Some(level) = stats.level {
        group.offer(level, position);
    }
    if let Some(secs) = stats.step_secs {
        group.offer_step_secs(secs);
    }
    group.offer_memory(stats.memory_ratio());
    // Busy throughout the window so far and busy now, with its clocks held down. This tick
    // included, as the rules count it: a GPU its peers wait for is known by the tick their
    // starvation could first hold.
    let mut window = *swings;
    window.entered(stats.swing(t));
    let busy_throughout = window.busy_throughout() && stats.busy_now(t);
    stats.busy_throughout = busy_throughout;
    stats.cycling = window.busy_and_idle();
    stats.window_mean = window.mean();
    if let Some(mean) = stats.window_mean {
        group.offer_window_mean(mean, position);
    }
    stats.waiting_some = window.mean().is_some_and(|m| m <= t.bubbles_max_mean);
    group.waiting_some += usize::from(stats.waiting_some);
    if window.mean().is_some_and(|m| m > t.bubbles_max_mean) {
        group.offer_busy_memory(stats.memory_ratio());
    }
    let dips_within = matches!((stats.hires_min, stats.hires_max), (Some(lo), Some(hi)) if lo <= t.starvation_dip && hi >= t.starvation_peak);
    stats.waiting_unseen = stats.waiting_some && !stats.cycling && !dips_within;
    group.waiting_unseen += usize::from(stats.waiting_unseen);
    stats.pending_busy = window.busy_so_far();
    group.pending_busy += usize::from(stats.pending_busy);
    stats.slowed_busy = busy_throughout && stats.held_down(t);
    group.slowed += usize::from(stats.slowed_busy);
    if stats.slowed_busy {
        group.offer_slowed_memory(stats.memory_ratio());
    }
    if !busy_throughout && position < 128 {
        group.not_busy_throughout |= 1 << position;
    }
    if stats.level.is_some() {
        group.with_level += 1;
        if busy_throughout {
            group.busy_throughout += 1;
            if !stats.slowed_busy {
                group.unslowed_busy = Some(position);
            }
        } else if stats.cycling {
            group.cycling += 1;
        }
    }
    // A GPU busy throughout never idles: no stage, no rank idling with the others.
    if stats.util.is_some() && !busy_throughout {
        group.readable += 1;
        group.idle_now += usize::from(stats.idle_now(t));
    }
}

/// What a raise needs besides the track: this tick's stats and its job's group.
struct Judged<'a> {
    stats: &'a TickStats,
    group: &'a PeerGroup,
    position: usize,
    undecided: Option<Undecided>,
    t: &'a super::Thresholds,
}

/// The finding of `kind` (slot `k`) raised on the device at `ctx.position` now.
fn raise_finding(
    snapshot: &Snapshot,
    track: &Track,
    kind: FindingKind,
    k: usize,
    ctx: &Judged<'_>,
    tick: u64,
) -> (Finding, Raised) {
    let at = snapshot.taken_at;
    let d = &snapshot.devices[ctx.position];
    let held = track.tallies.trailing_yes(k).max(1);
    let since = track.history.iter().rev().nth(held - 1).map_or(at, |s| s.at);
    let evidence = evidence_now(snapshot, track, kind, k, ctx);
    let finding = Finding::new(
        kind,
        rules::severity(kind),
        Some((d.info.index, d.info.uuid.as_str())),
        since,
        evidence,
        rules::advice_for(kind, &track.history, ctx.t),
    );
    (finding.clone(), Raised { finding, raised_at: at, formatted: tick })
}

/// The evidence of a finding of `kind` (slot `k`) on the device at `ctx.position`, from this
/// tick's readings and its window: when it is raised, and while it holds.
fn evidence_now(snapshot: &Snapshot, track: &Track, kind: FindingKind, k: usize, ctx: &Judged<'_>) -> String {
    let (stats, position) = (ctx.stats, ctx.position);
    let d = &snapshot.devices[position];
    let peer = ctx
        .group
        .busiest_other(position)
        .map(|(l, p)| (snapshot.devices[p].info.index, snapshot.devices[p].info.uuid.as_str(), l));
    let window = (track.tallies.yes(k), track.history.iter().count());
    let peers = PeerContext { peer, job: stats.job, undecided: ctx.undecided };
    let thresholds = ctx.t;
    let mut evidence = rules::evidence(kind, stats, &track.history, &peers, window, thresholds);
    waited_for_phrase(&mut evidence, snapshot, kind, ctx);
    // With a step tracker before this stage: the step time and the GPU's idle share of it,
    // the number a starving loader costs.
    if kind == FindingKind::DataloaderStarvation {
        if let Some(step) = snapshot.output::<Steps>().and_then(|s| s.evidence_for(d.info.index, &d.info.uuid)) {
            evidence.push_str("; ");
            evidence.push_str(&step);
        }
    }
    evidence
}

/// A slowed GPU busy throughout, or the lone one its cycling peers wait for: names them.
fn waited_for_phrase(evidence: &mut String, snapshot: &Snapshot, kind: FindingKind, ctx: &Judged<'_>) {
    let (stats, position) = (ctx.stats, ctx.position);
    let slowed_finding = stats.slowed_busy
        && matches!(
            kind,
            FindingKind::ThermalThrottling | FindingKind::PowerThrottling | FindingKind::ExternalSlowdown
        );
    let pacing_finding = stats.paces_peers && matches!(kind, FindingKind::Straggler | FindingKind::StragglerOrOwnJob);
    if !(slowed_finding || pacing_finding) {
        return;
    }
    // With the job assumed, those waiting for a slowed GPU are its replicas: the GPUs holding
    // the same share of memory (`PeerGroup::waits_for_slowed_peer`).
    let replica = |p: usize| {
        !slowed_finding
            || ctx.group.job.known()
            || ctx.group.holds_slowed_memory(snapshot.devices[p].memory.used_ratio())
    };
    let waiting: Vec<String> = (0..snapshot.devices.len().min(128))
        .filter(|&p| p != position && ctx.group.not_busy_throughout & (1 << p) != 0 && replica(p))
        .map(|p| snapshot.devices[p].info.index.to_string())
        .collect();
    if waiting.is_empty() {
        return;
    }
    let _ = write!(
        evidence,
        "; busy on every tick while GPU(s) {} are not: in a synchronous job they wait for it at every step (no \
         starvation, pipeline bubbles or straggler is named on them meanwhile)",
        waiting.join(", ")
    );
    if pacing_finding {
        // Nothing on the GPU says why it is slower, and nothing says it shares the others'
        // job: both readings, the second's cause.
        evidence.push_str(
            "; no slowdown reason is active on it: another process on it, a larger share of the work or a slower \
             link would do this — or it runs a job of its own, and the others idle for a cause of theirs (e.g. \
             starving data loaders)",
        );
    }
}

/// Adds one raise of `kind` to the running counts.
fn count_raise(total: &mut Arc<[FindingCount]>, kind: FindingKind) {
    let mut counts = total.to_vec();
    match counts.iter_mut().find(|c| c.kind == kind) {
        Some(c) => c.raised += 1,
        None => counts.push(FindingCount { kind, raised: 1 }),
    }
    counts.sort_by_key(|c| c.kind);
    *total = Arc::from(counts);
}

/// NVML's longest utilisation sampling period ("between 1 second and 1/6 second depending on the
/// product"): the most a measured period can read.
const MAX_DRIVER_PERIOD_S: f64 = 1.0;

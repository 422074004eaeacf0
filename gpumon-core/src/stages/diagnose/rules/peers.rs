//! Rules that compare peers: `imbalance` and `straggler`, and the job groups every rule that
//! compares GPUs reads (the in-turn-or-together test of starvation and bubbles too).
//!
//! Peers are the GPUs of the same job, as far as gpumon can tell:
//! 0. the command `gpumon-agent run` started ([`RunJob`](crate::diagnose::RunJob)): a GPU
//!    running one of its processes (the command or a descendant) is the run's, whatever else
//!    says — the run is the job;
//! 1. step marks' job ([`Steps::for_gpu`](crate::steps::Steps::for_gpu)): the run names its job;
//! 2. the processes' owner (attribution: pod, container or cgroup, user), when every process on
//!    the GPU has the same known one — refined by their launcher where attribution read it:
//!    two jobs one user started on a bare-metal node share the owner, not the launcher;
//! 3. the process tree alone: every process on the GPU was started by the same parent, the
//!    launcher that starts a job's ranks (`torchrun`, `deepspeed`, `mpirun`); or, with no
//!    parent read, one process on the GPU that also runs on others (one program placed on
//!    several GPUs);
//! 4. none of these: the GPUs with work are assumed to belong to one job, and the evidence says
//!    so. An assumption decides nothing that compares GPUs: the findings name both readings
//!    (`straggler_or_own_job`, `imbalance_or_own_job`, `starvation_or_bubbles`), since a job of
//!    its own beside the others reads the same.
//!
//! A straggler's peers are the GPUs of its job holding the same memory as it ([`peer_gap`]):
//! data-parallel replicas hold the same tensors, a pipeline's stages do not (their layers, the
//! micro-batches in flight on them) — and a stage reading lower than the others waits for a
//! slower one; it is not what they wait for. In a job whose GPUs all hold the same memory,
//! every GPU of it.
//!
//! A GPU busy throughout its window (never idle) is a peer for the straggler and imbalance
//! rules, but not a pipeline stage nor a rank idling with the others: it is left out of the
//! "idle together or in turn" count.

use super::{RuleInput, TickStats};
use crate::stages::diagnose::Thresholds;

/// Who a GPU works for, as far as gpumon can tell (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobKey {
    /// One of its processes is the command `gpumon-agent run` started, or a descendant of it.
    Run,
    /// Its run's step marks name a job (hash of the job name).
    Marked(u64),
    /// Every process on it has the same known owner (hash of it), and the same launcher where
    /// attribution read one.
    Owned(u64, Option<u32>),
    /// Every process on it was started by the same parent process (its pid).
    Launched(u32),
    /// Its one process drives other GPUs too (its pid): one program on several GPUs
    /// (`device_map="auto"`, `nn.DataParallel`) is one job, whoever runs it.
    Process(u32),
    /// Nothing says: assumed to share a job with every other GPU that nothing says of either.
    Assumed,
}

impl JobKey {
    /// Whether the job comes from what gpumon read rather than an assumption.
    pub(crate) fn known(self) -> bool {
        !matches!(self, JobKey::Assumed)
    }
}

/// What the GPUs of one job are doing at this tick, for the rules that compare peers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerGroup {
    pub(crate) job: JobKey,
    /// The two busiest allocated GPUs: (level, position in the snapshot).
    pub(crate) busiest: Option<(f64, usize)>,
    pub(crate) second: Option<(f64, usize)>,
    /// Sum and count of every allocated GPU's level: the peers' mean for the straggler rule in a
    /// job whose GPUs all hold one memory (else its replicas': [`Groups::index_replicas`]).
    pub(crate) sum: f64,
    pub(crate) n: usize,
    /// Allocated GPUs with a reading now that are not busy throughout (possible stages or
    /// ranks idling with this one), and how many of them read idle now.
    pub(crate) readable: usize,
    pub(crate) idle_now: usize,
    /// Allocated GPUs the others wait for: busy on every tick of their window with their clocks
    /// held down ([`TickStats::slowed_busy`]), or the lone such GPU among cycling peers
    /// ([`TickStats::paces_peers`]). Data-parallel ranks wait at every step for the slowest
    /// one: while one is never idle, the others' idle stretches are that wait — not their
    /// loaders, not pipeline bubbles, not a straggler of their own.
    pub(crate) slowed: usize,
    /// Positions (below 128) of the allocated GPUs that are not busy throughout their window:
    /// those a slowed GPU's evidence names as waiting for it.
    pub(crate) not_busy_throughout: u128,
    /// Allocated GPUs busy on every reading so far, too few readings yet to be "busy
    /// throughout" ([`TickStats::pending_busy`]): until they have enough, whether the others
    /// wait for one of them is not known, and starvation and bubbles are not judged on them.
    pub(crate) pending_busy: usize,
    /// Allocated GPUs with a level, those busy throughout, and those going busy and idle in
    /// turn over their window (possible pipeline stages, or ranks starving together).
    pub(crate) with_level: usize,
    pub(crate) busy_throughout: usize,
    pub(crate) cycling: usize,
    /// The lowest and highest share of memory used among the allocated GPUs: replicas of one
    /// data-parallel job hold the same model, optimizer state and batch size, so the same
    /// memory to within a few percent (see [`PeerGroup::uniform_memory`]).
    memory: MemoryRange,
    /// The same among the slowed GPUs (`slowed`).
    slowed_memory: MemoryRange,
    /// The same among the busy GPUs (window mean above `bubbles_max_mean`: not waiting a share
    /// worth naming).
    busy_memory: MemoryRange,
    /// Allocated GPUs whose window's mean level is at or below `bubbles_max_mean`: they wait
    /// a share of the time worth naming, seen in stretches or not (a driver period longer
    /// than their stretches averages them into a flat reading).
    pub(crate) waiting_some: usize,
    /// Of those, the ones whose waits nothing shows ([`TickStats::waiting_unseen`]): flat
    /// readings, their idle stretches shorter than the driver's period.
    pub(crate) waiting_unseen: usize,
    /// The last GPU busy throughout with no slowdown reason (see [`TickStats::paces_peers`]).
    pub(crate) unslowed_busy: Option<usize>,
    /// The two lowest and the two highest window means of the allocated GPUs: (mean, position).
    /// Two of each, so the spread of the others can be read for any one of them.
    lowest_means: [Option<(f64, usize)>; 2],
    highest_means: [Option<(f64, usize)>; 2],
    /// How many window means were offered.
    means: usize,
    /// Sum and count of the last marked step's duration, seconds, over the allocated GPUs whose
    /// run marks steps: their mean for a rank whose steps take longer ([`STEPS_SLOWER`]).
    step_secs_sum: f64,
    step_secs_n: usize,
}

/// How much longer than its job's other ranks' a rank's marked steps must take, as a share of
/// theirs, to name it a straggler on its steps (issue #42, item 5: "steps 10 % slower when
/// marked"). Ranks in lockstep end each step together and report the same step time: this
/// names the ranks of a job that does not wait for every rank at every step (local SGD,
/// asynchronous or elastic training, ranks marking before their collective), where the level
/// may not show it.
pub(crate) const STEPS_SLOWER: f64 = 0.10;

impl PeerGroup {
    pub(crate) fn new(job: JobKey) -> Self {
        Self {
            job,
            busiest: None,
            second: None,
            sum: 0.0,
            n: 0,
            readable: 0,
            idle_now: 0,
            slowed: 0,
            not_busy_throughout: 0,
            pending_busy: 0,
            with_level: 0,
            busy_throughout: 0,
            cycling: 0,
            waiting_some: 0,
            waiting_unseen: 0,
            unslowed_busy: None,
            memory: MemoryRange::EMPTY,
            slowed_memory: MemoryRange::EMPTY,
            busy_memory: MemoryRange::EMPTY,
            lowest_means: [None; 2],
            highest_means: [None; 2],
            means: 0,
            step_secs_sum: 0.0,
            step_secs_n: 0,
        }
    }

    /// Counts one allocated GPU's last marked step time in.
    pub(crate) fn offer_step_secs(&mut self, secs: f64) {
        if secs.is_finite() && secs > 0.0 {
            self.step_secs_sum += secs;
            self.step_secs_n += 1;
        }
    }

    /// The mean last step time of the job's other marking GPUs than one whose last step took
    /// `own` seconds (counted in), when there are two others at least: as for the level, two
    /// GPUs are no group to fall behind (one far behind its twin is an imbalance).
    pub(crate) fn peers_step_secs(&self, own: f64) -> Option<f64> {
        (self.step_secs_n >= 3 && own.is_finite() && own > 0.0)
            .then(|| (self.step_secs_sum - own) / (self.step_secs_n - 1) as f64)
    }

    /// Counts one allocated GPU's window mean in.
    pub(crate) fn offer_window_mean(&mut self, mean: f64, position: usize) {
        self.means += 1;
        let [low, second_low] = &mut self.lowest_means;
        if low.is_none_or(|(l, _)| mean < l) {
            *second_low = *low;
            *low = Some((mean, position));
        } else if second_low.is_none_or(|(l, _)| mean < l) {
            *second_low = Some((mean, position));
        }
        let [high, second_high] = &mut self.highest_means;
        if high.is_none_or(|(h, _)| mean > h) {
            *second_high = *high;
            *high = Some((mean, position));
        } else if second_high.is_none_or(|(h, _)| mean > h) {
            *second_high = Some((mean, position));
        }
    }

    /// The spread of the window means of the job's allocated GPUs other than the one at
    /// `position` (highest less lowest); `None` with fewer than two of them. (With ties the
    /// lowest and the highest other may be one GPU: every other then reads the same, spread 0.)
    pub(crate) fn peers_spread(&self, position: usize) -> Option<f64> {
        let other = |pair: &[Option<(f64, usize)>; 2]| match pair[0] {
            Some((_, p)) if p == position => pair[1],
            first => first,
        };
        let (low, high) = (other(&self.lowest_means)?, other(&self.highest_means)?);
        (self.means >= 3).then_some(high.0 - low.0)
    }

    /// Counts one allocated GPU's share of memory used in.
    pub(crate) fn offer_memory(&mut self, ratio: Option<f64>) {
        self.memory.offer(ratio);
    }

    /// Every allocated GPU of the group holds the same share of its memory, to within
    /// [`SAME_MEMORY`]: then each GPU's replicas are all the others, known job or assumed.
    pub(crate) fn uniform_memory(&self) -> bool {
        self.memory.high - self.memory.low <= SAME_MEMORY
    }

    /// Every allocated GPU of the group holds the same share of its memory ([`Self::uniform_memory`]),
    /// and memory was read on two at least: data-parallel replicas, by what they hold.
    pub(crate) fn holds_one_memory(&self) -> bool {
        self.memory.count >= 2 && self.uniform_memory()
    }

    /// The mean level of the allocated GPUs other than one at `level`, when there are at least
    /// two of them (a group to fall behind).
    pub(crate) fn peers_mean(&self, level: f64) -> Option<f64> {
        (self.n >= 3).then(|| (self.sum - level) / (self.n - 1) as f64)
    }

    /// The share of the job's GPUs other than this one that can idle (not busy throughout)
    /// reading idle now; `None` without such a GPU. `self_counted`: this GPU is counted in
    /// `readable` (and `self_idle`: in `idle_now`).
    pub(crate) fn peers_idle(&self, self_counted: bool, self_idle: bool) -> Option<f64> {
        let others = self.readable - usize::from(self_counted);
        let idle = self.idle_now - usize::from(self_counted && self_idle);
        (others > 0).then(|| idle as f64 / others as f64)
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
    /// others wait for it: this GPU waits for it. With the job assumed, only a slowed GPU
    /// holding the same share of memory as this one (`memory`), within [`SAME_MEMORY`] — a
    /// replica of its model: a throttled GPU of another job does not hold back a job starving
    /// beside it, and taking it for the one they wait for silenced their starvation (fit seed
    /// 0x42: a single-GPU job starving beside a GPU under an external slowdown).
    pub(crate) fn waits_for_slowed_peer(&self, self_slowed: bool, memory: Option<f64>) -> bool {
        self.slowed > usize::from(self_slowed) && (self.job.known() || self.holds_slowed_memory(memory))
    }

    /// Counts the share of memory a busy GPU uses in (see [`PeerGroup::waits_on_another_part`]).
    pub(crate) fn offer_busy_memory(&mut self, ratio: Option<f64>) {
        self.busy_memory.offer(ratio);
    }

    /// Whether a GPU holding `memory` waits on another part of its known job: GPUs of the job
    /// are busy (window mean above `bubbles_max_mean`), and each holds other memory than it
    /// (beyond [`SAME_MEMORY`]) — an uneven pipeline's slowest stage computes while the others
    /// wait for it. Data-parallel replicas hold its memory; a GPU waiting alone among them is
    /// their straggler.
    pub(crate) fn waits_on_another_part(&self, memory: Option<f64>) -> bool {
        self.job.known() && !self.busy_memory.is_empty() && memory.is_some_and(|m| !self.busy_memory.holds(m))
    }

    /// Counts a slowed GPU's share of memory in (see [`PeerGroup::waits_for_slowed_peer`]).
    pub(crate) fn offer_slowed_memory(&mut self, ratio: Option<f64>) {
        self.slowed_memory.offer(ratio);
    }

    /// Whether a GPU holding `memory` holds what a slowed GPU of the group holds, within
    /// [`SAME_MEMORY`] (the slowed GPUs' lowest and highest share: one slowed GPU exactly).
    pub(crate) fn holds_slowed_memory(&self, memory: Option<f64>) -> bool {
        memory.is_some_and(|m| self.slowed_memory.holds(m))
    }

    /// Whether the group is one job as far as can be told: known, or assumed with every GPU
    /// holding the same memory.
    pub(crate) fn shares_one_job(&self) -> bool {
        self.job.known() || self.uniform_memory()
    }

    /// The busiest allocated GPU of the job other than the one at `position`.
    pub(crate) fn busiest_other(&self, position: usize) -> Option<(f64, usize)> {
        match self.busiest {
            Some((_, p)) if p == position => self.second,
            other => other,
        }
    }

    /// GPUs of the job other than this one that go busy and idle in turn (`self_cycling`: this
    /// one does): possible pipeline stages next to it, or ranks starving with it.
    pub(crate) fn cycling_peers(&self, self_cycling: bool) -> usize {
        self.cycling - usize::from(self_cycling)
    }

    /// The lone GPU busy throughout, with no slowdown reason, while every other allocated GPU of
    /// the job (two at least) goes busy and idle in turn: in a synchronous job they wait for it
    /// at every step. Two or more busy GPUs, or a peer that does not cycle, is more than one
    /// pattern (a busy job next to a starving one): nothing is inferred then. Nor with the job
    /// assumed, unless every GPU holds the same memory (replicas of one model): a lone busy GPU
    /// beside cycling ones whose memory differs is likelier a job of its own next to a pipeline
    /// or a starving job than the one they all wait for.
    ///
    /// And the others wait for it a share worth naming: every one's window mean at least `gap`
    /// (`straggler_gap`, as for a straggler behind its peers) under its own. Ranks that idle
    /// a few readings once — all of a job's GPUs pausing for a checkpoint or an evaluation,
    /// which the readings of one of them happened to straddle — read nearly as busy as it, and
    /// nobody waits for it at every step. (Fit set, 48 000 GPU-runs: 8 of the 12 GPUs wrongly
    /// named straggler were taken for the one their peers wait for, with their peers within 10
    /// points of them: healthy jobs pausing, a straggler's job where the other rank idled on a
    /// few readings.)
    pub(crate) fn pacing_gpu(&self, gap: f64) -> Option<usize> {
        let lone = self.shares_one_job()
            && self.slowed == 0
            && self.busy_throughout == 1
            && self.with_level >= 3
            && self.cycling == self.with_level - 1;
        let pacer = self.unslowed_busy.filter(|_| lone)?;
        match self.highest_means {
            [Some((top, p)), Some((next, _))] if p == pacer && top - next >= gap => Some(pacer),
            _ => None,
        }
    }
}

/// The job groups of one tick: one [`PeerGroup`] per job, and each device's group.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub(crate) groups: Vec<PeerGroup>,
    /// The allocated GPUs of jobs whose GPUs hold different memory, each with a level and
    /// a memory share: (group and memory share as one sortable key, level, position), sorted by
    /// key. A straggler's peers in such a job are the GPUs holding the same memory as it
    /// ([`peer_gap`]): one sort and one sweep per tick, not a scan of every GPU for every GPU.
    replicas: Vec<(u64, f64, usize, f64)>,
    /// By position: the mean level of the GPUs holding its memory, and the spread of their
    /// window means (see [`Groups::index_replicas`]).
    replicas_mean: Vec<Option<(f64, f64)>>,
    /// The pids of the GPUs that run a single process, sorted: a pid in it twice drives several
    /// GPUs (see [`Groups::index_processes`]).
    sole_pids: Vec<u32>,
}

impl Groups {
    pub(crate) fn clear(&mut self) {
        self.groups.clear();
        self.replicas.clear();
        self.replicas_mean.clear();
        self.sole_pids.clear();
    }

    /// Notes which processes drive more than one GPU this tick, before any GPU's job is read:
    /// one sort of a pid per GPU.
    pub(crate) fn index_processes(&mut self, devices: &[crate::model::DeviceSample]) {
        self.sole_pids.extend(devices.iter().filter_map(sole_process));
        self.sole_pids.sort_unstable();
    }

    /// The GPU's one process, when it also drives another GPU this tick.
    pub(crate) fn shared_process(&self, d: &crate::model::DeviceSample) -> Option<u32> {
        let pid = sole_process(d)?;
        let first = self.sole_pids.partition_point(|&p| p < pid);
        (self.sole_pids.get(first + 1) == Some(&pid)).then_some(pid)
    }

    /// For every allocated GPU of a job whose GPUs hold different memory: the mean level
    /// of the other GPUs of that job holding the same share of memory as it, within
    /// [`SAME_MEMORY`], when there are at least two (a group to fall behind). After every GPU of
    /// the tick was read.
    pub(crate) fn index_replicas(&mut self, tick: &[TickStats], t: &Thresholds) {
        self.replicas_mean.resize(tick.len(), None);
        for (position, s) in tick.iter().enumerate() {
            // A job whose GPUs all hold the same memory compares with every GPU of it (a node
            // running one data-parallel job: nothing to index).
            let group = &self.groups[s.group];
            if group.uniform_memory() || !s.allocated(t) {
                continue;
            }
            if let (Some(level), Some(memory), Some(mean)) = (s.level, s.memory_ratio(), s.window_mean) {
                // The group in the high bits, the memory share in millionths below: integer keys
                // sort fast, and one job's GPUs are contiguous.
                let key = ((s.group as u64) << 32) | (memory.clamp(0.0, 1.0) * 1e6) as u64;
                self.replicas.push((key, level, position, mean));
            }
        }
        if self.replicas.is_empty() {
            return;
        }
        self.replicas.sort_unstable_by_key(|r| r.0);
        // The window of keys within SAME_MEMORY of each GPU's (its own group only: groups are
        // 2^32 apart), swept once.
        let reach = (SAME_MEMORY * 1e6) as u64;
        let (mut lo, mut hi, mut sum) = (0usize, 0usize, 0.0);
        for i in 0..self.replicas.len() {
            let key = self.replicas[i].0;
            while hi < self.replicas.len() && self.replicas[hi].0 <= key + reach {
                sum += self.replicas[hi].1;
                hi += 1;
            }
            while self.replicas[lo].0 + reach < key {
                sum -= self.replicas[lo].1;
                lo += 1;
            }
            // Itself is in the window.
            let others = hi - lo - 1;
            let (_, level, position, _) = self.replicas[i];
            self.replicas_mean[position] = (others >= 2).then(|| {
                // The spread of the others' window means: a scan of the window, which holds one
                // job's replicas (a few GPUs), not the node.
                let (mut low, mut high) = (f64::INFINITY, f64::NEG_INFINITY);
                for (j, r) in self.replicas[lo..hi].iter().enumerate() {
                    if lo + j != i {
                        (low, high) = (low.min(r.3), high.max(r.3));
                    }
                }
                ((sum - level) / others as f64, high - low)
            });
        }
    }

    /// The index of `job`'s group, made on first sight.
    pub(crate) fn index_of(&mut self, job: JobKey) -> usize {
        match self.groups.iter().position(|g| g.job == job) {
            Some(i) => i,
            None => {
                self.groups.push(PeerGroup::new(job));
                self.groups.len() - 1
            }
        }
    }

    /// See [`Groups::index_replicas`].
    fn replicas_mean(&self, position: usize) -> Option<(f64, f64)> {
        self.replicas_mean.get(position).copied().flatten()
    }
}

/// The pid of the one process on a GPU (every process listed on it has it); `None` without a
/// process or with several.
fn sole_process(d: &crate::model::DeviceSample) -> Option<u32> {
    let pid = d.processes.first()?.pid;
    d.processes.iter().all(|p| p.pid == pid).then_some(pid)
}

/// What the peer rules conclude on one GPU.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PeerHolds {
    /// The GPU is persistently behind busy peers of its job: its window's mean gap to their
    /// level is at least `straggler_gap`.
    pub(crate) behind: bool,
    /// A busy GPU of the same job (at or above `imbalance_busy`).
    pub(crate) busy_peer: bool,
    pub(crate) imbalance: bool,
    /// It idles beside a busy GPU as in `imbalance`, but nothing says they run one job and no
    /// process is read on it: the idle half of an uneven split, or a job of its own idling.
    pub(crate) imbalance_or_own_job: bool,
}

/// The peer comparisons for one GPU (imbalance now; "behind" over the window).
pub(crate) fn judge(input: &RuleInput<'_>) -> PeerHolds {
    let (s, t, group) = (input.s, input.t, input.group);
    let level = s.level;
    let allocated = s.allocated(t);
    let busy_peer = group.busiest_other(input.position).is_some_and(|(l, _)| l >= t.imbalance_busy);
    // Idle beside them over the window, not only at this tick: a straggler idles a share of
    // every step too, and a tick that falls in that stretch reads as low as an idle GPU.
    let idle_over_window = input.window.mean().is_none_or(|m| m <= t.imbalance_idle);
    let idle_beside_busy = allocated && level.is_some_and(|l| l <= t.imbalance_idle) && idle_over_window && busy_peer;
    // Whose busy GPU it idles beside, when nothing says which job either runs. The work of one
    // model split over GPUs runs in one process (`device_map="auto"`, `nn.DataParallel`: a
    // known job, `JobKey::Process`), and ranks of separate processes in one job synchronise —
    // one idling a whole window while another computes leaves the other spinning in a
    // collective, not computing. So a GPU whose own process runs on no other GPU and that
    // nothing ties to the busy one runs a job of its own: no imbalance (its own rules —
    // starvation, idle_allocated — judge it). With no process read at all (processes are not
    // sampled by default), either may hold: the idle half of an uneven split, or a job of its
    // own idling (its loader, or held with nothing running: `idle_allocated`) — both are named.
    let (imbalance, imbalance_or_own_job) = if group.job.known() {
        (idle_beside_busy, false)
    } else if s.processes.is_some() {
        (false, false)
    } else {
        (false, idle_beside_busy)
    };
    // Its marked steps take longer than its job's other ranks' (a known job only: their steps
    // are the same work). Held on each tick, so the window asks it to persist like any rule.
    let slow_steps = group.job.known()
        && matches!((s.step_secs, s.peers_step_secs), (Some(own), Some(theirs))
            if theirs > 0.0 && own >= theirs * (1.0 + STEPS_SLOWER));
    let behind = behind_peers(input, t) || (allocated && slow_steps);
    PeerHolds { behind, busy_peer, imbalance, imbalance_or_own_job }
}

/// One GPU persistently behind a group of busy peers doing the same work (a straggler, not a
/// loader: a starving loader holds back every rank of a data-parallel job alike). Judged on
/// the window: its mean gap to the peers' level over the ticks the peers were busy, which must
/// cover most of the window, while its own mean stays above the idle mark (below it the GPU is
/// idle beside them: `imbalance`).
fn behind_peers(input: &RuleInput<'_>, t: &Thresholds) -> bool {
    let w = &input.window;
    // The peers are its job's GPUs holding the same memory as it ([`peer_gap`]), every GPU of
    // the job when they all do. They are busy (at least `straggler_peers` on average: they spin in
    // the collective while they wait for it); pipeline stages, which all idle their bubbles,
    // read less.
    match (w.peer_gap_mean(), w.mean()) {
        (Some(gap), Some(mean)) => {
            w.peer_gap_ticks() * 2 >= w.readings() && gap >= t.straggler_gap && mean > t.imbalance_idle
        }
        _ => false,
    }
}

/// The gap to the job's peers this tick records in its window: the peers' mean level less its
/// own, when the peers are busy (at or above `straggler_peers`) and read alike (their window
/// means within [`SAME_LEVEL`]); `None` otherwise.
///
/// The peers are the other GPUs of its job that hold the same share of memory as this one
/// (within [`SAME_MEMORY`]), at least two — every other GPU of it when they all do:
/// data-parallel replicas hold the same model, optimizer state and batch. A pipeline's stages
/// hold different memory (their layers, the micro-batches in flight on them), and one reading
/// lower than the others waits for a slower stage: it is no straggler. With the job assumed, a
/// GPU idling beside busy GPUs whose memory differs may run a job of its own, waiting on its own
/// loader — which is how it is named then. (Fit set, 16 000 GPU-runs, once the simulator gave
/// stages their own memory: straggler precision 0.870 → 0.984, recall 0.882 either way.)
///
/// `window_ticks`: the window's length in ticks, which widens how far apart the peers may read
/// (see [`same_level`]).
pub(crate) fn peer_gap(
    s: &TickStats,
    position: usize,
    groups: &Groups,
    t: &Thresholds,
    window_ticks: usize,
) -> Option<f64> {
    let level = s.level.filter(|_| s.allocated(t))?;
    let group = groups.groups.get(s.group)?;
    let (peers, spread) = if group.uniform_memory() {
        (group.peers_mean(level)?, group.peers_spread(position)?)
    } else {
        groups.replicas_mean(position)?
    };

    (peers >= t.straggler_peers && spread <= same_level(window_ticks)).then_some(peers - level)
}

/// How far apart the peers' window means may be ([`SAME_LEVEL`]), widened by one reading over
/// the window's ticks: replicas read alike at every tick but the first of their job — the
/// interval it started in, which the driver sampled partly before the start on some and after
/// it on others (up to a whole reading apart), and which stays in their windows for a window's
/// length. At a 1.7 s interval (18 ticks) that alone is up to 5 points, and held a straggler
/// unnamed until its job's first interval left the window. At 0.2 s (150 ticks) it adds less
/// than a point. Fit set, 48 000 GPU-runs: 10 of the 19 stragglers missed were named late;
/// with this, straggler 0.948 / 0.920 → 0.950 / 0.962 (at a flat 8 points instead:
/// 0.947 / 0.963).
fn same_level(window_ticks: usize) -> f64 {
    // At most twice SAME_LEVEL: a window of a few ticks (a short `--diagnose-window`) would
    // otherwise take peers 15–30 points apart for replicas.
    SAME_LEVEL + (1.0 / window_ticks.max(1) as f64).min(SAME_LEVEL)
}

/// How far apart (points of utilisation, over the window) the peers a straggler holds back may
/// read: 5. Data-parallel ranks waiting for one rank spin in the same collective for the same
/// time at every step, so they read alike; pipeline stages do not (each idles its own bubbles,
/// longer the further it is from the slowest stage), and the least busy of them is no
/// straggler.
const SAME_LEVEL: f64 = 0.05;

/// The lowest and highest share of memory used among some GPUs of a group, and how many were
/// offered; empty (no share offered, `low` above `high`) before any.
#[derive(Clone, Copy, Debug)]
struct MemoryRange {
    low: f64,
    high: f64,
    /// How many shares were offered.
    count: usize,
}

impl MemoryRange {
    const EMPTY: Self = Self { low: f64::INFINITY, high: f64::NEG_INFINITY, count: 0 };

    fn offer(&mut self, ratio: Option<f64>) {
        if let Some(r) = ratio {
            self.low = self.low.min(r);
            self.high = self.high.max(r);
            self.count += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `m` is within [`SAME_MEMORY`] of the range (never, empty).
    fn holds(&self, m: f64) -> bool {
        m >= self.low - SAME_MEMORY && m <= self.high + SAME_MEMORY
    }
}

/// How far apart (share of each GPU's memory) the memory used by replicas of one job may be:
/// 2 points. Replicas allocate the same tensors; the allocator's caching adds a little.
const SAME_MEMORY: f64 = 0.02;

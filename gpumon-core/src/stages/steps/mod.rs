//! Training steps: GPU state per step of a training loop.
//!
//! A training loop marks the end of each step with one cheap call, [`TrainingRun::step`]; the
//! [`StepTracker`] — a [`Processor`](crate::Processor) — turns the marks into per-step GPU figures on the sampling
//! side and attaches them to every snapshot as its [`Steps`] output
//! (`snapshot.output::<Steps>()`), which every sink exports from the descriptor table ([`Snapshot::visit_derived`]): `gpumon_training_step{job,rank}`,
//! `gpumon_step_duration_seconds{job,rank}` and, per GPU, `gpumon_step_utilization_ratio`,
//! `gpumon_step_utilization_max_ratio`, `gpumon_step_memory_peak_bytes`,
//! `gpumon_step_energy_joules`.
//!
//! ```
//! use std::sync::Arc;
//! use gpumon_core::steps::{StepConfig, StepTracker};
//!
//! let (tracker, steps) = StepTracker::new(StepConfig::default())?;
//! // Agent::builder(sampler).processor(tracker) … .spawn()?;
//! # drop(tracker);
//! let run = steps.run("train", Some(0))?;
//! for n in 1..=3 {
//!     // … forward, backward, optimizer step …
//!     run.step(n)?;
//! }
//! assert!(run.step(2).is_err()); // steps only go up
//! # Ok::<(), gpumon_core::steps::StepError>(())
//! ```
//!
//! # The hand-off
//! [`TrainingRun::step`] reads the monotonic clock, updates two atomics of the run and writes
//! the mark's time into one of its [`MARK_SLOTS`] slots: no lock, no allocation, no system call
//! beyond the clock (vDSO on Linux). Concurrent callers of one run
//! are fine: the highest step wins and a step that is not above the last one marked is an error
//! ([`StepError::NotIncreasing`]). It keeps working — and costs the same — after the agent has
//! stopped; the marks are then simply never read.
//!
//! # Which samples a step takes
//! A sample taken at `t` describes the sampling period `(t − interval, t]` (utilisation is an
//! average over it; the high-resolution windows cover it). A step runs from the previous mark
//! (or, for the first step of a run created with [`StepRegistry::run`], from the moment the run
//! was created) to its own mark; it takes **every sample whose period overlaps it**, i.e. the
//! samples taken during the step plus the first one taken after its end (the sample that covers
//! the end). Per GPU, over those samples:
//! - utilisation mean: the mean of each sample's utilisation — the high-resolution window's mean
//!   where the sample has one, else the sampled value;
//! - utilisation max: the largest window maximum (or sampled value);
//! - peak memory: the largest `memory.used`;
//! - energy: the energy counter's increase over those samples' periods, prorated to the step's
//!   share of them (`Δcounter × duration / covered time`), so that a short step is not charged a
//!   whole interval. Absent until the tracker has seen one sample before the step (it needs a
//!   baseline) or without an energy counter.
//!
//! **A step shorter than the interval** takes the figures of the one sample that covers it. When
//! several steps end in one sampling period, each of them is reported with the figures of that
//! period's sample (the first also with the earlier samples it overlaps) and its own duration:
//! a run keeps the times of its latest [`MARK_SLOTS`] marks (64, as many as the tracker reports
//! per tick; one slot per step number, written without a lock). Steps whose marks are not kept
//! — a loop marking more than 64 steps per period, or step numbers the loop skipped — share the
//! time between the kept marks around them evenly: `(later mark − earlier mark) / steps`.
//!
//! A mark is read at the first tick whose sample was taken after it; a mark made between the
//! sample and the tracker's turn waits for the next tick. The first mark of a run created by
//! [`StepRegistry::record`] (the agent's steps socket) has no known start: it sets the run's step
//! but is not reported.
//!
//! # Reporting
//! Every `every_n`-th step ([`StepConfig::every_n`]; step numbers divisible by it) is *reported*:
//! it appears in [`RunSteps::reported`] at the tick that saw it (event sinks — InfluxDB's
//! `gpu_step` measurement, the stdout line — write one record per reported step) and becomes
//! [`RunSteps::last`], which the per-GPU gauges show until the next reported step. The step
//! number and the last step's duration are updated for every step.
//!
//! # Order with the diagnosis stage
//! Add the tracker **before** the [`Diagnoser`](crate::diagnose::Diagnoser): processors run in
//! the order they were added, so diagnosis sees this tick's [`Steps`] output (the agent does
//! this). A rule may then read the step time next to utilisation — e.g. the share of a step the
//! GPU spent idle, `(1 − utilisation mean) × step duration`, is the time the GPU waited between
//! steps, the signature of a starving data loader.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

#[cfg(doc)]
use crate::model::Snapshot;
use crate::DeviceFilter;

#[cfg(feature = "steps-socket")]
#[cfg_attr(docsrs, doc(cfg(feature = "steps-socket")))]
pub mod socket;

/// Most runs one registry holds; [`StepRegistry::run`] refuses more ([`StepError::TooManyRuns`]).
/// Bounds what a misbehaving client of the steps socket can make the agent keep and export.
pub const MAX_RUNS: usize = 256;

/// Longest job name, in bytes.
pub const MAX_JOB_LEN: usize = 128;

/// What the step tracker is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepConfig {
    /// Report every `every_n`-th step (the steps whose number is divisible by it). Default 1;
    /// 0 is an error.
    pub every_n: u64,
}

impl Default for StepConfig {
    fn default() -> Self {
        Self { every_n: 1 }
    }
}

impl StepConfig {
    /// A configuration reporting every `every_n`-th step.
    pub fn every_n(every_n: u64) -> Self {
        Self { every_n }
    }
}

/// What can go wrong with steps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// A step number not above the last one marked on this run.
    #[error("step {got} is not above the last step marked, {last}")]
    NotIncreasing {
        /// The last step marked.
        last: u64,
        /// The step given.
        got: u64,
    },
    /// A step number gpumon cannot store (`u64::MAX`).
    #[error("step {0} is out of range (at most {max})", max = u64::MAX - 1)]
    OutOfRange(u64),
    /// A job name that is empty, too long or holds control characters.
    #[error("invalid job name {0:?}: 1 to 128 bytes, no control characters")]
    InvalidJob(String),
    /// A bad [`StepConfig`].
    #[error("invalid steps configuration: {0}")]
    InvalidConfig(String),
    /// The registry already holds [`MAX_RUNS`] runs.
    #[error("too many training runs (at most {MAX_RUNS})")]
    TooManyRuns,
    /// A mark from another process for a run that another Unix user registered
    /// ([`StepRegistry::record_from`]): a run belongs to the uid that registered it.
    #[error("the run belongs to uid {owner}, not to uid {uid}")]
    NotOwner {
        /// The uid that registered the run.
        owner: u32,
        /// The uid of the process that sent the mark.
        uid: u32,
    },
    /// The Unix user already holds as many runs as one user may
    /// (`socket::SocketConfig::max_runs_per_uid`, feature `steps-socket`).
    #[error("uid {uid} already holds {max} training runs, the most one user may")]
    TooManyRunsForUid {
        /// The uid.
        uid: u32,
        /// The limit.
        max: usize,
    },
}

/// The process that registered a run through the steps socket: the credentials the kernel gives
/// for the connection (`SO_PEERCRED`), which a client cannot forge. A run belongs to its `uid`
/// ([`StepRegistry::record_from`]); a tenant sees the runs whose `pid` is one of its own
/// processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Peer {
    /// The effective user id of the connecting process.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
    /// Its process id, as the agent's pid namespace sees it (`None` when the kernel could not
    /// say: the process lives in a pid namespace the agent cannot see into).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub pid: Option<u32>,
}

impl Peer {
    /// The credentials `uid`, `gid`, `pid`.
    pub fn new(uid: u32, gid: u32, pid: Option<u32>) -> Self {
        Self { uid, gid, pid }
    }
}

/// The clock shared by the marks and the tracker: Unix nanoseconds derived from a monotonic
/// clock, so that marks compare with [`Snapshot::taken_at`] and never go backwards.
#[derive(Debug)]
struct Clock {
    instant: Instant,
    unix_nanos: u64,
}

impl Clock {
    fn new() -> Self {
        let unix_nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self { instant: Instant::now(), unix_nanos }
    }

    #[inline]
    fn now(&self) -> u64 {
        let since = self.instant.elapsed().as_nanos();
        self.unix_nanos.saturating_add(u64::try_from(since).unwrap_or(u64::MAX))
    }
}

/// One run's hand-off cell: what the training loop writes and the tracker reads.
#[derive(Debug)]
struct RunCell {
    job: Box<str>,
    /// The job its marks name: `job` itself, or for a run segment the steps socket opened
    /// (`<base>#<segment>`, [`StepRegistry::record_client`]) the job it continues.
    base: Box<str>,
    /// 1, or the number of the run segment this run is (the `n` of `<base>#<n>`).
    segment: u32,
    /// The steps-socket connection of its latest mark; 0 = none (a mark from this process or
    /// from the registry's API).
    client: AtomicU64,
    rank: Option<u32>,
    rank_label: Box<str>,
    /// Unix nanos when the run was created (the start of its first step), or 0 when unknown.
    created: u64,
    /// Who registered it through the steps socket; `None` for a run made in this process (or
    /// by [`StepRegistry::record`]), which no peer may mark.
    owner: Option<Peer>,
    /// Unix nanos when it was registered: with `at`, how long it has been idle.
    registered: u64,
    /// The pid of the owner's latest mark (a run's ranks may reconnect from a new process).
    pid: AtomicU64,
    /// Last step marked + 1; 0 = none yet.
    step: AtomicU64,
    /// First step ever marked + 1; 0 = none yet. Lets the tracker report every step of a run's
    /// first period, not only the last (marks 1 and 2 before the first tick are two steps).
    first: AtomicU64,
    /// Unix nanos of the first mark; 0 = none yet. A run registered through the steps socket has
    /// no creation time: its first mark is where the steps after it start.
    first_at: AtomicU64,
    /// Unix nanos of the latest mark.
    at: AtomicU64,
    /// The GPUs the run's marks named (the steps socket's `gpu` key), `None` when they named
    /// none: then rank `r` is taken to drive GPU `r`. Changes only when a mark names other GPUs.
    gpus: Mutex<Option<Arc<DeviceFilter>>>,
    /// The latest marks' times ([`MarkSlot`]).
    marks: [MarkSlot; MARK_SLOTS],
}

/// One recent mark's time, kept so that the tracker knows each step's own duration when several
/// steps end in one sampling period. Written like a seqlock: `step` is 0 while `at` changes,
/// then the mark's step + 1; a reader that sees the same step + 1 before and after reading `at`
/// read that mark's time.
#[derive(Debug, Default)]
struct MarkSlot {
    step: AtomicU64,
    at: AtomicU64,
}

/// How many recent marks a training run keeps, to give each step its own duration when several
/// end in one sampling period (slot `step % MARK_SLOTS`): as many as the tracker reports per
/// tick, so that every reported step has its own duration.
pub const MARK_SLOTS: usize = 64;

impl RunCell {
    #[inline]
    fn mark(&self, n: u64, now: u64) -> Result<(), StepError> {
        let Some(stored) = n.checked_add(1) else { return Err(StepError::OutOfRange(n)) };
        let mut cur = self.step.load(Ordering::Relaxed);
        loop {
            if cur >= stored {
                return Err(StepError::NotIncreasing { last: cur - 1, got: n });
            }
            match self.step.compare_exchange_weak(cur, stored, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // Only the caller that stored step n writes its slot (a caller of step
                    // n ± 64 at the same moment may overwrite it: the reader then sees another
                    // step in the slot and takes the mean for this one).
                    let slot = &self.marks[(n % MARK_SLOTS as u64) as usize];
                    slot.step.store(0, Ordering::Relaxed);
                    std::sync::atomic::fence(Ordering::Release);
                    slot.at.store(now, Ordering::Relaxed);
                    slot.step.store(stored, Ordering::Release);
                    if cur == 0 {
                        // Only the caller that moved the run off "no step yet" gets here.
                        self.first_at.store(now, Ordering::Release);
                        self.first.store(stored, Ordering::Release);
                    }
                    break;
                }
                Err(actual) => cur = actual,
            }
        }
        // A concurrent caller with a higher step may store its time first: keep the later time.
        self.at.fetch_max(now, Ordering::AcqRel);
        Ok(())
    }

    fn last(&self) -> Option<u64> {
        self.step.load(Ordering::Acquire).checked_sub(1)
    }

    /// Unix nanos of the latest sign of life: the latest mark, else the registration.
    fn active_at(&self) -> u64 {
        self.at.load(Ordering::Acquire).max(self.registered)
    }

    /// The registering peer, with the pid of its latest mark.
    fn peer(&self) -> Option<Peer> {
        let pid = u32::try_from(self.pid.load(Ordering::Acquire)).ok();
        self.owner.map(|o| Peer { pid: pid.or(o.pid), ..o })
    }

    /// Whether the run was registered by a mark from elsewhere ([`StepRegistry::record`] and
    /// the like: the steps socket), rather than made by the sampling process
    /// ([`StepRegistry::run`], which sets its start). Such a run's rank says which GPU it drives
    /// when its marks name none; the sampling process chose the GPUs it samples itself.
    fn marked_elsewhere(&self) -> bool {
        self.created == 0
    }

    /// When step `n` was marked, if its slot still holds that mark.
    fn marked_at(&self, n: u64) -> Option<u64> {
        let slot = &self.marks[(n % MARK_SLOTS as u64) as usize];
        let tag = n.checked_add(1)?;
        if slot.step.load(Ordering::Acquire) != tag {
            return None;
        }
        let at = slot.at.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        (slot.step.load(Ordering::Relaxed) == tag).then_some(at)
    }

    /// The first step ever marked on this run.
    fn first(&self) -> Option<u64> {
        self.first.load(Ordering::Acquire).checked_sub(1)
    }

    /// The GPUs the run's marks named, if any.
    fn gpus(&self) -> Option<Arc<DeviceFilter>> {
        self.gpus.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Remembers the GPUs a mark named (a no-op when they are the ones already known).
    fn name_gpus(&self, gpus: &DeviceFilter) {
        let mut cur = self.gpus.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cur.as_deref() != Some(gpus) {
            *cur = Some(Arc::new(gpus.clone()));
        }
    }
}

#[derive(Debug)]
struct Shared {
    clock: Clock,
    runs: Mutex<Vec<Arc<RunCell>>>,
    /// `runs.len()`, readable without the lock.
    count: AtomicUsize,
    /// Bumped under the lock whenever a run is added or evicted: the tracker checks it every
    /// tick and re-reads the table only when it moved.
    generation: AtomicU64,
    /// Whether a steps socket feeds this registry (then the rejection counters are exported).
    socket: AtomicBool,
    /// Most runs one uid may hold (the steps socket sets it; [`MAX_RUNS`] until then).
    max_runs_per_uid: AtomicUsize,
    /// Nanoseconds without a mark after which a peer's run may be evicted; 0 = never (the steps
    /// socket sets it).
    idle_timeout: AtomicU64,
    /// Marks dropped, per [`Rejection`] (indexed by `Rejection as usize`).
    rejected: [AtomicU64; 5],
    /// Runs evicted for idleness so far.
    evicted: AtomicU64,
    /// Steps-socket connections being read now (see [`StepRegistry::connections_open`]).
    connections: AtomicUsize,
    /// The last steps-socket client id handed out ([`StepRegistry::new_client`]).
    clients: AtomicU64,
}

crate::named_enum! {
    /// Why a mark from another process was dropped. Its name is the `reason` label of
    /// `gpumon_steps_rejected_total`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[non_exhaustive]
    pub enum Rejection as "rejection reason" {
        /// Not a JSON object with `job` and `step` (or not UTF-8, or cut off).
        Malformed = "malformed",
        /// A line over the length limit.
        Oversized = "oversized",
        /// A well-formed mark the registry refused ([`StepError`]).
        Refused = "refused",
        /// A connection past the connection limit (all of them, or its user's), closed at once.
        Connections = "connections",
        /// A mark for a run another Unix user registered ([`StepError::NotOwner`]).
        NotOwner = "not_owner",
    }
}

/// Marks from other processes dropped so far ([`Rejection`]), as a snapshot carries them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct StepRejections {
    /// [`Rejection::Malformed`].
    pub malformed: u64,
    /// [`Rejection::Oversized`].
    pub oversized: u64,
    /// [`Rejection::Refused`].
    pub refused: u64,
    /// [`Rejection::Connections`].
    pub connections: u64,
    /// [`Rejection::NotOwner`].
    pub not_owner: u64,
}

impl StepRejections {
    /// The count for `reason`.
    pub fn get(&self, reason: Rejection) -> u64 {
        match reason {
            Rejection::Malformed => self.malformed,
            Rejection::Oversized => self.oversized,
            Rejection::Refused => self.refused,
            Rejection::Connections => self.connections,
            Rejection::NotOwner => self.not_owner,
        }
    }

    /// All reasons together.
    pub fn total(&self) -> u64 {
        Rejection::ALL.iter().map(|r| self.get(*r)).sum()
    }
}

/// Where training runs are registered; the other half of a [`StepTracker`].
///
/// `Send + Sync`; a clone is another handle to the same registry.
#[derive(Clone, Debug)]
pub struct StepRegistry {
    shared: Arc<Shared>,
}

/// This process's effective uid (what a local run's owner is reported as), read from `/proc`:
/// only on the error path, so no libc call is needed.
fn self_uid() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    // Read once: a peer's mark for a run of this process asks on every line.
    static UID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UID.get_or_init(|| std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid()))
}

/// The rule every run's job name meets, in this process and over the steps socket: 1 to
/// [`MAX_JOB_LEN`] bytes, no control characters. For a client that checks a name before sending
/// marks the agent would refuse.
///
/// ```
/// use gpumon_core::steps::{validate_job, StepError};
/// assert!(validate_job("train").is_ok());
/// assert!(matches!(validate_job("a\tb"), Err(StepError::InvalidJob(_))));
/// ```
///
/// # Errors
/// [`StepError::InvalidJob`].
pub fn validate_job(job: &str) -> Result<(), StepError> {
    if job.is_empty() || job.len() > MAX_JOB_LEN || job.chars().any(char::is_control) {
        return Err(StepError::InvalidJob(job.chars().take(MAX_JOB_LEN).collect()));
    }
    Ok(())
}

impl StepRegistry {
    fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                clock: Clock::new(),
                runs: Mutex::new(Vec::new()),
                count: AtomicUsize::new(0),
                generation: AtomicU64::new(0),
                socket: AtomicBool::new(false),
                max_runs_per_uid: AtomicUsize::new(MAX_RUNS),
                idle_timeout: AtomicU64::new(0),
                rejected: Default::default(),
                evicted: AtomicU64::new(0),
                connections: AtomicUsize::new(0),
                clients: AtomicU64::new(0),
            }),
        }
    }

    /// Counts one mark from another process dropped for `reason` (the steps socket does this).
    pub fn reject(&self, reason: Rejection) {
        self.shared.rejected[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Steps-socket connections being read now: a client that closed its connection counts
    /// until every mark it wrote has been read. `gpumon-agent run` waits for none before the
    /// run's last sample, so that a burst of marks written just before the command exited is
    /// reported rather than cut off.
    pub fn connections_open(&self) -> usize {
        self.shared.connections.load(Ordering::Acquire)
    }

    /// Counts a connection open until the guard is dropped (also when its task is aborted).
    #[cfg(feature = "steps-socket")]
    pub(crate) fn connection_guard(&self) -> impl Drop + Send + 'static {
        struct Open(Arc<Shared>);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.connections.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.shared.connections.fetch_add(1, Ordering::AcqRel);
        Open(Arc::clone(&self.shared))
    }

    /// Marks dropped so far, `None` unless a steps socket feeds this registry.
    pub fn rejections(&self) -> Option<StepRejections> {
        if !self.shared.socket.load(Ordering::Acquire) {
            return None;
        }
        let get = |r: Rejection| self.shared.rejected[r as usize].load(Ordering::Relaxed);
        Some(StepRejections {
            malformed: get(Rejection::Malformed),
            oversized: get(Rejection::Oversized),
            refused: get(Rejection::Refused),
            connections: get(Rejection::Connections),
            not_owner: get(Rejection::NotOwner),
        })
    }

    /// The run (`job`, `rank`), created when new. A peer may only use a run its uid registered,
    /// and hold at most `max_runs_per_uid`; when a limit is reached, idle runs are evicted first.
    fn find_or_create(
        &self,
        job: &str,
        rank: Option<u32>,
        created: u64,
        owner: Option<&Peer>,
    ) -> Result<Arc<RunCell>, StepError> {
        validate_job(job)?;
        let mut runs = self.shared.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(cell) = runs.iter().find(|c| &*c.job == job && c.rank == rank) {
            Self::check_owner(cell, owner)?;
            return Ok(Arc::clone(cell));
        }
        self.create_locked(&mut runs, (job, job, 1), rank, created, owner)
    }

    /// Whether `owner` (`None`: this process) may mark `cell`; a peer's mark also makes its pid
    /// the run's.
    fn check_owner(cell: &RunCell, owner: Option<&Peer>) -> Result<(), StepError> {
        let Some(peer) = owner else { return Ok(()) };
        // A peer marks only its own runs; this process (no peer) is trusted with all.
        // A run this process registered belongs to this process's user, so a peer of
        // that user may mark it too (the run keeps this process's pid).
        match cell.owner {
            Some(o) if o.uid == peer.uid => {
                if let Some(pid) = peer.pid {
                    cell.pid.store(u64::from(pid), Ordering::Release);
                }
                Ok(())
            }
            Some(o) => Err(StepError::NotOwner { owner: o.uid, uid: peer.uid }),
            None if peer.uid == self_uid() => Ok(()),
            None => Err(StepError::NotOwner { owner: self_uid(), uid: peer.uid }),
        }
    }

    /// A new run named `(job, base, segment)` ([`RunCell::base`]), unless a limit is reached
    /// even after evicting idle runs.
    fn create_locked(
        &self,
        runs: &mut Vec<Arc<RunCell>>,
        (job, base, segment): (&str, &str, u32),
        rank: Option<u32>,
        created: u64,
        owner: Option<&Peer>,
    ) -> Result<Arc<RunCell>, StepError> {
        let max_per_uid = self.shared.max_runs_per_uid.load(Ordering::Relaxed);
        let held =
            |runs: &[Arc<RunCell>], uid: u32| runs.iter().filter(|c| c.owner.is_some_and(|o| o.uid == uid)).count();
        let over = |runs: &[Arc<RunCell>]| -> Option<StepError> {
            if let Some(peer) = owner {
                if held(runs, peer.uid) >= max_per_uid {
                    return Some(StepError::TooManyRunsForUid { uid: peer.uid, max: max_per_uid });
                }
            }
            (runs.len() >= MAX_RUNS).then_some(StepError::TooManyRuns)
        };
        if over(runs).is_some() {
            self.evict_idle_locked(runs, self.shared.clock.now());
            if let Some(e) = over(runs) {
                return Err(e);
            }
        }
        let now = self.shared.clock.now();
        let cell = Arc::new(RunCell {
            job: job.into(),
            base: base.into(),
            segment,
            client: AtomicU64::new(0),
            rank,
            rank_label: rank.map(|r| r.to_string()).unwrap_or_default().into(),
            created,
            owner: owner.copied(),
            registered: now,
            pid: AtomicU64::new(owner.and_then(|p| p.pid).map_or(u64::MAX, u64::from)),
            step: AtomicU64::new(0),
            first: AtomicU64::new(0),
            first_at: AtomicU64::new(0),
            at: AtomicU64::new(0),
            gpus: Mutex::new(None),
            marks: std::array::from_fn(|_| MarkSlot::default()),
        });
        runs.push(Arc::clone(&cell));
        self.shared.count.store(runs.len(), Ordering::Release);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        Ok(cell)
    }

    /// A new steps-socket client's id (one per connection; never 0).
    #[cfg_attr(not(feature = "steps-socket"), allow(dead_code))]
    pub(crate) fn new_client(&self) -> u64 {
        self.shared.clients.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A mark from steps-socket connection `client` ([`StepRegistry::new_client`]) sent by
    /// `peer`, naming the GPUs `gpus` when it names any: [`StepRegistry::record_from_gpus`],
    /// with **run segments**. A client's first mark of (`job`, `rank`) that numbers *below* the
    /// run's last step — a second `fit()` in a new process, a rank restarted from an older
    /// checkpoint — opens the run's next segment, the run `<job>#2` (then `#3`, …; a name
    /// already taken is skipped), instead of being refused: a run of its own whose first mark
    /// starts it, so the time between the two runs is no step. The client's later marks of
    /// `job` go to its segment. A mark *equal* to the last one (a retry after a reconnect), and
    /// a client going back on a run it has marked itself (numbering restarted each epoch), are
    /// still refused.
    #[cfg_attr(not(feature = "steps-socket"), allow(dead_code))]
    pub(crate) fn record_client(
        &self,
        peer: &Peer,
        client: u64,
        job: &str,
        rank: Option<u32>,
        gpus: Option<&DeviceFilter>,
        step: u64,
    ) -> Result<(), StepError> {
        validate_job(job)?;
        let mut runs = self.shared.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let of_job = |c: &&Arc<RunCell>| c.rank == rank && (&*c.base == job || &*c.job == job);
        // The run this client marks, else the job's latest segment.
        let found = runs
            .iter()
            .filter(of_job)
            .find(|c| c.client.load(Ordering::Acquire) == client)
            .or_else(|| runs.iter().filter(of_job).max_by_key(|c| (c.segment, c.registered)));
        let cell = match found {
            Some(cell) => {
                Self::check_owner(cell, Some(peer))?;
                Arc::clone(cell)
            }
            None => self.create_locked(&mut runs, (job, job, 1), rank, 0, Some(peer))?,
        };
        let mark = |cell: &RunCell| {
            if let Some(gpus) = gpus {
                // Named before the mark, so that the tick that reads the mark knows its GPUs.
                cell.name_gpus(gpus);
            }
            cell.mark(step, self.shared.clock.now())?;
            cell.client.store(client, Ordering::Release);
            Ok(())
        };
        match mark(&cell) {
            Err(StepError::NotIncreasing { last, got })
                if got < last && cell.client.load(Ordering::Acquire) != client =>
            {
                let base = Arc::clone(&cell);
                let next = runs.iter().filter(|c| c.base == base.base && c.rank == rank).map(|c| c.segment).max();
                let mut segment = next.unwrap_or(1) + 1;
                let taken = |runs: &[Arc<RunCell>], name: &str| runs.iter().any(|c| &*c.job == name && c.rank == rank);
                while taken(&runs, &format!("{}#{segment}", base.base)) {
                    segment += 1;
                }
                let name = format!("{}#{segment}", base.base);
                let cell = self.create_locked(&mut runs, (&name, &base.base, segment), rank, 0, Some(peer))?;
                mark(&cell)
            }
            other => other,
        }
    }

    /// Drops the peers' runs idle for the configured timeout (none when it is 0).
    fn evict_idle_locked(&self, runs: &mut Vec<Arc<RunCell>>, now: u64) -> usize {
        let timeout = self.shared.idle_timeout.load(Ordering::Relaxed);
        if timeout == 0 {
            return 0;
        }
        let before = runs.len();
        runs.retain(|c| c.owner.is_none() || now.saturating_sub(c.active_at()) < timeout);
        let evicted = before - runs.len();
        if evicted > 0 {
            self.shared.count.store(runs.len(), Ordering::Release);
            self.shared.generation.fetch_add(1, Ordering::AcqRel);
            self.shared.evicted.fetch_add(evicted as u64, Ordering::Relaxed);
            // Only the steps socket sets a timeout, and it brings tracing.
            #[cfg(feature = "steps-socket")]
            tracing::info!(
                evicted,
                held = runs.len(),
                "steps socket: evicted runs with no mark for {:?}",
                Duration::from_nanos(timeout)
            );
        }
        evicted
    }

    /// Evicts the runs registered through the steps socket ([`StepRegistry::record_from`]) that
    /// have had no mark for the socket's `idle_timeout` (`socket::SocketConfig`; their
    /// registration counts as a mark), and returns how many. The steps socket calls it periodically and whenever a new
    /// run would be refused for a full table; runs made in this process are never evicted. An
    /// evicted run's next mark registers it again, as a run with no known start.
    pub fn evict_idle(&self) -> usize {
        let mut runs = self.shared.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.evict_idle_locked(&mut runs, self.shared.clock.now())
    }

    /// Runs evicted for idleness so far ([`StepRegistry::evict_idle`]).
    pub fn evicted(&self) -> u64 {
        self.shared.evicted.load(Ordering::Relaxed)
    }

    /// The steps socket's limits: most runs per uid, and the idle time after which a peer's
    /// run may be evicted.
    #[cfg_attr(not(feature = "steps-socket"), allow(dead_code))]
    fn set_peer_limits(&self, max_runs_per_uid: usize, idle_timeout: Duration) {
        self.shared.max_runs_per_uid.store(max_runs_per_uid, Ordering::Relaxed);
        let nanos = u64::try_from(idle_timeout.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.shared.idle_timeout.store(nanos, Ordering::Relaxed);
    }

    /// The handle of run (`job`, `rank`), created on first use; its first step starts now.
    /// Asking again for the same pair returns a handle to the same run.
    ///
    /// # Errors
    /// [`StepError::InvalidJob`] for an empty job name, one over [`MAX_JOB_LEN`] bytes or one
    /// with control characters; [`StepError::TooManyRuns`] past [`MAX_RUNS`].
    pub fn run(&self, job: &str, rank: Option<u32>) -> Result<TrainingRun, StepError> {
        let cell = self.find_or_create(job, rank, self.shared.clock.now(), None)?;
        Ok(TrainingRun { cell, shared: Arc::clone(&self.shared) })
    }

    /// One mark from elsewhere (the agent's steps socket): step `step` of run (`job`, `rank`)
    /// ended now. A run first seen here has no known start, so its first mark is not reported.
    ///
    /// # Errors
    /// As [`StepRegistry::run`] and [`TrainingRun::step`].
    pub fn record(&self, job: &str, rank: Option<u32>, step: u64) -> Result<(), StepError> {
        let cell = self.find_or_create(job, rank, 0, None)?;
        cell.mark(step, self.shared.clock.now())
    }

    /// [`StepRegistry::record`] for a mark that `peer` sent (the steps socket passes the
    /// connection's credentials): a run first seen here belongs to `peer.uid`, and a run that
    /// another uid registered — or that this process made, unless `peer` is this process's own
    /// user — is not `peer`'s to mark.
    ///
    /// ```
    /// use gpumon_core::steps::{Peer, StepConfig, StepError, StepTracker};
    ///
    /// let (_tracker, steps) = StepTracker::new(StepConfig::default())?;
    /// let (alice, bob) = (Peer::new(1001, 1001, Some(4242)), Peer::new(1002, 1002, Some(4343)));
    /// steps.record_from(&bob, "train", Some(0), 1)?;
    /// assert_eq!(steps.record_from(&alice, "train", Some(0), 99), Err(StepError::NotOwner { owner: 1002, uid: 1001 }));
    /// steps.record_from(&bob, "train", Some(0), 2)?; // bob's steps go on from his own last
    /// # Ok::<(), StepError>(())
    /// ```
    ///
    /// # Errors
    /// As [`StepRegistry::record`]; [`StepError::NotOwner`] for another uid's run;
    /// [`StepError::TooManyRunsForUid`] when `peer.uid` already holds as many runs as one user
    /// may.
    pub fn record_from(&self, peer: &Peer, job: &str, rank: Option<u32>, step: u64) -> Result<(), StepError> {
        let cell = self.find_or_create(job, rank, 0, Some(peer))?;
        cell.mark(step, self.shared.clock.now())
    }

    /// [`StepRegistry::record_from`] for a mark that names the GPUs its run drives (the steps
    /// socket's `gpu` key, `CUDA_VISIBLE_DEVICES` syntax): the run's step figures and its
    /// diagnosis are then those GPUs' ([`Steps::for_gpu`]), whatever its rank. A rank indexes
    /// the process's `CUDA_VISIBLE_DEVICES`, not the node's GPUs, so a client that knows the
    /// physical GPU says it. The GPUs are remembered until a mark names others.
    ///
    /// ```
    /// use gpumon_core::steps::{Peer, StepConfig, StepTracker};
    /// use gpumon_core::DeviceFilter;
    ///
    /// let (_tracker, steps) = StepTracker::new(StepConfig::default())?;
    /// let me = Peer::new(1001, 1001, Some(4242));
    /// // Rank 1 of a job started with CUDA_VISIBLE_DEVICES=4,5 drives GPU 5.
    /// steps.record_from_gpus(&me, "train", Some(1), &DeviceFilter::parse("5").unwrap(), 1)?;
    /// # Ok::<(), gpumon_core::steps::StepError>(())
    /// ```
    ///
    /// # Errors
    /// As [`StepRegistry::record_from`] (a mark refused for its step still names the GPUs of
    /// the peer's own run).
    pub fn record_from_gpus(
        &self,
        peer: &Peer,
        job: &str,
        rank: Option<u32>,
        gpus: &DeviceFilter,
        step: u64,
    ) -> Result<(), StepError> {
        let cell = self.find_or_create(job, rank, 0, Some(peer))?;
        // Named before the mark, so that the tick that reads the mark knows its GPUs.
        cell.name_gpus(gpus);
        cell.mark(step, self.shared.clock.now())
    }

    /// [`StepRegistry::record`] at a given time rather than now: marks read back from a log, or
    /// made by a simulation whose clock is not the wall clock (the accuracy test marks the mock's
    /// steps in simulated time). `at` must be on the clock of the snapshots' `taken_at`.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use gpumon_core::steps::{StepConfig, StepTracker};
    ///
    /// let (_tracker, steps) = StepTracker::new(StepConfig::default())?;
    /// let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    /// steps.record_at("train", Some(0), 1, at)?;
    /// steps.record_at("train", Some(0), 2, at + Duration::from_millis(300))?;
    /// assert!(steps.record_at("train", Some(0), 2, at).is_err()); // steps only go up
    /// # Ok::<(), gpumon_core::steps::StepError>(())
    /// ```
    ///
    /// # Errors
    /// As [`StepRegistry::record`].
    pub fn record_at(&self, job: &str, rank: Option<u32>, step: u64, at: SystemTime) -> Result<(), StepError> {
        let nanos = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let cell = self.find_or_create(job, rank, 0, None)?;
        cell.mark(step, nanos)
    }

    /// The last step marked on run (`job`, `rank`); `None` when it has none or is not registered
    /// (unlike [`StepRegistry::run`], this never registers it).
    pub fn last_step(&self, job: &str, rank: Option<u32>) -> Option<u64> {
        let runs = self.shared.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        runs.iter().find(|c| &*c.job == job && c.rank == rank)?.last()
    }

    /// How many runs are registered.
    pub fn len(&self) -> usize {
        self.shared.count.load(Ordering::Acquire)
    }

    /// Whether no run is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The handle a training loop marks its steps with. `Send + Sync`; clones mark the same run.
#[derive(Clone, Debug)]
pub struct TrainingRun {
    cell: Arc<RunCell>,
    shared: Arc<Shared>,
}

impl TrainingRun {
    /// Marks the end of step `n` (`n` = the last completed step). Lock-free, no allocation,
    /// never blocks; see the [module docs](self) for what the tracker makes of it.
    ///
    /// # Errors
    /// [`StepError::NotIncreasing`] when `n` is not above the last step marked on this run
    /// (by any caller); [`StepError::OutOfRange`] for `u64::MAX`. The mark is then ignored.
    #[inline]
    pub fn step(&self, n: u64) -> Result<(), StepError> {
        self.cell.mark(n, self.shared.clock.now())
    }

    /// [`TrainingRun::step`] at a given time (Unix nanoseconds), for tests of the tracker.
    #[cfg(test)]
    pub(crate) fn step_at(&self, n: u64, unix_nanos: u64) -> Result<(), StepError> {
        self.cell.mark(n, unix_nanos)
    }

    /// The run's job name.
    pub fn job(&self) -> &str {
        &self.cell.job
    }

    /// The run's rank, if it has one.
    pub fn rank(&self) -> Option<u32> {
        self.cell.rank
    }

    /// The last step marked on this run, if any.
    pub fn last_step(&self) -> Option<u64> {
        self.cell.last()
    }
}

mod output;
mod tracker;
#[cfg(feature = "serde")]
pub(crate) use output::STEPS_KEY;
pub use output::{DeviceStep, RunSteps, StepReport, Steps};
pub use tracker::StepTracker;

#[cfg(test)]
mod tests;

impl StepTracker {
    /// A tracker and the registry its runs are marked in.
    ///
    /// # Errors
    /// [`StepError::InvalidConfig`] when `config.every_n` is 0.
    pub fn new(config: StepConfig) -> Result<(StepTracker, StepRegistry), StepError> {
        if config.every_n == 0 {
            return Err(StepError::InvalidConfig("every_n must be at least 1".into()));
        }
        let registry = StepRegistry::new();
        Ok((StepTracker::with(config, registry.clone()), registry))
    }
}

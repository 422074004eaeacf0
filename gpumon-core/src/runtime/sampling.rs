//! The sampling thread and its watchdog.
//!
//! One thread per agent owns the schedule: it sleeps on the agent's [`Clock`] until the tick,
//! calls the backend, runs the processors, hands the snapshot to the sinks that export inline
//! ([`Sink::exports_inline`](crate::Sink::exports_inline): they only store it) and puts it into
//! every other sink's queue (and sends it to the subscribers) itself. It wakes the runtime —
//! once, whatever the number of sinks: the [`Watchdog`] task wakes the sink workers from inside —
//! only when a queue got the snapshot or an inline sink has I/O due. A tick whose sinks all
//! export inline therefore costs one wake-up, this thread's. (It was two when every export went
//! through the runtime, and four when the runtime ticked and sampled on its blocking pool: the
//! timer, its wheel's cascade, the pool thread, the result.)
//!
//! A driver call that hangs holds only this thread. The [`Watchdog`], a task on the runtime,
//! abandons the sample in flight once its timeout passes: the sinks hear of the timeout, then of
//! every tick skipped while the call stays stuck, exactly as if the thread were still ticking;
//! the late result is discarded when the call returns. On the system clock (Linux) the thread
//! arms a kernel timer before each backend call and disarms it after (`alarm.rs`), so the
//! watchdog sleeps until a sample really overruns; otherwise the watchdog keeps the deadline on
//! the agent's clock and the thread wakes it every tick to re-arm it.
//!
//! Requests from handles ([`AgentHandle::snapshot_now`](super::AgentHandle::snapshot_now),
//! [`flush`](super::AgentHandle::flush)) are queued to the same thread, so there is never more
//! than one sample in flight, and are guarded by the same watchdog.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{broadcast, oneshot, Notify};

use crate::metric::MetricSet;
use crate::model::{Snapshot, SystemInfo};
use crate::sampler::{SampleError, SampleRequest, Sampler};
use crate::sink::{InlineExport, SinkError};
use crate::stages::Processor;
use crate::telemetry::{SinkStatusCell, Telemetry};

use super::alarm::Alarm;
use super::clock::{Clock, Wakeup};
use super::queue::SinkQueue;
use super::worker::{record, SharedSink};
use super::{metric_failures, panic_message};

/// What a request gets back: the snapshot, or why there is none.
pub(crate) type Reply = oneshot::Sender<Result<Taken, SampleError>>;

/// One snapshot in its two forms: `exported`, narrowed to the families the agent exports
/// ([`Snapshot::retain_exported`]), for every sink, subscriber and caller; `sampled`, with the
/// families sampled only for the processors too, for the sinks that record them
/// ([`Sink::records_stage_inputs`](crate::Sink::records_stage_inputs)). One `Arc` when the two
/// are the same (nothing sampled only for the processors, or no sink records it).
#[derive(Clone)]
pub(crate) struct Taken {
    pub(crate) exported: Arc<Snapshot>,
    pub(crate) sampled: Arc<Snapshot>,
}

impl Taken {
    /// A snapshot with nothing to narrow (a sampling-failed one).
    pub(crate) fn same(snapshot: Arc<Snapshot>) -> Self {
        Self { sampled: snapshot.clone(), exported: snapshot }
    }

    /// The form a sink gets.
    pub(crate) fn for_sink(&self, records_stage_inputs: bool) -> &Arc<Snapshot> {
        if records_stage_inputs {
            &self.sampled
        } else {
            &self.exported
        }
    }
}

/// A sample asked for by a handle, outside the schedule.
pub(crate) enum Request {
    /// [`AgentHandle::snapshot_now`](super::AgentHandle::snapshot_now): sampled, not processed,
    /// not published.
    SnapshotNow(Reply),
    /// [`AgentHandle::flush`](super::AgentHandle::flush): sampled, processed and sent to the
    /// subscribers; the agent hands it to the sinks with the flush command.
    Flush(Reply),
}

impl Request {
    fn into_reply(self) -> Reply {
        match self {
            Request::SnapshotNow(reply) | Request::Flush(reply) => reply,
        }
    }
}

/// Where a sink's snapshots go: its queue, and its status for counting drops; for a sink that
/// exports inline, the sink itself.
#[derive(Clone)]
pub(crate) struct Outlet {
    pub(crate) queue: Arc<SinkQueue>,
    pub(crate) status: SinkStatusCell,
    /// Set when the sink exports inline ([`Sink::exports_inline`](crate::Sink::exports_inline)).
    pub(crate) inline: Option<InlineOutlet>,
    /// [`Sink::records_stage_inputs`](crate::Sink::records_stage_inputs).
    pub(crate) records_stage_inputs: bool,
}

/// An inline sink as the sampling thread reaches it.
#[derive(Clone)]
pub(crate) struct InlineOutlet {
    pub(crate) sink: SharedSink,
    pub(crate) name: Arc<str>,
}

impl Outlet {
    /// Enqueues `snapshot`, counting a snapshot lost to a full (or closed) queue.
    fn enqueue(&self, snapshot: &Arc<Snapshot>) {
        if self.queue.enqueue(snapshot.clone()) {
            self.status.update(|s| s.dropped += 1);
        }
    }

    /// Hands `snapshot` to the sink: inline when it exports inline, its task is idle and nothing
    /// older waits in its queue (the worker pops only while it holds the sink, so the queue cannot
    /// empty behind this look); otherwise into its queue. Returns whether the sink's task has work
    /// (a queued snapshot, a flush an inline export asked for), i.e. whether the runtime must wake.
    fn deliver(&self, taken: &Taken) -> bool {
        let snapshot = taken.for_sink(self.records_stage_inputs);
        let Some(inline) = &self.inline else {
            self.enqueue(snapshot);
            return true;
        };
        let Ok(mut sink) = inline.sink.try_lock() else {
            self.enqueue(snapshot);
            return true;
        };
        if !self.queue.is_empty() {
            drop(sink);
            self.enqueue(snapshot);
            return true;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.export_inline(snapshot)));
        drop(sink);
        let (result, flush_due) = match outcome {
            Ok(Ok(InlineExport::Done)) => (Ok(()), false),
            Ok(Ok(InlineExport::FlushDue)) => (Ok(()), true),
            Ok(Err(error)) => (Err(error), false),
            Err(payload) => (Err(SinkError::Panicked(panic_message(&*payload))), false),
        };
        record(&inline.name, &self.status, result, true);
        if flush_due {
            self.queue.request_flush();
        }
        flush_due
    }
}

/// Puts `snapshot` in every sink queue (the watchdog's failure snapshots: the sampling thread may
/// be stuck in a call, so inline sinks get them through their task too). Never waits: a full
/// queue drops its oldest entry, and the loss is counted here, when it happens, not when a stuck
/// sink gets round to noticing. Wakes the sink workers when `wake`.
pub(crate) fn push_to_sinks(outlets: &[Outlet], snapshot: &Arc<Snapshot>, wake: bool) {
    for outlet in outlets {
        outlet.enqueue(snapshot);
        if wake {
            outlet.queue.wake();
        }
    }
}

/// The sampling thread's delivery of a tick: inline where a sink exports inline, queued
/// otherwise. Returns whether any sink's task has work (the runtime must be woken).
fn deliver_to_sinks(outlets: &[Outlet], taken: &Taken) -> bool {
    let mut wake = false;
    for outlet in outlets {
        wake |= outlet.deliver(taken);
    }
    wake
}

/// What the thread, the watchdog and the agent share, under one lock.
pub(crate) struct State {
    /// Set by the agent to end the thread.
    pub(crate) stop: bool,
    pub(crate) requests: VecDeque<Request>,
    pub(crate) in_flight: Option<InFlight>,
    /// When the next scheduled tick is due; `None` when the agent samples only on request.
    pub(crate) next_tick: Option<Instant>,
    pub(crate) book: Book,
}

/// The sample the thread is taking.
pub(crate) struct InFlight {
    /// On the agent's clock.
    pub(crate) started: Instant,
    /// `None` for a scheduled tick.
    pub(crate) request: Option<Request>,
    /// Set by the watchdog when the sample overran its timeout: its result will be discarded.
    pub(crate) abandoned: bool,
}

impl State {
    /// Whether a sample is stuck in the backend past its timeout.
    pub(crate) fn stuck(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|f| f.abandoned)
    }
}

/// The agent's numbering and failure bookkeeping, shared by the thread (which takes samples) and
/// the watchdog (which reports the ones that never return).
pub(crate) struct Book {
    pub(crate) seq: u64,
    /// The host facts of the last snapshot taken, for the sampling-failed snapshots that follow.
    last_system: Option<Arc<SystemInfo>>,
    /// The last sampling failure other than `Busy` (set by [`Book::failed`]), for the ticks
    /// skipped behind it.
    last_failure: Option<String>,
    /// Whether the last sample failed (to log a run of failures once, not every tick).
    failing: bool,
    /// The host-name override, for failure snapshots before any sample.
    hostname: Option<Arc<str>>,
    backend: String,
}

impl Book {
    pub(crate) fn new(hostname: Option<Arc<str>>, backend: String) -> Self {
        Self { seq: 0, last_system: None, last_failure: None, failing: false, hostname, backend }
    }

    /// Records a failed sample (logging a run of failures once) in the telemetry, and its
    /// cause for the ticks skipped behind it — a requested sample's timeout included, which no
    /// sampling-failed snapshot reports (its caller hears of it).
    pub(crate) fn failed(&mut self, telemetry: &Telemetry, duration: Duration, error: &SampleError) {
        if !matches!(error, SampleError::Busy) {
            self.last_failure = Some(error.to_string());
        }
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(error = %error, "sample failed again");
        } else {
            tracing::warn!(error = %error, "sample failed");
        }
        telemetry.sample_failed(duration, error);
    }

    /// What the sinks get for a tick whose sample failed: a sampling-failed snapshot
    /// ([`Snapshot::sampling_failed`]) about the host as the last good snapshot named it (before
    /// any: the host-name override or this host, and the sampler's name as backend), numbered
    /// like the last snapshot taken, so the sampled snapshots' numbers stay contiguous.
    /// Subscribers never get one (see [`AgentHandle::subscribe`](super::AgentHandle::subscribe)).
    pub(crate) fn failure_snapshot(&mut self, error: &SampleError) -> Arc<Snapshot> {
        let system = match &self.last_system {
            Some(system) => system.clone(),
            None => {
                let host = self.hostname.as_ref().map_or_else(crate::hostname, |h| h.to_string());
                let system = Arc::new(SystemInfo::new(host, self.backend.clone()));
                self.last_system = Some(system.clone());
                system
            }
        };
        // A tick skipped behind a stuck sample says why that sample is stuck (its timeout), not
        // only that one is in flight: the cause must not vanish from the sinks after one tick.
        let reason = match (error, &self.last_failure) {
            (SampleError::Busy, Some(cause)) => format!("{cause}; {error}"),
            _ => error.to_string(),
        };
        Arc::new(Snapshot::sampling_failed(system, reason).with_seq(self.seq))
    }
}

/// The handle the agent, the watchdog and the thread share.
pub(crate) struct Shared {
    pub(crate) wakeup: Arc<Wakeup<State>>,
    /// Signalled by the thread after a tick that left work for a sink's task (the watchdog wakes
    /// the sink workers) and, without the kernel alarm, after every tick and when it starts a
    /// requested sample (the watchdog re-arms its own timer).
    pub(crate) progress: Notify,
    pub(crate) outlets: Arc<[Outlet]>,
    pub(crate) telemetry: Telemetry,
    pub(crate) clock: Clock,
    pub(crate) sample_timeout: Duration,
    /// `None` when the agent samples only on request.
    pub(crate) interval: Option<Duration>,
    /// When the schedule started (its ticks fall on `origin + k × interval`); set by the thread.
    pub(crate) origin: std::sync::OnceLock<Instant>,
    /// Tells the watchdog of a sample that overruns its timeout (see `alarm.rs`).
    pub(crate) alarm: Alarm,
    /// Signalled by the alarm's thread when the timer goes off.
    pub(crate) alarm_fired: Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.wakeup.lock()
    }

    /// Asks the thread to stop after what it is doing.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wakeup.condvar.notify_all();
        self.progress.notify_one();
        // The alarm's thread sees `stop` when it wakes, and exits.
        self.alarm.ring();
    }

    /// Starts the alarm's thread (see `alarm.rs`): it wakes the watchdog when the timer goes off,
    /// until the agent stops.
    pub(crate) fn watch_alarm(self: &Arc<Self>) {
        let shared = self.clone();
        self.alarm.watch(move || {
            if shared.lock().stop {
                return false;
            }
            shared.alarm_fired.notify_one();
            true
        });
    }

    /// The first tick strictly after `now`.
    fn tick_after(&self, now: Instant) -> Option<Instant> {
        let interval = self.interval?;
        let origin = *self.origin.get()?;
        // In u64 nanoseconds (584 years), not u128: this runs every tick.
        let since = u64::try_from(now.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX);
        let step = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX).max(1);
        let n = since / step + 1;
        Some(origin + Duration::from_nanos(n.saturating_mul(step)))
    }
}

/// The thread's own side: the backend, the processors, and what a snapshot needs before it
/// leaves (the device filter's last word, the host-name override).
pub(crate) struct SamplingThread {
    pub(crate) shared: Arc<Shared>,
    pub(crate) sampler: Arc<dyn Sampler>,
    /// What the backend reads: the families exported and those sampled for the processors.
    pub(crate) request: SampleRequest,
    /// The families the snapshots leave with ([`Snapshot::retain_exported`]).
    pub(crate) exported: MetricSet,
    pub(crate) processors: Vec<Box<dyn Processor>>,
    pub(crate) subscribers: broadcast::Sender<Arc<Snapshot>>,
    pub(crate) hostname: Option<HostOverride>,
    /// Whether ambiguous device-filter prefixes were already reported.
    pub(crate) warned_ambiguous: bool,
    /// Whether the device list was checked for entries that select nothing (at the first sample).
    pub(crate) checked_unmatched: bool,
}

/// How a sample ended.
enum Outcome {
    Sampled(Snapshot),
    Failed(SampleError),
    /// The watchdog gave up on it while it ran; whoever waited has been told.
    Abandoned,
}

impl SamplingThread {
    /// Starts the thread; the returned receiver completes (with an error) when it has exited.
    pub(crate) fn spawn(self) -> std::io::Result<oneshot::Receiver<()>> {
        let (exited_tx, exited_rx) = oneshot::channel::<()>();
        std::thread::Builder::new().name("gpumon-sampler".to_owned()).spawn(move || {
            // Dropped last, on any exit: the agent sees the thread is gone.
            let _exited = exited_tx;
            let shared = self.shared.clone();
            // The backend's and the processors' panics are caught where they are called; this is
            // for a bug in the thread's own code, which must not leave a request waiting in vain.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
            let pending: Vec<Request> = {
                let mut state = shared.lock();
                state.stop = true;
                let in_flight = state.in_flight.take().and_then(|f| f.request);
                state.requests.drain(..).chain(in_flight).collect()
            };
            for request in pending {
                let _ = request.into_reply().send(Err(SampleError::ShutDown));
            }
            if let Err(payload) = outcome {
                tracing::error!(panic = %panic_message(&*payload), "the sampling thread panicked; no more samples");
            }
        })?;
        Ok(exited_rx)
    }

    fn run(mut self) {
        let shared = self.shared.clone();
        let clock = &shared.clock;
        let mut state = shared.lock();
        if shared.interval.is_some() {
            let origin = *shared.origin.get_or_init(|| clock.now());
            state.next_tick = Some(origin);
        }
        loop {
            if state.stop {
                return;
            }
            if let Some(request) = state.requests.pop_front() {
                let process = matches!(request, Request::Flush(_));
                state.in_flight = Some(InFlight { started: clock.now(), request: Some(request), abandoned: false });
                drop(state);
                // Without the kernel alarm the watchdog arms its own timer for this sample.
                if !shared.alarm.is_active() {
                    shared.progress.notify_one();
                }
                let (outcome, request) = self.sample(process);
                if let Some(request) = request {
                    self.answer(request, outcome);
                }
                state = shared.lock();
                continue;
            }
            let now = clock.now();
            match state.next_tick {
                Some(due) if now >= due => {
                    state.in_flight = Some(InFlight { started: now, request: None, abandoned: false });
                    state.next_tick = shared.tick_after(now);
                    drop(state);
                    let (outcome, _) = self.sample(true);
                    // The runtime is woken only when a sink's task has work, or, without the
                    // kernel alarm, for the watchdog to re-arm its timer.
                    if self.deliver(outcome) || !shared.alarm.is_active() {
                        shared.progress.notify_one();
                    }
                    state = shared.lock();
                }
                deadline => state = clock.wait(&shared.wakeup, state, deadline),
            }
        }
    }

    /// Takes the sample in flight under the watchdog; `process` runs the processors over a good
    /// one. Returns its outcome and the request that asked for it.
    fn sample(&mut self, process: bool) -> (Outcome, Option<Request>) {
        let started = Instant::now();
        let taken_at = SystemTime::now();
        let sampler = &self.sampler;
        let request = &self.request;
        self.shared.alarm.arm(self.shared.sample_timeout);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sampler.sample(request)))
            .unwrap_or_else(|payload| Err(SampleError::Panicked(panic_message(&*payload))));
        self.shared.alarm.disarm();
        let duration = started.elapsed();
        let mut state = self.shared.lock();
        // Out of the watchdog's hands from here: it cannot time out a sample that has returned.
        let in_flight = state.in_flight.take();
        let request = match in_flight {
            Some(InFlight { abandoned: false, request, .. }) => request,
            // Its result is stale; the watchdog already reported the timeout and the skips.
            _ => return (Outcome::Abandoned, None),
        };
        let book = &mut state.book;
        match result {
            Ok(mut snapshot) => {
                // Defence in depth: a backend that ignored the filter still leaks nothing, and a
                // UUID prefix that turns out to match several GPUs shows none of them.
                let ambiguous = self.request.devices.apply(&mut snapshot.devices);
                if !ambiguous.is_empty() && !std::mem::replace(&mut self.warned_ambiguous, true) {
                    tracing::error!(
                        prefixes = ?ambiguous,
                        "device UUID prefixes match more than one GPU; they select nothing (use a longer prefix)"
                    );
                }
                // Said once, at the first sample: `--devices 99` on an 8-GPU host is a typo, not
                // a GPU to wait for (one that appears later is sampled then all the same).
                if !std::mem::replace(&mut self.checked_unmatched, true) {
                    let unmatched = self.request.devices.unmatched(&snapshot.devices);
                    if !unmatched.is_empty() {
                        tracing::warn!(
                            entries = ?unmatched,
                            visible = snapshot.devices.len(),
                            "device list entries select no GPU on this host"
                        );
                    }
                }
                if let Some(host) = &mut self.hostname {
                    host.apply(&mut snapshot.system);
                }
                book.last_system = Some(snapshot.system.clone());
                // A replay's snapshots keep their recorded numbers and times
                // (`Sampler::keeps_taken_at`): a tick the recording lost stays a gap. The
                // telemetry below still says when this agent sampled.
                if self.sampler.keeps_taken_at() {
                    book.seq = snapshot.seq;
                } else {
                    book.seq += 1;
                    snapshot.seq = book.seq;
                    snapshot.taken_at = taken_at;
                    snapshot.duration = duration;
                }
                self.shared.telemetry.sample_ok(duration, taken_at, metric_failures(&snapshot));
                if std::mem::take(&mut book.failing) {
                    tracing::info!("sampling recovered");
                }
                drop(state);
                if process {
                    self.process(&mut snapshot);
                }
                (Outcome::Sampled(snapshot), request)
            }
            Err(error) => {
                book.failed(&self.shared.telemetry, duration, &error);
                (Outcome::Failed(error), request)
            }
        }
    }

    /// A scheduled tick's outcome goes to the sinks (and a good one to the subscribers).
    /// Returns whether a sink's task has work (the runtime must be woken).
    fn deliver(&self, outcome: Outcome) -> bool {
        let outlets = &self.shared.outlets;
        match outcome {
            Outcome::Sampled(snapshot) => {
                let taken = self.narrow(snapshot);
                let wake = deliver_to_sinks(outlets, &taken);
                let _ = self.subscribers.send(taken.exported);
                wake
            }
            Outcome::Failed(error) => {
                let marker = self.shared.lock().book.failure_snapshot(&error);
                deliver_to_sinks(outlets, &Taken::same(marker))
            }
            Outcome::Abandoned => false,
        }
    }

    /// A requested sample's outcome goes to whoever asked (a flush's also to the subscribers).
    fn answer(&self, request: Request, outcome: Outcome) {
        let flush = matches!(request, Request::Flush(_));
        let reply = request.into_reply();
        let _ = match outcome {
            Outcome::Sampled(snapshot) => {
                let taken = self.narrow(snapshot);
                if flush {
                    let _ = self.subscribers.send(taken.exported.clone());
                }
                reply.send(Ok(taken))
            }
            Outcome::Failed(error) => reply.send(Err(error)),
            Outcome::Abandoned => Ok(()),
        };
    }

    /// The snapshot as it leaves the thread, its processors done: narrowed to the families
    /// exported, and kept whole besides for the sinks that record what was sampled when it
    /// holds families sampled only for the processors. The copy is made only then.
    fn narrow(&self, mut snapshot: Snapshot) -> Taken {
        let sampled = self.request.metrics;
        let stage_only = sampled.iter().any(|f| !self.exported.contains(f));
        let whole = (stage_only && self.shared.outlets.iter().any(|o| o.records_stage_inputs))
            .then(|| Arc::new(snapshot.clone()));
        snapshot.retain_exported(sampled, self.exported);
        let exported = Arc::new(snapshot);
        Taken { sampled: whole.unwrap_or_else(|| exported.clone()), exported }
    }

    /// Runs every processor over `snapshot`, in order. A panicking processor loses its derived
    /// data for this tick (whatever it half-wrote is kept as is), never the tick.
    fn process(&mut self, snapshot: &mut Snapshot) {
        for p in &mut self.processors {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.process(snapshot)));
            if let Err(payload) = outcome {
                let message = panic_message(&*payload);
                if self.shared.telemetry.processor_panicked() == 1 {
                    tracing::error!(processor = p.name(), panic = %message, "processor panicked; tick shipped without its data");
                } else {
                    tracing::debug!(processor = p.name(), panic = %message, "processor panicked again");
                }
            }
        }
    }
}

/// [`AgentBuilder::hostname`](super::AgentBuilder::hostname): the name, and the last backend
/// `SystemInfo` with its patched copy. Backends hand out the same `Arc<SystemInfo>` every tick,
/// so the copy is made once, not per tick, and snapshots keep sharing one `SystemInfo`.
pub(crate) struct HostOverride {
    pub(crate) name: Arc<str>,
    pub(crate) last: Option<(Arc<SystemInfo>, Arc<SystemInfo>)>,
}

impl HostOverride {
    fn apply(&mut self, system: &mut Arc<SystemInfo>) {
        if system.hostname == *self.name {
            return;
        }
        match &self.last {
            Some((from, to)) if Arc::ptr_eq(from, system) => *system = to.clone(),
            _ => {
                let mut patched = SystemInfo::clone(system);
                patched.hostname = self.name.to_string();
                let patched = Arc::new(patched);
                self.last = Some((std::mem::replace(system, patched.clone()), patched));
            }
        }
    }
}

/// The runtime's side of the sampling thread: wakes the sink workers when a tick's snapshot is
/// in their queues, abandons a sample that overruns its timeout, and stands in for the schedule
/// while one is stuck.
pub(crate) struct Watchdog {
    pub(crate) shared: Arc<Shared>,
}

impl Watchdog {
    pub(crate) async fn run(self) {
        let shared = &self.shared;
        loop {
            let progressed = shared.progress.notified();
            let alarm = shared.alarm_fired.notified();
            let deadline = {
                let state = shared.lock();
                if state.stop {
                    return;
                }
                self.deadline(&state, shared.alarm.is_active())
            };
            let timer = async {
                match deadline {
                    Some(deadline) => shared.clock.sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = progressed => self.wake_sinks(),
                () = timer => self.check(),
                () = alarm => self.check(),
            }
        }
    }

    /// When to look next: while a sample is stuck, the next tick (to report it skipped); with
    /// the kernel alarm watching samples, nothing else (it goes off when one overruns);
    /// otherwise the timeout of the sample in flight, or of the next tick's sample, were it to
    /// start on time (a later start re-arms at the first look).
    fn deadline(&self, state: &State, alarm: bool) -> Option<Instant> {
        let timeout = self.shared.sample_timeout;
        match &state.in_flight {
            Some(f) if f.abandoned => state.next_tick,
            _ if alarm => None,
            Some(f) => Some(f.started + timeout),
            None => {
                let due = state.next_tick? + timeout;
                let now = self.shared.clock.now();
                // The thread is late to start the tick (a loaded machine): look again a timeout
                // from now rather than spin.
                Some(if due > now { due } else { now + timeout })
            }
        }
    }

    fn wake_sinks(&self) {
        for outlet in self.shared.outlets.iter() {
            outlet.queue.wake();
        }
    }

    fn check(&self) {
        let shared = &self.shared;
        let now = shared.clock.now();
        let timeout = shared.sample_timeout;
        let mut state = shared.lock();
        let state = &mut *state;
        let Some(in_flight) = &mut state.in_flight else { return };
        if !in_flight.abandoned {
            if now < in_flight.started + timeout {
                return;
            }
            in_flight.abandoned = true;
            let error = SampleError::Timeout(timeout);
            state.book.failed(&shared.telemetry, now - in_flight.started, &error);
            match in_flight.request.take() {
                Some(request) => {
                    let _ = request.into_reply().send(Err(error));
                }
                None => {
                    let marker = state.book.failure_snapshot(&error);
                    push_to_sinks(&shared.outlets, &marker, true);
                }
            }
            // Requests queued behind the stuck sample would wait for it: they are refused now.
            for request in state.requests.drain(..) {
                shared.telemetry.tick_skipped();
                let _ = request.into_reply().send(Err(SampleError::Busy));
            }
            return;
        }
        // Stuck: every tick that falls due while the call has not returned is skipped, and the
        // sinks hear of it.
        if let Some(due) = state.next_tick {
            if now >= due {
                shared.telemetry.tick_skipped();
                tracing::debug!("previous sample still running in the backend; tick skipped");
                let marker = state.book.failure_snapshot(&SampleError::Busy);
                push_to_sinks(&shared.outlets, &marker, true);
                state.next_tick = shared.tick_after(now);
            }
        }
    }
}

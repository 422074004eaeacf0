//! The agent: samples on a schedule and fans every snapshot out to its sinks.
//!
//! ```text
//!   thread "gpumon-sampler"  (sleeps on the Clock until each tick, interval grid, missed ticks skipped)
//!        sampler.sample ── one in flight at most; the watchdog (a runtime task, told by a kernel
//!        processors         timer) abandons it after sample_timeout and reports the ticks skipped
//!        inline sinks       behind it; sinks that only store (Sink::exports_inline) take the
//!               │           snapshot here, panics caught and counted
//!               │ Arc<Snapshot>
//!     ┌─────────┼──────────┬──────────────┐
//!  queue(cap) queue(cap) queue(cap)   subscribers
//!     │          │          │
//!  worker     worker     worker     ← one tokio task per sink: export under export_timeout,
//!  (sink A)   (sink B)   (sink C)     panics caught, losses counted
//! ```
//!
//! A healthy tick wakes one thread, the sampling thread, when every sink exports inline and no
//! inline sink has I/O due; the runtime is woken (once, however many sinks) only when a snapshot
//! lands in a queue or an inline sink asks for its `flush` (see `sampling.rs` and `alarm.rs`).
//!
//! The sampler never waits for a sink: each sink has its own bounded queue that drops its *oldest*
//! snapshot when full (for monitoring, the freshest data wins) and counts the loss. A sink that
//! hangs, fails or panics only ever affects itself.
//!
//! A tick whose sample fails (no driver, a timeout, a panic in the backend) still reaches every
//! sink, as a sampling-failed snapshot without devices ([`crate::SamplingState`]), so each sink
//! can say "up 0" for the host; subscribers get sampled data only.

mod alarm;
mod clock;
mod interval;
mod queue;
mod sampling;
mod worker;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::filter::DeviceFilter;
use crate::metric::MetricSet;
use crate::model::Snapshot;
use crate::sampler::{SampleError, SampleRequest, Sampler};
use crate::sink::{BuildError, Sink, SinkError};
use crate::stages::{Processor, ProcessorContext};
use crate::telemetry::{AgentStats, SinkState, SinkStatus, SinkStatusCell, Telemetry};

use alarm::Alarm;
use clock::Wakeup;
pub use clock::{Clock, ManualClock};
use queue::SinkQueue;
use sampling::{Book, HostOverride, InlineOutlet, Outlet, Request, SamplingThread, Shared, State, Taken, Watchdog};
use worker::{Calls, SharedSink, Worker, WorkerCommand};

pub use interval::{Interval, IntervalError, DEFAULT_INTERVAL, MAX_INTERVAL, MIN_INTERVAL};

/// How long past its deadline a handle waits for the agent's own answer (see
/// [`AgentHandle::shutdown`]).
const REPLY_GRACE: Duration = Duration::from_millis(100);

/// Most snapshots a sink's queue holds beyond its capacity during its start-up healthcheck (see
/// [`SinkOptions::capacity`]): a bound for a tiny interval with a long healthcheck timeout.
const MAX_STARTUP_ALLOWANCE: usize = 600;

/// Most snapshots one sink's queue may hold ([`SinkOptions::capacity`]): a sink that hangs holds
/// that many in memory.
pub const MAX_SINK_QUEUE: usize = 100_000;

/// The ticks one healthcheck may last: its timeout over the interval, rounded up.
fn startup_allowance(healthcheck_timeout: Duration, interval: Duration) -> usize {
    let ticks = healthcheck_timeout.as_nanos().div_ceil(interval.as_nanos().max(1));
    usize::try_from(ticks).unwrap_or(usize::MAX).min(MAX_STARTUP_ALLOWANCE)
}

/// Per-sink settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkOptions {
    /// Snapshots queued for the sink before the oldest is dropped: 1 to [`MAX_SINK_QUEUE`],
    /// default 16. Until the
    /// start-up healthcheck has ended, the queue holds as many more as ticks fit in
    /// [`healthcheck_timeout`](SinkOptions::healthcheck_timeout) (at most 600), so that a sink
    /// whose server hangs at start-up loses nothing.
    pub capacity: usize,
    /// Longest one `export`, `flush` or `shutdown` call may take. Default 10 s.
    pub export_timeout: Duration,
    /// Longest the start-up healthcheck may take. Default 5 s.
    pub healthcheck_timeout: Duration,
}

impl Default for SinkOptions {
    fn default() -> Self {
        Self { capacity: 16, export_timeout: Duration::from_secs(10), healthcheck_timeout: Duration::from_secs(5) }
    }
}

impl SinkOptions {
    /// Sets [`SinkOptions::capacity`].
    #[must_use]
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets [`SinkOptions::export_timeout`].
    #[must_use]
    pub fn export_timeout(mut self, timeout: Duration) -> Self {
        self.export_timeout = timeout;
        self
    }

    /// Sets [`SinkOptions::healthcheck_timeout`].
    #[must_use]
    pub fn healthcheck_timeout(mut self, timeout: Duration) -> Self {
        self.healthcheck_timeout = timeout;
        self
    }
}

/// Errors from [`AgentHandle`] operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The agent is no longer running.
    #[error("the agent has shut down")]
    ShutDown,
    /// Taking the sample failed.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// One or more sinks failed; the others completed.
    #[error("{} sink(s) failed: {}", .0.len(), describe(.0))]
    Sinks(Vec<SinkFailure>),
    /// The deadline passed before every sink finished.
    #[error("deadline of {after:?} passed; unfinished sinks: {}", .unfinished.join(", "))]
    Timeout {
        /// The deadline.
        after: Duration,
        /// Sinks that had not finished.
        unfinished: Vec<String>,
        /// Sinks that finished with an error.
        failed: Vec<SinkFailure>,
    },
}

/// One sink's failure within an [`AgentError`].
#[derive(Debug)]
#[non_exhaustive]
pub struct SinkFailure {
    /// The sink's name.
    pub sink: String,
    /// What went wrong.
    pub error: SinkError,
}

fn describe(failures: &[SinkFailure]) -> String {
    failures.iter().map(|f| format!("{}: {}", f.sink, f.error)).collect::<Vec<_>>().join("; ")
}

/// Builds an [`Agent`]. Start with [`Agent::builder`].
#[must_use]
pub struct AgentBuilder {
    sampler: Arc<dyn Sampler>,
    interval: Duration,
    sample_timeout: Option<Duration>,
    metrics: MetricSet,
    for_processors: MetricSet,
    devices: DeviceFilter,
    sinks: Vec<(Box<dyn Sink>, SinkOptions)>,
    processors: Vec<Box<dyn Processor>>,
    subscriber_capacity: usize,
    default_shutdown_deadline: Duration,
    scheduled: bool,
    hostname: Option<Arc<str>>,
    clock: Clock,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("sampler", &self.sampler.name())
            .field("interval", &self.interval)
            .field("sample_timeout", &self.sample_timeout)
            .field("metrics", &self.metrics)
            .field("for_processors", &self.for_processors)
            .field("devices", &self.devices)
            .field("sinks", &self.sinks.iter().map(|(s, _)| s.name().to_owned()).collect::<Vec<_>>())
            .field("processors", &self.processors.iter().map(|p| p.name().to_owned()).collect::<Vec<_>>())
            .finish()
    }
}

impl AgentBuilder {
    /// How often to sample. Default 1 s; at least [`MIN_INTERVAL`] (checked by `build`).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Longest one sample may take before the tick is abandoned. Default: the interval, capped
    /// at 5 s.
    pub fn sample_timeout(mut self, timeout: Duration) -> Self {
        self.sample_timeout = Some(timeout);
        self
    }

    /// Which metric families to sample and export. Default [`MetricSet::default`].
    pub fn metrics(mut self, metrics: MetricSet) -> Self {
        self.metrics = metrics;
        self
    }

    /// Families to sample for the processors only (default none): the backend reads them with
    /// [`metrics`](Self::metrics), the processors see them, and then they are cleared
    /// ([`Snapshot::retain_exported`]) before the snapshot reaches any sink, subscriber or
    /// caller — the web view and stdout included — so that their series cost no TSDB anything.
    /// Only a sink that records what was sampled ([`Sink::records_stage_inputs`], the trace)
    /// gets them. A family in both sets is exported. The assembly passes the opt-in families the
    /// built-in stages read ([`Family::READ_BY_STAGES`](crate::Family::READ_BY_STAGES)).
    pub fn sample_for_processors(mut self, families: MetricSet) -> Self {
        self.for_processors = families;
        self
    }

    /// Which devices are visible. Default: all.
    pub fn devices(mut self, devices: DeviceFilter) -> Self {
        self.devices = devices;
        self
    }

    /// Adds a sink with default [`SinkOptions`].
    pub fn sink(self, sink: impl Sink) -> Self {
        self.sink_with(sink, SinkOptions::default())
    }

    /// Adds a sink with explicit options.
    pub fn sink_with(mut self, sink: impl Sink, options: SinkOptions) -> Self {
        self.sinks.push((Box::new(sink), options));
        self
    }

    /// Adds an already boxed sink (for sinks chosen at run time).
    pub fn boxed_sink(mut self, sink: Box<dyn Sink>, options: SinkOptions) -> Self {
        self.sinks.push((sink, options));
        self
    }

    /// Adds a processing stage (e.g. [`crate::diagnose::Diagnoser`]). Processors run in the
    /// order they are added, after sampling and before the sinks; see [`Processor`].
    pub fn processor(mut self, processor: impl Processor) -> Self {
        self.processors.push(Box::new(processor));
        self
    }

    /// Adds an already boxed processor.
    pub fn boxed_processor(mut self, processor: Box<dyn Processor>) -> Self {
        self.processors.push(processor);
        self
    }

    /// Whether the agent samples on its own schedule (default `true`). When `false` it samples
    /// only when asked, through [`AgentHandle::flush`] or [`AgentHandle::snapshot_now`] — for
    /// one-shot runs (`--once`) and for embedders that drive sampling themselves.
    pub fn scheduled(mut self, scheduled: bool) -> Self {
        self.scheduled = scheduled;
        self
    }

    /// The host name every snapshot reports ([`SystemInfo::hostname`](crate::SystemInfo), the
    /// `host` label and tag of the sinks), instead of the one the backend read from the system.
    /// For a Kubernetes DaemonSet, where the system's host name is the pod's, pass the node's
    /// (the Downward API's `NODE_NAME`). An empty name is ignored.
    pub fn hostname(mut self, hostname: impl Into<String>) -> Self {
        let name: String = hostname.into();
        self.hostname = (!name.is_empty()).then(|| Arc::from(name));
        self
    }

    /// The clock the schedule and the sample timeout run on. Default [`Clock::System`]; tests
    /// pass a [`ManualClock`] to tick the agent by hand.
    ///
    /// The agent samples on a thread of its own, so tokio's paused test time does not drive
    /// it: under `#[tokio::test(start_paused = true)]` use a [`ManualClock`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use gpumon_core::{Agent, ManualClock, UnavailableSampler};
    ///
    /// let clock = ManualClock::new();
    /// let handle = Agent::builder(UnavailableSampler::new("no GPU in this test"))
    ///     .interval(Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .spawn()?;
    /// // What a tick does happens on the agent's thread, in real time: wait for its outcome.
    /// async fn ticks_seen(handle: &gpumon_core::AgentHandle, n: u64) {
    ///     while handle.stats().sample_failures < n {
    ///         tokio::time::sleep(Duration::from_millis(1)).await;
    ///     }
    /// }
    /// ticks_seen(&handle, 1).await; // the first tick: as soon as the agent runs
    /// clock.advance(Duration::from_secs(10)); // the second: now, not in 10 s
    /// ticks_seen(&handle, 2).await;
    /// handle.shutdown(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub fn clock(mut self, clock: impl Into<Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// Capacity of the [`AgentHandle::subscribe`] channel. Default 16.
    pub fn subscriber_capacity(mut self, capacity: usize) -> Self {
        self.subscriber_capacity = capacity;
        self
    }

    /// Validates the settings and returns the agent (a future to run) and its handle.
    ///
    /// Call [`Agent::run`] on a tokio runtime (or use [`AgentBuilder::spawn`]).
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] for an interval outside [`MIN_INTERVAL`]..=[`MAX_INTERVAL`], a zero timeout or
    /// queue capacity, or two sinks with the same name.
    pub fn build(self) -> Result<(Agent, AgentHandle), BuildError> {
        if let Err(e) = Interval::new(self.interval) {
            return Err(BuildError::invalid("interval", e.to_string()));
        }
        let sample_timeout = self.sample_timeout.unwrap_or_else(|| self.interval.min(Duration::from_secs(5)));
        if sample_timeout.is_zero() {
            return Err(BuildError::invalid("sample_timeout", "must be greater than zero"));
        }
        if self.subscriber_capacity == 0 {
            return Err(BuildError::invalid("subscriber_capacity", "must be at least 1"));
        }
        let mut names = std::collections::HashSet::new();
        for (sink, options) in &self.sinks {
            if !names.insert(sink.name().to_owned()) {
                return Err(BuildError::invalid("sinks", format!("two sinks are named `{}`", sink.name())));
            }
            if !(1..=MAX_SINK_QUEUE).contains(&options.capacity) {
                return Err(BuildError::invalid(
                    format!("{}.capacity", sink.name()),
                    format!("must be 1 to {MAX_SINK_QUEUE}"),
                ));
            }
            if options.export_timeout.is_zero() {
                return Err(BuildError::invalid(
                    format!("{}.export_timeout", sink.name()),
                    "must be greater than zero",
                ));
            }
        }

        let mut processor_names = std::collections::HashSet::new();
        for p in &self.processors {
            if !processor_names.insert(p.name().to_owned()) {
                return Err(BuildError::invalid("processors", format!("two processors are named `{}`", p.name())));
            }
        }
        let mut processors = self.processors;
        let context = ProcessorContext::new(self.interval);
        for p in &mut processors {
            p.attach(&context);
        }

        let telemetry = Telemetry::default();
        telemetry.set_interval(self.interval);
        let mut sinks = Vec::with_capacity(self.sinks.len());
        let mut outlets = Vec::with_capacity(self.sinks.len());
        for (mut sink, options) in self.sinks {
            let name = sink.name().to_owned();
            // Registered before the sink sees the telemetry, so it can report drops at once.
            let status = telemetry.register_sink(name.clone());
            sink.attach_telemetry(telemetry.clone());
            let queue = Arc::new(SinkQueue::with_startup_allowance(
                options.capacity,
                startup_allowance(options.healthcheck_timeout, self.interval),
            ));
            let (cmd_tx, cmd_rx) = mpsc::channel(4);
            let exports_inline = sink.exports_inline();
            let records_stage_inputs = sink.records_stage_inputs();
            let sink: SharedSink = Arc::new(tokio::sync::Mutex::new(sink));
            let inline = exports_inline.then(|| InlineOutlet { sink: sink.clone(), name: Arc::from(name.as_str()) });
            let calls = Calls { name: name.clone(), queue: queue.clone(), status: status.clone(), options };
            let worker = Worker { sink, calls, commands: cmd_rx, records_stage_inputs };
            outlets.push(Outlet { queue, status: status.clone(), inline, records_stage_inputs });
            sinks.push(SinkSlot {
                name,
                commands: cmd_tx,
                status,
                worker: std::sync::Mutex::new(Some(worker)),
                task: None,
            });
        }

        let state = State {
            stop: false,
            requests: VecDeque::new(),
            in_flight: None,
            next_tick: None,
            book: Book::new(self.hostname.clone(), self.sampler.name().to_owned()),
        };
        let shared = Arc::new(Shared {
            wakeup: Arc::new(Wakeup::new(state)),
            progress: tokio::sync::Notify::new(),
            outlets: outlets.into(),
            telemetry: telemetry.clone(),
            alarm: Alarm::new(matches!(self.clock, Clock::System)),
            clock: self.clock,
            sample_timeout,
            interval: self.scheduled.then_some(self.interval),
            origin: std::sync::OnceLock::new(),
            alarm_fired: tokio::sync::Notify::new(),
        });
        shared.clock.register(&shared.wakeup);

        let (control_tx, control_rx) = mpsc::channel(16);
        let (subscribers, _) = broadcast::channel(self.subscriber_capacity);
        let thread = SamplingThread {
            shared: shared.clone(),
            sampler: self.sampler.clone(),
            request: SampleRequest::new(self.metrics.union(self.for_processors), self.devices),
            exported: self.metrics,
            processors,
            subscribers: subscribers.clone(),
            hostname: self.hostname.map(|name| HostOverride { name, last: None }),
            warned_ambiguous: false,
            checked_unmatched: false,
        };
        let agent = Agent {
            sampler_name: self.sampler.name().to_owned(),
            interval: self.interval,
            shared,
            // In a `Mutex` only so that `Agent` is `Sync` (see `SinkSlot::worker`).
            thread: std::sync::Mutex::new(Some(thread)),
            sinks,
            control: control_rx,
            default_shutdown_deadline: self.default_shutdown_deadline,
        };
        let handle = AgentHandle { control: control_tx, subscribers, telemetry };
        Ok((agent, handle))
    }

    /// Builds the agent and spawns it on the current tokio runtime.
    ///
    /// # Errors
    /// As [`AgentBuilder::build`], plus [`BuildError::InvalidConfig`] when called outside a
    /// tokio runtime.
    pub fn spawn(self) -> Result<AgentHandle, BuildError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| BuildError::invalid("runtime", "AgentBuilder::spawn must be called inside a tokio runtime"))?;
        let (agent, handle) = self.build()?;
        runtime.spawn(agent.run());
        Ok(handle)
    }
}

struct SinkSlot {
    name: String,
    commands: mpsc::Sender<WorkerCommand>,
    status: SinkStatusCell,
    /// Taken when the agent starts. In a `Mutex` only so that `SinkSlot` is `Sync` (a
    /// `Box<dyn Sink>` is `Send` but not `Sync`) and the agent's future stays `Send`.
    worker: std::sync::Mutex<Option<Worker>>,
    task: Option<JoinHandle<()>>,
}

/// Requests from handles. Deadlines travel as instants, so time spent waiting for the agent
/// (behind a sample in progress, say) counts against them: a deadline is end to end.
enum Control {
    SnapshotNow(oneshot::Sender<Result<Arc<Snapshot>, SampleError>>),
    Flush(Deadline, oneshot::Sender<Result<(), AgentError>>),
    Shutdown(Deadline, oneshot::Sender<Result<(), AgentError>>),
}

/// A caller's deadline: when it ends, and how long it was (for error messages).
#[derive(Clone, Copy, Debug)]
struct Deadline {
    until: tokio::time::Instant,
    after: Duration,
}

impl Deadline {
    fn from_now(after: Duration) -> Self {
        Self { until: tokio::time::Instant::now() + after, after }
    }
}

/// The sampling loop. Build one with [`Agent::builder`], then `tokio::spawn(agent.run())`.
#[must_use = "an agent does nothing until `run` is awaited or spawned"]
pub struct Agent {
    sampler_name: String,
    interval: Duration,
    shared: Arc<Shared>,
    /// Taken when the agent starts (see `SinkSlot::worker` for the `Mutex`).
    thread: std::sync::Mutex<Option<SamplingThread>>,
    sinks: Vec<SinkSlot>,
    control: mpsc::Receiver<Control>,
    default_shutdown_deadline: Duration,
}

/// Ends the sampling thread when the agent's future ends, however it ends (a runtime dropped
/// with the agent still spawned included).
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("sampler", &self.sampler_name)
            .field("interval", &self.interval)
            .field("sinks", &self.sinks.iter().map(|s| s.name.as_str()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts building an agent around `sampler`.
    ///
    /// ```no_run
    /// # async fn demo(sampler: impl gpumon_core::Sampler, sink: impl gpumon_core::Sink) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use gpumon_core::Agent;
    ///
    /// let handle = Agent::builder(sampler)
    ///     .interval(Duration::from_secs(5))
    ///     .sink(sink)
    ///     .spawn()?;
    /// // ... later
    /// handle.shutdown(Duration::from_secs(3)).await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(sampler: impl Sampler) -> AgentBuilder {
        Self::builder_arc(Arc::new(sampler))
    }

    /// [`Agent::builder`] for a sampler that is already shared.
    pub fn builder_arc(sampler: Arc<dyn Sampler>) -> AgentBuilder {
        AgentBuilder {
            sampler,
            interval: DEFAULT_INTERVAL,
            sample_timeout: None,
            metrics: MetricSet::default(),
            for_processors: MetricSet::nothing(),
            devices: DeviceFilter::all(),
            sinks: Vec::new(),
            processors: Vec::new(),
            subscriber_capacity: 16,
            default_shutdown_deadline: Duration::from_secs(5),
            scheduled: true,
            hostname: None,
            clock: Clock::System,
        }
    }

    /// Runs until [`AgentHandle::shutdown`] is called or every handle is dropped.
    pub async fn run(mut self) {
        for slot in &mut self.sinks {
            let worker = slot.worker.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            if let Some(worker) = worker {
                slot.task = Some(tokio::spawn(worker.run()));
            }
        }
        let _stop = StopOnDrop(self.shared.clone());
        // Before the first sample: samples arm the alarm only once it is watched.
        self.shared.watch_alarm();
        let thread = self.thread.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let mut exited = match thread.map(SamplingThread::spawn) {
            Some(Ok(exited)) => Some(exited),
            Some(Err(e)) => {
                // Nothing can be sampled: the error is logged here, and every request is refused
                // (`SampleError::ShutDown`).
                tracing::error!(error = %e, "cannot start the sampling thread");
                self.shared.lock().stop = true;
                None
            }
            None => None,
        };
        let watchdog = AbortOnDrop(tokio::spawn(Watchdog { shared: self.shared.clone() }.run()));
        loop {
            match self.control.recv().await {
                Some(Control::SnapshotNow(reply)) => {
                    let result = self.request(Request::SnapshotNow).await;
                    let _ = reply.send(result.map(|taken| taken.exported));
                }
                Some(Control::Flush(deadline, reply)) => {
                    let result = self.flush(deadline).await;
                    let _ = reply.send(result);
                }
                Some(Control::Shutdown(deadline, reply)) => {
                    let result = self.shutdown(deadline, &mut exited, watchdog).await;
                    let _ = reply.send(result);
                    return;
                }
                None => {
                    let deadline = Deadline::from_now(self.default_shutdown_deadline);
                    if let Err(e) = self.shutdown(deadline, &mut exited, watchdog).await {
                        tracing::warn!(error = %e, "agent dropped; shutdown incomplete");
                    }
                    return;
                }
            }
        }
    }

    /// Has the sampling thread take a sample now (after the one in flight, if any), under the
    /// sample timeout; refused at once while a sample is stuck in the backend.
    async fn request(&self, make: impl FnOnce(sampling::Reply) -> Request) -> Result<Taken, SampleError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            if state.stop {
                return Err(SampleError::ShutDown);
            }
            if state.stuck() {
                self.shared.telemetry.tick_skipped();
                tracing::debug!("previous sample still running in the backend; request refused");
                return Err(SampleError::Busy);
            }
            state.requests.push_back(make(tx));
        }
        self.shared.wakeup.condvar.notify_all();
        // The thread answers, or the watchdog (timeout), or the thread exits and drops the reply.
        rx.await.unwrap_or(Err(SampleError::ShutDown))
    }

    async fn flush(&mut self, deadline: Deadline) -> Result<(), AgentError> {
        let sampled = self.request(Request::Flush).await;
        let snapshot = match &sampled {
            Ok(taken) => taken.clone(),
            Err(e) => Taken::same(self.shared.lock().book.failure_snapshot(e)),
        };
        let outcome = self.ask_all(deadline, |reply| WorkerCommand::Flush { snapshot: snapshot.clone(), reply }).await;
        match (sampled, outcome) {
            (_, Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(AgentError::Sample(e)),
            (Ok(_), Ok(())) => Ok(()),
        }
    }

    async fn shutdown(
        &mut self,
        deadline: Deadline,
        exited: &mut Option<oneshot::Receiver<()>>,
        watchdog: AbortOnDrop,
    ) -> Result<(), AgentError> {
        let until = deadline.until;
        // No tick after this. A sample being taken normally ends within a millisecond or two and
        // reaches the sinks before they are drained; one that takes longer (a slow or hung
        // driver call) is not waited for past a short grace, so it cannot eat the sinks' time,
        // and is counted as dropped if it arrives after they closed. A stuck one is left to its
        // thread.
        let stuck = self.shared.lock().stuck();
        self.shared.stop();
        drop(watchdog);
        if let Some(exited) = exited.take().filter(|_| !stuck) {
            let grace = (tokio::time::Instant::now() + REPLY_GRACE).min(until);
            let _ = tokio::time::timeout_at(grace, exited).await;
        }
        let result = self.ask_all(deadline, |reply| WorkerCommand::Shutdown { reply }).await;
        // A worker exits right after replying; whatever is still running at the deadline is
        // abandoned, not waited for.
        for slot in &mut self.sinks {
            if let Some(mut task) = slot.task.take() {
                if tokio::time::timeout_at(until, &mut task).await.is_err() {
                    task.abort();
                    slot.status.update(|s| s.state = SinkState::Aborted);
                }
            }
        }
        result
    }

    /// Sends one command to every worker and collects the replies under one deadline.
    async fn ask_all(
        &mut self,
        deadline: Deadline,
        make: impl Fn(oneshot::Sender<Result<(), SinkError>>) -> WorkerCommand,
    ) -> Result<(), AgentError> {
        let mut pending = Vec::with_capacity(self.sinks.len());
        let mut failed = Vec::new();
        let until = deadline.until;
        for slot in &self.sinks {
            let (tx, rx) = oneshot::channel();
            // A worker stuck in a long call may have a full command queue; waiting for room
            // counts against the same deadline.
            match tokio::time::timeout_at(until, slot.commands.send(make(tx))).await {
                Ok(Ok(())) => pending.push((slot.name.clone(), rx)),
                Ok(Err(_)) => failed.push(SinkFailure { sink: slot.name.clone(), error: SinkError::AlreadyShutdown }),
                Err(_) => pending.push((slot.name.clone(), rx)),
            }
        }
        let mut unfinished = Vec::new();
        for (name, rx) in pending {
            match tokio::time::timeout_at(until, rx).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => failed.push(SinkFailure { sink: name, error }),
                Ok(Err(_)) => failed.push(SinkFailure { sink: name, error: SinkError::AlreadyShutdown }),
                Err(_) => unfinished.push(name),
            }
        }
        if !unfinished.is_empty() {
            return Err(AgentError::Timeout { after: deadline.after, unfinished, failed });
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(AgentError::Sinks(failed))
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Families that could not be read, one per device and family (as sinks export them: see
/// [`MetricId::MetricFailure`](crate::MetricId::MetricFailure)).
fn metric_failures(snapshot: &Snapshot) -> u64 {
    snapshot.devices.iter().filter(|d| d.is_up()).map(|d| d.failed_families().count() as u64).sum()
}

/// The text of a panic payload (`&str` or `String`; for any other payload, says so).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Controls a running [`Agent`]. Cheap to clone; when the last clone is dropped the agent shuts
/// down with a 5 s deadline — call [`AgentHandle::shutdown`] explicitly to choose the deadline and
/// see the outcome.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    control: mpsc::Sender<Control>,
    subscribers: broadcast::Sender<Arc<Snapshot>>,
    telemetry: Telemetry,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::SnapshotNow(_) => "SnapshotNow",
            Control::Flush(..) => "Flush",
            Control::Shutdown(..) => "Shutdown",
        })
    }
}

impl AgentHandle {
    /// Takes a sample now and returns it, without sending it to the sinks.
    ///
    /// # Errors
    /// [`AgentError::Sample`] if sampling failed (or a sample is stuck in the backend);
    /// [`AgentError::ShutDown`] if the agent is gone.
    pub async fn snapshot_now(&self) -> Result<Arc<Snapshot>, AgentError> {
        let (tx, rx) = oneshot::channel();
        self.control.send(Control::SnapshotNow(tx)).await.map_err(|_| AgentError::ShutDown)?;
        Ok(rx.await.map_err(|_| AgentError::ShutDown)??)
    }

    /// A stream of every snapshot the agent takes. A slow receiver sees `Lagged` and skips ahead.
    ///
    /// Only sampled data: a tick whose sample fails sends nothing here (the sinks get a
    /// sampling-failed snapshot, see [`SamplingState`](crate::SamplingState); [`Self::stats`]
    /// says why sampling fails).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Snapshot>> {
        self.subscribers.subscribe()
    }

    /// Every sink's status.
    pub fn sink_status(&self) -> Vec<SinkStatus> {
        self.telemetry.stats().sinks
    }

    /// The agent's own counters, with every sink's status.
    pub fn stats(&self) -> AgentStats {
        self.telemetry.stats()
    }

    /// The shared telemetry view (what sinks receive through `attach_telemetry`).
    pub fn telemetry(&self) -> Telemetry {
        self.telemetry.clone()
    }

    /// Takes a sample now, sends it to every sink, and waits — up to `deadline` — for each sink
    /// to export everything queued and flush. Sinks that finish are not held up by the rest.
    ///
    /// # Errors
    /// [`AgentError::Sample`] if the sample failed (sinks still get the sampling-failed
    /// snapshot, see [`SamplingState`](crate::SamplingState), and are flushed);
    /// [`AgentError::Sinks`] listing sinks that failed; [`AgentError::Timeout`] listing sinks
    /// that did not finish in time (they are abandoned); [`AgentError::ShutDown`].
    pub async fn flush(&self, deadline: Duration) -> Result<(), AgentError> {
        let deadline = Deadline::from_now(deadline);
        self.request(deadline, |reply| Control::Flush(deadline, reply)).await
    }

    /// Stops sampling, lets every sink export what is queued, flush and shut down, all within
    /// one `deadline`, counted from this call (time the agent needs to finish a sample in
    /// progress counts too). Sinks still busy at the deadline are abandoned and named in the
    /// error. Returns at the deadline, or at most 100 ms after it when the agent itself is stuck.
    ///
    /// # Errors
    /// [`AgentError::Timeout`], [`AgentError::Sinks`], or [`AgentError::ShutDown`] when the agent
    /// was already shut down.
    pub async fn shutdown(&self, deadline: Duration) -> Result<(), AgentError> {
        let deadline = Deadline::from_now(deadline);
        self.request(deadline, |reply| Control::Shutdown(deadline, reply)).await
    }

    /// Sends a request and waits for its reply, both within `deadline`.
    async fn request(
        &self,
        deadline: Deadline,
        make: impl FnOnce(oneshot::Sender<Result<(), AgentError>>) -> Control,
    ) -> Result<(), AgentError> {
        let (tx, rx) = oneshot::channel();
        let timed_out = || AgentError::Timeout {
            after: deadline.after,
            unfinished: self
                .telemetry
                .stats()
                .sinks
                .into_iter()
                .filter(|s| s.state == SinkState::Running)
                .map(|s| s.name)
                .collect(),
            failed: Vec::new(),
        };
        match tokio::time::timeout_at(deadline.until, self.control.send(make(tx))).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(_)) => return Err(AgentError::ShutDown),
            Ok(Ok(())) => {}
        }
        // The agent enforces the same deadline itself and answers the moment it passes, with
        // the authoritative outcome (which sinks were abandoned). Allow it a short grace to do
        // so; only an agent stuck elsewhere (in a sample, say) is given up on here.
        match tokio::time::timeout_at(deadline.until + REPLY_GRACE, rx).await {
            Err(_) => Err(timed_out()),
            Ok(Err(_)) => Err(AgentError::ShutDown),
            Ok(Ok(result)) => result,
        }
    }

    /// Whether the agent is still running.
    pub fn is_running(&self) -> bool {
        !self.control.is_closed()
    }
}

//! Playing traces back: [`ReplaySampler`], [`ReplayProgress`], [`ReplaySpeed`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{TraceError, TraceHeader, TraceReader};
use crate::model::{Snapshot, SystemInfo, REPLAY_BACKEND};
use crate::sampler::{SampleError, SampleRequest, Sampler};

/// A [`Sampler`] that plays a trace back: each call hands out the next recorded snapshot, with
/// its recorded `seq`, `taken_at`, `duration`, devices, processes, steps and attribution,
/// and [`SystemInfo::backend`] `"replay"` (every sink marks such data `backend=replay`, as it
/// marks the mock's). The runtime keeps the recorded times ([`Sampler::keeps_taken_at`]), so the
/// stages after it — diagnosis, the run report — see what the live run's stages saw and reach
/// the same findings, at any speed.
///
/// A recorded sampling failure is replayed as a failed sample (the sinks get a
/// sampling-failed snapshot, as they did live). Once the trace is played, every call fails with
/// "the trace has ended", and [`ReplayProgress::is_finished`] says so as soon as the last
/// snapshot is handed out (the sampler reads one line ahead). A bad line ends the replay there:
/// [`ReplayProgress::error`] names it.
///
/// Replay what the trace holds: the metric families of the request are not consulted (a
/// family that was not recorded cannot be replayed); the agent's device filter still applies.
/// Drive it with [`ReplayProgress::play`] (feature `runtime`) for a lossless replay at any
/// [`ReplaySpeed`].
///
/// ```
/// use gpumon_core::trace::ReplaySampler;
///
/// let err = ReplaySampler::open("/nonexistent/trace.gz").unwrap_err();
/// assert!(err.to_string().contains("/nonexistent/trace.gz"));
/// ```
#[derive(Debug)]
pub struct ReplaySampler {
    header: TraceHeader,
    state: Mutex<State>,
    progress: ReplayProgress,
}

#[derive(Debug)]
struct State {
    reader: TraceReader,
    /// The line read ahead: the next snapshot, the error that ends the trace, or `None` at the end.
    next: Option<Result<Snapshot, Arc<TraceError>>>,
    /// The last recorded `SystemInfo` and its marked copy (snapshots share one `Arc`).
    marked: Option<(Arc<SystemInfo>, Arc<SystemInfo>)>,
}

/// A recorded sampling failure, replayed.
#[derive(Debug, thiserror::Error)]
#[error("recorded sampling failure: {0}")]
struct RecordedFailure(String);

impl ReplaySampler {
    /// Opens the trace at `path` and reads its header and first snapshot.
    ///
    /// # Errors
    /// As [`TraceReader::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        Ok(Self::from_reader(TraceReader::open(path)?))
    }

    /// Plays back what `reader` has not read yet.
    pub fn from_reader(mut reader: TraceReader) -> Self {
        let header = reader.header().clone();
        let progress = ReplayProgress::new(header.interval);
        let next = reader.next().map(|r| r.map_err(Arc::new));
        progress.looked_ahead(next.as_ref());
        Self { header, state: Mutex::new(State { reader, next, marked: None }), progress }
    }

    /// The trace's header: the recording's interval, backend and fleet identity.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// A handle on how far the replay has got (shared; clone it before the sampler moves into
    /// an agent).
    pub fn progress(&self) -> ReplayProgress {
        self.progress.clone()
    }
}

impl State {
    /// `system` marked as replayed data, shared between snapshots as the recorded one was.
    fn mark(&mut self, system: &Arc<SystemInfo>) -> Arc<SystemInfo> {
        if let Some((from, to)) = &self.marked {
            if Arc::ptr_eq(from, system) {
                return to.clone();
            }
        }
        let mut marked = SystemInfo::clone(system);
        // What recorded it stays said (a replay of the mock is still simulated); a trace of a
        // replay keeps the first recording's backend.
        if !marked.is_replay() {
            marked.recorded_backend = Some(marked.backend.clone());
        }
        marked.backend = REPLAY_BACKEND.to_owned();
        let marked = Arc::new(marked);
        self.marked = Some((system.clone(), marked.clone()));
        marked
    }
}

impl Sampler for ReplaySampler {
    fn name(&self) -> &str {
        REPLAY_BACKEND
    }

    fn keeps_taken_at(&self) -> bool {
        true
    }

    fn sample(&self, _request: &SampleRequest) -> Result<Snapshot, SampleError> {
        let mut state = crate::lock(&self.state);
        let mut snapshot = match state.next.take() {
            None => return Err(SampleError::unavailable("the trace has ended")),
            Some(Err(e)) => {
                // Kept, so that every later call says the same.
                state.next = Some(Err(e.clone()));
                return Err(SampleError::Backend(Box::new(e)));
            }
            Some(Ok(snapshot)) => snapshot,
        };
        let next = state.reader.next().map(|r| r.map_err(Arc::new));
        state.next = next;
        self.progress.0.played.fetch_add(1, Ordering::SeqCst);
        self.progress.looked_ahead(state.next.as_ref());
        snapshot.system = state.mark(&snapshot.system);
        match snapshot.sampling_failure() {
            Some(reason) => Err(SampleError::Backend(Box::new(RecordedFailure(reason.to_owned())))),
            None => Ok(snapshot),
        }
    }
}

/// How fast a trace is played back.
///
/// Parsed from `max` (or `0`): as fast as the stages and sinks take it; or a positive factor of
/// real time, `1` (the recorded pace), `2` or `2x` (twice as fast), `0.5` (half).
///
/// ```
/// use gpumon_core::trace::ReplaySpeed;
/// use std::time::Duration;
///
/// assert_eq!("max".parse::<ReplaySpeed>(), Ok(ReplaySpeed::Max));
/// assert_eq!("0".parse::<ReplaySpeed>(), Ok(ReplaySpeed::Max));
/// let double: ReplaySpeed = "2x".parse().unwrap();
/// assert_eq!(double.pace(Duration::from_secs(1)), Some(Duration::from_millis(500)));
/// assert!("-1".parse::<ReplaySpeed>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReplaySpeed {
    /// As fast as possible: each snapshot as soon as every sink has taken the previous one.
    Max,
    /// This many times real time, from [`ReplaySpeed::SLOWEST`] to [`ReplaySpeed::FASTEST`];
    /// `1.0` is the recorded pace.
    Factor(f64),
}

impl Default for ReplaySpeed {
    /// Real time.
    fn default() -> Self {
        Self::Factor(1.0)
    }
}

impl ReplaySpeed {
    /// The slowest factor parsed: a thousand times slower than recorded (slower, a replay of
    /// one 1 s interval would wait for hours; a factor such as 1e-300 would not even fit a
    /// `Duration`).
    pub const SLOWEST: f64 = 1e-3;
    /// The fastest factor parsed (faster, use `max`).
    pub const FASTEST: f64 = 1e6;

    /// The wall time between two snapshots recorded `interval` apart; `None` for
    /// [`ReplaySpeed::Max`]. Saturates at [`Duration::MAX`] for a factor built by hand outside
    /// the parsed range.
    pub fn pace(self, interval: Duration) -> Option<Duration> {
        match self {
            Self::Max => None,
            Self::Factor(f) => Some(Duration::try_from_secs_f64(interval.as_secs_f64() / f).unwrap_or(Duration::MAX)),
        }
    }
}

impl std::str::FromStr for ReplaySpeed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        if text.eq_ignore_ascii_case("max") {
            return Ok(Self::Max);
        }
        let number = text.strip_suffix(['x', 'X']).unwrap_or(text);
        match number.parse::<f64>() {
            Ok(0.0) => Ok(Self::Max),
            Ok(f) if (Self::SLOWEST..=Self::FASTEST).contains(&f) => Ok(Self::Factor(f)),
            Ok(f) if f.is_finite() && f > 0.0 => Err(format!(
                "`{s}` is out of range: a factor of real time from {} to {} (or `max`)",
                Self::SLOWEST,
                Self::FASTEST
            )),
            _ => Err(format!(
                "`{s}` is not a replay speed: `max` (or 0) for as fast as possible, or a factor of real time such as 1, 2x or 0.5"
            )),
        }
    }
}

impl std::fmt::Display for ReplaySpeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Max => f.write_str("max"),
            Self::Factor(x) => write!(f, "{x}x"),
        }
    }
}

/// How far a [`ReplaySampler`] has got; cheap to clone, shared with the sampler.
#[derive(Clone, Debug)]
pub struct ReplayProgress(Arc<ProgressInner>);

#[derive(Debug)]
struct ProgressInner {
    /// The recording's interval: the pace of `play` (feature `runtime`).
    #[cfg_attr(not(feature = "runtime"), allow(dead_code))]
    interval: Option<Duration>,
    played: AtomicU64,
    finished: AtomicBool,
    error: Mutex<Option<Arc<TraceError>>>,
}

impl ReplayProgress {
    fn new(interval: Option<Duration>) -> Self {
        Self(Arc::new(ProgressInner {
            interval,
            played: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            error: Mutex::new(None),
        }))
    }

    /// Notes what the sampler read ahead: the end, or an error that ends the trace.
    fn looked_ahead(&self, next: Option<&Result<Snapshot, Arc<TraceError>>>) {
        match next {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                *crate::lock(&self.0.error) = Some(e.clone());
                self.0.finished.store(true, Ordering::SeqCst);
            }
            None => self.0.finished.store(true, Ordering::SeqCst),
        }
    }

    /// Snapshots handed out so far (recorded sampling failures included).
    pub fn played(&self) -> u64 {
        self.0.played.load(Ordering::SeqCst)
    }

    /// Whether every snapshot the trace holds has been handed out (or a bad line ended it).
    pub fn is_finished(&self) -> bool {
        self.0.finished.load(Ordering::SeqCst)
    }

    /// The error that ended the trace early, naming the line; `None` when it is (so far) whole.
    pub fn error(&self) -> Option<Arc<TraceError>> {
        crate::lock(&self.0.error).clone()
    }
}

#[cfg(feature = "runtime")]
impl ReplayProgress {
    /// Plays the rest of the trace through the agent behind `handle` — an agent built around
    /// this progress's [`ReplaySampler`] with [`scheduled(false)`](crate::AgentBuilder::scheduled)
    /// and the recording's interval ([`TraceHeader::interval`]) — and returns how many
    /// snapshots were played.
    ///
    /// Every snapshot goes through [`AgentHandle::flush`](crate::AgentHandle::flush): sampled
    /// (replayed), processed, and exported by every sink before the next, so no sink's queue
    /// drops one and the outcome never depends on how fast this machine is. At
    /// [`ReplaySpeed::Max`] the next follows at once; at a factor, the `k`-th is due
    /// `k × interval / factor` after the start (a sink slower than that slows the replay down
    /// rather than lose snapshots). `flush_deadline` bounds each snapshot's export; a sink that
    /// fails or overruns it is logged and the replay goes on, as a live agent would.
    ///
    /// Returns early, with what was played, when the agent shuts down.
    ///
    /// # Errors
    /// The [`TraceError`] that ended the trace early (every snapshot before it was played).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
    /// use gpumon_core::trace::{ReplaySampler, ReplaySpeed};
    /// use gpumon_core::Agent;
    ///
    /// let sampler = ReplaySampler::open("run.gpumon-trace.gz")?;
    /// let interval = sampler.header().interval.unwrap_or(Duration::from_secs(1));
    /// let progress = sampler.progress();
    /// let handle = Agent::builder(sampler)
    ///     .interval(interval)
    ///     .scheduled(false)
    ///     .processor(Diagnoser::new(DiagnoseConfig::default())?)
    ///     .spawn()?;
    /// let played = progress.play(&handle, ReplaySpeed::Max, Duration::from_secs(10)).await?;
    /// handle.shutdown(Duration::from_secs(5)).await?;
    /// println!("{played} snapshots replayed");
    /// # Ok(()) }
    /// ```
    pub async fn play(
        &self,
        handle: &crate::AgentHandle,
        speed: ReplaySpeed,
        flush_deadline: Duration,
    ) -> Result<u64, Arc<TraceError>> {
        let pace = speed.pace(self.0.interval.unwrap_or(crate::DEFAULT_INTERVAL));
        let start = tokio::time::Instant::now();
        let first = self.played();
        let mut k: u32 = 0;
        while !self.is_finished() {
            if let Some(pace) = pace {
                tokio::time::sleep_until(start + pace.saturating_mul(k)).await;
            }
            k = k.saturating_add(1);
            match handle.flush(flush_deadline).await {
                Ok(()) | Err(crate::AgentError::Sample(_)) => {}
                Err(crate::AgentError::ShutDown) => break,
                Err(e) => tracing::warn!(error = %e, "replay: a sink did not take a snapshot"),
            }
        }
        let played = self.played() - first;
        match self.error() {
            Some(e) => Err(e),
            None => Ok(played),
        }
    }
}

//! What the agent knows about its own health: sampling counters and per-sink status.
//!
//! Shared (cheaply cloned) between the agent, its `AgentHandle` and any sink
//! that asked for it through [`Sink::attach_telemetry`](crate::Sink::attach_telemetry), so a Prometheus endpoint can
//! export the agent's self-metrics at scrape time.
// Without the `runtime` feature nothing records into the telemetry (the agent is what does), but
// sinks still compile against it.
#![cfg_attr(not(feature = "runtime"), allow(dead_code))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Lifecycle of one sink inside the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkState {
    /// Taking snapshots.
    Running,
    /// Shut down cleanly.
    ShutDown,
    /// Abandoned: it did not finish within the shutdown deadline.
    Aborted,
}

/// A point-in-time copy of one sink's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkStatus {
    /// The sink's name.
    pub name: String,
    /// Lifecycle state.
    pub state: SinkState,
    /// Snapshots exported successfully.
    pub exported: u64,
    /// Snapshots lost because the sink's queue was full (the oldest are dropped), plus data the
    /// sink itself reported dropping (see [`Telemetry::record_dropped`]).
    pub dropped: u64,
    /// Calls (export, flush, shutdown) that failed, timed out or panicked.
    pub failures: u64,
    /// Failures since the last success.
    pub consecutive_failures: u64,
    /// Panics caught.
    pub panics: u64,
    /// The last error, as text.
    pub last_error: Option<String>,
    /// When the last export succeeded.
    pub last_success: Option<SystemTime>,
    /// Outcome of the start-up healthcheck (`None` until it finished).
    pub healthy: Option<bool>,
}

impl SinkStatus {
    pub(crate) fn new(name: String) -> Self {
        Self {
            name,
            state: SinkState::Running,
            exported: 0,
            dropped: 0,
            failures: 0,
            consecutive_failures: 0,
            panics: 0,
            last_error: None,
            last_success: None,
            healthy: None,
        }
    }
}

/// A point-in-time copy of the agent's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentStats {
    /// Samples that produced a snapshot.
    pub samples_taken: u64,
    /// Samples that failed (backend error, timeout, panic).
    pub sample_failures: u64,
    /// Ticks skipped because the previous sample was still stuck in the backend.
    pub skipped_ticks: u64,
    /// Whether the last sample succeeded.
    pub last_sample_ok: bool,
    /// How long the last sample took.
    pub last_sample_duration: Duration,
    /// When the last successful sample was taken.
    pub last_sample_time: Option<SystemTime>,
    /// The last sampling error, as text.
    pub last_sample_error: Option<String>,
    /// Metric families that could not be read at the last successful sample, summed over its
    /// GPUs ([`DeviceSample::errors`](crate::DeviceSample::errors), one per GPU and family): a GPU
    /// whose XID events are not monitored counts one. 0 when every GPU reads every family.
    pub metric_failures: u64,
    /// Panics caught in processors (each loses one tick's derived data).
    pub processor_panics: u64,
    /// Every sink's status, in the order they were added.
    pub sinks: Vec<SinkStatus>,
}

#[derive(Debug, Default)]
struct Inner {
    samples_taken: AtomicU64,
    sample_failures: AtomicU64,
    skipped_ticks: AtomicU64,
    processor_panics: AtomicU64,
    metric_failures: AtomicU64,
    last_sample_ok: AtomicBool,
    /// The agent's sampling interval in nanoseconds (0 = not attached to an agent).
    interval_nanos: AtomicU64,
    last: Mutex<LastSample>,
    sinks: Mutex<Vec<Arc<Mutex<SinkStatus>>>>,
}

#[derive(Debug, Default)]
struct LastSample {
    duration: Duration,
    time: Option<SystemTime>,
    error: Option<String>,
}

/// Cheaply cloneable view of the agent's health. See [`AgentStats`].
#[derive(Clone, Debug, Default)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

use crate::lock;

impl Telemetry {
    /// Copies the current counters.
    pub fn stats(&self) -> AgentStats {
        let i = &self.inner;
        let last = lock(&i.last);
        AgentStats {
            samples_taken: i.samples_taken.load(Ordering::Relaxed),
            sample_failures: i.sample_failures.load(Ordering::Relaxed),
            skipped_ticks: i.skipped_ticks.load(Ordering::Relaxed),
            last_sample_ok: i.last_sample_ok.load(Ordering::Relaxed),
            last_sample_duration: last.duration,
            last_sample_time: last.time,
            last_sample_error: last.error.clone(),
            metric_failures: i.metric_failures.load(Ordering::Relaxed),
            processor_panics: i.processor_panics.load(Ordering::Relaxed),
            sinks: lock(&i.sinks).iter().map(|s| lock(s).clone()).collect(),
        }
    }

    /// The sampling interval of the agent this telemetry belongs to (`None` outside an agent).
    /// Sinks use it to tell fresh data from stale data.
    pub fn interval(&self) -> Option<Duration> {
        match self.inner.interval_nanos.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    pub(crate) fn set_interval(&self, interval: Duration) {
        let nanos = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.inner.interval_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Adds `n` to the `dropped` count of the sink named `sink`: for sinks that buffer
    /// internally (an outage buffer, say) and must drop data of their own, so that every loss
    /// shows in [`SinkStatus::dropped`] and in the agent's self-metrics. Unknown names are
    /// ignored.
    pub fn record_dropped(&self, sink: &str, n: u64) {
        if n == 0 {
            return;
        }
        for cell in lock(&self.inner.sinks).iter() {
            let mut status = lock(cell);
            if status.name == sink {
                status.dropped += n;
                return;
            }
        }
    }

    pub(crate) fn register_sink(&self, name: String) -> SinkStatusCell {
        let cell = Arc::new(Mutex::new(SinkStatus::new(name)));
        lock(&self.inner.sinks).push(cell.clone());
        SinkStatusCell(cell)
    }

    pub(crate) fn sample_ok(&self, duration: Duration, at: SystemTime, metric_failures: u64) {
        self.inner.samples_taken.fetch_add(1, Ordering::Relaxed);
        self.inner.metric_failures.store(metric_failures, Ordering::Relaxed);
        self.inner.last_sample_ok.store(true, Ordering::Relaxed);
        let mut last = lock(&self.inner.last);
        last.duration = duration;
        last.time = Some(at);
        last.error = None;
    }

    pub(crate) fn sample_failed(&self, duration: Duration, error: &dyn std::fmt::Display) {
        self.inner.sample_failures.fetch_add(1, Ordering::Relaxed);
        self.inner.last_sample_ok.store(false, Ordering::Relaxed);
        let mut last = lock(&self.inner.last);
        last.duration = duration;
        last.error = Some(error.to_string());
    }

    pub(crate) fn tick_skipped(&self) {
        self.inner.skipped_ticks.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a processor panic; returns the count including this one.
    pub(crate) fn processor_panicked(&self) -> u64 {
        self.inner.processor_panics.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// One sink's status, updated by its worker.
#[derive(Clone, Debug)]
pub(crate) struct SinkStatusCell(Arc<Mutex<SinkStatus>>);

impl SinkStatusCell {
    pub(crate) fn update(&self, f: impl FnOnce(&mut SinkStatus)) {
        f(&mut lock(&self.0));
    }

    pub(crate) fn succeeded(&self, exported: bool) {
        self.update(|s| {
            if exported {
                s.exported += 1;
                s.last_success = Some(SystemTime::now());
            }
            s.consecutive_failures = 0;
        });
    }

    /// Counts a failed export (`panicked`: the sink panicked, a `SinkError::Panicked`).
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display, panicked: bool) {
        self.update(|s| {
            s.failures += 1;
            s.consecutive_failures += 1;
            if panicked {
                s.panics += 1;
            }
            s.last_error = Some(error.to_string());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_can_report_their_own_drops() {
        let t = Telemetry::default();
        let _a = t.register_sink("a".into());
        let _b = t.register_sink("b".into());
        t.record_dropped("b", 3);
        t.record_dropped("b", 0);
        t.record_dropped("nope", 9);
        let stats = t.stats();
        assert_eq!(stats.sinks.iter().map(|s| (s.name.as_str(), s.dropped)).collect::<Vec<_>>(), [("a", 0), ("b", 3)]);
        assert_eq!(t.interval(), None);
        t.set_interval(Duration::from_millis(250));
        assert_eq!(t.interval(), Some(Duration::from_millis(250)));
    }
}

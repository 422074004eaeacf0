//! The time the agent's schedule runs on: the system's, or a hand-driven one for tests.
//!
//! The agent samples on its own thread, which sleeps until each tick on this clock, and a
//! watchdog on the tokio runtime abandons a sample that overruns its timeout, also on this clock.
//! tokio's paused test clock cannot drive either (a thread outside the runtime does not stop it
//! from auto-advancing), so test suites that want exact, instant timing hand the agent a
//! [`ManualClock`] and step it themselves. Sinks' own timeouts and the deadlines of
//! [`AgentHandle`](super::AgentHandle) calls stay on tokio's time.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::lock;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The clock an [`Agent`](super::Agent) schedules its ticks and sample timeouts on. Default:
/// [`Clock::System`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Clock {
    /// The system's monotonic clock.
    #[default]
    System,
    /// A clock that moves only when told to (see [`ManualClock`]).
    Manual(ManualClock),
}

impl From<ManualClock> for Clock {
    fn from(clock: ManualClock) -> Self {
        Clock::Manual(clock)
    }
}

impl Clock {
    /// The current time on this clock.
    pub fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Manual(manual) => manual.now(),
        }
    }

    /// Waits, on the tokio runtime, until `deadline` on this clock.
    pub(crate) async fn sleep_until(&self, deadline: Instant) {
        match self {
            Clock::System => tokio::time::sleep_until(deadline.into()).await,
            Clock::Manual(manual) => {
                let mut changed = manual.inner.changed.subscribe();
                while manual.now() < deadline {
                    if changed.changed().await.is_err() {
                        // Cannot happen while `manual` (which owns the sender) is alive.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    /// Blocks the calling thread on `wakeup` until `deadline` on this clock (or for ever with
    /// `None`), until `notified` says so, or spuriously; the caller re-checks its condition.
    /// `guard` is `state`'s, held; it is released while waiting, as by [`std::sync::Condvar`].
    pub(crate) fn wait<'a, T>(
        &self,
        wakeup: &Wakeup<T>,
        guard: std::sync::MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> std::sync::MutexGuard<'a, T> {
        match (self, deadline) {
            (Clock::System, Some(deadline)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return guard;
                }
                wakeup.condvar.wait_timeout(guard, left).unwrap_or_else(PoisonError::into_inner).0
            }
            // A manual clock wakes the waiter itself when it moves (`ManualClock::advance`).
            (_, _) => wakeup.condvar.wait(guard).unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Makes [`Clock::wait`] on `wakeup` return when this clock moves, for as long as `wakeup`
    /// lives.
    pub(crate) fn register<T: Send + 'static>(&self, wakeup: &Arc<Wakeup<T>>) {
        if let Clock::Manual(manual) = self {
            let weak: Weak<Wakeup<T>> = Arc::downgrade(wakeup);
            let weak: Weak<dyn Notifiable> = weak;
            lock(&manual.inner.waiters).push(weak);
        }
    }
}

/// A mutex-guarded state and the condition variable a thread waits on for it.
#[derive(Debug, Default)]
pub(crate) struct Wakeup<T> {
    pub(crate) state: Mutex<T>,
    pub(crate) condvar: std::sync::Condvar,
}

impl<T> Wakeup<T> {
    pub(crate) fn new(state: T) -> Self {
        Self { state: Mutex::new(state), condvar: std::sync::Condvar::new() }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        lock(&self.state)
    }

    /// Wakes the waiting thread. Taking the lock first means a waiter between checking its
    /// condition and waiting cannot miss this.
    pub(crate) fn notify(&self) {
        drop(self.lock());
        self.condvar.notify_all();
    }
}

trait Notifiable: Send + Sync {
    fn notify(&self);
}

impl<T: Send> Notifiable for Wakeup<T> {
    fn notify(&self) {
        Wakeup::notify(self);
    }
}

/// A clock for tests: it starts at the moment it is made and moves only by
/// [`ManualClock::advance`]. Hand it to [`AgentBuilder::clock`](super::AgentBuilder::clock) and
/// the agent ticks when the test says so — `advance(interval)` is one tick — and a hung sample
/// times out when the test has advanced past its timeout, however long the test really takes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use gpumon_core::ManualClock;
///
/// let clock = ManualClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now() - start, Duration::from_secs(5));
/// # }
/// ```
///
/// Advancing wakes the agent's sampling thread, which then samples in real time: wait for the
/// outcome (a sink's record, [`AgentHandle::stats`](super::AgentHandle::stats)) before
/// asserting on it. The schedule starts when the agent starts running, with its first tick at
/// once, so wait for that one too before the first advance (an advance before it only moves the
/// start).
#[derive(Clone, Debug)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    start: Instant,
    /// Time since `start`; also what `changed` carries, for async sleepers.
    elapsed: Mutex<Duration>,
    changed: watch::Sender<Duration>,
    /// Threads waiting on this clock (dropped ones are pruned as they are found).
    waiters: Mutex<Vec<Weak<dyn Notifiable>>>,
}

impl std::fmt::Debug for ManualInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualClock").field("elapsed", &*lock(&self.elapsed)).finish_non_exhaustive()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock standing at the current instant.
    pub fn new() -> Self {
        let (changed, _) = watch::channel(Duration::ZERO);
        Self {
            inner: Arc::new(ManualInner {
                start: Instant::now(),
                elapsed: Mutex::new(Duration::ZERO),
                changed,
                waiters: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The time on this clock.
    pub fn now(&self) -> Instant {
        self.inner.start + *lock(&self.inner.elapsed)
    }

    /// How far the clock has been advanced since it was made.
    pub fn elapsed(&self) -> Duration {
        *lock(&self.inner.elapsed)
    }

    /// Moves the clock forward by `by` and wakes everything waiting on it.
    pub fn advance(&self, by: Duration) {
        let elapsed = {
            let mut elapsed = lock(&self.inner.elapsed);
            *elapsed += by;
            *elapsed
        };
        self.inner.changed.send_replace(elapsed);
        let waiters: Vec<_> = {
            let mut waiters = lock(&self.inner.waiters);
            waiters.retain(|w| w.strong_count() > 0);
            waiters.iter().filter_map(Weak::upgrade).collect()
        };
        for waiter in waiters {
            waiter.notify();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_waiting_on_a_clock_driven_by_hand_wakes_when_it_passes_the_deadline() {
        let clock = ManualClock::new();
        let wakeup = Arc::new(Wakeup::new(()));
        Clock::from(clock.clone()).register(&wakeup);
        let deadline = clock.now() + Duration::from_secs(10);
        let waiter = std::thread::spawn({
            let clock = Clock::from(clock.clone());
            let wakeup = wakeup.clone();
            move || {
                let mut guard = wakeup.lock();
                while clock.now() < deadline {
                    guard = clock.wait(&wakeup, guard, Some(deadline));
                }
                clock.now()
            }
        });
        clock.advance(Duration::from_secs(4));
        clock.advance(Duration::from_secs(6));
        assert_eq!(waiter.join().unwrap(), deadline);
    }

    #[tokio::test]
    async fn an_async_sleep_on_a_clock_driven_by_hand_ends_only_when_advanced_past_it() {
        let clock = ManualClock::new();
        let deadline = clock.now() + Duration::from_secs(3);
        let sleeper = tokio::spawn({
            let clock = Clock::from(clock.clone());
            async move { clock.sleep_until(deadline).await }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(2));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(10), sleeper).await.unwrap().unwrap();
    }
}

//! How the watchdog learns that a sample has overrun its timeout without being woken every tick.
//!
//! The watchdog is a task on the tokio runtime; the sample it guards runs on the sampling thread.
//! Re-arming a tokio timer for each sample would need the runtime awake at every tick — a second
//! thread wake-up per tick, the cost [`Sink::exports_inline`](crate::Sink::exports_inline)
//! exists to remove. On Linux the sampling thread instead arms a kernel timer (a `timerfd`)
//! before each backend call and disarms it after: two system calls that wake nobody. A thread of
//! the agent's own (`gpumon-alarm`) sleeps in a blocking `read` of the timer and wakes the
//! watchdog only when a sample really overruns. (A thread rather than the runtime's reactor, so
//! that the agent keeps running on a runtime built without I/O.) Elsewhere, on a
//! [`ManualClock`](super::ManualClock) (which the kernel cannot see), or when the thread cannot
//! start, the watchdog keeps its tokio timer and the sampling thread wakes it every tick, as
//! before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The kernel timer that guards samples, if any.
#[derive(Debug)]
pub(crate) struct Alarm {
    #[cfg(target_os = "linux")]
    timer: Option<timer::TimerFd>,
    /// Whether the `gpumon-alarm` thread waits on the timer. Only then do samples arm it and
    /// does the sampling thread leave the watchdog asleep between ticks.
    watched: AtomicBool,
}

impl Alarm {
    /// A kernel timer when `system_clock` (the schedule runs on the system's monotonic clock)
    /// and the platform has one; otherwise none.
    pub(crate) fn new(system_clock: bool) -> Self {
        #[cfg(target_os = "linux")]
        {
            let timer = system_clock
                .then(|| {
                    timer::TimerFd::new()
                        .map_err(|e| tracing::debug!(error = %e, "no timerfd; the watchdog wakes every tick"))
                        .ok()
                })
                .flatten();
            Self { timer, watched: AtomicBool::new(false) }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = system_clock;
            Self { watched: AtomicBool::new(false) }
        }
    }

    /// Whether the kernel timer tells the watchdog of overruns (it needs no wake-up per tick).
    pub(crate) fn is_active(&self) -> bool {
        self.watched.load(Ordering::Acquire)
    }

    /// Arms the timer to go off `after` from now (a no-op unless [`Alarm::is_active`]).
    pub(crate) fn arm(&self, after: Duration) {
        #[cfg(target_os = "linux")]
        if let Some(timer) = self.timer.as_ref().filter(|_| self.is_active()) {
            timer.set(Some(after));
        }
        let _ = after;
    }

    /// Disarms the timer (a no-op unless [`Alarm::is_active`]).
    pub(crate) fn disarm(&self) {
        #[cfg(target_os = "linux")]
        if let Some(timer) = self.timer.as_ref().filter(|_| self.is_active()) {
            timer.set(None);
        }
    }

    /// Wakes the waiting thread now, so that it sees the agent stopping.
    pub(crate) fn ring(&self) {
        #[cfg(target_os = "linux")]
        if let Some(timer) = &self.timer {
            timer.set(Some(Duration::ZERO));
        }
    }

    /// Starts the thread that waits on the timer and calls `fired` each time it goes off, until
    /// `fired` returns `false`. Without a timer, or when the thread cannot start (logged), the
    /// alarm stays inactive and the watchdog keeps its own timer.
    pub(crate) fn watch(&self, fired: impl FnMut() -> bool + Send + 'static) {
        #[cfg(target_os = "linux")]
        if let Some(timer) = &self.timer {
            match timer.spawn_waiter(fired) {
                Ok(()) => self.watched.store(true, Ordering::Release),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the sample-timeout alarm; the watchdog wakes every tick")
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = fired;
    }
}

#[cfg(target_os = "linux")]
mod timer {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    /// A `timerfd` on `CLOCK_MONOTONIC` (the clock of [`std::time::Instant`]), blocking reads.
    #[derive(Debug)]
    pub(super) struct TimerFd(OwnedFd);

    impl TimerFd {
        pub(super) fn new() -> std::io::Result<Self> {
            // SAFETY: a plain system call; the descriptor it returns is owned by nobody else.
            let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh, valid descriptor that nothing else owns.
            Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
        }

        /// Goes off once, `after` from now; `None` disarms.
        pub(super) fn set(&self, after: Option<Duration>) {
            // A zero `it_value` disarms: an alarm due now goes off after a nanosecond instead.
            let after = after.map(|d| d.max(Duration::from_nanos(1))).unwrap_or_default();
            let value = libc::itimerspec {
                it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
                it_value: libc::timespec {
                    tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
                    // Below 10⁹: fits a `c_long` anywhere.
                    tv_nsec: after.subsec_nanos() as libc::c_long,
                },
            };
            // SAFETY: a valid descriptor, and pointers valid for the duration of the call. It
            // fails only on a bad descriptor or value, which this type does not allow.
            let rc = unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &value, std::ptr::null_mut()) };
            debug_assert_eq!(rc, 0, "timerfd_settime: {}", std::io::Error::last_os_error());
        }

        /// A thread that sleeps in `read` until the timer goes off, and calls `fired`.
        pub(super) fn spawn_waiter(&self, mut fired: impl FnMut() -> bool + Send + 'static) -> std::io::Result<()> {
            let fd = self.0.try_clone()?;
            std::thread::Builder::new().name("gpumon-alarm".to_owned()).spawn(move || loop {
                let mut expirations = [0u8; 8];
                // SAFETY: reads at most 8 bytes into an 8-byte buffer from a valid descriptor.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), expirations.len()) };
                if n == 8 {
                    if !fired() {
                        return;
                    }
                } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(error = %std::io::Error::last_os_error(), "the sample-timeout alarm failed");
                    return;
                }
            })?;
            Ok(())
        }
    }
}

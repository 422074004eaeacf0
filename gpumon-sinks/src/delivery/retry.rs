//! Exponential backoff with full jitter, shared by the HTTP sinks.

use std::time::Duration;

/// Backoff settings: the n-th retry waits a random time in `0..=min(max, initial * 2^n)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(200), max: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// The ceiling of the delay before retry number `attempt` (0-based), before jitter.
    pub(crate) fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(20));
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay before retry number `attempt`, with full jitter (AWS architecture blog's
    /// "full jitter": spreads retries of many agents so a recovering server is not stampeded).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

/// Parses an HTTP `Retry-After` header given in seconds (the HTTP-date form is rare from
/// metric backends and is ignored).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_max() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(3), Duration::from_millis(800));
        assert_eq!(b.ceiling(4), Duration::from_secs(1));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(1));
        for attempt in 0..10 {
            assert!(b.delay(attempt) <= b.ceiling(attempt));
        }
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}

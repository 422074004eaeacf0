//! The sampling interval and its bounds, in one place: the agent's builder, the assembly (config
//! and flags) and the Python binding all check an interval through [`Interval::new`].

use std::time::Duration;

/// The shortest sampling interval the agent accepts.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The longest sampling interval the agent accepts: one hour. Longer is almost always a unit
/// mistake (`1000000000h`), and every deadline the agent computes from it must stay far from
/// `Instant`'s range.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Default sampling interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// A sampling interval within [`MIN_INTERVAL`]..=[`MAX_INTERVAL`].
///
/// ```
/// use std::time::Duration;
/// use gpumon_core::{Interval, MAX_INTERVAL};
/// assert_eq!(Interval::new(Duration::from_millis(500)).unwrap().get(), Duration::from_millis(500));
/// assert!(Interval::new(Duration::from_millis(10)).unwrap_err().to_string().contains("minimum of 100ms"));
/// assert!(Interval::new(MAX_INTERVAL * 2).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval(Duration);

/// Why a duration is not a sampling interval.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IntervalError {
    /// Below [`MIN_INTERVAL`].
    #[error("{0:?} is below the minimum of {MIN_INTERVAL:?}")]
    TooShort(Duration),
    /// Above [`MAX_INTERVAL`].
    #[error("{0:?} is above the maximum of {MAX_INTERVAL:?}")]
    TooLong(Duration),
}

impl Interval {
    /// The default, [`DEFAULT_INTERVAL`].
    pub const DEFAULT: Interval = Interval(DEFAULT_INTERVAL);

    /// `interval` when it is within the bounds.
    ///
    /// # Errors
    /// [`IntervalError`] saying which bound it crosses.
    pub fn new(interval: Duration) -> Result<Self, IntervalError> {
        if interval < MIN_INTERVAL {
            Err(IntervalError::TooShort(interval))
        } else if interval > MAX_INTERVAL {
            Err(IntervalError::TooLong(interval))
        } else {
            Ok(Interval(interval))
        }
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl Default for Interval {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl From<Interval> for Duration {
    fn from(interval: Interval) -> Duration {
        interval.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive_and_errors_say_which() {
        assert_eq!(Interval::new(MIN_INTERVAL).map(Interval::get), Ok(MIN_INTERVAL));
        assert_eq!(Interval::new(MAX_INTERVAL).map(Interval::get), Ok(MAX_INTERVAL));
        let short = MIN_INTERVAL - Duration::from_nanos(1);
        assert_eq!(Interval::new(short), Err(IntervalError::TooShort(short)));
        let huge = Duration::from_secs(1_000_000_000 * 3600);
        assert_eq!(Interval::new(huge), Err(IntervalError::TooLong(huge)));
        assert!(IntervalError::TooLong(huge).to_string().contains("maximum of 3600s"));
    }
}

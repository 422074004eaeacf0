//! The one retry policy of every HTTP push sink: which answers are worth another try
//! ([`classify`]), and how long to wait before it ([`Backoff::wait`]: the server's `Retry-After`,
//! else exponential backoff with full jitter).
//!
//! The InfluxDB and remote-write writers ([`crate::delivery`]) retry in the background until the
//! data is written or dropped; the Pushgateway retries within one export's time budget; OTLP/HTTP
//! does not retry itself and reports a [`Failure::Retry`] as a transient error for the agent to
//! count. All of them read the same table, and the two that retry keep their tries and their
//! outage in one [`Retrier`]: the next wait, the failure last logged, and how long the outage
//! lasted when writes recover.

use std::time::Duration;

use gpumon_core::SinkError;

/// The longest `Retry-After` obeyed; a server asking for more is retried after this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How a request failed, and so what a sink does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Network error, timeout, 5xx, 429, 408: retry with backoff (or after `Retry-After`).
    Retry { message: String, retry_after: Option<Duration> },
    /// 401/403/404, or a server certificate the client refused: the data is fine but the server
    /// will not take it until someone fixes the credentials, the URL or the CA file. A writer
    /// keeps the data and tries again only after `backoff.max`; a sink without a buffer reports
    /// it as permanent.
    Hold { message: String },
    /// Other 4xx (and data the sink could not even encode): refused; retrying cannot help.
    Reject { message: String },
}

impl Failure {
    /// What to log and report.
    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Retry { message, .. } | Failure::Hold { message } | Failure::Reject { message } => message,
        }
    }

    /// Whether another try may succeed without anyone changing anything.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, Failure::Retry { .. })
    }

    /// The wait the server asked for, if any.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Retry { retry_after, .. } => *retry_after,
            Failure::Hold { .. } | Failure::Reject { .. } => None,
        }
    }

    /// `message` as the agent's error: transient for [`Failure::Retry`], permanent otherwise.
    pub(crate) fn sink_error(&self, message: impl Into<String>) -> SinkError {
        if self.is_retryable() {
            SinkError::transient(message)
        } else {
            SinkError::permanent(message)
        }
    }
}

impl From<Failure> for SinkError {
    fn from(failure: Failure) -> Self {
        failure.sink_error(failure.message())
    }
}

/// Classifies a non-2xx HTTP answer: the one retry table of every push sink.
pub(crate) fn classify(status: u16, message: String, retry_after: Option<Duration>) -> Failure {
    match status {
        408 | 429 | 500..=599 => Failure::Retry { message, retry_after },
        401 | 403 | 404 => Failure::Hold { message },
        _ => Failure::Reject { message },
    }
}

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

    /// The wait before retry number `attempt` after a [`Failure::Retry`]: the server's
    /// `Retry-After` (at most [`MAX_RETRY_AFTER`]) when it sent one, else [`Backoff::delay`].
    pub(crate) fn wait(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(d) => d.min(MAX_RETRY_AFTER),
            None => self.delay(attempt),
        }
    }
}

/// What a sink does after a failed try ([`Retrier::failed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again after `delay`: the server's `Retry-After` when `server_asked`, else the backoff.
    Retry { delay: Duration, server_asked: bool },
    /// Keep the data and try again after `Backoff::max` (401/403/404, an untrusted server
    /// certificate): someone must fix the credentials, the URL or the CA file.
    Hold(Duration),
    /// Refused: retrying cannot help.
    Drop,
}

/// An outage that ended ([`Retrier::succeeded`]): how long it lasted and how many tries failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Recovered {
    pub(crate) lasted: Duration,
    pub(crate) failed_tries: u64,
}

/// The retry-and-outage loop's state of one push target, shared by the Pushgateway sink (which
/// retries within one export's budget) and the batching writer ([`crate::delivery`], which
/// retries in the background): the retry number the backoff grows with, and the outage in
/// progress — since when, how many tries failed, and the failure last logged, so that a run of
/// identical failures is logged once.
#[derive(Debug)]
pub(crate) struct Retrier {
    backoff: Backoff,
    /// Retries since the last success (or [`Retrier::new_round`]): the backoff's exponent.
    retries: u32,
    /// When the outage began, and the tries failed since.
    outage: Option<(std::time::Instant, u64)>,
    /// The key of the failure last logged (`None`: none since the last success).
    last_logged: Option<String>,
}

impl Retrier {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self { backoff, retries: 0, outage: None, last_logged: None }
    }

    /// Starts the backoff over (the next retry waits as the first), keeping the outage.
    pub(crate) fn new_round(&mut self) {
        self.retries = 0;
    }

    /// A try failed: counts it into the outage (which begins now, if none is in progress) and
    /// says what to do next.
    pub(crate) fn failed(&mut self, failure: &Failure) -> Next {
        let (_, tries) = self.outage.get_or_insert_with(|| (std::time::Instant::now(), 0));
        *tries += 1;
        match failure {
            Failure::Retry { .. } => {
                let delay = self.backoff.wait(self.retries, failure.retry_after());
                self.retries = self.retries.saturating_add(1);
                Next::Retry { delay, server_asked: failure.retry_after().is_some() }
            }
            Failure::Hold { .. } => Next::Hold(self.backoff.max),
            Failure::Reject { .. } => Next::Drop,
        }
    }

    /// Whether to log a failure of the kind `key` (its message, `connect`, `HTTP 503`): only when
    /// it differs from the failure last logged since the last success.
    pub(crate) fn log_once(&mut self, key: &str) -> bool {
        let new = self.last_logged.as_deref() != Some(key);
        if new {
            self.last_logged = Some(key.to_owned());
        }
        new
    }

    /// A try succeeded: the backoff starts over, and the outage ends. It is returned when a
    /// failure of it was logged (a try that failed and was retried in silence is no outage to
    /// report).
    pub(crate) fn succeeded(&mut self) -> Option<Recovered> {
        self.retries = 0;
        let (since, failed_tries) = self.outage.take()?;
        self.last_logged.take()?;
        Some(Recovered { lasted: since.elapsed(), failed_tries })
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
    fn retry_classification() {
        let class = |code| match classify(code, String::new(), None) {
            Failure::Retry { .. } => "retry",
            Failure::Hold { .. } => "hold",
            Failure::Reject { .. } => "reject",
        };
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(class(code), "retry", "{code}");
        }
        for code in [401, 403, 404] {
            assert_eq!(class(code), "hold", "{code}");
        }
        for code in [400, 409, 413, 422] {
            assert_eq!(class(code), "reject", "{code}");
        }
        let f = classify(429, "m".into(), Some(Duration::from_secs(3)));
        assert_eq!(f, Failure::Retry { message: "m".into(), retry_after: Some(Duration::from_secs(3)) });
        assert_eq!(f.retry_after(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn failures_become_transient_or_permanent_sink_errors() {
        let retry = classify(503, "busy".into(), None);
        assert!(retry.is_retryable());
        assert_eq!(SinkError::from(retry.clone()).to_string(), SinkError::transient("busy").to_string());
        assert!(retry.sink_error("busy (after 3 attempts)").is_retryable());
        for code in [401, 400] {
            let f = classify(code, "no".into(), Some(Duration::from_secs(1)));
            assert!(!f.is_retryable() && f.retry_after().is_none(), "{code}");
            assert_eq!(SinkError::from(f).to_string(), SinkError::permanent("no").to_string(), "{code}");
        }
    }

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
            assert!(b.wait(attempt, None) <= b.ceiling(attempt));
        }
    }

    #[test]
    fn the_servers_wait_wins_up_to_five_minutes() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
        assert_eq!(b.wait(0, Some(Duration::from_secs(7))), Duration::from_secs(7));
        assert_eq!(b.wait(9, Some(Duration::from_secs(3600))), MAX_RETRY_AFTER);
    }

    #[test]
    fn the_retrier_backs_off_logs_each_kind_once_and_reports_the_outage() {
        let backoff = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
        let mut r = Retrier::new(backoff);
        assert_eq!(r.succeeded(), None, "no outage yet");
        let busy = classify(503, "busy".into(), None);
        assert!(matches!(r.failed(&busy), Next::Retry { delay, server_asked: false } if delay <= backoff.ceiling(0)));
        assert_eq!(r.succeeded(), None, "a failure retried in silence is no outage");
        assert!(matches!(r.failed(&busy), Next::Retry { delay, .. } if delay <= backoff.ceiling(0)), "starts over");
        assert!(r.log_once("HTTP 503"));
        assert!(matches!(r.failed(&busy), Next::Retry { delay, .. } if delay <= backoff.ceiling(1)));
        assert!(!r.log_once("HTTP 503"), "the same kind is logged once");
        let asked = classify(429, "slow down".into(), Some(Duration::from_secs(7)));
        assert_eq!(r.failed(&asked), Next::Retry { delay: Duration::from_secs(7), server_asked: true });
        assert!(r.log_once("HTTP 429"));
        assert_eq!(r.failed(&classify(401, "who".into(), None)), Next::Hold(backoff.max));
        assert_eq!(r.failed(&classify(400, "bad".into(), None)), Next::Drop);
        r.new_round();
        assert_eq!(r.retries, 0);
        assert_eq!(r.succeeded().map(|o| o.failed_tries), Some(5), "a new round keeps the outage");
        assert!(r.log_once("HTTP 429"), "logged again after a recovery");
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}

//! Delivery shared by the push sinks that batch and retry (InfluxDB, Prometheus remote write):
//! the outage [`buffer`] and the background writer ([`Delivery`]) that sends sealed batches in
//! order through a sink's [`Transport`]. What an HTTP answer means and how long to wait before
//! the next try is the one retry policy of every HTTP sink, in [`crate::http::retry`].
//!
//! The semantics, the same for every sink built on it:
//! - `export` never waits for the network: it appends the encoded snapshot to the open batch and
//!   returns the current write error, if any, so the agent's status shows what the server said.
//! - A batch is sealed at `batch_items` items or after `batch_interval` — at once when exports
//!   come about `batch_interval` apart or more (it would be sent alone anyway); batches go out one at
//!   a time, oldest first.
//! - Network errors, timeouts, 408, 429 and 5xx are retried with jittered exponential backoff, or
//!   after the server's `Retry-After`; 401/403/404 and a server certificate the client does not
//!   trust hold the data and retry only every `backoff.max`; any other 4xx refuses the batch for good (dropped, counted, logged once).
//! - While the server is away the buffer is bounded by items and bytes: the oldest batches are
//!   dropped, counted, and reported to the agent
//!   ([`Telemetry::record_dropped`](gpumon_core::Telemetry::record_dropped)).
//! - `flush` seals and waits until everything is written or an attempt fails; `shutdown` does the
//!   same once (then spills what is left, where a spill directory is set).

pub(crate) mod buffer;
mod engine;

pub(crate) use engine::{Delivery, DeliveryConfig, DeliveryStats, Shared as DeliveryShared, Transport, Unit};

use std::time::Duration;

use gpumon_core::BuildError;

use crate::http::client::HttpClient;
use crate::http::retry::Failure;

/// How a batch's body is compressed before it is sent: the name of the compression (for error
/// messages) and the function.
pub(crate) type Compression = (&'static str, fn(&[u8]) -> Result<Vec<u8>, String>);

/// The [`Transport`] of every sink built on this: each sealed batch is one `POST` to `url`, its
/// body compressed first (gzip for InfluxDB, snappy for remote write), sent and classified by
/// the HTTP layer's one send-and-classify ([`HttpClient::send`]). A batch that cannot be
/// compressed is refused (dropped and counted), never retried. The request's fixed headers
/// (content type and encoding, auth) are the client's. The shape is vector's (shared/STYLE.md,
/// "HTTP is written per sink"): the HTTP service once in `sinks/util`, a sink holding only what
/// its requests carry.
#[derive(Debug)]
pub(crate) struct PostBatches {
    pub(crate) client: HttpClient,
    pub(crate) url: reqwest::Url,
    /// `POST <url>` (InfluxDB leaves out the query), the start of every error message.
    pub(crate) target: String,
    /// `None`: the batch is sent as it is.
    pub(crate) compression: Option<Compression>,
}

#[async_trait::async_trait]
impl Transport for PostBatches {
    async fn send(&self, batch: &bytes::Bytes) -> Result<(), Failure> {
        let body = match self.compression {
            Some((name, compress)) => bytes::Bytes::from(
                compress(batch).map_err(|e| Failure::Reject { message: format!("{}: {name}: {e}", self.target) })?,
            ),
            // The batch itself: no copy of ~140 KB per request for 8 GPUs.
            None => batch.clone(),
        };
        let request = self.client.request(reqwest::Method::POST, self.url.clone()).body(body);
        self.client.send(request).await.map_err(|e| e.into_failure(&self.target))
    }
}

/// Returns memory the process has freed to the system: glibc's `malloc` keeps freed pages in its
/// arenas for reuse (and raises its mmap threshold after the first large free, so a backlog's
/// batches come from the arenas), so the high-water mark of an outage buffer would otherwise
/// stay as RSS after the drain. Elsewhere (musl, other systems) a no-op: their allocators return
/// large frees themselves or offer no such call.
pub(crate) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks glibc's own arenas under their locks
    // and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The batching and buffer settings of a sink's `[section]` as every sink built on this checks
/// them: `batch_{items}` at least 1, `batch_interval` at least 10 ms, a `timeout`,
/// `buffer_max_{items}` at least one batch, `buffer_max_bytes` at least 4096.
///
/// # Errors
/// [`BuildError::InvalidConfig`] naming the first setting out of range (`influxdb.batch_points`).
pub(crate) fn check_batching(
    section: &str,
    items: &str,
    batch: usize,
    batch_interval: Duration,
    timeout: Duration,
    buffer_max: usize,
    buffer_max_bytes: usize,
) -> Result<(), BuildError> {
    if batch == 0 {
        return Err(BuildError::invalid(format!("{section}.batch_{items}"), "must be at least 1"));
    }
    if batch_interval < Duration::from_millis(10) {
        return Err(BuildError::invalid(format!("{section}.batch_interval"), "must be at least 10ms"));
    }
    if timeout.is_zero() {
        return Err(BuildError::invalid(format!("{section}.timeout"), "must be greater than zero"));
    }
    if buffer_max < batch {
        return Err(BuildError::invalid(
            format!("{section}.buffer_max_{items}"),
            format!("must be at least `batch_{items}` ({batch})"),
        ));
    }
    if buffer_max_bytes < 4096 {
        return Err(BuildError::invalid(format!("{section}.buffer_max_bytes"), "must be at least 4096"));
    }
    Ok(())
}

/// `retry_initial` and `retry_max` of `[section]`: 0 < retry_initial <= retry_max.
///
/// # Errors
/// [`BuildError::InvalidConfig`] naming `{section}.retry_max`.
pub(crate) fn check_retry(section: &str, initial: Duration, max: Duration) -> Result<(), BuildError> {
    if initial.is_zero() || max < initial {
        return Err(BuildError::invalid(format!("{section}.retry_max"), "need 0 < retry_initial <= retry_max"));
    }
    Ok(())
}

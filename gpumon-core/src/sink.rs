//! The output seam: anything that takes snapshots implements [`Sink`].

use std::sync::Arc;
use std::time::Duration;

use crate::model::Snapshot;
use crate::sampler::BoxError;

/// One destination for snapshots: a scrape endpoint, a time-series database, a terminal.
///
/// The runtime gives every sink its own task and bounded queue, so a sink may take its time —
/// retrying, batching, waiting on a slow server — without delaying sampling or other sinks. Each
/// call runs under a timeout; a sink that overruns it loses that call, not the agent.
///
/// Object-safe (through `async-trait`), so an agent holds `Vec<Box<dyn Sink>>`.
///
/// # Contract
/// - `export` is called with snapshots in order; a sink that falls behind its queue loses the
///   *oldest* ones, and the runtime counts them.
/// - A tick whose sample failed still reaches `export`, as a sampling-failed snapshot
///   ([`Snapshot::sampling_failed`]: no devices, [`Snapshot::sampling_failure`] says why). A sink
///   that exports from [`Snapshot::visit_derived`] gets its "up 0 for the host" point with no
///   code of its own; a sink that only walks the devices exports nothing for it.
/// - Retry, if any, happens inside `export`, bounded by the export timeout.
/// - `flush` returns once everything accepted so far has been written (or failed).
/// - `shutdown` flushes what it can and releases resources. It is idempotent; after it, `export`
///   returns [`SinkError::AlreadyShutdown`].
///
/// # Inline exports
/// A sink whose export cannot block — it stores the snapshot (a scrape endpoint), appends to a
/// bounded buffer, or writes where a write never waits (a regular file) — says so with
/// [`Sink::exports_inline`] and implements [`Sink::export_inline`]. The runtime then calls it on
/// the sampling thread, right after the tick's sample, and wakes its tokio runtime only when a
/// sink has I/O due (a sink that may block, or an inline sink answering
/// [`InlineExport::FlushDue`]): a tick whose sinks all export inline costs one thread wake-up.
/// The sampling thread catches an inline export's panic (counted in the sink's status, logged,
/// sampling goes on); it cannot bound its time, so an inline export must never wait — on a
/// lock held across I/O, a socket, a pipe, a full channel. While the sink's own task is busy
/// with it (its healthcheck, a flush, the shutdown), ticks go through its queue and `export`
/// instead, in order.
#[async_trait::async_trait]
pub trait Sink: Send + 'static {
    /// A short, unique name for status and logs, e.g. `"prometheus"`.
    fn name(&self) -> &str;

    /// Called once when the sink is added to an agent, with a view of the agent's own health
    /// (sampling counters, every sink's status), for sinks that export self-metrics.
    fn attach_telemetry(&mut self, telemetry: crate::Telemetry) {
        let _ = telemetry;
    }

    /// Takes one snapshot.
    ///
    /// # Errors
    /// A [`SinkError`]; the runtime records it in the sink's status and carries on.
    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError>;

    /// Whether [`Sink::export_inline`] can take this sink's ticks on the sampling thread (see
    /// [Inline exports](Sink#inline-exports)). Asked once, when the sink is added to an agent.
    /// Default `false`: the export may block, so it runs on the sink's own task.
    fn exports_inline(&self) -> bool {
        false
    }

    /// Whether this sink receives the families the agent samples only for its processors
    /// ([`AgentBuilder::sample_for_processors`](crate::AgentBuilder::sample_for_processors)),
    /// which every other sink, subscriber and caller never sees. Asked once, when the sink is
    /// added to an agent. Default `false`. Only a sink that records what was sampled for a later
    /// run of the same processors says `true` (the trace's `RecordSink`, whose
    /// replay's diagnosis needs the windows it reads live); an exporter never does.
    fn records_stage_inputs(&self) -> bool {
        false
    }

    /// Takes one snapshot synchronously, on the sampling thread, without ever waiting. Called
    /// instead of [`Sink::export`] for scheduled ticks when [`Sink::exports_inline`] is `true`;
    /// `export` must still work (a flush's snapshot, and ticks that arrive while the sink's
    /// task holds it, go through it).
    ///
    /// # Errors
    /// A [`SinkError`], recorded in the sink's status as an `export` failure is. The default
    /// refuses with [`SinkError::Permanent`]: only a sink that says it exports inline is called.
    fn export_inline(&mut self, snapshot: &Arc<Snapshot>) -> Result<InlineExport, SinkError> {
        let _ = snapshot;
        Err(SinkError::permanent(format!("sink `{}` does not export inline", self.name())))
    }

    /// Checks the destination can be reached. Run once at start-up; failure is reported, not fatal.
    ///
    /// # Errors
    /// Why the destination cannot be reached.
    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Writes out anything buffered.
    ///
    /// # Errors
    /// Why buffered data could not be written.
    async fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Flushes and releases resources. Idempotent.
    ///
    /// # Errors
    /// Why the final flush failed.
    async fn shutdown(&mut self) -> Result<(), SinkError>;
}

#[async_trait::async_trait]
impl<S: Sink + ?Sized> Sink for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn attach_telemetry(&mut self, telemetry: crate::Telemetry) {
        (**self).attach_telemetry(telemetry);
    }
    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        (**self).export(snapshot).await
    }
    fn exports_inline(&self) -> bool {
        (**self).exports_inline()
    }
    fn records_stage_inputs(&self) -> bool {
        (**self).records_stage_inputs()
    }
    fn export_inline(&mut self, snapshot: &Arc<Snapshot>) -> Result<InlineExport, SinkError> {
        (**self).export_inline(snapshot)
    }
    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        (**self).healthcheck().await
    }
    async fn flush(&mut self) -> Result<(), SinkError> {
        (**self).flush().await
    }
    async fn shutdown(&mut self) -> Result<(), SinkError> {
        (**self).shutdown().await
    }
}

/// What an inline export ([`Sink::export_inline`]) leaves for the sink's own task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InlineExport {
    /// Nothing: the snapshot is stored or written.
    Done,
    /// I/O is due (a buffer to write out, a batch to push): the runtime wakes and calls
    /// [`Sink::flush`] on the sink's own task, under the export timeout.
    FlushDue,
}

/// Why a sink call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// The sink was shut down.
    #[error("sink already shut down")]
    AlreadyShutdown,
    /// The call did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A failure that may go away (network error, 5xx, 429).
    #[error("transient failure: {0}")]
    Transient(#[source] BoxError),
    /// A failure that will not go away by retrying (bad credentials, rejected data).
    #[error("permanent failure: {0}")]
    Permanent(#[source] BoxError),
    /// The sink panicked; the message is the panic payload.
    #[error("sink panicked: {0}")]
    Panicked(String),
}

impl SinkError {
    /// Whether retrying the same call might succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SinkError::Timeout(_) | SinkError::Transient(_))
    }

    /// A transient failure with a message.
    pub fn transient(msg: impl Into<String>) -> Self {
        SinkError::Transient(msg.into().into())
    }

    /// A permanent failure with a message.
    pub fn permanent(msg: impl Into<String>) -> Self {
        SinkError::Permanent(msg.into().into())
    }
}

/// Errors from building a sink or an agent from configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting has a value that cannot work.
    #[error("invalid setting `{name}`: {reason}")]
    InvalidConfig {
        /// The setting (config key or builder method).
        name: String,
        /// Why the value is wrong.
        reason: String,
    },
    /// A URL or address could not be used.
    #[error("invalid endpoint `{endpoint}`: {reason}")]
    InvalidEndpoint {
        /// The value given.
        endpoint: String,
        /// Why it is wrong.
        reason: String,
    },
    /// A listener could not bind, a client could not be built, and the like.
    #[error("{what}: {source}")]
    Io {
        /// What was being set up.
        what: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl BuildError {
    /// An [`BuildError::InvalidConfig`].
    pub fn invalid(name: impl Into<String>, reason: impl Into<String>) -> Self {
        BuildError::InvalidConfig { name: name.into(), reason: reason.into() }
    }
}

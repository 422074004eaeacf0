//! Why an agent could not be assembled, and why a background service could not start: each
//! error names the config key it comes from ([`AssemblyError::key`]), so that a face can say it
//! in its own words (the `gpumon-agent` binary adds the flag that sets the key).

use std::path::PathBuf;

use super::backend::{Backend, BackendError};

/// Why [`super::Assembly::build`] refused a configuration, or could not build what it asks for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AssemblyError {
    /// A setting is bad: its key (`agent.interval`, `diagnose.thresholds.idle_level`, …) and why.
    #[error("{key}: {reason}")]
    Invalid {
        /// The config key, dotted (`steps.every_n`).
        key: String,
        /// Why the value is refused.
        reason: String,
    },
    /// A sink's section is well-formed, but the sink could not be built from it (a listener
    /// that cannot bind, a URL without a host, an unreadable CA file).
    #[error("{key}: {source}")]
    Sink {
        /// The sink's section (`prometheus`, `influxdb`, `remote_write`, …).
        key: &'static str,
        /// The sink's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A section configures something this build was compiled without.
    #[error("{key}: {what} is configured, but this build has no `{feature}` feature")]
    FeatureMissing {
        /// The section (`prometheus`, `web`, …).
        key: &'static str,
        /// What it configures, in words ("a Prometheus endpoint").
        what: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// `record.file` cannot be created.
    #[error("record.file: cannot create the trace {}: {source}", path.display())]
    Record {
        /// The trace asked for.
        path: PathBuf,
        /// Why it cannot be created.
        #[source]
        source: std::io::Error,
    },
    /// `replay.file` cannot be opened as a trace (missing, empty, another format version).
    #[error("replay.file: {0}")]
    Trace(#[source] gpumon_core::trace::TraceError),
    /// `replay.file` holds no snapshot to play: only its header (a recording stopped before
    /// its first snapshot reached the file), or a first snapshot that cannot be read. Refused
    /// before anything runs, as an empty file is: a replay of nothing would report an empty
    /// run as if it were one.
    #[error("replay.file: the trace {} holds no snapshot to replay (its header: host `{host}`, {gpus} GPU(s)){}",
        path.display(), cause.as_ref().map_or_else(|| ": it ends after its header".to_owned(), |e| format!(": {e}")))]
    NoSnapshot {
        /// The trace.
        path: PathBuf,
        /// The recorded host, from the header.
        host: String,
        /// The recorded GPUs, from the header.
        gpus: usize,
        /// Why its first snapshot cannot be read (truncated, corrupt); `None` when the trace
        /// ends after its header.
        cause: Option<std::sync::Arc<gpumon_core::trace::TraceError>>,
    },
    /// `replay.file` is set with a backend other than `replay`: which was meant is not obvious.
    #[error("replay.file: a trace is played with backend \"replay\", not {}", format!("{backend:?}").to_lowercase())]
    TraceWithBackend {
        /// The backend configured beside the trace.
        backend: Backend,
    },
    /// No sampler: the backend's settings are bad ([`BackendError::is_config`]), or the backend
    /// asked for cannot run here. (`replay` without a trace is [`BackendError::NoTrace`].)
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl AssemblyError {
    /// The config key (or section) the error is about, when there is one: `agent.interval`,
    /// `diagnose.window`, `prometheus`, `replay.file`. The backend's errors have theirs in their
    /// own variants (`mock.profile`, …).
    pub fn key(&self) -> Option<&str> {
        match self {
            AssemblyError::Invalid { key, .. } => Some(key),
            AssemblyError::Sink { key, .. } | AssemblyError::FeatureMissing { key, .. } => Some(key),
            AssemblyError::Record { .. } => Some("record.file"),
            AssemblyError::Trace(_) | AssemblyError::NoSnapshot { .. } | AssemblyError::TraceWithBackend { .. } => {
                Some("replay.file")
            }
            AssemblyError::Backend(_) => None,
        }
    }

    /// Whether the configuration is at fault (every error but a backend that cannot run here:
    /// no NVML, no mock in this build).
    pub fn is_config(&self) -> bool {
        match self {
            AssemblyError::Backend(e) => e.is_config() || matches!(e, BackendError::NoTrace),
            _ => true,
        }
    }

    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        AssemblyError::Invalid { key: key.into(), reason: reason.into() }
    }
}

impl From<gpumon_core::diagnose::DiagnoseConfigError> for AssemblyError {
    /// The diagnosis settings' own errors, keyed `diagnose.<key>` (their text is unchanged).
    fn from(e: gpumon_core::diagnose::DiagnoseConfigError) -> Self {
        use gpumon_core::diagnose::DiagnoseConfigError as E;
        match e {
            E::Invalid { key, reason } => AssemblyError::invalid(format!("diagnose.{key}"), reason),
            E::UnknownRule { key, name, known } => {
                AssemblyError::invalid(format!("diagnose.{key}"), format!("unknown rule `{name}` (known: {known})"))
            }
            other => AssemblyError::invalid("diagnose", other.to_string()),
        }
    }
}

/// Why a background service of the assembled agent ([`super::Services`]) could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// `steps.socket` cannot be bound (in use by another process, not a socket, no permission).
    #[error("{0}")]
    StepsSocket(#[from] gpumon_core::steps::socket::SocketError),
    /// The kubelet refresher (`attribution.kubelet`) cannot start.
    #[error("attribution.kubelet: {0}")]
    Kubelet(String),
}

//! The backend seam: anything that can read GPUs implements [`Sampler`].

use std::time::Duration;

use crate::filter::DeviceFilter;
use crate::metric::MetricSet;
use crate::model::Snapshot;

/// A boxed error from a backend, kept as the `source` of a [`SampleError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What one call of [`Sampler::sample`] should read.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct SampleRequest {
    /// Families to read; the rest stay `None`.
    pub metrics: MetricSet,
    /// Devices the caller may see. A backend must not read — let alone return — hidden devices.
    pub devices: DeviceFilter,
}

impl SampleRequest {
    /// A request for `metrics` on every device `devices` lets through.
    pub fn new(metrics: MetricSet, devices: DeviceFilter) -> Self {
        Self { metrics, devices }
    }
}

/// A source of GPU samples: NVML, the mock, or anything else.
///
/// NVML is a synchronous C API, so this trait is synchronous; the runtime calls it on the agent's
/// own sampling thread, one call at a time, under a timeout (a call that never returns holds
/// only that thread, and the sinks still hear of every tick). Implementations keep whatever state they
/// need between ticks (device handles, `lastSeenTimeStamp`s) behind interior mutability.
///
/// A device that fails as a whole (lost, needs reset) is reported as a
/// [`DeviceSample::lost`](crate::model::DeviceSample::lost) entry, not as an error: the other
/// devices still ship. `Err` means nothing could be read at all.
pub trait Sampler: Send + Sync + 'static {
    /// A short name for logs and [`SystemInfo::backend`](crate::model::SystemInfo::backend),
    /// e.g. `"nvml"`.
    fn name(&self) -> &str;

    /// Reads every visible device once.
    ///
    /// # Errors
    /// [`SampleError::Unavailable`] when the backend cannot be reached at all (library missing,
    /// driver not loaded); [`SampleError::Backend`] for any other failure of the whole call.
    fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError>;

    /// Whether the snapshots this sampler returns already carry the tick they stand for — a
    /// replayed trace's recorded [`Snapshot::seq`], [`Snapshot::taken_at`] and
    /// [`Snapshot::duration`]. The runtime then keeps all three instead of numbering the
    /// snapshot and stamping the moment of the call, so that every stage sees the recorded
    /// ticks and a replay gives the findings the live run gave, however fast it runs.
    /// Default `false`: a live backend reads the GPUs now.
    fn keeps_taken_at(&self) -> bool {
        false
    }
}

/// A boxed or shared sampler samples as the one it holds.
macro_rules! forward_sampler {
    ($($pointer:ident)::+) => {
        impl<S: Sampler + ?Sized> Sampler for $($pointer)::+<S> {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError> {
                (**self).sample(request)
            }
            fn keeps_taken_at(&self) -> bool {
                (**self).keeps_taken_at()
            }
        }
    };
}
forward_sampler!(Box);
forward_sampler!(std::sync::Arc);

/// Why a whole sample failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SampleError {
    /// The backend cannot be used at all: the message says what was looked for.
    #[error("GPU backend unavailable: {reason}")]
    Unavailable {
        /// What was tried and what went wrong, e.g. "libnvidia-ml.so.1 not found".
        reason: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The sample did not finish in time; the runtime skips ticks until it returns.
    #[error("sampling timed out after {0:?}")]
    Timeout(Duration),
    /// The previous sample is still running (the runtime never runs two at once).
    #[error("a sample is already in flight")]
    Busy,
    /// The agent has shut down.
    #[error("the agent has shut down")]
    ShutDown,
    /// The sampler panicked; the message is the panic payload.
    #[error("the sampler panicked: {0}")]
    Panicked(String),
    /// Any other backend failure.
    #[error("GPU backend error: {0}")]
    Backend(#[source] BoxError),
}

impl SampleError {
    /// An [`SampleError::Unavailable`] without an underlying error.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::Unavailable { reason: reason.into(), source: None }
    }
}

/// A sampler that never reads anything: the stand-in for a backend that is compiled out.
#[derive(Debug, Clone)]
pub struct UnavailableSampler {
    reason: String,
}

impl UnavailableSampler {
    /// A sampler whose every sample fails with [`SampleError::Unavailable`] and `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Self { reason: reason.into() }
    }
}

impl Sampler for UnavailableSampler {
    fn name(&self) -> &str {
        "unavailable"
    }
    fn sample(&self, _: &SampleRequest) -> Result<Snapshot, SampleError> {
        Err(SampleError::unavailable(self.reason.clone()))
    }
}

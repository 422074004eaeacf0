//! The NVML backend. (Implemented in a later change; until then it reports "unavailable".)

use crate::sampler::{SampleError, SampleRequest, Sampler};
use crate::model::Snapshot;

/// Samples GPUs through NVML.
#[derive(Debug, Default)]
pub struct NvmlSampler {
    _private: (),
}

impl NvmlSampler {
    /// Loads NVML.
    ///
    /// # Errors
    /// Always [`SampleError::Unavailable`] for now.
    pub fn new() -> Result<Self, SampleError> {
        Err(SampleError::unavailable("the NVML backend is not implemented yet"))
    }
}

impl Sampler for NvmlSampler {
    fn name(&self) -> &str {
        "nvml"
    }
    fn sample(&self, _: &SampleRequest) -> Result<Snapshot, SampleError> {
        Err(SampleError::unavailable("the NVML backend is not implemented yet"))
    }
}

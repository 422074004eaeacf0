//! A `mockall` mock of the [`Sampler`](gpumon_core::Sampler) seam, for call-order tests.
//!
//! ```
//! use gpumon_core::{SampleError, SampleRequest, Sampler};
//! use gpumon_mock::MockSamplerSeam;
//!
//! let mut seam = MockSamplerSeam::new();
//! seam.expect_name().return_const("seam".to_owned());
//! seam.expect_sample().times(1).returning(|_| Err(SampleError::unavailable("scripted")));
//! assert!(seam.sample(&SampleRequest::default()).is_err());
//! assert_eq!(seam.name(), "seam");
//! ```
#![allow(missing_docs)] // mockall generates the expectation API.

use gpumon_core::{SampleError, SampleRequest, Snapshot};

mockall::mock! {
    /// A `mockall` mock of [`gpumon_core::Sampler`]: set expectations with `expect_sample()` /
    /// `expect_name()`, order them with [`mockall::Sequence`].
    pub SamplerSeam {}

    impl gpumon_core::Sampler for SamplerSeam {
        fn name(&self) -> &str;
        fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError>;
    }
}

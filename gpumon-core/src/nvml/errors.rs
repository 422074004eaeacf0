//! How NVML errors map onto gpumon's data model.

use nvml_wrapper::error::NvmlError;

use crate::model::FailureReason;

/// What one failed NVML call means for the sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The value is not available here (`NotSupported`, an old driver without the symbol, no
    /// data this interval): `None`, not an error.
    Absent,
    /// A per-metric failure: `None` plus a [`crate::MetricFailure`].
    Failure(FailureReason),
    /// The whole device is gone (`GpuLost`, `ResetRequired`, `Unknown`): the device is reported
    /// lost this tick and re-discovered later.
    Lost,
}

pub(crate) fn classify(e: &NvmlError) -> Outcome {
    match e {
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::NotFound | NvmlError::NoData => {
            Outcome::Absent
        }
        NvmlError::NoPermission => Outcome::Failure(FailureReason::NoPermission),
        NvmlError::Timeout => Outcome::Failure(FailureReason::Timeout),
        NvmlError::GpuLost | NvmlError::ResetRequired | NvmlError::Unknown => Outcome::Lost,
        other => Outcome::Failure(FailureReason::Other(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_nvml_errors() {
        assert_eq!(classify(&NvmlError::NotSupported), Outcome::Absent);
        assert_eq!(classify(&NvmlError::FailedToLoadSymbol("nvmlX".into())), Outcome::Absent);
        assert_eq!(classify(&NvmlError::NoPermission), Outcome::Failure(FailureReason::NoPermission));
        assert_eq!(classify(&NvmlError::GpuLost), Outcome::Lost);
        assert_eq!(classify(&NvmlError::ResetRequired), Outcome::Lost);
        assert_eq!(classify(&NvmlError::Unknown), Outcome::Lost);
        assert!(matches!(classify(&NvmlError::InvalidArg), Outcome::Failure(FailureReason::Other(_))));
    }
}

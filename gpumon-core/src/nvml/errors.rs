//! How NVML errors map onto gpumon's data model.

use nvml_wrapper::error::NvmlError;

use crate::model::FailureReason;

/// The [`FailureReason::Other`] message recorded for `NVML_ERROR_UNKNOWN` on a single value.
pub const UNKNOWN_ERROR: &str = "NVML unknown error";

/// What one failed NVML call means for the sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The value is not available here (`NotSupported`, an old driver without the symbol, no
    /// data this interval): `None`, not an error.
    Absent,
    /// A per-metric failure: `None` plus a [`crate::MetricFailure`]. `Unknown` is one of these:
    /// drivers return it for single fields ("[Unknown Error]") while the GPU is fine.
    Failure(FailureReason),
    /// The whole device is gone (`GpuLost`, `ResetRequired`): the device is reported lost this
    /// tick and re-discovered later.
    Lost,
}

/// Maps an error of a call that reads one value.
pub(crate) fn classify(e: &NvmlError) -> Outcome {
    match e {
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::NotFound | NvmlError::NoData => {
            Outcome::Absent
        }
        NvmlError::NoPermission => Outcome::Failure(FailureReason::NoPermission),
        NvmlError::Timeout => Outcome::Failure(FailureReason::Timeout),
        NvmlError::Unknown => Outcome::Failure(FailureReason::Other(UNKNOWN_ERROR.to_owned())),
        NvmlError::GpuLost | NvmlError::ResetRequired => Outcome::Lost,
        other => Outcome::Failure(FailureReason::Other(other.to_string())),
    }
}

/// Whether an error of an *identity* call (handle by index, UUID, name) means the device cannot
/// be reported: lost / reset required, and also `Unknown` — a GPU whose handle or UUID cannot
/// be read is not usable, whatever single fields might still answer.
pub(crate) fn identity_lost(e: &NvmlError) -> bool {
    classify(e) == Outcome::Lost || matches!(e, NvmlError::Unknown)
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
        // A single field's "[Unknown Error]" is a per-metric failure, not a lost GPU.
        assert_eq!(classify(&NvmlError::Unknown), Outcome::Failure(FailureReason::Other(UNKNOWN_ERROR.into())));
        assert!(matches!(classify(&NvmlError::InvalidArg), Outcome::Failure(FailureReason::Other(_))));
    }

    #[test]
    fn identity_calls_treat_unknown_as_unusable() {
        assert!(identity_lost(&NvmlError::GpuLost));
        assert!(identity_lost(&NvmlError::ResetRequired));
        assert!(identity_lost(&NvmlError::Unknown));
        assert!(!identity_lost(&NvmlError::NoPermission));
        assert!(!identity_lost(&NvmlError::NotSupported));
    }
}

//! The NVML C ABI as the fake implements it: return codes, constants and `#[repr(C)]` structs.
//!
//! Written from NVIDIA's `nvml.h` (13.x). Every struct here is checked against the header by
//! `tests/layout.rs` (C `sizeof`/`offsetof`, when a C compiler and the header are available) and
//! against `nvml-wrapper-sys`'s bindgen output (always).
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs, missing_debug_implementations)]

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};

/// `nvmlReturn_t`.
pub type nvmlReturn_t = c_uint;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_RESET_REQUIRED: nvmlReturn_t = 16;
pub const NVML_ERROR_NO_DATA: nvmlReturn_t = 21;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned long long.
pub const NVML_VALUE_NOT_AVAILABLE_ULL: c_ulonglong = u64::MAX;
/// "Not a MIG instance" in process structs.
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `NVML_STRUCT_VERSION(Memory, 2)`.
pub const nvmlMemory_v2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

// Clock types (`nvmlClockType_t`).
pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;

// Temperature sensors and thresholds.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
pub const NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: c_uint = 0;
pub const NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: c_uint = 1;
pub const NVML_TEMPERATURE_THRESHOLD_MEM_MAX: c_uint = 2;
pub const NVML_TEMPERATURE_THRESHOLD_GPU_MAX: c_uint = 3;

// ECC.
pub const NVML_MEMORY_ERROR_TYPE_CORRECTED: c_uint = 0;
pub const NVML_MEMORY_ERROR_TYPE_UNCORRECTED: c_uint = 1;
pub const NVML_VOLATILE_ECC: c_uint = 0;
pub const NVML_AGGREGATE_ECC: c_uint = 1;
pub const NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: c_uint = 0;
pub const NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: c_uint = 1;

// PCIe utilisation counters.
pub const NVML_PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const NVML_PCIE_UTIL_RX_BYTES: c_uint = 1;

// Sampling types (`nvmlSamplingType_t`).
pub const NVML_TOTAL_POWER_SAMPLES: c_uint = 0;
pub const NVML_GPU_UTILIZATION_SAMPLES: c_uint = 1;
pub const NVML_MEMORY_UTILIZATION_SAMPLES: c_uint = 2;
pub const NVML_ENC_UTILIZATION_SAMPLES: c_uint = 3;
pub const NVML_DEC_UTILIZATION_SAMPLES: c_uint = 4;
pub const NVML_PROCESSOR_CLK_SAMPLES: c_uint = 5;
pub const NVML_MEMORY_CLK_SAMPLES: c_uint = 6;

// Value types (`nvmlValueType_t`).
pub const NVML_VALUE_TYPE_DOUBLE: c_uint = 0;
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
pub const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

// Field ids.
pub const NVML_FI_DEV_MEMORY_TEMP: c_uint = 82;
pub const NVML_FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: c_uint = 140;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: c_uint = 141;
pub const NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: c_uint = 161;
pub const NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: c_uint = 162;
pub const NVML_FI_DEV_NVLINK_ERROR_DL_CRC: c_uint = 163;
pub const NVML_FI_DEV_NVLINK_GET_STATE: c_uint = 165;
pub const NVML_FI_DEV_NVLINK_GET_VERSION: c_uint = 166;
/// `scopeId` asking a per-link field for the sum over all links.
pub const NVML_SCOPE_ALL_LINKS: c_uint = c_uint::MAX;

/// `nvmlTemperature_v1_t` (`nvmlDeviceGetTemperatureV`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlTemperature_t {
    pub version: c_uint,
    pub sensorType: c_uint,
    pub temperature: c_int,
}
/// `NVML_STRUCT_VERSION(Temperature, 1)`.
pub const nvmlTemperature_v1: c_uint = std::mem::size_of::<nvmlTemperature_t>() as c_uint | (1 << 24);

// Events.
pub const nvmlEventTypeSingleBitEccError: c_ulonglong = 0x1;
pub const nvmlEventTypeDoubleBitEccError: c_ulonglong = 0x2;
pub const nvmlEventTypeXidCriticalError: c_ulonglong = 0x8;

// Architectures (`nvmlDeviceArchitecture_t`).
pub const NVML_DEVICE_ARCH_UNKNOWN: c_uint = 0xFFFF_FFFF;

// GPM.
pub const NVML_GPM_METRICS_GET_VERSION: c_uint = 1;
pub const NVML_GPM_SUPPORT_VERSION: c_uint = 1;
pub const NVML_GPM_METRIC_GRAPHICS_UTIL: c_uint = 1;
pub const NVML_GPM_METRIC_SM_UTIL: c_uint = 2;
pub const NVML_GPM_METRIC_SM_OCCUPANCY: c_uint = 3;
pub const NVML_GPM_METRIC_ANY_TENSOR_UTIL: c_uint = 5;
pub const NVML_GPM_METRIC_DRAM_BW_UTIL: c_uint = 10;

/// Opaque device handle target (`struct nvmlDevice_st`). The fake's handles point into a static
/// table of these.
#[repr(C)]
#[derive(Debug)]
pub struct nvmlDevice_st {
    pub(crate) slot: u32,
}
pub type nvmlDevice_t = *mut nvmlDevice_st;

/// Opaque event set (`struct nvmlEventSet_st`).
#[repr(C)]
pub struct nvmlEventSet_st {
    _private: [u8; 0],
}
pub type nvmlEventSet_t = *mut nvmlEventSet_st;

/// Opaque GPM sample (`struct nvmlGpmSample_st`).
#[repr(C)]
pub struct nvmlGpmSample_st {
    _private: [u8; 0],
}
pub type nvmlGpmSample_t = *mut nvmlGpmSample_st;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

/// `nvmlProcessInfo_v1_t` (the unversioned getters).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` = `nvmlProcessInfo_t` (the `_v2` and `_v3` getters).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union nvmlValue_t {
    pub dVal: f64,
    pub siVal: c_int,
    pub uiVal: c_uint,
    pub ulVal: std::os::raw::c_ulong,
    pub ullVal: c_ulonglong,
    pub sllVal: std::os::raw::c_longlong,
    pub usVal: std::os::raw::c_ushort,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlSample_t {
    pub timeStamp: c_ulonglong,
    pub sampleValue: nvmlValue_t,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: std::os::raw::c_longlong,
    pub latencyUsec: std::os::raw::c_longlong,
    pub valueType: c_uint,
    pub nvmlReturn: nvmlReturn_t,
    pub value: nvmlValue_t,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlEventData_t {
    pub device: nvmlDevice_t,
    pub eventType: c_ulonglong,
    pub eventData: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpmMetricInfo_t {
    pub shortName: *mut c_char,
    pub longName: *mut c_char,
    pub unit: *mut c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpmMetric_t {
    pub metricId: c_uint,
    pub nvmlReturn: nvmlReturn_t,
    pub value: f64,
    pub metricInfo: nvmlGpmMetricInfo_t,
}

/// The fixed head of `nvmlGpmMetricsGet_t`; `metrics[]` follows. Its declared length differs
/// between header versions (210 in 12.x/13.0, 477 in 13.5), so the fake reads only `numMetrics`
/// entries and never relies on the array's size.
#[repr(C)]
#[derive(Debug)]
pub struct nvmlGpmMetricsGetHead_t {
    pub version: c_uint,
    pub numMetrics: c_uint,
    pub sample1: nvmlGpmSample_t,
    pub sample2: nvmlGpmSample_t,
    pub metrics: [nvmlGpmMetric_t; 0],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlGpmSupport_t {
    pub version: c_uint,
    pub isSupportedDevice: c_uint,
}

/// `nvmlErrorString`'s messages.
pub fn error_string(code: nvmlReturn_t) -> &'static std::ffi::CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"Ecc is not supported",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    }
}

//! Getters that fill caller buffers: processes, process utilisation, driver samples, retired
//! pages, field values.

use std::os::raw::{c_int, c_uint, c_ulonglong};

use gpumon_core::{DeviceSample, FailureReason, Family, NvlinkLink, ProcessSample, WindowStats};

use super::{out, out_list, some};
use crate::ffi::*;
use crate::state::{with_device, Ret};
use crate::units;

fn process_infos(name: &'static str, device: nvmlDevice_t, graphics: bool) -> Result<Vec<nvmlProcessInfo_t>, Ret> {
    with_device(name, device, Some(Family::Processes), |_, d| {
        let (gi, ci) = match &d.info.mig {
            Some(m) => (m.gpu_instance_id, m.compute_instance_id),
            None => (NO_INSTANCE, NO_INSTANCE),
        };
        // The model does not tell compute from graphics contexts: every process is a compute one.
        if graphics {
            return Ok(Vec::new());
        }
        Ok(d.sample
            .processes
            .iter()
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.memory_used.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
                gpuInstanceId: gi,
                computeInstanceId: ci,
            })
            .collect())
    })
}

unsafe fn procs_v1(
    name: &'static str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
    graphics: bool,
) -> Result<(), Ret> {
    let v: Vec<nvmlProcessInfo_v1_t> = process_infos(name, device, graphics)?
        .into_iter()
        .map(|p| nvmlProcessInfo_v1_t { pid: p.pid, usedGpuMemory: p.usedGpuMemory })
        .collect();
    unsafe { out_list(count, infos, &v) }
}

unsafe fn procs_v2(
    name: &'static str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    graphics: bool,
) -> Result<(), Ret> {
    let v = process_infos(name, device, graphics)?;
    unsafe { out_list(count, infos, &v) }
}

fn has_util(p: &ProcessSample) -> bool {
    p.sm_utilization.is_some()
        || p.memory_utilization.is_some()
        || p.encoder_utilization.is_some()
        || p.decoder_utilization.is_some()
}

fn window_of(s: &gpumon_core::Windows, kind: c_uint) -> Result<(Option<WindowStats>, f64), Ret> {
    Ok(match kind {
        NVML_TOTAL_POWER_SAMPLES => (s.power_watts, 1000.0),
        NVML_GPU_UTILIZATION_SAMPLES => (s.gpu_utilization, 100.0),
        NVML_MEMORY_UTILIZATION_SAMPLES => (s.memory_utilization, 100.0),
        NVML_PROCESSOR_CLK_SAMPLES => (s.sm_clock, 1e-6),
        NVML_MEMORY_CLK_SAMPLES => (s.memory_clock, 1e-6),
        NVML_ENC_UTILIZATION_SAMPLES | NVML_DEC_UTILIZATION_SAMPLES => (None, 100.0),
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    })
}

unsafe fn retired(
    name: &'static str,
    device: nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<(), Ret> {
    let (n, slot, ts) = with_device(name, device, Some(Family::RetiredPages), |fake, d| {
        let n = match cause {
            NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => some(d.sample.ecc.retired_pages_single_bit)?,
            NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => some(d.sample.ecc.retired_pages_double_bit)?,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        Ok((n.min(crate::MAX_RETIRED_PAGES) as usize, d.slot as u64, fake.tick_start_us(0) / 1_000_000))
    })?;
    let addrs: Vec<c_ulonglong> = (0..n as u64).map(|i| (slot << 40) | (u64::from(cause) << 32) | (i << 12)).collect();
    let cap = unsafe { super::read(count) }?;
    unsafe { out_list(count, addresses, &addrs) }?;
    if !timestamps.is_null() && n > 0 && cap as usize >= n {
        let stamps = vec![ts; n];
        unsafe { std::ptr::copy_nonoverlapping(stamps.as_ptr(), timestamps, n) };
    }
    Ok(())
}

nvml_export! {
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        unsafe { procs_v1(NAME, device, info_count, infos, false) }
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2 | nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, info_count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        unsafe { procs_v2(NAME, device, info_count, infos, false) }
    }
    // The model has no graphics or MPS contexts (every process is a plain compute one): both
    // lists are empty.
    fn nvmlDeviceGetGraphicsRunningProcesses | nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        unsafe { procs_v1(NAME, device, info_count, infos, true) }
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v2
        | nvmlDeviceGetGraphicsRunningProcesses_v3
        | nvmlDeviceGetMPSComputeRunningProcesses_v2
        | nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, info_count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        unsafe { procs_v2(NAME, device, info_count, infos, true) }
    }

    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t, process_samples_count: *mut c_uint, last_seen_time_stamp: c_ulonglong) {
        let v = with_device(NAME, device, Some(Family::Processes), |fake, d| {
            let ts = fake.tick_start_us(d.tick) + fake.tick_len_us() / 2;
            if ts <= last_seen_time_stamp {
                return Ok(Vec::new());
            }
            let pct = |v: Option<f64>| units::percent(v.unwrap_or(0.0));
            Ok(d.sample
                .processes
                .iter()
                .filter(|p| has_util(p))
                .map(|p| nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: ts,
                    smUtil: pct(p.sm_utilization),
                    memUtil: pct(p.memory_utilization),
                    encUtil: pct(p.encoder_utilization),
                    decUtil: pct(p.decoder_utilization),
                })
                .collect::<Vec<_>>())
        })?;
        if v.is_empty() {
            if process_samples_count.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            return Err(NVML_ERROR_NOT_FOUND);
        }
        unsafe { out_list(process_samples_count, utilization, &v) }
    }

    fn nvmlDeviceGetSamples(device: nvmlDevice_t, kind: c_uint, last_seen_time_stamp: c_ulonglong, sample_val_type: *mut c_uint, sample_count: *mut c_uint, samples: *mut nvmlSample_t) {
        if sample_val_type.is_null() || sample_count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let v = with_device(NAME, device, Some(Family::HighResolution), |fake, d| {
            let (stats, scale) = window_of(&d.sample.windows, kind)?;
            let stats = some(stats)?;
            let values = units::window_values(&stats, scale);
            let start = fake.tick_start_us(d.tick);
            let step = fake.tick_len_us() / (values.len() as u64 + 1);
            Ok(values
                .into_iter()
                .enumerate()
                .map(|(i, v)| nvmlSample_t { timeStamp: start + step * (i as u64 + 1), sampleValue: nvmlValue_t { dVal: v } })
                .filter(|s| s.timeStamp > last_seen_time_stamp)
                .collect::<Vec<_>>())
        })?;
        if v.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        unsafe { out(sample_val_type, NVML_VALUE_TYPE_DOUBLE)? };
        if samples.is_null() {
            return unsafe { out(sample_count, v.len() as c_uint) };
        }
        let cap = unsafe { super::read(sample_count) }? as usize;
        let n = cap.min(v.len());
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), samples, n);
            out(sample_count, n as c_uint)
        }
    }

    fn nvmlDeviceGetRetiredPages(device: nvmlDevice_t, cause: c_uint, page_count: *mut c_uint, addresses: *mut c_ulonglong) {
        unsafe { retired(NAME, device, cause, page_count, addresses, std::ptr::null_mut()) }
    }
    fn nvmlDeviceGetRetiredPages_v2(device: nvmlDevice_t, cause: c_uint, page_count: *mut c_uint, addresses: *mut c_ulonglong, timestamps: *mut c_ulonglong) {
        unsafe { retired(NAME, device, cause, page_count, addresses, timestamps) }
    }

    fn nvmlDeviceGetFieldValues(device: nvmlDevice_t, values_count: c_int, values: *mut nvmlFieldValue_t) {
        if values.is_null() || values_count < 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let (sample, now) = with_device(NAME, device, None, |fake, d| Ok((d.sample.clone(), fake.tick_start_us(d.tick))))?;
        for i in 0..values_count as usize {
            // SAFETY: the caller passes `values_count` entries.
            let fv = unsafe { &mut *values.add(i) };
            fv.timestamp = now as i64;
            fv.latencyUsec = 0;
            match field_value(&sample, fv.fieldId, fv.scopeId) {
                Ok(FieldValue::U32(v)) => {
                    fv.valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                    fv.value = nvmlValue_t { ullVal: 0 };
                    fv.value.uiVal = v;
                    fv.nvmlReturn = NVML_SUCCESS;
                }
                Ok(FieldValue::U64(v)) => {
                    fv.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    fv.value = nvmlValue_t { ullVal: v };
                    fv.nvmlReturn = NVML_SUCCESS;
                }
                Err(e) => fv.nvmlReturn = e,
            }
        }
        Ok(())
    }
}

enum FieldValue {
    U32(c_uint),
    U64(c_ulonglong),
}

/// One field of `nvmlDeviceGetFieldValues`: memory temperature, and the NVLink fields (per link
/// by `scopeId`, or summed over the links with `scopeId = UINT_MAX`). A family the model denies
/// reads as that family's error; anything else is `NOT_SUPPORTED`.
fn field_value(s: &DeviceSample, field: c_uint, scope: c_uint) -> Result<FieldValue, Ret> {
    let denied = |family: Family| match s.errors.iter().find(|f| f.family == family) {
        Some(f) => Err(match f.reason {
            FailureReason::NoPermission => NVML_ERROR_NO_PERMISSION,
            FailureReason::Timeout => NVML_ERROR_TIMEOUT,
            _ => NVML_ERROR_UNKNOWN,
        }),
        None => Ok(()),
    };
    if field == NVML_FI_DEV_MEMORY_TEMP {
        denied(Family::Temperature)?;
        return some(s.temperature.memory).map(|t| FieldValue::U32(units::celsius(t)));
    }
    let counter: fn(&NvlinkLink) -> Option<u64> = match field {
        NVML_FI_DEV_NVLINK_LINK_COUNT => {
            denied(Family::Nvlink)?;
            let nv = some(s.nvlink.as_ref())?;
            return Ok(FieldValue::U32(nv.links.len() as c_uint));
        }
        NVML_FI_DEV_NVLINK_GET_STATE | NVML_FI_DEV_NVLINK_GET_VERSION => {
            denied(Family::Nvlink)?;
            let nv = some(s.nvlink.as_ref())?;
            let l = nv.links.iter().find(|l| l.link == scope).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            return if field == NVML_FI_DEV_NVLINK_GET_STATE {
                Ok(FieldValue::U32(c_uint::from(l.is_up())))
            } else {
                some(l.version).map(FieldValue::U32)
            };
        }
        // Throughput fields count KiB; the model's byte counters are whole KiB.
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX | NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX => {
            |l| l.tx_bytes.map(|b| b / 1024)
        }
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX | NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX => {
            |l| l.rx_bytes.map(|b| b / 1024)
        }
        NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY => |l| l.replay_errors,
        NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY => |l| l.recovery_errors,
        NVML_FI_DEV_NVLINK_ERROR_DL_CRC => |l| l.crc_errors,
        _ => return Err(NVML_ERROR_NOT_SUPPORTED),
    };
    denied(Family::Nvlink)?;
    let nv = some(s.nvlink.as_ref())?;
    if scope == NVML_SCOPE_ALL_LINKS {
        return some(nv.links.iter().filter_map(counter).reduce(u64::saturating_add)).map(FieldValue::U64);
    }
    let l = nv.links.iter().find(|l| l.link == scope).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    some(counter(l)).map(FieldValue::U64)
}

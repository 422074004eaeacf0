//! Per-device scalar getters: identity, utilisation, memory, temperature, power, clocks, fan,
//! P-state, clock-event reasons, PCIe, ECC.

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};

use gpumon_core::{ClockEventReasons, Family};

use super::{out, out_str, read, some};
use crate::ffi::*;
use crate::state::{with_device, Dev, Ret};
use crate::units;

fn get<T>(
    name: &'static str,
    device: nvmlDevice_t,
    family: Option<Family>,
    f: impl FnOnce(&Dev) -> Result<T, Ret>,
) -> Result<T, Ret> {
    with_device(name, device, family, |_, d| f(d))
}

/// `domain:bus:device.function` → (domain, bus, device).
fn parse_bus_id(id: &str) -> (u32, u32, u32) {
    let mut it = id.split([':', '.']);
    let mut next = || it.next().and_then(|p| u32::from_str_radix(p, 16).ok()).unwrap_or(0);
    (next(), next(), next())
}

fn pci_info(d: &Dev) -> Result<nvmlPciInfo_t, Ret> {
    let bus_id = some(d.info.pci_bus_id.clone())?;
    let (domain, bus, device) = parse_bus_id(&bus_id);
    let mut p = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain,
        bus,
        device,
        pciDeviceId: d.extras.pci_device_id,
        pciSubSystemId: d.extras.pci_device_id.rotate_left(16),
        busId: [0; 32],
    };
    let legacy = format!("{domain:04X}:{bus:02X}:{device:02X}.0");
    for (dst, src) in p.busIdLegacy.iter_mut().take(15).zip(legacy.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in p.busId.iter_mut().take(31).zip(bus_id.bytes()) {
        *dst = src as c_char;
    }
    Ok(p)
}

fn clock_of(c: &gpumon_core::Clocks, kind: c_uint) -> Result<Option<f64>, Ret> {
    Ok(match kind {
        NVML_CLOCK_GRAPHICS => c.graphics,
        NVML_CLOCK_SM => c.sm,
        NVML_CLOCK_MEM => c.memory,
        NVML_CLOCK_VIDEO => c.video,
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    })
}

fn utilization(d: &Dev) -> Result<nvmlUtilization_t, Ret> {
    let u = &d.sample.utilization;
    let gpu = some(u.gpu)?;
    Ok(nvmlUtilization_t { gpu: units::percent(gpu), memory: units::percent(u.memory.unwrap_or(0.0)) })
}

fn memory(d: &Dev) -> Result<(u64, u64, u64, u64), Ret> {
    let m = &d.sample.memory;
    let total = some(m.total)?;
    Ok((total, m.reserved.unwrap_or(0), m.free.unwrap_or(0), m.used.unwrap_or(0)))
}

fn codec(
    name: &'static str,
    device: nvmlDevice_t,
    util: *mut c_uint,
    period: *mut c_uint,
    pick: fn(&Dev) -> Option<f64>,
) -> Result<(), Ret> {
    let v = get(name, device, Some(Family::Utilization), |d| some(pick(d)).map(units::percent))?;
    unsafe {
        out(util, v)?;
        out(period, 167_000)
    }
}

fn fan(d: &Dev) -> Result<c_uint, Ret> {
    some(d.sample.fan_speed).map(units::percent)
}

fn pstate(d: &Dev) -> Result<c_uint, Ret> {
    some(d.sample.performance_state).map(|p| p.min(15))
}

fn reasons(d: &Dev) -> Result<c_ulonglong, Ret> {
    some(d.sample.clock_event_reasons).map(|r| r.0)
}

const SUPPORTED_REASONS: c_ulonglong = {
    let mut all = 0;
    let mut i = 0;
    while i < ClockEventReasons::ALL.len() {
        all |= ClockEventReasons::ALL[i].0;
        i += 1;
    }
    all
};

nvml_export! {
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let n = get(NAME, device, None, |d| Ok(d.info.name.clone()))?;
        unsafe { out_str(name, length, &n) }
    }
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let u = get(NAME, device, None, |d| Ok(d.info.uuid.clone()))?;
        unsafe { out_str(uuid, length, &u) }
    }
    fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        let s = get(NAME, device, None, |d| some(d.info.serial.clone()))?;
        unsafe { out_str(serial, length, &s) }
    }
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        let i = get(NAME, device, None, |d| Ok(d.info.index))?;
        unsafe { out(index, i) }
    }
    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) {
        let i = get(NAME, device, None, |d| if d.info.mig.is_some() { Err(NVML_ERROR_NOT_SUPPORTED) } else { Ok(d.info.index) })?;
        unsafe { out(minor, i) }
    }
    fn nvmlDeviceGetPciInfo | nvmlDeviceGetPciInfo_v2 | nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let p = get(NAME, device, None, pci_info)?;
        unsafe { out(pci, p) }
    }
    fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) {
        let a = get(NAME, device, None, |d| {
            Ok(d.info.architecture.as_deref().and_then(units::architecture_code).unwrap_or(NVML_DEVICE_ARCH_UNKNOWN))
        })?;
        unsafe { out(arch, a) }
    }
    fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        let (a, b) = get(NAME, device, None, |d| Ok(d.extras.compute_capability))?;
        unsafe {
            out(major, a as c_int)?;
            out(minor, b as c_int)
        }
    }

    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization_out: *mut nvmlUtilization_t) {
        let u = get(NAME, device, Some(Family::Utilization), utilization)?;
        unsafe { out(utilization_out, u) }
    }
    fn nvmlDeviceGetEncoderUtilization(device: nvmlDevice_t, utilization: *mut c_uint, sampling_period_us: *mut c_uint) {
        codec(NAME, device, utilization, sampling_period_us, |d| d.sample.utilization.encoder)
    }
    fn nvmlDeviceGetDecoderUtilization(device: nvmlDevice_t, utilization: *mut c_uint, sampling_period_us: *mut c_uint) {
        codec(NAME, device, utilization, sampling_period_us, |d| d.sample.utilization.decoder)
    }

    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, mem: *mut nvmlMemory_t) {
        let (total, reserved, free, used) = get(NAME, device, Some(Family::Memory), memory)?;
        // v1 counts reserved memory as used.
        unsafe { out(mem, nvmlMemory_t { total, free, used: used + reserved }) }
    }
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) {
        let version = unsafe { read(std::ptr::addr_of!((*mem).version)) }?;
        if version != nvmlMemory_v2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, free, used) = get(NAME, device, Some(Family::Memory), memory)?;
        unsafe { out(mem, nvmlMemory_v2_t { version, total, reserved, free, used }) }
    }

    fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensor: c_uint, temp: *mut c_uint) {
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let t = get(NAME, device, Some(Family::Temperature), |d| some(d.sample.temperature.gpu).map(units::celsius))?;
        unsafe { out(temp, t) }
    }
    fn nvmlDeviceGetTemperatureThreshold(device: nvmlDevice_t, threshold: c_uint, temp: *mut c_uint) {
        let t = get(NAME, device, None, |d| {
            let v = match threshold {
                NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => d.info.temperature_shutdown_celsius,
                NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => d.info.temperature_slowdown_celsius,
                NVML_TEMPERATURE_THRESHOLD_MEM_MAX | NVML_TEMPERATURE_THRESHOLD_GPU_MAX => None,
                _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
            };
            some(v).map(units::celsius)
        })?;
        unsafe { out(temp, t) }
    }

    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) {
        let p = get(NAME, device, Some(Family::Power), |d| some(d.sample.power.usage_watts).map(units::milliwatts))?;
        unsafe { out(power, p) }
    }
    fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        let p = get(NAME, device, Some(Family::Power), |d| some(d.sample.power.limit_watts).map(units::milliwatts))?;
        unsafe { out(limit, p) }
    }
    fn nvmlDeviceGetPowerManagementLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        let p = get(NAME, device, Some(Family::Power), |d| some(d.sample.power.limit_watts).map(units::milliwatts))?;
        unsafe { out(limit, p) }
    }
    fn nvmlDeviceGetPowerManagementDefaultLimit(device: nvmlDevice_t, default_limit: *mut c_uint) {
        let p = get(NAME, device, None, |d| some(d.info.power_limit_default_watts).map(units::milliwatts))?;
        unsafe { out(default_limit, p) }
    }
    fn nvmlDeviceGetPowerManagementLimitConstraints(device: nvmlDevice_t, min_limit: *mut c_uint, max_limit: *mut c_uint) {
        let (a, b) = get(NAME, device, None, |d| {
            Ok((some(d.info.power_limit_min_watts)?, some(d.info.power_limit_max_watts)?))
        })?;
        unsafe {
            out(min_limit, units::milliwatts(a))?;
            out(max_limit, units::milliwatts(b))
        }
    }
    fn nvmlDeviceGetTotalEnergyConsumption(device: nvmlDevice_t, energy: *mut c_ulonglong) {
        let e = get(NAME, device, Some(Family::Energy), |d| some(d.sample.power.energy_joules).map(units::millijoules))?;
        unsafe { out(energy, e) }
    }

    fn nvmlDeviceGetClockInfo(device: nvmlDevice_t, kind: c_uint, clock: *mut c_uint) {
        let c = get(NAME, device, Some(Family::Clocks), |d| some(clock_of(&d.sample.clocks, kind)?).map(units::megahertz))?;
        unsafe { out(clock, c) }
    }
    fn nvmlDeviceGetMaxClockInfo(device: nvmlDevice_t, kind: c_uint, clock: *mut c_uint) {
        let c = get(NAME, device, None, |d| some(clock_of(&d.info.max_clocks, kind)?).map(units::megahertz))?;
        unsafe { out(clock, c) }
    }
    fn nvmlDeviceGetClock(device: nvmlDevice_t, kind: c_uint, clock_id: c_uint, clock_mhz: *mut c_uint) {
        let c = get(NAME, device, Some(Family::Clocks), |d| match clock_id {
            0 => some(clock_of(&d.sample.clocks, kind)?).map(units::megahertz),
            3 => some(clock_of(&d.info.max_clocks, kind)?).map(units::megahertz),
            1 | 2 => Err(NVML_ERROR_NOT_SUPPORTED),
            _ => Err(NVML_ERROR_INVALID_ARGUMENT),
        })?;
        unsafe { out(clock_mhz, c) }
    }

    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) {
        let f = get(NAME, device, Some(Family::Fan), fan)?;
        unsafe { out(speed, f) }
    }
    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan_index: c_uint, speed: *mut c_uint) {
        let f = get(NAME, device, Some(Family::Fan), |d| if fan_index == 0 { fan(d) } else { Err(NVML_ERROR_INVALID_ARGUMENT) })?;
        unsafe { out(speed, f) }
    }
    fn nvmlDeviceGetNumFans(device: nvmlDevice_t, num_fans: *mut c_uint) {
        let n = get(NAME, device, Some(Family::Fan), |d| fan(d).map(|_| 1))?;
        unsafe { out(num_fans, n) }
    }

    fn nvmlDeviceGetPerformanceState | nvmlDeviceGetPowerState(device: nvmlDevice_t, p_state: *mut c_uint) {
        let p = get(NAME, device, Some(Family::PerformanceState), pstate)?;
        unsafe { out(p_state, p) }
    }

    fn nvmlDeviceGetCurrentClocksEventReasons | nvmlDeviceGetCurrentClocksThrottleReasons(device: nvmlDevice_t, clocks_event_reasons: *mut c_ulonglong) {
        let r = get(NAME, device, Some(Family::ClockEvents), reasons)?;
        unsafe { out(clocks_event_reasons, r) }
    }
    fn nvmlDeviceGetSupportedClocksEventReasons | nvmlDeviceGetSupportedClocksThrottleReasons(device: nvmlDevice_t, supported: *mut c_ulonglong) {
        get(NAME, device, Some(Family::ClockEvents), reasons)?;
        unsafe { out(supported, SUPPORTED_REASONS) }
    }

    fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, curr_link_gen: *mut c_uint) {
        let v = get(NAME, device, Some(Family::PcieLink), |d| some(d.sample.pcie.link_generation))?;
        unsafe { out(curr_link_gen, v) }
    }
    fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, curr_link_width: *mut c_uint) {
        let v = get(NAME, device, Some(Family::PcieLink), |d| some(d.sample.pcie.link_width))?;
        unsafe { out(curr_link_width, v) }
    }
    fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, max_link_gen: *mut c_uint) {
        let v = get(NAME, device, None, |d| some(d.info.pcie_max_link_generation))?;
        unsafe { out(max_link_gen, v) }
    }
    fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, max_link_width: *mut c_uint) {
        let v = get(NAME, device, None, |d| some(d.info.pcie_max_link_width))?;
        unsafe { out(max_link_width, v) }
    }
    fn nvmlDeviceGetPcieReplayCounter(device: nvmlDevice_t, value: *mut c_uint) {
        let v = get(NAME, device, Some(Family::PcieLink), |d| some(d.sample.pcie.replays))?;
        unsafe { out(value, v.min(u64::from(u32::MAX)) as c_uint) }
    }
    fn nvmlDeviceGetPcieThroughput(device: nvmlDevice_t, counter: c_uint, value: *mut c_uint) {
        let v = get(NAME, device, Some(Family::PcieThroughput), |d| {
            let p = &d.sample.pcie;
            let bps = match counter {
                NVML_PCIE_UTIL_TX_BYTES => p.tx_bytes_per_second,
                NVML_PCIE_UTIL_RX_BYTES => p.rx_bytes_per_second,
                _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
            };
            some(bps).map(units::kilobytes_per_second)
        })?;
        unsafe { out(value, v) }
    }

    fn nvmlDeviceGetEccMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        let on = get(NAME, device, Some(Family::Ecc), |d| Ok(c_uint::from(d.sample.ecc.corrected.is_some() || d.sample.ecc.uncorrected.is_some())))?;
        if on == 0 {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        unsafe {
            out(current, on)?;
            out(pending, on)
        }
    }
    fn nvmlDeviceGetTotalEccErrors(device: nvmlDevice_t, error_type: c_uint, counter_type: c_uint, ecc_counts: *mut c_ulonglong) {
        let v = get(NAME, device, Some(Family::Ecc), |d| {
            if counter_type != NVML_VOLATILE_ECC && counter_type != NVML_AGGREGATE_ECC {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            match error_type {
                NVML_MEMORY_ERROR_TYPE_CORRECTED => some(d.sample.ecc.corrected),
                NVML_MEMORY_ERROR_TYPE_UNCORRECTED => some(d.sample.ecc.uncorrected),
                _ => Err(NVML_ERROR_INVALID_ARGUMENT),
            }
        })?;
        unsafe { out(ecc_counts, v) }
    }
    fn nvmlDeviceGetRetiredPagesPendingStatus(device: nvmlDevice_t, is_pending: *mut c_uint) {
        let v = get(NAME, device, Some(Family::RetiredPages), |d| some(d.sample.ecc.retired_pages_pending))?;
        unsafe { out(is_pending, c_uint::from(v)) }
    }
    fn nvmlDeviceGetRemappedRows(device: nvmlDevice_t, corr_rows: *mut c_uint, unc_rows: *mut c_uint, is_pending: *mut c_uint, failure_occurred: *mut c_uint) {
        let e = get(NAME, device, Some(Family::RemappedRows), |d| {
            let e = d.sample.ecc;
            if e.remapped_rows_correctable.is_none()
                && e.remapped_rows_uncorrectable.is_none()
                && e.remapped_rows_pending.is_none()
                && e.remapped_rows_failure.is_none()
            {
                return Err(NVML_ERROR_NOT_SUPPORTED);
            }
            Ok(e)
        })?;
        let n = |v: Option<u64>| v.unwrap_or(0).min(u64::from(u32::MAX)) as c_uint;
        unsafe {
            out(corr_rows, n(e.remapped_rows_correctable))?;
            out(unc_rows, n(e.remapped_rows_uncorrectable))?;
            out(is_pending, c_uint::from(e.remapped_rows_pending.unwrap_or(false)))?;
            out(failure_occurred, c_uint::from(e.remapped_rows_failure.unwrap_or(false)))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bus_id_parses() {
        assert_eq!(super::parse_bus_id("00000000:18:00.0"), (0, 0x18, 0));
        assert_eq!(super::parse_bus_id("0001:AF:1f.0"), (1, 0xAF, 0x1f));
    }
}

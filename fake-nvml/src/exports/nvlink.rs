//! NVLink (per-link state, version, remote end, error counters — the field values are in
//! `buffers.rs`) and the newer / versioned mode getters current clients call: temperature via
//! `nvmlDeviceGetTemperatureV`, persistence mode, display mode / active, compute mode.

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};

use gpumon_core::{Family, NvlinkLink};

use super::{out, read, some};
use crate::ffi::*;
use crate::state::{with_device, Dev, Ret};
use crate::units;

/// `NVML_NVLINK_ERROR_DL_*` counters of `nvmlDeviceGetNvLinkErrorCounter`.
const DL_REPLAY: c_uint = 0;
const DL_RECOVERY: c_uint = 1;
const DL_CRC_FLIT: c_uint = 2;
const DL_CRC_DATA: c_uint = 3;

/// Link `link` of a device: `NOT_SUPPORTED` without NVLink, `INVALID_ARGUMENT` past its links.
fn link_of(d: &Dev, link: c_uint) -> Result<NvlinkLink, Ret> {
    let nv = d.sample.nvlink.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    nv.links.iter().find(|l| l.link == link).cloned().ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn link(name: &'static str, device: nvmlDevice_t, family: Option<Family>, link: c_uint) -> Result<NvlinkLink, Ret> {
    with_device(name, device, family, |_, d| link_of(d, link))
}

/// `pciInfo` of a remote end, from its bus id.
fn remote_pci(bus_id: &str) -> nvmlPciInfo_t {
    let mut it = bus_id.split([':', '.']);
    let mut next = || it.next().and_then(|p| u32::from_str_radix(p, 16).ok()).unwrap_or(0);
    let (domain, bus, device) = (next(), next(), next());
    let mut p =
        nvmlPciInfo_t { busIdLegacy: [0; 16], domain, bus, device, pciDeviceId: 0, pciSubSystemId: 0, busId: [0; 32] };
    let legacy = format!("{domain:04X}:{bus:02X}:{device:02X}.0");
    for (dst, src) in p.busIdLegacy.iter_mut().take(15).zip(legacy.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in p.busId.iter_mut().take(31).zip(bus_id.bytes()) {
        *dst = src as c_char;
    }
    p
}

nvml_export! {
    fn nvmlDeviceGetNvLinkState(device: nvmlDevice_t, link_id: c_uint, is_active: *mut c_uint) {
        let l = link(NAME, device, Some(Family::Nvlink), link_id)?;
        unsafe { out(is_active, c_uint::from(l.is_up())) }
    }
    fn nvmlDeviceGetNvLinkVersion(device: nvmlDevice_t, link_id: c_uint, version: *mut c_uint) {
        let v = some(link(NAME, device, None, link_id)?.version)?;
        unsafe { out(version, v) }
    }
    fn nvmlDeviceGetNvLinkCapability(device: nvmlDevice_t, link_id: c_uint, capability: c_uint, cap_result: *mut c_uint) {
        link(NAME, device, None, link_id)?;
        // P2P, P2P atomics and "valid" — what an SXM GPU's links report; no sysmem access or SLI.
        let v = match capability {
            0 | 2 | 5 => 1,
            1 | 3 | 4 => 0,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        unsafe { out(cap_result, v) }
    }
    fn nvmlDeviceGetNvLinkRemotePciInfo | nvmlDeviceGetNvLinkRemotePciInfo_v2(device: nvmlDevice_t, link_id: c_uint, pci: *mut nvmlPciInfo_t) {
        let id = some(link(NAME, device, None, link_id)?.remote_pci_bus_id)?;
        unsafe { out(pci, remote_pci(&id)) }
    }
    fn nvmlDeviceGetNvLinkRemoteDeviceType(device: nvmlDevice_t, link_id: c_uint, kind: *mut c_uint) {
        let t = some(link(NAME, device, None, link_id)?.remote_device_type)?;
        unsafe { out(kind, t.nvml_code()) }
    }
    fn nvmlDeviceGetNvLinkErrorCounter(device: nvmlDevice_t, link_id: c_uint, counter: c_uint, value: *mut c_ulonglong) {
        let l = link(NAME, device, Some(Family::Nvlink), link_id)?;
        let v = match counter {
            DL_REPLAY => l.replay_errors,
            DL_RECOVERY => l.recovery_errors,
            DL_CRC_FLIT => l.crc_errors,
            // The model counts CRC errors once (flit level); data-CRC errors stay 0.
            DL_CRC_DATA => l.crc_errors.map(|_| 0),
            4 => None,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        unsafe { out(value, some(v)?) }
    }

    fn nvmlDeviceGetTemperatureV(device: nvmlDevice_t, temperature: *mut nvmlTemperature_t) {
        let t = unsafe { read(temperature) }?;
        if t.version != nvmlTemperature_v1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if t.sensorType != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let c = with_device(NAME, device, Some(Family::Temperature), |_, d| some(d.sample.temperature.gpu).map(units::celsius))?;
        unsafe { out(temperature, nvmlTemperature_t { temperature: c as c_int, ..t }) }
    }
    fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut c_uint) {
        // Datacenter hosts run nvidia-persistenced; a GeForce desktop does not.
        let on = with_device(NAME, device, None, |_, d| Ok(c_uint::from(!d.extras.geforce)))?;
        unsafe { out(mode, on) }
    }
    fn nvmlDeviceGetDisplayMode(device: nvmlDevice_t, display: *mut c_uint) {
        let on = with_device(NAME, device, None, |_, d| Ok(c_uint::from(d.extras.geforce && d.info.mig.is_none())))?;
        unsafe { out(display, on) }
    }
    fn nvmlDeviceGetDisplayActive(device: nvmlDevice_t, is_active: *mut c_uint) {
        // Headless: no display is attached to any fake GPU.
        with_device(NAME, device, None, |_, _| Ok(()))?;
        unsafe { out(is_active, 0) }
    }
    fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) {
        // NVML_COMPUTEMODE_DEFAULT: several contexts may share the GPU.
        with_device(NAME, device, None, |_, _| Ok(()))?;
        unsafe { out(mode, 0) }
    }
}

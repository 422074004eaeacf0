//! Init/shutdown, system queries, device enumeration.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint};

use super::{out, out_str};
use crate::ffi::*;
use crate::state::{handle_of, lock, Ret};

fn init() -> Result<(), Ret> {
    lock().init()
}

fn count() -> Result<c_uint, Ret> {
    let mut g = lock();
    let tick = g.tick();
    let fake = g.fake_mut()?;
    if fake.fleet.unavailable(tick) {
        return Err(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    let n = fake.physical.len() as c_uint;
    // A scripted hang blocks the first enumeration of its tick (without holding the lock).
    if let Some(d) = fake.fleet.hang(tick).filter(|_| fake.hung_tick != Some(tick)) {
        fake.hung_tick = Some(tick);
        drop(g);
        std::thread::sleep(d);
    }
    Ok(n)
}

fn by_index(name: &'static str, index: c_uint, device: *mut nvmlDevice_t) -> Result<(), Ret> {
    if device.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let mut g = lock();
    let tick = g.tick();
    let fake = g.fake_mut()?;
    let slot = *fake.physical.get(index as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    fake.device(name, handle_of(slot), tick, None)?;
    unsafe { out(device, handle_of(slot)) }
}

fn by_key(
    name: &'static str,
    key: *const c_char,
    device: *mut nvmlDevice_t,
    pick: fn(&gpumon_core::DeviceInfo) -> Option<&str>,
) -> Result<(), Ret> {
    if key.is_null() || device.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let key = unsafe { CStr::from_ptr(key) }.to_str().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?.to_owned();
    let mut g = lock();
    let tick = g.tick();
    let fake = g.fake_mut()?;
    let slot = fake
        .fleet
        .devices
        .iter()
        .position(|d| pick(d).is_some_and(|v| v.eq_ignore_ascii_case(&key)))
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    fake.device(name, handle_of(slot), tick, None)?;
    unsafe { out(device, handle_of(slot)) }
}

fn system_string(
    buf: *mut c_char,
    len: c_uint,
    pick: fn(&gpumon_core::SystemInfo) -> Option<String>,
) -> Result<(), Ret> {
    let mut g = lock();
    let s = pick(&g.fake_mut()?.fleet.system).ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    unsafe { out_str(buf, len, &s) }
}

fn cuda_version(v: *mut c_int) -> Result<(), Ret> {
    let mut g = lock();
    let cuda = g.fake_mut()?.fleet.system.cuda_driver_version.ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    unsafe { out(v, cuda) }
}

nvml_export! {
    fn nvmlInit() { init() }
    fn nvmlInit_v2() { init() }
    fn nvmlInitWithFlags(_flags: c_uint) { init() }

    fn nvmlShutdown() {
        let mut g = lock();
        g.init_count = g.init_count.saturating_sub(1);
        Ok(())
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        system_string(version, length, |s| s.driver_version.clone())
    }
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        system_string(version, length, |s| s.nvml_version.clone())
    }
    fn nvmlSystemGetCudaDriverVersion(cuda: *mut c_int) { cuda_version(cuda) }
    fn nvmlSystemGetCudaDriverVersion_v2(cuda: *mut c_int) { cuda_version(cuda) }

    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) {
        let known = {
            let mut g = lock();
            let tick = g.tick();
            let fake = g.fake_mut()?;
            let mut found = None;
            for slot in 0..fake.slots.len() {
                let s = fake.sample(slot, tick);
                if let Some(p) = s.processes.iter().find(|p| p.pid == pid) {
                    found = p.name.clone();
                    break;
                }
            }
            found
        };
        let n = match known {
            Some(n) => n,
            None => std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim_end().to_owned())
                .map_err(|_| NVML_ERROR_NOT_FOUND)?,
        };
        // NVML truncates rather than failing on a short buffer.
        let max = (length as usize).saturating_sub(1);
        let mut end = n.len().min(max);
        while !n.is_char_boundary(end) {
            end -= 1;
        }
        unsafe { out_str(name, length, &n[..end]) }
    }

    fn nvmlDeviceGetCount(device_count: *mut c_uint) { unsafe { out(device_count, count()?) } }
    fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) { unsafe { out(device_count, count()?) } }

    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) { by_index(NAME, index, device) }
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) { by_index(NAME, index, device) }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        by_key(NAME, uuid, device, |d| Some(d.uuid.as_str()))
    }
    fn nvmlDeviceGetHandleByPciBusId | nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        by_key(NAME, bus_id, device, |d| if d.mig.is_none() { d.pci_bus_id.as_deref() } else { None })
    }
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) {
        by_key(NAME, serial, device, |d| if d.mig.is_none() { d.serial.as_deref() } else { None })
    }
}

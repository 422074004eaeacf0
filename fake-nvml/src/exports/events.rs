//! MIG handles, event sets (XID delivery) and GPM samples.

use std::os::raw::{c_char, c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use gpumon_core::Family;

use super::{out, read};
use crate::ffi::*;
use crate::state::{
    handle_of, lock, wake_event_waiters, with_device, EventSetState, GpmSampleState, Ret, EVENT_CHANGED,
    EVENT_GENERATION, EVENT_WAITERS,
};

/// Event sets and GPM samples are handed out as fake addresses that are looked up, never
/// dereferenced.
const EVENT_SET_BASE: usize = 0x00E5_0000_0000;
const GPM_SAMPLE_BASE: usize = 0x00A6_0000_0000;

fn next_id(base: usize, used: impl Iterator<Item = usize>) -> usize {
    base + 16 * (used.map(|k| (k - base) / 16 + 1).max().unwrap_or(0) + 1)
}

/// A GPU's MIG instances that exist now (in profile order, destroyed ones left out), or `None`
/// when MIG mode is off (the profile gives the GPU no instances).
fn mig_children(name: &'static str, device: nvmlDevice_t) -> Result<Option<Vec<usize>>, Ret> {
    with_device(name, device, None, |fake, d| {
        if fake.slots[d.slot].mig_index.is_some() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let children = &fake.slots[d.slot].children;
        if children.is_empty() {
            return Ok(None);
        }
        Ok(Some(children.iter().copied().filter(|&c| !fake.mig_absent(c, d.tick)).collect()))
    })
}

fn gpm_value(g: &gpumon_core::Gpm, id: c_uint) -> Option<(f64, &'static std::ffi::CStr, &'static std::ffi::CStr)> {
    let v = match id {
        NVML_GPM_METRIC_GRAPHICS_UTIL => {
            (g.graphics_activity?, c"gr_util", c"Percentage of time any compute/graphics app was active on the GPU")
        }
        NVML_GPM_METRIC_SM_UTIL => (g.sm_activity?, c"sm_util", c"Percentage of SMs that were busy"),
        NVML_GPM_METRIC_SM_OCCUPANCY => {
            (g.sm_occupancy?, c"sm_occupancy", c"Percentage of warps that were active vs theoretical maximum")
        }
        NVML_GPM_METRIC_ANY_TENSOR_UTIL => {
            (g.tensor_activity?, c"tensor_util", c"Percentage of time the GPU's SMs were doing ANY tensor operations")
        }
        NVML_GPM_METRIC_DRAM_BW_UTIL => {
            (g.dram_bandwidth?, c"dram_bw_util", c"Percentage of DRAM bw used vs theoretical maximum")
        }
        _ => return None,
    };
    Some((v.0 * 100.0, v.1, v.2))
}

/// Most metrics one `nvmlGpmMetricsGet` may ask for (`NVML_GPM_METRIC_MAX` in the 13.5 header).
const GPM_METRIC_MAX: usize = 477;

/// Counts a thread in [`EVENT_WAITERS`] while it lives.
struct Waiting;

impl Waiting {
    fn new() -> Self {
        EVENT_WAITERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        EVENT_WAITERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn generation() -> u64 {
    *EVENT_GENERATION.lock().unwrap_or_else(|e| e.into_inner())
}

/// `nvmlEventSetWait`: sleeps like the driver's wait. XIDs only come from ECC bursts scheduled at
/// a tick ([`crate::state::Fake::next_xid_tick`]), so the wait sleeps until the wall clock reaches the next
/// such tick or the timeout, whichever is first, and is woken early by a change of
/// configuration, faults, registrations or a manual clock ([`wake_event_waiters`]). A fleet
/// without scheduled XIDs costs one wake-up per timeout, not one per model tick.
fn event_wait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) -> Result<(), Ret> {
    if data.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let key = set as usize;
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    let _waiting = Waiting::new();
    loop {
        // Read before looking at the state: a change made after the look bumps it, so the
        // sleep below cannot miss it.
        let seen = generation();
        let next_tick_at = {
            let mut g = lock();
            let tick = g.tick();
            let fake = g.fake_mut()?;
            let registered = match fake.event_sets.get(&key) {
                Some(s) if s.quiet_tick == Some(tick) => Vec::new(),
                Some(s) => s.registered.clone(),
                None => return Err(NVML_ERROR_INVALID_ARGUMENT),
            };
            for (slot, mask) in registered {
                if mask & nvmlEventTypeXidCriticalError == 0 || fake.gpu_lost(fake.slots[slot].gpu, tick) {
                    continue;
                }
                let sample = fake.sample(slot, tick);
                let Some(state) = fake.event_sets.get_mut(&key) else { break };
                for x in &sample.xid_errors {
                    let delivered = state.delivered.entry((slot, x.code)).or_insert(0);
                    if x.count > *delivered {
                        *delivered += 1;
                        let ev = nvmlEventData_t {
                            device: handle_of(slot),
                            eventType: nvmlEventTypeXidCriticalError,
                            eventData: x.code,
                            gpuInstanceId: NO_INSTANCE,
                            computeInstanceId: NO_INSTANCE,
                        };
                        return unsafe { out(data, ev) };
                    }
                }
            }
            if let Some(state) = fake.event_sets.get_mut(&key) {
                state.quiet_tick = Some(tick);
            }
            // When the wall clock reaches the next tick with an XID (the instant the tick
            // before it ends); no such tick: only the timeout or a change ends the wait.
            fake.next_xid_tick(tick).and_then(|t| fake.next_tick_at(t - 1))
        };
        if Instant::now() >= deadline {
            return Err(NVML_ERROR_TIMEOUT);
        }
        let until = next_tick_at.map_or(deadline, |t| t.min(deadline));
        let mut g = EVENT_GENERATION.lock().unwrap_or_else(|e| e.into_inner());
        while *g == seen {
            let now = Instant::now();
            if now >= until {
                break;
            }
            g = EVENT_CHANGED.wait_timeout(g, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

nvml_export! {
    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current_mode: *mut c_uint, pending_mode: *mut c_uint) {
        let on = c_uint::from(mig_children(NAME, device)?.is_some());
        // A MIG-capable GPU with MIG off reads 0 (as on a real H100); others do not support it.
        if on == 0 && !crate::state::with_device(NAME, device, None, |_, d| Ok(d.extras.mig_capable))? {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        unsafe {
            out(current_mode, on)?;
            out(pending_mode, on)
        }
    }
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        let n = if mig_children(NAME, device)?.is_none() { 0 } else { 7 };
        unsafe { out(count, n) }
    }
    fn nvmlDeviceGetMigDeviceHandleByIndex(device: nvmlDevice_t, index: c_uint, mig_device: *mut nvmlDevice_t) {
        let children = mig_children(NAME, device)?.unwrap_or_default();
        let slot = *children.get(index as usize).ok_or(NVML_ERROR_NOT_FOUND)?;
        unsafe { out(mig_device, handle_of(slot)) }
    }
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig_device: *mut c_uint) {
        let is = with_device(NAME, device, None, |fake, d| Ok(c_uint::from(fake.slots[d.slot].mig_index.is_some())))?;
        unsafe { out(is_mig_device, is) }
    }
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_device: nvmlDevice_t, device: *mut nvmlDevice_t) {
        let parent = with_device(NAME, mig_device, None, |fake, d| fake.slots[d.slot].parent.ok_or(NVML_ERROR_INVALID_ARGUMENT))?;
        unsafe { out(device, handle_of(parent)) }
    }
    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        let v = with_device(NAME, device, None, |_, d| d.info.mig.as_ref().map(|m| m.gpu_instance_id).ok_or(NVML_ERROR_INVALID_ARGUMENT))?;
        unsafe { out(id, v) }
    }
    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        let v = with_device(NAME, device, None, |_, d| d.info.mig.as_ref().map(|m| m.compute_instance_id).ok_or(NVML_ERROR_INVALID_ARGUMENT))?;
        unsafe { out(id, v) }
    }

    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) {
        if set.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let mut g = lock();
        let fake = g.fake_mut()?;
        fake.function_fault(NAME, None)?;
        let key = next_id(EVENT_SET_BASE, fake.event_sets.keys().copied());
        fake.event_sets.insert(
            key,
            EventSetState { registered: Vec::new(), delivered: Default::default(), quiet_tick: None },
        );
        unsafe { out(set, key as nvmlEventSet_t) }
    }
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, event_types: c_ulonglong, set: nvmlEventSet_t) {
        with_device(NAME, device, Some(Family::Xid), |fake, d| {
            let s = fake.event_sets.get_mut(&(set as usize)).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            s.register(d.slot, event_types);
            Ok(())
        })?;
        wake_event_waiters();
        Ok(())
    }
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, event_types: *mut c_ulonglong) {
        with_device(NAME, device, Some(Family::Xid), |_, _| Ok(()))?;
        unsafe { out(event_types, nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError) }
    }
    fn nvmlEventSetWait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) { event_wait(set, data, timeoutms) }
    fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) { event_wait(set, data, timeoutms) }
    fn nvmlEventSetFree(set: nvmlEventSet_t) {
        let mut g = lock();
        g.fake_mut()?.event_sets.remove(&(set as usize)).map(|_| ()).ok_or(NVML_ERROR_INVALID_ARGUMENT)
    }

    fn nvmlGpmQueryDeviceSupport(device: nvmlDevice_t, gpm_support: *mut nvmlGpmSupport_t) {
        let mut s = unsafe { read(gpm_support) }?;
        if s.version != NVML_GPM_SUPPORT_VERSION {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        s.isSupportedDevice = with_device(NAME, device, Some(Family::Gpm), |_, d| {
            let g = d.sample.gpm;
            Ok(c_uint::from(
                d.info.mig.is_none()
                    && (g.graphics_activity.is_some() || g.sm_activity.is_some() || g.sm_occupancy.is_some()
                        || g.tensor_activity.is_some() || g.dram_bandwidth.is_some()),
            ))
        })?;
        unsafe { out(gpm_support, s) }
    }
    fn nvmlGpmQueryIfStreamingEnabled(device: nvmlDevice_t, state: *mut c_uint) {
        with_device(NAME, device, Some(Family::Gpm), |_, _| Ok(()))?;
        unsafe { out(state, 0) }
    }
    fn nvmlGpmSampleAlloc(gpm_sample: *mut nvmlGpmSample_t) {
        if gpm_sample.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let mut g = lock();
        let fake = g.fake_mut()?;
        let key = next_id(GPM_SAMPLE_BASE, fake.gpm_samples.keys().copied());
        fake.gpm_samples.insert(key, GpmSampleState { taken: None });
        unsafe { out(gpm_sample, key as nvmlGpmSample_t) }
    }
    fn nvmlGpmSampleFree(gpm_sample: nvmlGpmSample_t) {
        let mut g = lock();
        g.fake_mut()?.gpm_samples.remove(&(gpm_sample as usize)).map(|_| ()).ok_or(NVML_ERROR_INVALID_ARGUMENT)
    }
    fn nvmlGpmSampleGet(device: nvmlDevice_t, gpm_sample: nvmlGpmSample_t) {
        with_device(NAME, device, Some(Family::Gpm), |fake, d| {
            let g = d.sample.gpm;
            if d.info.mig.is_some()
                || (g.graphics_activity.is_none() && g.sm_activity.is_none() && g.sm_occupancy.is_none()
                    && g.tensor_activity.is_none() && g.dram_bandwidth.is_none())
            {
                return Err(NVML_ERROR_NOT_SUPPORTED);
            }
            let s = fake.gpm_samples.get_mut(&(gpm_sample as usize)).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            s.taken = Some((d.slot, d.tick));
            Ok(())
        })
    }
    fn nvmlGpmMigSampleGet(device: nvmlDevice_t, _gpu_instance_id: c_uint, _gpm_sample: nvmlGpmSample_t) {
        with_device(NAME, device, Some(Family::Gpm), |_, _| Err(NVML_ERROR_NOT_SUPPORTED))
    }
    fn nvmlGpmMetricsGet(metrics_get: *mut nvmlGpmMetricsGetHead_t) {
        if metrics_get.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, and the caller passes a whole nvmlGpmMetricsGet_t.
        let head = unsafe { &mut *metrics_get };
        if head.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let n = head.numMetrics as usize;
        if n > GPM_METRIC_MAX {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let gpm = {
            let mut g = lock();
            let fake = g.fake_mut()?;
            let taken = |s: nvmlGpmSample_t| fake.gpm_samples.get(&(s as usize)).and_then(|s| s.taken);
            let (Some((slot1, _)), Some((slot2, tick2))) = (taken(head.sample1), taken(head.sample2)) else {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            };
            if slot1 != slot2 {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            fake.sample(slot2, tick2).gpm
        };
        let metrics = std::ptr::addr_of_mut!(head.metrics).cast::<nvmlGpmMetric_t>();
        for i in 0..n {
            // SAFETY: the struct holds NVML_GPM_METRIC_MAX entries; i < numMetrics <= that.
            let m = unsafe { &mut *metrics.add(i) };
            match gpm_value(&gpm, m.metricId) {
                Some((v, short, long)) => {
                    m.value = v;
                    m.nvmlReturn = NVML_SUCCESS;
                    m.metricInfo = nvmlGpmMetricInfo_t {
                        shortName: short.as_ptr().cast_mut(),
                        longName: long.as_ptr().cast_mut(),
                        unit: c"%".as_ptr().cast_mut() as *mut c_char,
                    };
                }
                None => {
                    m.value = 0.0;
                    m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                }
            }
        }
        Ok(())
    }
}

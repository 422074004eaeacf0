//! Reading one device's families through nvml-wrapper (and raw calls where it has no wrapper).

use std::collections::HashMap;
use std::mem;
use std::os::raw::{c_uint, c_ulonglong};
use std::panic::Location;
use std::ptr;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, Sampling, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::{nvml_sym, nvml_try, nvml_try_count, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use super::errors::{classify, identity_lost, Outcome};
use crate::metric::{Family, MetricSet};
use crate::model::{ClockEventReasons, Clocks, DeviceInfo, DeviceSample, MigInfo, ProcessSample, WindowStats};

/// `NVML_FI_DEV_MEMORY_TEMP`.
const FI_DEV_MEMORY_TEMP: u32 = 82;
/// `nvmlDeviceGetPcieThroughput` reports KB/s; NVML's KB is 1024 bytes.
const PCIE_KB: f64 = 1024.0;

/// How long a call the driver answered `NotSupported` is left alone before it is asked again.
/// Support is a property of the board, its driver and its modes (MIG, ECC); a mode can change
/// while the agent runs, and this period bounds how long a stale answer hides a value (the MIG
/// check also starts the parent afresh when it sees the mode change). The same period as the
/// runtime-PM file's retry.
pub(crate) const REPROBE_UNSUPPORTED: Duration = Duration::from_secs(30);

/// The calls of one device that answered `NotSupported`, each with when it did: skipped until
/// [`REPROBE_UNSUPPORTED`] has passed. The fake's H100 model answers `NotSupported` to five of
/// the default families' calls (encoder utilisation, fan, retired pages); asking again every
/// tick cost a driver call, an error conversion and a classification each, per GPU per tick.
///
/// A call is its call site in this module (`#[track_caller]`), and an index for the sites that
/// make several calls in a loop.
#[derive(Debug, Default)]
pub(crate) struct Unsupported {
    calls: Vec<(&'static Location<'static>, u8, Instant)>,
}

impl Unsupported {
    /// Whether the call at `site` is known unsupported at `now` (and forgets it once it is due
    /// to be asked again).
    fn skips(&mut self, site: &'static Location<'static>, index: u8, now: Instant) -> bool {
        // Compared by value: one call site need not have one address.
        let Some(i) = self.calls.iter().position(|&(s, n, _)| n == index && (ptr::eq(s, site) || *s == *site)) else {
            return false;
        };
        if now.saturating_duration_since(self.calls[i].2) < REPROBE_UNSUPPORTED {
            return true;
        }
        self.calls.swap_remove(i);
        false
    }

    fn note(&mut self, site: &'static Location<'static>, index: u8, now: Instant) {
        self.calls.push((site, index, now));
    }

    /// How many calls are being skipped (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.calls.len()
    }
}

/// Collects values into a sample, turning errors into absent values, per-metric failures or a
/// lost device. Once the device is lost, no further call is made.
pub(crate) struct Reader<'s> {
    pub(crate) sample: &'s mut DeviceSample,
    pub(crate) lost: bool,
    /// The device's calls known unsupported (from its [`Carry`]).
    pub(crate) unsupported: &'s mut Unsupported,
    /// When this sample began (one clock read per sample, not per call).
    pub(crate) now: Instant,
}

impl Reader<'_> {
    /// Makes the call `read` at the caller's call site, unless that call answered
    /// `NotSupported` less than [`REPROBE_UNSUPPORTED`] ago.
    #[track_caller]
    pub(crate) fn get<T>(&mut self, family: Family, read: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        self.get_nth(0, family, read)
    }

    /// [`Reader::get`] for a call site that makes several calls (a loop): `index` tells them
    /// apart.
    #[track_caller]
    pub(crate) fn get_nth<T>(
        &mut self,
        index: u8,
        family: Family,
        read: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost {
            return None;
        }
        let site = Location::caller();
        if self.unsupported.skips(site, index, self.now) {
            return None;
        }
        match read() {
            Ok(v) => Some(v),
            Err(e) => {
                if matches!(e, NvmlError::NotSupported) {
                    self.unsupported.note(site, index, self.now);
                }
                self.note(family, &e);
                None
            }
        }
    }

    pub(crate) fn note(&mut self, family: Family, e: &NvmlError) {
        match classify(e) {
            Outcome::Absent => {}
            Outcome::Lost => self.lost = true,
            Outcome::Failure(reason) => {
                if !self.sample.errors.iter().any(|f| f.family == family) {
                    self.sample.record_failure(family, reason);
                }
            }
        }
    }
}

/// Per-device state carried between ticks.
#[derive(Debug, Default)]
pub(crate) struct Carry {
    /// `lastSeenTimeStamp` per `nvmlDeviceGetSamples` type.
    pub(crate) samples_seen: [Option<u64>; 5],
    /// `lastSeenTimeStamp` for `nvmlDeviceGetProcessUtilization`.
    pub(crate) processes_seen: Option<u64>,
    /// GPM support, once known.
    pub(crate) gpm_supported: Option<bool>,
    /// The previous tick's GPM sample (`nvmlGpmSample_t`).
    pub(crate) gpm_prev: Option<usize>,
    /// NVLink links with their static facts, once discovered (empty: no NVLink).
    pub(crate) nvlink: Option<Vec<crate::model::NvlinkLink>>,
    /// Calls that answered `NotSupported`, skipped for a while ([`Unsupported`]).
    pub(crate) unsupported: Unsupported,
}

/// A sample type and how its values convert to base units.
type SampleKind = (Sampling, fn(f64) -> f64);

const SAMPLING: [SampleKind; 5] = [
    (Sampling::GpuUtilization, |v| v / 100.0),
    (Sampling::MemoryUtilization, |v| v / 100.0),
    (Sampling::Power, |v| v / 1000.0),
    (Sampling::ProcessorClock, |v| v * 1e6),
    (Sampling::MemoryClock, |v| v * 1e6),
];

/// One field of `nvmlDeviceGetFieldValues`; `None` when the driver returns no entry. The field's
/// own error is the call's: a board without the sensor answers the call but the field
/// `NotSupported`, and [`Reader::get`] must see that to leave the call alone for a while.
fn field_value(d: &Device<'_>, id: u32) -> Result<Option<SampleValue>, NvmlError> {
    let Some(field) = d.field_values_for(&[FieldId(id)])?.into_iter().next() else { return Ok(None) };
    field.and_then(|f| f.value).map(Some)
}

fn sample_value(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(v) => v,
        SampleValue::U32(v) => f64::from(v),
        SampleValue::U64(v) => v as f64,
        SampleValue::I64(v) => v as f64,
    }
}

fn mhz(v: u32) -> f64 {
    f64::from(v) * 1e6
}

/// The static facts of a physical GPU. A lost GPU (or `Unknown` from the name) is an error; the
/// rest are optional (an unreadable name is empty).
pub(crate) fn static_info(nvml: &Nvml, d: &Device<'_>, index: u32, uuid: String) -> Result<DeviceInfo, NvmlError> {
    let name = match d.name() {
        Ok(n) => n,
        Err(e) if identity_lost(&e) => return Err(e),
        Err(_) => String::new(),
    };
    let mut info = DeviceInfo::new(index, uuid, name);
    info.pci_bus_id = d.pci_info().ok().map(|p| p.bus_id);
    info.serial = d.serial().ok().filter(|s| !s.is_empty());
    info.architecture = architecture(nvml, d);
    info.memory_total_bytes = d.memory_info().ok().map(|m| m.total);
    info.power_limit_default_watts = d.power_management_limit_default().ok().map(|mw| f64::from(mw) / 1000.0);
    if let Ok(c) = d.power_management_limit_constraints() {
        info.power_limit_min_watts = Some(f64::from(c.min_limit) / 1000.0);
        info.power_limit_max_watts = Some(f64::from(c.max_limit) / 1000.0);
    }
    let max = |c| d.max_clock_info(c).ok().map(mhz);
    info.max_clocks = Clocks {
        graphics: max(Clock::Graphics),
        sm: max(Clock::SM),
        memory: max(Clock::Memory),
        video: max(Clock::Video),
    };
    let t = |th| d.temperature_threshold(th).ok().map(f64::from);
    info.temperature_slowdown_celsius = t(TemperatureThreshold::Slowdown);
    info.temperature_shutdown_celsius = t(TemperatureThreshold::Shutdown);
    info.pcie_max_link_generation = d.max_pcie_link_gen().ok();
    info.pcie_max_link_width = d.max_pcie_link_width().ok();
    Ok(info)
}

/// The static facts of MIG instance `mig_index` of `parent`.
pub(crate) fn mig_info(
    nvml: &Nvml,
    d: &Device<'_>,
    parent: &DeviceInfo,
    mig_index: u32,
) -> Result<DeviceInfo, NvmlError> {
    let uuid = d.uuid()?;
    let name = d.name()?;
    let lib = nvml.lib();
    let id = |sym: &Result<unsafe extern "C" fn(sys::nvmlDevice_t, *mut c_uint) -> sys::nvmlReturn_t, _>| {
        let f = nvml_sym(sym.as_ref()).ok()?;
        let mut v: c_uint = 0;
        // SAFETY: a live MIG handle and a valid out-pointer.
        nvml_try(unsafe { f(d.handle(), &mut v) }).ok().map(|()| v)
    };
    let gi = id(&lib.nvmlDeviceGetGpuInstanceId).unwrap_or(0);
    let ci = id(&lib.nvmlDeviceGetComputeInstanceId).unwrap_or(0);
    let mut mig = MigInfo::new(parent.uuid.clone(), mig_index, gi, ci);
    mig.profile = name.rsplit_once(" MIG ").map(|(_, p)| p.trim().to_owned()).filter(|p| !p.is_empty());
    let mut info = DeviceInfo::new(parent.index, uuid, name);
    info.pci_bus_id = parent.pci_bus_id.clone();
    info.architecture = parent.architecture.clone();
    info.memory_total_bytes = d.memory_info().ok().map(|m| m.total);
    info.mig = Some(mig);
    Ok(info)
}

/// The PCI bus id with a single raw `nvmlDeviceGetPciInfo_v3` (nvml-wrapper's `pci_info` makes
/// more calls than that).
pub(crate) fn bus_id(nvml: &Nvml, d: &Device<'_>) -> Option<String> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetPciInfo_v3.as_ref()).ok()?;
    // SAFETY: plain C struct; all-zero is valid.
    let mut p: sys::nvmlPciInfo_t = unsafe { mem::zeroed() };
    // SAFETY: a live handle and a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), &mut p) }).ok()?;
    let id: Vec<u8> = p.busId.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8(id).ok().filter(|s| !s.is_empty())
}

fn architecture(nvml: &Nvml, d: &Device<'_>) -> Option<String> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetArchitecture.as_ref()).ok()?;
    let mut arch: sys::nvmlDeviceArchitecture_t = 0;
    // SAFETY: a live handle and a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), &mut arch) }).ok()?;
    let name = match arch {
        2 => "Kepler",
        3 => "Maxwell",
        4 => "Pascal",
        5 => "Volta",
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada",
        9 => "Hopper",
        10 => "Blackwell",
        _ => return None,
    };
    Some(name.to_owned())
}

/// A process's name: `/proc/<pid>/comm` when readable, else what NVML says.
fn process_name(nvml: &Nvml, pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| nvml.sys_process_name(pid, 256).ok().filter(|s| !s.is_empty()))
}

/// Reads every requested family of one device (physical or MIG) into `r.sample`.
pub(crate) fn families(nvml: &Nvml, d: &Device<'_>, set: MetricSet, carry: &mut Carry, r: &mut Reader<'_>) {
    let is_mig = r.sample.info.mig.is_some();
    if set.contains(Family::Utilization) {
        if let Some(u) = r.get(Family::Utilization, || d.utilization_rates()) {
            r.sample.utilization.gpu = Some(f64::from(u.gpu) / 100.0);
            r.sample.utilization.memory = Some(f64::from(u.memory) / 100.0);
        }
        r.sample.utilization.encoder =
            r.get(Family::Utilization, || d.encoder_utilization()).map(|u| f64::from(u.utilization) / 100.0);
        r.sample.utilization.decoder =
            r.get(Family::Utilization, || d.decoder_utilization()).map(|u| f64::from(u.utilization) / 100.0);
    }
    if set.contains(Family::Memory) {
        if let Some(m) = r.get(Family::Memory, || d.memory_info()) {
            r.sample.memory.used = Some(m.used);
            r.sample.memory.free = Some(m.free);
            r.sample.memory.total = Some(m.total);
            r.sample.memory.reserved = Some(m.reserved);
        }
    }
    if set.contains(Family::Temperature) {
        r.sample.temperature.gpu = r.get(Family::Temperature, || d.temperature(TemperatureSensor::Gpu)).map(f64::from);
        r.sample.temperature.memory =
            r.get(Family::Temperature, || field_value(d, FI_DEV_MEMORY_TEMP)).flatten().map(|v| sample_value(&v));
    }
    if set.contains(Family::Power) {
        r.sample.power.usage_watts = r.get(Family::Power, || d.power_usage()).map(|mw| f64::from(mw) / 1000.0);
        r.sample.power.limit_watts = r.get(Family::Power, || d.enforced_power_limit()).map(|mw| f64::from(mw) / 1000.0);
    }
    if set.contains(Family::Energy) {
        r.sample.power.energy_joules =
            r.get(Family::Energy, || d.total_energy_consumption()).map(|mj| mj as f64 / 1000.0);
    }
    if set.contains(Family::Clocks) {
        let graphics = r.get(Family::Clocks, || d.clock_info(Clock::Graphics)).map(mhz);
        let sm = r.get(Family::Clocks, || d.clock_info(Clock::SM)).map(mhz);
        let memory = r.get(Family::Clocks, || d.clock_info(Clock::Memory)).map(mhz);
        let video = r.get(Family::Clocks, || d.clock_info(Clock::Video)).map(mhz);
        r.sample.clocks = Clocks { graphics, sm, memory, video };
    }
    if set.contains(Family::Fan) {
        r.sample.fan_speed = r.get(Family::Fan, || d.fan_speed(0)).map(|p| f64::from(p) / 100.0);
    }
    if set.contains(Family::PerformanceState) {
        r.sample.performance_state =
            r.get(Family::PerformanceState, || d.performance_state()).map(|p| p.as_c()).filter(|&p| p <= 15);
    }
    if set.contains(Family::ClockEvents) || set.contains(Family::ClockEventsByReason) {
        r.sample.clock_event_reasons =
            r.get(Family::ClockEvents, || clock_event_reasons(nvml, d)).map(ClockEventReasons);
    }
    if set.contains(Family::PcieLink) {
        r.sample.pcie.link_generation = r.get(Family::PcieLink, || d.current_pcie_link_gen());
        r.sample.pcie.link_width = r.get(Family::PcieLink, || d.current_pcie_link_width());
        r.sample.pcie.replays = r.get(Family::PcieLink, || d.pcie_replay_counter()).map(u64::from);
    }
    if set.contains(Family::PcieThroughput) {
        let kb = |v: u32| f64::from(v) * PCIE_KB;
        r.sample.pcie.tx_bytes_per_second =
            r.get(Family::PcieThroughput, || d.pcie_throughput(PcieUtilCounter::Send)).map(kb);
        r.sample.pcie.rx_bytes_per_second =
            r.get(Family::PcieThroughput, || d.pcie_throughput(PcieUtilCounter::Receive)).map(kb);
    }
    if set.contains(Family::Ecc) {
        r.sample.ecc.corrected =
            r.get(Family::Ecc, || d.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate));
        r.sample.ecc.uncorrected =
            r.get(Family::Ecc, || d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate));
    }
    if set.contains(Family::RetiredPages) {
        r.sample.ecc.retired_pages_single_bit = r.get(Family::RetiredPages, || retired_pages(nvml, d, 0));
        r.sample.ecc.retired_pages_double_bit = r.get(Family::RetiredPages, || retired_pages(nvml, d, 1));
        r.sample.ecc.retired_pages_pending = r.get(Family::RetiredPages, || d.are_pages_pending_retired());
    }
    if set.contains(Family::RemappedRows) {
        if let Some((corr, unc, pending, failure)) = r.get(Family::RemappedRows, || remapped_rows(nvml, d)) {
            r.sample.ecc.remapped_rows_correctable = Some(u64::from(corr));
            r.sample.ecc.remapped_rows_uncorrectable = Some(u64::from(unc));
            r.sample.ecc.remapped_rows_pending = Some(pending != 0);
            r.sample.ecc.remapped_rows_failure = Some(failure != 0);
        }
    }
    if set.contains(Family::Processes) {
        processes(nvml, d, carry, r);
    }
    if set.contains(Family::HighResolution) {
        windows(d, carry, r);
    }
    if set.contains(Family::Gpm) && !is_mig {
        gpm(nvml, d, carry, r);
    }
    // NVML reports NVLink on the physical GPU only.
    let per_link = set.contains(Family::NvlinkLinks);
    if (set.contains(Family::Nvlink) || per_link) && !is_mig && !r.lost {
        if carry.nvlink.is_none() {
            let links = super::nvlink::discover(nvml, d, r);
            if !r.lost {
                carry.nvlink = Some(links);
            }
        }
        if let Some(links) = &carry.nvlink {
            r.sample.nvlink = super::nvlink::read(nvml, d, links, r).map(|nv| nv.with_per_link(per_link));
        }
    }
}

fn clock_event_reasons(nvml: &Nvml, d: &Device<'_>) -> Result<u64, NvmlError> {
    let lib = nvml.lib();
    let f = match nvml_sym(lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref()) {
        Ok(f) => f,
        Err(_) => nvml_sym(lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref())?,
    };
    let mut v: c_ulonglong = 0;
    // SAFETY: a live handle and a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), &mut v) })?;
    Ok(v)
}

fn retired_pages(nvml: &Nvml, d: &Device<'_>, cause: sys::nvmlPageRetirementCause_t) -> Result<u64, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetRetiredPages.as_ref())?;
    let mut count: c_uint = 0;
    // SAFETY: a null buffer with count 0 asks for the count only.
    nvml_try_count(unsafe { f(d.handle(), cause, &mut count, ptr::null_mut()) })?;
    Ok(u64::from(count))
}

fn remapped_rows(nvml: &Nvml, d: &Device<'_>) -> Result<(u32, u32, u32, u32), NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: a live handle and valid out-pointers.
    nvml_try(unsafe { f(d.handle(), &mut corr, &mut unc, &mut pending, &mut failure) })?;
    Ok((corr, unc, pending, failure))
}

fn processes(nvml: &Nvml, d: &Device<'_>, carry: &mut Carry, r: &mut Reader<'_>) {
    let mut list: Vec<ProcessSample> = Vec::new();
    for (i, get) in [Device::running_compute_processes, Device::running_graphics_processes].into_iter().enumerate() {
        for p in r.get_nth(i as u8, Family::Processes, || get(d)).unwrap_or_default() {
            if list.iter().any(|q| q.pid == p.pid) {
                continue;
            }
            let mut s = ProcessSample::new(p.pid);
            s.memory_used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            list.push(s);
        }
    }
    if r.lost {
        return;
    }
    match d.process_utilization_stats(carry.processes_seen) {
        Ok(samples) => {
            let mut latest: HashMap<u32, &nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample> =
                HashMap::new();
            for s in &samples {
                carry.processes_seen = Some(carry.processes_seen.unwrap_or(0).max(s.timestamp));
                let e = latest.entry(s.pid).or_insert(s);
                if s.timestamp > e.timestamp {
                    *e = s;
                }
            }
            for p in &mut list {
                if let Some(u) = latest.get(&p.pid) {
                    p.sm_utilization = Some(f64::from(u.sm_util) / 100.0);
                    p.memory_utilization = Some(f64::from(u.mem_util) / 100.0);
                    p.encoder_utilization = Some(f64::from(u.enc_util) / 100.0);
                    p.decoder_utilization = Some(f64::from(u.dec_util) / 100.0);
                }
            }
        }
        Err(e) => r.note(Family::Processes, &e),
    }
    for p in &mut list {
        p.name = process_name(nvml, p.pid);
    }
    r.sample.processes = list;
}

fn windows(d: &Device<'_>, carry: &mut Carry, r: &mut Reader<'_>) {
    let mut out: [Option<WindowStats>; 5] = [None; 5];
    for (i, (kind, decode)) in SAMPLING.iter().enumerate() {
        let seen = carry.samples_seen[i];
        if let Some(samples) = r.get_nth(i as u8, Family::HighResolution, || d.samples(*kind, seen)) {
            if let Some(max) = samples.iter().map(|s| s.timestamp).max() {
                carry.samples_seen[i] = Some(max);
            }
            out[i] = WindowStats::from_values(samples.iter().map(|s| decode(sample_value(&s.value))));
        }
    }
    let w = &mut r.sample.windows;
    [w.gpu_utilization, w.memory_utilization, w.power_watts, w.sm_clock, w.memory_clock] = out;
}

const GPM_METRICS: [u32; 5] = [
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
];

/// Takes a GPM sample without reporting anything: the baseline the first tick's metrics are
/// computed against (taken when the sampler is built). Failures are left to the tick's read.
pub(crate) fn gpm_baseline(nvml: &Nvml, d: &Device<'_>, carry: &mut Carry) {
    if carry.gpm_prev.is_some() {
        return;
    }
    match d.gpm_support() {
        Ok(true) => carry.gpm_supported = Some(true),
        Ok(false) => {
            carry.gpm_supported = Some(false);
            return;
        }
        Err(_) => return,
    }
    if let Ok(s) = take_gpm_sample(nvml, d) {
        carry.gpm_prev = Some(s);
    }
}

/// Allocates a GPM sample and fills it from `d` (freed again on failure).
fn take_gpm_sample(nvml: &Nvml, d: &Device<'_>) -> Result<usize, NvmlError> {
    let lib = nvml.lib();
    let alloc = nvml_sym(lib.nvmlGpmSampleAlloc.as_ref())?;
    let get = nvml_sym(lib.nvmlGpmSampleGet.as_ref())?;
    let mut s: sys::nvmlGpmSample_t = ptr::null_mut();
    // SAFETY: valid out-pointer.
    nvml_try(unsafe { alloc(&mut s) })?;
    // SAFETY: a live handle and a freshly allocated sample.
    if let Err(e) = nvml_try(unsafe { get(d.handle(), s) }) {
        free_gpm_sample(nvml, s as usize);
        return Err(e);
    }
    Ok(s as usize)
}

/// GPM needs two samples: each tick takes one and reports the metrics between it and the
/// previous one (the previous tick's, or the baseline taken when the sampler was built). Raw
/// calls, because nvml-wrapper's `GpmSample` borrows `Nvml` and cannot be kept across ticks.
fn gpm(nvml: &Nvml, d: &Device<'_>, carry: &mut Carry, r: &mut Reader<'_>) {
    if carry.gpm_supported.is_none() {
        carry.gpm_supported = r.get(Family::Gpm, || d.gpm_support()).or(Some(false));
    }
    if carry.gpm_supported != Some(true) || r.lost {
        return;
    }
    let metrics_get = match nvml_sym(nvml.lib().nvmlGpmMetricsGet.as_ref()) {
        Ok(f) => f,
        Err(e) => return r.note(Family::Gpm, &e),
    };
    let s = match take_gpm_sample(nvml, d) {
        Ok(s) => s as sys::nvmlGpmSample_t,
        Err(e) => return r.note(Family::Gpm, &e),
    };
    if let Some(prev) = carry.gpm_prev.replace(s as usize) {
        // SAFETY: plain C struct; all-zero is a valid starting value.
        let mut mg: Box<sys::nvmlGpmMetricsGet_t> = Box::new(unsafe { mem::zeroed() });
        mg.version = sys::NVML_GPM_METRICS_GET_VERSION;
        mg.numMetrics = GPM_METRICS.len() as c_uint;
        mg.sample1 = prev as sys::nvmlGpmSample_t;
        mg.sample2 = s;
        for (m, id) in mg.metrics.iter_mut().zip(GPM_METRICS) {
            m.metricId = id;
        }
        // SAFETY: a fully initialised request with two samples of this device.
        let rc = unsafe { metrics_get(&mut *mg) };
        free_gpm_sample(nvml, prev);
        if let Err(e) = nvml_try(rc) {
            return r.note(Family::Gpm, &e);
        }
        let value = |i: usize| {
            let m = &mg.metrics[i];
            (m.nvmlReturn == sys::nvmlReturn_enum_NVML_SUCCESS).then_some(m.value / 100.0)
        };
        let g = &mut r.sample.gpm;
        g.graphics_activity = value(0);
        g.sm_activity = value(1);
        g.sm_occupancy = value(2);
        g.tensor_activity = value(3);
        g.dram_bandwidth = value(4);
    }
}

/// Frees a GPM sample through the raw symbol (the generated method panics if it is missing).
pub(crate) fn free_gpm_sample(nvml: &Nvml, s: usize) {
    if let Ok(free) = nvml_sym(nvml.lib().nvmlGpmSampleFree.as_ref()) {
        // SAFETY: `s` came from nvmlGpmSampleAlloc and is freed once.
        let _ = unsafe { free(s as sys::nvmlGpmSample_t) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn here() -> &'static Location<'static> {
        Location::caller()
    }

    #[test]
    fn an_unsupported_call_is_skipped_until_it_is_due_again_and_only_that_call() {
        let (a, b) = (here(), here());
        let t0 = Instant::now();
        let mut u = Unsupported::default();
        assert!(!u.skips(a, 0, t0), "nothing known yet");
        u.note(a, 0, t0);
        assert!(u.skips(a, 0, t0 + Duration::from_secs(1)));
        assert!(u.skips(a, 0, t0 + REPROBE_UNSUPPORTED - Duration::from_millis(1)));
        assert!(!u.skips(a, 1, t0 + Duration::from_secs(1)), "another call of the same site");
        assert!(!u.skips(b, 0, t0 + Duration::from_secs(1)), "another site");
        // Due: asked again, and forgotten until it answers NotSupported once more.
        assert!(!u.skips(a, 0, t0 + REPROBE_UNSUPPORTED));
        assert_eq!(u.len(), 0);
        assert!(!u.skips(a, 0, t0 + REPROBE_UNSUPPORTED + Duration::from_secs(1)));
    }

    #[test]
    fn a_reader_remembers_not_supported_only() {
        let mut sample = DeviceSample::new(std::sync::Arc::new(DeviceInfo::new(0, "GPU-0", "test")));
        let mut unsupported = Unsupported::default();
        let now = Instant::now();
        let mut calls = [0; 3];
        for _ in 0..3 {
            let mut r = Reader { sample: &mut sample, lost: false, unsupported: &mut unsupported, now };
            for (i, answer) in
                [NvmlError::NotSupported, NvmlError::NoPermission, NvmlError::Unknown].into_iter().enumerate()
            {
                let got: Option<u32> = r.get_nth(i as u8, Family::Power, || {
                    calls[i] += 1;
                    Err(answer)
                });
                assert_eq!(got, None);
            }
        }
        // NotSupported was asked once; the errors that may pass are asked every time.
        assert_eq!(calls, [1, 3, 3]);
        assert_eq!(unsupported.len(), 1);
    }
}

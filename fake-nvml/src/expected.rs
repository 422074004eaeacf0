//! What an NVML client reads from the fake: the model's values after the fake's tick-based faults
//! and NVML's integer units. Tests compare `gpumon_core::nvml::NvmlSampler`'s snapshots (and
//! Python clients' readings) against these.

use std::sync::Arc;

use gpumon_core::{Clocks, DeviceInfo, DeviceSample, DeviceState, MigInfo, ProcessSample, WindowStats, XidCount};

use crate::config::{Fault, ECC_BURST_CORRECTED, ECC_BURST_UNCORRECTED};
use crate::model::Fleet;
use crate::units;

/// The model's sample of device `index` at `tick` with the fake's tick-based faults applied
/// (`lost:<gpu>@<tick>`, `ecc-burst`). This is what the fake serves, before unit conversion.
pub fn faulted_sample(fleet: &Fleet, faults: &[Fault], index: usize, tick: u64) -> DeviceSample {
    let mut s = fleet.sample(index, tick);
    let gpu = fleet.devices[index].index;
    if is_replaced(fleet, faults, index, tick) {
        s.info = Arc::new(replaced(&s.info));
    }
    for f in faults {
        match *f {
            Fault::Lost { gpu: g, from, until } if g == gpu && tick >= from && until.is_none_or(|u| tick < u) => {
                return DeviceSample::lost(s.info.clone());
            }
            Fault::EccBurst { gpu: g, tick: at, xid }
                if g == gpu && tick >= at && fleet.devices[index].mig.is_none() =>
            {
                if let Some(c) = s.ecc.corrected.as_mut() {
                    *c += ECC_BURST_CORRECTED;
                }
                if let Some(u) = s.ecc.uncorrected.as_mut() {
                    *u += ECC_BURST_UNCORRECTED;
                }
                match s.xid_errors.iter_mut().find(|x| x.code == xid) {
                    Some(x) => x.count += 1,
                    None => s.xid_errors.push(XidCount::new(xid, 1, std::time::SystemTime::now())),
                }
            }
            Fault::NvlinkDown { gpu: g, link, tick: at } if g == gpu => {
                let f = gpumon_mock::Fault::NvlinkDown { device: g, link, at_tick: at };
                fleet.mock.apply_nvlink_fault(index, &mut s, &f, tick);
            }
            Fault::NvlinkErrors { gpu: g, link, tick: at, per_tick } if g == gpu => {
                let f = gpumon_mock::Fault::NvlinkErrors { device: g, link, at_tick: at, per_tick };
                fleet.mock.apply_nvlink_fault(index, &mut s, &f, tick);
            }
            Fault::Pids { gpu: g, ref pids } if g == gpu && fleet.devices[index].mig.is_none() && s.is_up() => {
                s.processes = real_processes(&s.processes, pids);
            }
            _ => {}
        }
    }
    s
}

/// The model's processes re-assigned to real PIDs: memory split evenly (whole MiB, the rest
/// to the first), utilisation shared likewise; names left to `/proc/<pid>/comm`.
fn real_processes(model: &[ProcessSample], pids: &[u32]) -> Vec<ProcessSample> {
    const MIB: u64 = 1 << 20;
    let n = pids.len().max(1) as u64;
    let total: u64 = model.iter().filter_map(|p| p.memory_used).sum();
    let each = total / n / MIB * MIB;
    let share = |v: Option<f64>| v.map(|v| (v / n as f64 * 100.0).floor() / 100.0);
    let sm: Option<f64> = model.iter().filter_map(|p| p.sm_utilization).reduce(|a, b| a + b);
    let mem: Option<f64> = model.iter().filter_map(|p| p.memory_utilization).reduce(|a, b| a + b);
    pids.iter()
        .enumerate()
        .map(|(i, &pid)| {
            let mut p = ProcessSample::new(pid);
            p.memory_used = Some(if i == 0 { total - each * (n - 1) } else { each });
            p.sm_utilization = share(sm);
            p.memory_utilization = share(mem);
            p.encoder_utilization = Some(0.0);
            p.decoder_utilization = Some(0.0);
            p
        })
        .collect()
}

fn is_replaced(fleet: &Fleet, faults: &[Fault], index: usize, tick: u64) -> bool {
    let gpu = fleet.devices[index].index;
    faults.iter().any(|f| matches!(*f, Fault::Replaced { gpu: g, tick: at } if g == gpu && tick >= at))
}

/// The identity device `index` presents at `tick`: the profile's, or — after a
/// `replaced:<gpu>@<tick>` fault — the replacement board's ([`replaced`]).
pub fn identity(fleet: &Fleet, faults: &[Fault], index: usize, tick: u64) -> Arc<DeviceInfo> {
    if is_replaced(fleet, faults, index, tick) {
        Arc::new(replaced(&fleet.devices[index]))
    } else {
        fleet.devices[index].clone()
    }
}

/// The replacement board's identity: every hex digit of the UUID (and of a MIG instance's
/// parent UUID) moved by 8, every serial digit by 5 — deterministic, and never the original.
pub fn replaced(info: &DeviceInfo) -> DeviceInfo {
    fn uuid(u: &str) -> String {
        let (prefix, rest) = u.split_once('-').unwrap_or(("", u));
        let moved: String = rest
            .chars()
            .map(|c| c.to_digit(16).and_then(|d| char::from_digit((d + 8) % 16, 16)).unwrap_or(c))
            .collect();
        if prefix.is_empty() {
            moved
        } else {
            format!("{prefix}-{moved}")
        }
    }
    let mut d = info.clone();
    d.uuid = uuid(&info.uuid);
    d.serial = info.serial.as_ref().map(|s| {
        s.chars().map(|c| c.to_digit(10).and_then(|d| char::from_digit((d + 5) % 10, 10)).unwrap_or(c)).collect()
    });
    if let Some(m) = d.mig.as_mut() {
        m.parent_uuid = uuid(&m.parent_uuid);
    }
    d
}

/// The static facts an NVML client reads for `info` (limits and clocks in NVML's integer units).
pub fn device_info(info: &DeviceInfo) -> DeviceInfo {
    let mut d = info.clone();
    d.architecture = info
        .architecture
        .as_deref()
        .and_then(units::architecture_code)
        .and_then(units::architecture_name)
        .map(str::to_owned);
    let w = |v: Option<f64>| v.map(|w| f64::from(units::milliwatts(w)) / 1000.0);
    d.power_limit_default_watts = w(info.power_limit_default_watts);
    d.power_limit_min_watts = w(info.power_limit_min_watts);
    d.power_limit_max_watts = w(info.power_limit_max_watts);
    d.max_clocks = clocks(&info.max_clocks);
    let c = |v: Option<f64>| v.map(|c| f64::from(units::celsius(c)));
    d.temperature_slowdown_celsius = c(info.temperature_slowdown_celsius);
    d.temperature_shutdown_celsius = c(info.temperature_shutdown_celsius);
    if let Some(m) = &info.mig {
        let mut mi = MigInfo::new(m.parent_uuid.clone(), m.mig_index, m.gpu_instance_id, m.compute_instance_id);
        mi.profile = mig_profile_from_name(&info.name).or_else(|| m.profile.clone());
        d.mig = Some(mi);
    }
    d
}

/// The MIG profile in a MIG device's NVML name (`"NVIDIA A100-SXM4-80GB MIG 1g.10gb"` → `1g.10gb`).
pub fn mig_profile_from_name(name: &str) -> Option<String> {
    name.rsplit_once(" MIG ").map(|(_, p)| p.trim().to_owned()).filter(|p| !p.is_empty())
}

fn clocks(c: &Clocks) -> Clocks {
    let f = |v: Option<f64>| v.map(|hz| f64::from(units::megahertz(hz)) * 1e6);
    let mut out = Clocks::default();
    out.graphics = f(c.graphics);
    out.sm = f(c.sm);
    out.memory = f(c.memory);
    out.video = f(c.video);
    out
}

/// What an NVML client reads for `sample` (the fake's output for it, decoded the way
/// gpumon's NVML backend decodes it). `info` replaces the sample's identity (use
/// [`device_info`]). XID `last_seen` is kept from the model: a client sees the arrival time
/// instead, so compare codes and counts only.
pub fn nvml_view(sample: &DeviceSample, info: Arc<DeviceInfo>) -> DeviceSample {
    if sample.state == DeviceState::Lost {
        return DeviceSample::lost(info);
    }
    let pct = |v: Option<f64>| v.map(|r| f64::from(units::percent(r)) / 100.0);
    let mut out = DeviceSample::new(info);
    let u = &sample.utilization;
    out.utilization.gpu = pct(u.gpu);
    out.utilization.memory = u.gpu.map(|_| f64::from(units::percent(u.memory.unwrap_or(0.0))) / 100.0);
    out.utilization.encoder = pct(u.encoder);
    out.utilization.decoder = pct(u.decoder);
    let m = &sample.memory;
    if let Some(total) = m.total {
        out.memory.total = Some(total);
        out.memory.used = Some(m.used.unwrap_or(0));
        out.memory.free = Some(m.free.unwrap_or(0));
        out.memory.reserved = Some(m.reserved.unwrap_or(0));
    }
    let c = |v: Option<f64>| v.map(|c| f64::from(units::celsius(c)));
    out.temperature.gpu = c(sample.temperature.gpu);
    out.temperature.memory = c(sample.temperature.memory);
    let w = |v: Option<f64>| v.map(|w| f64::from(units::milliwatts(w)) / 1000.0);
    out.power.usage_watts = w(sample.power.usage_watts);
    out.power.limit_watts = w(sample.power.limit_watts);
    out.power.energy_joules = sample.power.energy_joules.map(|j| units::millijoules(j) as f64 / 1000.0);
    out.clocks = clocks(&sample.clocks);
    out.fan_speed = pct(sample.fan_speed);
    out.performance_state = sample.performance_state.map(|p| p.min(15));
    out.clock_event_reasons = sample.clock_event_reasons;
    let p = &sample.pcie;
    let kb = |v: Option<f64>| v.map(|b| f64::from(units::kilobytes_per_second(b)) * 1024.0);
    out.pcie.link_generation = p.link_generation;
    out.pcie.link_width = p.link_width;
    out.pcie.replays = p.replays;
    out.pcie.tx_bytes_per_second = kb(p.tx_bytes_per_second);
    out.pcie.rx_bytes_per_second = kb(p.rx_bytes_per_second);
    let e = &sample.ecc;
    let remap = e.remapped_rows_correctable.is_some()
        || e.remapped_rows_uncorrectable.is_some()
        || e.remapped_rows_pending.is_some()
        || e.remapped_rows_failure.is_some();
    let u32ish = |v: Option<u64>| v.map(|v| v.min(u64::from(u32::MAX)));
    let o = &mut out.ecc;
    o.corrected = e.corrected;
    o.uncorrected = e.uncorrected;
    o.retired_pages_single_bit = e.retired_pages_single_bit.map(|v| v.min(crate::MAX_RETIRED_PAGES));
    o.retired_pages_double_bit = e.retired_pages_double_bit.map(|v| v.min(crate::MAX_RETIRED_PAGES));
    o.retired_pages_pending = e.retired_pages_pending;
    if remap {
        o.remapped_rows_correctable = u32ish(e.remapped_rows_correctable.or(Some(0)));
        o.remapped_rows_uncorrectable = u32ish(e.remapped_rows_uncorrectable.or(Some(0)));
        o.remapped_rows_pending = Some(e.remapped_rows_pending.unwrap_or(false));
        o.remapped_rows_failure = Some(e.remapped_rows_failure.unwrap_or(false));
    }
    out.xid_errors = sample.xid_errors.clone();
    // NVLink byte counters travel in whole KiB; the model's already are.
    out.nvlink = sample.nvlink.clone();
    out.processes = sample
        .processes
        .iter()
        .map(|p| {
            let any_util = p.sm_utilization.is_some()
                || p.memory_utilization.is_some()
                || p.encoder_utilization.is_some()
                || p.decoder_utilization.is_some();
            let util = |v: Option<f64>| {
                if any_util {
                    Some(f64::from(units::percent(v.unwrap_or(0.0))) / 100.0)
                } else {
                    None
                }
            };
            let mut q = ProcessSample::new(p.pid);
            q.name = p.name.clone();
            q.memory_used = p.memory_used;
            q.sm_utilization = util(p.sm_utilization);
            q.memory_utilization = util(p.memory_utilization);
            q.encoder_utilization = util(p.encoder_utilization);
            q.decoder_utilization = util(p.decoder_utilization);
            q
        })
        .collect();
    // Encode as the fake does (`window_values` in NVML units), decode as gpumon's backend does.
    let win = |s: Option<WindowStats>, scale: f64, decode: fn(f64) -> f64| {
        s.and_then(|s| WindowStats::from_values(units::window_values(&s, scale).into_iter().map(decode)))
    };
    let w = &sample.windows;
    out.windows.gpu_utilization = win(w.gpu_utilization, 100.0, |v| v / 100.0);
    out.windows.memory_utilization = win(w.memory_utilization, 100.0, |v| v / 100.0);
    out.windows.power_watts = win(w.power_watts, 1000.0, |v| v / 1000.0);
    out.windows.sm_clock = win(w.sm_clock, 1e-6, |v| v * 1e6);
    out.windows.memory_clock = win(w.memory_clock, 1e-6, |v| v * 1e6);
    let g = &sample.gpm;
    let gp = |v: Option<f64>| v.map(|r| (r * 100.0) / 100.0);
    out.gpm.graphics_activity = gp(g.graphics_activity);
    out.gpm.sm_activity = gp(g.sm_activity);
    out.gpm.sm_occupancy = gp(g.sm_occupancy);
    out.gpm.tensor_activity = gp(g.tensor_activity);
    out.gpm.dram_bandwidth = gp(g.dram_bandwidth);
    out.errors = sample.errors.clone();
    out
}

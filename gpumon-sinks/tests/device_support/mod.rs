//! The crate's test GPU with every metric family present, shared (`#[path]`-included, not a test
//! crate) by the OTLP tests and bench (through `otlp_support`) and the Prometheus unit tests
//! (`src/prometheus/tests.rs`: every catalogue metric must appear in a rendering of it).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpumon_core::{ClockEventReasons, DeviceInfo, DeviceSample, ProcessSample, WindowStats, XidCount};

/// `hw.energy` of GPU 0 in tick `n`: how a received export is matched to its snapshot.
pub fn energy_marker(n: u64) -> f64 {
    1_000_000.0 + n as f64 * 250.5
}

fn stats(min: f64, max: f64) -> Option<WindowStats> {
    WindowStats::from_values([min, max, (min + max) / 2.0])
}

/// A GPU with every family present; values depend on the index and the tick `n`.
pub fn full_gpu(index: u32, n: u64) -> DeviceSample {
    let i = u64::from(index);
    let f = f64::from(index);
    let mut info =
        DeviceInfo::new(index, format!("GPU-{index:08x}-1111-2222-3333-444455556666"), "NVIDIA H100 80GB HBM3");
    info.serial = Some(format!("16523220{index:05}"));
    info.pci_bus_id = Some(format!("00000000:{:02X}:00.0", 0x18 + index));
    info.architecture = Some("Hopper".into());
    info.memory_total_bytes = Some(85_520_809_984);
    let mut s = DeviceSample::new(Arc::new(info));
    let load = ((i * 7 + n) % 100) as f64 / 100.0;
    s.utilization.gpu = Some(load);
    s.utilization.memory = Some(load / 2.0);
    s.utilization.encoder = Some(0.0);
    s.utilization.decoder = Some(0.125);
    s.memory.total = Some(85_520_809_984);
    s.memory.used = Some(40_000_000_000 + i * 1_000_000 + n);
    s.memory.reserved = Some(566_231_040);
    s.memory.free = Some(85_520_809_984 - 566_231_040 - 40_000_000_000 - i * 1_000_000 - n);
    s.temperature.gpu = Some(40.0 + f + (n % 5) as f64);
    s.temperature.memory = Some(50.0 + f);
    s.power.usage_watts = Some(300.25 + f * 10.0);
    s.power.limit_watts = Some(700.0);
    s.power.energy_joules = Some(energy_marker(n) + f * 1000.0);
    s.clocks.graphics = Some(1_980_000_000.0);
    s.clocks.sm = Some(1_980_000_000.0);
    s.clocks.memory = Some(2_619_000_000.0);
    s.clocks.video = Some(1_755_000_000.0);
    s.fan_speed = Some(0.3);
    s.performance_state = Some(0);
    s.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP | ClockEventReasons::GPU_IDLE));
    s.pcie.link_generation = Some(5);
    s.pcie.link_width = Some(16);
    s.pcie.replays = Some(i + n);
    s.pcie.tx_bytes_per_second = Some(1.5e9 + f);
    s.pcie.rx_bytes_per_second = Some(2.5e9 + f);
    s.ecc.corrected = Some(10 + i + n);
    s.ecc.uncorrected = Some(i);
    s.ecc.retired_pages_single_bit = Some(1);
    s.ecc.retired_pages_double_bit = Some(0);
    s.ecc.retired_pages_pending = Some(false);
    s.ecc.remapped_rows_correctable = Some(2);
    s.ecc.remapped_rows_uncorrectable = Some(0);
    s.ecc.remapped_rows_pending = Some(false);
    s.ecc.remapped_rows_failure = Some(false);
    let seen = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + i);
    s.xid_errors.push(XidCount::new(13, 1 + n, seen));
    s.xid_errors.push(XidCount::new(79, 1, seen));
    for (k, pid) in [(0u64, 1000 + index * 10), (1, 1001 + index * 10)] {
        let mut p = ProcessSample::new(pid);
        p.name = Some("python3".into());
        p.memory_used = Some((k + 1) * 4_294_967_296);
        p.sm_utilization = Some(load / 2.0);
        p.memory_utilization = Some(0.1);
        p.encoder_utilization = Some(0.0);
        p.decoder_utilization = Some(0.0);
        s.processes.push(p);
    }
    s.windows.gpu_utilization = stats(load / 2.0, load);
    s.windows.memory_utilization = stats(0.1, 0.3);
    s.windows.power_watts = stats(290.0, 310.5);
    s.windows.sm_clock = stats(1.7e9, 1.98e9);
    s.windows.memory_clock = stats(2.6e9, 2.619e9);
    s.gpm.graphics_activity = Some(load);
    s.gpm.sm_activity = Some(load * 0.9);
    s.gpm.sm_occupancy = Some(0.4);
    s.gpm.tensor_activity = Some(0.33);
    s.gpm.dram_bandwidth = Some(0.5);
    s.nvlink = Some(gpumon_core::Nvlink::new(
        (0..2)
            .map(|l| {
                let mut link = gpumon_core::NvlinkLink::new(l);
                link.version = Some(4);
                link.tx_bytes = Some(1_000_000 * (u64::from(l) + 1) + n);
                link.rx_bytes = Some(2_000_000 * (u64::from(l) + 1) + n);
                link.crc_errors = Some(u64::from(l));
                link.replay_errors = Some(0);
                link.recovery_errors = Some(0);
                link
            })
            .collect(),
    ));
    s
}

//! Line-protocol encoding throughput and size.
//!
//! `cargo bench -p gpumon-sinks --features influxdb --bench influx_encode`
//!
//! Throughput is reported in *points* = metric values (fields) per second, one core; the size of
//! one GPU-sample (all lines of one GPU in one snapshot) is printed before the runs.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumon_core::{ClockEventReasons, DeviceInfo, DeviceSample, Snapshot, SystemInfo, WindowStats, XidCount};
use gpumon_sinks::influxdb::{encode_snapshot, LineProtocolEncoder};

/// A fully populated H100-like sample: every default family, one XID code.
fn snapshot(devices: u32) -> Snapshot {
    let devices = (0..devices)
        .map(|i| {
            let mut info = DeviceInfo::new(i, format!("GPU-8b5e4f3c-1d2a-4b6c-9e8f-{i:012x}"), "NVIDIA H100 80GB HBM3");
            info.pci_bus_id = Some(format!("00000000:{:02X}:00.0", 0x17 + i));
            let mut d = DeviceSample::new(Arc::new(info));
            let x = f64::from(i) * 0.0137;
            d.utilization.gpu = Some(0.83 + x);
            d.utilization.memory = Some(0.412_345 + x);
            d.utilization.encoder = Some(0.0);
            d.utilization.decoder = Some(0.0);
            d.memory.used = Some(61_234_567_168 + u64::from(i));
            d.memory.free = Some(24_012_345_344);
            d.memory.total = Some(85_520_809_984);
            d.memory.reserved = Some(566_231_040);
            d.temperature.gpu = Some(64.0);
            d.temperature.memory = Some(71.0);
            d.power.usage_watts = Some(612.337 + x);
            d.power.limit_watts = Some(700.0);
            d.power.energy_joules = Some(987_654_321.123);
            d.clocks.graphics = Some(1.98e9);
            d.clocks.sm = Some(1.98e9);
            d.clocks.memory = Some(2.619e9);
            d.clocks.video = Some(1.545e9);
            d.fan_speed = None;
            d.performance_state = Some(0);
            d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
            d.pcie.link_generation = Some(5);
            d.pcie.link_width = Some(16);
            d.pcie.replays = Some(0);
            d.ecc.corrected = Some(12);
            d.ecc.uncorrected = Some(0);
            d.ecc.retired_pages_single_bit = Some(0);
            d.ecc.retired_pages_double_bit = Some(0);
            d.ecc.retired_pages_pending = Some(false);
            d.ecc.remapped_rows_correctable = Some(0);
            d.ecc.remapped_rows_uncorrectable = Some(0);
            d.ecc.remapped_rows_pending = Some(false);
            d.ecc.remapped_rows_failure = Some(false);
            d.xid_errors.push(XidCount::new(13, 2, UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
            d.windows.gpu_utilization = WindowStats::from_values([0.7, 0.9, 0.85]);
            d.windows.power_watts = WindowStats::from_values([600.0, 640.5, 611.2]);
            d.gpm.sm_activity = Some(0.77);
            d.gpm.tensor_activity = Some(0.52);
            d
        })
        .collect();
    Snapshot::new(Arc::new(SystemInfo::new("gpu-node-017.cluster.example", "bench")), devices)
}

fn bench(c: &mut Criterion) {
    let encoder = LineProtocolEncoder::default();
    for n in [8u32, 64] {
        let s = snapshot(n);
        let mut out = String::new();
        let encoded = encode_snapshot(&s, &mut out);
        println!(
            "{n} GPUs: {} lines, {} points, {} bytes per GPU-sample ({} of them in the `gpu` line)",
            encoded.lines / n as usize,
            encoded.fields / n as usize,
            out.len() / n as usize,
            out.lines().next().map_or(0, |l| l.len() + 1),
        );
        let mut group = c.benchmark_group(format!("influx_encode/{n}_gpus"));
        group.throughput(Throughput::Elements(encoded.fields as u64));
        group.bench_function("encode_snapshot", |b| {
            let mut buf = String::with_capacity(out.len());
            b.iter(|| {
                buf.clear();
                black_box(encoder.encode_snapshot(black_box(&s), &mut buf));
            });
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

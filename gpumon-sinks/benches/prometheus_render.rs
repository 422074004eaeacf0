//! Exposition rendering: 8 fully populated GPUs and 64 devices, native and dcgm names, text 0.0.4
//! and OpenMetrics; and (with `prometheus-http`) whole HTTP scrapes over loopback, with the
//! process CPU time per scrape.
//!
//! ```text
//! cargo bench -p gpumon-sinks --bench prometheus_render --features prometheus-http
//! ```
//!
//! Figures from a 2-core dev VM are in docs/prometheus.md (8 GPUs: ~45 µs; 64 devices: ~300 µs).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gpumon_core::{
    ClockEventReasons, DeviceInfo, DeviceSample, ProcessSample, Snapshot, SystemInfo, WindowStats, XidCount,
};
use gpumon_sinks::prometheus::{Format, Naming, PrometheusHandle, PrometheusSink};

/// A device with every metric family present (2 XID codes, 2 processes).
fn full_device(index: u32) -> DeviceSample {
    let mut info =
        DeviceInfo::new(index, format!("GPU-{index:08x}-1111-2222-3333-444444444444"), "NVIDIA H100 80GB HBM3");
    info.pci_bus_id = Some(format!("00000000:{:02X}:00.0", 0x17 + index % 200));
    info.serial = Some(format!("16500{index}"));
    info.architecture = Some("Hopper".into());
    let mut d = DeviceSample::new(Arc::new(info));
    let f = f64::from(index);
    d.utilization.gpu = Some(0.87 - f / 1000.0);
    d.utilization.memory = Some(0.41);
    d.utilization.encoder = Some(0.0);
    d.utilization.decoder = Some(0.0);
    d.memory.used = Some(61_234_567_168 + u64::from(index));
    d.memory.free = Some(20_000_000_000);
    d.memory.total = Some(85_520_809_984);
    d.memory.reserved = Some(566_231_040);
    d.temperature.gpu = Some(64.0 + f);
    d.temperature.memory = Some(71.0);
    d.power.usage_watts = Some(512.25 + f);
    d.power.limit_watts = Some(700.0);
    d.power.energy_joules = Some(98_765_432.125 + f);
    d.clocks.graphics = Some(1.98e9);
    d.clocks.sm = Some(1.98e9);
    d.clocks.memory = Some(2.619e9);
    d.clocks.video = Some(1.545e9);
    d.fan_speed = Some(0.3);
    d.performance_state = Some(0);
    d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
    d.pcie.link_generation = Some(5);
    d.pcie.link_width = Some(16);
    d.pcie.replays = Some(3);
    d.pcie.tx_bytes_per_second = Some(1.2e9);
    d.pcie.rx_bytes_per_second = Some(3.4e9);
    d.ecc.corrected = Some(12);
    d.ecc.uncorrected = Some(0);
    d.ecc.retired_pages_single_bit = Some(1);
    d.ecc.retired_pages_double_bit = Some(0);
    d.ecc.retired_pages_pending = Some(false);
    d.ecc.remapped_rows_correctable = Some(2);
    d.ecc.remapped_rows_uncorrectable = Some(0);
    d.ecc.remapped_rows_pending = Some(false);
    d.ecc.remapped_rows_failure = Some(false);
    d.xid_errors.push(XidCount::new(13, 1, UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
    d.xid_errors.push(XidCount::new(79, 1, UNIX_EPOCH + Duration::from_secs(1_700_000_500)));
    for pid in [4242, 4343] {
        let mut p = ProcessSample::new(pid);
        p.name = Some("python3".into());
        p.memory_used = Some(30_000_000_000);
        p.sm_utilization = Some(0.4);
        p.memory_utilization = Some(0.2);
        p.encoder_utilization = Some(0.0);
        p.decoder_utilization = Some(0.0);
        d.processes.push(p);
    }
    let w = WindowStats::from_values([0.8, 0.9, 0.91]);
    d.windows.gpu_utilization = w;
    d.windows.memory_utilization = w;
    d.windows.power_watts = WindowStats::from_values([500.0, 520.0]);
    d.windows.sm_clock = WindowStats::from_values([1.9e9, 1.98e9]);
    d.windows.memory_clock = WindowStats::from_values([2.619e9]);
    d.gpm.graphics_activity = Some(0.8);
    d.gpm.sm_activity = Some(0.7);
    d.gpm.sm_occupancy = Some(0.5);
    d.gpm.tensor_activity = Some(0.6);
    d.gpm.dram_bandwidth = Some(0.45);
    d
}

fn snapshot(devices: u32) -> Arc<Snapshot> {
    let mut system = SystemInfo::new("node-1", "bench");
    system.driver_version = Some("570.86.15".into());
    system.cuda_driver_version = Some(12080);
    Arc::new(Snapshot::new(Arc::new(system), (0..devices).map(full_device).collect()))
}

fn handle(naming: Naming, devices: u32) -> PrometheusHandle {
    let sink = PrometheusSink::builder().naming(naming).build().unwrap();
    let h = sink.handle();
    h.store(snapshot(devices));
    h
}

fn render(c: &mut Criterion) {
    let mut g = c.benchmark_group("prometheus_render");
    for devices in [8u32, 64] {
        for (naming, nname) in [(Naming::Native, "native"), (Naming::Dcgm, "dcgm")] {
            for (format, fname) in [(Format::Text, "text"), (Format::OpenMetrics, "openmetrics")] {
                let h = handle(naming, devices);
                let bytes = h.render(format).len();
                g.throughput(Throughput::Bytes(bytes as u64));
                let mut buf = String::with_capacity(bytes * 2);
                g.bench_function(BenchmarkId::new(format!("{nname}/{fname}"), devices), |b| {
                    b.iter(|| {
                        buf.clear();
                        h.render_to(&mut buf, format);
                        std::hint::black_box(buf.len())
                    })
                });
            }
        }
    }
    // The allocating form, as the HTTP listener uses it.
    let h = handle(Naming::Native, 8);
    g.bench_function(BenchmarkId::new("native/text/allocating", 8), |b| b.iter(|| h.render(Format::Text)));
    g.finish();
}

criterion_group!(benches, render);

/// Sequential scrapes over one kept-alive loopback connection: wall time per scrape and this
/// process's CPU time (server + the minimal client) per scrape.
#[cfg(feature = "prometheus-http")]
fn scrape_cpu() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn cpu_seconds() -> f64 {
        // utime + stime of this process, in clock ticks (100 Hz on Linux).
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        ticks / 100.0
    }

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        for devices in [8u32, 64] {
            let sink = PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0)).build().unwrap();
            sink.handle().store(snapshot(devices));
            let addr = sink.local_addr().unwrap();
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            let req = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n";
            let mut buf = vec![0u8; 1 << 20];
            let mut scrape = async || {
                s.write_all(req).await.unwrap();
                // Read the head, then the body by Content-Length.
                let mut n = 0;
                let (head_end, len) = loop {
                    n += s.read(&mut buf[n..]).await.unwrap();
                    if let Some(p) = buf[..n].windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = std::str::from_utf8(&buf[..p]).unwrap().to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap();
                        break (p + 4, len);
                    }
                };
                while n < head_end + len {
                    n += s.read(&mut buf[n..]).await.unwrap();
                }
                len
            };
            let body = scrape().await;
            for _ in 0..200 {
                scrape().await;
            }
            let n = 3000;
            let (cpu0, t0) = (cpu_seconds(), std::time::Instant::now());
            for _ in 0..n {
                scrape().await;
            }
            let (cpu, wall) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
            println!(
                "http scrape, {devices} devices ({body} bytes, text): {:.1} µs wall/scrape, {:.1} µs process CPU/scrape \
                 (server + minimal client, {n} scrapes, 10 ms tick resolution)",
                wall / f64::from(n) * 1e6,
                cpu / f64::from(n) * 1e6
            );
        }
    });
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    #[cfg(feature = "prometheus-http")]
    if !std::env::args().any(|a| a == "--list" || a == "--test") {
        scrape_cpu();
    }
}

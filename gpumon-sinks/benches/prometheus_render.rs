//! Exposition rendering: 8 and 64 mock H100s with every metric family, native and dcgm names, text 0.0.4
//! and OpenMetrics; and (with `prometheus-http`) whole HTTP scrapes over loopback, with the
//! process CPU time per scrape.
//!
//! ```text
//! cargo bench -p gpumon-sinks --bench prometheus_render --features prometheus-http
//! ```
//!
//! Figures from a 2-core dev VM are in docs/prometheus.md (8 GPUs: ~45 µs; 64 devices: ~300 µs).

use std::sync::Arc;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_mock::{FleetProfile, MockSampler};
use gpumon_sinks::prometheus::{Format, Naming, PrometheusHandle, PrometheusSink};

/// `devices` mock H100s sampled with every metric family (processes and PCIe throughput
/// included): the benches' one "full snapshot" fixture, from the mock rather than built by hand.
fn snapshot(devices: u32) -> Arc<Snapshot> {
    let profile = FleetProfile::load(&format!("h100x{devices}")).unwrap();
    let sampler = MockSampler::builder().profile(profile).build().unwrap();
    Arc::new(sampler.sample(&SampleRequest::new(MetricSet::everything(), DeviceFilter::all())).unwrap())
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

//! Cost of one tick per sink encoder for 1, 8 and 64 devices: time per tick AND heap allocations
//! per tick, counted by a counting global allocator. Shows that the cost grows linearly with the
//! number of devices and that the encoders which render into a reused buffer allocate nothing in
//! the steady state.
//!
//! `cargo bench --bench alloc` (plain harness; `-- --quick` runs fewer iterations)
//!
//! Fleets: `h100x1`, `h100x8`, `h100x64` (mock profiles, every default metric family) and
//! `a100-mig64` (16 A100s, each with 3 MIG instances: 64 devices). Each encoder renders one of 16
//! pre-sampled snapshots per iteration (different values, like consecutive ticks). Rows:
//!
//! - `sampler`: `MockSampler::sample` (builds the snapshot: the data model itself allocates).
//! - `prometheus.render_to`: text exposition into a reused `String` (one scrape).
//! - `influx.encode_snapshot`: line protocol into a reused `String`.
//! - `stdout.json` / `stdout.human`: `format_snapshot` into a reused `String`.
//! - `otlp.export (SDK, no wire)`: `OtlpSink::export` with an SDK provider whose exporter drops
//!   the batch (record + SDK collection; no protobuf, no HTTP).
//! - `otlp.export (direct, no wire)`: the direct pipeline's `ExportMetricsServiceRequest` built
//!   from the snapshot and protobuf-encoded into its reused buffer (`OtlpSink::encode_request`;
//!   everything an export does except the HTTP request).
//! - `otlp.export (SDK|direct, HTTP loopback)`: a whole `OtlpSink::export` through each pipeline,
//!   one OTLP/HTTP request to a minimal server on 127.0.0.1 answering 200 (the server's own
//!   few allocations per request are counted too, the same for both rows).
//! - `diagnose.process (healthy|findings active)`: the diagnosis stage on one tick, past its
//!   window — nothing raised, or every GPU with an active finding (memory at 97 %: near_oom).
//! - `report.process (findings active)`: the run report on one tick after that diagnosis (its
//!   sums per GPU, and the lost time of each held finding).
//! - `runtime.tick`: one unscheduled agent tick (sample on the agent's sampling thread, fan-out to
//!   a no-op sink, wait for it) — `AgentHandle::flush`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumon::core::diagnose::{DiagnoseConfig, Diagnoser, Sampling};
use gpumon::core::report::RunReport;
use gpumon::core::{
    Agent, DeviceFilter, MetricSet, Processor, ProcessorContext, SampleRequest, Sampler, Sink, Snapshot,
};
use gpumon::mock::test_env::HttpStub;
use gpumon::mock::{FleetProfile, MockSampler};
use gpumon::sinks::influxdb::LineProtocolEncoder;
use gpumon::sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use gpumon::sinks::prometheus::{Format, PrometheusSink};
use gpumon::sinks::stdout::{format_snapshot, StdoutFormat};
use gpumon_mock::test_kit::DiscardExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

/// `System`, counting every allocation (reallocations count as one) and the bytes asked for.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Row {
    fleet: &'static str,
    devices: usize,
    what: &'static str,
    ns: f64,
    allocs: f64,
    bytes: f64,
}

/// Runs `f` `warmup` times, then `iters` times, and returns (ns, allocations, bytes) per call.
fn measure(warmup: usize, iters: usize, mut f: impl FnMut(usize)) -> (f64, f64, f64) {
    for i in 0..warmup {
        f(i);
    }
    let (a0, b0) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
    let t0 = Instant::now();
    for i in 0..iters {
        f(warmup + i);
    }
    let ns = t0.elapsed().as_nanos() as f64 / iters as f64;
    let allocs = (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / iters as f64;
    let bytes = (BYTES.load(Ordering::Relaxed) - b0) as f64 / iters as f64;
    (ns, allocs, bytes)
}

fn fleet(name: &str) -> FleetProfile {
    match name {
        "a100-mig64" => FleetProfile::from_toml_str(
            r#"
name = "a100-mig64"
description = "16x A100 40GB, each with 3 MIG instances: 64 devices"
[[devices]]
model = "a100-sxm4-40gb"
count = 16
mig = ["3g.20gb", "2g.10gb", "2g.10gb"]
"#,
            "alloc bench",
        )
        .expect("MIG profile"),
        other => FleetProfile::load(other).expect("profile"),
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run one pass then.
    if !std::env::args().any(|a| a == "--bench" || a == "--quick") {
        println!("alloc bench: run with `cargo bench --bench alloc`");
        return;
    }
    let scale = if quick { 10 } else { 1 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut rows = Vec::new();

    for fleet_name in ["h100x1", "h100x8", "h100x64", "a100-mig64"] {
        let sampler = MockSampler::builder().profile(fleet(fleet_name)).build().unwrap();
        let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
        let snapshots: Vec<Arc<Snapshot>> = (0..16).map(|_| Arc::new(sampler.sample(&request).unwrap())).collect();
        let devices = snapshots[0].devices.len();
        // Fewer iterations for bigger fleets: about the same time per row.
        let iters = (4000 / devices.max(1)).clamp(200, 4000) / scale;
        let warmup = (iters / 10).max(20);
        let mut push = |what: &'static str, (ns, allocs, bytes): (f64, f64, f64)| {
            rows.push(Row { fleet: fleet_name, devices, what, ns, allocs, bytes });
        };

        push("sampler", measure(warmup, iters, |_| drop(black_box(sampler.sample(&request).unwrap()))));

        let prom = PrometheusSink::builder().build().unwrap();
        let handle = prom.handle();
        let mut buf = String::new();
        push(
            "prometheus.render_to",
            measure(warmup, iters, |i| {
                handle.store(snapshots[i % 16].clone());
                buf.clear();
                handle.render_to(&mut buf, Format::Text);
                black_box(buf.len());
            }),
        );

        let encoder = LineProtocolEncoder::default();
        let mut buf = String::new();
        push(
            "influx.encode_snapshot",
            measure(warmup, iters, |i| {
                buf.clear();
                black_box(encoder.encode_snapshot(&snapshots[i % 16], &mut buf));
            }),
        );

        for (what, format) in [("stdout.json", StdoutFormat::Json), ("stdout.human", StdoutFormat::Human)] {
            let mut buf = String::new();
            push(
                what,
                measure(warmup, iters, |i| {
                    buf.clear();
                    format_snapshot(&mut buf, &snapshots[i % 16], format).unwrap();
                    black_box(buf.len());
                }),
            );
        }

        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(DiscardExporter).with_interval(Duration::from_secs(86_400)).build())
            .build();
        let mut sink = OtlpSink::with_meter_provider(provider.clone());
        push(
            "otlp.export (SDK, no wire)",
            measure(warmup, (iters / 4).max(50), |i| rt.block_on(sink.export(snapshots[i % 16].clone())).unwrap()),
        );
        rt.block_on(sink.shutdown()).unwrap();
        drop(sink);
        provider.shutdown().unwrap();

        let mut cfg = OtlpConfig::new("http://127.0.0.1:9", Protocol::HttpProtobuf);
        cfg.pipeline = Some(Pipeline::Direct);
        let mut sink = OtlpSink::from_config(&cfg).unwrap();
        push(
            "otlp.export (direct, no wire)",
            measure(warmup, (iters / 4).max(50), |i| {
                black_box(sink.encode_request(&snapshots[i % 16]).map(<[u8]>::len));
            }),
        );
        drop(sink);

        // Kept alive for the rows below; counts only, so its per-request allocations stay few.
        let server = HttpStub::ok_unrecorded();
        let port = server.addr().port();
        for (what, pipeline) in [
            ("otlp.export (SDK, HTTP loopback)", Pipeline::Sdk),
            ("otlp.export (direct, HTTP loopback)", Pipeline::Direct),
        ] {
            let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf);
            cfg.pipeline = Some(pipeline);
            let mut sink = rt.block_on(async { OtlpSink::from_config(&cfg).unwrap() });
            push(
                what,
                measure(warmup, (iters / 4).max(50), |i| rt.block_on(sink.export(snapshots[i % 16].clone())).unwrap()),
            );
            rt.block_on(sink.shutdown()).unwrap();
        }

        for (what, full) in [("diagnose.process (healthy)", false), ("diagnose.process (findings active)", true)] {
            let mut ticks: Vec<Snapshot> = snapshots.iter().map(|s| (**s).clone()).collect();
            if full {
                for s in &mut ticks {
                    for d in &mut s.devices {
                        d.memory.used = d.memory.total.map(|t| t / 100 * 97);
                    }
                }
            }
            let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).unwrap();
            diagnoser.attach(&ProcessorContext::new(Duration::from_secs(1)));
            // Past the 30-tick window first, so findings are raised and the state is steady.
            for i in 0..64 {
                diagnoser.process(&mut ticks[i % 16]);
            }
            push(what, measure(warmup, iters, |i| diagnoser.process(&mut ticks[i % 16])));
            if full {
                // The run report after it: the per-GPU sums and each held finding's lost time.
                let (report, _handle) = RunReport::new();
                let mut report = report.with_diagnosis(
                    &DiagnoseConfig::default(),
                    Sampling::new(Duration::from_secs(1), MetricSet::default()),
                );
                report.attach(&ProcessorContext::new(Duration::from_secs(1)));
                for i in 0..64 {
                    diagnoser.process(&mut ticks[i % 16]);
                    report.process(&mut ticks[i % 16]);
                }
                push(
                    "report.process (findings active)",
                    measure(warmup, iters, |i| report.process(&mut ticks[i % 16])),
                );
            }
        }

        let agent = rt.block_on(async {
            Agent::builder(MockSampler::builder().profile(fleet(fleet_name)).build().unwrap())
                .scheduled(false)
                .sink(gpumon::mock::NullSink)
                .spawn()
                .unwrap()
        });
        push(
            "runtime.tick (sample + no-op sink)",
            measure(warmup, (iters / 2).max(50), |_| rt.block_on(agent.flush(Duration::from_secs(10))).unwrap()),
        );
        rt.block_on(agent.shutdown(Duration::from_secs(5))).unwrap();
    }

    println!("| fleet | devices | what | µs / tick | µs / device | allocations / tick | allocations / device | KiB allocated / tick |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} |",
            r.fleet,
            r.devices,
            r.what,
            r.ns / 1e3,
            r.ns / 1e3 / r.devices as f64,
            r.allocs,
            r.allocs / r.devices as f64,
            r.bytes / 1024.0
        );
    }
    // Linearity: per-device cost at 64 vs 8 devices (1.0 = perfectly linear).
    println!("\nper-device time and allocations, h100x64 ÷ h100x8 (1.00 = linear):");
    for what in rows.iter().filter(|r| r.fleet == "h100x8").map(|r| r.what) {
        let get = |f: &str| rows.iter().find(|r| r.fleet == f && r.what == what);
        if let (Some(a), Some(b)) = (get("h100x8"), get("h100x64")) {
            let t = (b.ns / b.devices as f64) / (a.ns / a.devices as f64);
            let al = if a.allocs > 0.0 {
                format!("{:.2}", (b.allocs / b.devices as f64) / (a.allocs / a.devices as f64))
            } else {
                format!("{:.1} → {:.1} per tick", a.allocs, b.allocs)
            };
            println!("  {what:38} time {t:.2}  allocations {al}");
        }
    }
}

//! Cost of one OTLP export of 8 GPUs with every metric family (≈ 600 data points), in process.
//!
//! - `sdk_only`: record + SDK collection + an exporter that drops the batch (what the sink and
//!   the OpenTelemetry SDK cost, without the wire).
//! - `direct_only`: the direct pipeline's request built from the snapshot and protobuf-encoded
//!   into its reused buffer (`OtlpSink::encode_request`), without the wire.
//! - `http_loopback_sdk` / `http_loopback_direct`: a whole `export` through each pipeline
//!   (`pipeline = "sdk"`: SDK + opentelemetry-otlp's exporter; `pipeline = "direct"`: the sink's
//!   own encoder and async reqwest client), one OTLP/HTTP request to a minimal HTTP server on
//!   127.0.0.1 that answers 200 at once.
//!
//! `cargo bench -p gpumon-sinks --features otlp --bench otlp_export`

#[path = "../tests/otlp_support/mod.rs"]
mod otlp_support;

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumon_core::Sink;
use gpumon_mock::test_env::HttpStub;
use gpumon_mock::test_kit::DiscardExporter;
use gpumon_sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let snapshots: Vec<_> = (0..16).map(|n| Arc::new(otlp_support::fleet(8, n, false))).collect();
    let points: usize = snapshots[0].devices.iter().map(|d| d.points().len()).sum();

    let mut group = c.benchmark_group("otlp_export_8gpu");
    group.throughput(Throughput::Elements(points as u64));

    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(DiscardExporter).with_interval(Duration::from_secs(86_400)).build())
        .build();
    let mut sink = OtlpSink::with_meter_provider(provider.clone());
    let mut i = 0;
    group.bench_function("sdk_only", |b| {
        b.iter(|| {
            i += 1;
            rt.block_on(sink.export(snapshots[i % snapshots.len()].clone())).unwrap();
        })
    });
    rt.block_on(sink.shutdown()).unwrap();
    drop(sink);
    provider.shutdown().unwrap();

    let mut sink = rt.block_on(async {
        let mut cfg = OtlpConfig::new("http://127.0.0.1:9", Protocol::HttpProtobuf);
        cfg.pipeline = Some(Pipeline::Direct);
        OtlpSink::from_config(&cfg).unwrap()
    });
    group.bench_function("direct_only", |b| {
        b.iter(|| {
            i += 1;
            std::hint::black_box(sink.encode_request(&snapshots[i % snapshots.len()]).map(<[u8]>::len));
        })
    });
    drop(sink);

    let server = HttpStub::ok_unrecorded();
    let port = server.addr().port();
    for (name, pipeline) in [("http_loopback_sdk", Pipeline::Sdk), ("http_loopback_direct", Pipeline::Direct)] {
        let mut sink = rt.block_on(async {
            let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf);
            cfg.pipeline = Some(pipeline);
            OtlpSink::from_config(&cfg).unwrap()
        });
        group.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                rt.block_on(sink.export(snapshots[i % snapshots.len()].clone())).unwrap();
            })
        });
        rt.block_on(sink.shutdown()).unwrap();
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

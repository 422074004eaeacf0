//! Remote-write cost per 8-GPU snapshot against the scrape endpoint's render of the same snapshot.
//!
//! `cargo bench -p gpumon-sinks --features remote-write --bench remote_write_encode`
//!
//! Prints the bytes on the wire first: the exposition text a scrape transfers (uncompressed), the
//! protobuf `WriteRequest`, and the snappy-compressed request body remote write sends.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon_core::{SampleRequest, Sampler, Snapshot};
use gpumon_sinks::prometheus::{Format, PrometheusSink};
use gpumon_sinks::remote_write::encode::{compress, Encoder};
use gpumon_sinks::remote_write::RemoteWriteConfig;

fn snapshot() -> Arc<Snapshot> {
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    Arc::new(sampler.sample(&SampleRequest::default()).unwrap())
}

fn bench(c: &mut Criterion) {
    let snap = snapshot();
    let sink = PrometheusSink::builder().build().unwrap();
    let handle = sink.handle();
    handle.store(snap.clone());
    let config = RemoteWriteConfig::new("http://127.0.0.1:9090/api/v1/write");
    let mut encoder = Encoder::from_config(&config);

    let text = handle.render(Format::Text);
    let mut body = Vec::new();
    let samples = encoder.encode_snapshot(&snap, &mut body);
    let wire = compress(&body).unwrap();
    eprintln!(
        "8-GPU snapshot (h100x8): {samples} series; scrape text {} B; WriteRequest {} B; snappy {} B ({:.1} B/sample)",
        text.len(),
        body.len(),
        wire.len(),
        wire.len() as f64 / samples as f64
    );

    let mut g = c.benchmark_group("remote_write_8gpu");
    g.bench_function("scrape_render_text", |b| b.iter(|| black_box(handle.render(Format::Text))));
    g.bench_function("encode", |b| {
        b.iter(|| {
            body.clear();
            black_box(encoder.encode_snapshot(&snap, &mut body))
        })
    });
    g.bench_function("encode_and_compress", |b| {
        b.iter(|| {
            body.clear();
            encoder.encode_snapshot(&snap, &mut body);
            black_box(compress(&body).unwrap())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

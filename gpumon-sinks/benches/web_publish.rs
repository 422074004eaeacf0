//! The web view's cost per tick: `WebHandle::publish` (what `Sink::export` does) for 8 mock H100s
//! with 0, 1 and 10 live clients (in-process clients, drained every tick, so that the figure is
//! the sink's own work: history point, one JSON serialisation, one queue push per client), and
//! with 64 devices. Prints the page weight (gzip) once.
//!
//! ```text
//! cargo bench -p gpumon-sinks --bench web_publish --features web
//! ```
//!
//! Figures are in docs/web.md.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, BenchmarkId, Criterion};
use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_sinks::web::{page_weight, page_weight_gzip, WebConfig, WebSink};

fn snapshot(profile: &str) -> Snapshot {
    let sampler = gpumon_mock::MockSampler::from_profile_name(profile).unwrap();
    sampler.sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::all())).unwrap()
}

fn publish(c: &mut Criterion) {
    eprintln!(
        "page weight: {} bytes gzip ({} bytes uncompressed): index.html, app.js, app.css, uPlot.iife.min.js, uPlot.min.css",
        page_weight_gzip(),
        page_weight()
    );
    let mut g = c.benchmark_group("web_publish");
    let mut dropped = 0;
    g.measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for (profile, clients) in [("h100x8", 0), ("h100x8", 1), ("h100x8", 10), ("h100x64", 0), ("h100x64", 10)] {
        let base = snapshot(profile);
        let sink = WebSink::without_listener(&WebConfig::default()).unwrap();
        let h = sink.handle();
        // Fill the history ring first: the steady state reuses the oldest point's buffers.
        for _ in 0..WebConfig::default().history {
            h.publish(Arc::new(base.clone()));
        }
        let mut live: Vec<_> = (0..clients).map(|_| h.subscribe().unwrap()).collect();
        let mut t = SystemTime::now();
        let h2 = h.clone();
        g.bench_function(BenchmarkId::new(profile, format!("{clients}_clients")), |b| {
            b.iter_batched(
                || {
                    t += Duration::from_secs(1);
                    Arc::new(base.clone().with_taken_at(t))
                },
                |snap| {
                    h.publish(snap);
                    for c in &mut live {
                        while let Some(e) = c.try_next() {
                            std::hint::black_box(e);
                        }
                    }
                },
                criterion::BatchSize::SmallInput,
            );
        });
        dropped += h2.dropped_clients();
        assert_eq!(h2.live_clients(), clients, "every bench client stayed connected");
    }
    g.finish();
    // The figures above are only meaningful if no client was cut off while being drained.
    assert_eq!(dropped, 0, "a bench client was dropped");
}

criterion_group!(benches, publish);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}

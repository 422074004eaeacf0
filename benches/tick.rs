//! One sampling tick through the runtime into a no-op sink, for 8 and 64 mock devices, measured
//! side by side with the bare sampler call and the point walk every sink does, so the runtime's
//! own share can be read as a ratio.
//!
//! `cargo bench --bench tick`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumon::core::{Agent, Sampler};

mod common;

fn tick(c: &mut Criterion) {
    let rt = common::runtime();
    let mut group = common::group(c, "tick", 4);
    for devices in [8usize, 64] {
        let (sampler, request) = common::sampler_baseline(&mut group, devices);

        let snapshot = sampler.sample(&request).unwrap();
        group.bench_with_input(BenchmarkId::new("visit_points", devices), &devices, |b, _| {
            b.iter(|| {
                let mut n = 0usize;
                for d in &snapshot.devices {
                    d.visit_points(|p| {
                        std::hint::black_box(p);
                        n += 1;
                    });
                }
                n
            })
        });

        let handle = rt.block_on(async {
            Agent::builder(common::sampler(devices)).scheduled(false).sink(gpumon::mock::NullSink).spawn().unwrap()
        });
        group.bench_with_input(BenchmarkId::new("runtime_flush_to_noop_sink", devices), &devices, |b, _| {
            b.iter(|| rt.block_on(handle.flush(Duration::from_secs(10))).unwrap())
        });
        rt.block_on(handle.shutdown(Duration::from_secs(5))).unwrap();
    }
    group.finish();
}

criterion_group!(benches, tick);
criterion_main!(benches);

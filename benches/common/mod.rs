//! What the root benches share (a module of each, not a bench of its own).
#![allow(dead_code)] // each bench uses its own subset

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion};
use gpumon::core::{DeviceFilter, MetricSet, SampleRequest, Sampler};
use gpumon::mock::MockSampler;

/// A runtime shaped like the agent's: two worker threads.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The benchmark group `name`, each bench measured for `seconds` after a 1 s warm-up.
pub fn group<'a>(c: &'a mut Criterion, name: &str, seconds: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.measurement_time(Duration::from_secs(seconds)).warm_up_time(Duration::from_secs(1));
    group
}

/// The mock sampler of `devices` H100s.
pub fn sampler(devices: usize) -> MockSampler {
    MockSampler::from_profile_name(&format!("h100x{devices}")).unwrap()
}

/// The mock [`sampler`]`(devices)` and a request for the default metrics, after
/// benching the bare sampler call as `sampler_only/<devices>` in `group`: the baseline the
/// group's other figures are read against.
pub fn sampler_baseline(group: &mut BenchmarkGroup<'_, WallTime>, devices: usize) -> (MockSampler, SampleRequest) {
    sampler_baseline_of(group, devices, MetricSet::default())
}

/// [`sampler_baseline`] sampling `metrics`.
pub fn sampler_baseline_of(
    group: &mut BenchmarkGroup<'_, WallTime>,
    devices: usize,
    metrics: MetricSet,
) -> (MockSampler, SampleRequest) {
    let sampler = sampler(devices);
    let request = SampleRequest::new(metrics, DeviceFilter::all());
    group.bench_with_input(BenchmarkId::new("sampler_only", devices), &devices, |b, _| {
        b.iter(|| std::hint::black_box(sampler.sample(&request).unwrap()))
    });
    (sampler, request)
}

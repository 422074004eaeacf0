//! What the root benches share (a module of each, not a bench of its own).
#![allow(dead_code)] // each bench uses its own subset

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId};
use gpumon::core::{DeviceFilter, MetricSet, SampleRequest, Sampler};
use gpumon::mock::MockSampler;

/// The mock profile of `devices` H100s.
pub fn profile(devices: usize) -> String {
    format!("h100x{devices}")
}

/// The mock sampler of [`profile`]`(devices)` and a request for the default metrics, after
/// benching the bare sampler call as `sampler_only/<devices>` in `group`: the baseline the
/// group's other figures are read against.
pub fn sampler_baseline(group: &mut BenchmarkGroup<'_, WallTime>, devices: usize) -> (MockSampler, SampleRequest) {
    let sampler = MockSampler::from_profile_name(&profile(devices)).unwrap();
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    group.bench_with_input(BenchmarkId::new("sampler_only", devices), &devices, |b, _| {
        b.iter(|| std::hint::black_box(sampler.sample(&request).unwrap()))
    });
    (sampler, request)
}

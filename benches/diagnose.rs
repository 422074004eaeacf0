//! Cost of the diagnosis stage per tick for 8 and 64 mock devices, measured side by side with
//! the bare mock sample and a whole tick through the runtime, so its share reads as a ratio.
//! Two cases: healthy training (nothing raised) and every GPU with an active finding (the
//! steady state of a diagnosed problem).
//!
//! `cargo bench --bench diagnose`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumon::core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon::core::{Agent, DeviceFilter, MetricSet, Processor, ProcessorContext, SampleRequest, Sampler, Snapshot};
use gpumon::mock::MockSampler;

fn diagnoser() -> Diagnoser {
    let mut d = Diagnoser::new(DiagnoseConfig::default()).unwrap();
    d.attach(&ProcessorContext::new(Duration::from_secs(1)));
    d
}

/// Sixteen consecutive ticks; with `full`, every GPU's memory at 97 % (near_oom raised).
fn ticks(sampler: &MockSampler, full: bool) -> Vec<Snapshot> {
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    (0..16)
        .map(|_| {
            let mut s = sampler.sample(&request).unwrap();
            if full {
                for d in &mut s.devices {
                    d.memory.used = d.memory.total.map(|t| t / 100 * 97);
                }
            }
            s
        })
        .collect()
}

fn diagnose(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut group = c.benchmark_group("diagnose");
    group.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for devices in [8usize, 64] {
        let profile = format!("h100x{devices}");
        let sampler = MockSampler::from_profile_name(&profile).unwrap();
        let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
        group.bench_with_input(BenchmarkId::new("sampler_only", devices), &devices, |b, _| {
            b.iter(|| std::hint::black_box(sampler.sample(&request).unwrap()))
        });

        for (case, full) in [("process_healthy", false), ("process_findings_active", true)] {
            let mut snapshots = ticks(&sampler, full);
            let mut d = diagnoser();
            // Past the window: findings raised, steady state.
            for i in 0..64 {
                d.process(&mut snapshots[i % 16]);
            }
            let mut i = 0;
            group.bench_with_input(BenchmarkId::new(case, devices), &devices, |b, _| {
                b.iter(|| {
                    i += 1;
                    d.process(&mut snapshots[i % 16]);
                })
            });
        }

        for (case, with) in [("runtime_tick_without_diagnosis", false), ("runtime_tick_with_diagnosis", true)] {
            let handle = rt.block_on(async {
                let mut b = Agent::builder(MockSampler::from_profile_name(&profile).unwrap())
                    .scheduled(false)
                    .sink(gpumon::mock::NullSink);
                if with {
                    b = b.processor(diagnoser());
                }
                b.spawn().unwrap()
            });
            group.bench_with_input(BenchmarkId::new(case, devices), &devices, |b, _| {
                b.iter(|| rt.block_on(handle.flush(Duration::from_secs(10))).unwrap())
            });
            rt.block_on(handle.shutdown(Duration::from_secs(5))).unwrap();
        }
    }
    group.finish();
}

criterion_group!(benches, diagnose);
criterion_main!(benches);

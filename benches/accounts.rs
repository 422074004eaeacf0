//! Cost of the GPU-time accounts per tick, side by side with the tick without them: a whole
//! tick through the runtime (the mock sample, diagnosis and the run report, into a no-op sink)
//! for 8 and 64 mock devices, with and without the [`Accounts`] stage, in alternating rounds
//! (`…/roundN`); and the stage's own `process` on sampled snapshots. The accounts' share is the
//! ratio of the two ticks' medians over the rounds.
//!
//! `cargo bench --bench accounts --features mock`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumon::core::accounts::Accounts;
use gpumon::core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon::core::report::RunReport;
use gpumon::core::{Agent, DeviceFilter, MetricSet, Processor, ProcessorContext, SampleRequest, Sampler};

mod common;

/// Alternating rounds of the two whole-tick cases.
const ROUNDS: u32 = 3;

fn accounts(c: &mut Criterion) {
    let rt = common::runtime();
    let mut group = common::group(c, "accounts", 3);
    for devices in [8usize, 64] {
        // Side by side: the two agents run at once and are measured in alternating rounds
        // (without, with, without, with, …), so that a change of the machine's load lands on
        // both; the rounds' medians give the ratio, their spread the error bar.
        let agents: Vec<_> = [false, true]
            .into_iter()
            .map(|with_accounts| {
                rt.block_on(async {
                    let mut builder = Agent::builder(common::sampler(devices))
                        .scheduled(false)
                        .processor(Diagnoser::new(DiagnoseConfig::default()).unwrap())
                        .processor(RunReport::new().0);
                    if with_accounts {
                        builder = builder.processor(Accounts::new().0);
                    }
                    builder.sink(gpumon::mock::NullSink).spawn().unwrap()
                })
            })
            .collect();
        for round in 1..=ROUNDS {
            for (case, handle) in ["tick_without_accounts", "tick_with_accounts"].into_iter().zip(&agents) {
                let id = BenchmarkId::new(format!("{case}/round{round}"), devices);
                group.bench_with_input(id, &devices, |b, _| {
                    b.iter(|| rt.block_on(handle.flush(Duration::from_secs(10))).unwrap())
                });
            }
        }
        for handle in agents {
            rt.block_on(handle.shutdown(Duration::from_secs(5))).unwrap();
        }

        let sampler = common::sampler(devices);
        let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
        let mut snapshots: Vec<_> = (0..16).map(|_| sampler.sample(&request).unwrap()).collect();
        let (mut stage, _) = Accounts::new();
        stage.attach(&ProcessorContext::new(Duration::from_secs(1)));
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("accounts_process", devices), &devices, |b, _| {
            b.iter(|| {
                i += 1;
                stage.process(&mut snapshots[i % 16]);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, accounts);
criterion_main!(benches);

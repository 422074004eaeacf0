//! Every built-in scenario, sampled by the mock and diagnosed, raises exactly the findings of
//! its row in the contract table (tests/support/expected_findings.rs), on the right GPUs, within
//! the stated number of ticks; healthy scenarios raise nothing over many seeds.

#[path = "support/expected_findings.rs"]
mod expected_findings;

use expected_findings::{diagnoser, table, Outcome};
use gpumon_core::{DeviceFilter, MetricSet, Processor, SampleRequest, Sampler};
use gpumon_mock::{MockSampler, Scenario};

fn run(scenario: &str, metrics: MetricSet, seed: u64, ticks: u64) -> (Outcome, Option<u32>) {
    let loaded = Scenario::builtin(scenario).unwrap_or_else(|e| panic!("scenario {scenario}: {e}"));
    let faulted = loaded.faults.iter().find_map(|f| f.device());
    let sampler = MockSampler::builder()
        .profile(gpumon_mock::FleetProfile::load("h100x8").unwrap())
        .scenario(loaded)
        .seed(seed)
        .build()
        .unwrap();
    let request = SampleRequest::new(metrics, DeviceFilter::all());
    let mut d = diagnoser();
    let mut outcome = Outcome::default();
    for tick in 1..=ticks {
        let mut snapshot = sampler.sample(&request).unwrap().with_seq(tick);
        d.process(&mut snapshot);
        outcome.observe(tick, &snapshot);
    }
    (outcome, faulted)
}

#[test]
fn every_scenario_raises_exactly_its_findings_in_time() {
    for e in table() {
        for seed in [1, 7, 42] {
            let (outcome, faulted) = run(e.scenario, e.metrics, seed, e.ticks);
            assert_eq!(outcome.gpus, 8);
            outcome.check(&e, faulted, &format!("{} (seed {seed}, mock)", e.scenario));
        }
    }
}

/// No false alarms: healthy training and idle GPUs over 50 seeds × 600 ticks × 8 GPUs.
#[test]
fn healthy_scenarios_raise_nothing_over_many_seeds() {
    for scenario in ["training", "idle"] {
        for seed in 0..50 {
            let (outcome, _) = run(scenario, MetricSet::default(), seed, 600);
            assert!(outcome.raised.is_empty(), "{scenario} seed {seed}: raised {:?}", outcome.raised);
        }
    }
}

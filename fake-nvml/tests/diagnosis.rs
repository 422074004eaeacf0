//! The diagnosis contract through the real NVML code path: gpumon's `NvmlSampler` reads the fake
//! libnvidia-ml (one fake tick = one sampling interval), the diagnoser runs on what it reads,
//! and every scenario raises exactly the findings of its row in the contract table — the same
//! table the mock is held to (gpumon-mock/tests/support/expected_findings.rs).

mod common;

#[path = "../../gpumon-mock/tests/support/expected_findings.rs"]
mod expected_findings;

use std::time::Duration;

use common::Fake;
use expected_findings::{diagnoser, faulted, table, Outcome};
use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{DeviceFilter, Processor, SampleRequest, Sampler};

#[test]
fn every_scenario_raises_exactly_its_findings_through_nvml() {
    for e in table() {
        // The healthy rows run 600 ticks on the mock over 50 seeds; one seed and the onset plus
        // two windows is enough to hold the NVML path to the same verdict.
        let ticks = e.ticks.min(e.within.max(60) + 60);
        let spec = format!("profile=h100x8;scenario={};seed=7;clock=manual", e.scenario);
        let fake = Fake::new(&spec);
        let faulted = faulted(&gpumon_mock::Scenario::builtin(e.scenario).unwrap());
        let sampler = NvmlSampler::builder()
            .library_path(fake.library())
            .xid_poll_interval(Duration::from_millis(5))
            .build()
            .expect("NvmlSampler on the fake");
        let request = SampleRequest::new(e.metrics, DeviceFilter::all());
        let mut d = diagnoser();
        let mut outcome = Outcome::default();
        for tick in 1..=ticks {
            fake.set_tick(tick - 1);
            if e.scenario == "ecc-burst" {
                // XID events arrive on the sampler's event thread: give it a moment per tick.
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut snapshot = sampler.sample(&request).unwrap().with_seq(tick);
            d.process(&mut snapshot);
            outcome.observe(tick, &snapshot);
        }
        assert_eq!(outcome.gpus, 8, "{}", e.scenario);
        outcome.check(&e, faulted, &format!("{} (fake libnvidia-ml)", e.scenario));
    }
}

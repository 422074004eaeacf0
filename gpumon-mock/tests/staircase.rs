//! Issue #42: the step-boundary staircase of a pipeline schedule is told apart from
//! data-parallel ranks waiting at once. Four GPUs of one job (one process owner), read through
//! the mock's driver sampling model at a 1/6 s driver period and a 0.5 s interval:
//!
//! - as the four stages of a 1F1B pipeline (8 micro-batches: each stage idles 3 of 11 slots,
//!   27 % of the step, in a staircase at the step's ends), they are `pipeline_bubbles`, never
//!   `dataloader_starvation`;
//! - as four data-parallel ranks waiting for their input at the same moments, the same busy
//!   share, they are `dataloader_starvation`, never `pipeline_bubbles`;
//! - as the same 1F1B stages with nothing saying they run one job (no owner), they are "cannot
//!   tell" (`starvation_or_bubbles`): other jobs' GPUs starving on their own read the same.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon_core::{
    DeviceFilter, Family, FindingKind, MetricSet, Owner, ProcessSample, Processor, ProcessorContext, Snapshot,
    Transition,
};
use gpumon_mock::sim::{PipelineSpec, Schedule};
use gpumon_mock::{FleetProfile, MockFleet, Phase, Scenario, Shape, Workload};

const INTERVAL_S: f64 = 0.5;
const DRIVER_S: f64 = 1.0 / 6.0;
const TICKS: u64 = 240; // 120 s: four 30 s windows

/// Every (GPU, kind) raised over the run of the four GPUs whose busy stretches within each
/// step of `step_s` are `patterns`; `owned`: every GPU's process has the same owner.
fn raised(patterns: &[Vec<[f64; 2]>], step_s: f64, owned: bool) -> BTreeSet<(u32, FindingKind)> {
    let mut scenario = Scenario::new(Workload::Idle)
        .with_driver_period(Duration::from_secs_f64(DRIVER_S))
        .with_tick_period(Duration::from_secs_f64(INTERVAL_S));
    scenario.phases = patterns
        .iter()
        .enumerate()
        .map(|(gpu, pattern)| Phase {
            gpus: Some(vec![gpu as u32]),
            shape: Shape::Pattern,
            step_s,
            pattern: pattern.clone(),
            // Steps in lockstep (one jitter for the job), as a pipeline's and a data-parallel
            // job's are.
            jitter: 0.03,
            jitter_key: Some(42),
            busy: 0.97,
            idle: 0.0,
            memory: 0.6,
            memory_controller: Some(0.4),
            ..Phase::default()
        })
        .collect();
    let profile = FleetProfile::of_model("h100", 4).expect("an H100 node");
    let epoch = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let fleet = MockFleet::new(&profile, &scenario, 7).expect("the scenario builds").with_epoch(epoch);
    let metrics = MetricSet::default().with(Family::Processes);
    let interval = Duration::from_secs_f64(INTERVAL_S);
    let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).expect("default settings");
    diagnoser.attach(&ProcessorContext::new(interval));
    let owner = Arc::new(Owner { uid: Some(1000), ..Owner::default() });
    let mut said = BTreeSet::new();
    for tick in 1..=TICKS {
        let mut devices = fleet.sample(tick, metrics, &DeviceFilter::all());
        for d in &mut devices {
            let mut p = ProcessSample::new(20_000 + d.info.index);
            p.memory_used = d.memory.used;
            p.owner = owned.then(|| owner.clone());
            d.processes = vec![p];
        }
        let at: SystemTime = epoch + interval.mul_f64(tick as f64);
        let mut s = Snapshot::new(fleet.system(), devices).with_seq(tick).with_taken_at(at);
        diagnoser.process(&mut s);
        for e in &s.output::<gpumon_core::Diagnosis>().expect("a diagnosis").events {
            if e.transition == Transition::Raised {
                said.insert((e.finding.gpu.expect("a GPU's finding"), e.finding.kind));
            }
        }
    }
    said
}

/// A 4-stage 1F1B step of 8 micro-batches: its length and each stage's busy stretches.
fn one_f_one_b() -> (f64, Vec<Vec<[f64; 2]>>) {
    let spec = PipelineSpec {
        schedule: Schedule::OneFOneB,
        forward_s: vec![0.1; 4],
        backward_ratio: 2.0,
        micro_batches: 8,
        transfer_s: 0.0,
        optimizer_s: 0.0,
    };
    let step = spec.step();
    (step.step_s, step.busy)
}

fn kinds(said: &BTreeSet<(u32, FindingKind)>) -> BTreeSet<FindingKind> {
    said.iter().map(|(_, k)| *k).collect()
}

#[test]
fn a_one_f_one_b_staircase_is_pipeline_bubbles_not_starvation() {
    let (step_s, busy) = one_f_one_b();
    // The textbook bubble: (stages − 1) / (micro-batches + stages − 1) = 3 / 11 of each step,
    // on every stage.
    for stage in &busy {
        let idle = 1.0 - stage.iter().map(|[a, b]| b - a).sum::<f64>() / step_s;
        assert!((idle - 3.0 / 11.0).abs() < 0.01, "idle share {idle}");
    }
    let said = raised(&busy, step_s, true);
    assert!(!kinds(&said).contains(&FindingKind::DataloaderStarvation), "{said:?}");
    let bubbles: Vec<u32> =
        said.iter().filter(|(_, k)| *k == FindingKind::PipelineBubbles).map(|(g, _)| *g).collect();
    // The first stage idles in short gaps between its operations (its bubble is spread over the
    // step, shorter than the driver's period): it may read flat. The later stages' bubbles are
    // the staircase at the step's ends.
    assert!(bubbles.len() >= 2 && bubbles.iter().all(|g| *g >= 1), "{said:?}");
}

#[test]
fn ranks_waiting_at_once_with_the_same_busy_share_are_starvation_not_bubbles() {
    let (step_s, busy) = one_f_one_b();
    // Every rank busy the same 8/11 of the step, all idle at its start, in lockstep.
    let share = busy[0].iter().map(|[a, b]| b - a).sum::<f64>() / step_s;
    let together = vec![vec![[step_s * (1.0 - share), step_s]]; 4];
    let said = raised(&together, step_s, true);
    assert_eq!(kinds(&said), BTreeSet::from([FindingKind::DataloaderStarvation]), "{said:?}");
    assert_eq!(said.len(), 4, "{said:?}");
}

#[test]
fn stages_of_a_job_nothing_names_cannot_tell_loaders_from_bubbles() {
    let (step_s, busy) = one_f_one_b();
    let said = raised(&busy, step_s, false);
    let k = kinds(&said);
    assert!(!k.contains(&FindingKind::PipelineBubbles) && !k.contains(&FindingKind::DataloaderStarvation), "{said:?}");
    assert!(k.contains(&FindingKind::StarvationOrBubbles), "{said:?}");
}

//! Issue #42: the step-boundary staircase of a pipeline schedule is told apart from
//! data-parallel ranks waiting at once. Four GPUs of one job (one process owner), read through
//! the mock's driver sampling model at a 1/6 s driver period and a 0.5 s interval:
//!
//! - as the four stages of a 1F1B pipeline (8 micro-batches: each stage idles 3 of 11 slots,
//!   27 % of the step, in a staircase at the step's ends; each holding its own memory, the
//!   micro-batches in flight on it), they are never
//!   `dataloader_starvation`: the end stages are `pipeline_bubbles`, the middle ones bubbles or
//!   "cannot tell";
//! - as four data-parallel ranks waiting for their input at the same moments, the same busy
//!   share and the same memory, they are `dataloader_starvation`, never `pipeline_bubbles`;
//! - as the same 1F1B stages with nothing saying they run one job (no owner), they are "cannot
//!   tell" (`starvation_or_bubbles`): other jobs' GPUs starving on their own read the same.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::attribution::Owner;
use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon_core::{
    DeviceFilter, Family, FindingKind, MetricSet, ProcessSample, Processor, ProcessorContext, Snapshot, Transition,
};
use gpumon_mock::sim::{PipelineSpec, Schedule};
use gpumon_mock::{FleetProfile, MockFleet, Phase, Scenario, Shape, Workload};

const INTERVAL_S: f64 = 0.5;
const DRIVER_S: f64 = 1.0 / 6.0;
const TICKS: u64 = 240; // 120 s: four 30 s windows

/// Every (GPU, kind) raised over the run of the four GPUs whose busy stretches within each
/// step of `step_s` are `patterns` and who hold `memory` (share of each GPU's); `owned`: every
/// GPU's process has the same owner.
fn raised(patterns: &[Vec<[f64; 2]>], memory: &[f64], step_s: f64, owned: bool) -> BTreeSet<(u32, FindingKind)> {
    let mut scenario = Scenario::new(Workload::Idle)
        .with_driver_period(Duration::from_secs_f64(DRIVER_S))
        .with_tick_period(Duration::from_secs_f64(INTERVAL_S));
    scenario.phases = patterns
        .iter()
        .enumerate()
        .map(|(gpu, pattern)| {
            let mut p = Phase::default();
            p.gpus = Some(vec![gpu as u32]);
            p.shape = Shape::Pattern;
            p.step_s = step_s;
            p.pattern = pattern.clone();
            // Steps in lockstep (one jitter for the job), as a pipeline's and a data-parallel
            // job's are.
            p.jitter = 0.03;
            p.jitter_key = Some(42);
            p.busy = 0.97;
            p.idle = 0.0;
            p.memory = memory[gpu];
            p.memory_controller = Some(0.4);
            p
        })
        .collect();
    let profile = FleetProfile::of_model("h100", 4).expect("an H100 node");
    let epoch = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let fleet = MockFleet::new(&profile, &scenario, 7).expect("the scenario builds").with_epoch(epoch);
    // What a default agent samples (the opt-in families diagnosis reads included).
    let metrics = MetricSet::default().with_stage_inputs().with(Family::Processes);
    let interval = Duration::from_secs_f64(INTERVAL_S);
    let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).expect("default settings");
    diagnoser.attach(&ProcessorContext::new(interval));
    let mut owner = Owner::default();
    owner.uid = Some(1000);
    let owner = Arc::new(owner);
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

/// A 4-stage 1F1B step of 8 micro-batches: its length, each stage's busy stretches and the
/// memory each stage holds (its own: the first holds the most micro-batches in flight).
fn one_f_one_b() -> (f64, Vec<Vec<[f64; 2]>>, Vec<f64>) {
    let spec = PipelineSpec {
        schedule: Schedule::OneFOneB,
        forward_s: vec![0.1; 4],
        backward_ratio: 2.0,
        micro_batches: 8,
        transfer_s: 0.0,
        optimizer_s: 0.0,
    };
    let step = spec.step();
    (step.step_s, step.busy, spec.stage_memory(0.6))
}

fn kinds(said: &BTreeSet<(u32, FindingKind)>) -> BTreeSet<FindingKind> {
    said.iter().map(|(_, k)| *k).collect()
}

#[test]
fn a_one_f_one_b_staircase_is_pipeline_bubbles_not_starvation() {
    let (step_s, busy, memory) = one_f_one_b();
    // The textbook bubble: (stages − 1) / (micro-batches + stages − 1) = 3 / 11 of each step,
    // on every stage.
    for stage in &busy {
        let idle = 1.0 - stage.iter().map(|[a, b]| b - a).sum::<f64>() / step_s;
        assert!((idle - 3.0 / 11.0).abs() < 0.01, "idle share {idle}");
    }
    let said = raised(&busy, &memory, step_s, true);
    // Never read as ranks waiting at once.
    assert!(!kinds(&said).contains(&FindingKind::DataloaderStarvation), "{said:?}");
    // The end stages idle most in turn with the others: bubbles. The middle stages' bubbles
    // overlap their neighbours' in part (the staircase): named bubbles, or — neither together
    // nor in turn clearly — "cannot tell", never a loader.
    let on = |kind| said.iter().filter(|(_, k)| *k == kind).count();
    assert!(on(FindingKind::PipelineBubbles) >= 2, "{said:?}");
    assert_eq!(on(FindingKind::PipelineBubbles) + on(FindingKind::StarvationOrBubbles), 4, "{said:?}");
}

#[test]
fn ranks_waiting_at_once_with_the_same_busy_share_are_starvation_not_bubbles() {
    let (step_s, busy, _) = one_f_one_b();
    // Every rank busy the same 8/11 of the step, all idle at its start, in lockstep.
    let share = busy[0].iter().map(|[a, b]| b - a).sum::<f64>() / step_s;
    let together = vec![vec![[step_s * (1.0 - share), step_s]]; 4];
    // Replicas: the same memory on every rank.
    let said = raised(&together, &[0.6; 4], step_s, true);
    assert_eq!(kinds(&said), BTreeSet::from([FindingKind::DataloaderStarvation]), "{said:?}");
    assert_eq!(said.len(), 4, "{said:?}");
}

#[test]
fn stages_of_a_job_nothing_names_cannot_tell_loaders_from_bubbles() {
    let (step_s, busy, memory) = one_f_one_b();
    let said = raised(&busy, &memory, step_s, false);
    let k = kinds(&said);
    assert!(!k.contains(&FindingKind::PipelineBubbles) && !k.contains(&FindingKind::DataloaderStarvation), "{said:?}");
    assert!(k.contains(&FindingKind::StarvationOrBubbles), "{said:?}");
}

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::attribution::Owner;
use crate::metric::Value;
use crate::model::{DeviceInfo, DeviceState, ProcessSample, SystemInfo};
use crate::report::{ReportHandle, RunReport};
use crate::stages::diagnose::finding::{Diagnosis, Finding, FindingEvent, Severity};
use crate::stages::diagnose::{DiagnoseConfig, Diagnoser};

const GIB: u64 = 1 << 30;

fn info(index: u32) -> Arc<DeviceInfo> {
    let mut i = DeviceInfo::new(index, format!("GPU-{index}"), "NVIDIA H100 80GB HBM3");
    i.max_clocks.sm = Some(2000e6);
    Arc::new(i)
}

fn attached(interval: Duration) -> (RunReport, ReportHandle, Accounts, AccountsHandle) {
    let context = ProcessorContext::new(interval);
    let (mut report, report_handle) = RunReport::new();
    report.attach(&context);
    let (mut accounts, handle) = Accounts::new();
    accounts.attach(&context);
    (report, report_handle, accounts, handle)
}

/// A small deterministic generator (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn ratio(&mut self) -> f64 {
        (self.next() % 1001) as f64 / 1000.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn owned_by(d: &mut DeviceSample, namespace: &str, pod: &str) {
    let owner = Arc::new(Owner { namespace: Some(namespace.into()), pod: Some(pod.into()), ..Owner::default() });
    let mut p = ProcessSample::new(1000 + d.info.index);
    p.memory_used = Some(GIB);
    p.owner = Some(owner.clone());
    d.processes.push(p);
    d.owners.push(owner);
}

/// Per GPU UUID, the accounts summed over owners: observed, allocated, idle, energy.
fn sums(accounts: &[Account]) -> HashMap<String, (f64, f64, f64, Option<f64>)> {
    let mut out: HashMap<String, (f64, f64, f64, Option<f64>)> = HashMap::new();
    for a in accounts {
        let e = out.entry(a.uuid.clone()).or_default();
        e.0 += a.observed_seconds;
        e.1 += a.allocated_seconds;
        e.2 += a.idle_allocated_seconds;
        if let Some(j) = a.energy_joules {
            e.3 = Some(e.3.unwrap_or(0.0) + j);
        }
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// A run with everything that moves the figures — utilisation levels, memory freed and held,
/// GPUs changing hands, a GPU lost for a while, energy counters (with a reset) on some GPUs
/// and power only on others, a tick sooner than the interval, and findings of every kind
/// raised and cleared at random — gives, per GPU summed over its owners and per cause summed
/// over GPUs, the report's figures. Several seeds.
#[test]
fn the_accounts_equal_the_report_over_a_run() {
    for seed in [0x9e37_79b9_7f4a_7c15u64, 7, 42, 1_000_003] {
        let interval = Duration::from_millis(500);
        let (mut report, report_handle, mut accounts, handle) = attached(interval);
        let mut rng = Rng(seed);
        let infos: Vec<_> = (0..4).map(info).collect();
        let mut counters = [0.0f64; 4];
        let mut at = Duration::ZERO;
        for tick in 0..200u64 {
            // Now and then a tick sooner than the interval (a flush).
            at += if rng.below(10) == 0 { interval / 3 } else { interval };
            let mut devices = Vec::new();
            for (i, inf) in infos.iter().enumerate() {
                let mut d = DeviceSample::new(inf.clone());
                if i == 3 && (60..70).contains(&tick) {
                    d.state = DeviceState::Lost;
                    devices.push(d);
                    continue;
                }
                d.utilization.gpu = Some(rng.ratio());
                d.memory.total = Some(80 * GIB);
                d.memory.used = Some(if rng.below(4) == 0 { 0 } else { 40 * GIB });
                d.power.usage_watts = Some(100.0 + 600.0 * rng.ratio());
                d.clocks.sm = Some(1000e6 + 1000e6 * rng.ratio());
                d.gpm.sm_activity = Some(rng.ratio());
                if i < 2 {
                    // GPU 1's counter resets once (a driver reload).
                    counters[i] = if i == 1 && tick == 100 { 5.0 } else { counters[i] + 300.0 * rng.ratio() };
                    d.power.energy_joules = Some(counters[i]);
                }
                // GPUs change hands: each tenant holds a stretch, some stretches nobody.
                match (tick / 50 + i as u64) % 3 {
                    0 => owned_by(&mut d, "team-a", &format!("train-{i}")),
                    1 => owned_by(&mut d, "team-b", "eval"),
                    _ => {}
                }
                devices.push(d);
            }
            let mut s = Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), devices)
                .with_seq(tick + 1)
                .with_taken_at(UNIX_EPOCH + at);
            let mut events = Vec::new();
            for _ in 0..rng.below(3) {
                let kind = FindingKind::ALL[rng.below(FindingKind::ALL.len() as u64) as usize];
                let gpu = rng.below(4) as u32;
                let transition = if rng.below(3) == 0 { Transition::Cleared } else { Transition::Raised };
                let uuid = format!("GPU-{gpu}");
                let finding = Finding::new(kind, Severity::Warning, Some((gpu, &uuid)), UNIX_EPOCH, "ev", "do");
                events.push(FindingEvent { transition, finding, held_for: None });
            }
            s.attach(Diagnosis { events, ..Diagnosis::default() });
            report.process(&mut s);
            accounts.process(&mut s);
        }
        let r = report_handle.report();
        let all = handle.accounts();
        assert!(all.len() > 4, "GPUs changed hands: {}", all.len());
        let per_gpu = sums(&all);
        for g in &r.gpus {
            let (observed, allocated, idle, energy) = per_gpu[&g.uuid];
            assert!(
                close(observed, g.observed_seconds),
                "seed {seed} {}: {observed} vs {}",
                g.uuid,
                g.observed_seconds
            );
            assert!(close(allocated, g.allocated_seconds), "seed {seed} {}", g.uuid);
            assert!(close(idle, g.idle_allocated_seconds), "seed {seed} {}", g.uuid);
            let (a, b) = (energy.unwrap(), g.energy_joules.unwrap());
            assert!(close(a, b), "seed {seed} {}: energy {a} vs {b}", g.uuid);
        }
        for cause in &r.overview.causes {
            let ours: f64 =
                all.iter().flat_map(|a| &a.lost_seconds).filter(|(k, _)| *k == cause.kind).map(|(_, s)| s).sum();
            assert!(close(ours, cause.lost_gpu_seconds), "seed {seed} {}: {ours} vs {cause:?}", cause.kind);
        }
        // No cause the report did not see.
        for a in &all {
            for (kind, _) in &a.lost_seconds {
                assert!(r.overview.causes.iter().any(|c| c.kind == *kind), "seed {seed}: {kind}");
            }
        }
    }
}

/// With one owner per GPU, the sums group as the report's do: equal to the last bit.
#[test]
fn one_owner_per_gpu_agrees_to_the_bit_after_the_diagnoser() {
    let interval = Duration::from_secs(1);
    let context = ProcessorContext::new(interval);
    let mut diagnoser = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(10))).unwrap();
    diagnoser.attach(&context);
    let (mut report, report_handle, mut accounts, handle) = attached(interval);
    for tick in 0..120u64 {
        let devices = (0..2)
            .map(|i| {
                let mut d = DeviceSample::new(info(i));
                d.memory.total = Some(80 * GIB);
                // GPU 0 holds memory and idles (idle_allocated); GPU 1 is nearly full (near_oom).
                d.memory.used = Some(if i == 0 { 20 * GIB } else { 79 * GIB });
                d.utilization.gpu = Some(if i == 0 { 0.01 } else { 0.9 });
                d.power.usage_watts = Some(250.0 + tick as f64);
                owned_by(&mut d, "team-a", "train");
                d
            })
            .collect();
        let mut s = Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), devices)
            .with_seq(tick + 1)
            .with_taken_at(UNIX_EPOCH + interval * tick as u32);
        diagnoser.process(&mut s);
        report.process(&mut s);
        accounts.process(&mut s);
    }
    let r = report_handle.report();
    let all = handle.accounts();
    assert_eq!(all.len(), 2);
    assert!(!r.overview.causes.is_empty(), "the diagnoser raised something");
    for (a, g) in all.iter().zip(&r.gpus) {
        assert_eq!(a.uuid, g.uuid);
        assert_eq!(a.owner.namespace.as_deref(), Some("team-a"));
        assert_eq!(a.observed_seconds, g.observed_seconds);
        assert_eq!(a.allocated_seconds, g.allocated_seconds);
        assert_eq!(a.idle_allocated_seconds, g.idle_allocated_seconds);
        assert_eq!(a.energy_joules, g.energy_joules);
        for f in &g.findings {
            let ours = a.lost_seconds.iter().find(|(k, _)| *k == f.kind).map(|(_, s)| *s);
            assert_eq!(ours, Some(f.lost_gpu_seconds), "{:?}", f.kind);
        }
    }
}

/// The series a tick exports: per GPU the current owner's counters with its job, the lost
/// series only for causes charged or open, and the counters keep counting for an owner who
/// comes back.
#[test]
fn each_tick_exports_the_current_owners_counters() {
    use crate::steps::{RunSteps, Steps};
    let interval = Duration::from_secs(1);
    let (_, _, mut accounts, handle) = attached(interval);
    let run = RunSteps { job: "resnet".into(), ..RunSteps::default() };
    let tick = |accounts: &mut Accounts, n: u64, namespace: &str, events: Vec<FindingEvent>| {
        let mut d = DeviceSample::new(info(0));
        d.memory.total = Some(80 * GIB);
        d.memory.used = Some(40 * GIB);
        d.utilization.gpu = Some(0.25);
        owned_by(&mut d, namespace, "p");
        let mut s = Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), vec![d])
            .with_seq(n + 1)
            .with_taken_at(UNIX_EPOCH + interval * n as u32);
        s.attach(Steps { runs: vec![run.clone()], ..Steps::default() });
        s.attach(Diagnosis { events, ..Diagnosis::default() });
        accounts.process(&mut s);
        let mut points = Vec::new();
        s.visit_derived(|p| {
            let v = match p.value {
                Value::Float(v) => v,
                Value::Int(v) => v as f64,
            };
            points.push((p.descriptor.prometheus_name(), p.labels[0].to_owned(), p.labels[1].to_owned(), v));
        });
        points
    };
    let raise = || {
        let finding =
            Finding::new(FindingKind::IdleAllocated, Severity::Warning, Some((0, "GPU-0")), UNIX_EPOCH, "e", "a");
        vec![FindingEvent { transition: Transition::Raised, finding, held_for: None }]
    };
    let p = tick(&mut accounts, 0, "team-a", Vec::new());
    let names: Vec<_> = p.iter().map(|(n, ..)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpumon_account_observed_seconds_total",
            "gpumon_account_allocated_seconds_total",
            "gpumon_account_idle_allocated_seconds_total"
        ]
    );
    assert!(p.iter().all(|(_, job, _, v)| job == "resnet" && *v == 0.0), "{p:?}");
    let p = tick(&mut accounts, 1, "team-a", raise());
    // Raised at this tick: exported at 0 (charged from the next tick on).
    assert!(p.contains(&("gpumon_account_lost_seconds_total".into(), "idle_allocated".into(), "resnet".into(), 0.0)));
    let p = tick(&mut accounts, 2, "team-a", Vec::new());
    assert!(p.contains(&("gpumon_account_lost_seconds_total".into(), "idle_allocated".into(), "resnet".into(), 0.75)));
    assert!(p.contains(&("gpumon_account_observed_seconds_total".into(), "resnet".into(), String::new(), 2.0)));
    // team-b takes the GPU: its own counters, from its first tick.
    let p = tick(&mut accounts, 3, "team-b", Vec::new());
    assert!(p.contains(&("gpumon_account_observed_seconds_total".into(), "resnet".into(), String::new(), 1.0)));
    // team-a comes back: its counters go on from where they were.
    let p = tick(&mut accounts, 4, "team-a", Vec::new());
    assert!(p.contains(&("gpumon_account_observed_seconds_total".into(), "resnet".into(), String::new(), 3.0)));
    assert!(p.contains(&("gpumon_account_lost_seconds_total".into(), "idle_allocated".into(), "resnet".into(), 1.5)));
    let all = handle.accounts();
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].owner.namespace.as_deref(), Some("team-b"));
    assert_eq!(all[1].owner.job.as_deref(), Some("resnet"));
    assert_eq!(all[1].lost_seconds, [(FindingKind::IdleAllocated, 0.75)]);
}

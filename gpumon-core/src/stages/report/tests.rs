//! The run report's tests: accumulation, time lost per cause, steps, rendering and JSON.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::model::{DeviceInfo, DeviceSample, DeviceState, Snapshot, SystemInfo};
use crate::stages::diagnose::finding::{Diagnosis, Finding, FindingEvent, FindingKind, Severity, Transition};
use crate::stages::diagnose::{DiagnoseConfig, Diagnoser, Thresholds};
use crate::stages::{Processor, ProcessorContext};

const GIB: u64 = 1 << 30;

fn info(index: u32) -> Arc<DeviceInfo> {
    Arc::new(DeviceInfo::new(index, format!("GPU-{index}"), "NVIDIA H100 80GB HBM3"))
}

fn snapshot(tick: u64, interval: Duration, devices: Vec<DeviceSample>) -> Snapshot {
    Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), devices)
        .with_seq(tick + 1)
        .with_taken_at(UNIX_EPOCH + interval * tick as u32)
}

fn attached(interval: Duration) -> (RunReport, ReportHandle) {
    let (mut r, h) = RunReport::new();
    r.attach(&ProcessorContext::new(interval));
    (r, h)
}

#[test]
fn utilisation_mean_and_percentiles_match_a_sort_of_the_inputs() {
    let interval = Duration::from_millis(500);
    let (mut report, handle) = attached(interval);
    let gpu = info(0);
    // 200 values on the 0.1 % grid, in a scrambled order, some repeated.
    let values: Vec<f64> = (0..200u64).map(|i| ((i * 37 + 11) % 1001) as f64 / 1000.0).collect();
    for (tick, &u) in values.iter().enumerate() {
        let mut d = DeviceSample::new(gpu.clone());
        d.utilization.gpu = Some(u);
        report.process(&mut snapshot(tick as u64, interval, vec![d]));
    }
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let nearest_rank = |p: f64| sorted[((p / 100.0 * sorted.len() as f64).ceil() as usize).max(1) - 1];
    let mean = values.iter().sum::<f64>() / values.len() as f64;

    let r = handle.report();
    assert_eq!(r.ticks, 200);
    assert_eq!(r.gpus.len(), 1);
    let g = &r.gpus[0];
    assert_eq!(g.samples, 200);
    assert!((g.utilization_mean.unwrap() - mean).abs() < 1e-12, "{:?} vs {mean}", g.utilization_mean);
    assert_eq!(g.utilization_p5, Some(nearest_rank(5.0)));
    assert_eq!(g.utilization_p95, Some(nearest_rank(95.0)));
    assert!(g.utilization_p5 < g.utilization_p95);
    assert_eq!(r.wall_seconds, 199.0 * 0.5);
}

#[test]
fn the_high_resolution_mean_wins_over_the_instantaneous_value() {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let mut d = DeviceSample::new(info(0));
    d.utilization.gpu = Some(0.9);
    d.windows.gpu_utilization = Some(crate::model::WindowStats { min: 0.0, max: 0.9, mean: 0.3, count: 6 });
    report.process(&mut snapshot(0, interval, vec![d]));
    assert_eq!(handle.report().gpus[0].utilization_mean, Some(0.3));
}

#[test]
fn energy_sums_counter_increases_and_skips_a_reset() {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let counter = [5_000.0, 5_300.0, 5_750.0, 120.0, 420.0, 420.0];
    for (tick, &e) in counter.iter().enumerate() {
        let mut d = DeviceSample::new(info(0));
        d.power.energy_joules = Some(e);
        d.power.usage_watts = Some(310.0);
        report.process(&mut snapshot(tick as u64, interval, vec![d]));
    }
    let expected: f64 = counter.windows(2).filter(|w| w[1] >= w[0]).map(|w| w[1] - w[0]).sum();
    let g = &handle.report().gpus[0];
    assert_eq!(g.energy_joules, Some(expected));
    assert_eq!(g.energy_source, Some(EnergySource::Counter));
    assert_eq!(g.power_mean_watts, Some(310.0));
}

#[test]
fn energy_without_a_counter_integrates_power_over_the_interval() {
    let interval = Duration::from_millis(250);
    let (mut report, handle) = attached(interval);
    let power = [100.0, 250.0, 400.0, 175.5];
    for (tick, &p) in power.iter().enumerate() {
        let mut d = DeviceSample::new(info(0));
        d.power.usage_watts = Some(p);
        report.process(&mut snapshot(tick as u64, interval, vec![d]));
    }
    let g = &handle.report().gpus[0];
    // The first tick opens the run: each later one covers the 0.25 s since the one before.
    let expected: f64 = power[1..].iter().map(|p| p * 0.25).sum();
    assert_eq!(g.energy_joules, Some(expected));
    assert_eq!(g.energy_source, Some(EnergySource::IntegratedPower));
    assert_eq!(g.power_mean_watts, Some(power.iter().sum::<f64>() / 4.0));
}

#[test]
fn idle_while_allocated_counts_idle_ticks_with_memory_held_and_the_peak() {
    let interval = Duration::from_millis(100);
    let (mut report, handle) = attached(interval);
    let total = 80 * GIB;
    // (utilisation, memory used): idle+allocated, busy+allocated, idle+empty, boundaries.
    let ticks = [(0.0, 40 * GIB), (0.9, 79 * GIB), (0.01, GIB), (0.05, 8 * GIB), (0.051, 60 * GIB), (0.03, 9 * GIB)];
    for (tick, &(u, used)) in ticks.iter().enumerate() {
        let mut d = DeviceSample::new(info(3));
        d.utilization.gpu = Some(u);
        d.memory.used = Some(used);
        d.memory.total = Some(total);
        report.process(&mut snapshot(tick as u64, interval, vec![d]));
    }
    let is_allocated = |used: u64| used as f64 / total as f64 >= 0.10;
    let idle = ticks.iter().filter(|&&(u, used)| is_allocated(used) && u <= 0.05).count() as u64;
    // Time: the first tick opens the run and covers none; each later one covers 0.1 s.
    let allocated: Vec<f64> = ticks[1..].iter().filter(|(_, used)| is_allocated(*used)).map(|t| t.0).collect();
    let g = &handle.report().gpus[0];
    assert_eq!(g.index, 3);
    assert_eq!(g.idle_allocated_ticks, idle);
    assert!((g.allocated_seconds - allocated.len() as f64 * 0.1).abs() < 1e-12, "{}", g.allocated_seconds);
    let idle_seconds: f64 = allocated.iter().map(|u| (1.0 - u) * 0.1).sum();
    assert!((g.idle_allocated_seconds - idle_seconds).abs() < 1e-12, "{} vs {idle_seconds}", g.idle_allocated_seconds);
    assert_eq!(g.memory_peak_bytes, ticks.iter().map(|t| t.1).max());
    assert_eq!(g.memory_total_bytes, Some(total));
}

/// A run of `gpumon-agent run -- sleep 1` at a 5 s interval: the first tick opens it, the
/// sample taken at exit 1.3 s later covers those 1.3 s — not 10 GPU-s of two intervals, nor
/// 6.3 of one and a bit.
#[test]
fn a_tick_sooner_than_the_interval_covers_only_the_time_since_the_previous_one() {
    let interval = Duration::from_secs(5);
    let (mut report, handle) = attached(interval);
    let gpu = info(0);
    let first = snapshot(0, interval, vec![allocated(&gpu, 0.0, 0)]);
    let exit = first.clone().with_seq(2).with_taken_at(first.taken_at + Duration::from_millis(1300));
    let mut at_exit = exit.clone();
    at_exit.devices = vec![allocated(&gpu, 0.0, 0)];
    report.process(&mut first.clone());
    report.process(&mut at_exit);
    let r = handle.report();
    let g = &r.gpus[0];
    assert_eq!(g.samples, 2);
    assert!((g.observed_seconds - 1.3).abs() < 1e-9, "{}", g.observed_seconds);
    assert!((g.observed_seconds - r.wall_seconds).abs() < 1e-9, "one GPU: GPU-time is wall time");
    assert!((g.allocated_seconds - 1.3).abs() < 1e-9, "{}", g.allocated_seconds);
    assert!((g.idle_allocated_seconds - 1.3).abs() < 1e-9, "idle both ticks: {}", g.idle_allocated_seconds);
    assert!((r.overview.gpu_seconds - 1.3).abs() < 1e-9, "{}", r.overview.gpu_seconds);
    // A tick on the grid covers its interval; a second snapshot at the same instant, none.
    let mut same = at_exit.clone().with_seq(3);
    same.devices = vec![allocated(&gpu, 0.0, 0)];
    report.process(&mut same);
    assert!((handle.report().gpus[0].observed_seconds - 1.3).abs() < 1e-9);
}

/// A sample allocated (40 of 80 GiB) whose high-resolution window reads `mean`, with `count`
/// driver samples (none: no window).
fn allocated(info: &Arc<DeviceInfo>, mean: f64, count: u32) -> DeviceSample {
    let mut d = DeviceSample::new(info.clone());
    d.utilization.gpu = Some(mean);
    d.memory.used = Some(40 * GIB);
    d.memory.total = Some(80 * GIB);
    if count > 0 {
        d.windows.gpu_utilization = Some(crate::model::WindowStats { min: 0.0, max: 1.0, mean, count });
    }
    d
}

#[test]
fn idle_within_intervals_counts_not_only_whole_idle_ticks() {
    // The case: a GPU busy 38 % of every interval in short stretches never has a
    // whole idle tick, yet is idle 62 % of the time.
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let (a, b) = (info(0), info(1));
    // 51 ticks: the first opens the run, the 50 after it cover 50 s.
    for tick in 0..=50u64 {
        let busy_twin = allocated(&b, 0.9, 6);
        report.process(&mut snapshot(tick, interval, vec![allocated(&a, 0.38, 6), busy_twin]));
    }
    let r = handle.report();
    let g = &r.gpus[0];
    assert_eq!(g.idle_allocated_ticks, 0);
    assert!((g.idle_allocated_seconds - 31.0).abs() < 1e-9, "{}", g.idle_allocated_seconds);
    assert_eq!(g.allocated_seconds, 50.0);
    let o = &r.overview;
    assert_eq!(o.gpus, 2);
    assert_eq!(o.gpu_seconds, 100.0);
    assert_eq!(o.allocated_seconds, 100.0);
    assert!((o.idle_allocated_seconds - 36.0).abs() < 1e-9, "31 + 50 × 0.1: {}", o.idle_allocated_seconds);
    let text = r.to_string();
    assert!(text.contains("idle while allocated  31.0 s of 50.0 s allocated (62.0 %; 0 whole idle tick(s))"), "{text}");
    assert!(
        text.contains("idle while allocated  0.010 GPU-h (36.0 GPU-s) of 100.0 GPU-s allocated (36.0 %)"),
        "{text}"
    );
}

#[test]
fn time_lost_is_counted_per_cause_and_the_costliest_is_the_main_one() {
    let interval = Duration::from_millis(500);
    let (mut report, handle) = attached(interval);
    let starved = info(0);
    let mut hot = DeviceInfo::new(1, "GPU-1", "NVIDIA H100 80GB HBM3");
    hot.max_clocks.sm = Some(2000e6);
    let hot = Arc::new(hot);
    let membound = info(2);
    let lost = info(3);
    let last = 12u64;
    for tick in 0..=last {
        let mut s0 = allocated(&starved, 0.4, 3);
        s0.gpm.sm_activity = Some(0.9); // read by memory_bound only
        let mut s1 = allocated(&hot, 1.0, 3);
        s1.clocks.sm = Some(1500e6);
        let mut s2 = allocated(&membound, 0.95, 3);
        s2.gpm.sm_activity = Some(0.3);
        let mut s3 = allocated(&lost, 0.8, 3);
        if (8..=9).contains(&tick) {
            s3.state = DeviceState::Lost;
        }
        let mut s = snapshot(tick, interval, vec![s0, s1, s2, s3]);
        let mut events = Vec::new();
        let raise = |kind, uuid| event(Transition::Raised, kind, Some(uuid), None);
        match tick {
            1 => {
                events.push(raise(FindingKind::ThermalThrottling, "GPU-1"));
                events.push(raise(FindingKind::NearOom, "GPU-1"));
                events.push(raise(FindingKind::MemoryBound, "GPU-2"));
            }
            2 => events.push(raise(FindingKind::DataloaderStarvation, "GPU-0")),
            6 => events.push(event(Transition::Cleared, FindingKind::DataloaderStarvation, Some("GPU-0"), None)),
            7 => events.push(raise(FindingKind::HardwareErrors, "GPU-3")),
            _ => {}
        }
        s.attach(Diagnosis { events, ..Diagnosis::default() });
        report.process(&mut s);
    }
    let r = handle.report();
    let lost_of = |gpu: usize, kind| {
        let f = r.gpus[gpu].findings.iter().find(|f| f.kind == kind).unwrap();
        f.lost_gpu_seconds
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // Charged from the tick after the raise to the clearing tick: ticks 3–6, idle 60 %.
    assert!(close(lost_of(0, FindingKind::DataloaderStarvation), 4.0 * 0.6 * 0.5));
    // Busy 100 % at 75 % of the max clock: a quarter of ticks 2–12.
    assert!(close(lost_of(1, FindingKind::ThermalThrottling), 11.0 * 0.25 * 0.5));
    assert_eq!(lost_of(1, FindingKind::NearOom), 0.0);
    // SM activity 30 %, whatever the utilisation.
    assert!(close(lost_of(2, FindingKind::MemoryBound), 11.0 * 0.7 * 0.5));
    // The two ticks the GPU was lost, whole.
    assert!(close(lost_of(3, FindingKind::HardwareErrors), 2.0 * 0.5));

    let kinds: Vec<_> = r.overview.causes.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [
            FindingKind::MemoryBound,
            FindingKind::ThermalThrottling,
            FindingKind::DataloaderStarvation,
            FindingKind::HardwareErrors,
            FindingKind::NearOom
        ]
    );
    let main = r.overview.main_cause.as_ref().unwrap();
    assert_eq!((main.kind, main.gpus, main.raised), (FindingKind::MemoryBound, 1, 1));
    assert!(close(main.active_gpu_seconds, 11.0 * 0.5));
    let starvation = &r.overview.causes[2];
    assert!(close(starvation.active_gpu_seconds, 4.0 * 0.5), "{starvation:?}");
    let text = r.to_string();
    assert!(text.contains("main cause            memory_bound on 1 GPU(s): 0.001 GPU-h (3.9 GPU-s) lost"), "{text}");
    assert!(text.contains("    dataloader_starvation       1.2 GPU-s lost, held 2.0 GPU-s on 1 GPU(s)"), "{text}");
    assert!(text.contains("dataloader_starvation (warning) held 2.0 s, 1.2 GPU-s lost"), "{text}");
}

/// Ticks 0..=`last` at 1 s of `devices()`, with a `straggler` on GPU `uuid` raised at tick
/// `raised` (and cleared at `cleared`): the straggler's time lost.
fn straggler_lost(
    last: u64,
    uuid: &str,
    raised: u64,
    cleared: Option<u64>,
    devices: impl Fn() -> Vec<DeviceSample>,
) -> (f64, Report) {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    for tick in 0..=last {
        let mut s = snapshot(tick, interval, devices());
        let events = match tick {
            t if t == raised => vec![event(Transition::Raised, FindingKind::Straggler, Some(uuid), None)],
            t if Some(t) == cleared => vec![event(Transition::Cleared, FindingKind::Straggler, Some(uuid), None)],
            _ => Vec::new(),
        };
        s.attach(Diagnosis { events, ..Diagnosis::default() });
        report.process(&mut s);
    }
    let r = handle.report();
    let lost =
        r.gpus.iter().flat_map(|g| &g.findings).find(|f| f.kind == FindingKind::Straggler).unwrap().lost_gpu_seconds;
    (lost, r)
}

#[test]
fn a_straggler_is_charged_its_peers_wait_beyond_its_own_idle() {
    // GPU 3 busy 95 % (idle 5 %); GPUs 0-2, its peers, idle 45 %: 40 points of that is the
    // wait for GPU 3, the 5 they share with it is not. GPU 4 runs another user's job and
    // idles 90 %: not a peer. GPU 5 holds no memory: not allocated, not a peer.
    let gpus: Vec<_> = (0..6).map(info).collect();
    let owned = |mut d: DeviceSample, uid: u32| {
        let mut p = crate::model::ProcessSample::new(1000 + d.info.index);
        p.owner = Some(Arc::new(crate::model::Owner { uid: Some(uid), ..Default::default() }));
        d.processes = vec![p];
        d
    };
    let (lost, r) = straggler_lost(10, "GPU-3", 2, Some(6), || {
        let mut devices: Vec<_> = (0..3).map(|g| owned(allocated(&gpus[g], 0.55, 6), 1)).collect();
        devices.push(owned(allocated(&gpus[3], 0.95, 6), 1));
        devices.push(owned(allocated(&gpus[4], 0.1, 6), 2));
        let mut free = DeviceSample::new(gpus[5].clone());
        free.utilization.gpu = Some(0.0);
        devices.push(free);
        devices
    });
    // Charged ticks 3-6: its own 5 % and three peers' 40 % each.
    let expected = 4.0 * (0.05 + 3.0 * 0.40);
    assert!((lost - expected).abs() < 1e-9, "{lost} != {expected}");
    assert_eq!(r.overview.main_cause.as_ref().unwrap().kind, FindingKind::Straggler);
}

#[test]
fn a_straggler_behind_busy_peers_is_charged_its_own_idle() {
    // GPU 2 at 50 % behind two peers at 90 %: they idle less than it does, so nothing of
    // theirs is a wait for it; its own idle half is the loss.
    let gpus: Vec<_> = (0..3).map(info).collect();
    let (lost, _) = straggler_lost(6, "GPU-2", 1, None, || {
        vec![allocated(&gpus[0], 0.9, 6), allocated(&gpus[1], 0.9, 6), allocated(&gpus[2], 0.5, 6)]
    });
    assert!((lost - 5.0 * 0.5).abs() < 1e-9, "{lost}");
}

#[test]
fn one_cause_on_several_gpus_adds_up_and_without_loss_the_longest_held_leads() {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let gpus = [info(0), info(1)];
    for tick in 0..10u64 {
        let mut s = snapshot(tick, interval, gpus.iter().map(|g| allocated(g, 0.9, 0)).collect());
        let mut events = Vec::new();
        if tick == 2 || tick == 5 {
            events.push(event(Transition::Raised, FindingKind::NearOom, Some("GPU-0"), None));
        }
        if tick == 4 {
            events.push(event(Transition::Cleared, FindingKind::NearOom, Some("GPU-0"), None));
            events.push(event(Transition::Raised, FindingKind::NearOom, Some("GPU-1"), None));
        }
        if tick == 3 {
            events.push(event(Transition::Raised, FindingKind::PowerThrottling, Some("GPU-1"), None));
        }
        s.attach(Diagnosis { events, ..Diagnosis::default() });
        report.process(&mut s);
    }
    let o = handle.report().overview;
    // Power throttling without the clocks costs nothing known; near_oom never costs.
    assert!(o.causes.iter().all(|c| c.lost_gpu_seconds == 0.0), "{o:#?}");
    let main = o.main_cause.unwrap();
    assert_eq!((main.kind, main.gpus, main.raised), (FindingKind::NearOom, 2, 3));
    // GPU 0: 2 s (ticks 2–4) + 4 s (5–9, open); GPU 1: 5 s (4–9, open).
    assert_eq!(main.active_gpu_seconds, 2.0 + 4.0 + 5.0);
    assert_eq!(o.causes[1].kind, FindingKind::PowerThrottling);
    assert_eq!(o.causes[1].active_gpu_seconds, 6.0);
    // No high-resolution windows: the driver's period is not known.
    assert_eq!(o.driver_sample_period_seconds, None);
}

#[test]
fn the_driver_sampling_period_is_measured_from_the_windows() {
    // A 1 s driver under a 100 ms interval: one sample every tenth tick, none between.
    let interval = Duration::from_millis(100);
    let (mut report, handle) = attached(interval);
    let gpu = info(0);
    for tick in 0..100u64 {
        let count = u32::from(tick % 10 == 3);
        report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, count)]));
    }
    let period = handle.report().overview.driver_sample_period_seconds.unwrap();
    // From the first window (tick 3) on: 97 ticks, 10 samples.
    assert!((period - 0.97).abs() < 1e-9, "{period}");

    // A 1/6 s driver under a 1 s interval: six a tick.
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    for tick in 0..20u64 {
        report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, 6)]));
    }
    let r = handle.report();
    let period = r.overview.driver_sample_period_seconds.unwrap();
    assert!((period - 1.0 / 6.0).abs() < 1e-9, "{period}");
    assert!(r.to_string().contains("utilisation every 0.167 s (6.0 sample(s) per interval)"), "{r}");
}

#[test]
fn the_settings_given_are_listed_with_the_gpus_seen_and_the_measured_period() {
    use crate::metric::MetricSet;
    use crate::stages::diagnose::Sampling;
    let interval = Duration::from_millis(100);
    let (report, handle) = RunReport::new();
    let mut report = report
        .with_diagnosis(&DiagnoseConfig::default(), Sampling::new(interval, MetricSet::default().with_stage_inputs()));
    report.attach(&ProcessorContext::new(interval));
    // Before any tick: the settings alone.
    let before = handle.report().overview.limitations;
    assert!(before.iter().any(|l| l.rules == [FindingKind::PcieBound]), "{before:#?}");
    assert!(!before.iter().any(|l| l.rules.contains(&FindingKind::Imbalance)), "device count unknown yet");
    let gpu = info(0);
    for tick in 0..60u64 {
        let count = u32::from(tick % 5 == 0); // every 500 ms
        report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, count)]));
    }
    let r = handle.report();
    let limits = &r.overview.limitations;
    // One GPU: the rules that compare GPUs cannot work.
    assert!(
        limits.iter().any(|l| l.rules.contains(&FindingKind::Imbalance) && l.reason.contains("1 GPU")),
        "{limits:#?}"
    );
    let starvation = limits.iter().find(|l| l.rules == [FindingKind::DataloaderStarvation]).unwrap();
    assert!(starvation.reason.contains("(measured here: 500ms)"), "{starvation}");
    let text = r.to_string();
    assert!(
        text.contains(
            "  limitations:\n    [warning] pcie_bound: PCIe throughput is not sampled; --enable pcie_throughput"
        ),
        "{text}"
    );
    #[cfg(feature = "serde")]
    {
        let v = serde_json::to_value(&r).unwrap();
        let l = &v["overview"]["limitations"];
        assert!(
            l.as_array().unwrap().iter().any(|l| l["rules"][0] == "pcie_bound" && l["severity"] == "warning"),
            "{l}"
        );
    }
}

#[test]
fn tuned_thresholds_change_what_counts_as_idle() {
    let interval = Duration::from_secs(1);
    let (report, handle) = RunReport::new();
    let mut t = Thresholds::default();
    // The peak first: the level may not be above it.
    t.set("idle_peak", 0.25).unwrap();
    t.set("idle_level", 0.2).unwrap();
    let mut report = report.with_thresholds(&t);
    report.attach(&ProcessorContext::new(interval));
    let mut d = DeviceSample::new(info(0));
    d.utilization.gpu = Some(0.15);
    d.memory.used = Some(40 * GIB);
    d.memory.total = Some(80 * GIB);
    report.process(&mut snapshot(0, interval, vec![d]));
    assert_eq!(handle.report().gpus[0].idle_allocated_ticks, 1);
}

#[test]
fn a_lost_gpu_is_not_sampled_while_lost() {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    for tick in 0..5u64 {
        let mut d = DeviceSample::new(info(0));
        if tick == 2 {
            d.state = DeviceState::Lost;
        } else {
            d.utilization.gpu = Some(0.5);
        }
        report.process(&mut snapshot(tick, interval, vec![d]));
    }
    let r = handle.report();
    assert_eq!((r.ticks, r.gpus[0].samples), (5, 4));
}

fn event(transition: Transition, kind: FindingKind, uuid: Option<&str>, held: Option<Duration>) -> FindingEvent {
    let device = uuid.map(|u| (0, u));
    FindingEvent {
        transition,
        finding: Finding::new(kind, Severity::Warning, device, UNIX_EPOCH, "ev", "do this"),
        held_for: held,
    }
}

#[test]
fn findings_are_held_from_raise_to_clear_or_to_the_last_tick() {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let (raise_1, clear_1, raise_2, host_raise, last) = (2u64, 5u64, 7u64, 4u64, 10u64);
    for tick in 0..=last {
        let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(0))]);
        let mut events = Vec::new();
        if tick == raise_1 || tick == raise_2 {
            events.push(event(Transition::Raised, FindingKind::Imbalance, Some("GPU-0"), None));
        }
        if tick == clear_1 {
            let held = interval * (clear_1 - raise_1) as u32;
            events.push(event(Transition::Cleared, FindingKind::Imbalance, Some("GPU-0"), Some(held)));
        }
        if tick == host_raise {
            events.push(event(Transition::Raised, FindingKind::PcieBound, None, None));
        }
        s.attach(Diagnosis { events, ..Diagnosis::default() });
        report.process(&mut s);
    }
    let r = handle.report();
    let f = &r.gpus[0].findings;
    assert_eq!(f.len(), 2);
    assert_eq!((f[0].kind, f[0].active_at_exit), (FindingKind::Imbalance, false));
    assert_eq!(f[0].held_seconds, (clear_1 - raise_1) as f64);
    assert_eq!(f[0].raised_at, UNIX_EPOCH + Duration::from_secs(raise_1));
    assert!(f[1].active_at_exit);
    assert_eq!(f[1].held_seconds, (last - raise_2) as f64);
    assert_eq!(f[1].advice, "do this");
    assert_eq!(r.host_findings.len(), 1);
    assert_eq!(r.host_findings[0].held_seconds, (last - host_raise) as f64);
    // Reading the report does not close anything: later ticks extend an open finding.
    let mut s = snapshot(last + 3, interval, vec![DeviceSample::new(info(0))]);
    report.process(&mut s);
    assert_eq!(handle.report().gpus[0].findings[1].held_seconds, (last + 3 - raise_2) as f64);
}

#[test]
fn after_the_diagnoser_it_reports_the_raised_finding() {
    let interval = Duration::from_secs(1);
    let context = ProcessorContext::new(interval);
    let mut diagnoser = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(10))).unwrap();
    diagnoser.attach(&context);
    let (mut report, handle) = attached(interval);
    let last = 20u64;
    let mut raised_tick = None;
    for tick in 0..=last {
        let mut d = DeviceSample::new(info(0));
        d.memory.used = Some(78 * GIB);
        d.memory.total = Some(80 * GIB);
        d.utilization.gpu = Some(0.9);
        let mut s = snapshot(tick, interval, vec![d]);
        diagnoser.process(&mut s);
        if s.output::<crate::Diagnosis>().is_some_and(|dg| !dg.events.is_empty()) {
            raised_tick.get_or_insert(tick);
        }
        report.process(&mut s);
    }
    let raised = raised_tick.expect("near_oom raised");
    // Raised after ceil(0.8 × 10) = 8 holding ticks: tick index 7.
    assert_eq!(raised, diagnoser.raise_after_ticks() as u64 - 1);
    let f = &handle.report().gpus[0].findings;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].kind, FindingKind::NearOom);
    assert!(f[0].active_at_exit);
    assert_eq!(f[0].held_seconds, (last - raised) as f64);
    assert!(f[0].evidence.contains("97.5 %"), "{}", f[0].evidence);
}

#[test]
fn steps_pool_the_runs_per_gpu_and_a_report_of_some_gpus_counts_only_theirs() {
    use crate::steps::{DeviceStep, RunSteps, StepReport, Steps};
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let step = |n: u64, secs: f64| {
        let mut r = StepReport::new(n, Duration::from_secs_f64(secs));
        for (uuid, joules) in [("GPU-0", 100.0), ("GPU-1", 50.0)] {
            let mut d = DeviceStep::new(uuid);
            d.energy_joules = Some(joules);
            r.devices.push(d);
        }
        r
    };
    for (tick, (slow, fast)) in [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)].into_iter().enumerate() {
        let n = tick as u64 + 2;
        let mut rank0 = RunSteps::new("train", Some(0));
        rank0.reported.push(step(n, slow));
        let mut rank1 = RunSteps::new("train", Some(1));
        rank1.reported.push(step(n, fast));
        let mut s = snapshot(tick as u64, interval, vec![DeviceSample::new(info(0)), DeviceSample::new(info(1))]);
        s.attach(Steps { runs: vec![rank0, rank1], rejected: None });
        report.process(&mut s);
    }
    let r = handle.report();
    assert_eq!(r.format, REPORT_FORMAT);
    let steps = r.steps.expect("steps");
    assert_eq!(steps.steps, 6);
    // Nearest rank over [1, 1, 1, 1, 2, 3].
    assert_eq!((steps.duration_median_seconds, steps.duration_p95_seconds), (Some(1.0), Some(3.0)));
    assert_eq!(steps.duration_mean_seconds, Some(9.0 / 6.0));
    // Both runs carry both GPUs' figures: per step the job's GPUs used 100 J + 50 J, not twice.
    assert_eq!(steps.energy_per_step_joules, Some(150.0));
    let ranks: Vec<_> = steps.runs.iter().map(|r| (r.rank, r.steps, r.first_step, r.last_step)).collect();
    assert_eq!(ranks, [(Some(0), 3, Some(2), Some(4)), (Some(1), 3, Some(2), Some(4))]);
    assert_eq!(steps.runs[0].duration_median_seconds, Some(2.0));
    assert_eq!(steps.runs[0].energy_per_step_joules, Some(150.0));

    let only = handle.report_of(|uuid| uuid == "GPU-0");
    assert_eq!(only.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(), ["GPU-0"]);
    assert_eq!(only.overview.gpus, 1);
    // Three ticks a second apart: 2 s of GPU-0 (the first tick opens the run).
    assert_eq!(only.overview.gpu_seconds, 2.0);
    assert_eq!(only.steps.expect("steps").energy_per_step_joules, Some(100.0));
    assert_eq!(handle.report().overview.gpus, 2);
}

/// A loop marking 1 000 steps a second: the tracker reports the latest 64 of each tick, and
/// the report still counts every step completed, from the first.
#[test]
fn the_report_counts_every_completed_step_not_only_the_reported_ones() {
    use crate::steps::{RunSteps, StepReport, Steps};
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    let ms = Duration::from_millis(1);
    // (tick, steps completed, the last one, each step's time): the last tick, one slow step.
    for (tick, completed, last, took) in [(1u64, 999u64, 999u64, ms), (2, 1000, 1999, ms), (3, 1, 2000, 500 * ms)] {
        let mut run = RunSteps::new("fast", Some(0));
        run.last_step = Some(last);
        run.last_duration = Some(took);
        run.completed = completed;
        let from = last + 1 - completed.min(64);
        run.reported = (from..=last).map(|n| StepReport::new(n, took)).collect();
        let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(0))]);
        s.attach(Steps { runs: vec![run], rejected: None });
        report.process(&mut s);
    }
    let steps = handle.report().steps.expect("steps");
    assert_eq!(steps.steps, 2000);
    let run = &steps.runs[0];
    assert_eq!((run.steps, run.first_step, run.last_step), (2000, Some(1), Some(2000)));
    // Weighted by steps: 1 999 steps of 1 ms and one of 0.5 s.
    assert_eq!((run.duration_median_seconds, run.duration_p95_seconds), (Some(0.001), Some(0.001)));
    let mean = (1999.0 * 0.001 + 0.5) / 2000.0;
    assert!((run.duration_mean_seconds.unwrap() - mean).abs() < 1e-12, "{:?}", run.duration_mean_seconds);
}

#[test]
fn a_run_without_a_sample_says_so_and_has_no_negative_zero() {
    let (_report, handle) = attached(Duration::from_secs(1));
    let r = handle.report();
    assert_eq!(r.ticks, 0);
    let o = &r.overview;
    for v in [o.gpu_seconds, o.allocated_seconds, o.idle_allocated_seconds] {
        assert!(v == 0.0 && v.is_sign_positive(), "{v:?}");
    }
    let text = r.to_string();
    assert!(text.contains("no sample was taken during the run"), "{text}");
    assert!(!text.contains("-0.0") && !text.contains("GPU-h"), "{text}");
}

#[test]
fn human_and_json_forms_carry_the_numbers() {
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    for tick in 0..4u64 {
        let mut d = DeviceSample::new(info(0));
        d.utilization.gpu = Some(0.25 * tick as f64);
        d.memory.used = Some(40 * GIB);
        d.memory.total = Some(80 * GIB);
        d.power.usage_watts = Some(200.0);
        let mut s = snapshot(tick, interval, vec![d]);
        if tick == 1 {
            s.attach(Diagnosis {
                events: vec![event(Transition::Raised, FindingKind::IdleAllocated, Some("GPU-0"), None)],
                ..Diagnosis::default()
            });
        }
        report.process(&mut s);
    }
    let r = handle.report();
    let text = r.to_string();
    assert!(text.contains("GPU 0 NVIDIA H100 80GB HBM3 (GPU-0), 4 sample(s)"), "{text}");
    assert!(text.contains("mean 37.5 %, p5 0.0 %, p95 75.0 %"), "{text}");
    assert!(text.contains("peak 40.0 GiB of 80.0 GiB"), "{text}");
    // 200 W over the 3 s after the first tick.
    assert!(text.contains("energy 0.6 kJ"), "{text}");
    assert!(
        text.starts_with("gpumon run report: host node-1, 4 tick(s) over 3.0 s, interval 1 s\noverview\n"),
        "{text}"
    );
    assert!(text.contains("  GPUs                  1, wall time 3.0 s, 0.001 GPU-h (3.0 GPU-s) observed"), "{text}");
    // Charged on ticks 2 and 3, idle 50 % and 25 %.
    assert!(text.contains("idle_allocated (warning) held 2.0 s, 0.8 GPU-s lost, still active at exit"), "{text}");
    assert!(text.contains("main cause            idle_allocated on 1 GPU(s): 0.000 GPU-h (0.8 GPU-s) lost"), "{text}");
    assert!(text.contains("driver sampling       unknown"), "{text}");
    assert!(text.contains("limitations           none"), "{text}");
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["gpus"][0]["findings"][0]["kind"], "idle_allocated");
        assert_eq!(v["gpus"][0]["energy_source"], "integrated_power");
        assert_eq!(v["gpus"][0]["findings"][0]["lost_gpu_seconds"], 0.75);
        let o = &v["overview"];
        assert_eq!(o["gpus"], 1);
        assert_eq!(o["gpu_seconds"], 3.0);
        assert_eq!(o["allocated_seconds"], 3.0);
        // Ticks 1–3, idle 75 %, 50 % and 25 % of a second each.
        assert_eq!(o["idle_allocated_seconds"], 1.5);
        assert_eq!(o["main_cause"]["kind"], "idle_allocated");
        assert_eq!(o["main_cause"]["lost_gpu_seconds"], 0.75);
        assert_eq!(o["causes"][0]["active_gpu_seconds"], 2.0);
        assert_eq!(o["driver_sample_period_seconds"], serde_json::Value::Null);
        assert_eq!(o["limitations"], serde_json::json!([]));
    }
}

/// The marks of steps_slow10.py (30 steps, every 10th 1.5 s, the rest 0.2 s) through the real
/// tracker at a 100 ms, 1 s and 5 s interval: the step times are the steps', not the ticks'.
#[test]
fn step_time_percentiles_are_over_the_steps_at_any_interval() {
    use crate::steps::{StepConfig, StepTracker};
    let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut marks = vec![(0u64, Duration::ZERO)];
    for n in 1..=30u64 {
        let took = if n % 10 == 0 { Duration::from_millis(1500) } else { Duration::from_millis(200) };
        let (_, before) = marks[marks.len() - 1];
        marks.push((n, before + took));
    }
    let end = marks[marks.len() - 1].1;
    for interval in [Duration::from_millis(100), Duration::from_secs(1), Duration::from_secs(5)] {
        let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
        let (mut report, handle) = attached(interval);
        let mut next = marks.iter().peekable();
        let mut tick = 0u32;
        loop {
            // Each mark is read at the first tick at least 1 ms after it.
            let at = interval * tick;
            while let Some((n, when)) = next.next_if(|(_, when)| *when + Duration::from_millis(1) <= at) {
                steps.record_at("s", Some(0), *n, t0 + *when).unwrap();
            }
            let mut s = Snapshot::new(Arc::new(SystemInfo::new("node-1", "test")), vec![DeviceSample::new(info(0))])
                .with_seq(u64::from(tick) + 1)
                .with_taken_at(t0 + at);
            tracker.process(&mut s);
            report.process(&mut s);
            if at > end + interval {
                break;
            }
            tick += 1;
        }
        let steps = handle.report().steps.expect("steps");
        let round = |v: Option<f64>| v.map(|v| (v * 1000.0).round() / 1000.0);
        assert_eq!(steps.steps, 30, "{interval:?}");
        assert_eq!(
            (
                round(steps.duration_median_seconds),
                round(steps.duration_p95_seconds),
                round(steps.duration_mean_seconds)
            ),
            (Some(0.2), Some(1.5), Some(0.33)),
            "at {interval:?}"
        );
    }
}

/// A replay of some of a trace's GPUs (`--devices`): the recorded steps carry every GPU's
/// figures, the energy per step is the sampled GPUs' only.
#[test]
fn energy_per_step_counts_only_the_gpus_of_the_snapshot() {
    use crate::steps::{DeviceStep, RunSteps, StepReport, Steps};
    let interval = Duration::from_secs(1);
    let (mut report, handle) = attached(interval);
    for tick in 1..=3u64 {
        let mut run = RunSteps::new("train", Some(0));
        let mut step = StepReport::new(tick, interval);
        for gpu in 0..4u32 {
            let mut d = DeviceStep::new(format!("GPU-{gpu}"));
            d.energy_joules = Some(80.0 + f64::from(gpu));
            step.devices.push(d);
        }
        run.reported.push(step);
        let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(1))]);
        s.attach(Steps { runs: vec![run], rejected: None });
        report.process(&mut s);
    }
    let steps = handle.report().steps.expect("steps");
    assert_eq!(steps.energy_per_step_joules, Some(81.0));
    assert_eq!(steps.runs[0].energy_per_step_joules, Some(81.0));
}

/// Marks the steps socket dropped (numbering restarted: refused; a bad line: malformed) are
/// counted in the report, also when no step was reported at all.
#[test]
fn the_report_counts_the_marks_dropped_by_reason() {
    use crate::steps::{RunSteps, StepRejections, StepReport, Steps};
    let interval = Duration::from_secs(1);
    let rejected = StepRejections { refused: 10, malformed: 1, ..StepRejections::default() };
    let (mut report, handle) = attached(interval);
    for tick in 1..=2u64 {
        let mut run = RunSteps::new("train", Some(0));
        run.reported.push(StepReport::new(tick + 1, interval));
        let mut s = snapshot(tick, interval, vec![DeviceSample::new(info(0))]);
        s.attach(Steps { runs: vec![run], rejected: Some(rejected) });
        report.process(&mut s);
    }
    let r = handle.report();
    assert_eq!(r.steps.as_ref().and_then(|s| s.marks_rejected), Some(rejected));
    let text = r.to_string();
    assert!(text.contains("  marks dropped         1 malformed, 10 refused (not in the step figures)\n"), "{text}");
    assert!(text.contains("numbering restarted"), "{text}");

    let (mut report, handle) = attached(interval);
    let mut s = snapshot(1, interval, vec![DeviceSample::new(info(0))]);
    s.attach(Steps { runs: Vec::new(), rejected: Some(rejected) });
    report.process(&mut s);
    let steps = handle.report().steps.expect("a steps part for the dropped marks");
    assert_eq!((steps.steps, steps.marks_rejected), (0, Some(rejected)));
    let text = handle.report().to_string();
    assert!(
        text.contains("steps                   0 step(s)\n  marks dropped         1 malformed, 10 refused"),
        "{text}"
    );
    #[cfg(feature = "serde")]
    {
        let v = serde_json::to_value(handle.report()).unwrap();
        assert_eq!(v["steps"]["marks_rejected"]["refused"], 10);
        assert_eq!(v["steps"]["marks_rejected"]["malformed"], 1);
    }
}

/// An 11 s job idling 64 % under the default 30 s window raised nothing because no window
/// filled: the report says so where the main cause would be, not "no finding was raised".
#[test]
fn a_run_shorter_than_the_window_says_so_where_the_main_cause_would_be() {
    use crate::metric::MetricSet;
    use crate::stages::diagnose::Sampling;
    let interval = Duration::from_secs(1);
    let config = DiagnoseConfig::default();
    let (report, handle) = RunReport::new();
    let mut report = report.with_diagnosis(&config, Sampling::new(interval, MetricSet::default().with_stage_inputs()));
    report.attach(&ProcessorContext::new(interval));
    let gpu = info(0);
    for tick in 0..12u64 {
        report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.36, 6)]));
    }
    let r = handle.report();
    assert_eq!(r.overview.main_cause, None);
    assert!(r.shorter_than_window());
    assert_eq!(r.overview.diagnosis_window_seconds, Some(config.window.as_secs_f64()));
    let text = r.to_string();
    let main = text.lines().find(|l| l.starts_with("  main cause ")).expect("a main-cause line");
    assert_eq!(
        main,
        "  main cause            not diagnosed: the run (11.0 s) was shorter than the diagnosis window (30.0 s); \
         a finding is raised only once a window fills (--diagnose-window)"
    );
    assert!(!text.contains("no finding was raised"), "{text}");
    assert!(text.contains("(64.0 %)"), "{text}");
    #[cfg(feature = "serde")]
    {
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["overview"]["diagnosis_window_seconds"], 30.0);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    // As long as the window, or without the settings: nothing raised reads "none" as before.
    let (report, handle) = RunReport::new();
    let short = DiagnoseConfig::default().with_window(Duration::from_secs(5));
    let mut report = report.with_diagnosis(&short, Sampling::new(interval, MetricSet::default().with_stage_inputs()));
    report.attach(&ProcessorContext::new(interval));
    let (mut bare, bare_handle) = attached(interval);
    for tick in 0..12u64 {
        report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.9, 6)]));
        bare.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.36, 6)]));
    }
    for r in [handle.report(), bare_handle.report()] {
        assert!(!r.shorter_than_window());
        assert!(r.to_string().contains("  main cause            none: no finding was raised on any GPU\n"), "{r}");
    }
}

/// Each limitation is one line, its first clause with its figures; the whole reason and
/// remedy are under `verbose()` and in the JSON.
#[test]
fn limitations_are_one_line_each_and_whole_in_the_verbose_report() {
    use crate::metric::MetricSet;
    use crate::stages::diagnose::Sampling;
    let interval = Duration::from_millis(100);
    let (report, handle) = RunReport::new();
    let mut report = report
        .with_diagnosis(&DiagnoseConfig::default(), Sampling::new(interval, MetricSet::default().with_stage_inputs()));
    report.attach(&ProcessorContext::new(interval));
    let gpu = info(0);
    for tick in 0..60u64 {
        report.process(&mut snapshot(tick, interval, vec![allocated(&gpu, 0.5, u32::from(tick % 5 == 0))]));
    }
    let r = handle.report();
    let limits = &r.overview.limitations;
    assert!(limits.len() >= 3, "{limits:#?}");
    let text = r.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| *l == "  limitations:").expect("limitations") + 1;
    for (line, l) in lines[at..at + limits.len()].iter().zip(limits) {
        let rules: Vec<&str> = l.rules.iter().map(|k| k.name()).collect();
        let want = format!(
            "    [{}] {}: {}; {}",
            l.severity,
            rules.join(", "),
            super::render::first_clause(&l.reason),
            super::render::first_clause(&l.remedy)
        );
        assert_eq!(*line, want);
        assert!(line.len() <= format!("    [{}] {l}", l.severity).len(), "{line}");
    }
    assert_eq!(lines[at + limits.len()], "    (each in full: --verbose, or the JSON report)");
    // The driver's period, measured, stays on the starvation line; its explanation does not.
    let starvation = lines.iter().find(|l| l.starts_with("    [info] dataloader_starvation: ")).unwrap();
    assert!(starvation.contains("(measured here: 500ms)"), "{starvation}");
    let whole = limits.iter().find(|l| l.rules == [FindingKind::DataloaderStarvation]).unwrap();
    assert!(!starvation.contains(&whole.reason), "{starvation}");

    let verbose = r.verbose().to_string();
    for l in limits {
        assert!(verbose.contains(&format!("    [{}] {l}\n", l.severity)), "{verbose}");
    }
    assert!(!verbose.contains("(each in full"), "{verbose}");
    // Only the limitations differ.
    let strip = |t: &str| {
        t.lines().filter(|l| !l.starts_with("    [") && !l.starts_with("    (each")).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(strip(&text), strip(&verbose));
}

#[test]
fn the_first_clause_keeps_parentheses_whole() {
    use super::render::first_clause;
    assert_eq!(
        first_clause("a period (measured here: 1s) is averaged away, and more"),
        "a period (measured here: 1s) is averaged away"
    );
    assert_eq!(
        first_clause("the window holds 3 tick(s) (window 300ms / interval 100ms); busy"),
        "the window holds 3 tick(s) (window 300ms / interval 100ms)"
    );
    assert_eq!(first_clause("2 GPU(s) held memory — MIG instances: none"), "2 GPU(s) held memory");
    assert_eq!(first_clause("GPM is not sampled: a memory-bound kernel"), "GPM is not sampled");
    assert_eq!(
        first_clause("--enable x (or switch it off: y = [\"z\"])"),
        "--enable x (or switch it off: y = [\"z\"])"
    );
    assert_eq!(first_clause("unbalanced ) parens: stay safe"), "unbalanced ) parens");
    assert_eq!(first_clause(""), "");
}

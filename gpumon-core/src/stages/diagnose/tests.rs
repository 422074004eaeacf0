//! Rule and window tests on synthetic snapshots (tick time, no clock). The scenario-level
//! contract (every mock scenario raises exactly its findings) is tested in gpumon-mock.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use super::*;
use crate::model::{ClockEventReasons, DeviceInfo, DeviceSample, SystemInfo, WindowStats, XidCount};
use crate::stages::diagnose::finding::{BusyGpu, Diagnosis, FindingKind, Severity, Transition};
use crate::stages::{Processor, ProcessorContext};

const GIB: u64 = 1 << 30;

fn info(index: u32) -> Arc<DeviceInfo> {
    let mut i = DeviceInfo::new(index, format!("GPU-{index:04}"), "NVIDIA H100 80GB HBM3");
    i.memory_total_bytes = Some(80 * GIB);
    i.max_clocks.sm = Some(1980e6);
    i.temperature_slowdown_celsius = Some(87.0);
    Arc::new(i)
}

/// A healthy, busy GPU: nothing should be found on it.
fn busy(index: u32) -> DeviceSample {
    let mut d = DeviceSample::new(info(index));
    d.utilization.gpu = Some(0.95);
    d.utilization.memory = Some(0.4);
    d.windows.gpu_utilization = Some(WindowStats { min: 0.85, max: 0.99, mean: 0.94, count: 6 });
    d.memory.used = Some(70 * GIB);
    d.memory.total = Some(80 * GIB);
    d.gpm.sm_activity = Some(0.8);
    d.gpm.dram_bandwidth = Some(0.45);
    d.power.usage_watts = Some(600.0);
    d.power.limit_watts = Some(700.0);
    d.clocks.sm = Some(1980e6);
    d.clock_event_reasons = Some(ClockEventReasons(0));
    d.temperature.gpu = Some(65.0);
    d
}

struct Rig {
    d: Diagnoser,
    tick: u64,
    system: Arc<SystemInfo>,
}

impl Rig {
    fn new(window_secs: u64) -> Self {
        Self::with_config(DiagnoseConfig::default().with_window(Duration::from_secs(window_secs)))
    }

    /// A 10 s window with no warm-up grace: idle GPUs count as idle from the first tick.
    fn without_grace() -> Self {
        Self::with_config(
            DiagnoseConfig::default().with_window(Duration::from_secs(10)).with_idle_grace(Duration::ZERO),
        )
    }

    fn with_config(config: DiagnoseConfig) -> Self {
        Self::with_diagnoser(Diagnoser::new(config).unwrap())
    }

    /// `d`, attached at 1 s ticks.
    fn with_diagnoser(mut d: Diagnoser) -> Self {
        d.attach(&ProcessorContext::new(Duration::from_secs(1)));
        Self { d, tick: 0, system: Arc::new(SystemInfo::new("node-1", "test")) }
    }

    fn step(&mut self, devices: Vec<DeviceSample>) -> Diagnosis {
        self.step_with(devices, None)
    }

    /// One tick (1 s after the last) of `devices`, with the step tracker's output when `steps`.
    fn step_with(&mut self, devices: Vec<DeviceSample>, steps: Option<crate::stages::steps::Steps>) -> Diagnosis {
        self.tick += 1;
        let mut s = Snapshot::new(self.system.clone(), devices)
            .with_seq(self.tick)
            .with_taken_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000 + self.tick));
        if let Some(steps) = steps {
            s.attach(steps);
        }
        self.d.process(&mut s);
        s.output::<crate::Diagnosis>().cloned().expect("the diagnoser always attaches its diagnosis")
    }

    /// `ticks` ticks, each of the devices `devices` makes; the last tick's diagnosis.
    fn run(&mut self, ticks: usize, mut devices: impl FnMut() -> Vec<DeviceSample>) -> Diagnosis {
        (0..ticks).map(|_| self.step(devices())).last().expect("at least one tick")
    }
}

fn assert_quiet(d: &Diagnosis) {
    assert!(d.active.is_empty(), "{:?}", kinds_on(d));
}

/// A GPU whose utilisation dips to near zero and recovers within every interval (a starving
/// input pipeline, seen in the high-resolution windows), compute and DRAM low.
fn dipping(index: u32) -> DeviceSample {
    let mut d = busy(index);
    d.utilization.gpu = Some(0.4);
    d.windows.gpu_utilization = Some(WindowStats { min: 0.02, max: 0.96, mean: 0.31, count: 6 });
    d.windows.memory_utilization = Some(WindowStats { min: 0.0, max: 0.3, mean: 0.12, count: 6 });
    d.gpm.sm_activity = Some(0.3);
    d.gpm.dram_bandwidth = Some(0.1);
    d
}

fn kinds_on(d: &Diagnosis) -> Vec<(Option<u32>, FindingKind)> {
    d.active.iter().map(|f| (f.gpu, f.kind)).collect()
}

fn first_raise(d: &Diagnosis, kind: FindingKind) -> Option<&Finding> {
    d.events.iter().find(|e| e.transition == Transition::Raised && e.finding.kind == kind).map(|e| &e.finding)
}

#[test]
fn healthy_busy_gpus_raise_nothing() {
    let mut rig = Rig::new(10);
    for _ in 0..100 {
        let d = rig.step((0..4).map(busy).collect());
        assert_quiet(&d);
        assert!(d.events.is_empty());
    }
}

#[test]
fn near_oom_raises_after_ceil_80_percent_of_the_window_and_clears_with_hysteresis() {
    let mut rig = Rig::new(10);
    assert_eq!(rig.d.window_ticks(), 10);
    assert_eq!(rig.d.raise_after_ticks(), 8);
    let full = |used: u64| {
        let mut d = busy(0);
        d.memory.used = Some(used);
        d
    };
    let mut raised_at = None;
    for tick in 1..=20u64 {
        let d = rig.step(vec![full(78 * GIB + tick * 10_000_000)]);
        if let Some(f) = first_raise(&d, FindingKind::NearOom) {
            raised_at = Some(tick);
            assert_eq!(f.gpu, Some(0));
            assert_eq!(f.uuid.as_deref(), Some("GPU-0000"));
            assert_eq!(f.severity, Severity::Warning);
            assert!(f.evidence.starts_with("memory 97."), "{}", f.evidence);
            assert!(f.advice.contains("batch size"), "{}", f.advice);
            assert_eq!(f.since, UNIX_EPOCH + Duration::from_secs(1_700_000_001));
        }
    }
    assert_eq!(raised_at, Some(8));
    // 93 % is between the clear mark (92 %) and the raise mark (95 %): still held.
    for _ in 0..15 {
        let d = rig.step(vec![full(745 * GIB / 10)]);
        assert_eq!(kinds_on(&d), [(Some(0), FindingKind::NearOom)]);
    }
    // Below 92 %: cleared once at most 20 % of the window holds, i.e. after 8 ticks.
    let mut cleared_after = None;
    for tick in 1..=12 {
        let d = rig.step(vec![full(60 * GIB)]);
        if let Some(e) = d.events.iter().find(|e| e.transition == Transition::Cleared) {
            cleared_after = Some(tick);
            assert!(e.finding.evidence.starts_with("no longer holds; now: memory 7"), "{}", e.finding.evidence);
            assert!(e.held_for.unwrap() >= Duration::from_secs(15));
        }
    }
    assert_eq!(cleared_after, Some(8));
}

/// A held finding's evidence is as of now: formatted again every third of the window from the
/// latest readings (its `since` stays), and shared unchanged on the ticks between.
#[test]
fn a_held_findings_evidence_follows_the_readings_every_third_of_the_window() {
    let mut rig = Rig::new(9);
    assert_eq!(rig.d.evidence_refresh_ticks(), 3);
    let full = |used: u64| {
        let mut d = busy(0);
        d.memory.used = Some(used);
        d
    };
    let d = rig.run(9, || vec![full(78 * GIB)]);
    let raised = d.active[0].clone();
    assert!(raised.evidence.starts_with("memory 97.5 %"), "{}", raised.evidence);
    // Memory grows to 99 % while the finding holds: within 3 ticks the evidence says so.
    let mut seen = Vec::new();
    let mut last: Option<Diagnosis> = None;
    for _ in 0..6 {
        let d = rig.step(vec![full(792 * GIB / 10)]);
        assert!(d.events.is_empty(), "held: neither raised nor cleared");
        let f = &d.active[0];
        assert_eq!((f.kind, f.since), (FindingKind::NearOom, raised.since));
        if let Some(prev) = &last {
            if prev.active[0].evidence == f.evidence {
                assert!(Arc::ptr_eq(&prev.active, &d.active), "an unchanged list is shared, not rebuilt");
            }
        }
        seen.push(f.evidence.starts_with("memory 99.0 %"));
        last = Some(d);
    }
    assert!(seen.iter().take(3).any(|&now| now), "refreshed within 3 ticks: {seen:?}");
    assert!(seen.iter().skip(3).all(|&now| now), "{seen:?}");
}

/// "Busy" per GPU, as diagnosis means it: the window's mean level at or above `imbalance_busy`,
/// with the window it was judged over; a starving GPU that reads 96 % at times is not busy.
#[test]
fn the_diagnosis_says_which_gpus_are_busy_over_its_window() {
    let mut rig = Rig::new(10);
    let d = rig.run(12, || vec![busy(0), dipping(1)]);
    let b = d.busy.expect("the diagnoser says which GPUs are busy");
    assert_eq!((b.window_seconds, b.level), (10.0, 0.6));
    assert_eq!(&*b.gpus, [BusyGpu::new("GPU-0000", true), BusyGpu::new("GPU-0001", false)]);
    // Unchanged verdicts: the same list, not a new one.
    let next = rig.step(vec![busy(0), dipping(1)]).busy.unwrap();
    assert!(Arc::ptr_eq(&b.gpus, &next.gpus));
    // GPU 0 idles: busy no more once its window's mean falls below 60 %.
    let idle = || {
        let mut d = busy(0);
        d.utilization.gpu = Some(0.0);
        d.windows.gpu_utilization = Some(WindowStats { min: 0.0, max: 0.0, mean: 0.0, count: 6 });
        d.gpm.sm_activity = Some(0.0);
        d
    };
    let d = rig.run(10, || vec![idle(), dipping(1)]);
    assert_eq!(&*d.busy.unwrap().gpus, [BusyGpu::new("GPU-0000", false), BusyGpu::new("GPU-0001", false)]);
}

#[test]
fn near_oom_is_not_raised_while_memory_shrinks() {
    let mut rig = Rig::new(10);
    for tick in 0..30u64 {
        let mut d = busy(0);
        d.memory.used = Some(79 * GIB - tick * 10_000_000);
        assert_quiet(&rig.step(vec![d]));
    }
}

#[test]
fn active_findings_are_shared_between_ticks_not_rebuilt() {
    let mut rig = Rig::new(5);
    let mut previous: Option<Arc<[Finding]>> = None;
    for tick in 0..30 {
        let mut d = busy(0);
        d.memory.used = Some(79 * GIB);
        let diag = rig.step(vec![d]);
        if tick > 10 {
            assert_eq!(diag.active.len(), 1);
            // The same allocation every tick: the readings do not move, so the evidence formatted
            // again every third of the window reads the same and the list is not rebuilt.
            assert!(Arc::ptr_eq(previous.as_ref().unwrap(), &diag.active));
        }
        previous = Some(diag.active);
    }
}

#[test]
fn imbalance_is_found_on_the_idle_twin_and_names_the_busy_one() {
    // One process drives both (`device_map="auto"`): one job, split unevenly.
    let one_process = |mut d: DeviceSample| {
        d.processes = vec![crate::model::ProcessSample::new(4242)];
        d
    };
    let d = Rig::new(10).run(12, || vec![one_process(busy(0)), one_process(idle_twin())]);
    assert_eq!(kinds_on(&d), [(Some(1), FindingKind::Imbalance)]);
    let f = &d.active[0];
    assert!(f.evidence.starts_with("utilisation "), "{}", f.evidence);
    assert!(f.evidence.contains("while GPU 0 (GPU-0000) runs at 94 %"), "{}", f.evidence);
    // No process read on either, nothing said of their job: the idle half of an uneven split
    // and a job of its own idling beside another job read the same — both are named.
    let d = Rig::new(10).run(12, || vec![busy(0), idle_twin()]);
    assert_eq!(kinds_on(&d), [(Some(1), FindingKind::ImbalanceOrOwnJob)]);
    let f = &d.active[0];
    assert!(f.evidence.starts_with("cannot tell imbalance from a job of its own: utilisation "), "{}", f.evidence);
    assert!(f.evidence.contains("while GPU 0 (GPU-0000) runs at 94 %"), "{}", f.evidence);
    // A process of its own on each, neither on the other's GPU, nothing else said: the idle one
    // runs a job of its own (ranks of one job in separate processes synchronise; the halves of
    // one split model run in one process) — no imbalance, said or doubted.
    let d = Rig::new(10).run(12, || {
        let mut a = busy(0);
        a.processes = vec![crate::model::ProcessSample::new(100)];
        let mut b = idle_twin();
        b.processes = vec![crate::model::ProcessSample::new(200)];
        vec![a, b]
    });
    assert!(
        kinds_on(&d).iter().all(|(_, k)| !matches!(k, FindingKind::Imbalance | FindingKind::ImbalanceOrOwnJob)),
        "{:?}",
        kinds_on(&d)
    );
}

/// GPU 1 idling at 5 % (peaks of 12 %) with memory held: the idle half of [`busy`]'s twin.
fn idle_twin() -> DeviceSample {
    let mut idle = busy(1);
    idle.utilization.gpu = Some(0.05);
    idle.windows.gpu_utilization = Some(WindowStats { min: 0.0, max: 0.12, mean: 0.06, count: 6 });
    idle.gpm.sm_activity = Some(0.05);
    idle
}

#[test]
fn idle_allocated_without_a_busy_peer() {
    // Past the warm-up grace from the first tick (its own test is below).
    let d = Rig::without_grace().run(12, || {
        (0..2)
            .map(|i| {
                let mut d = busy(i);
                d.utilization.gpu = Some(0.0);
                d.windows.gpu_utilization = Some(WindowStats { min: 0.0, max: 0.01, mean: 0.0, count: 6 });
                d.gpm.sm_activity = Some(0.0);
                d.memory.used = Some(30 * GIB);
                d
            })
            .collect()
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::IdleAllocated), (Some(1), FindingKind::IdleAllocated)]);
}

#[test]
fn starvation_from_high_resolution_dips() {
    let d = Rig::new(10).run(12, || {
        let mut d = dipping(0);
        d.utilization.memory = Some(0.15);
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::DataloaderStarvation)]);
    let e = &d.active[0].evidence;
    assert!(
        e.starts_with(
            "utilisation mean 31 %, min 2 % / max 96 % within the interval, dipped to ≤ 10 % within 100 % of the ticks and peaked at ≥ 60 % within 100 % of them, 70.0 GiB of 80.0 GiB"
        ),
        "{e}"
    );
}

/// With a step tracker before diagnosis, the starvation evidence quotes the last step's time
/// and the GPU's idle share of it.
#[test]
fn starvation_evidence_quotes_the_step_time_when_steps_are_tracked() {
    use crate::stages::steps::{DeviceStep, RunSteps, StepReport, Steps};
    let mut rig = Rig::new(10);
    let mut raised = None;
    for tick in 1..=12u64 {
        let d = dipping(0);
        let mut report = StepReport::new(tick, Duration::from_millis(1250));
        let mut g = DeviceStep::new(d.info.uuid.clone());
        g.utilization_mean = Some(0.4);
        report.devices.push(g);
        let mut run = RunSteps::new("train", Some(0));
        run.last = Some(report);
        let diagnosis = rig.step_with(vec![d], Some(Steps { runs: vec![run], ..Default::default() }));
        if let Some(f) = first_raise(&diagnosis, FindingKind::DataloaderStarvation) {
            raised = Some((tick, f.evidence.clone()));
        }
    }
    let (tick, e) = raised.expect("starvation raised");
    assert!(
        e.ends_with(&format!("; step {tick} of train rank 0 took 1.25 s, 0.75 s of it idle (40 % mean utilisation)")),
        "{e}"
    );
}

#[test]
fn starvation_without_high_resolution_windows_uses_the_swings_across_ticks() {
    let mut rig = Rig::new(10);
    let mut raised = false;
    for tick in 0..20 {
        let mut d = busy(0);
        d.windows = Default::default();
        d.gpm = Default::default();
        d.utilization.memory = Some(0.1);
        d.utilization.gpu = Some(if tick % 3 == 0 { 0.9 } else { 0.02 });
        raised |= first_raise(&rig.step(vec![d]), FindingKind::DataloaderStarvation).is_some();
    }
    assert!(raised);
}

#[test]
fn memory_bound_is_not_starvation() {
    let d = Rig::new(10).run(12, || {
        let mut d = busy(0);
        d.utilization.gpu = Some(0.35);
        d.windows.gpu_utilization = Some(WindowStats { min: 0.05, max: 0.7, mean: 0.33, count: 6 });
        d.gpm.sm_activity = Some(0.3);
        d.gpm.dram_bandwidth = Some(0.82);
        d.utilization.memory = Some(0.8);
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::MemoryBound)]);
}

#[test]
fn thermal_throttling_suppresses_power_throttling() {
    let d = Rig::new(10).run(12, || {
        let mut d = busy(0);
        d.temperature.gpu = Some(90.0);
        d.clocks.sm = Some(1400e6);
        d.power.usage_watts = Some(690.0);
        d.clock_event_reasons =
            Some(ClockEventReasons(ClockEventReasons::HW_THERMAL_SLOWDOWN | ClockEventReasons::SW_POWER_CAP));
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::ThermalThrottling)]);
    assert!(d.active[0].evidence.contains("slowdown at 87 °C"), "{}", d.active[0].evidence);
}

#[test]
fn power_throttling_needs_the_limit_and_reduced_clocks() {
    let mut rig = Rig::new(10);
    let power_capped = |watts: f64, clock: f64| {
        let mut d = busy(0);
        d.power.usage_watts = Some(watts);
        d.clocks.sm = Some(clock);
        d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
        d
    };
    for _ in 0..20 {
        // Below 95 % of the limit, or clocks at maximum: the reason bit alone is not throttling.
        assert!(rig.step(vec![power_capped(600.0, 1400e6)]).active.is_empty());
    }
    let mut rig = Rig::new(10);
    for _ in 0..20 {
        assert!(rig.step(vec![power_capped(699.0, 1980e6)]).active.is_empty());
    }
    let d = rig.run(12, || vec![power_capped(699.0, 1500e6)]);
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::PowerThrottling)]);
    assert_eq!(d.active[0].severity, Severity::Info);
}

#[test]
fn pcie_bound_compares_traffic_with_the_link() {
    let d = Rig::new(10).run(12, || {
        let mut d = busy(0);
        d.utilization.gpu = Some(0.3);
        d.windows.gpu_utilization = Some(WindowStats { min: 0.2, max: 0.4, mean: 0.3, count: 6 });
        d.gpm.sm_activity = Some(0.3);
        d.gpm.dram_bandwidth = Some(0.1);
        d.utilization.memory = Some(0.1);
        d.pcie.link_generation = Some(5);
        d.pcie.link_width = Some(16);
        d.pcie.rx_bytes_per_second = Some(48e9);
        d.pcie.tx_bytes_per_second = Some(2e9);
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::PcieBound)]);
    assert!(
        d.active[0].evidence.starts_with("PCIe traffic 48.0 GB/s on average (76 % of the link)"),
        "{}",
        d.active[0].evidence
    );
}

#[test]
fn hardware_errors_raise_at_once_and_clear_after_a_quiet_window() {
    let mut rig = Rig::new(10);
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let gpu = |xids: u64| {
        let mut d = busy(1);
        d.ecc.uncorrected = Some(0);
        if xids > 0 {
            d.xid_errors.push(XidCount::new(48, xids, now));
        }
        d
    };
    for _ in 0..3 {
        assert!(rig.step(vec![busy(0), gpu(0)]).active.is_empty());
    }
    let d = rig.step(vec![busy(0), gpu(2)]);
    assert_eq!(kinds_on(&d), [(Some(1), FindingKind::HardwareErrors)]);
    let f = first_raise(&d, FindingKind::HardwareErrors).unwrap();
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(f.evidence, "2 new XID event(s) (last XID 48)");
    // The count stays at 2: no news. Cleared when the whole window has none.
    let mut cleared = None;
    for tick in 1..=12 {
        if rig.step(vec![busy(0), gpu(2)]).events.iter().any(|e| e.transition == Transition::Cleared) {
            cleared = Some(tick);
        }
    }
    assert_eq!(cleared, Some(10));
}

#[test]
fn rising_nvlink_errors_are_hardware_errors_and_a_suspended_gpu_is_not() {
    let mut rig = Rig::new(10);
    let gpu = |crc: u64, down: bool| {
        let mut d = busy(1);
        let links = (0..4)
            .map(|l| {
                let mut link = crate::model::NvlinkLink::new(l);
                link.crc_errors = Some(if l == 2 { crc } else { 0 });
                link.replay_errors = Some(0);
                link.recovery_errors = Some(u64::from(down && l == 2));
                if down && l == 2 {
                    link.state = crate::model::NvlinkState::Down;
                }
                link
            })
            .collect();
        d.nvlink = Some(crate::model::Nvlink::new(links));
        d
    };
    // Errors present from the start are history, not news.
    for _ in 0..3 {
        assert!(rig.step(vec![busy(0), gpu(5, false)]).active.is_empty());
    }
    let d = rig.step(vec![busy(0), gpu(12, true)]);
    assert_eq!(kinds_on(&d), [(Some(1), FindingKind::HardwareErrors)]);
    let f = first_raise(&d, FindingKind::HardwareErrors).unwrap();
    assert_eq!(f.evidence, "8 new NVLink CRC/replay/recovery error(s), 1 NVLink link(s) down");

    // A runtime-suspended GPU is asleep, not lost: nothing is found on it.
    let mut rig = Rig::new(10);
    for _ in 0..3 {
        let d = rig.step(vec![busy(0), DeviceSample::suspended(info(1))]);
        assert!(d.active.is_empty(), "{:?}", d.active);
    }
}

#[test]
fn a_lost_gpu_is_a_hardware_error_and_one_that_leaves_clears_its_findings() {
    let mut rig = Rig::new(10);
    let d = rig.step(vec![busy(0), DeviceSample::lost(info(1))]);
    assert_eq!(kinds_on(&d), [(Some(1), FindingKind::HardwareErrors)]);
    assert_eq!(d.active[0].evidence, "the GPU is lost (fell off the bus or needs a reset)");
    assert_eq!(
        d.raised_total.iter().map(|c| (c.kind, c.raised)).collect::<Vec<_>>(),
        [(FindingKind::HardwareErrors, 1)]
    );
    let d = rig.step(vec![busy(0)]);
    assert!(d.active.is_empty());
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].transition, Transition::Cleared);
    assert_eq!(d.events[0].finding.evidence, "the GPU is no longer in the snapshot");
    // The count of findings raised is a counter: it does not go down.
    assert_eq!(d.raised_total.len(), 1);
}

#[test]
fn disabled_rules_raise_nothing() {
    let config = DiagnoseConfig::default().with_window(Duration::from_secs(5)).disable_by_name(["near_oom"]).unwrap();
    let mut d = Diagnoser::new(config).unwrap();
    d.attach(&ProcessorContext::new(Duration::from_secs(1)));
    for tick in 0..20 {
        let mut gpu = busy(0);
        gpu.memory.used = Some(79 * GIB);
        let mut s = Snapshot::new(Arc::new(SystemInfo::default()), vec![gpu]).with_seq(tick);
        d.process(&mut s);
        assert!(s.output::<crate::Diagnosis>().cloned().unwrap().active.is_empty());
    }
}

#[test]
fn window_ticks_follow_the_interval() {
    let mut d = Diagnoser::new(DiagnoseConfig::default()).unwrap();
    d.attach(&ProcessorContext::new(Duration::from_millis(250)));
    assert_eq!((d.window_ticks(), d.raise_after_ticks()), (120, 96));
    d.attach(&ProcessorContext::new(Duration::from_secs(7)));
    assert_eq!((d.window_ticks(), d.raise_after_ticks()), (5, 4));
}

#[test]
fn bad_configuration_names_the_key() {
    let short = DiagnoseConfig::default().with_window(Duration::from_millis(500));
    let err = short.validate(Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(err.to_string(), "diagnose.window: 500ms is shorter than the sampling interval 1s");
    let err = DiagnoseConfig::default().with_window(Duration::ZERO).validate(None).unwrap_err();
    assert!(err.to_string().starts_with("diagnose.window: "), "{err}");

    let mut t = Thresholds::default();
    let err = t.set("starvation_dip", 1.5).unwrap_err();
    assert_eq!(err.to_string(), "diagnose.thresholds.starvation_dip: 1.5 is not a ratio in 0.0..=1.0");
    let mut t = Thresholds::default();
    let err = t.set("near_oom_clear", 0.97).unwrap_err();
    assert_eq!(err.to_string(), "diagnose.thresholds.near_oom_clear: must be below near_oom_raise");
    // Every pair that bounds a reading from both sides is checked for order: out of order the
    // rule could never hold.
    for (key, value, needle) in [
        ("starvation_min_mean", 0.9, "must be below starvation_max_mean"),
        ("starvation_max_mean", 0.1, "must be below starvation_max_mean"),
        ("idle_level", 0.3, "must not be above idle_peak"),
        ("idle_peak", 0.01, "must not be above idle_peak"),
        ("straggler_gap", 0.8, "must be below 1 - imbalance_idle"),
    ] {
        let err = Thresholds::default().set(key, value).unwrap_err();
        assert!(err.to_string().contains(needle), "{key} = {value}: {err}");
        assert!(err.to_string().starts_with("diagnose.thresholds."), "{err}");
    }
    // Equal bounds on the idle pair are a flat reading, still possible.
    let mut t = Thresholds::default();
    t.set("idle_level", 0.15).unwrap();
    let err = Thresholds::default().set("no_such", 0.5).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("diagnose.thresholds.no_such: unknown threshold (known: allocated_memory_ratio,"));

    let err = DiagnoseConfig::default().disable_by_name(["near-oom"]).unwrap_err();
    assert!(err.to_string().starts_with("diagnose.disable: unknown rule `near-oom` (known: dataloader_starvation,"));
    assert!(Diagnoser::new(DiagnoseConfig { raise_share: 0.1, clear_share: 0.2, ..DiagnoseConfig::default() }).is_err());
}

#[test]
fn a_nan_utilisation_reading_is_not_read_and_leaves_the_window_as_it_entered() {
    // Starvation without high-resolution windows, from the swings across ticks; one tick in the
    // middle reads NaN. It must count neither in nor out (it used to count in as a reading of 0
    // and, once kept as `Past`, not out), and the pattern must still be found.
    let mut rig = Rig::new(10);
    let starving = |util: f64| {
        let mut d = busy(0);
        d.windows.gpu_utilization = None;
        d.gpm.sm_activity = None;
        d.gpm.dram_bandwidth = None;
        d.utilization.memory = Some(0.1);
        d.utilization.gpu = Some(util);
        d
    };
    let mut raised = false;
    for tick in 0..40 {
        let util = match tick {
            12 => f64::NAN,
            t if t % 2 == 0 => 0.02,
            _ => 0.9,
        };
        let d = rig.step(vec![starving(util)]);
        raised |= first_raise(&d, FindingKind::DataloaderStarvation).is_some();
        let track = rig.d.tracks.values().next().unwrap();
        // Ticks before anything ran on it (the first, idle) are counted apart, not as readings.
        let readings = track.history.iter().filter(|h| h.worked && h.util.get().is_some()).count();
        assert_eq!(track.swings.readings(), readings, "tick {tick}");
    }
    assert!(raised, "the swings still show starvation");
}

#[test]
fn the_window_keeps_every_reading_it_reads_back_in_a_smaller_record() {
    let mut d = busy(0);
    d.windows.memory_utilization = Some(WindowStats { min: 0.3, max: 0.5, mean: 0.41, count: 6 });
    d.pcie.tx_bytes_per_second = Some(3.5e9);
    d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
    d.xid_errors = vec![XidCount { code: 79, count: 2, last_seen: UNIX_EPOCH + Duration::from_secs(5) }];
    d.ecc.remapped_rows_pending = Some(true);
    let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut counters = rules::Counters::default();
    let _ = TickStats::read(&d, at, &mut counters);
    d.xid_errors[0].count = 5;
    let stats = TickStats::read(&d, at, &mut counters);
    let past = stats.past();
    assert_eq!(past.at, stats.at);
    for (kept, read) in [
        (past.util, stats.util),
        (past.level, stats.level),
        (past.hires_min, stats.hires_min),
        (past.hires_max, stats.hires_max),
        (past.memory_controller, stats.memory_controller),
        (past.sm_activity, stats.sm_activity),
        (past.dram, stats.dram),
        (past.power, stats.power),
        (past.sm_clock, stats.sm_clock),
        (past.pcie_peak_bytes_per_second, stats.pcie_peak_bytes_per_second),
        (past.temperature, stats.temperature),
    ] {
        assert!(read.is_some());
        assert_eq!(kept.get(), read);
    }
    assert_eq!(past.memory_used.get(), Some((70 * GIB) as f64));
    assert_eq!(past.reasons, ClockEventReasons::SW_POWER_CAP);
    assert_eq!((past.xid_new, past.xid_code.get()), (3, Some(79.0)));
    assert_eq!((past.ecc_new, past.nvlink_errors_new, past.remap_trouble), (0, 0, true));
    // Not read stays not read, and so does a NaN reading.
    let bare = TickStats::read(&DeviceSample::new(info(1)), at, &mut rules::Counters::default()).past();
    assert_eq!((bare.util.get(), bare.memory_used.get(), bare.xid_code.get(), bare.reasons), (None, None, None, 0));
    assert_eq!(rules::Reading::from(Some(f64::NAN)).get(), None);
    // The claim in `Past`'s documentation: less than half the size of the stats it keeps
    // (168 and 424 bytes on x86-64).
    let (past, full) = (std::mem::size_of::<rules::Past>(), std::mem::size_of::<TickStats>());
    assert!(past * 2 < full, "Past {past} bytes, TickStats {full} bytes");
}

#[cfg(feature = "serde")]
#[test]
fn thresholds_deserialize_with_defaults_and_reject_unknown_keys() {
    let t: Thresholds = serde_json::from_str(r#"{"near_oom_raise": 0.9, "near_oom_clear": 0.85}"#).unwrap();
    assert_eq!((t.near_oom_raise, t.near_oom_clear, t.idle_level), (0.9, 0.85, 0.05));
    let err = serde_json::from_str::<Thresholds>(r#"{"near_oom": 0.9}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `near_oom`"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A signal hovering at a threshold never flaps: going from "raised" back to "cleared" needs
    /// the share of holding ticks to fall from 80 % to 20 % of the window, so two transitions of
    /// one finding are always at least `raise_at - clear_at` ticks apart, whatever the signal.
    #[test]
    fn no_flapping_at_a_threshold(memory in proptest::collection::vec(0.93f64..0.97, 50..400)) {
        let mut rig = Rig::new(10);
        let gap = rig.d.raise_after_ticks() - 2; // raise at 8, clear at 2
        let mut last_transition: Option<usize> = None;
        for (tick, ratio) in memory.iter().enumerate() {
            let mut d = busy(0);
            d.memory.used = Some((ratio * (80 * GIB) as f64) as u64);
            let diag = rig.step(vec![d]);
            if !diag.events.is_empty() {
                if let Some(prev) = last_transition {
                    prop_assert!(tick - prev >= gap, "transitions at ticks {prev} and {tick}");
                }
                last_transition = Some(tick);
            }
        }
    }

    /// An alternating signal — over the raise mark on every other tick — holds on half the
    /// window and raises nothing.
    #[test]
    fn half_holding_never_raises(low in 0.80f64..0.90, high in 0.95f64..0.99, ticks in 30usize..300) {
        let mut rig = Rig::new(10);
        for tick in 0..ticks {
            let mut d = busy(0);
            let ratio = if tick.is_multiple_of(2) { high } else { low };
            d.memory.used = Some((ratio * (80 * GIB) as f64) as u64);
            prop_assert!(rig.step(vec![d]).active.is_empty());
        }
    }
}

/// A GPU holding memory whose utilisation is `util` (instantaneous), with a one-sample window
/// when `window` (as a driver sampling at the interval gives), none otherwise.
fn one_sample(index: u32, util: f64, window: bool) -> DeviceSample {
    let mut d = busy(index);
    d.utilization.gpu = Some(util);
    d.utilization.memory = Some(0.1);
    d.windows = Default::default();
    d.windows.gpu_utilization = window.then_some(WindowStats { min: util, max: util, mean: util, count: 1 });
    d.gpm = Default::default();
    d
}

/// Pipeline stage `i` of a job: it holds its own layers and the micro-batches in flight on it,
/// so memory of its own (40 GiB, and 8 more per stage), not its replicas' 70 GiB.
fn stage(mut d: DeviceSample, i: u32) -> DeviceSample {
    d.memory.used = Some((40 + 8 * u64::from(i)) * GIB);
    d
}

/// One user's job on four pipeline stages (see [`stage`]), stage `i` reading `util(i)`.
fn four_stages(util: impl Fn(u32) -> f64) -> Vec<DeviceSample> {
    (0..4).map(|i| owned(stage(one_sample(i, util(i), true), i), 1000)).collect()
}

#[test]
fn starvation_with_one_driver_sample_per_interval_is_found_across_ticks() {
    // The issue's case: `dataloader-starved` at a 100 ms interval put one sample in each window
    // (min = max = mean) and nothing was raised.
    for window in [true, false] {
        let mut rig = Rig::new(10);
        let mut raised = None;
        for tick in 0..20 {
            let util = if tick % 3 == 0 { 0.92 } else { 0.02 };
            if first_raise(&rig.step(vec![one_sample(0, util, window)]), FindingKind::DataloaderStarvation).is_some() {
                raised.get_or_insert(tick);
            }
        }
        let tick = raised.unwrap_or_else(|| panic!("not raised (window: {window})"));
        // Two cycles to see a pattern, then 80 % of the 10-tick window.
        assert!(tick < 6 + 8, "raised at tick {tick}");
    }
}

#[test]
fn a_driver_slower_than_the_interval_is_measured_from_the_ticks_without_a_new_sample() {
    // One GPU starving, read every 0.4 s by a driver sampling every 0.8 s: every other tick
    // brings one new sample, the others none (NVML has nothing newer than the last read). The
    // driver's period is 0.8 s, not the interval; counting only the ticks with a sample read
    // 0.4 s.
    let mut d = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(20))).unwrap();
    d.attach(&ProcessorContext::new(Duration::from_millis(400)));
    let system = Arc::new(SystemInfo::new("node-1", "test"));
    let mut evidence = None;
    for tick in 0..150u64 {
        let util = if tick % 8 < 4 { 0.02 } else { 0.93 };
        let mut s = Snapshot::new(system.clone(), vec![one_sample(0, util, tick.is_multiple_of(2))])
            .with_seq(tick + 1)
            .with_taken_at(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + 400 * tick));
        d.process(&mut s);
        let diagnosis = s.output::<crate::Diagnosis>().expect("a diagnosis");
        if let Some(f) = first_raise(diagnosis, FindingKind::DataloaderStarvation) {
            evidence.get_or_insert(f.evidence.clone());
        }
    }
    let evidence = evidence.expect("starvation raised");
    let period: f64 = evidence
        .split("the driver samples utilisation every ")
        .nth(1)
        .and_then(|rest| rest.split(" s (measured)").next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no measured period in {evidence}"));
    // A running average of one sample and none, tick by tick: near 0.8 s.
    assert!((0.65..=0.95).contains(&period), "{evidence}");
}

#[test]
fn idling_together_is_starvation_and_in_turn_is_pipeline_bubbles() {
    // Four GPUs. Together: all idle on the same ticks. In turn: GPU i idles on ticks ≡ i mod 4.
    // `owner`: every GPU's process owned by that uid; 0: each GPU by a uid of its own. Staggered,
    // each holds memory of its own, as a pipeline's stages do (`stage`), unless `replicas`.
    let run_with = |staggered: bool, owner: Option<u32>, replicas: bool| {
        let mut tick = 0u32;
        let last = Rig::new(10).run(30, || {
            let gpus = (0..4)
                .map(|i| {
                    let idle = if staggered { tick % 4 == i } else { tick % 4 < 2 };
                    let d = one_sample(i, if idle { 0.02 } else { 0.93 }, true);
                    let d = if staggered && !replicas { stage(d, i) } else { d };
                    match owner {
                        Some(0) => owned(d, 2000 + i),
                        Some(uid) => owned(d, uid),
                        None => d,
                    }
                })
                .collect();
            tick += 1;
            gpus
        });
        let kinds = kinds_on(&last).into_iter().map(|(_, k)| k).collect::<BTreeSet<FindingKind>>();
        (kinds, last)
    };
    let run = |staggered: bool, owner: Option<u32>| run_with(staggered, owner, false).0;
    assert_eq!(run(false, None), BTreeSet::from([FindingKind::DataloaderStarvation]));
    // In turn with nothing saying the four run one job: a pipeline's stages, or four jobs each
    // starving on its own — both named (issue #42: other jobs' GPUs were read as stages).
    assert_eq!(run(true, None), BTreeSet::from([FindingKind::StarvationOrBubbles]));
    // The same four owned by one user: one job, its stages idle in turn — bubbles.
    assert_eq!(run(true, Some(1000)), BTreeSet::from([FindingKind::PipelineBubbles]));
    // Each its own user's: four independent single-GPU jobs are never bubbles.
    assert_eq!(run(true, Some(0)), BTreeSet::from([FindingKind::DataloaderStarvation]));
    // One user's job idling in turn, every GPU of it holding the same memory, as data-parallel
    // replicas do: ranks whose loaders stall at different moments read in turn too (fit set: all
    // of the 46 GPU-runs wrongly called bubbles were such ranks) — both named, and why.
    let (kinds, last) = run_with(true, Some(1000), true);
    assert_eq!(kinds, BTreeSet::from([FindingKind::StarvationOrBubbles]));
    let f = last.active.iter().find(|f| f.gpu == Some(0)).unwrap();
    assert!(f.evidence.contains("every GPU of the job holds the same share of its memory"), "{}", f.evidence);
}

#[test]
fn ranks_whose_latest_readings_idle_in_turn_but_whose_levels_move_together_are_not_bubbles() {
    // One user's job on four GPUs. Each GPU's latest driver sample idles on its own tick of a
    // four-tick cycle (in turn), and each interval holds both idle and busy samples. `shared`:
    // the intervals' levels rise and fall together on every GPU — ranks waiting at the same
    // moments, each sampled by the driver at its own instants (held-back draws: data-parallel
    // ranks starving in lockstep were called pipeline bubbles). Otherwise each GPU's level
    // follows its own latest sample: stages idling in turn.
    let run = |shared: bool, owner: bool| {
        let mut tick = 0u32;
        Rig::new(12).run(40, || {
            let t = tick;
            tick += 1;
            (0..4)
                .map(|i| {
                    let idle = t % 4 == i;
                    let mut d = one_sample(i, if idle { 0.02 } else { 0.93 }, true);
                    let mean = if shared {
                        if t.is_multiple_of(2) {
                            0.35
                        } else {
                            0.75
                        }
                    } else if idle {
                        0.3
                    } else {
                        0.8
                    };
                    d.windows.gpu_utilization = Some(WindowStats { min: 0.02, max: 0.93, mean, count: 3 });
                    // Memory of its own, as a stage: the levels alone decide here.
                    let d = stage(d, i);
                    if owner {
                        owned(d, 1000)
                    } else {
                        d
                    }
                })
                .collect()
        })
    };
    let shared = run(true, true);
    let kinds: BTreeSet<FindingKind> = kinds_on(&shared).into_iter().map(|(_, k)| k).collect();
    assert_eq!(kinds, BTreeSet::from([FindingKind::StarvationOrBubbles]), "{:?}", kinds_on(&shared));
    let f = shared.active.iter().find(|f| f.gpu == Some(0)).unwrap();
    assert!(
        f.evidence.contains("its intervals' levels rise and fall with theirs (correlation 1.00)"),
        "{}",
        f.evidence
    );
    let own = run(false, true);
    let kinds: BTreeSet<FindingKind> = kinds_on(&own).into_iter().map(|(_, k)| k).collect();
    assert_eq!(kinds, BTreeSet::from([FindingKind::PipelineBubbles]), "{:?}", kinds_on(&own));
    // Nothing says the four run one job: that is the first reason given, whatever the levels.
    let assumed = run(true, false);
    let f = assumed.active.iter().find(|f| f.gpu == Some(0)).unwrap();
    assert_eq!(f.kind, FindingKind::StarvationOrBubbles);
    assert!(f.evidence.contains("nothing says they run one job"), "{}", f.evidence);
}

#[test]
fn stages_whose_one_bubble_per_step_reads_idle_on_one_tick_in_twelve_are_pipeline_bubbles() {
    // One user's job on four GPUs, a step of twelve ticks (five in the window). Each stage's bubble is a driver
    // period or two: one latest reading clearly idle, two in between, nine busy (its level 78 %,
    // 8 % of its readings idle), at its own place in the step. Fit set: stages like these were
    // a third of the missed bubbles while a tenth of the readings had to be idle.
    let mut tick = 0u32;
    let d = Rig::new(60).run(130, || {
        let t = tick;
        tick += 1;
        four_stages(|i| match (t + 12 - 3 * i) % 12 {
            0 => 0.02,
            1 | 11 => 0.5,
            _ => 0.93,
        })
    });
    let kinds: BTreeSet<FindingKind> = kinds_on(&d).into_iter().map(|(_, k)| k).collect();
    assert_eq!(kinds, BTreeSet::from([FindingKind::PipelineBubbles]), "{:?}", kinds_on(&d));
}

/// The first of `ticks` ticks (from 0) at which `kind` is raised — on `gpu`, or on any GPU
/// with `None` — the devices of each tick made by `devices` from the tick's number.
fn first_raise_tick(
    rig: &mut Rig,
    ticks: u32,
    kind: FindingKind,
    gpu: Option<u32>,
    mut devices: impl FnMut(u32) -> Vec<DeviceSample>,
) -> Option<u32> {
    let mut raised = None;
    for tick in 0..ticks {
        let d = rig.step(devices(tick));
        let on = |f: &Finding| f.kind == kind && gpu.is_none_or(|g| f.gpu == Some(g));
        if d.events.iter().any(|e| e.transition == Transition::Raised && on(&e.finding)) {
            raised.get_or_insert(tick);
        }
    }
    raised
}

#[test]
fn a_straggler_is_named_while_its_jobs_first_intervals_are_still_in_the_window() {
    // One user's job on eight GPUs, held idle for three ticks, then started. The driver sampled
    // the first two intervals mostly after the start on half of them and partly before it on
    // the others, so they read 95 % on some replicas and 20 % then 50 % on the rest; from then
    // on all read alike, at 93 %, and GPU 5 at 70 %. Those two intervals keep the replicas'
    // 18-tick window means more than 5 points apart until they leave the window (fit set:
    // stragglers named after the two windows their onset allows).
    let raised = first_raise_tick(&mut Rig::new(18), 60, FindingKind::Straggler, None, |tick| {
        (0..8)
            .map(|i| {
                let util = match tick {
                    0..3 => 0.0,
                    3 | 4 if i == 5 => 0.3,
                    3 | 4 => {
                        if i % 2 == 0 {
                            0.95
                        } else {
                            0.2 + 0.3 * f64::from(tick - 3)
                        }
                    }
                    _ if i == 5 => 0.7,
                    _ => 0.93,
                };
                owned(one_sample(i, util, true), 1000)
            })
            .collect()
    });
    let tick = raised.expect("the straggler named");
    // Within two windows of its job's start (issue #42, item 5), at tick 3: 37 here; 45 at the
    // 5-point tolerance, which waits for the first two intervals to leave the window.
    assert!(tick <= 3 + 2 * 18, "named at tick {tick}");
}

#[test]
fn a_stage_whose_idle_readings_hover_at_the_patterns_bound_is_named_in_time() {
    // One user's job on four stages (memory of their own), a step of 22 ticks: one reading
    // clearly idle, five in between, sixteen busy (window mean 79 %), each stage at its own
    // place in the step. A 120-tick window holds 5 or 6 of its idle readings, as each enters or
    // leaves it: a twentieth of the window (6) on some ticks and not the next. The pattern, once
    // seen, holds down to a fortieth (`Swings::still_busy_and_idle`); without that hysteresis
    // the stage read bubbles on half its ticks only, and was never raised.
    let raised = first_raise_tick(&mut Rig::new(120), 300, FindingKind::PipelineBubbles, None, |tick| {
        four_stages(|i| match (tick + 22 - [0, 5, 11, 16][i as usize]) % 22 {
            0 => 0.02,
            1..=5 => 0.5,
            _ => 0.93,
        })
    });
    let tick = raised.expect("bubbles named");
    // Within two windows of the job's start (issue #42, item 5).
    assert!(tick <= 240, "named at tick {tick}");
}

#[test]
fn a_stage_whose_co_idling_hovers_at_the_in_turn_bound_is_named_in_time() {
    // One user's job on four stages (memory of their own), a 12-tick step, a 36-tick window:
    // each idles 5 ticks of the step, in two pairs 3 ticks apart (a staircase's neighbours share
    // part of each bubble). Its co-idling moves between 0.30 and 0.34 as readings enter and
    // leave the window: in turn on some ticks, "neither clearly" on the next. Once read in turn
    // it stays in turn up to 0.35 (`IN_TURN_HELD`); without that hysteresis neither verdict held
    // on 80 % of the window's ticks within two windows (fit set: stages of staircases named late
    // or not at all).
    let raised = first_raise_tick(&mut Rig::new(36), 200, FindingKind::PipelineBubbles, Some(0), |tick| {
        four_stages(|i| if (tick + 12 - [0, 0, 3, 3][i as usize]) % 12 < 5 { 0.02 } else { 0.93 })
    });
    let tick = raised.expect("bubbles named on GPU 0");
    assert!(tick <= 72, "named at tick {tick}");
}

#[test]
fn a_straggler_among_busy_peers_is_named_and_twins_stay_imbalance() {
    // One job (one owner) on eight GPUs; GPU 5 at 60 % among peers at 97 %.
    let job = |i: u32, level: f64| owned(one_sample(i, level, true), 1000);
    let d = Rig::new(10).run(12, || (0..8).map(|i| job(i, if i == 5 { 0.6 } else { 0.97 })).collect());
    assert_eq!(kinds_on(&d), [(Some(5), FindingKind::Straggler)]);
    assert!(
        d.active[0].evidence.starts_with("utilisation 60 %, 37 points below the mean of its job's other GPUs"),
        "{}",
        d.active[0].evidence
    );
    // No job information, but all eight hold the same memory, as data-parallel replicas do: its
    // peers are assumed to be those, and a job of its own reads the same (issue #42: an
    // independent single-GPU job is never named a straggler on an assumption) — both readings
    // are named, and the evidence says which assumption each makes.
    let d = Rig::new(10).run(12, || (0..8).map(|i| one_sample(i, if i == 5 { 0.6 } else { 0.97 }, true)).collect());
    assert_eq!(kinds_on(&d), [(Some(5), FindingKind::StragglerOrOwnJob)]);
    let e = &d.active[0].evidence;
    assert!(e.starts_with("cannot tell a straggler from a job of its own: utilisation 60 %, 37 points below"), "{e}");
    assert!(
        e.contains("if the GPUs holding the same share of memory as it (data-parallel replicas) run its job, it holds them back"),
        "{e}"
    );
    // No job information, two jobs side by side, each on GPUs holding the same memory: GPU 2
    // behind the three that hold what it holds is the one compared, whatever the other job's
    // GPUs hold (issue #42: with another job on the node, the straggler read as a starving
    // loader).
    let d = Rig::new(10).run(12, || {
        (0..8)
            .map(|i| {
                let mut d = one_sample(i, if i == 2 { 0.6 } else { 0.97 }, true);
                if i >= 4 {
                    d.memory.used = d.memory.used.map(|u| u * 3 / 4);
                }
                d
            })
            .collect()
    });
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::StragglerOrOwnJob)]);
    // Its idle share in stretches longer than a tick (one tick in five idle, the others busy):
    // the ticks in the stretch read as low as an idle GPU, but over the window it is behind its
    // peers, not idle beside them — a straggler, not an imbalance.
    let mut tick = 0;
    let d = Rig::new(10).run(12, || {
        tick += 1;
        (0..8).map(|i| job(i, if i == 5 && tick % 5 == 0 { 0.0 } else { 0.97 })).collect()
    });
    assert_eq!(kinds_on(&d), [(Some(5), FindingKind::Straggler)]);
    // Nothing says they run one job and GPU 5 holds other memory: it may run a lighter job of
    // its own — no straggler (issue #42: a job of its own was called the others' straggler).
    let d = Rig::new(10).run(12, || {
        (0..8)
            .map(|i| {
                let mut d = one_sample(i, if i == 5 { 0.6 } else { 0.97 }, true);
                if i == 5 {
                    d.memory.used = d.memory.used.map(|u| u / 2);
                }
                d
            })
            .collect()
    });
    assert_quiet(&d);
    // Two GPUs of one job, one far behind: imbalance, not a straggler (there is no group to
    // fall behind).
    let d = Rig::new(10).run(12, || vec![job(0, 0.97), job(1, 0.05)]);
    assert_eq!(kinds_on(&d), [(Some(1), FindingKind::Imbalance)]);
}

#[test]
fn hw_slowdown_on_a_cool_gpu_is_an_external_slowdown() {
    let d = Rig::new(10).run(12, || {
        let mut d = busy(0);
        d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::HW_SLOWDOWN));
        d.clocks.sm = d.info.max_clocks.sm.map(|m| m * 0.5);
        d.temperature.gpu = Some(45.0);
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::ExternalSlowdown)]);
    assert!(d.active[0].evidence.contains("HW slowdown / power brake active on"), "{}", d.active[0].evidence);
}

#[test]
fn idle_allocated_waits_for_the_warm_up_grace_unless_the_gpu_has_run() {
    let idle = |i| one_sample(i, 0.0, true);
    // 40 s of loading/compiling, then work: nothing raised (the grace is 60 s).
    let mut rig = Rig::new(10);
    for tick in 0..100 {
        let d = if tick < 40 { idle(0) } else { one_sample(0, 0.95, true) };
        assert!(rig.step(vec![d]).events.is_empty(), "tick {tick}");
    }
    // Never runs: raised once the grace is over, within a window.
    let mut rig = Rig::new(10);
    let raised = (0..100).find(|_| first_raise(&rig.step(vec![idle(0)]), FindingKind::IdleAllocated).is_some());
    let tick = raised.expect("raised");
    assert!((60..=72).contains(&tick), "raised at tick {tick}");
    // Ran, then stopped: no grace — once the window no longer holds the work (10 ticks), 80 %
    // of a window idle raises it.
    let mut rig = Rig::new(10);
    for _ in 0..5 {
        rig.step(vec![one_sample(0, 0.95, true)]);
    }
    let raised = (0..30).find(|_| first_raise(&rig.step(vec![idle(0)]), FindingKind::IdleAllocated).is_some());
    assert!(raised.is_some_and(|t| t <= 10 + 8), "{raised:?}");
}

#[test]
fn idle_allocated_evidence_quotes_what_the_rule_tested() {
    // Idle on most ticks, with a little housekeeping (12 %: above the idle level, below the idle
    // peak) on every tenth; the evidence says how often the rule's own test held.
    let mut rig = Rig::without_grace();
    let mut evidence = None;
    for tick in 0..40 {
        let util = if tick % 10 == 0 { 0.12 } else { 0.0 };
        if let Some(f) = first_raise(&rig.step(vec![one_sample(0, util, true)]), FindingKind::IdleAllocated) {
            evidence.get_or_insert(f.evidence.clone());
        }
    }
    let e = evidence.expect("raised");
    assert!(e.starts_with("utilisation at most 5 % on "), "{e}");
}

/// GPUs whose readings average each step's busy and idle stretches away (the driver's sampling
/// period spans several steps), with memory held: each reads `level`, give or take the part of
/// a step the sample caught (± `spread` / 2, a tick up, a tick down); GPU `i`'s run (rank `i`)
/// reports a 0.3 s step at every tick with that mean, when `marked` says so.
fn averaged_tick(rig: &mut Rig, tick: u64, levels: &[f64], marked: &[bool]) -> Diagnosis {
    averaged_tick_with_spread(rig, tick, levels, marked, 0.08)
}

/// Rank `rank` of job `train` on GPU `d`, reporting step `tick`: `duration` long, `level` busy.
fn rank_run(d: &DeviceSample, rank: u32, tick: u64, duration: Duration, level: f64) -> crate::stages::steps::RunSteps {
    use crate::stages::steps::{DeviceStep, RunSteps, StepReport};
    let mut report = StepReport::new(tick, duration);
    let mut g = DeviceStep::new(d.info.uuid.clone());
    g.utilization_mean = Some(level);
    report.devices.push(g);
    let mut run = RunSteps::new("train", Some(rank));
    run.last_duration = Some(report.duration);
    run.last = Some(report.clone());
    run.reported = vec![report];
    run
}

fn averaged_tick_with_spread(rig: &mut Rig, tick: u64, levels: &[f64], marked: &[bool], spread: f64) -> Diagnosis {
    use crate::stages::steps::Steps;
    let mut devices = Vec::new();
    let mut runs = Vec::new();
    for (i, (&level, &marks)) in levels.iter().zip(marked).enumerate() {
        let mut d = busy(i as u32);
        let read = level + if tick.is_multiple_of(2) { spread / 2.0 } else { -spread / 2.0 };
        d.utilization.gpu = Some(read);
        d.windows.gpu_utilization = Some(WindowStats { min: read, max: read, mean: read, count: 1 });
        d.utilization.memory = Some(0.1);
        d.windows.memory_utilization = None;
        d.gpm = Default::default();
        if marks {
            runs.push(rank_run(&d, i as u32, tick, Duration::from_millis(300), level));
        }
        devices.push(d);
    }
    rig.step_with(devices, (!runs.is_empty()).then(|| Steps { runs, ..Default::default() }))
}

/// 20 ticks of [`averaged_tick`] on a fresh rig, `each` seeing every tick's diagnosis; the last.
fn averaged_run(levels: &[f64], marked: &[bool], mut each: impl FnMut(&Diagnosis)) -> Diagnosis {
    let mut rig = Rig::new(10);
    let mut last = None;
    for tick in 1..=20 {
        let d = averaged_tick(&mut rig, tick, levels, marked);
        each(&d);
        last = Some(d);
    }
    last.expect("20 ticks")
}

#[test]
fn marked_steps_decide_starvation_where_the_readings_average_it_away() {
    // Two GPUs at a steady 40 % in every reading: without steps nothing tells a starving loop
    // from steady light work, and nothing is raised.
    averaged_run(&[0.4, 0.4], &[false, false], assert_quiet);
    // A one-GPU job marking its steps: they are 60 % idle, and with no other GPU to be a stage
    // of, that is starvation.
    let mut evidence = None;
    let last = averaged_run(&[0.4], &[true], |d| {
        if let Some(f) = first_raise(d, FindingKind::DataloaderStarvation) {
            assert_eq!(f.gpu, Some(0));
            evidence = Some(f.evidence.clone());
        }
    });
    assert_eq!(kinds_on(&last), vec![(Some(0), FindingKind::DataloaderStarvation)]);
    let e = evidence.expect("raised");
    assert!(e.contains("its marked steps 40 % busy on average (60 % of each step idle"), "{e}");
    // The region its readings can show, from its own numbers.
    assert!(e.contains("its steps 0.30 s with busy and idle stretches of 0.12 s and 0.18 s"), "{e}");
    assert!(e.contains("the readings cannot show this cause (the marked steps decide)"), "{e}");
    assert!(e.contains("of train rank 0 took 0.30 s, 0.18 s of it idle (40 % mean utilisation)"), "{e}");
    // The same steps on GPU 0 of a job whose run drives GPU 1 too: the steps say GPU 0 waits
    // 60 % of each one, but readings averaged over the driver's period cannot show whether
    // GPU 1 waits at the same moments (data-parallel ranks starving together) or in turn (a
    // pipeline's stages): both are named, and why (issue #42, item 4). GPU 1 reports no steps.
    let mut evidence = None;
    let last = averaged_run(&[0.4, 0.4], &[true, false], |d| {
        if let Some(f) = first_raise(d, FindingKind::StarvationOrBubbles) {
            evidence = Some(f.evidence.clone());
        }
    });
    assert_eq!(kinds_on(&last), vec![(Some(0), FindingKind::StarvationOrBubbles)]);
    let e = evidence.expect("raised");
    assert!(e.contains("cannot tell data loader starvation from pipeline bubbles"), "{e}");
    assert!(e.contains("cannot show whether they idle at the same moments"), "{e}");
    // How the idle time splits between the two is what cannot be read: no share is given.
    assert!(!e.contains("of the window, about") && !e.contains("all one or the other"), "{e}");
    assert!(!e.contains("; ,"), "{e}");
}

#[test]
fn marked_steps_mostly_idle_are_starvation_below_the_band_that_keeps_servers_quiet() {
    // A one-GPU loop marking its steps, each 88 % idle. Its readings alone (12 % on average)
    // are below the band's 15 %, where a GPU with short bursts may be a server between
    // requests; a loop marking training steps is not one: its loader starves it.
    let last = averaged_run(&[0.12], &[true], |_| {});
    assert_eq!(kinds_on(&last), vec![(Some(0), FindingKind::DataloaderStarvation)]);
    // The same readings unmarked: nothing says it is a training loop, nothing is raised.
    averaged_run(&[0.12], &[false], assert_quiet);
}

#[test]
fn marked_steps_of_a_busy_loop_or_a_straggler_are_not_starvation() {
    // Busy steps: nothing.
    averaged_run(&[0.95, 0.94], &[true, true], assert_quiet);
    // One rank at 55 % among three at 96 %, all marked: a straggler, not a starving loader
    // (a loader holds back every rank of the job alike).
    let last = averaged_run(&[0.96, 0.96, 0.55, 0.96], &[true; 4], |_| {});
    assert_eq!(kinds_on(&last), vec![(Some(2), FindingKind::Straggler)]);
}

#[test]
fn marked_steps_decide_however_little_the_readings_vary() {
    // Issue #42, item 5: a loop marking 0.3 s steps at a steady 28 % in every reading — 72 % of
    // each step idle, readings flat (a driver period of whole steps averages every wait away, or
    // host work between small kernels never shows). The steps decide: it waits on its host, and
    // the evidence says the readings are flat and names both ways of waiting so.
    // One marked GPU at 28 % whose readings move by `spread`: the evidence starvation was first
    // raised with.
    let starving_evidence = |spread: f64| {
        let mut rig = Rig::new(10);
        (1..=20).find_map(|tick| {
            let d = averaged_tick_with_spread(&mut rig, tick, &[0.28], &[true], spread);
            first_raise(&d, FindingKind::DataloaderStarvation).map(|f| f.evidence.clone())
        })
    };
    let e = starving_evidence(0.0).expect("the marked steps decide with flat readings");
    assert!(e.contains("72 % of each step idle"), "{e}");
    assert!(e.contains("its readings flat (within 0 points)"), "{e}");
    assert!(e.contains("a loop bound by its CPU"), "{e}");
    // Readings that move by the part of a step each sample catches: the same finding, and no
    // word of flat readings.
    let e = starving_evidence(0.08).expect("raised");
    assert!(!e.contains("readings flat"), "{e}");
    // Two GPUs of one run, flat: starving together or pipeline stages in turn, the readings
    // cannot tell — both named, never nothing.
    let mut rig = Rig::new(10);
    let mut last = None;
    for tick in 1..=20 {
        last = Some(averaged_tick_with_spread(&mut rig, tick, &[0.28, 0.28], &[true, true], 0.0));
    }
    let kinds: Vec<_> = kinds_on(&last.expect("20 ticks")).into_iter().map(|(_, k)| k).collect();
    assert_eq!(kinds, [FindingKind::StarvationOrBubbles; 2]);
    // The same flat readings unmarked: nothing tells a starving loop from steady light work.
    let mut rig = Rig::new(10);
    for tick in 1..=20 {
        assert_quiet(&averaged_tick_with_spread(&mut rig, tick, &[0.28], &[false], 0.0));
    }
}

/// One tick of GPUs busy at 95 %, each marking rank `i` of job `train`: step `tick` took
/// `steps[i]` seconds.
fn marked_busy_tick(rig: &mut Rig, tick: u64, steps: &[f64]) -> Diagnosis {
    marked_tick(rig, tick, &vec![0.95; steps.len()], steps)
}

/// One tick of GPUs at `levels`, each marking rank `i` of job `train`: step `tick` took
/// `steps[i]` seconds.
fn marked_tick(rig: &mut Rig, tick: u64, levels: &[f64], steps: &[f64]) -> Diagnosis {
    let devices: Vec<_> = levels.iter().enumerate().map(|(i, &level)| one_sample(i as u32, level, true)).collect();
    let runs = devices
        .iter()
        .zip(levels.iter().zip(steps))
        .map(|(d, (&level, &secs))| rank_run(d, d.info.index, tick, Duration::from_secs_f64(secs), level))
        .collect();
    rig.step_with(devices, Some(crate::stages::steps::Steps { runs, ..Default::default() }))
}

#[test]
fn a_rank_whose_marked_steps_take_a_tenth_longer_is_a_straggler() {
    // Issue #42, item 5: "steps 10 % slower when marked". Four ranks busy at 95 % (the level
    // shows nothing), rank 2's steps 1.2 s against 1.0 s: a straggler on its steps.
    let run = |steps: &[f64]| {
        let mut rig = Rig::new(10);
        (1..=20).map(|tick| marked_busy_tick(&mut rig, tick, steps)).last().expect("20 ticks")
    };
    let d = run(&[1.0, 1.0, 1.2, 1.0]);
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::Straggler)]);
    assert!(
        d.active[0]
            .evidence
            .contains("its last marked step 1.20 s against 1.00 s for its job's other ranks (20 % longer)"),
        "{}",
        d.active[0].evidence
    );
    // A rank 30 points behind on its level, its steps in lockstep with the others' (to within a
    // timer's jitter): a straggler on its level, and no step times said ("1 % longer" would
    // say nothing).
    let mut rig = Rig::new(10);
    let steps = [1.0, 1.0, 1.01, 1.0];
    let d = (1..=20).map(|tick| marked_tick(&mut rig, tick, &[0.95, 0.95, 0.65, 0.95], &steps)).last();
    let d = d.expect("20 ticks");
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::Straggler)]);
    assert!(!d.active[0].evidence.contains("marked step"), "{}", d.active[0].evidence);
    // 5 % longer: under the gap worth naming. Ranks in lockstep (the same step time): nothing.
    assert_quiet(&run(&[1.0, 1.0, 1.05, 1.0]));
    assert_quiet(&run(&[1.0; 4]));
    // Two ranks are no group to fall behind, as for the level.
    assert_quiet(&run(&[1.0, 1.2]));
}

/// A GPU busy at 97 % with its clocks held down by a thermal slowdown.
fn hot_and_busy(index: u32) -> DeviceSample {
    let mut d = one_sample(index, 0.97, true);
    d.temperature.gpu = Some(89.0);
    d.clocks.sm = d.info.max_clocks.sm.map(|m| m * 0.6);
    d.clock_event_reasons =
        Some(ClockEventReasons(ClockEventReasons::HW_THERMAL_SLOWDOWN | ClockEventReasons::SW_THERMAL_SLOWDOWN));
    d
}

#[test]
fn peers_waiting_for_a_slowed_busy_gpu_are_not_bubbles_and_its_finding_names_them() {
    // The review's case: GPU 0 throttled and never idle; GPUs 1 and 2 wait for it at every
    // step, idle together — but with GPU 0 busy, "most others busy" made their idling "in turn":
    // pipeline bubbles on both, the run's main cause, with advice about micro-batches.
    let mut raised = Vec::new();
    let mut rig = Rig::new(10);
    for tick in 0..40u32 {
        let idle = tick.is_multiple_of(2);
        let d = rig.step(vec![
            hot_and_busy(0),
            one_sample(1, if idle { 0.02 } else { 0.95 }, true),
            one_sample(2, if idle { 0.02 } else { 0.95 }, true),
        ]);
        raised.extend(d.events.iter().filter(|e| e.transition == Transition::Raised).map(|e| e.finding.clone()));
    }
    let kinds: Vec<_> = raised.iter().map(|f| (f.gpu, f.kind)).collect();
    assert_eq!(kinds, [(Some(0), FindingKind::ThermalThrottling)]);
    let e = &raised[0].evidence;
    assert!(e.contains("busy on every tick while GPU(s) 1, 2 are not: in a synchronous job they wait for it"), "{e}");

    // Every rank starving, one of them also hot: it idles with the others, nobody waits for it.
    let mut tick = 0u32;
    let last = Rig::new(10).run(30, || {
        let idle = tick.is_multiple_of(2);
        tick += 1;
        let util = if idle { 0.02 } else { 0.95 };
        let mut hot = hot_and_busy(0);
        hot.utilization.gpu = Some(util);
        hot.windows.gpu_utilization = Some(WindowStats { min: util, max: util, mean: util, count: 1 });
        vec![hot, one_sample(1, util, true), one_sample(2, util, true)]
    });
    let mut kinds = kinds_on(&last);
    kinds.sort();
    assert_eq!(
        kinds,
        [
            (Some(0), FindingKind::DataloaderStarvation),
            (Some(0), FindingKind::ThermalThrottling),
            (Some(1), FindingKind::DataloaderStarvation),
            (Some(2), FindingKind::DataloaderStarvation),
        ]
    );
}

#[test]
fn a_throttled_gpu_holding_other_memory_does_not_silence_a_job_starving_beside_it() {
    // No job information. GPU 0 throttled and busy throughout; GPUs 1 and 2 starve together.
    // Holding the same memory as GPU 0 (replicas of one model), they are taken to wait for it
    // (the test above); holding other memory — another job's model — their loaders starve
    // them, and GPU 0's finding claims no waiting peers (fit seed 0x42: a single-GPU job
    // starving beside a GPU under an external slowdown was silenced).
    let mut raised = Vec::new();
    let mut rig = Rig::new(10);
    for tick in 0..40u32 {
        let idle = tick.is_multiple_of(2);
        let starving = |i: u32| {
            let mut d = one_sample(i, if idle { 0.02 } else { 0.95 }, true);
            d.memory.used = d.memory.used.map(|u| u / 2);
            d
        };
        let d = rig.step(vec![hot_and_busy(0), starving(1), starving(2)]);
        raised.extend(d.events.iter().filter(|e| e.transition == Transition::Raised).map(|e| e.finding.clone()));
    }
    let mut kinds: Vec<_> = raised.iter().map(|f| (f.gpu, f.kind)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            (Some(0), FindingKind::ThermalThrottling),
            (Some(1), FindingKind::DataloaderStarvation),
            (Some(2), FindingKind::DataloaderStarvation),
        ]
    );
    let thermal = raised.iter().find(|f| f.kind == FindingKind::ThermalThrottling).unwrap();
    assert!(!thermal.evidence.contains("they wait for it"), "{}", thermal.evidence);
}

#[test]
fn pcie_bound_reads_the_level_over_the_window_not_the_interval() {
    // The review's memcopy case at short intervals: 0.4 s compute bursts at 90 % between copies
    // at 85 % of the link; each tick is all burst or all copy, and the burst ticks read busy.
    let mut tick = 0u32;
    let d = Rig::new(10).run(20, || {
        let util = if tick % 5 < 2 { 0.9 } else { 0.05 };
        tick += 1;
        let mut d = one_sample(0, util, true);
        d.pcie.link_generation = Some(4);
        d.pcie.link_width = Some(16);
        d.pcie.rx_bytes_per_second = Some(0.85 * 16.0 * 1.969e9);
        d.pcie.tx_bytes_per_second = Some(1e9);
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::PcieBound)]);
}

#[test]
fn without_gpm_a_busy_gpu_with_its_memory_controller_busy_nearly_always_is_memory_bound() {
    // An A100 (no GPM): a kernel runs all the time (utilisation 97 %), so the level, standing in
    // for SM activity, is high; the memory controller, busy 85 % of the time, decides.
    let no_gpm = |controller: f64| {
        move || {
            let mut d = busy(0);
            d.utilization.gpu = Some(0.97);
            d.windows.gpu_utilization = Some(WindowStats { min: 0.95, max: 0.99, mean: 0.97, count: 6 });
            d.utilization.memory = Some(controller);
            d.gpm.sm_activity = None;
            d.gpm.dram_bandwidth = None;
            vec![d]
        }
    };
    let mut rig = Rig::new(10);
    let d = rig.run(12, no_gpm(0.85));
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::MemoryBound)]);
    assert_eq!(rig.d.devices_without_sm_activity(), 1);
    // Compute-bound training keeps the controller busy well under that: nothing.
    assert_quiet(&Rig::new(10).run(12, no_gpm(0.45)));
    // With GPM, SM activity decides: busy SMs are not memory-bound, whatever the controller.
    let mut rig = Rig::new(10);
    let d = rig.run(12, || {
        let mut d = busy(0);
        d.utilization.memory = Some(0.85);
        vec![d]
    });
    assert_quiet(&d);
    assert_eq!(rig.d.devices_without_sm_activity(), 0);
}

/// A MIG instance: memory, no utilisation (NVML reads none per instance), GPM where given.
fn mig_instance(index: u32, sm_activity: Option<f64>) -> DeviceSample {
    let mut i = (*info(index)).clone();
    i.uuid = format!("MIG-{index:04}");
    let mut d = DeviceSample::new(Arc::new(i));
    d.memory.used = Some(20 * GIB);
    d.memory.total = Some(40 * GIB);
    d.gpm.sm_activity = sm_activity;
    d
}

#[test]
fn a_mig_instance_reads_its_level_from_gpm_and_without_gpm_is_counted_unjudged() {
    // With GPM (H100): SM activity is the level, and an instance holding memory with nothing
    // running is idle while allocated.
    let mut rig = Rig::without_grace();
    let d = rig.run(12, || vec![mig_instance(0, Some(0.0)), mig_instance(1, Some(0.0))]);
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::IdleAllocated), (Some(1), FindingKind::IdleAllocated)]);
    assert!(d.active[0].evidence.contains("GPM SM activity"), "{}", d.active[0].evidence);
    assert_eq!(rig.d.devices_without_level(), 0);
    // A busy instance is not.
    assert_quiet(&Rig::without_grace().run(12, || vec![mig_instance(0, Some(0.9))]));
    // Without GPM (A100): no level, nothing can be judged, and that is counted.
    let mut rig = Rig::without_grace();
    assert_quiet(&rig.run(12, || vec![mig_instance(0, None), mig_instance(1, None)]));
    assert_eq!(rig.d.devices_without_level(), 2);
}

#[test]
fn the_lone_busy_gpu_its_cycling_peers_wait_for_is_the_straggler_and_they_are_not_starving() {
    // GPU 2 busy throughout with no slowdown reason; GPUs 0, 1, 3 idle together in every other
    // tick (they wait for it in lockstep).
    let peers_and = |gpus: u32, busy_ones: &'static [u32]| {
        let mut tick = 0u32;
        move || {
            tick += 1;
            (0..gpus)
                .map(|i| {
                    if busy_ones.contains(&i) {
                        return busy(i);
                    }
                    let mut d = busy(i);
                    let u = if tick.is_multiple_of(2) { 0.95 } else { 0.02 };
                    d.utilization.gpu = Some(u);
                    d.windows.gpu_utilization = None;
                    d.gpm.sm_activity = Some(u * 0.8);
                    d.utilization.memory = Some(0.2);
                    d
                })
                .collect::<Vec<DeviceSample>>()
        }
    };
    // One user's job (attribution on), and no job information at all: named a straggler in
    // the first, both readings named in the second (a busy job of its own beside a starving
    // one reads the same); the peers are never called starving in either.
    for (known, kind) in [(true, FindingKind::Straggler), (false, FindingKind::StragglerOrOwnJob)] {
        let mut rig = Rig::new(10);
        let mut raised = None;
        let mut gen = peers_and(4, &[2]);
        for _ in 0..30 {
            let devices: Vec<DeviceSample> =
                gen().into_iter().map(|d| if known { owned(d, 1000) } else { d }).collect();
            let d = rig.step(devices);
            raised = raised.or_else(|| first_raise(&d, kind).cloned());
            assert!(kinds_on(&d).iter().all(|(g, k)| *g == Some(2) && *k == kind), "{:?}", kinds_on(&d));
        }
        let f = raised.expect("the straggler raised");
        assert_eq!(f.gpu, Some(2));
        assert!(f.evidence.contains("while GPU(s) 0, 1, 3 are not"), "{}", f.evidence);
        assert!(f.evidence.contains("no slowdown reason"), "{}", f.evidence);
    }
    // Two busy GPUs next to six cycling ones: another job as likely as a slow rank; the
    // cycling ones starve.
    let mut gen = peers_and(8, &[6, 7]);
    let d = Rig::new(10).run(30, &mut gen);
    let expected: Vec<_> = (0..6).map(|g| (Some(g), FindingKind::DataloaderStarvation)).collect();
    assert_eq!(kinds_on(&d), expected);

    // The peers as busy as GPU 2 but one reading in twelve (the job pausing for a checkpoint,
    // which GPU 2's readings happened to straddle): they cycle, but read within 10 points of
    // it over the window — nobody waits for it at every step, and nothing is said (fit set:
    // healthy jobs' busiest GPU was named a straggler so).
    let mut tick = 0u32;
    let d = Rig::new(10).run(40, || {
        tick += 1;
        (0..4u32)
            .map(|i| {
                let mut d = owned(busy(i), 1000);
                if i != 2 && tick % 12 == 5 {
                    d.utilization.gpu = Some(0.02);
                    d.windows.gpu_utilization = None;
                    d.gpm.sm_activity = Some(0.016);
                }
                d
            })
            .collect()
    });
    assert_quiet(&d);
}

/// A GPU running one process of the user `uid` (attribution on).
fn owned(mut d: DeviceSample, uid: u32) -> DeviceSample {
    let mut p = crate::model::ProcessSample::new(1000 + d.info.index);
    p.owner = Some(Arc::new(crate::model::Owner { uid: Some(uid), ..Default::default() }));
    d.processes = vec![p];
    d
}

#[test]
fn an_idle_gpu_of_another_owner_next_to_a_busy_job_is_idle_allocated_not_imbalance() {
    // GPUs 0-2 run one user's job; GPU 3 holds memory with nothing running.
    let idle = |uid| {
        move || {
            let mut gpus: Vec<DeviceSample> = (0..3).map(|i| owned(busy(i), 1000)).collect();
            let mut d = busy(3);
            d.utilization.gpu = Some(0.0);
            d.windows.gpu_utilization = Some(WindowStats { min: 0.0, max: 0.0, mean: 0.0, count: 6 });
            d.gpm.sm_activity = Some(0.0);
            d.memory.used = Some(12 * GIB);
            gpus.push(owned(d, uid));
            gpus
        }
    };
    // Another user's (a paused notebook): idle while allocated, and no imbalance claimed.
    let d = Rig::without_grace().run(12, idle(2000));
    assert_eq!(kinds_on(&d), [(Some(3), FindingKind::IdleAllocated)]);
    // The same user's: one job, unevenly spread.
    let d = Rig::without_grace().run(12, idle(1000));
    assert_eq!(kinds_on(&d), [(Some(3), FindingKind::Imbalance)]);
    assert!(d.active[0].advice.contains("another job"), "{}", d.active[0].advice);
    // Owners unknown (no attribution), but each GPU's process read: GPU 3's runs on no other
    // GPU, and nothing ties it to the busy ones — a job of its own, held idle (issue #42: it
    // was called the busy job's imbalance).
    let d = Rig::without_grace().run(12, || {
        let mut gpus = idle(2000)();
        gpus.iter_mut().for_each(|g| g.processes.iter_mut().for_each(|p| p.owner = None));
        gpus
    });
    assert_eq!(kinds_on(&d), [(Some(3), FindingKind::IdleAllocated)]);
    // No process read at all (processes are not sampled by default): held idle by a job of
    // its own, or the idle half of the busy job split unevenly — both are named.
    let d = Rig::without_grace().run(12, || {
        let mut gpus = idle(2000)();
        gpus.iter_mut().for_each(|g| g.processes.clear());
        gpus
    });
    assert_eq!(kinds_on(&d), [(Some(3), FindingKind::ImbalanceOrOwnJob)]);
}

#[test]
fn starvation_advice_names_what_else_idles_a_gpu_that_way() {
    // Across ticks, no high-resolution windows: `period` ticks busy, then `idle` ticks idle.
    let cycling = |period: u64, idle: u64| {
        let mut tick = 0u64;
        move || {
            tick += 1;
            let mut d = busy(0);
            let u = if tick % period < idle { 0.02 } else { 0.95 };
            d.utilization.gpu = Some(u);
            d.windows.gpu_utilization = None;
            d.gpm.sm_activity = Some(u * 0.8);
            d.utilization.memory = Some(0.2);
            vec![d]
        }
    };
    let raised = |gen: &mut dyn FnMut() -> Vec<DeviceSample>| {
        let mut rig = Rig::new(30);
        (0..90).find_map(|_| first_raise(&rig.step(gen()), FindingKind::DataloaderStarvation).cloned())
    };
    // 1 s idle every 2 s (no marked steps): a loader, or a server between requests.
    let f = raised(&mut cycling(2, 1)).expect("starvation raised");
    assert!(f.advice.contains("num_workers") && f.advice.contains("serves requests"), "{}", f.advice);
    assert!(f.evidence.contains("stretch(es) of 1.0 s"), "{}", f.evidence);
    // 5 s idle every 15 s: a host phase of the loop, or a stalling loader.
    let f = raised(&mut cycling(15, 5)).expect("starvation raised");
    assert!(f.advice.contains("evaluation pass") && f.advice.contains("loader stalls"), "{}", f.advice);
    assert!(f.evidence.contains("seconds at a time"), "{}", f.evidence);
}

#[test]
fn with_a_window_of_few_ticks_the_peers_of_the_gpu_they_wait_for_never_read_as_starving_first() {
    // A 6-tick window (a 5 s interval, the default 30 s window) and a 5-tick one: the peers'
    // intervals each hold both busy and idle driver samples, so starvation could hold from the
    // first tick — before five readings show GPU 2 busy throughout. It must not be raised in
    // between.
    for window in [5, 6] {
        let mut rig = Rig::new(window);
        let mut straggler = false;
        for _ in 0..20 {
            // One user's job: the GPU they wait for is named a straggler once it is known.
            let devices = (0..4)
                .map(|i| {
                    if i == 2 {
                        return owned(busy(i), 1000);
                    }
                    let mut d = dipping(i);
                    d.windows.gpu_utilization = Some(WindowStats { min: 0.02, max: 0.97, mean: 0.6, count: 30 });
                    d.utilization.gpu = Some(0.6);
                    owned(d, 1000)
                })
                .collect();
            let d = rig.step(devices);
            assert!(first_raise(&d, FindingKind::DataloaderStarvation).is_none(), "{:?}", kinds_on(&d));
            straggler |= first_raise(&d, FindingKind::Straggler).is_some_and(|f| f.gpu == Some(2));
        }
        assert!(straggler, "GPU 2 named ({window}-tick window)");
    }
}

#[test]
fn two_independent_starving_jobs_next_to_six_busy_ones_are_never_bubbles() {
    // Issue #42: GPUs 0 and 1 each run a single-GPU job whose loader starves it, out of step
    // with each other; GPUs 2-7 run a busy job. The six never idle: no pipeline stage.
    let run = |owners: bool| {
        let mut seen = BTreeSet::new();
        let mut rig = Rig::new(10);
        for tick in 0..40u32 {
            let gpus: Vec<DeviceSample> = (0..8u32)
                .map(|i| {
                    let util = match i {
                        0 => [0.02, 0.95, 0.95][(tick % 3) as usize],
                        1 => [0.95, 0.02, 0.02, 0.95, 0.95][(tick % 5) as usize],
                        _ => 0.97,
                    };
                    let d = one_sample(i, util, true);
                    if owners {
                        owned(d, if i < 2 { 3000 + i } else { 1000 })
                    } else {
                        d
                    }
                })
                .collect();
            let d = rig.step(gpus);
            seen.extend(kinds_on(&d));
        }
        seen
    };
    for owners in [false, true] {
        let seen = run(owners);
        for (gpu, kind) in &seen {
            assert!(
                !matches!(kind, FindingKind::PipelineBubbles | FindingKind::Straggler | FindingKind::Imbalance),
                "owners {owners}: {kind:?} on GPU {gpu:?} ({seen:?})"
            );
            assert!(matches!(gpu, Some(0 | 1)), "owners {owners}: a busy GPU was named: {seen:?}");
        }
        if owners {
            // Each alone in its job: nothing to be a stage of — their loaders.
            assert!(seen.contains(&(Some(0), FindingKind::DataloaderStarvation)), "{seen:?}");
            assert!(seen.contains(&(Some(1), FindingKind::DataloaderStarvation)), "{seen:?}");
        }
    }
}

#[test]
fn a_zero_offload_job_keeping_the_link_busy_while_the_sm_waits_is_pcie_bound() {
    // Issue #42: the link 85 % busy over the step while the SM waits 60 % of it. The copies
    // come in bursts: one tick's reading holds the 50 % link share on 61 % of ticks only, and
    // the per-tick rule never raised. Over the window the mean share is what counts.
    let mut tick = 0u32;
    let d = Rig::new(10).run(30, || {
        let mut d = busy(0);
        // 18 ticks in 30: link near full, SM idle; the rest: link half busy, SM computing.
        let copying = (tick * 61 / 100) != ((tick + 1) * 61 / 100);
        tick += 1;
        let (util, link_share) = if copying { (0.2, 0.95) } else { (0.65, 0.7) };
        d.utilization.gpu = Some(util);
        d.windows.gpu_utilization = Some(WindowStats { min: util, max: util, mean: util, count: 6 });
        d.gpm.sm_activity = Some(util);
        d.gpm.dram_bandwidth = Some(0.1);
        d.utilization.memory = Some(0.1);
        d.pcie.link_generation = Some(4);
        d.pcie.link_width = Some(16);
        d.pcie.rx_bytes_per_second = Some(link_share * 1.969e9 * 16.0);
        d.pcie.tx_bytes_per_second = Some(1e9);
        vec![d]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::PcieBound)]);
    assert!(d.active[0].evidence.contains("% of the link)"), "{}", d.active[0].evidence);
}

/// One GPU's tick: utilisation `util` over the interval (`samples` driver samples, all alike)
/// and the busier PCIe direction at `link_share` of a gen-4 x16 link.
fn with_link(util: f64, samples: u32, link_share: f64) -> DeviceSample {
    let mut d = one_sample(0, util, true);
    d.windows.gpu_utilization = Some(WindowStats { min: util, max: util, mean: util, count: samples });
    d.pcie.link_generation = Some(4);
    d.pcie.link_width = Some(16);
    d.pcie.rx_bytes_per_second = Some(link_share * 1.969e9 * 16.0);
    d.pcie.tx_bytes_per_second = Some(1e8);
    d
}

#[test]
fn a_starving_loader_prefetching_while_it_computes_is_not_pcie_bound() {
    // Waits of 3 s, read by a driver sampling every 1/6 s: a tick reading idle was idle, and the
    // link at that instant is what the GPU waited for — quiet here; the traffic runs while it
    // computes (prefetching the next batch). The window's estimate (its mean share over its idle
    // share, 0.82) would call it PCIe-bound: the paired readings overrule it.
    let mut tick = 0u32;
    let d = Rig::new(20).run(60, || {
        let computing = tick % 6 < 3;
        tick += 1;
        vec![if computing { with_link(0.97, 6, 0.8) } else { with_link(0.0, 6, 0.05) }]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::DataloaderStarvation)]);
}

#[test]
fn offload_waits_as_short_as_the_drivers_period_are_pcie_bound() {
    // A ZeRO-offload step of 3 ticks, one of them copying, with the driver sampling once per
    // tick: the utilisation reading is a period behind the link's instant, so the copies are
    // read at "busy" ticks and the idle readings fall where the copies are done. Paired tick by
    // tick the traffic seems to follow the compute (prefetching); the waits are too short for
    // the pairing, and the window's estimate (its mean share over its idle share: 0.9) holds.
    let mut tick = 0u32;
    let d = Rig::new(10).run(30, || {
        let phase = tick % 3;
        tick += 1;
        vec![match phase {
            0 => with_link(0.97, 1, 0.85),
            1 => with_link(0.0, 1, 0.05),
            _ => with_link(0.97, 1, 0.05),
        }]
    });
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::PcieBound)]);
}

#[test]
fn one_rank_at_80_among_peers_at_97_is_a_straggler_and_clears_within_two_windows() {
    // Issue #42: 17 points behind costs the job 17 %; the rule asked for 20 and said nothing.
    let mut rig = Rig::new(10);
    let mut raised_at = None;
    for tick in 0..20 {
        let d = rig.step((0..8).map(|i| owned(one_sample(i, if i == 3 { 0.80 } else { 0.97 }, true), 1000)).collect());
        if first_raise(&d, FindingKind::Straggler).is_some() {
            raised_at.get_or_insert(tick);
        }
    }
    let raised_at = raised_at.expect("straggler raised");
    assert!(raised_at < 20, "raised at tick {raised_at}");
    let d = rig.step((0..8).map(|i| owned(one_sample(i, if i == 3 { 0.80 } else { 0.97 }, true), 1000)).collect());
    assert_eq!(kinds_on(&d), [(Some(3), FindingKind::Straggler)]);
    // Caught up: cleared within two windows (20 ticks).
    let mut cleared = false;
    for _ in 0..20 {
        let d = rig.step((0..8).map(|i| owned(one_sample(i, 0.97, true), 1000)).collect());
        cleared |=
            d.events.iter().any(|e| e.transition == Transition::Cleared && e.finding.kind == FindingKind::Straggler);
    }
    assert!(cleared);
    // Three points behind is noise between peers: nothing.
    let d = Rig::new(10)
        .run(30, || (0..8).map(|i| owned(one_sample(i, if i == 3 { 0.94 } else { 0.97 }, true), 1000)).collect());
    assert_quiet(&d);
}

#[test]
fn a_single_gpu_job_of_its_own_is_never_a_straggler_or_imbalance() {
    // GPU 3 runs its own user's job at 50 %; GPUs 0-2 another's at 97 %.
    let d = Rig::new(10).run(30, || {
        (0..4)
            .map(|i| owned(one_sample(i, if i == 3 { 0.5 } else { 0.97 }, true), if i == 3 { 7 } else { 8 }))
            .collect()
    });
    assert_quiet(&d);
    // Without owners, and GPU 3 holding other memory than the three: nothing says they run one
    // job, and no straggler is named on a guess (issue #42: it was, saying the assumption).
    let d = Rig::new(10).run(30, || {
        (0..4)
            .map(|i| {
                let mut d = one_sample(i, if i == 3 { 0.5 } else { 0.97 }, true);
                if i == 3 {
                    d.memory.used = d.memory.used.map(|u| u / 3);
                }
                d
            })
            .collect()
    });
    assert_quiet(&d);
}

#[test]
fn two_gpus_idling_in_turn_that_nothing_says_share_a_job_cannot_tell_loaders_from_bubbles() {
    // Two GPUs, no owners, no marks, idling in turn: a 2-stage pipeline, or two jobs each
    // starving on its own. One finding names both, with both pieces of advice.
    let mut tick = 0u32;
    let d = Rig::new(10).run(30, || {
        let gpus = (0..2).map(|i| one_sample(i, if tick % 2 == i { 0.02 } else { 0.93 }, true)).collect();
        tick += 1;
        gpus
    });
    let kinds: BTreeSet<FindingKind> = kinds_on(&d).into_iter().map(|(_, k)| k).collect();
    assert_eq!(kinds, BTreeSet::from([FindingKind::StarvationOrBubbles]), "{:?}", kinds_on(&d));
    let f = &d.active[0];
    assert!(f.evidence.starts_with("cannot tell data loader starvation from pipeline bubbles"), "{}", f.evidence);
    assert!(f.evidence.contains("assuming the GPUs with work belong to one job"), "{}", f.evidence);
    assert!(f.advice.contains("num_workers") && f.advice.contains("micro-batches"), "{}", f.advice);
    // The share each reading explains: every idle moment is one or the other (item 4).
    assert!(f.evidence.contains("its idle 52 % of the window is all one or the other"), "{}", f.evidence);
}

#[test]
fn a_starving_gpu_beside_others_that_wait_unseen_with_no_job_known_names_both() {
    // GPU 0 goes busy and idle (47 % on average); GPU 1 reads a flat 70 % — it waits 30 % of
    // the time in stretches too short for the driver's sampling — and GPU 2 is busy. Nothing
    // says which job any runs: GPU 1 may be the next stage of GPU 0's pipeline or another job.
    let run = |others: &[f64], owners: bool| {
        let mut tick = 0u32;
        Rig::new(10).run(30, || {
            tick += 1;
            std::iter::once(if tick.is_multiple_of(2) { 0.02 } else { 0.93 })
                .chain(others.iter().copied())
                .enumerate()
                .map(|(i, u)| {
                    let d = one_sample(i as u32, u, true);
                    if owners {
                        owned(d, 1000 + i as u32)
                    } else {
                        d
                    }
                })
                .collect()
        })
    };
    let d = run(&[0.70, 0.97], false);
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::StarvationOrBubbles)]);
    let e = &d.active[0].evidence;
    assert!(e.contains("in stretches too short for the driver's sampling to show"), "{e}");
    assert!(e.contains("all one or the other"), "{e}");
    // Each GPU its own owner's: GPU 0 is alone in its job, and its loader starves it.
    assert_eq!(kinds_on(&run(&[0.70, 0.97], true)), [(Some(0), FindingKind::DataloaderStarvation)]);
    // Beside a busy GPU only (97 %): it waits for nothing worth naming, no stage of anyone's.
    assert_eq!(kinds_on(&run(&[0.97], false)), [(Some(0), FindingKind::DataloaderStarvation)]);
    // Ranks starving together in a window of few ticks: each interval's driver samples show
    // their dips and peaks, too few ticks to see them go busy and idle across the window. Their
    // waits are seen, not "unseen": they starve (the agent's short-window runs caught this).
    let d = Rig::new(3).run(12, || (0..4).map(dipping).collect());
    let expected: Vec<_> = (0..4).map(|g| (Some(g), FindingKind::DataloaderStarvation)).collect();
    assert_eq!(kinds_on(&d), expected);
}

#[test]
fn idling_partly_with_its_job_and_partly_in_turn_says_the_share_of_the_window_each_explains() {
    // One user's job on four GPUs, in a cycle of four ticks: GPUs 0-2 idle on the first two
    // ticks, GPU 3 on the last two. GPU 0's peers idle with it two times in three and while it
    // computes one time in three: neither together nor in turn clearly — "cannot tell", and its
    // idle half of the window splits two to one between a shared wait and a turn.
    let mut tick = 0u32;
    let d = Rig::new(12).run(40, || {
        let phase = tick % 4;
        tick += 1;
        (0..4)
            .map(|i| {
                let idle = if i < 3 { phase < 2 } else { phase >= 2 };
                owned(one_sample(i, if idle { 0.02 } else { 0.93 }, true), 1000)
            })
            .collect()
    });
    let on0: Vec<FindingKind> = kinds_on(&d).into_iter().filter(|(g, _)| *g == Some(0)).map(|(_, k)| k).collect();
    assert_eq!(on0, [FindingKind::StarvationOrBubbles], "{:?}", kinds_on(&d));
    let f = d.active.iter().find(|f| f.gpu == Some(0)).unwrap();
    assert!(f.evidence.contains("idle partly with it and partly in turn"), "{}", f.evidence);
    assert!(
        f.evidence.contains(
            "of the window, about 35 % idle while the job's other GPUs idled too (as ranks waiting for input do) and 17 % idle while they computed"
        ),
        "{}",
        f.evidence
    );
}

#[test]
fn one_pause_in_a_busy_window_is_not_a_starving_loader() {
    // Held-back draws: a healthy job busy at 97 % that saves a checkpoint (every GPU idle for a
    // few seconds, once) and idles briefly now and then, its window's level brought under the
    // band's top by the pause alone. It was called `dataloader_starvation`. The same idle time
    // in like stretches through the window is a loader starving it at every step.
    let run = |idle_ticks: &[u32]| {
        let mut rig = Rig::new(30);
        let mut raised = false;
        for tick in 0..60u32 {
            let util = if idle_ticks.contains(&(tick % 30)) { 0.0 } else { 0.97 };
            raised |=
                first_raise(&rig.step(vec![one_sample(0, util, true)]), FindingKind::DataloaderStarvation).is_some();
        }
        raised
    };
    // 7 idle ticks of 30 (window level 0.74): a 5-tick pause and two single dips.
    assert!(!run(&[3, 10, 11, 12, 13, 14, 22]), "one pause explains the window");
    // 7 idle ticks of 30, in stretches of one or two ticks through the window: starving.
    assert!(run(&[1, 2, 6, 11, 12, 18, 25]), "stretches of like length through the window");
}

/// A GPU whose one process was started by `parent`, with `uid`'s owner when given.
fn launched(mut d: DeviceSample, uid: Option<u32>, parent: Option<u32>) -> DeviceSample {
    if let Some(uid) = uid {
        d = owned(d, uid);
    } else {
        d.processes = vec![crate::model::ProcessSample::new(1000 + d.info.index)];
    }
    d.processes[0].parent_pid = parent;
    d
}

#[test]
fn one_users_two_launches_are_two_jobs_and_a_launcher_names_a_job() {
    // One user on a bare-metal node: a 4-GPU job (its ranks started by torchrun, pid 500) at
    // 97 %, and a job of its own on GPU 4 at 60 % (started from a shell, pid 600).
    let run = |parents: bool| {
        Rig::new(10).run(12, || {
            (0..5)
                .map(|i| {
                    let parent = parents.then_some(if i == 4 { 600 } else { 500 });
                    launched(one_sample(i, if i == 4 { 0.6 } else { 0.97 }, true), Some(1000), parent)
                })
                .collect()
        })
    };
    // The owner alone says one job: GPU 4 reads as the 4-GPU job's straggler.
    assert_eq!(kinds_on(&run(false)), [(Some(4), FindingKind::Straggler)]);
    // The launchers tell the two jobs apart (issue #42: independent jobs compared as one job).
    assert_quiet(&run(true));

    // Four GPUs whose processes one parent started, GPU 2 at 60 % beside the others at 97 %,
    // holding their memory (`half`: half of it); no owners (attribution read only the process
    // tree).
    let four_launched_by = |parent: u32, half: bool| {
        Rig::new(10).run(12, || {
            (0..4)
                .map(|i| {
                    let mut d = launched(one_sample(i, if i == 2 { 0.6 } else { 0.97 }, true), None, Some(parent));
                    if i == 2 && half {
                        d.memory.used = d.memory.used.map(|u| u / 2);
                    }
                    d
                })
                .collect()
        })
    };
    // The launcher names the job: GPU 2 is its replicas' straggler.
    let d = four_launched_by(500, false);
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::Straggler)]);
    assert!(!d.active[0].evidence.contains("no job information"), "{}", d.active[0].evidence);
    // Holding other memory than theirs, it is no replica of theirs (a pipeline stage waiting
    // for a slower one reads so): no straggler, whatever names the job.
    assert_quiet(&four_launched_by(500, true));
    // Processes left to init (their launcher died) name no job: pid 1 is everyone's parent. The
    // GPUs holding one memory are assumed to be one job, and both readings are named.
    let d = four_launched_by(1, false);
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::StragglerOrOwnJob)]);
    assert!(d.active[0].evidence.contains("no job information"), "{}", d.active[0].evidence);
}

#[test]
fn a_gpu_waiting_alone_beside_busy_gpus_of_its_job_holding_other_memory_names_both_readings() {
    // One user's job on three GPUs: GPU 0 goes busy and idle, GPUs 1 and 2 compute throughout.
    // Holding other memory than theirs (`half`), it waits for another part of its job — the
    // slowest stage of an uneven pipeline reads so — or for its own input: both are named (fit
    // set: such stages were called stragglers, then starved). Holding theirs, it is their
    // straggler.
    let run = |half: bool| {
        Rig::new(10).run(12, || {
            (0..3)
                .map(|i| {
                    let mut d = if i == 0 { dipping(0) } else { busy(i) };
                    if i == 0 && half {
                        d.memory.used = d.memory.used.map(|u| u / 2);
                    }
                    owned(d, 1000)
                })
                .collect()
        })
    };
    let d = run(true);
    assert_eq!(kinds_on(&d), [(Some(0), FindingKind::StarvationOrBubbles)]);
    assert!(
        d.active[0].evidence.contains("it waits alone while the other GPUs of its job"),
        "{}",
        d.active[0].evidence
    );
    assert_eq!(kinds_on(&run(false)), [(Some(0), FindingKind::Straggler)]);
}

#[test]
fn the_command_gpumon_agent_run_started_is_one_job_before_anything_else_says() {
    // Issue #42, item 1: the `run` command's process tree is the most trusted job information.
    // Four ranks of the run (pids 1000-1003, no owner or parent read: the run turns on the
    // processes family, not attribution), GPU 2 at 60 % among the others at 97 %, all holding
    // one memory; and on GPU 4 another job's process (pid 2000) at 60 % holding half of it.
    let gpus = || {
        (0..5)
            .map(|i| {
                let mut d = one_sample(i, if i == 2 || i == 4 { 0.6 } else { 0.97 }, true);
                d.processes = vec![crate::model::ProcessSample::new(if i == 4 { 2000 } else { 1000 + i })];
                if i == 4 {
                    d.memory.used = d.memory.used.map(|u| u / 2);
                }
                d
            })
            .collect::<Vec<_>>()
    };
    // Nothing known: the GPUs holding one memory are assumed to be one job, GPU 2 their
    // straggler or a job of its own — both named; GPU 4, holding other memory, is compared with
    // nothing.
    let d = Rig::new(10).run(12, gpus);
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::StragglerOrOwnJob)]);
    // The run's pids: GPUs 0-3 are its job, GPU 2 their straggler, named; GPU 4 (not the run's)
    // is compared with nothing of it.
    let job = RunJob::new();
    job.set_pids([1000, 1001, 1002, 1003]);
    let diagnoser = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(10))).unwrap();
    let mut rig = Rig::with_diagnoser(diagnoser.with_run_job(job.clone()));
    let d = rig.run(12, gpus);
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::Straggler)]);
    assert!(d.active[0].evidence.contains("its job: the command gpumon-agent run started"), "{}", d.active[0].evidence);
    // Pids found later count from then on: the same run with the set emptied reads as before.
    job.set_pids([]);
    let d = rig.run(24, gpus);
    assert_eq!(kinds_on(&d), [(Some(2), FindingKind::StragglerOrOwnJob)]);
}

#[test]
fn one_process_on_two_gpus_is_one_job() {
    // A model placed unevenly on two GPUs (`device_map="auto"`): GPU 0 computes, GPU 1 holds
    // its share of the weights and never runs above the idle peak. Attribution read no owner
    // and no parent: only the PIDs.
    let run = |pids: [u32; 2]| {
        Rig::new(10).run(12, || {
            let mut idle = busy(1);
            idle.utilization.gpu = Some(0.03);
            idle.windows.gpu_utilization = Some(WindowStats { min: 0.0, max: 0.05, mean: 0.03, count: 6 });
            idle.gpm.sm_activity = Some(0.03);
            let mut gpus = vec![busy(0), idle];
            for (d, pid) in gpus.iter_mut().zip(pids) {
                d.processes = vec![crate::model::ProcessSample::new(pid)];
            }
            gpus
        })
    };
    // One process on both: one job, and its idle half is the imbalance.
    assert_eq!(kinds_on(&run([700, 700])), [(Some(1), FindingKind::Imbalance)]);
    // A process of its own on each: nothing says the busy GPU is its job's, and a GPU held and
    // left idle is the likelier reading — no imbalance named.
    assert!(!kinds_on(&run([700, 701])).contains(&(Some(1), FindingKind::Imbalance)));
}

//! The diagnosis contract of every built-in scenario (issue #10's table): which findings each
//! scenario must raise, on which GPUs, within how many ticks — and nothing else. Shared by the
//! mock test (gpumon-mock/tests/diagnosis.rs) and the fake-libnvidia-ml test
//! (fake-nvml/tests/diagnosis.rs), so both backends are held to one table.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon_core::{Family, FindingKind, MetricSet, Processor, ProcessorContext, Snapshot, Transition};

/// One row of the table.
pub struct Expectation {
    pub scenario: &'static str,
    /// Extra families the scenario needs (PCIe throughput is opt-in).
    pub metrics: MetricSet,
    /// The findings (GPU index, kind) that must be active at the end, and are the only ones
    /// ever raised.
    pub findings: Findings,
    /// Ticks to run.
    pub ticks: u64,
    /// Every expected finding must be raised by this tick (1-based): the scenario's onset plus
    /// one diagnosis window.
    pub within: u64,
}

pub enum Findings {
    /// `kind` on every GPU.
    Every(FindingKind),
    /// `kind` on these GPUs only.
    On(FindingKind, &'static [u32]),
    /// `kind` on the GPU the scenario's fault names.
    OnFaulted(FindingKind),
    /// Nothing at all.
    Nothing,
}

/// The diagnosis window the table is stated for: 30 ticks (the default 30 s at 1 s), so a
/// condition that holds from the first tick is raised at tick 24 (80 % of 30).
pub const WINDOW_TICKS: u64 = 30;

pub fn table() -> Vec<Expectation> {
    use FindingKind as K;
    // What a default agent samples: the default families and the opt-in ones diagnosis reads.
    let default = MetricSet::default().with_stage_inputs();
    let row = |scenario, findings, ticks, within| Expectation { scenario, metrics: default, findings, ticks, within };
    vec![
        // Idling together (starvation) or in turn (bubbles) needs clear idle and busy readings
        // of every rank first: within two windows, as issue #42 asks of every finding.
        row("dataloader-starved", Findings::Every(K::DataloaderStarvation), 120, 2 * WINDOW_TICKS),
        row("memory-bound", Findings::Every(K::MemoryBound), 120, WINDOW_TICKS),
        // A default agent reads no processes: nothing says each idle twin shares its busy
        // twin's job, and a job of its own idling reads the same — both are named. With
        // processes sampled, one process on both GPUs of a pair says they are one job.
        row("imbalance", Findings::On(K::ImbalanceOrOwnJob, &[1, 3, 5, 7]), 120, WINDOW_TICKS),
        Expectation {
            scenario: "imbalance",
            metrics: default.with(Family::Processes),
            findings: Findings::On(K::Imbalance, &[1, 3, 5, 7]),
            ticks: 120,
            within: WINDOW_TICKS,
        },
        // The temperature climbs past the slowdown point within ~60 ticks.
        row("thermal-throttling", Findings::Every(K::ThermalThrottling), 200, 60 + WINDOW_TICKS),
        row("power-capped", Findings::Every(K::PowerThrottling), 120, WINDOW_TICKS),
        row("near-oom", Findings::Every(K::NearOom), 120, WINDOW_TICKS),
        // A GPU that never ran gets the warm-up grace (60 s) first.
        row("idle-allocated", Findings::Every(K::IdleAllocated), 150, 60 + WINDOW_TICKS),
        Expectation {
            scenario: "pcie-bound",
            metrics: default.with(Family::PcieThroughput),
            findings: Findings::Every(K::PcieBound),
            ticks: 120,
            within: WINDOW_TICKS,
        },
        row("ecc-burst", Findings::OnFaulted(K::HardwareErrors), 120, 120),
        row("lost-gpu", Findings::OnFaulted(K::HardwareErrors), 120, 120),
        row("training", Findings::Nothing, 600, 0),
        row("idle", Findings::Nothing, 600, 0),
    ]
}

/// The GPU a scenario's hardware trouble strikes: a fault's device, or the GPU a `lost` phase
/// names.
pub fn faulted(scenario: &gpumon_mock::Scenario) -> Option<u32> {
    scenario.faults.iter().find_map(|f| f.device()).or_else(|| {
        scenario.phases.iter().filter(|p| p.lost).find_map(|p| p.gpus.as_ref().and_then(|g| g.first().copied()))
    })
}

pub fn diagnoser() -> Diagnoser {
    let mut d = Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(WINDOW_TICKS))).unwrap();
    d.attach(&ProcessorContext::new(Duration::from_secs(1)));
    d
}

/// What a run of the diagnoser saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every (gpu, kind) ever raised, with the tick (1-based) of its first raise.
    pub raised: Vec<(u32, FindingKind, u64)>,
    /// (gpu, kind) active after the last tick.
    pub active_at_end: BTreeSet<(u32, FindingKind)>,
    pub gpus: u32,
}

impl Outcome {
    pub fn observe(&mut self, tick: u64, snapshot: &Snapshot) {
        self.gpus = self.gpus.max(snapshot.devices.len() as u32);
        let diagnosis = snapshot.output::<gpumon_core::Diagnosis>().expect("diagnosis attached");
        for e in &diagnosis.events {
            if e.transition == Transition::Raised {
                let gpu = e.finding.gpu.expect("device finding");
                if !self.raised.iter().any(|(g, k, _)| *g == gpu && *k == e.finding.kind) {
                    self.raised.push((gpu, e.finding.kind, tick));
                }
            }
        }
        self.active_at_end = diagnosis.active.iter().map(|f| (f.gpu.unwrap(), f.kind)).collect();
    }

    /// Checks the outcome against `e`; `faulted` is the GPU the scenario's fault names.
    pub fn check(&self, e: &Expectation, faulted: Option<u32>, what: &str) {
        let expected: BTreeSet<(u32, FindingKind)> = match &e.findings {
            Findings::Every(k) => (0..self.gpus).map(|g| (g, *k)).collect(),
            Findings::On(k, gpus) => gpus.iter().map(|g| (*g, *k)).collect(),
            Findings::OnFaulted(k) => {
                [(faulted.unwrap_or_else(|| panic!("{what}: the scenario names no faulted GPU")), *k)].into()
            }
            Findings::Nothing => BTreeSet::new(),
        };
        let ever: BTreeSet<(u32, FindingKind)> = self.raised.iter().map(|(g, k, _)| (*g, *k)).collect();
        assert_eq!(ever, expected, "{what}: findings ever raised (gpu, kind)");
        if !matches!(e.findings, Findings::OnFaulted(_)) {
            // A hardware error may have cleared again by the end; the others persist.
            assert_eq!(self.active_at_end, expected, "{what}: findings active at the end");
        }
        for (gpu, kind, tick) in &self.raised {
            assert!(*tick <= e.within, "{what}: {kind} on GPU {gpu} raised at tick {tick}, later than {}", e.within);
        }
    }
}

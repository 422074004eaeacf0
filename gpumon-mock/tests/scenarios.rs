//! The built-in scenarios' contract with gpumon's diagnosis rules (`docs/diagnosis.md`): each
//! scenario's raw data sits clearly on the expected side of every rule's threshold, on every
//! GPU, every tick and every seed — so the rules raise exactly the scenario's finding and
//! nothing else. These tests check the data, not the rules.

use gpumon_core::{ClockEventReasons, DeviceFilter, DeviceSample, MetricSet};
use gpumon_mock::{FleetProfile, MockFleet, Scenario, DEFAULT_SEED};

const SEEDS: [u64; 5] = [1, 7, 42, 0xDEAD_BEEF, DEFAULT_SEED];
const TICKS: u64 = 300;
/// The rules' default window at a 1 s interval.
const WINDOW: usize = 30;

/// `[tick][gpu]` samples of the physical GPUs not in MIG mode, everything asked for.
struct Run {
    what: String,
    ticks: Vec<Vec<DeviceSample>>,
}

impl Run {
    fn new(scenario: &str, profile: &str, seed: u64) -> Run {
        let fleet =
            MockFleet::new(&FleetProfile::load(profile).unwrap(), &Scenario::builtin(scenario).unwrap(), seed).unwrap();
        let ticks = (0..TICKS)
            .map(|t| {
                fleet
                    .sample(t, MetricSet::everything(), &DeviceFilter::all())
                    .into_iter()
                    .filter(|s| s.info.mig.is_none() && (!s.is_up() || s.utilization.gpu.is_some()))
                    .collect()
            })
            .collect();
        Run { what: format!("{scenario} on {profile}, seed {seed:#x}"), ticks }
    }

    fn gpus(&self) -> usize {
        self.ticks[0].len()
    }

    /// One GPU's samples over time.
    fn series(&self, gpu: usize) -> impl Iterator<Item = (usize, &DeviceSample)> {
        self.ticks.iter().enumerate().map(move |(t, devs)| (t, &devs[gpu]))
    }

    /// Checks `f` on every sample of every GPU.
    fn each(&self, f: impl Fn(&DeviceSample, &str)) {
        for (t, devs) in self.ticks.iter().enumerate() {
            for s in devs {
                f(s, &format!("{}: tick {t} GPU {}", self.what, s.info.index));
            }
        }
    }
}

/// Every scenario over every seed on 8 H100s, and once on the mixed fleet (A100 gen 4, V100
/// gen 3, RTX 4090 without GPM).
fn runs(scenario: &str) -> impl Iterator<Item = Run> + '_ {
    SEEDS.iter().map(move |&seed| Run::new(scenario, "h100x8", seed)).chain([Run::new(scenario, "mixed", 3)])
}

/// The rules' "level": the window mean when there is a window.
fn level(s: &DeviceSample) -> f64 {
    s.windows.gpu_utilization.map_or_else(|| s.utilization.gpu.unwrap(), |w| w.mean)
}

fn allocated(s: &DeviceSample) -> bool {
    s.memory.used_ratio().unwrap() >= 0.10 || !s.processes.is_empty()
}

/// Bytes/s of one direction of the link the GPU is on now (per-lane GB/s after encoding).
fn link_bytes_per_second(s: &DeviceSample) -> f64 {
    let lane = match s.pcie.link_generation.unwrap() {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        g => panic!("gen {g}"),
    };
    lane * f64::from(s.pcie.link_width.unwrap()) * 1e9
}

fn pcie_share(s: &DeviceSample) -> f64 {
    s.pcie.tx_bytes_per_second.unwrap().max(s.pcie.rx_bytes_per_second.unwrap()) / link_bytes_per_second(s)
}

fn reasons(s: &DeviceSample) -> ClockEventReasons {
    s.clock_event_reasons.unwrap()
}

const THERMAL: u64 = ClockEventReasons::SW_THERMAL_SLOWDOWN | ClockEventReasons::HW_THERMAL_SLOWDOWN;
const POWER: u64 = ClockEventReasons::SW_POWER_CAP | ClockEventReasons::HW_POWER_BRAKE_SLOWDOWN;

fn any(r: ClockEventReasons, bits: u64) -> bool {
    r.0 & bits != 0
}

fn sm_clock_share(s: &DeviceSample) -> f64 {
    s.clocks.sm.unwrap() / s.info.max_clocks.sm.unwrap()
}

fn power_share(s: &DeviceSample) -> f64 {
    s.power.usage_watts.unwrap() / s.power.limit_watts.unwrap()
}

/// The memory controller, instantaneous and over the interval.
fn memory_controller_max(s: &DeviceSample) -> f64 {
    s.utilization.memory.unwrap().max(s.windows.memory_utilization.unwrap().max)
}

/// Healthy training on one sample: nothing any rule could hold on.
fn assert_training(s: &DeviceSample, ctx: &str) {
    let gpu = s.utilization.gpu.unwrap();
    assert!((0.90..=0.98).contains(&gpu), "{ctx}: util {gpu}");
    let w = s.windows.gpu_utilization.unwrap();
    assert!(w.min > 0.6, "{ctx}: window {w:?}");
    if let Some(sm) = s.gpm.sm_activity {
        assert!(sm >= 0.65, "{ctx}: SM activity {sm}");
    }
    if let Some(dram) = s.gpm.dram_bandwidth {
        assert!(dram <= 0.6, "{ctx}: DRAM {dram}");
    }
    assert!(memory_controller_max(s) <= 0.6, "{ctx}: memory controller {}", memory_controller_max(s));
    let used = s.memory.used_ratio().unwrap();
    assert!((0.80..0.92).contains(&used), "{ctx}: memory {used}");
    assert!(!any(reasons(s), THERMAL | ClockEventReasons::HW_SLOWDOWN), "{ctx}: {:?}", reasons(s));
    assert!(pcie_share(s) < 0.4, "{ctx}: PCIe {}", pcie_share(s));
    assert!(!s.processes.is_empty(), "{ctx}");
}

/// Share of ticks in each sliding window of [`WINDOW`] ticks for which `f` holds: (min, max).
fn window_shares(run: &Run, gpu: usize, f: impl Fn(&DeviceSample) -> bool) -> (f64, f64) {
    let holds: Vec<bool> = run.series(gpu).map(|(_, s)| f(s)).collect();
    holds
        .windows(WINDOW)
        .map(|w| w.iter().filter(|&&h| h).count() as f64 / WINDOW as f64)
        .fold((1.0f64, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

#[test]
fn training_is_healthy_and_never_capped() {
    for run in runs("training") {
        run.each(|s, ctx| {
            assert_training(s, ctx);
            assert!(!any(reasons(s), POWER), "{ctx}: {:?}", reasons(s));
            assert!(power_share(s) < 0.95 && sm_clock_share(s) >= 0.94, "{ctx}");
        });
    }
}

#[test]
fn idle_holds_nothing() {
    for run in runs("idle") {
        run.each(|s, ctx| {
            assert!(s.memory.used_ratio().unwrap() < 0.05, "{ctx}");
            assert!(s.processes.is_empty(), "{ctx}");
            assert!(level(s) <= 0.02 && s.utilization.gpu.unwrap() <= 0.02, "{ctx}: {}", level(s));
            assert!(!any(reasons(s), THERMAL | POWER), "{ctx}");
            assert!(pcie_share(s) < 0.05, "{ctx}");
        });
    }
}

/// A 1 s tick holds six driver samples (one per 1/6 s) of a 1.2 s step — 0.45 s of compute,
/// 0.75 s waiting: nearly every window spans a wait and a batch.
#[test]
fn dataloader_starved_collapses_within_most_intervals() {
    for run in runs("dataloader-starved") {
        run.each(|s, ctx| {
            assert!(allocated(s) && s.memory.used_ratio().unwrap() >= 0.5, "{ctx}");
            let w = s.windows.gpu_utilization.unwrap();
            assert!((5..=7).contains(&w.count), "{ctx}: the driver's samples of one second: {w:?}");
            assert!((0.15..=0.5).contains(&w.mean), "{ctx}: mean {w:?}");
            assert!(memory_controller_max(s) < 0.3, "{ctx}: memory controller {}", memory_controller_max(s));
            assert!(pcie_share(s) < 0.3, "{ctx}: PCIe {}", pcie_share(s));
            if let Some(sm) = s.gpm.sm_activity {
                // GPM counts the whole interval's activity (not the driver's samples), and DRAM
                // stays quiet.
                let g = s.gpm.graphics_activity.unwrap();
                assert!((0.1..=0.5).contains(&g) && sm <= g && sm >= 0.75 * g, "{ctx}: gpm {:?}", s.gpm);
                assert!(s.gpm.dram_bandwidth.unwrap() < 0.3, "{ctx}: {:?}", s.gpm);
            }
            assert!(!any(reasons(s), THERMAL | POWER | ClockEventReasons::HW_SLOWDOWN), "{ctx}");
        });
        for gpu in 0..run.gpus() {
            // Within the interval: a sample at the wait (≤ 5 %) and one in a batch (≥ 80 %).
            let (fewest, _) = window_shares(&run, gpu, |s| {
                let w = s.windows.gpu_utilization.unwrap();
                w.min <= 0.05 && w.max >= 0.8
            });
            assert!(fewest >= 0.8, "{} GPU {gpu}: dip and batch within only {fewest} of a window's ticks", run.what);
            // Without windows a rule sees the instantaneous readings jump (the step is not a
            // whole number of ticks, so the latest sample falls at a new point of it each tick):
            // in every 30-tick window at least 30 % of them near 0 and 15 % high (the rule asks
            // for 10 % of each), and their mean at most 0.5.
            let (low, _) = window_shares(&run, gpu, |s| s.utilization.gpu.unwrap() <= 0.10);
            let (high, _) = window_shares(&run, gpu, |s| s.utilization.gpu.unwrap() >= 0.60);
            assert!(low >= 0.3 && high >= 0.15, "{} GPU {gpu}: low {low} high {high}", run.what);
            let utils: Vec<f64> = run.series(gpu).map(|(_, s)| s.utilization.gpu.unwrap()).collect();
            for w in utils.windows(WINDOW) {
                let mean = w.iter().sum::<f64>() / WINDOW as f64;
                assert!(mean <= 0.5, "{} GPU {gpu}: instantaneous mean {mean}", run.what);
            }
        }
    }
}

#[test]
fn memory_bound_saturates_dram_with_idle_sms() {
    for run in runs("memory-bound") {
        run.each(|s, ctx| {
            assert!(allocated(s), "{ctx}");
            let w = s.windows.gpu_utilization.unwrap();
            assert!((0.25..=0.40).contains(&level(s)) && w.min > 0.2, "{ctx}: steady ~30 %: {w:?}");
            assert!(s.utilization.memory.unwrap() >= 0.75, "{ctx}: memory controller {:?}", s.utilization.memory);
            if let Some(sm) = s.gpm.sm_activity {
                assert!((0.2..=0.4).contains(&sm), "{ctx}: SM activity {sm}");
                let dram = s.gpm.dram_bandwidth.unwrap();
                assert!((0.75..=0.9).contains(&dram), "{ctx}: DRAM {dram}");
            }
            assert!(pcie_share(s) < 0.3, "{ctx}: PCIe {}", pcie_share(s));
            assert!(!any(reasons(s), THERMAL | POWER | ClockEventReasons::HW_SLOWDOWN), "{ctx}");
        });
    }
}

#[test]
fn imbalance_pairs_a_busy_gpu_with_an_idle_twin() {
    for run in runs("imbalance") {
        let twins = run.ticks[0].iter().filter(|s| s.info.index % 2 == 1).count();
        assert!(twins >= 2, "{}: {twins} idle twins", run.what);
        run.each(|s, ctx| {
            let i = s.info.index as usize;
            assert!(allocated(s), "{ctx}: both twins hold the model");
            if i.is_multiple_of(2) {
                assert!(level(s) >= 0.85, "{ctx}: busy twin at {}", level(s));
                assert_training(s, ctx);
            } else {
                assert!((0.03..=0.15).contains(&level(s)), "{ctx}: idle twin at {}", level(s));
                assert!(s.windows.gpu_utilization.unwrap().max < 0.3, "{ctx}");
                assert!(memory_controller_max(s) < 0.2 && pcie_share(s) < 0.1, "{ctx}");
                assert!(!any(reasons(s), THERMAL | POWER), "{ctx}");
            }
        });
    }
}

#[test]
fn thermal_throttling_climbs_then_slows_for_heat_only() {
    for run in runs("thermal-throttling") {
        for gpu in 0..run.gpus() {
            let mut hot_at = None;
            for (t, s) in run.series(gpu) {
                let ctx = format!("{} GPU {gpu} tick {t}", run.what);
                let slowdown = s.info.temperature_slowdown_celsius.unwrap();
                let r = reasons(s);
                assert!(!any(r, POWER), "{ctx}: power-cap reasons in a thermal scenario: {r:?}");
                assert!(s.utilization.gpu.unwrap() >= 0.9, "{ctx}");
                if s.temperature.gpu.unwrap() >= slowdown {
                    hot_at.get_or_insert(t);
                }
                if hot_at.is_some() {
                    assert!(s.temperature.gpu.unwrap() >= slowdown, "{ctx}: stays hot");
                    assert!(any(r, THERMAL), "{ctx}: {r:?}");
                    assert!(sm_clock_share(s) < 0.7, "{ctx}: SM clock {}", sm_clock_share(s));
                    assert!(power_share(s) < 0.8, "{ctx}: power {}", power_share(s));
                } else {
                    assert!(!any(r, THERMAL | ClockEventReasons::HW_SLOWDOWN), "{ctx}: {r:?}");
                }
            }
            let t0 = hot_at.unwrap_or_else(|| panic!("{} GPU {gpu}: never hot", run.what));
            assert!(t0 <= 60, "{} GPU {gpu}: hot only at tick {t0}", run.what);
        }
    }
}

#[test]
fn power_capped_sits_at_the_limit_with_clocks_down() {
    for run in runs("power-capped") {
        for gpu in 0..run.gpus() {
            let (fewest, _) = window_shares(&run, gpu, |s| reasons(s).contains(ClockEventReasons::SW_POWER_CAP));
            assert!(fewest >= 0.9, "{} GPU {gpu}: SW_POWER_CAP on only {fewest} of a window", run.what);
        }
        run.each(|s, ctx| {
            let r = reasons(s);
            assert!(!any(r, THERMAL | ClockEventReasons::HW_SLOWDOWN), "{ctx}: {r:?}");
            assert!(level(s) >= 0.85, "{ctx}: utilisation {}", level(s));
            let slowdown = s.info.temperature_slowdown_celsius.unwrap();
            assert!(s.temperature.gpu.unwrap() < slowdown - 10.0, "{ctx}");
            if r.contains(ClockEventReasons::SW_POWER_CAP) {
                assert!(power_share(s) >= 0.97, "{ctx}: power {}", power_share(s));
                let w = s.windows.power_watts.unwrap();
                assert!(w.mean >= 0.96 * s.power.limit_watts.unwrap(), "{ctx}: power window {w:?}");
                assert!(sm_clock_share(s) < 0.85, "{ctx}: SM clock {}", sm_clock_share(s));
            } else {
                assert!(power_share(s) < 0.97, "{ctx}: at the limit without the reason");
            }
        });
    }
}

#[test]
fn near_oom_fills_memory_and_never_frees_it() {
    for run in runs("near-oom") {
        for gpu in 0..run.gpus() {
            let mut prev = 0;
            for (t, s) in run.series(gpu) {
                let ctx = format!("{} GPU {gpu} tick {t}", run.what);
                let used = s.memory.used.unwrap();
                let ratio = s.memory.used_ratio().unwrap();
                assert!((0.95..=0.99).contains(&ratio), "{ctx}: {ratio}");
                assert!(used >= prev, "{ctx}: memory fell {prev} -> {used}");
                prev = used;
                assert_eq!(s.memory.free, Some(s.memory.total.unwrap() - s.memory.reserved.unwrap() - used), "{ctx}");
                assert!(level(s) >= 0.85 && s.windows.gpu_utilization.unwrap().min > 0.6, "{ctx}");
                assert!(!any(reasons(s), THERMAL), "{ctx}");
            }
            let first = run.ticks[0][gpu].memory.used.unwrap();
            assert!(prev > first, "{} GPU {gpu}: memory rises ({first} -> {prev})", run.what);
        }
    }
}

#[test]
fn near_oom_mig_instances_fill_up_too() {
    let scenario = Scenario::builtin("near-oom").unwrap();
    let fleet = MockFleet::new(&FleetProfile::load("a100x8-mig").unwrap(), &scenario, 5).unwrap();
    let mut prev = vec![0u64; fleet.devices().len()];
    for t in 0..TICKS {
        for (i, s) in fleet.sample(t, MetricSet::default().with_stage_inputs(), &DeviceFilter::all()).iter().enumerate()
        {
            if s.info.mig.is_some() {
                let used = s.memory.used.unwrap();
                assert!(s.memory.used_ratio().unwrap() >= 0.95, "tick {t} device {i}: {:?}", s.memory);
                assert!(used >= prev[i], "tick {t} device {i}: memory fell {} -> {used}", prev[i]);
                prev[i] = used;
            }
        }
    }
}

#[test]
fn idle_allocated_holds_memory_and_runs_nothing() {
    for run in runs("idle-allocated") {
        run.each(|s, ctx| {
            let used = s.memory.used_ratio().unwrap();
            assert!((0.30..=0.60).contains(&used), "{ctx}: memory {used}");
            assert!(!s.processes.is_empty(), "{ctx}: a compute process holds it");
            assert!(level(s) <= 0.02, "{ctx}: level {}", level(s));
            assert!(s.windows.gpu_utilization.unwrap().max <= 0.05, "{ctx}: {:?}", s.windows.gpu_utilization);
            assert!(memory_controller_max(s) <= 0.05 && pcie_share(s) < 0.05, "{ctx}");
            assert!(!any(reasons(s), THERMAL | POWER), "{ctx}");
        });
    }
}

#[test]
fn pcie_bound_saturates_the_link_with_steady_low_utilisation() {
    for run in runs("pcie-bound") {
        run.each(|s, ctx| {
            assert!(allocated(s), "{ctx}");
            assert_eq!(s.pcie.link_generation, s.info.pcie_max_link_generation, "{ctx}: busy links run at full speed");
            assert!(pcie_share(s) >= 0.7, "{ctx}: PCIe {}", pcie_share(s));
            let w = s.windows.gpu_utilization.unwrap();
            assert!((0.2..=0.4).contains(&level(s)) && w.min > 0.15, "{ctx}: steady, no starvation dips: {w:?}");
            assert!(memory_controller_max(s) < 0.3, "{ctx}");
            if let Some(dram) = s.gpm.dram_bandwidth {
                assert!(dram < 0.3, "{ctx}: DRAM {dram}");
            }
            assert!(!any(reasons(s), THERMAL | POWER | ClockEventReasons::HW_SLOWDOWN), "{ctx}");
        });
    }
}

#[test]
fn hardware_faults_hit_one_gpu_while_the_others_train() {
    for run in runs("ecc-burst") {
        for (t, devs) in run.ticks.iter().enumerate() {
            for s in devs {
                let ctx = format!("{}: tick {t} GPU {}", run.what, s.info.index);
                assert_training(s, &ctx);
                let hit = s.info.index == 1 && t >= 10;
                assert_eq!(s.ecc.uncorrected.is_some_and(|u| u > 0), hit, "{ctx}: ECC {:?}", s.ecc);
                assert_eq!(!s.xid_errors.is_empty(), hit, "{ctx}: XIDs {:?}", s.xid_errors);
            }
        }
    }
    for run in runs("lost-gpu") {
        for (t, devs) in run.ticks.iter().enumerate() {
            for s in devs {
                let ctx = format!("{}: tick {t} GPU {}", run.what, s.info.index);
                if s.info.index == 3 && t >= 5 {
                    assert!(!s.is_up(), "{ctx}: lost");
                } else {
                    assert!(s.is_up(), "{ctx}");
                    assert_training(s, &ctx);
                    assert!(s.xid_errors.is_empty() && s.ecc.uncorrected.unwrap_or(0) == 0, "{ctx}");
                }
            }
        }
    }
}

#[test]
fn every_builtin_scenario_is_covered_here() {
    // A new scenario needs its contract test above.
    let covered = [
        "training",
        "idle",
        "dataloader-starved",
        "memory-bound",
        "imbalance",
        "thermal-throttling",
        "power-capped",
        "near-oom",
        "idle-allocated",
        "pcie-bound",
        "lost-gpu",
        "ecc-burst",
    ];
    let mut names = Scenario::builtin_names();
    names.sort_unstable();
    let mut want = covered.to_vec();
    want.sort_unstable();
    assert_eq!(names, want);
}

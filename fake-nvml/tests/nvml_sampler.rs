//! gpumon's NvmlSampler (real nvml-wrapper code path) against the fake: every family round-trips
//! from the profile to the snapshot; faults behave as specified.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use common::Fake;
use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{ClockEventReasons, DeviceFilter, DeviceSample, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_fake_nvml::expected::{device_info, faulted_sample, nvml_view};
use gpumon_fake_nvml::{Config, Fleet};

fn sampler(fake: &Fake) -> NvmlSampler {
    fake.sampler(Duration::from_millis(20))
}

fn everything() -> SampleRequest {
    SampleRequest::new(MetricSet::everything(), DeviceFilter::all())
}

/// What the sampler should report for the fleet at `tick`, in snapshot order — GPM included
/// from the first tick on (the sampler takes a GPM baseline when it is built).
fn expected(config: &Config, tick: u64) -> Vec<DeviceSample> {
    let fleet = Fleet::load(config).expect("fleet");
    (0..fleet.devices.len())
        .map(|i| {
            let info = Arc::new(device_info(&fleet.devices[i]));
            let mut s = nvml_view(&faulted_sample(&fleet, &config.faults, i, tick), info);
            normalize(&mut s);
            s
        })
        .collect()
}

/// XID arrival times and names of processes that exist on this host differ by design.
fn normalize(s: &mut DeviceSample) {
    for x in &mut s.xid_errors {
        x.last_seen = UNIX_EPOCH;
    }
    for p in &mut s.processes {
        if let Ok(comm) = std::fs::read_to_string(format!("/proc/{}/comm", p.pid)) {
            p.name = Some(comm.trim_end().to_owned());
        }
    }
}

fn normalized(snap: &Snapshot) -> Vec<DeviceSample> {
    snap.devices
        .iter()
        .cloned()
        .map(|mut s| {
            normalize(&mut s);
            s
        })
        .collect()
}

fn assert_same(got: &[DeviceSample], want: &[DeviceSample], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: device count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.info, w.info, "{what}: info of {}", w.info.uuid);
        assert_eq!(g, w, "{what}: sample of {}", w.info.uuid);
    }
}

#[test]
fn every_family_round_trips_h100x8() {
    let spec = "profile=h100x8;clock=manual";
    let fake = Fake::new(spec);
    let config = Config::parse(spec).unwrap();
    let s = sampler(&fake);
    for tick in 0..4 {
        fake.set_tick(tick);
        let snap = s.sample(&everything()).unwrap();
        // XIDs arrive on the watcher thread: give it a moment when the model has some.
        let want = expected(&config, tick);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut got = normalized(&snap);
        while got.iter().zip(&want).any(|(g, w)| g.xid_errors != w.xid_errors) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            // Same tick again: windows/processes have nothing new, so only compare XIDs here.
            let again = normalized(&s.sample(&everything()).unwrap());
            for (g, a) in got.iter_mut().zip(again) {
                g.xid_errors = a.xid_errors;
            }
        }
        assert_same(&got, &want, &format!("tick {tick}"));
    }
    let sys = s.system();
    assert_eq!(sys.backend, "nvml");
    let fleet = Fleet::load(&config).unwrap();
    assert_eq!(sys.driver_version, fleet.system.driver_version);
    assert_eq!(sys.cuda_driver_version, fleet.system.cuda_driver_version);
    assert_eq!(sys.nvml_version, fleet.system.nvml_version);
}

/// One source of truth: NVML's view through the fake equals the mock's own samples — the mock
/// already quantises to NVML's units — GPM included on the first tick (baseline taken at build).
#[test]
fn nvml_through_the_fake_equals_the_mock_model() {
    for profile in ["h100x8", "a100x8-mig", "rtx4090x2", "h200x8", "mixed"] {
        assert_fake_equals_model(&format!("profile={profile};clock=manual"), &[0, 1, 7]);
    }
}

/// Every built-in scenario reaches an NVML client unchanged: high-resolution windows (the
/// starved GPU's dips), GPM (memory-bound DRAM), clock-event reasons (power cap, thermal),
/// PCIe throughput and processes — the data gpumon's diagnosis reads.
#[test]
fn every_builtin_scenario_flows_through_the_fake() {
    for name in gpumon_mock::Scenario::builtin_names() {
        // Tick 70: thermal-throttling is hot by then, lost-gpu has lost GPU 3, ecc-burst had its burst.
        let got = assert_fake_equals_model(&format!("scenario={name};clock=manual"), &[0, 1, 2, 70]);
        let up: Vec<&DeviceSample> = got.iter().filter(|s| s.is_up()).collect();
        let every = |f: &dyn Fn(&DeviceSample) -> bool| up.iter().all(|s| f(s));
        let reasons = |s: &DeviceSample| s.clock_event_reasons.unwrap().0;
        let link = |s: &DeviceSample| 3.938e9 * f64::from(s.pcie.link_width.unwrap());
        let signature = match name {
            "dataloader-starved" => every(&|s| {
                let w = s.windows.gpu_utilization.unwrap();
                w.min <= 0.05 && w.max >= 0.8 && w.mean <= 0.5 && s.utilization.memory.unwrap() < 0.3
            }),
            "memory-bound" => every(&|s| s.gpm.sm_activity.unwrap() <= 0.4 && s.gpm.dram_bandwidth.unwrap() >= 0.75),
            "power-capped" => up.iter().filter(|s| reasons(s) & ClockEventReasons::SW_POWER_CAP != 0).count() >= 7,
            "thermal-throttling" => every(&|s| {
                reasons(s) & ClockEventReasons::HW_THERMAL_SLOWDOWN != 0
                    && reasons(s) & ClockEventReasons::SW_POWER_CAP == 0
            }),
            "near-oom" => every(&|s| s.memory.used_ratio().unwrap() >= 0.95),
            "idle-allocated" => every(&|s| !s.processes.is_empty() && s.windows.gpu_utilization.unwrap().max <= 0.05),
            "pcie-bound" => every(&|s| s.pcie.rx_bytes_per_second.unwrap() >= 0.7 * link(s)),
            "lost-gpu" => up.len() == 7,
            _ => true,
        };
        assert!(signature, "{name}: the scenario's signature did not reach the NVML client at tick 70");
    }
}

/// Samples the fake configured by `spec` at each of `ticks` through `NvmlSampler` and asserts the
/// snapshots equal the mock model's samples; returns the last tick's snapshot.
fn assert_fake_equals_model(spec: &str, ticks: &[u64]) -> Vec<DeviceSample> {
    let fake = Fake::new(spec);
    let config = Config::parse(spec).unwrap();
    let fleet = Fleet::load(&config).unwrap();
    let s = sampler(&fake);
    let mut last = Vec::new();
    for &tick in ticks {
        fake.set_tick(tick);
        let got = normalized(&s.sample(&everything()).unwrap());
        last = got.clone();
        let want: Vec<DeviceSample> = (0..fleet.devices.len())
            .map(|i| {
                let mut m = fleet.sample(i, tick);
                normalize(&mut m);
                m
            })
            .collect();
        let got: Vec<DeviceSample> = got
            .into_iter()
            .zip(&want)
            .map(|(mut g, w)| {
                // XIDs are counted by the watcher thread; compared in the round-trip test.
                g.xid_errors.clear();
                // Window statistics pass through floating-point driver samples: equal to
                // 1e-9, not bit for bit.
                assert_windows_close(&g.windows, &w.windows, &format!("{spec} tick {tick} {}", w.info.uuid));
                g.windows = w.windows;
                // GPM percent → ratio: also equal to 1e-9.
                let (a, b) = (&g.gpm, &w.gpm);
                for (x, y) in [
                    (a.graphics_activity, b.graphics_activity),
                    (a.sm_activity, b.sm_activity),
                    (a.sm_occupancy, b.sm_occupancy),
                    (a.tensor_activity, b.tensor_activity),
                    (a.dram_bandwidth, b.dram_bandwidth),
                ] {
                    assert!(
                        x.is_some() == y.is_some() && (x.unwrap_or(0.0) - y.unwrap_or(0.0)).abs() < 1e-9,
                        "{spec} tick {tick}: gpm {a:?} vs {b:?}"
                    );
                }
                g.gpm = w.gpm;
                g
            })
            .collect();
        let want: Vec<DeviceSample> = want
            .into_iter()
            .map(|mut w| {
                w.xid_errors.clear();
                w
            })
            .collect();
        assert_same(&got, &want, &format!("{spec} tick {tick}"));
    }
    last
}

fn assert_windows_close(a: &gpumon_core::Windows, b: &gpumon_core::Windows, what: &str) {
    let pairs = [
        (a.gpu_utilization, b.gpu_utilization),
        (a.memory_utilization, b.memory_utilization),
        (a.power_watts, b.power_watts),
        (a.sm_clock, b.sm_clock),
        (a.memory_clock, b.memory_clock),
    ];
    for (x, y) in pairs {
        match (x, y) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                let close = |p: f64, q: f64| (p - q).abs() <= 1e-9 * p.abs().max(q.abs()).max(1.0);
                assert!(
                    close(x.min, y.min) && close(x.max, y.max) && close(x.mean, y.mean) && x.count == y.count,
                    "{what}: window {x:?} != {y:?}"
                );
            }
            _ => panic!("{what}: window {x:?} vs {y:?}"),
        }
    }
}

#[test]
fn step_and_wall_clocks_advance() {
    // step: each nvmlDeviceGetCount_v2 (one per NvmlSampler tick, and one when it is built to
    // take the GPM baselines) starts a new model tick.
    let spec = "clock=step:nvmlDeviceGetCount_v2";
    let fake = Fake::new(spec);
    let config = Config::parse(spec).unwrap();
    let fleet = Fleet::load(&config).unwrap();
    let s = NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().unwrap();
    assert_eq!(fake.tick(), 0, "built at tick 0");
    for tick in 1..4 {
        let snap = s.sample(&everything()).unwrap();
        assert_eq!(fake.tick(), tick);
        assert_eq!(snap.devices[0].power.usage_watts, fleet.sample(0, tick).power.usage_watts, "tick {tick}");
    }
    // wall: one tick per 40 ms.
    let fake = Fake::new("clock=wall;tick_ms=40");
    let _s = NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().unwrap();
    std::thread::sleep(Duration::from_millis(130));
    assert!((3..=6).contains(&fake.tick()), "tick {}", fake.tick());
}

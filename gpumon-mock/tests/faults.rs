//! Every fault the mock can inject, checked through `MockSampler`.

use std::time::{Duration, Instant, SystemTime};

use gpumon_core::{
    DeviceFilter, FailureReason, Family, MetricFailure, MetricSet, SampleError, SampleRequest, Sampler, Snapshot,
};
use gpumon_mock::{Fault, FleetProfile, Gate, MockSampler, Scenario};

fn everything() -> SampleRequest {
    SampleRequest::new(MetricSet::everything(), DeviceFilter::all())
}

fn sampler(profile: &str, faults: Vec<Fault>) -> MockSampler {
    faults
        .into_iter()
        .fold(MockSampler::builder().profile(FleetProfile::load(profile).unwrap()), |b, f| b.fault(f))
        .epoch(SystemTime::UNIX_EPOCH)
        .build()
        .unwrap()
}

#[test]
fn lost_gpu_is_sticky_and_the_others_keep_reporting() {
    let s = MockSampler::builder().scenario(Scenario::load("lost-gpu").unwrap()).build().unwrap();
    for tick in 0..20 {
        let snap = s.sample(&everything()).unwrap();
        assert_eq!(snap.devices.len(), 8);
        let gpu3 = &snap.devices[3];
        if tick < 5 {
            assert!(gpu3.is_up(), "tick {tick}");
        } else {
            assert!(!gpu3.is_up(), "tick {tick}: lost from 5 on");
            assert_eq!(gpu3.points().len(), 1, "a lost device carries no values");
            assert_eq!(gpu3.info.index, 3);
        }
        for (i, d) in snap.devices.iter().enumerate().filter(|(i, _)| *i != 3) {
            assert!(d.is_up() && d.utilization.gpu.is_some(), "tick {tick} gpu {i}");
        }
    }
}

#[test]
fn a_lost_gpu_takes_its_mig_instances_with_it() {
    let s = sampler("a100x8-mig", vec![Fault::DeviceLost { device: 1, at_tick: 0 }]);
    let snap = s.sample(&everything()).unwrap();
    let (lost, up): (Vec<_>, Vec<_>) = snap.devices.iter().partition(|d| !d.is_up());
    assert_eq!(lost.len(), 5);
    assert!(lost.iter().all(|d| d.info.index == 1));
    assert_eq!(up.len(), 35);
}

#[test]
fn not_supported_leaves_values_absent_without_errors() {
    let s = sampler(
        "h100x8",
        vec![
            Fault::NotSupported { device: Some(0), family: Family::Power },
            Fault::NotSupported { device: None, family: Family::Temperature },
        ],
    );
    let snap = s.sample(&everything()).unwrap();
    let (g0, g1) = (&snap.devices[0], &snap.devices[1]);
    assert!(g0.power.usage_watts.is_none() && g0.power.limit_watts.is_none());
    assert!(g0.power.energy_joules.is_some(), "only the named family goes");
    assert!(g1.power.usage_watts.is_some());
    assert!(snap.devices.iter().all(|d| d.temperature.gpu.is_none() && d.temperature.memory.is_none()));
    assert!(snap.devices.iter().all(|d| d.errors.is_empty()));
}

#[test]
fn no_permission_records_a_failure() {
    let s = sampler("h100x8", vec![Fault::NoPermission { device: Some(2), family: Family::Processes }]);
    let snap = s.sample(&everything()).unwrap();
    let g2 = &snap.devices[2];
    assert!(g2.processes.is_empty());
    assert_eq!(g2.errors, [MetricFailure::new(Family::Processes, FailureReason::NoPermission)]);
    assert!(!snap.devices[1].processes.is_empty() && snap.devices[1].errors.is_empty());
    // Not asked for, so not failed.
    let snap = s.sample(&SampleRequest::default()).unwrap();
    assert!(snap.devices[2].errors.is_empty());
}

#[test]
fn unavailable_window() {
    let s = sampler("a100x4", vec![Fault::Unavailable { from_tick: 2, until_tick: Some(4) }]);
    let results: Vec<Result<Snapshot, SampleError>> = (0..6).map(|_| s.sample(&everything())).collect();
    let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, true, false, false, true, true]);
    assert!(matches!(results[2], Err(SampleError::Unavailable { .. })));
    assert_eq!(s.tick(), 6, "failed samples still advance the tick");

    let forever = sampler("a100x4", vec![Fault::Unavailable { from_tick: 0, until_tick: None }]);
    assert!((0..3).all(|_| forever.sample(&everything()).is_err()));
}

#[test]
fn hang_blocks_for_its_duration() {
    let s = sampler("a100x4", vec![Fault::Hang { at_tick: 1, duration: Duration::from_millis(150) }]);
    let timed = || {
        let t = Instant::now();
        s.sample(&everything()).unwrap();
        t.elapsed()
    };
    assert!(timed() < Duration::from_millis(100));
    assert!(timed() >= Duration::from_millis(150));
    assert!(timed() < Duration::from_millis(100));
}

#[test]
fn hang_until_released_waits_for_the_gate() {
    let gate = Gate::new();
    let s = std::sync::Arc::new(sampler("a100x4", vec![Fault::HangUntilReleased { at_tick: 0, gate: gate.clone() }]));
    let worker = std::thread::spawn({
        let s = s.clone();
        move || s.sample(&everything())
    });
    // Proves something does *not* happen: an unhung sample returns in microseconds, so 100 ms
    // is a generous margin.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!worker.is_finished(), "still hung before release");
    gate.release();
    let snap = worker.join().unwrap().unwrap();
    assert_eq!(snap.devices.len(), 4);
    // Only that tick hangs.
    assert!(s.sample(&everything()).is_ok());
}

#[test]
fn ecc_burst_raises_counters_and_xids_from_its_tick() {
    let s = sampler(
        "h100x8",
        vec![
            Fault::EccBurst { device: 1, at_tick: 3, xid: 48, count: 4 },
            Fault::EccBurst { device: 1, at_tick: 5, xid: 48, count: 2 },
            Fault::EccBurst { device: 1, at_tick: 5, xid: 94, count: 1 },
        ],
    );
    let snaps: Vec<Snapshot> = (0..8).map(|_| s.sample(&everything()).unwrap()).collect();
    for (tick, snap) in snaps.iter().enumerate() {
        let g1 = &snap.devices[1];
        let expected = match tick {
            0..=2 => 0,
            3 | 4 => 4,
            _ => 7,
        };
        assert_eq!(g1.ecc.uncorrected, Some(expected), "tick {tick}");
        assert_eq!(g1.ecc.remapped_rows_uncorrectable, Some(expected));
        assert_eq!(g1.ecc.remapped_rows_pending, Some(expected > 0));
        assert_eq!(snap.devices[0].ecc.uncorrected, Some(0), "other GPUs untouched");
        assert!(snap.devices[0].xid_errors.is_empty());
        let xids: Vec<(u64, u64)> = g1.xid_errors.iter().map(|x| (x.code, x.count)).collect();
        match tick {
            0..=2 => assert!(xids.is_empty()),
            3 | 4 => assert_eq!(xids, [(48, 4)]),
            _ => assert_eq!(xids, [(48, 6), (94, 1)]),
        }
    }
    let last = &snaps[7].devices[1].xid_errors[0];
    assert_eq!(last.last_seen, SystemTime::UNIX_EPOCH + Duration::from_secs(5), "epoch + at_tick * period");
}

#[test]
fn faults_on_missing_gpus_are_refused() {
    let e = MockSampler::builder()
        .profile(FleetProfile::load("rtx4090x2").unwrap())
        .fault(Fault::EccBurst { device: 2, at_tick: 0, xid: 48, count: 1 })
        .build()
        .unwrap_err();
    assert_eq!(e.key(), Some("faults[0].device"), "{e}");
}

#[test]
fn nvlink_faults_take_a_link_down_and_raise_its_error_counters() {
    let toml = r#"
name = "nvlink-trouble"
workload = "training"
[[faults]]
kind = "nvlink_down"
device = 2
link = 5
at_tick = 2
[[faults]]
kind = "nvlink_errors"
device = 3
link = 0
at_tick = 1
per_tick = 4
"#;
    let scenario = Scenario::from_toml_str(toml, "test").unwrap();
    assert_eq!(scenario.faults[0], Fault::NvlinkDown { device: 2, link: 5, at_tick: 2 });
    let s = MockSampler::builder()
        .profile(FleetProfile::load("h100x8").unwrap())
        .scenario(scenario)
        .epoch(SystemTime::UNIX_EPOCH)
        .build()
        .unwrap();
    let snaps: Vec<Snapshot> = (0..4).map(|_| s.sample(&everything()).unwrap()).collect();
    let link = |t: usize, gpu: usize, l: usize| snaps[t].devices[gpu].nvlink.as_ref().unwrap().links[l].clone();
    for (t, snap) in snaps.iter().enumerate() {
        assert_eq!(link(t, 2, 5).is_up(), t < 2, "tick {t}");
        assert_eq!(snap.devices[2].nvlink.as_ref().unwrap().links_up(), if t < 2 { 18 } else { 17 });
        assert_eq!(link(t, 3, 0).crc_errors, Some(4 * t as u64), "tick {t}");
        assert_eq!(link(t, 0, 0).crc_errors, Some(0), "other GPUs untouched");
    }
    assert_eq!(link(3, 2, 5).tx_bytes, link(2, 2, 5).tx_bytes, "a down link's counters stop");
    assert!(link(3, 2, 4).tx_bytes > link(2, 2, 4).tx_bytes, "its neighbours keep counting");
    assert_eq!(link(2, 2, 5).recovery_errors, Some(1));

    // A key of another kind is refused by name.
    let bad = "name = \"x\"\nworkload = \"idle\"\n[[faults]]\nkind = \"nvlink_down\"\ndevice = 0\nlink = 1\nat_tick = 0\nxid = 3\n";
    let err = Scenario::from_toml_str(bad, "test").unwrap_err().to_string();
    assert!(err.contains("faults[0].xid"), "{err}");
    // A link the GPU does not have is refused, naming the key.
    let pcie = MockSampler::builder()
        .profile(FleetProfile::load("rtx4090x2").unwrap())
        .fault(Fault::NvlinkDown { device: 0, link: 0, at_tick: 0 })
        .build()
        .unwrap_err()
        .to_string();
    assert!(pcie.contains("faults[0].link") && pcie.contains("0 NVLink links"), "{pcie}");
}

//! Each fault of the fake, seen through gpumon's NvmlSampler: absent values, per-metric
//! failures, lost devices that leave the others reporting and come back, XIDs counted from the
//! event set, NVML unavailable at init.

mod common;

use std::time::{Duration, Instant};

use common::Fake;
use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{
    DeviceFilter, DeviceState, FailureReason, Family, MetricFailure, MetricSet, SampleError, SampleRequest, Sampler,
    Snapshot,
};

fn sampler(fake: &Fake) -> NvmlSampler {
    NvmlSampler::builder()
        .library_path(fake.library())
        .xid_poll_interval(Duration::from_millis(10))
        .build()
        .expect("NvmlSampler on the fake")
}

fn all() -> SampleRequest {
    SampleRequest::new(MetricSet::everything(), DeviceFilter::all())
}

fn states(s: &Snapshot) -> Vec<DeviceState> {
    s.devices.iter().map(|d| d.state).collect()
}

#[test]
fn lost_gpu_keeps_the_others_reporting_and_is_rediscovered() {
    let fake = Fake::new("clock=manual;faults=lost:3@2-4");
    let s = sampler(&fake);
    let first = s.sample(&all()).unwrap();
    assert!(first.devices.iter().all(|d| d.is_up()));
    let uuid3 = first.devices[3].info.uuid.clone();
    for tick in [2, 3] {
        fake.set_tick(tick);
        let snap = s.sample(&all()).unwrap();
        assert_eq!(snap.devices.len(), 8, "tick {tick}");
        for (i, d) in snap.devices.iter().enumerate() {
            if i == 3 {
                assert_eq!(d.state, DeviceState::Lost);
                assert_eq!(d.info.uuid, uuid3, "a lost GPU keeps its identity");
                assert_eq!(d.points().len(), 1, "only up=0");
            } else {
                assert!(d.is_up() && d.power.usage_watts.is_some(), "GPU {i} still reports at tick {tick}");
            }
        }
    }
    fake.set_tick(4);
    let back = s.sample(&all()).unwrap();
    assert_eq!(states(&back), vec![DeviceState::Ok; 8]);
    assert!(back.devices[3].utilization.gpu.is_some(), "rediscovered GPU reports values again");
}

#[test]
fn lost_after_n_calls_is_sticky() {
    let fake = Fake::new("clock=manual;faults=lost:5@30calls");
    let s = sampler(&fake);
    let mut lost_at = None;
    for tick in 0..6 {
        fake.set_tick(tick);
        let snap = s.sample(&all()).unwrap();
        let st = states(&snap);
        if let Some(t) = lost_at {
            assert_eq!(st[5], DeviceState::Lost, "sticky after tick {t}");
        } else if st[5] == DeviceState::Lost {
            lost_at = Some(tick);
        }
        assert!(st.iter().enumerate().all(|(i, s)| i == 5 || *s == DeviceState::Ok));
    }
    assert!(lost_at.is_some(), "GPU 5 should be lost after 30 calls");
}

#[test]
fn scenario_lost_gpu_comes_through_the_fake() {
    // The mock's own `lost-gpu` scenario: GPU 3 lost from tick 5.
    let fake = Fake::new("scenario=lost-gpu;clock=manual");
    let s = sampler(&fake);
    fake.set_tick(4);
    assert!(s.sample(&all()).unwrap().devices[3].is_up());
    fake.set_tick(5);
    let snap = s.sample(&all()).unwrap();
    assert_eq!(snap.devices[3].state, DeviceState::Lost);
    assert_eq!(snap.devices.iter().filter(|d| d.is_up()).count(), 7);
}

#[test]
fn not_supported_is_absent_without_error() {
    let fake =
        Fake::new("clock=manual;faults=notsupported:nvmlDeviceGetPowerUsage,notsupported:nvmlDeviceGetFanSpeed_v2@1");
    let s = sampler(&fake);
    let snap = s.sample(&all()).unwrap();
    for d in &snap.devices {
        assert_eq!(d.power.usage_watts, None);
        assert!(d.power.limit_watts.is_some(), "other power values still read");
        assert!(d.errors.is_empty(), "NotSupported is not an error: {:?}", d.errors);
    }
}

#[test]
fn no_permission_is_absent_with_a_metric_failure() {
    let fake = Fake::new("clock=manual;faults=nopermission:nvmlDeviceGetTotalEnergyConsumption@2");
    let s = sampler(&fake);
    let snap = s.sample(&all()).unwrap();
    for (i, d) in snap.devices.iter().enumerate() {
        if i == 2 {
            assert_eq!(d.power.energy_joules, None);
            assert_eq!(d.errors, vec![MetricFailure::new(Family::Energy, FailureReason::NoPermission)]);
        } else {
            assert!(d.power.energy_joules.is_some() && d.errors.is_empty());
        }
    }
}

#[test]
fn ecc_burst_raises_counters_and_counts_the_xid_from_the_event_set() {
    let fake = Fake::new("scenario=idle;clock=manual;faults=ecc-burst:1@2:48");
    let s = sampler(&fake);
    let before = s.sample(&all()).unwrap();
    assert!(before.devices[1].xid_errors.is_empty());
    let unc0 = before.devices[1].ecc.uncorrected.unwrap();
    fake.set_tick(2);
    let deadline = Instant::now() + Duration::from_secs(5);
    let snap = loop {
        let snap = s.sample(&all()).unwrap();
        if !snap.devices[1].xid_errors.is_empty() || Instant::now() > deadline {
            break snap;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let d = &snap.devices[1];
    assert_eq!(d.ecc.uncorrected, Some(unc0 + gpumon_fake_nvml::config::ECC_BURST_UNCORRECTED));
    assert_eq!(d.xid_errors.len(), 1);
    assert_eq!((d.xid_errors[0].code, d.xid_errors[0].count), (48, 1));
    assert!(d.xid_errors[0].last_seen.elapsed().unwrap_or_default() < Duration::from_secs(60));
    assert!(snap.devices.iter().enumerate().all(|(i, d)| i == 1 || d.xid_errors.is_empty()));
    // A counter, not a sticky gauge: a second burst on the same code counts 2.
    fake.inject("ecc-burst:1@3:48");
    fake.set_tick(3);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let snap = s.sample(&all()).unwrap();
        if snap.devices[1].xid_errors.first().map(|x| x.count) == Some(2) {
            break;
        }
        assert!(Instant::now() < deadline, "second XID not counted: {:?}", snap.devices[1].xid_errors);
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn driver_not_loaded_is_unavailable_with_a_clear_reason() {
    let fake = Fake::new("faults=driver-not-loaded");
    let err = NvmlSampler::builder().library_path(fake.library()).build().unwrap_err();
    let SampleError::Unavailable { reason, .. } = err else { panic!("{err}") };
    assert!(reason.contains("driver is not") && reason.contains("DRIVER_NOT_LOADED"), "{reason}");
}

#[test]
fn missing_library_is_unavailable_naming_what_was_looked_for() {
    let err = NvmlSampler::builder().library_path("/nonexistent/libnvidia-ml.so.1").build().unwrap_err();
    let SampleError::Unavailable { reason, .. } = err else { panic!("{err}") };
    assert!(reason.starts_with("could not load /nonexistent/libnvidia-ml.so.1"), "{reason}");
}

#[test]
fn scenario_unavailable_then_back() {
    let dir = std::env::temp_dir().join(format!("gpumon-fake-nvml-scn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("flaky.toml");
    std::fs::write(
        &file,
        "name = \"flaky\"\nworkload = \"idle\"\n[[faults]]\nkind = \"unavailable\"\nfrom_tick = 1\nuntil_tick = 2\n",
    )
    .unwrap();
    let fake = Fake::new(&format!("clock=manual;scenario={}", file.display()));
    let s = sampler(&fake);
    assert!(s.sample(&all()).is_ok());
    fake.set_tick(1);
    assert!(matches!(s.sample(&all()), Err(SampleError::Unavailable { .. })));
    fake.set_tick(2);
    assert_eq!(s.sample(&all()).unwrap().devices.len(), 8);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn metric_set_and_device_filter_are_honoured_before_reading() {
    let fake = Fake::new("clock=manual");
    let s = NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().unwrap();
    let req = SampleRequest::new(MetricSet::nothing().with(Family::Memory), DeviceFilter::parse("1,3").unwrap());
    let snap = s.sample(&req).unwrap();
    assert_eq!(snap.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [1, 3]);
    assert!(snap.devices.iter().all(|d| d.memory.used.is_some() && d.power.usage_watts.is_none()));
    assert_eq!(fake.calls("nvmlDeviceGetPowerUsage"), 0, "unrequested families are not read");
    // Hidden GPUs are not read beyond their UUID; static info was read for the visible two only.
    assert_eq!(fake.calls("nvmlDeviceGetName"), 2);
    assert_eq!(fake.calls("nvmlDeviceGetMemoryInfo_v2"), 2 + 2, "static total + one tick, for two GPUs");
}

#[test]
fn mig_instances_carry_their_parent_and_filter_by_gpu_mig_pair() {
    let fake = Fake::new("profile=a100x8-mig;clock=manual");
    let s = sampler(&fake);
    let snap = s.sample(&all()).unwrap();
    let gpu0 = &snap.devices[0];
    let migs: Vec<_> =
        snap.devices.iter().filter(|d| d.info.mig.as_ref().is_some_and(|m| m.parent_uuid == gpu0.info.uuid)).collect();
    assert_eq!(migs.len(), 4, "3g.20gb + 2g.10gb + 2x 1g.5gb");
    assert_eq!(migs[0].info.mig.as_ref().unwrap().profile.as_deref(), Some("3g.20gb"));
    let only = s.sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::parse("0:1").unwrap())).unwrap();
    assert_eq!(only.devices.len(), 1);
    assert_eq!(only.devices[0].info.mig.as_ref().map(|m| m.mig_index), Some(1));
}

#[test]
fn static_info_is_read_once_and_handles_are_cached() {
    let fake = Fake::new("clock=manual");
    let s = NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().unwrap();
    for t in 0..5 {
        fake.set_tick(t);
        s.sample(&all()).unwrap();
    }
    assert_eq!(fake.calls("nvmlDeviceGetName"), 8);
    assert_eq!(fake.calls("nvmlDeviceGetPowerManagementDefaultLimit"), 8);
    assert_eq!(fake.calls("nvmlDeviceGetHandleByIndex_v2"), 8, "handles cached across ticks");
    assert_eq!(fake.calls("nvmlDeviceGetPowerUsage"), 8 * 5);
}

#[test]
fn lazy_sampler_retries_with_backoff_until_nvml_loads() {
    let fake = Fake::new("clock=manual");
    let dir = fake.dir.join("later");
    let path = dir.join("libnvidia-ml.so.1");
    let lazy = NvmlSampler::builder()
        .library_path(&path)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(80))
        .build_lazy();
    let e = lazy.sample(&all()).unwrap_err();
    assert!(
        matches!(&e, SampleError::Unavailable { reason, .. } if reason.contains("could not load") && reason.contains("attempt 1")),
        "{e}"
    );
    // Within the backoff no new attempt is made.
    let e = lazy.sample(&all()).unwrap_err();
    assert!(e.to_string().contains("next retry in"), "{e}");
    assert_eq!(lazy.failed_attempts(), 1);
    std::thread::sleep(Duration::from_millis(30));
    assert!(lazy.sample(&all()).is_err());
    assert_eq!(lazy.failed_attempts(), 2);
    // The driver "arrives".
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(common::built_library(), &path).unwrap();
    std::thread::sleep(Duration::from_millis(90));
    let snap = lazy.sample(&all()).expect("loads once the library is there");
    assert_eq!(snap.devices.len(), 8);
    assert!(lazy.is_loaded());
}

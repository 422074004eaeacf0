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
    fake.sampler(Duration::from_millis(10))
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
fn a_call_that_answered_not_supported_is_not_asked_again_every_tick() {
    // An H100 has no NVENC: the encoder utilisation is NotSupported, the decoder's is not.
    let fake = Fake::new("profile=h100x8;clock=manual;faults=notsupported:nvmlDeviceGetPowerUsage@3");
    let s = sampler(&fake);
    let ticks = 5;
    for tick in 0..ticks {
        fake.set_tick(tick);
        let snap = s.sample(&all()).unwrap();
        for (i, d) in snap.devices.iter().enumerate() {
            assert_eq!(d.utilization.encoder, None, "GPU {i} tick {tick}");
            assert!(d.utilization.decoder.is_some(), "GPU {i} tick {tick}");
            assert_eq!(d.power.usage_watts.is_none(), i == 3, "GPU {i} tick {tick}");
            assert!(d.errors.is_empty(), "GPU {i}: {:?}", d.errors);
        }
    }
    // Asked once per GPU (the first tick); the supported calls every tick.
    assert_eq!(fake.calls("nvmlDeviceGetEncoderUtilization"), 8);
    assert_eq!(fake.calls("nvmlDeviceGetDecoderUtilization"), 8 * ticks);
    // Per GPU and per call: GPU 3's power usage is asked once, the other GPUs' every tick.
    assert_eq!(fake.calls("nvmlDeviceGetPowerUsage"), 1 + 7 * ticks);
    assert_eq!(fake.calls("nvmlDeviceGetEnforcedPowerLimit"), 8 * ticks);
}

#[test]
fn a_field_the_board_lacks_is_not_asked_again_every_tick() {
    // The field-values call for the memory temperature succeeds on every board; on a board
    // without the sensor (the fake's RTX 4090 model) the field itself answers NotSupported.
    let temperature = || SampleRequest::new([Family::Temperature].into_iter().collect(), DeviceFilter::all());
    let ticks = 5;
    for (profile, gpus, has_sensor) in [("rtx4090x2", 2u64, false), ("h100x8", 8, true)] {
        let fake = Fake::new(&format!("profile={profile};clock=manual"));
        let s = sampler(&fake);
        for tick in 0..ticks {
            fake.set_tick(tick);
            let snap = s.sample(&temperature()).unwrap();
            assert_eq!(snap.devices.len() as u64, gpus);
            for (i, d) in snap.devices.iter().enumerate() {
                assert_eq!(d.temperature.memory.is_some(), has_sensor, "{profile} GPU {i} tick {tick}");
                assert!(d.temperature.gpu.is_some(), "{profile} GPU {i} tick {tick}");
                assert!(d.errors.is_empty(), "{profile} GPU {i}: {:?}", d.errors);
            }
        }
        // Without the sensor: asked on the first tick only; with it, every tick.
        let expected = if has_sensor { gpus * ticks } else { gpus };
        assert_eq!(fake.calls("nvmlDeviceGetFieldValues"), expected, "{profile}");
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

fn xid_failure(d: &gpumon_core::DeviceSample) -> Option<String> {
    d.errors.iter().find(|f| f.family == Family::Xid).map(|f| f.reason.to_string())
}

#[test]
fn gpu_whose_xid_events_cannot_be_registered_reads_as_not_monitored() {
    let fake = Fake::new("scenario=idle;clock=manual;faults=notsupported:nvmlDeviceRegisterEvents@1");
    let s = sampler(&fake);
    let snap = s.sample(&all()).unwrap();
    let reason = xid_failure(&snap.devices[1]).expect("GPU 1 must carry an XID failure, not read as healthy");
    assert!(reason.contains("not monitored") && reason.contains("nvmlDeviceRegisterEvents"), "{reason}");
    assert!(snap.devices[1].xid_errors.is_empty());
    assert!(snap.devices[1].is_up(), "the GPU itself is fine");
    // What every sink exports for it: one `metric_failure` point, labelled `xid`.
    let exported: Vec<_> =
        snap.devices[1].points().into_iter().filter(|p| p.id == gpumon_core::MetricId::MetricFailure).collect();
    assert_eq!(exported.len(), 1, "{exported:?}");
    assert_eq!(exported[0].label, Some(gpumon_core::LabelValue::Str("xid")));
    for (i, d) in snap.devices.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert_eq!(xid_failure(d), None, "GPU {i} is watched");
    }
    // Not asked for, not reported.
    let no_xid = SampleRequest::new(MetricSet::default().with_stage_inputs().without(Family::Xid), DeviceFilter::all());
    assert!(s.sample(&no_xid).unwrap().devices.iter().all(|d| xid_failure(d).is_none()));
}

#[test]
fn no_nvml_event_sets_means_no_gpu_is_xid_monitored() {
    let fake = Fake::new("scenario=idle;clock=manual;faults=unknown:nvmlEventSetCreate");
    let snap = sampler(&fake).sample(&all()).unwrap();
    assert!(!snap.devices.is_empty());
    for d in snap.devices.iter().filter(|d| d.info.mig.is_none()) {
        let reason = xid_failure(d).unwrap_or_else(|| panic!("{}: no XID failure", d.info.uuid));
        assert!(reason.contains("nvmlEventSetCreate"), "{reason}");
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
    let only = s
        .sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::parse("0:1").unwrap()))
        .unwrap();
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

#[test]
fn unknown_error_is_a_metric_failure_not_a_lost_gpu() {
    // Real drivers answer NVML_ERROR_UNKNOWN ("[Unknown Error]") for single fields of a GPU that
    // is otherwise fine: that value fails, the GPU stays up with everything else.
    let fake = Fake::new("clock=manual;faults=unknown:nvmlDeviceGetTotalEnergyConsumption@2");
    let s = sampler(&fake);
    for tick in 0..3 {
        fake.set_tick(tick);
        let snap = s.sample(&all()).unwrap();
        assert_eq!(states(&snap), vec![DeviceState::Ok; 8], "tick {tick}");
        let d = &snap.devices[2];
        assert_eq!(d.power.energy_joules, None);
        assert!(d.power.usage_watts.is_some() && d.utilization.gpu.is_some(), "the rest is still read");
        assert_eq!(
            d.errors,
            vec![MetricFailure::new(Family::Energy, FailureReason::Other(gpumon_core::nvml::UNKNOWN_ERROR.into()))]
        );
    }
    // Not re-discovered: handles and static info were read once.
    assert_eq!(fake.calls("nvmlDeviceGetHandleByIndex_v2"), 8 + 8, "sampler + XID watcher, once each");
    assert_eq!(fake.calls("nvmlDeviceGetName"), 8);
}

fn scenario_file(name: &str, body: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("gpumon-fake-nvml-scn-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, body).unwrap();
    (dir, file)
}

#[test]
fn scenario_unknown_error_is_the_same_metric_failure_on_mock_and_nvml() {
    let (dir, file) = scenario_file(
        "unknown",
        "name = \"unknown\"\nworkload = \"training\"\n\
         [[faults]]\nkind = \"unknown_error\"\nfamily = \"ecc\"\ndevice = 1\n\
         [[faults]]\nkind = \"unknown_error\"\nfamily = \"fan\"\n",
    );
    let scenario = gpumon_mock::Scenario::load(file.to_str().unwrap()).unwrap();
    let mock = gpumon_mock::MockSampler::builder().scenario(scenario).build().unwrap().sample(&all()).unwrap();
    let fake = Fake::new(&format!("clock=manual;scenario={}", file.display()));
    let nvml = sampler(&fake).sample(&all()).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    assert_eq!(mock.devices.len(), nvml.devices.len());
    let other = || FailureReason::Other(gpumon_core::nvml::UNKNOWN_ERROR.into());
    for (m, n) in mock.devices.iter().zip(&nvml.devices) {
        let i = m.info.index;
        assert!(m.is_up() && n.is_up(), "GPU {i}: an unknown error is not a lost GPU");
        // The same failures (the mock lists them in fault order, NVML in read order).
        let sorted = |v: &[MetricFailure]| {
            let mut v = v.to_vec();
            v.sort_by_key(|f| f.family != Family::Ecc);
            v
        };
        let mut want = vec![MetricFailure::new(Family::Fan, other())];
        if i == 1 {
            want.insert(0, MetricFailure::new(Family::Ecc, other()));
        }
        assert_eq!(sorted(&m.errors), want, "GPU {i}: mock");
        assert_eq!(sorted(&n.errors), want, "GPU {i}: nvml");
        assert_eq!((m.fan_speed, n.fan_speed), (None, None));
        assert_eq!(m.ecc.uncorrected.is_some(), i != 1);
        assert_eq!(n.ecc.uncorrected, m.ecc.uncorrected, "GPU {i}");
        assert_eq!(n.power.usage_watts, m.power.usage_watts, "GPU {i}: other families unaffected");
    }
}

#[test]
fn gpu_lost_before_its_first_sample_is_reported_by_index() {
    let fake = Fake::new("clock=manual;faults=lost:3@0-2");
    let s = sampler(&fake);
    let snap = s.sample(&all()).unwrap();
    assert_eq!(snap.devices.len(), 8, "the lost GPU does not vanish");
    let d = &snap.devices[3];
    assert_eq!((d.state, d.info.index, d.info.uuid.as_str()), (DeviceState::Lost, 3, ""));
    assert_eq!(d.points().len(), 1, "only up=0");
    // The filter is honoured by index; a UUID filter cannot match a GPU whose UUID is unknown.
    let by_index = s
        .sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::parse("3").unwrap()))
        .unwrap();
    assert_eq!(states(&by_index), [DeviceState::Lost]);
    let other = snap.devices[1].info.uuid.clone();
    let by_uuid = s
        .sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::parse(&other).unwrap()))
        .unwrap();
    assert_eq!(by_uuid.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [1]);
    // Back: identified and read.
    fake.set_tick(2);
    let back = s.sample(&all()).unwrap();
    assert!(back.devices[3].is_up() && back.devices[3].info.uuid.starts_with("GPU-"));
}

#[test]
fn gpu_whose_uuid_cannot_be_read_is_reported_lost_by_index() {
    for fault in ["unknown:nvmlDeviceGetUUID@4", "notsupported:nvmlDeviceGetUUID@4"] {
        let fake = Fake::new(&format!("clock=manual;faults={fault}"));
        let s = NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().unwrap();
        let snap = s.sample(&all()).unwrap();
        assert_eq!(snap.devices.len(), 8, "{fault}");
        let d = &snap.devices[4];
        assert_eq!((d.state, d.info.index, d.info.uuid.as_str()), (DeviceState::Lost, 4, ""), "{fault}");
        assert!(snap.devices.iter().filter(|d| d.info.index != 4).all(|d| d.is_up()));
        fake.clear_faults();
        assert!(s.sample(&all()).unwrap().devices[4].is_up(), "{fault}: identified once the UUID reads");
    }
}

#[test]
fn gpu_swapped_at_the_same_index_shows_its_new_identity() {
    let spec = "clock=manual;faults=lost:3@1-3,replaced:3@2";
    let fake = Fake::new(spec);
    let config = gpumon_fake_nvml::Config::parse(spec).unwrap();
    let fleet = gpumon_fake_nvml::Fleet::load(&config).unwrap();
    let s = sampler(&fake);
    let before = s.sample(&all()).unwrap().devices[3].info.clone();
    fake.set_tick(1);
    assert_eq!(s.sample(&all()).unwrap().devices[3].info.uuid, before.uuid, "lost: last known identity");
    fake.set_tick(3);
    let after = s.sample(&all()).unwrap();
    let d = &after.devices[3];
    let new = gpumon_fake_nvml::expected::identity(&fleet, &config.faults, 3, 3);
    assert!(d.is_up());
    assert_ne!(new.uuid, before.uuid);
    assert_eq!(d.info.uuid, new.uuid, "the new board's UUID");
    assert_eq!(d.info.serial, new.serial, "static info re-read");
    assert_eq!(after.devices[2].info.uuid, fleet.devices[2].uuid, "others unchanged");
}

#[test]
fn mig_instances_created_and_destroyed_at_run_time_are_picked_up() {
    // GPU 0 of a100x8-mig has MIG instances 0..=3: instance 3 is created at tick 2, instance 1
    // destroyed at tick 4. The layout is re-checked every 3 ticks.
    let spec = "profile=a100x8-mig;clock=manual;faults=mig-absent:0:3@0-2,mig-absent:0:1@4";
    let fake = Fake::new(spec);
    let fleet = gpumon_fake_nvml::Fleet::load(&gpumon_fake_nvml::Config::parse(spec).unwrap()).unwrap();
    let mig_uuid = |m: u32| {
        fleet
            .devices
            .iter()
            .find(|d| d.index == 0 && d.mig.as_ref().is_some_and(|x| x.mig_index == m))
            .map(|d| d.uuid.clone())
            .unwrap()
    };
    let s =
        NvmlSampler::builder().library_path(fake.library()).xid_events(false).mig_recheck_interval(3).build().unwrap();
    let migs_of_0 = |snap: &Snapshot| {
        let parent = snap.devices.iter().find(|d| d.info.index == 0 && d.info.mig.is_none()).unwrap().info.uuid.clone();
        snap.devices
            .iter()
            .filter(|d| d.info.mig.as_ref().is_some_and(|m| m.parent_uuid == parent))
            .map(|d| d.info.uuid.clone())
            .collect::<Vec<_>>()
    };
    let t0 = s.sample(&all()).unwrap(); // tick 1 of the sampler
    assert_eq!(migs_of_0(&t0), [mig_uuid(0), mig_uuid(1), mig_uuid(2)]);
    fake.set_tick(2);
    assert_eq!(migs_of_0(&s.sample(&all()).unwrap()).len(), 3, "not re-checked every tick");
    assert_eq!(migs_of_0(&s.sample(&all()).unwrap()), [mig_uuid(0), mig_uuid(1), mig_uuid(2), mig_uuid(3)]);
    fake.set_tick(4);
    s.sample(&all()).unwrap();
    s.sample(&all()).unwrap();
    let after = s.sample(&all()).unwrap();
    assert_eq!(migs_of_0(&after), [mig_uuid(0), mig_uuid(2), mig_uuid(3)], "destroyed instance dropped");
    assert!(after.devices.iter().all(|d| d.is_up() && d.errors.is_empty()));
}

#[test]
fn lazy_sampler_counts_attempts_and_backs_off_when_nvml_goes_away() {
    let (dir, file) = scenario_file(
        "away",
        "name = \"away\"\nworkload = \"idle\"\n[[faults]]\nkind = \"unavailable\"\nfrom_tick = 1\nuntil_tick = 100\n",
    );
    let fake = Fake::new(&format!("clock=manual;scenario={}", file.display()));
    let lazy = NvmlSampler::builder()
        .library_path(fake.library())
        .xid_events(false)
        .retry_backoff(Duration::from_millis(50), Duration::from_secs(5))
        .build_lazy();
    assert!(lazy.sample(&all()).is_ok());
    fake.set_tick(1);
    let e = lazy.sample(&all()).unwrap_err().to_string();
    assert!(e.contains("NVML stopped answering") && e.contains("attempt 1; next retry in 50"), "{e}");
    assert_eq!(lazy.failed_attempts(), 1);
    assert!(!lazy.is_loaded());
    // Within the backoff: no new attempt.
    let e = lazy.sample(&all()).unwrap_err().to_string();
    assert!(e.contains("attempt 1;"), "{e}");
    // Loads again, but NVML still does not answer: attempt 2, and the backoff doubled.
    std::thread::sleep(Duration::from_millis(60));
    let e = lazy.sample(&all()).unwrap_err().to_string();
    assert!(e.contains("attempt 2; next retry in 100"), "{e}");
    assert_eq!(lazy.failed_attempts(), 2);
    std::thread::sleep(Duration::from_millis(60));
    assert!(lazy.sample(&all()).unwrap_err().to_string().contains("attempt 2;"), "still within 100 ms");
    std::thread::sleep(Duration::from_millis(60));
    let e = lazy.sample(&all()).unwrap_err().to_string();
    assert!(e.contains("attempt 3; next retry in 200"), "{e}");
    // NVML answers again: the count resets with the first good sample.
    fake.set_tick(100);
    std::thread::sleep(Duration::from_millis(210));
    assert!(lazy.sample(&all()).is_ok());
    assert_eq!(lazy.failed_attempts(), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn lost_and_rediscovered_gpu_gets_its_xid_registration_back() {
    let fake = Fake::new("scenario=idle;clock=manual;faults=lost:2@1-3");
    let s = sampler(&fake);
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for("the watcher to register GPU 2", &|| fake.event_registrations(2) == 1);
    fake.set_tick(1);
    assert_eq!(s.sample(&all()).unwrap().devices[2].state, DeviceState::Lost);
    assert_eq!(fake.event_registrations(2), 0, "a lost GPU loses its registration");
    fake.set_tick(3);
    assert!(s.sample(&all()).unwrap().devices[2].is_up());
    wait_for("GPU 2 to be registered again", &|| fake.event_registrations(2) == 1);
    // And an XID after the return is counted.
    fake.inject("ecc-burst:2@4:79");
    fake.set_tick(4);
    wait_for("the XID of GPU 2", &|| {
        let snap = s.sample(&all()).unwrap();
        snap.devices[2].xid_errors.iter().any(|x| (x.code, x.count) == (79, 1))
    });
}

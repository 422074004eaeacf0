//! NVLink through gpumon's NvmlSampler on the fake (model values, topologies, link faults, one
//! batched field-values call per GPU per tick) and runtime power management (a suspended GPU is
//! reported suspended and receives no call that would wake it).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::Fake;
use gpumon_core::nvml::{runtime_pm, NvmlSampler};
use gpumon_core::{
    DeviceFilter, DeviceState, Family, MetricSet, Nvlink, NvlinkRemote, NvlinkState, SampleRequest, Sampler,
};
use gpumon_fake_nvml::expected::{device_info, faulted_sample, nvml_view};
use gpumon_fake_nvml::{Config, Fleet};

fn sampler(fake: &Fake) -> NvmlSampler {
    NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().expect("sampler")
}

/// NVLink with every link's own series (`nvlink_links`, opt-in): what the fake's model carries.
fn nvlink_only() -> SampleRequest {
    SampleRequest::new(MetricSet::nothing().with(Family::Nvlink).with(Family::NvlinkLinks), DeviceFilter::all())
}

/// What the model says GPU position `i` reports at `tick` (after the fake's faults).
fn expected_nvlink(spec: &str, i: usize, tick: u64) -> Option<Nvlink> {
    let config = Config::parse(spec).unwrap();
    let fleet = Fleet::load(&config).unwrap();
    let info = Arc::new(device_info(&fleet.devices[i]));
    nvml_view(&faulted_sample(&fleet, &config.faults, i, tick), info).nvlink
}

#[test]
fn h100_sxm_reports_18_switched_links_equal_to_the_model() {
    let spec = "profile=h100x8;clock=manual";
    let fake = Fake::new(spec);
    let s = sampler(&fake);
    // The totals alone (the default) read the same links but do not export each one.
    let totals = SampleRequest::new(MetricSet::nothing().with(Family::Nvlink), DeviceFilter::all());
    let snap = s.sample(&totals).unwrap();
    let nv = snap.devices[0].nvlink.as_ref().expect("H100 SXM has NVLink");
    assert!(!nv.per_link && nv.links.len() == 18);
    let ids: Vec<_> = snap.devices[0].points().iter().map(|p| p.id).collect();
    assert!(
        ids.contains(&gpumon_core::MetricId::NvlinkTx) && !ids.contains(&gpumon_core::MetricId::NvlinkLinkTx),
        "{ids:?}"
    );
    for tick in [0, 3] {
        fake.set_tick(tick);
        let snap = s.sample(&nvlink_only()).unwrap();
        assert_eq!(snap.devices.len(), 8);
        for (i, d) in snap.devices.iter().enumerate() {
            let nv = d.nvlink.as_ref().expect("H100 SXM has NVLink");
            assert_eq!(nv.links.len(), 18);
            assert!(nv.links.iter().all(|l| l.is_up() && l.version == Some(4)));
            assert!(nv.links.iter().all(|l| l.remote_device_type == Some(NvlinkRemote::Switch)));
            assert_eq!(d.nvlink, expected_nvlink(spec, i, tick), "GPU {i} tick {tick}");
        }
    }
    // Traffic follows the training workload: counters rise between ticks.
    fake.set_tick(10);
    let later = s.sample(&nvlink_only()).unwrap();
    fake.set_tick(3);
    let earlier = s.sample(&nvlink_only()).unwrap();
    let tx = |snap: &gpumon_core::Snapshot| snap.devices[0].nvlink.as_ref().unwrap().tx_bytes().unwrap();
    assert!(tx(&later) > tx(&earlier) + 7 * 18 * 1_000_000_000, "{} vs {}", tx(&later), tx(&earlier));
}

#[test]
fn a100_links_go_to_peer_gpus_and_pcie_cards_have_none() {
    let spec = "profile=a100x4;clock=manual";
    let fake = Fake::new(spec);
    let snap = sampler(&fake).sample(&nvlink_only()).unwrap();
    let gpus: Vec<_> = snap.devices.iter().filter(|d| d.info.mig.is_none()).collect();
    for (i, d) in gpus.iter().enumerate() {
        let nv = d.nvlink.as_ref().expect("A100 SXM has NVLink");
        assert_eq!(nv.links.len(), 12);
        assert!(nv.links.iter().all(|l| l.remote_device_type == Some(NvlinkRemote::Gpu) && l.version == Some(3)));
        let own = d.info.pci_bus_id.clone();
        assert!(nv.links.iter().all(|l| l.remote_pci_bus_id.is_some() && l.remote_pci_bus_id != own), "GPU {i}");
        assert_eq!(d.nvlink, expected_nvlink(spec, i, 0));
    }

    let fake = Fake::new("profile=rtx4090x2;clock=manual");
    let snap = sampler(&fake).sample(&nvlink_only()).unwrap();
    assert_eq!(snap.devices.len(), 2);
    assert!(snap.devices.iter().all(|d| d.nvlink.is_none()), "no NVLink, not zeros");
}

#[test]
fn a_link_fault_shows_as_down_and_rising_errors() {
    let spec = "profile=h100x8;clock=manual;faults=nvlink-down:2:5@2,nvlink-errors:3:0@2:7";
    let fake = Fake::new(spec);
    let s = sampler(&fake);
    let mut crc = Vec::new();
    let mut down_tx = Vec::new();
    for tick in 0..5 {
        fake.set_tick(tick);
        let snap = s.sample(&nvlink_only()).unwrap();
        let l5 = &snap.devices[2].nvlink.as_ref().unwrap().links[5];
        assert_eq!(l5.state == NvlinkState::Down, tick >= 2, "tick {tick}");
        if tick >= 2 {
            down_tx.push(l5.tx_bytes.unwrap());
        }
        let l0 = &snap.devices[3].nvlink.as_ref().unwrap().links[0];
        crc.push(l0.crc_errors.unwrap());
        for (i, d) in snap.devices.iter().enumerate() {
            assert_eq!(d.nvlink, expected_nvlink(spec, i, tick), "GPU {i} tick {tick}");
        }
    }
    assert_eq!(crc, [0, 0, 7, 14, 21]);
    assert!(down_tx.windows(2).all(|w| w[0] == w[1]), "a down link's counters stop: {down_tx:?}");
}

#[test]
fn nvlink_costs_one_field_values_call_per_gpu_per_tick() {
    let fake = Fake::new("profile=h100x8;clock=manual");
    let s = sampler(&fake);
    s.sample(&nvlink_only()).unwrap(); // discovery: link count + per-link static facts
    let before = fake.calls("nvmlDeviceGetFieldValues");
    let versions = fake.calls("nvmlDeviceGetNvLinkVersion");
    for tick in 1..4 {
        fake.set_tick(tick);
        s.sample(&nvlink_only()).unwrap();
    }
    assert_eq!(fake.calls("nvmlDeviceGetFieldValues") - before, 3 * 8);
    assert_eq!(fake.calls("nvmlDeviceGetNvLinkVersion"), versions, "static facts are read once");
    assert_eq!(fake.calls("nvmlDeviceGetNvLinkState"), 0, "no per-link calls per tick");
}

/// A sysfs fixture: `runtime_status` of every GPU of the fleet, `suspended` for those listed.
fn sysfs_fixture(dir: &Path, bus_ids: &[String], suspended: &[usize]) {
    for (i, id) in bus_ids.iter().enumerate() {
        let p = runtime_pm::runtime_status_path(dir, id).unwrap();
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, if suspended.contains(&i) { "suspended\n" } else { "active\n" }).unwrap();
    }
}

#[test]
fn a_suspended_gpu_is_reported_and_not_woken() {
    let spec = "profile=h100x8;clock=manual";
    let fake = Fake::new(spec);
    let fleet = Fleet::load(&Config::parse(spec).unwrap()).unwrap();
    let bus_ids: Vec<String> = fleet.devices.iter().map(|d| d.pci_bus_id.clone().unwrap()).collect();
    let root: PathBuf = fake.dir.join("sysfs");
    sysfs_fixture(&root, &bus_ids, &[3]);
    let s = NvmlSampler::builder()
        .library_path(fake.library())
        .xid_events(false)
        .sysfs_root(&root)
        .build()
        .expect("sampler");
    // Building the sampler took GPU 3's handle and bus id (two calls the driver answers without
    // waking it) and no GPM baseline.
    let at_build = fake.device_calls(3);
    assert_eq!(at_build, 2, "{at_build} calls reached the sleeping GPU while the sampler was built");
    let everything = SampleRequest::new(MetricSet::everything(), DeviceFilter::all());
    for tick in 0..3 {
        fake.set_tick(tick);
        let snap = s.sample(&everything).unwrap();
        assert_eq!(snap.devices.len(), 8);
        let d = &snap.devices[3];
        assert_eq!(d.state, DeviceState::Suspended);
        assert_eq!(d.info.pci_bus_id.as_deref(), Some(bus_ids[3].as_str()));
        assert!(d.utilization.gpu.is_none() && d.nvlink.is_none() && d.errors.is_empty());
        assert!(snap.devices.iter().enumerate().all(|(i, d)| i == 3 || d.state == DeviceState::Ok));
    }
    assert_eq!(fake.device_calls(3), at_build, "no NVML call reached the suspended GPU");
    assert!(fake.device_calls(2) > 50, "the others were read");

    // Woken by someone else: read normally from the next tick.
    sysfs_fixture(&root, &bus_ids, &[]);
    let snap = s.sample(&everything).unwrap();
    assert_eq!(snap.devices[3].state, DeviceState::Ok);
    assert!(snap.devices[3].utilization.gpu.is_some());

    // wake_suspended: the check is off, the GPU is read (and would be woken).
    sysfs_fixture(&root, &bus_ids, &[3]);
    let waking =
        NvmlSampler::builder().library_path(fake.library()).xid_events(false).sysfs_root(&root).wake_suspended(true);
    let snap = waking.build().unwrap().sample(&everything).unwrap();
    assert_eq!(snap.devices[3].state, DeviceState::Ok);
}

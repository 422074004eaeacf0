//! The device-filter rules hold in the NVML sampler itself (on the fake libnvidia-ml), not only
//! in the agent runtime: an ambiguous UUID prefix selects nothing, and CUDA-ordered indices are
//! refused on a host with different GPU models.

mod common;

use common::Fake;
use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{DeviceFilter, MetricSet, SampleError, SampleRequest, Sampler};

fn sampler(fake: &Fake) -> NvmlSampler {
    NvmlSampler::builder().library_path(fake.library()).xid_events(false).build().expect("NvmlSampler on the fake")
}

fn request(filter: DeviceFilter) -> SampleRequest {
    SampleRequest::new(MetricSet::default().with_stage_inputs(), filter)
}

#[test]
fn ambiguous_uuid_prefix_selects_nothing_in_the_nvml_sampler() {
    // 20 GPUs, 16 possible first hex digits: two share one.
    let fake = Fake::new("profile=h100x20;clock=manual");
    let s = sampler(&fake);
    let all = s.sample(&request(DeviceFilter::all())).unwrap();
    let uuids: Vec<&str> = all.devices.iter().map(|d| d.info.uuid.as_str()).collect();
    let prefix = uuids.iter().map(|u| &u[..5]).find(|p| uuids.iter().filter(|u| u.starts_with(p)).count() > 1).unwrap();
    let snap = s.sample(&request(DeviceFilter::parse(prefix).unwrap())).unwrap();
    assert!(snap.devices.is_empty(), "`{prefix}` matches several GPUs: {:?}", snap.devices);
    let snap = s.sample(&request(DeviceFilter::parse(&format!("{prefix},3")).unwrap())).unwrap();
    assert_eq!(snap.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [3]);
}

#[test]
fn cuda_indices_are_refused_on_a_mixed_host() {
    let fake = Fake::new("profile=mixed;clock=manual");
    let s = sampler(&fake);
    let cuda = |order: Option<&str>| {
        DeviceFilter::from_vars_ordered(Some("1".into()), None, order.map(str::to_owned)).unwrap()
    };
    let err = s.sample(&request(cuda(None))).unwrap_err();
    assert!(matches!(err, SampleError::Backend(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("CUDA_VISIBLE_DEVICES") && msg.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"), "{msg}");
    let snap = s.sample(&request(cuda(Some("PCI_BUS_ID")))).unwrap();
    assert_eq!(snap.devices.len(), 1);
    assert_eq!(snap.devices[0].info.index, 1);
    // UUIDs always work.
    let uuid = snap.devices[0].info.uuid.clone();
    let by_uuid = DeviceFilter::from_vars_ordered(Some(uuid.clone()), None, None).unwrap();
    assert_eq!(s.sample(&request(by_uuid)).unwrap().devices[0].info.uuid, uuid);
}

//! The device-filter rules hold in the mock sampler itself, not only in the agent runtime: an
//! ambiguous UUID prefix selects nothing, and CUDA-ordered indices are refused on a mixed fleet.

use gpumon_core::{DeviceFilter, MetricSet, SampleError, SampleRequest, Sampler};
use gpumon_mock::MockSampler;

/// Two GPU UUIDs of `sampler` that share their first hex digit (64 GPUs, 16 digits: there are).
fn shared_prefix(sampler: &MockSampler) -> (String, usize) {
    let all =
        sampler.sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::all())).unwrap();
    let uuids: Vec<&str> = all.devices.iter().map(|d| d.info.uuid.as_str()).collect();
    let prefix = uuids
        .iter()
        .map(|u| &u[..5])
        .find(|p| uuids.iter().filter(|u| u.starts_with(p)).count() > 1)
        .expect("pigeonhole: 64 UUIDs, 16 first digits");
    (prefix.to_owned(), uuids.iter().filter(|u| u.starts_with(prefix)).count())
}

#[test]
fn ambiguous_uuid_prefix_selects_nothing_in_the_sampler() {
    let s = MockSampler::from_profile_name("h100x64").unwrap();
    let (prefix, matching) = shared_prefix(&s);
    assert!(matching > 1);
    let req =
        |list: &str| SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::parse(list).unwrap());
    assert!(s.sample(&req(&prefix)).unwrap().devices.is_empty(), "`{prefix}` matches {matching} GPUs");
    // Next to an unambiguous selector, only that one shows.
    let snap = s.sample(&req(&format!("{prefix},5"))).unwrap();
    assert_eq!(snap.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [5]);
}

#[test]
fn cuda_indices_are_refused_on_a_mixed_fleet() {
    let s = MockSampler::from_profile_name("mixed").unwrap();
    let filter = DeviceFilter::from_vars_ordered(Some("0".into()), None, None).unwrap();
    let err = s.sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), filter)).unwrap_err();
    assert!(matches!(err, SampleError::Backend(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("CUDA_VISIBLE_DEVICES") && msg.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"), "{msg}");
    let pci = DeviceFilter::from_vars_ordered(Some("0".into()), None, Some("PCI_BUS_ID".into())).unwrap();
    let snap = s.sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), pci)).unwrap();
    assert_eq!(snap.devices.iter().filter(|d| d.info.mig.is_none()).count(), 1);
    // One model: the orders agree, the index is accepted.
    let same = MockSampler::from_profile_name("h100x8").unwrap();
    let filter = DeviceFilter::from_vars_ordered(Some("0".into()), None, None).unwrap();
    assert_eq!(
        same.sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), filter)).unwrap().devices.len(),
        1
    );
}

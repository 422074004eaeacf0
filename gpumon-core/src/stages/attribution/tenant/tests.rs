//! The tenant filter: selector parsing, matching, fixture snapshots with owners set by hand, and
//! a property test that one tenant's view never names another's owners, processes or GPUs.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use super::*;
use crate::model::{Nvlink, NvlinkLink, NvlinkRemote};
use crate::stages::attribution::{OwnerLabels, SharedOwner};
use crate::stages::diagnose::finding::{
    Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, Severity, Transition,
};
use crate::stages::steps::{DeviceStep, Peer, RunSteps, StepReport, Steps};
use crate::{DeviceInfo, MigInfo, ProcessSample, SystemInfo};

fn sel(s: &str) -> TenantSelector {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Selectors

#[test]
fn text_form_parses_round_trips_and_names_what_is_wrong() {
    let s = sel(" namespace = team-a , container=trainer,user=alice,group=100 ");
    assert_eq!(
        s.criteria(),
        &[
            Criterion::Namespace("team-a".into()),
            Criterion::Container("trainer".into()),
            Criterion::User("alice".into()),
            Criterion::Gid(100),
        ]
    );
    assert_eq!(s.to_string(), "namespace=team-a,container=trainer,user=alice,group=100");
    assert_eq!(sel(&s.to_string()), s);
    assert_eq!(sel("user=1000").criteria(), &[Criterion::Uid(1000)]);

    let err = |s: &str| s.parse::<TenantSelector>().unwrap_err();
    assert_eq!(err(""), TenantSelectorError::Empty);
    assert_eq!(err(" , "), TenantSelectorError::Empty);
    assert_eq!(err("namespace="), TenantSelectorError::EmptyValue { key: "namespace" });
    assert_eq!(err("group="), TenantSelectorError::EmptyValue { key: "group" });
    assert_eq!(err("user=alice,user=1000"), TenantSelectorError::Duplicate { key: "user" });
    assert_eq!(err("pod=x"), TenantSelectorError::UnknownKey { key: "pod".into() });
    assert_eq!(err("namespace"), TenantSelectorError::Malformed { part: "namespace".into() });
    assert_eq!(err("group=gpu"), TenantSelectorError::GroupName { value: "gpu".into() });
    assert_eq!(err("user=99999999999"), TenantSelectorError::BadId { key: "user", value: "99999999999".into() });
    // The messages say what to write instead.
    assert!(err("group=gpu").to_string().contains("numeric gid"), "{}", err("group=gpu"));
    assert!(err("").to_string().contains("namespace, container, user or group"));
}

#[cfg(feature = "serde")]
#[test]
fn config_form_takes_a_table_or_the_text_and_rejects_with_the_reason() {
    let de = |json: &str| serde_json::from_str::<TenantSelector>(json);
    assert_eq!(de(r#"{"namespace":"team-a"}"#).unwrap(), sel("namespace=team-a"));
    assert_eq!(de(r#"{"user":1000}"#).unwrap().criteria(), &[Criterion::Uid(1000)]);
    assert_eq!(de(r#"{"user":"1000"}"#).unwrap().criteria(), &[Criterion::Uid(1000)]);
    assert_eq!(de(r#"{"user":"alice","group":100}"#).unwrap(), sel("user=alice,group=100"));
    assert_eq!(de(r#""container=abc""#).unwrap(), sel("container=abc"));

    let msg = |json: &str| de(json).unwrap_err().to_string();
    assert!(msg("{}").contains("at least one of"), "{}", msg("{}"));
    assert!(msg(r#"{"group":"gpu"}"#).contains("numeric gid"), "{}", msg(r#"{"group":"gpu"}"#));
    assert!(msg(r#"{"uid":5}"#).contains("unknown selector key `uid`"), "{}", msg(r#"{"uid":5}"#));
    assert!(msg(r#"{"pod":"x"}"#).contains("unknown selector key `pod`"));
    assert!(msg(r#"{"user":-1}"#).contains("not a valid id"), "{}", msg(r#"{"user":-1}"#));
    assert!(msg(r#"{"namespace":7}"#).contains("takes a name"), "{}", msg(r#"{"namespace":7}"#));
    assert!(msg(r#"{"namespace":""}"#).contains("must not be empty"));
    assert!(msg(r#""namespace""#).contains("expected key=value"));
}

fn owner(ns: Option<&str>, ctr: Option<&str>, user: Option<&str>, uid: Option<u32>, gid: Option<u32>) -> Owner {
    Owner {
        namespace: ns.map(Into::into),
        container: ctr.map(Into::into),
        user: user.map(Into::into),
        uid,
        gid,
        ..Owner::default()
    }
}

#[test]
fn every_criterion_must_hold_and_unknown_fields_never_match() {
    let alice = owner(Some("team-a"), Some("trainer"), Some("alice"), Some(1000), Some(100));
    assert!(sel("namespace=team-a").matches(&alice));
    assert!(sel("namespace=team-a,user=alice").matches(&alice));
    assert!(sel("user=1000,group=100").matches(&alice));
    assert!(sel("container=trainer").matches(&alice));
    assert!(!sel("namespace=team-a,user=bob").matches(&alice));
    assert!(!sel("namespace=team-b").matches(&alice));
    assert!(!sel("group=101").matches(&alice));
    // Nothing known: matches no selector at all.
    assert!(!sel("user=0").matches(&Owner::default()));
    assert!(!sel("namespace=team-a").matches(&owner(None, None, Some("alice"), Some(1000), None)));
    // A container outside Kubernetes: its short id is `container`, the full one `container_id`.
    let mut docker = owner(None, Some("0123456789ab"), None, None, None);
    docker.container_id = Some("0123456789abcdef".into());
    assert!(sel("container=0123456789ab").matches(&docker));
    assert!(sel("container=0123456789abcdef").matches(&docker));
    assert!(!sel("container=0123").matches(&docker));
}

// ---------------------------------------------------------------------------------------------
// Fixture snapshots

fn ns_owner(ns: &str, pod: &str, user: &str, uid: u32) -> SharedOwner {
    let mut o = owner(Some(ns), Some("main"), Some(user), Some(uid), Some(uid));
    o.pod = Some(pod.into());
    Arc::new(o)
}

fn alloc(ns: &str, pod: &str) -> SharedOwner {
    let mut o = owner(Some(ns), Some("main"), None, None, None);
    o.pod = Some(pod.into());
    Arc::new(o)
}

fn process(pid: u32, owner: Option<&SharedOwner>) -> ProcessSample {
    let mut p = ProcessSample::new(pid);
    p.name = Some(format!("proc-{pid}"));
    p.memory_used = Some(1 << 30);
    p.owner = owner.cloned();
    p
}

/// A device whose owners are `allocations` plus its processes' distinct owners, as the
/// attribution processor fills them.
fn device(info: DeviceInfo, allocations: &[&SharedOwner], processes: Vec<ProcessSample>) -> DeviceSample {
    let mut d = DeviceSample::new(Arc::new(info));
    d.utilization.gpu = Some(0.5);
    d.owners = allocations.iter().map(|o| (*o).clone()).collect();
    for p in &processes {
        if let Some(o) = &p.owner {
            if !d.owners.contains(o) {
                d.owners.push(o.clone());
            }
        }
    }
    d.processes = processes;
    d
}

fn mig(index: u32, uuid: &str, parent: &str, gi: u32) -> DeviceInfo {
    let mut i = DeviceInfo::new(index, uuid, "NVIDIA A100 MIG 1g.10gb");
    i.mig = Some(MigInfo::new(parent, gi, gi, 0));
    i
}

struct Fixture {
    snapshot: Snapshot,
    a: SharedOwner,
    b: SharedOwner,
}

/// GPU-0: a's process. GPU-1: b's. GPU-2: shared (a's and b's processes, time-sliced).
/// GPU-3: allocated to a's pod, no process yet. GPU-4: a process nobody is known to own.
/// GPU-5: in MIG mode, its instances MIG-5a (a's process) and MIG-5b (b's); the parent lists
/// both processes, as the driver does. GPU-6: lost, allocated to b.
fn fixture() -> Fixture {
    let a = ns_owner("team-a", "pod-a", "alice", 1000);
    let b = ns_owner("team-b", "pod-b", "bob", 2000);
    let info = |i: u32| DeviceInfo::new(i, format!("GPU-{i}"), "NVIDIA H100");
    let mut lost = DeviceSample::lost(Arc::new(info(6)));
    lost.owners.push(alloc("team-b", "pod-b"));
    let devices = vec![
        device(info(0), &[], vec![process(100, Some(&a))]),
        device(info(1), &[], vec![process(200, Some(&b))]),
        device(info(2), &[], vec![process(101, Some(&a)), process(201, Some(&b))]),
        device(info(3), &[&alloc("team-a", "pod-a")], vec![]),
        device(info(4), &[], vec![process(300, None)]),
        device(info(5), &[], vec![process(102, Some(&a)), process(202, Some(&b))]),
        device(mig(5, "MIG-5a", "GPU-5", 1), &[], vec![process(102, Some(&a))]),
        device(mig(5, "MIG-5b", "GPU-5", 2), &[], vec![process(202, Some(&b))]),
        lost,
    ];
    let mut snapshot = Snapshot::new(Arc::new(SystemInfo::new("node-1", "nvml")), devices)
        .with_seq(7)
        .with_taken_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        .with_duration(Duration::from_millis(3));
    let since = UNIX_EPOCH + Duration::from_secs(1_699_999_000);
    let finding = |kind, uuid: Option<(u32, &str)>, evidence: &str| {
        Finding::new(kind, Severity::Warning, uuid, since, evidence, "advice")
    };
    let active: Vec<Finding> = vec![
        finding(FindingKind::NearOom, Some((0, "GPU-0")), "memory 97 % used"),
        finding(FindingKind::NearOom, Some((1, "GPU-1")), "memory 98 % used"),
        finding(FindingKind::Imbalance, Some((0, "GPU-0")), "utilisation 3 % while GPU 1 (GPU-1) runs at 90 %"),
        finding(FindingKind::Imbalance, Some((3, "GPU-3")), "utilisation 0 % while GPU 2 (GPU-2) runs at 90 %"),
        finding(FindingKind::MemoryBound, Some((5, "MIG-5a")), "on MIG-5a of GPU-5"),
        finding(FindingKind::HardwareErrors, None, "host-level"),
    ];
    let diagnosis = Diagnosis {
        events: vec![
            FindingEvent::new(Transition::Raised, active[0].clone(), None),
            FindingEvent::new(Transition::Raised, active[1].clone(), None),
        ],
        active: active.into(),
        raised_total: vec![FindingCount::new(FindingKind::NearOom, 2)].into(),
        busy: Some(crate::Busy {
            window_seconds: 30.0,
            level: 0.6,
            gpus: ["GPU-0", "GPU-1", "GPU-2", "GPU-3"].map(|u| crate::BusyGpu::new(u, u != "GPU-1")).to_vec().into(),
        }),
    };
    snapshot.attach(diagnosis);
    let mut steps = Steps::default();
    steps.runs.push(RunSteps::new("job-of-team-b", Some(0)));
    snapshot.attach(steps);
    Fixture { snapshot, a, b }
}

fn uuids(s: &Snapshot) -> Vec<&str> {
    s.devices.iter().map(|d| d.info.uuid.as_str()).collect()
}

fn pids(d: &DeviceSample) -> Vec<u32> {
    d.processes.iter().map(|p| p.pid).collect()
}

#[test]
fn a_view_from_holdings_computed_beforehand_is_the_same_view() {
    let f = fixture();
    for selector in ["namespace=team-a", "user=bob", "namespace=team-b", "user=0"] {
        let tenant = sel(selector);
        let direct = f.snapshot.scoped_to(&tenant);
        let held = tenant.held_devices(&f.snapshot);
        let given = f.snapshot.scoped_to_held(&tenant, &held);
        assert_eq!(uuids(&given), uuids(&direct), "{selector}");
        for (a, b) in given.devices.iter().zip(&direct.devices) {
            assert_eq!((pids(a), a.owners.len()), (pids(b), b.owners.len()), "{selector}");
        }
        assert_eq!(
            given.output::<crate::Diagnosis>().map(|d| d.active.len()),
            direct.output::<crate::Diagnosis>().map(|d| d.active.len()),
            "{selector}"
        );
        // Holdings of another length (another snapshot's) are not trusted.
        let wrong = vec![true; held.len() + 1];
        assert_eq!(uuids(&f.snapshot.scoped_to_held(&tenant, &wrong)), uuids(&direct), "{selector}");
    }
}

#[test]
fn a_tenant_sees_the_gpus_its_processes_or_pods_hold_and_only_its_own_processes() {
    let f = fixture();
    let view = f.snapshot.scoped_to(&sel("namespace=team-a"));
    // GPU-5 is in MIG mode: holding MIG-5a does not show the whole GPU.
    assert_eq!(uuids(&view), ["GPU-0", "GPU-2", "GPU-3", "MIG-5a"]);
    assert_eq!(pids(&view.devices[0]), [100]);
    assert_eq!(pids(&view.devices[1]), [101], "b's process on the shared GPU is hidden");
    assert!(view.devices[2].processes.is_empty());
    assert_eq!(pids(&view.devices[3]), [102]);
    // Device-wide values stay, host facts stay, the tick's identity stays.
    assert_eq!(view.devices[1].utilization.gpu, Some(0.5));
    assert_eq!(view.system, f.snapshot.system);
    assert_eq!((view.seq, view.taken_at, view.duration), (7, f.snapshot.taken_at, f.snapshot.duration));

    let b_view = f.snapshot.scoped_to(&sel("user=bob"));
    assert_eq!(uuids(&b_view), ["GPU-1", "GPU-2", "MIG-5b"], "bob is no pod, so the lost GPU-6's pod is not his");
    assert_eq!(pids(&b_view.devices[1]), [201]);
    let b_ns = f.snapshot.scoped_to(&sel("namespace=team-b"));
    assert_eq!(uuids(&b_ns), ["GPU-1", "GPU-2", "MIG-5b", "GPU-6"], "a lost GPU allocated to the tenant stays");
}

#[test]
fn owner_labels_of_a_shared_gpu_name_only_the_reader() {
    let f = fixture();
    let full = &f.snapshot.devices[2];
    assert_eq!(full.owner_labels().namespace, Some(crate::stages::attribution::SHARED));
    for (selector, own) in [("namespace=team-a", &f.a), ("namespace=team-b", &f.b)] {
        let view = f.snapshot.scoped_to(&sel(selector));
        let shared = view.device("GPU-2").expect("both tenants see the shared GPU");
        assert_eq!(shared.owners, vec![own.clone()]);
        assert_eq!(shared.owner_labels(), OwnerLabels::merge([&**own]));
        assert!(view.devices.iter().flat_map(|d| &d.owners).all(|o| sel(selector).matches(o)));
    }
}

#[test]
fn a_gpu_in_mig_mode_is_held_only_through_an_allocation_of_the_whole_gpu() {
    let mut f = fixture();
    let view = f.snapshot.scoped_to(&sel("namespace=team-a"));
    assert!(view.device("GPU-5").is_none());
    // The kubelet gave the whole GPU to a's pod (no process of its own owns that record).
    f.snapshot.devices[5].owners.push(alloc("team-a", "pod-a-whole"));
    let view = f.snapshot.scoped_to(&sel("namespace=team-a"));
    let parent = view.device("GPU-5").expect("allocated whole");
    assert_eq!(pids(parent), [102], "still only a's process");
    assert!(f.snapshot.scoped_to(&sel("namespace=team-b")).device("GPU-5").is_none());
}

#[test]
fn findings_about_kept_gpus_stay_unless_they_name_another_gpu_and_host_data_goes() {
    let f = fixture();
    let view = f.snapshot.scoped_to(&sel("namespace=team-a"));
    let d = view.output::<crate::Diagnosis>().expect("diagnosis stays on");
    let kept: Vec<(&str, &str)> = d.active.iter().map(|f| (f.uuid.as_deref().unwrap(), f.evidence.as_str())).collect();
    assert_eq!(
        kept,
        [
            ("GPU-0", "memory 97 % used"),
            // The peer GPU-2 is in a's view (shared): nothing new is named.
            ("GPU-3", "utilisation 0 % while GPU 2 (GPU-2) runs at 90 %"),
            // The parent's UUID is on the MIG instance anyway.
            ("MIG-5a", "on MIG-5a of GPU-5"),
        ]
    );
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].finding.uuid.as_deref(), Some("GPU-0"));
    assert!(d.raised_total.is_empty(), "counts over every tenant's GPUs");
    let busy = d.busy.as_ref().expect("the busy verdicts of the view's GPUs");
    let judged: Vec<(&str, bool)> = busy.gpus.iter().map(|g| (g.uuid.as_str(), g.busy)).collect();
    assert_eq!(judged, [("GPU-0", true), ("GPU-2", true), ("GPU-3", true)], "not GPU-1, b's");
    assert_eq!((busy.window_seconds, busy.level), (30.0, 0.6));
    assert!(view.output::<crate::stages::steps::Steps>().is_none(), "a run's job name is its owner's");
}

#[test]
fn a_tenant_with_nothing_gets_an_empty_view_of_the_same_host() {
    let f = fixture();
    let view = f.snapshot.scoped_to(&sel("namespace=team-c"));
    assert!(view.devices.is_empty());
    assert_eq!(view.system.hostname, "node-1");
    assert!(view.output::<crate::Diagnosis>().is_some_and(|d| d.active.is_empty()));
    // An unattributed process is nobody's: no selector (not even uid 0) gets GPU-4.
    assert!(f.snapshot.scoped_to(&sel("user=0")).devices.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Property: a tenant's view never names another tenant.

/// Which tenant an owner or a process belongs to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    A(u8),
    B(u8),
    Nobody,
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![(0u8..3).prop_map(Who::A), (0u8..3).prop_map(Who::B), Just(Who::Nobody)]
}

/// The full owner record of a process of `who` (disjoint values for a and b in every field).
fn process_owner(who: Who) -> Option<SharedOwner> {
    let (t, i, base) = match who {
        Who::A(i) => ("a", i, 1000),
        Who::B(i) => ("b", i, 2000),
        Who::Nobody => return None,
    };
    let mut o = owner(
        Some(&format!("ns-{t}")),
        Some(&format!("ctr-{t}{i}")),
        Some(&format!("user-{t}{i}")),
        Some(base + u32::from(i)),
        Some(base),
    );
    o.pod = Some(format!("pod-{t}{i}"));
    o.pod_uid = Some(format!("poduid-{t}{i}"));
    o.container_id = Some(format!("cid-{t}{i}"));
    Some(Arc::new(o))
}

/// A kubelet allocation of `who`'s pod (names only).
fn allocation(who: Who) -> Option<SharedOwner> {
    let (t, i) = match who {
        Who::A(i) => ("a", i),
        Who::B(i) => ("b", i),
        Who::Nobody => return None,
    };
    let mut o = owner(Some(&format!("ns-{t}")), Some(&format!("ctr-{t}{i}")), None, None, None);
    o.pod = Some(format!("pod-{t}{i}"));
    Some(Arc::new(o))
}

#[derive(Clone, Debug)]
struct GenDevice {
    allocation: Who,
    processes: Vec<Who>,
    /// Index of another device its finding's evidence names, if any.
    names_peer: Option<usize>,
}

fn gen_device() -> impl Strategy<Value = GenDevice> {
    (who(), prop::collection::vec(who(), 0..4), prop::option::of(0usize..8))
        .prop_map(|(allocation, processes, names_peer)| GenDevice { allocation, processes, names_peer })
}

/// Selectors for a and b that are disjoint (each picks out only its own tenant's owners).
fn selectors() -> impl Strategy<Value = (TenantSelector, TenantSelector)> {
    prop_oneof![
        Just(("namespace=ns-a", "namespace=ns-b")),
        Just(("group=1000", "group=2000")),
        Just(("user=user-a0", "user=2001")),
        Just(("container=ctr-a1", "container=cid-b0")),
        Just(("namespace=ns-a,user=1002", "namespace=ns-b,group=2000")),
    ]
    .prop_map(|(a, b)| (sel(a), sel(b)))
}

struct Generated {
    snapshot: Snapshot,
    /// Whether a may hold each device (computed independently of the code under test).
    a_holds: Vec<bool>,
    /// The runs a's own processes registered (computed independently of the code under test).
    a_runs: Vec<String>,
}

fn build(plain: &[GenDevice], mig_parts: &[GenDevice], parent_alloc: Who, a: &TenantSelector) -> Generated {
    let mut pid = 10_000u32;
    let mut mk_processes = |whos: &[Who]| -> Vec<ProcessSample> {
        whos.iter()
            .map(|w| {
                pid += 1;
                let mut p = ProcessSample::new(pid);
                let tag = match w {
                    Who::A(_) => "a",
                    Who::B(_) => "b",
                    Who::Nobody => "x",
                };
                p.name = Some(format!("proc-{tag}-{pid}"));
                p.owner = process_owner(*w);
                p
            })
            .collect()
    };
    let alloc_of = |w: Who| allocation(w).into_iter().collect::<Vec<_>>();
    let matches_a = |o: &Option<SharedOwner>| o.as_deref().is_some_and(|o| a.matches(o));

    let mut devices = Vec::new();
    let mut a_holds = Vec::new();
    for (i, g) in plain.iter().enumerate() {
        let processes = mk_processes(&g.processes);
        let allocations = alloc_of(g.allocation);
        a_holds.push(matches_a(&allocation(g.allocation)) || processes.iter().any(|p| matches_a(&p.owner)));
        let refs: Vec<&SharedOwner> = allocations.iter().collect();
        let mut info = DeviceInfo::new(i as u32, format!("GPU-{i:04}-x"), "H100");
        info.pci_bus_id = Some(bus_id(i));
        let mut d = device(info, &refs, processes);
        // NVLink to every other plain GPU (their bus ids) and to a switch.
        let mut links: Vec<NvlinkLink> = (0..plain.len())
            .filter(|&j| j != i)
            .map(|j| {
                let mut l = NvlinkLink::new(j as u32);
                l.remote_pci_bus_id = Some(bus_id(j));
                l.remote_device_type = Some(NvlinkRemote::Gpu);
                l
            })
            .collect();
        let mut switch = NvlinkLink::new(99);
        switch.remote_pci_bus_id = Some("0000:f0:00.0".into());
        switch.remote_device_type = Some(NvlinkRemote::Switch);
        links.push(switch);
        d.nvlink = Some(Nvlink::new(links));
        devices.push(d);
    }
    if !mig_parts.is_empty() {
        let parent_uuid = "GPU-0099-x";
        let idx = plain.len() as u32;
        let parts: Vec<Vec<ProcessSample>> = mig_parts.iter().map(|g| mk_processes(&g.processes)).collect();
        let parent_processes: Vec<ProcessSample> = parts.iter().flatten().cloned().collect();
        let allocations = alloc_of(parent_alloc);
        a_holds.push(matches_a(&allocation(parent_alloc)));
        let refs: Vec<&SharedOwner> = allocations.iter().collect();
        devices.push(device(DeviceInfo::new(idx, parent_uuid, "A100"), &refs, parent_processes));
        for (k, (g, processes)) in mig_parts.iter().zip(parts).enumerate() {
            let allocations = alloc_of(g.allocation);
            a_holds.push(matches_a(&allocation(g.allocation)) || processes.iter().any(|p| matches_a(&p.owner)));
            let refs: Vec<&SharedOwner> = allocations.iter().collect();
            let info = mig(idx, &format!("MIG-0099-{k}-x"), parent_uuid, k as u32 + 1);
            devices.push(device(info, &refs, processes));
        }
    }

    // Findings on every device, some naming a peer GPU; a host finding; a b-only run.
    let uuids: Vec<String> = devices.iter().map(|d| d.info.uuid.clone()).collect();
    // Which peer each device's finding names: the MIG parent's names none.
    let parent = (!mig_parts.is_empty()).then_some(None);
    let peers: Vec<Option<usize>> =
        plain.iter().map(|g| g.names_peer).chain(parent).chain(mig_parts.iter().map(|g| g.names_peer)).collect();
    let since = UNIX_EPOCH;
    let mut active = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let evidence = match peers[i].and_then(|p| uuids.get(p)) {
            Some(peer) => format!("utilisation 1 % while GPU ({peer}) runs at 99 %"),
            None => "utilisation 1 %".to_owned(),
        };
        let device = Some((d.info.index, d.info.uuid.as_str()));
        active.push(Finding::new(FindingKind::Imbalance, Severity::Info, device, since, evidence, "advice"));
    }
    active.push(Finding::new(FindingKind::HardwareErrors, Severity::Critical, None, since, "host of b", "advice"));
    let diagnosis = Diagnosis {
        events: active.iter().map(|f| FindingEvent::new(Transition::Raised, f.clone(), None)).collect(),
        active: active.into(),
        raised_total: vec![FindingCount::new(FindingKind::Imbalance, 9)].into(),
        busy: None,
    };
    let mut snapshot = Snapshot::new(Arc::new(SystemInfo::new("node-1", "nvml")), devices);
    snapshot.attach(diagnosis);
    // Steps: a local run; one run per owned process, registered by it, with figures for every
    // GPU; and one of b's whose pid an a process has now (a reused pid).
    let mut report = StepReport::new(7, Duration::from_secs(1));
    report.devices = uuids.iter().map(|u| DeviceStep::new(u.as_str())).collect();
    let registered = |job: String, by: Peer| {
        let mut r = RunSteps::new(job, Some(0));
        r.last = Some(report.clone());
        r.reported = vec![report.clone()];
        r.registered_by = Some(by);
        r
    };
    let mut steps = Steps::default();
    steps.runs.push(RunSteps::new("job-of-b", Some(1)));
    let mut a_runs = Vec::new();
    let mut seen = HashSet::new();
    for p in snapshot.devices.iter().flat_map(|d| &d.processes) {
        let Some(o) = p.owner.as_deref().filter(|_| seen.insert(p.pid)) else { continue };
        let tag = if o.uid.unwrap_or(0) >= 2000 { "b" } else { "a" };
        let job = format!("job-of-{tag}-{}", p.pid);
        if a.matches(o) {
            a_runs.push(job.clone());
        }
        steps.runs.push(registered(job, Peer::new(o.uid.unwrap(), o.gid.unwrap(), Some(p.pid))));
        if tag == "a" {
            steps.runs.push(registered(format!("job-of-b-reused-{}", p.pid), Peer::new(2001, 2000, Some(p.pid))));
        }
    }
    snapshot.attach(steps);
    Generated { snapshot, a_holds, a_runs }
}

/// Plain GPU `i`'s PCI bus id (upper case, as NVML writes them; views compare without case).
fn bus_id(i: usize) -> String {
    format!("00000000:{:02X}:00.0", 0xA0 + i)
}

proptest! {
    // Cheap (well under a second): 256 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_tenants_view_never_names_the_other_tenant(
        plain in prop::collection::vec(gen_device(), 1..6),
        mig_parts in prop::collection::vec(gen_device(), 0..3),
        parent_alloc in who(),
        (a, b) in selectors(),
    ) {
        let g = build(&plain, &mig_parts, parent_alloc, &a);
        let view = g.snapshot.scoped_to(&a);

        // Exactly the devices a holds, in order.
        let expected: Vec<&str> = g.snapshot.devices.iter().zip(&g.a_holds)
            .filter(|(_, &h)| h).map(|(d, _)| d.info.uuid.as_str()).collect();
        prop_assert_eq!(uuids(&view), expected);
        prop_assert_eq!(a.held_devices(&g.snapshot), g.a_holds.clone());

        for d in &view.devices {
            let full = g.snapshot.device(&d.info.uuid).unwrap();
            // Every process and owner left is a's; none of a's is lost.
            prop_assert!(d.processes.iter().all(|p| p.owner.as_deref().is_some_and(|o| a.matches(o))));
            prop_assert!(d.owners.iter().all(|o| a.matches(o) && !b.matches(o)));
            let own = full.processes.iter().filter(|p| p.owner.as_deref().is_some_and(|o| a.matches(o))).count();
            prop_assert_eq!(d.processes.len(), own);
            // The labels every series of the device carries name only a.
            for (key, value) in d.owner_labels().pairs() {
                prop_assert!(!value.contains("-b"), "{}={} on {}", key, value, d.info.uuid);
            }
        }

        // Exactly the runs a's processes registered, in order.
        let runs: Vec<String> = view.output::<Steps>().map(|s| s.runs.iter().map(|r| r.job.clone()).collect()).unwrap_or_default();
        prop_assert_eq!(runs, g.a_runs.clone());

        // Nothing in the whole view — any field, any text — names b or a GPU a does not hold.
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_string(&view).unwrap();
            for token in ["ns-b", "pod-b", "ctr-b", "cid-b", "user-b", "poduid-b", "proc-b", "proc-x", "job-of-b", "host of b"] {
                prop_assert!(!json.contains(token), "{} in a's view: {}", token, json);
            }
            for id in 2000..2003 {
                for key in ["uid", "gid"] {
                    let field = format!("\"{key}\":{id}");
                    prop_assert!(!json.contains(&field), "{} in a's view: {}", field, json);
                }
            }
            let parents_shown: Vec<&str> = view.devices.iter()
                .filter_map(|d| d.info.mig.as_ref().map(|m| m.parent_uuid.as_str())).collect();
            for (d, held) in g.snapshot.devices.iter().zip(&g.a_holds) {
                let uuid = d.info.uuid.as_str();
                if !held && !parents_shown.contains(&uuid) {
                    prop_assert!(!json.contains(uuid), "{} (not a's) in a's view: {}", uuid, json);
                    // Nor its PCI bus id, which a held GPU's NVLink far end would show.
                    if let Some(bus) = d.info.pci_bus_id.as_deref() {
                        prop_assert!(!json.contains(bus), "{} (bus of {}, not a's) in a's view: {}", bus, uuid, json);
                    }
                }
            }
            // Links to a held GPU and to the switch keep their far end.
            for d in &view.devices {
                for l in d.nvlink.iter().flat_map(|nv| &nv.links) {
                    if l.remote_device_type == Some(NvlinkRemote::Switch) {
                        prop_assert!(l.remote_pci_bus_id.is_some());
                    } else if let Some(bus) = &l.remote_pci_bus_id {
                        prop_assert!(view.devices.iter().any(|v| v.info.pci_bus_id.as_ref() == Some(bus)), "{}", bus);
                    }
                }
            }
        }
    }
}

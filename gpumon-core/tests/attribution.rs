//! Attribution end to end inside the core: cgroup files in the shapes real systems write, a proc
//! root of fixtures in a temp dir, and the processor over snapshots.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gpumon_core::attribution::procfs::ProcOwners;
use gpumon_core::attribution::{
    cgroup, AllocationCache, Allocations, AttributionConfig, AttributionStats, ContainerRuntime, Owner, QosClass,
    SHARED,
};
use gpumon_core::{DeviceInfo, DeviceSample, MetricId, MigInfo, ProcessSample, Processor, Snapshot, SystemInfo};
use proptest::prelude::*;

const DOCKER_ID: &str = "9f2c4e6a8b0d1f3e5a7c9b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a3c5b7d9f2e";
const K8S_ID: &str = "3b8e1f5a7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e8f0a1b3c5d7e9f2a4b6c8d0e1f";
const CRIO_ID: &str = "e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6";
const PODMAN_ID: &str = "5c1a9e3b7d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c2e4b6d8f0a1c3e5b7d9f1a3c";
const POD_UID: &str = "7d1c0b6e-2f3a-4e5d-9c8b-1a2b3c4d5e6f";

fn fixture(name: &str) -> Owner {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup").join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    cgroup::parse(&String::from_utf8_lossy(&bytes))
}

/// What a fixture must parse to.
#[derive(Debug, Default, PartialEq)]
struct Expected<'a> {
    runtime: Option<ContainerRuntime>,
    container_id: Option<&'a str>,
    container: Option<&'a str>,
    pod_uid: Option<&'a str>,
    qos: Option<QosClass>,
    unit: Option<&'a str>,
}

fn got(o: &Owner) -> Expected<'_> {
    Expected {
        runtime: o.runtime,
        container_id: o.container_id.as_deref(),
        container: o.container.as_deref(),
        pod_uid: o.pod_uid.as_deref(),
        qos: o.qos,
        unit: o.unit.as_deref(),
    }
}

#[test]
fn fixtures_from_real_layouts_parse_to_their_container_pod_or_unit() {
    use ContainerRuntime as R;
    let docker = Expected {
        runtime: Some(R::Docker),
        container_id: Some(DOCKER_ID),
        container: Some(&DOCKER_ID[..12]),
        ..Expected::default()
    };
    let podman = Expected {
        runtime: Some(R::Podman),
        container_id: Some(PODMAN_ID),
        container: Some(&PODMAN_ID[..12]),
        ..Expected::default()
    };
    let service = Expected { runtime: Some(R::Systemd), unit: Some("gpu-train.service"), ..Expected::default() };
    let cases = [
        ("docker-v1-cgroupfs.txt", docker),
        (
            "docker-v2-systemd.txt",
            Expected {
                runtime: Some(R::Docker),
                container_id: Some(DOCKER_ID),
                container: Some(&DOCKER_ID[..12]),
                ..Expected::default()
            },
        ),
        (
            "k8s-containerd-v2-systemd.txt",
            Expected {
                runtime: Some(R::Containerd),
                container_id: Some(K8S_ID),
                pod_uid: Some(POD_UID),
                qos: Some(QosClass::Burstable),
                ..Expected::default()
            },
        ),
        (
            "k8s-containerd-v1-cgroupfs.txt",
            Expected {
                runtime: None,
                container_id: Some(K8S_ID),
                pod_uid: Some(POD_UID),
                qos: Some(QosClass::BestEffort),
                ..Expected::default()
            },
        ),
        (
            "k8s-crio-v2-guaranteed.txt",
            Expected {
                runtime: Some(R::Crio),
                container_id: Some(CRIO_ID),
                pod_uid: Some("2a4c6e8f-0b1d-4f3a-8c5e-7a9b0c1d2e3f"),
                qos: Some(QosClass::Guaranteed),
                ..Expected::default()
            },
        ),
        ("podman-rootful-v2.txt", podman),
        (
            "podman-rootless-v2.txt",
            Expected {
                runtime: Some(R::Podman),
                container_id: Some(PODMAN_ID),
                container: Some(&PODMAN_ID[..12]),
                ..Expected::default()
            },
        ),
        (
            "podman-conmon-v2.txt",
            Expected {
                runtime: Some(R::Podman),
                container_id: Some(PODMAN_ID),
                container: Some(&PODMAN_ID[..12]),
                ..Expected::default()
            },
        ),
        ("systemd-service-v2.txt", service),
        (
            "systemd-service-v1.txt",
            Expected { runtime: Some(R::Systemd), unit: Some("gpu-train.service"), ..Expected::default() },
        ),
        (
            "user-session-v2.txt",
            Expected { runtime: Some(R::Systemd), unit: Some("session-4.scope"), ..Expected::default() },
        ),
    ];
    for (name, expected) in cases {
        let owner = fixture(name);
        assert_eq!(got(&owner), expected, "{name}");
        assert_eq!((owner.uid, owner.user.as_deref()), (None, None), "{name}: the cgroup knows no user");
    }
}

#[test]
fn garbage_truncated_empty_and_root_cgroups_are_unknown() {
    for name in ["garbage.txt", "truncated.txt", "empty.txt", "root-v2.txt"] {
        let o = fixture(name);
        assert!(o.is_unknown(), "{name}: {o:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary text never panics the parser, and whatever it finds is well-formed.
    #[test]
    fn arbitrary_input_never_panics(text in "\\PC*") {
        let o = cgroup::parse(&text);
        if let Some(id) = &o.container_id {
            prop_assert_eq!(id.len(), 64);
        }
    }

    /// Cgroup-shaped input built from real components, shuffled and cut anywhere.
    #[test]
    fn cgroup_shaped_input_never_panics(
        parts in proptest::collection::vec(prop_oneof![
            Just("kubepods.slice"), Just("kubepods-burstable.slice"), Just("kubepods"), Just("burstable"),
            Just("pod7d1c0b6e_2f3a_4e5d_9c8b_1a2b3c4d5e6f"), Just("docker"), Just("system.slice"),
            Just("x.service"), Just("session-1.scope"), Just(".."), Just(""), Just("libpod-"), Just(":"),
            Just("kubepods-besteffort-pod7d1c0b6e_2f3a_4e5d_9c8b_1a2b3c4d5e6f.slice"),
        ], 0..12),
        cut in 0usize..400,
    ) {
        let mut text = format!("0::/{}/cri-containerd-{K8S_ID}.scope\n1:name=systemd:/{}", parts.join("/"), parts.join("/"));
        let cut = (0..=cut.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
        let _ = cgroup::parse(&text);
    }
}

// ---------------------------------------------------------------------------------------------
// A proc root of fixtures

struct ProcRoot {
    dir: PathBuf,
}

impl ProcRoot {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpumon-attribution-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("passwd"), "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n")
            .unwrap();
        Self { dir }
    }

    fn passwd(&self) -> PathBuf {
        self.dir.join("passwd")
    }

    fn proc(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// `<root>/proc/<pid>/{stat,status,cgroup}`.
    fn add(&self, pid: u32, start: u64, uid: u32, cgroup: &str) {
        self.add_child(pid, start, uid, cgroup, 1);
    }

    /// The same, started by `parent`.
    fn add_child(&self, pid: u32, start: u64, uid: u32, cgroup: &str, parent: u32) {
        let d = self.proc().join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let stat = format!(
            "{pid} (python3 (x)) S {parent} {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 {start} 1000 10 0"
        );
        std::fs::write(d.join("stat"), stat).unwrap();
        std::fs::write(
            d.join("status"),
            format!("Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t0\t0\t0\n"),
        )
        .unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
    }

    /// Puts a directory where `<pid>/<file>` should be, so that reading it fails whoever runs
    /// the test (root reads any mode-000 file, so a permission bit would not do); its path.
    fn make_unreadable(&self, pid: u32, file: &str) -> PathBuf {
        let path = self.proc().join(format!("{pid}/{file}"));
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        path
    }

    fn remove(&self, pid: u32) {
        std::fs::remove_dir_all(self.proc().join(pid.to_string())).unwrap();
    }
}

impl Drop for ProcRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn docker_cgroup() -> String {
    format!("0::/system.slice/docker-{DOCKER_ID}.scope\n")
}

fn pod_cgroup() -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{K8S_ID}.scope\n",
        POD_UID.replace('-', "_")
    )
}

#[test]
fn owners_are_read_once_and_shared_between_processes_of_one_container() {
    let root = ProcRoot::new("shared");
    root.add(100, 5000, 1000, &docker_cgroup());
    root.add(101, 5001, 1000, &docker_cgroup());
    root.add(102, 5002, 0, "0::/system.slice/gpu-train.service\n");
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    procs.begin_tick();
    let a = procs.owner(100).unwrap();
    let b = procs.owner(101).unwrap();
    let c = procs.owner(102).unwrap();
    procs.end_tick();
    assert!(Arc::ptr_eq(&a, &b), "one container, one user: one owner");
    assert_eq!(a.user.as_deref(), Some("alice"));
    assert_eq!((a.uid, a.gid), (Some(1000), Some(1000)));
    assert_eq!(a.container.as_deref(), Some(&DOCKER_ID[..12]));
    assert_eq!(c.user.as_deref(), Some("root"));
    assert_eq!(c.unit.as_deref(), Some("gpu-train.service"));

    // Cached: the files may go, a pid seen on the last tick is not read again.
    root.remove(100);
    procs.begin_tick();
    assert_eq!(procs.owner(100), Some(a));
    procs.end_tick();
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 0);
}

#[test]
fn a_pid_that_vanished_before_it_was_read_is_counted_once_and_unknown() {
    let root = ProcRoot::new("vanished");
    std::fs::create_dir_all(root.proc()).unwrap();
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    for _ in 0..3 {
        procs.begin_tick();
        assert_eq!(procs.owner(4242), None);
        procs.end_tick();
    }
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 1, "remembered, not re-read each tick");
    assert!(stats.last_error().unwrap().contains("4242/stat"), "{:?}", stats.last_error());
}

#[test]
fn an_unreadable_file_gives_what_the_others_say() {
    let root = ProcRoot::new("unreadable");
    root.add(7, 1, 1000, &docker_cgroup());
    root.make_unreadable(7, "cgroup");
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    procs.begin_tick();
    let o = procs.owner(7).unwrap();
    procs.end_tick();
    assert_eq!(o.user.as_deref(), Some("alice"));
    assert_eq!(o.container_id, None);
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 1);
}

/// A file that failed may be readable later (a process caught mid-start, a transient error, a
/// proc root mounted late): the partly read owner is read again, whole, on the next tick; while
/// it keeps failing the re-reads come after 1, 2, 4 … ticks (at most `PARTIAL_REREAD_TICKS`), not
/// every tick; and an owner once complete is never read again.
#[test]
fn a_partly_read_owner_is_read_again_next_tick_then_less_often_and_a_complete_one_never() {
    use gpumon_core::attribution::procfs::PARTIAL_REREAD_TICKS;
    let root = ProcRoot::new("partial");
    root.add(7, 1, 1000, &docker_cgroup());
    let cgroup = root.make_unreadable(7, "cgroup");
    let stats = Arc::new(AttributionStats::default());
    let failures = || stats.proc_read_failures.load(Ordering::Relaxed);
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    let mut tick = || {
        procs.begin_tick();
        let o = procs.owner(7);
        procs.end_tick();
        o.expect("the user is known either way")
    };
    // Ticks 1..=4: read at 1, re-read at 2 (one tick later) and 4 (two later), all failing.
    for n in 1..=4 {
        assert_eq!(tick().container_id, None, "tick {n}");
    }
    // Fixed after tick 4's re-read: the next is due four ticks later, at tick 8.
    std::fs::remove_dir(&cgroup).unwrap();
    std::fs::write(&cgroup, docker_cgroup()).unwrap();
    for n in 5..=7 {
        assert_eq!(tick().container_id, None, "tick {n}: read again too early (the waits double)");
    }
    assert_eq!(failures(), 1);
    let whole = tick();
    assert_eq!(whole.container.as_deref(), Some(&DOCKER_ID[..12]), "read again at tick 8");
    assert_eq!(whole.user.as_deref(), Some("alice"));
    root.remove(7);
    for _ in 0..2 * PARTIAL_REREAD_TICKS {
        assert_eq!(tick(), whole);
    }
    assert_eq!(failures(), 1, "a complete owner is not read again");
}

/// #31: a process whose first read was partial — its cgroup readable but not its status (caught
/// while starting, or `status` briefly unreadable) — gets its whole owner on the next tick, not a
/// minute later; one that exited mid-read keeps what was read, counted once.
#[test]
fn a_partial_first_read_is_retried_on_the_next_tick() {
    let root = ProcRoot::new("partial-status");
    root.add(8, 1, 1000, &docker_cgroup());
    let status = root.make_unreadable(8, "status");
    root.add(9, 2, 1000, &docker_cgroup());
    root.make_unreadable(9, "status");
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    procs.begin_tick();
    let first = procs.owner(8).expect("the container is known");
    let exiting = procs.owner(9).expect("the container is known");
    procs.end_tick();
    assert_eq!((first.user.as_deref(), first.container.as_deref()), (None, Some(&DOCKER_ID[..12])));

    std::fs::remove_dir(&status).unwrap();
    std::fs::write(&status, "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t0\t0\t0\n").unwrap();
    root.remove(9); // exited after its cgroup was read
    procs.begin_tick();
    let whole = procs.owner(8).expect("known");
    let gone = procs.owner(9);
    procs.end_tick();
    assert_eq!(whole.user.as_deref(), Some("alice"), "read again, whole, on the next tick");
    assert_eq!(whole.container.as_deref(), Some(&DOCKER_ID[..12]));
    assert_eq!(gone, Some(exiting), "what was read of the exited process stays");
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 2, "one per process, not per attempt");
}

/// #31: bob's listed pid exits and alice's new process gets the same pid before the next tick —
/// NVML lists the pid on every tick, never missing. The new process is told apart by its start
/// time and read as alice's; bob's owner never labels it.
#[test]
fn a_pid_reused_between_two_ticks_gets_the_new_process_owner() {
    let root = ProcRoot::new("reuse-no-gap");
    root.add(77, 1000, 1000, &docker_cgroup());
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    let tick = |procs: &mut ProcOwners| {
        procs.begin_tick();
        let o = procs.owner(77);
        procs.end_tick();
        o.expect("known")
    };
    let bob = tick(&mut procs);
    assert_eq!(bob.uid, Some(1000));
    assert_eq!(tick(&mut procs), bob, "the same process: the same owner");
    root.remove(77);
    root.add(77, 1700, 0, "0::/system.slice/gpu-train.service\n");
    let next = tick(&mut procs);
    assert_eq!((next.uid, next.user.as_deref()), (Some(0), Some("root")), "{next:?}");
    assert_eq!(next.unit.as_deref(), Some("gpu-train.service"));
    assert_eq!(next.container, None);
    assert_eq!(tick(&mut procs), next);
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 0);
}

/// A re-read that fails again is not counted again (the counter counts processes, not
/// attempts) and keeps what was known — also when the process's files are gone altogether.
#[test]
fn a_re_read_that_fails_again_keeps_the_owner_and_is_not_counted_again() {
    use gpumon_core::attribution::procfs::PARTIAL_REREAD_TICKS;
    let root = ProcRoot::new("partial-again");
    root.add(7, 1, 1000, &docker_cgroup());
    root.make_unreadable(7, "cgroup");
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    let mut ticks = |n: u64| {
        let mut last = None;
        for _ in 0..n {
            procs.begin_tick();
            last = procs.owner(7);
            procs.end_tick();
        }
        last
    };
    let first = ticks(1).expect("the user is known");
    assert_eq!(first.user.as_deref(), Some("alice"));
    // Two re-reads: the cgroup file still fails.
    assert_eq!(ticks(2 * PARTIAL_REREAD_TICKS), Some(first.clone()));
    // Then every file goes (the process exited but is still listed): still the owner known.
    root.remove(7);
    assert_eq!(ticks(2 * PARTIAL_REREAD_TICKS), Some(first));
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 1, "counted at the first read only");
}

#[test]
fn a_reused_pid_is_told_apart_by_its_start_time_and_gone_pids_are_forgotten() {
    let root = ProcRoot::new("reuse");
    root.add(55, 1000, 1000, &docker_cgroup());
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    let tick = |procs: &mut ProcOwners, pids: &[u32]| {
        procs.begin_tick();
        let owners: Vec<_> = pids.iter().map(|&p| procs.owner(p)).collect();
        procs.end_tick();
        owners
    };
    let first = tick(&mut procs, &[55]).remove(0).unwrap();
    assert_eq!(first.user.as_deref(), Some("alice"));

    // Missing for a tick and back with the same start time: the same process, not re-read.
    tick(&mut procs, &[]);
    std::fs::write(root.proc().join("55/cgroup"), "0::/system.slice/other.service\n").unwrap();
    assert_eq!(tick(&mut procs, &[55])[0].as_ref(), Some(&first));

    // Missing for a tick and back with another start time: a new process under the old pid.
    tick(&mut procs, &[]);
    root.remove(55);
    root.add(55, 2000, 0, "0::/system.slice/gpu-train.service\n");
    let second = tick(&mut procs, &[55]).remove(0).unwrap();
    assert_eq!(second.user.as_deref(), Some("root"));
    assert_eq!(second.unit.as_deref(), Some("gpu-train.service"));

    // Gone for good: forgotten after a few ticks.
    for _ in 0..4 {
        tick(&mut procs, &[]);
    }
    assert!(procs.is_empty());
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 0);
}

// ---------------------------------------------------------------------------------------------
// The processor

fn gpu(index: u32, uuid: &str, pids: &[u32]) -> DeviceSample {
    let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(index, uuid, "NVIDIA H100 80GB HBM3")));
    for &pid in pids {
        let mut p = ProcessSample::new(pid);
        p.memory_used = Some(1 << 30);
        d.processes.push(p);
    }
    d
}

fn snapshot(devices: Vec<DeviceSample>) -> Snapshot {
    Snapshot::new(Arc::new(SystemInfo::new("node-1", "nvml")), devices)
}

fn pod(ns: &str, name: &str, container: &str) -> Arc<Owner> {
    let mut o = Owner::default();
    o.namespace = Some(ns.into());
    o.pod = Some(name.into());
    o.container = Some(container.into());
    Arc::new(o)
}

#[test]
fn device_owners_are_the_pods_then_the_distinct_process_owners() {
    let root = ProcRoot::new("processor");
    root.add(10, 1, 1000, &docker_cgroup());
    root.add(11, 2, 1000, &docker_cgroup());
    root.add(12, 3, 0, "0::/system.slice/gpu-train.service\n");
    root.add(20, 4, 0, &pod_cgroup());
    let mut attributor = AttributionConfig::new().with_proc_root(root.proc()).with_passwd_file(root.passwd()).build();
    let mut snap = snapshot(vec![gpu(0, "GPU-a", &[10, 11]), gpu(1, "GPU-b", &[10, 12]), gpu(2, "GPU-c", &[20])]);
    attributor.process(&mut snap);

    let [a, b, c] = &snap.devices[..] else { unreachable!() };
    assert_eq!(a.owners.len(), 1, "two processes of one container and user: one owner");
    let labels = a.owner_labels();
    assert_eq!(labels.pairs().collect::<Vec<_>>(), [("container", &DOCKER_ID[..12]), ("user", "alice")]);
    assert_eq!(a.processes[1].owner.as_ref().unwrap().container_id.as_deref(), Some(DOCKER_ID));

    // A GPU shared by a container of alice and a service of root.
    assert_eq!(b.owners.len(), 2);
    let labels = b.owner_labels();
    assert_eq!(labels.container, Some(&DOCKER_ID[..12]), "only one owner knows a container");
    assert_eq!(labels.user, Some(SHARED));
    assert_eq!(b.processes[1].owner_labels().user, Some("root"));

    // A pod's process seen through its cgroup only: the user, no container name.
    assert_eq!(c.owner_labels().pairs().collect::<Vec<_>>(), [("user", "root")]);
    assert_eq!(c.owners[0].pod_uid.as_deref(), Some(POD_UID));

    assert_eq!(snap.output::<gpumon_core::attribution::AttributionSummary>().cloned().unwrap().proc_read_failures, 0);
    assert_eq!(
        snap.output::<gpumon_core::attribution::AttributionSummary>().cloned().unwrap().kubelet_failures,
        None,
        "no kubelet source"
    );
}

#[test]
fn kubelet_allocations_name_the_pod_of_gpus_and_mig_instances() {
    let root = ProcRoot::new("kubelet");
    root.add(20, 4, 0, &pod_cgroup());
    let cache = AllocationCache::new();
    let stats = Arc::new(AttributionStats::default());
    let mut attributor = AttributionConfig::new()
        .with_proc_root(root.proc())
        .with_passwd_file(root.passwd())
        .with_allocations(cache.clone())
        .with_stats(stats.clone())
        .build();

    let mig_info = {
        let mut info = DeviceInfo::new(3, "MIG-m1", "NVIDIA A100 MIG 1g.10gb");
        info.mig = Some(MigInfo::new("GPU-parent", 1, 7, 0));
        info
    };
    let devices = || {
        vec![
            gpu(0, "GPU-a", &[20]),
            gpu(1, "GPU-b", &[]),
            DeviceSample::new(Arc::new(mig_info.clone())),
            gpu(2, "GPU-idx", &[]),
        ]
    };

    // Cache empty (the kubelet not answered yet): process owners only.
    let mut snap = snapshot(devices());
    attributor.process(&mut snap);
    assert_eq!(snap.devices[0].owner_labels().pairs().collect::<Vec<_>>(), [("user", "root")]);
    assert!(snap.devices[1].owners.is_empty());
    assert_eq!(
        snap.output::<gpumon_core::attribution::AttributionSummary>().cloned().unwrap().kubelet_failures,
        Some(0)
    );

    let mut alloc = Allocations::new();
    alloc.insert("GPU-a", pod("team-a", "train-0", "trainer"));
    // Two pods time-slicing one GPU (replica suffixes).
    alloc.insert("GPU-b::0", pod("team-a", "infer-0", "server"));
    alloc.insert("GPU-b::1", pod("team-a", "infer-1", "server"));
    alloc.insert("MIG-m1", pod("team-b", "notebook", "jupyter"));
    // A device plugin naming devices by index.
    alloc.insert("2", pod("team-c", "batch", "job"));
    cache.store(alloc);
    stats.kubelet_failures.fetch_add(3, Ordering::Relaxed);

    let mut snap = snapshot(devices());
    attributor.process(&mut snap);
    let labels = |i: usize| snap.devices[i].owner_labels().pairs().collect::<Vec<_>>();
    assert_eq!(labels(0), [("namespace", "team-a"), ("pod", "train-0"), ("container", "trainer"), ("user", "root")]);
    assert_eq!(labels(1), [("namespace", "team-a"), ("pod", SHARED), ("container", "server")]);
    assert_eq!(labels(2), [("namespace", "team-b"), ("pod", "notebook"), ("container", "jupyter")]);
    assert_eq!(labels(3), [("namespace", "team-c"), ("pod", "batch"), ("container", "job")]);
    assert_eq!(
        snap.output::<gpumon_core::attribution::AttributionSummary>().cloned().unwrap().kubelet_failures,
        Some(3)
    );

    // Exported as a host series per source.
    let mut failures = Vec::new();
    snap.visit_derived(|p| {
        if p.id() == Some(MetricId::AttributionFailures) {
            failures.push((p.labels[0], p.value.as_f64(), p.device));
        }
    });
    assert_eq!(failures, [("proc", 0.0, None), ("kubelet", 3.0, None)]);
}

#[test]
fn the_parent_pid_is_read_with_the_start_time_and_follows_a_new_parent() {
    // Two ranks a launcher (pid 150) started, and a process of another launch.
    let root = ProcRoot::new("parents");
    root.add_child(200, 5000, 1000, &docker_cgroup(), 150);
    root.add_child(201, 5001, 1000, &docker_cgroup(), 150);
    root.add_child(300, 6000, 1000, &docker_cgroup(), 290);
    let stats = Arc::new(AttributionStats::default());
    let mut procs = ProcOwners::new(root.proc(), root.passwd(), stats.clone());
    procs.begin_tick();
    for pid in [200, 201, 300] {
        procs.owner(pid);
    }
    procs.end_tick();
    assert_eq!(
        (procs.parent_pid(200), procs.parent_pid(201), procs.parent_pid(300)),
        (Some(150), Some(150), Some(290))
    );
    assert_eq!(procs.parent_pid(999), None, "never asked for");

    // The launcher died: its children now have another parent, read from the `stat` read at
    // every tick anyway (the owner is not read again).
    root.add_child(200, 5000, 1000, &docker_cgroup(), 1);
    procs.begin_tick();
    procs.owner(200);
    procs.end_tick();
    assert_eq!(procs.parent_pid(200), Some(1));

    // A `stat` that cannot be read keeps the last parent known.
    root.make_unreadable(201, "stat");
    procs.begin_tick();
    procs.owner(201);
    procs.end_tick();
    assert_eq!(procs.parent_pid(201), Some(150));
    assert_eq!(stats.proc_read_failures.load(Ordering::Relaxed), 0);
}

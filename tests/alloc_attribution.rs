//! Guards the cost claims of docs/attribution.md: once its processes are known, the attribution
//! stage reads only each pid's `stat` and allocates only each attributed device's `owners`
//! vector per tick, and
//! the encoders still allocate nothing per tick when every series carries owner labels.
//!
//! A counting global allocator counts the allocations of the *current thread* only (a
//! thread-local counter), as in tests/alloc_steady.rs.
#![cfg(all(feature = "stdout", feature = "prometheus", feature = "influxdb", feature = "otlp"))]

use std::collections::HashMap;
use std::sync::Arc;

use gpumon::core::attribution::{AttributionConfig, Owner};
use gpumon::core::{DeviceFilter, MetricSet, Processor, SampleRequest, Sampler, Snapshot};
use gpumon_mock::MockSampler;

#[path = "common/alloc.rs"]
mod counting;
use counting::{allocations, encoders, scrape, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Eight consecutive snapshots of an 8-GPU fleet with its processes.
fn snapshots() -> Vec<Snapshot> {
    let sampler = MockSampler::from_profile_name("h100x8").expect("built-in profile");
    let request = SampleRequest::new(MetricSet::default().with(gpumon::core::Family::Processes), DeviceFilter::all());
    (0..8).map(|_| sampler.sample(&request).expect("mock sample")).collect()
}

/// A proc root in a temp dir in which every pid of `snaps` is a process of one of two users,
/// half of them in a Docker container.
fn proc_root(snaps: &[Snapshot]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-alloc-attribution-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pids: std::collections::BTreeSet<u32> =
        snaps.iter().flat_map(|s| s.devices.iter().flat_map(|d| d.processes.iter().map(|p| p.pid))).collect();
    for (i, pid) in pids.into_iter().enumerate() {
        let d = dir.join("proc").join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("stat"), format!("{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid} 0 0"))
            .unwrap();
        let uid = if i % 2 == 0 { 0 } else { 1000 };
        std::fs::write(d.join("status"), format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")).unwrap();
        let cgroup = if i % 4 < 2 {
            "0::/system.slice/docker-9f2c4e6a8b0d1f3e5a7c9b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a3c5b7d9f2e.scope\n"
        } else {
            "0::/system.slice/train.service\n"
        };
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
    }
    std::fs::write(dir.join("passwd"), "root:x:0:0::/:/bin/sh\nalice:x:1000:1000::/:/bin/sh\n").unwrap();
    dir
}

#[test]
fn once_processes_are_known_the_stage_allocates_only_the_owner_lists() {
    let snaps = snapshots();
    let dir = proc_root(&snaps);
    let mut stage =
        AttributionConfig::new().with_proc_root(dir.join("proc")).with_passwd_file(dir.join("passwd")).build();
    // Warm-up: every pid read once.
    for s in &snaps {
        stage.process(&mut s.clone());
    }
    let mut copies: Vec<Snapshot> = (0..3).flat_map(|_| snaps.iter().cloned()).collect();
    let attributed_devices: usize =
        copies.iter().map(|s| s.devices.iter().filter(|d| !d.processes.is_empty()).count()).sum();
    // Each tick reads every pid's `stat` (a reused pid is another process), into reused
    // buffers: no allocation for that either.
    let n = allocations(|| {
        for s in &mut copies {
            stage.process(s);
        }
    });
    assert!(copies.iter().all(|s| s.devices.iter().all(|d| d.processes.iter().all(|p| p.owner.is_some()))));
    assert!(
        n as usize <= attributed_devices,
        "{n} allocations over {} ticks, {attributed_devices} attributed devices",
        copies.len()
    );
    assert_eq!(
        copies[0].output::<gpumon::core::attribution::AttributionSummary>().cloned().unwrap().proc_read_failures,
        0
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The snapshots with owners on every device and process, shared between ticks as the stage
/// shares them.
fn attributed(snaps: &[Snapshot]) -> Vec<Arc<Snapshot>> {
    let mut pod = Owner::default();
    pod.namespace = Some("team-a".into());
    pod.pod = Some("train-0".into());
    pod.container = Some("trainer".into());
    let pod = Arc::new(pod);
    let mut by_pid: HashMap<u32, Arc<Owner>> = HashMap::new();
    snaps
        .iter()
        .map(|s| {
            let mut s = s.clone();
            for d in &mut s.devices {
                d.owners = vec![pod.clone()];
                for p in &mut d.processes {
                    let owner = by_pid
                        .entry(p.pid)
                        .or_insert_with(|| {
                            let mut o = Owner::default();
                            o.user = Some(if p.pid % 2 == 0 { "root" } else { "alice" }.into());
                            Arc::new(o)
                        })
                        .clone();
                    if !d.owners.iter().any(|o| Arc::ptr_eq(o, &owner)) {
                        d.owners.push(owner.clone());
                    }
                    p.owner = Some(owner);
                }
            }
            Arc::new(s)
        })
        .collect()
}

#[test]
fn encoders_allocate_nothing_per_tick_with_owner_labels() {
    let snaps = attributed(&snapshots());
    assert!(snaps[0].devices.iter().any(|d| !d.processes.is_empty()), "the fleet has processes");
    for (encoder, per_tick) in encoders(&snaps) {
        assert_eq!(per_tick, 0.0, "{encoder}");
    }

    // A scrape keeps the few allocations it has without owners (tests/alloc_steady.rs): the
    // owner labels go into the same per-scrape label buffer.
    let (per_scrape, buf) = scrape(&snaps);
    assert!(buf.contains(",pod=\"train-0\","), "{buf}");
    assert!(per_scrape <= 12.0, "{per_scrape} allocations per scrape with owner labels");
}

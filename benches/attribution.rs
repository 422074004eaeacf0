//! Cost of the attribution stage per tick for 8 and 64 mock devices with their processes, next
//! to the bare mock sample: the steady state (every pid already read, as from the second tick
//! of a process on) and the first sight of every pid (three small files per process, from a
//! fixture proc root in a temp dir).
//!
//! `cargo bench --bench attribution`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumon::core::attribution::AttributionConfig;
use gpumon::core::{Family, MetricSet, Processor, Sampler, Snapshot};

mod common;

/// A proc root where every pid of `snaps` is a containerised process of root.
fn proc_root(snaps: &[Snapshot], devices: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-bench-attribution-{devices}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for s in snaps {
        for pid in s.devices.iter().flat_map(|d| d.processes.iter().map(|p| p.pid)) {
            let d = dir.join("proc").join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), format!("{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid} 0 0"))
                .unwrap();
            std::fs::write(d.join("status"), "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n").unwrap();
            std::fs::write(
                d.join("cgroup"),
                "0::/system.slice/docker-9f2c4e6a8b0d1f3e5a7c9b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a3c5b7d9f2e.scope\n",
            )
            .unwrap();
        }
    }
    std::fs::write(dir.join("passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
    dir
}

fn attribution(c: &mut Criterion) {
    let mut group = common::group(c, "attribution", 3);
    for devices in [8usize, 64] {
        let (sampler, request) =
            common::sampler_baseline_of(&mut group, devices, MetricSet::default().with(Family::Processes));
        let snaps: Vec<Snapshot> = (0..16).map(|_| sampler.sample(&request).unwrap()).collect();
        let dir = proc_root(&snaps, devices);
        let config = AttributionConfig::new().with_proc_root(dir.join("proc")).with_passwd_file(dir.join("passwd"));

        let mut stage = config.clone().build();
        for s in &snaps {
            stage.process(&mut s.clone());
        }
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("process_steady", devices), &devices, |b, _| {
            b.iter_batched_ref(
                || {
                    i += 1;
                    snaps[i % snaps.len()].clone()
                },
                |s| stage.process(s),
                criterion::BatchSize::SmallInput,
            )
        });

        group.bench_with_input(BenchmarkId::new("process_first_sight", devices), &devices, |b, _| {
            b.iter_batched_ref(
                || (config.clone().build(), snaps[0].clone()),
                |(stage, s)| stage.process(s),
                criterion::BatchSize::SmallInput,
            )
        });
        let _ = std::fs::remove_dir_all(dir);
    }
    group.finish();
}

criterion_group!(benches, attribution);
criterion_main!(benches);

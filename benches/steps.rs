//! Cost of marking a training step: one `TrainingRun::step()` side by side with a bare atomic
//! store (the floor of any lock-free hand-off), and one step over the agent's steps socket —
//! a client's `write` of one JSON line until the agent has recorded it — side by side with the
//! cost of that `write` alone.
//!
//! `cargo bench --bench steps`

use std::hint::black_box;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::steps::socket::{SocketConfig, StepSocket};
use gpumon::core::steps::{StepConfig, StepTracker};

/// Writes step `step` of `job`'s rank 0 to `socket` as the one JSON line a client sends, built
/// in `line` (reused: no allocation per mark).
fn mark(socket: &mut UnixStream, line: &mut Vec<u8>, job: &str, step: u64) {
    line.clear();
    writeln!(line, "{{\"job\":\"{job}\",\"rank\":0,\"step\":{step}}}").unwrap();
    socket.write_all(line).unwrap();
}

fn steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    group.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));

    let (_tracker, registry) = StepTracker::new(StepConfig::default()).unwrap();
    let run = registry.run("bench", Some(0)).unwrap();
    let mut n = 0u64;
    group.bench_function("TrainingRun::step", |b| {
        b.iter(|| {
            n += 1;
            run.step(black_box(n)).unwrap();
        })
    });
    let cell = AtomicU64::new(0);
    let mut m = 0u64;
    group.bench_function("bare AtomicU64::store", |b| {
        b.iter(|| {
            m += 1;
            cell.store(black_box(m), Ordering::Release);
        })
    });

    // Over the socket: the agent side runs on its own runtime, as in the agent.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("gpumon-bench-steps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("steps.sock");
    let (_tracker, registry) = StepTracker::new(StepConfig::default()).unwrap();
    let socket = rt.block_on(async { StepSocket::bind(SocketConfig::new(&path), registry.clone()) }).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(socket.serve(async move {
        let _ = stopped.await;
    }));
    let remote = registry.run("remote", Some(0)).unwrap();
    let mut client = UnixStream::connect(&path).unwrap();
    let mut k = 0u64;
    let mut line = Vec::with_capacity(64);
    group.bench_function("socket: write until recorded", |b| {
        b.iter(|| {
            k += 1;
            mark(&mut client, &mut line, "remote", k);
            let mut spins = 0u32;
            while remote.last_step() != Some(k) {
                // A refused mark is never recorded: fail instead of spinning for ever.
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1 << 20) {
                    assert_eq!(registry.rejections().unwrap().total(), 0, "the agent refused a mark");
                }
                std::hint::spin_loop();
            }
        })
    });
    // The client's share: a write the agent never reads (a second connection the server also
    // serves, marking another run), without waiting.
    let other = registry.run("writer", Some(0)).unwrap();
    let mut writer = UnixStream::connect(&path).unwrap();
    let mut w = 0u64;
    group.bench_function("socket: client write only", |b| {
        b.iter(|| {
            w += 1;
            mark(&mut writer, &mut line, "writer", w);
        })
    });
    group.finish();
    // Let the server drain before checking nothing was dropped.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while other.last_step() != Some(w) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(registry.rejections().unwrap().total(), 0, "every line was well formed");
    let _ = stop.send(());
    rt.block_on(server).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, steps);
criterion_main!(benches);

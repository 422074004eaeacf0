//! Cost of the diagnosis stage per tick for 8 and 64 mock devices, measured side by side with
//! the bare mock sample and a whole tick through the runtime, so its share reads as a ratio.
//! Two cases: healthy training (nothing raised) and every GPU with an active finding (the
//! steady state of a diagnosed problem). A third, `process_first_window_100ms`, is what an agent
//! pays in its first window: at 100 ms the 30 s window is 300 ticks per GPU, and until it is full
//! every tick writes window memory never touched before (page faults, cache misses). A fourth,
//! `process_cold_100ms`, is a tick as an agent sleeping between ticks runs it: the diagnoser's
//! state evicted from every cache (a 64 MiB sweep before each tick, not timed), the snapshot's
//! most-read fields warmed again (the sampler has just written it; the rest of it stays cold). Hot loops hide what a 100 ms sleep costs: there, the lines
//! and pages a tick touches count more than its instructions.
//!
//! `cargo bench --bench diagnose`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumon::core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon::core::{Agent, DeviceFilter, MetricSet, Processor, ProcessorContext, SampleRequest, Sampler, Snapshot};
use gpumon::mock::MockSampler;

mod common;

fn diagnoser() -> Diagnoser {
    diagnoser_at(Duration::from_secs(1))
}

fn diagnoser_at(interval: Duration) -> Diagnoser {
    let mut d = Diagnoser::new(DiagnoseConfig::default()).unwrap();
    d.attach(&ProcessorContext::new(interval));
    d
}

/// Sixteen consecutive ticks; with `full`, every GPU's memory at 97 % (near_oom raised).
fn ticks(sampler: &MockSampler, full: bool) -> Vec<Snapshot> {
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    (0..16)
        .map(|_| {
            let mut s = sampler.sample(&request).unwrap();
            if full {
                for d in &mut s.devices {
                    d.memory.used = d.memory.total.map(|t| t / 100 * 97);
                }
            }
            s
        })
        .collect()
}

/// Writes one byte per cache line of `sweep` (64 MiB: more than any last-level cache, and
/// 16 384 pages, more than any TLB holds).
fn evict(sweep: &mut [u8]) {
    for line in sweep.chunks_mut(64) {
        line[0] = line[0].wrapping_add(1);
    }
    std::hint::black_box(&sweep);
}

/// Reads what diagnosis reads of a snapshot, as the sampler has just written it.
fn warm(snapshot: &Snapshot) {
    for d in &snapshot.devices {
        std::hint::black_box((
            d.info.uuid.as_bytes().iter().map(|b| u32::from(*b)).sum::<u32>(),
            d.utilization.gpu,
            d.memory.used,
            d.windows.gpu_utilization.map(|w| w.mean),
            d.power.usage_watts,
            d.clocks.sm,
            d.pcie.tx_bytes_per_second,
            d.xid_errors.len(),
        ));
    }
}

fn diagnose(c: &mut Criterion) {
    let rt = common::runtime();
    let mut group = common::group(c, "diagnose", 3);
    for devices in [8usize, 64] {
        let (sampler, _) = common::sampler_baseline(&mut group, devices);

        for (case, full) in [("process_healthy", false), ("process_findings_active", true)] {
            let mut snapshots = ticks(&sampler, full);
            let mut d = diagnoser();
            // Past the window: findings raised, steady state.
            for i in 0..64 {
                d.process(&mut snapshots[i % 16]);
            }
            let mut i = 0;
            group.bench_with_input(BenchmarkId::new(case, devices), &devices, |b, _| {
                b.iter(|| {
                    i += 1;
                    d.process(&mut snapshots[i % 16]);
                })
            });
        }

        // Fresh diagnosers, each fed its first window of ticks; all kept alive until the batch
        // ends, so each one's window is new memory (as in a new agent), not the last one's.
        let mut snapshots = ticks(&sampler, false);
        group.bench_with_input(BenchmarkId::new("process_first_window_100ms", devices), &devices, |b, _| {
            b.iter_custom(|iters| {
                let window = diagnoser_at(Duration::from_millis(100)).window_ticks() as u64;
                let mut alive = Vec::new();
                let mut took = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let mut d = diagnoser_at(Duration::from_millis(100));
                    let n = (iters - done).min(window);
                    let start = Instant::now();
                    for i in 0..n {
                        d.process(&mut snapshots[i as usize % 16]);
                    }
                    took += start.elapsed();
                    alive.push(d);
                    done += n;
                }
                took
            })
        });

        // Past the window at 100 ms (full rings), then one tick at a time with cold caches.
        let mut d = diagnoser_at(Duration::from_millis(100));
        for i in 0..d.window_ticks() + 16 {
            d.process(&mut snapshots[i % 16]);
        }
        let mut sweep = vec![0u8; 64 << 20];
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("process_cold_100ms", devices), &devices, |b, _| {
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    evict(&mut sweep);
                    i += 1;
                    let snapshot = &mut snapshots[i % 16];
                    warm(snapshot);
                    let start = Instant::now();
                    d.process(snapshot);
                    took += start.elapsed();
                }
                took
            })
        });

        for (case, with) in [("runtime_tick_without_diagnosis", false), ("runtime_tick_with_diagnosis", true)] {
            let handle = rt.block_on(async {
                let mut b = Agent::builder(common::sampler(devices)).scheduled(false).sink(gpumon::mock::NullSink);
                if with {
                    b = b.processor(diagnoser());
                }
                b.spawn().unwrap()
            });
            group.bench_with_input(BenchmarkId::new(case, devices), &devices, |b, _| {
                b.iter(|| rt.block_on(handle.flush(Duration::from_secs(10))).unwrap())
            });
            rt.block_on(handle.shutdown(Duration::from_secs(5))).unwrap();
        }
    }
    group.finish();
}

criterion_group!(benches, diagnose);
criterion_main!(benches);

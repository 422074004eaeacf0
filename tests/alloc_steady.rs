//! Guards the allocation claims of BENCHMARKS.md: once a snapshot exists, the encoders and the
//! sink side of the tick path allocate nothing per tick in the steady state (their buffers are
//! reused), whatever the fleet size; nor does the diagnosis stage while no finding is raised or
//! cleared, but on the ticks that format a held finding's evidence again (every third of the
//! window).
//!
//! A counting global allocator counts the allocations of the *current thread* only (a
//! thread-local counter), so the test harness's other threads cannot disturb the figures.
#![cfg(all(feature = "stdout", feature = "prometheus", feature = "influxdb", feature = "otlp"))]

use std::sync::Arc;
use std::time::Duration;

use gpumon::core::diagnose::{DiagnoseConfig, Diagnoser, Sampling};
use gpumon::core::report::RunReport;
use gpumon::core::{DeviceFilter, MetricSet, Processor, ProcessorContext, SampleRequest, Sampler, Sink, Snapshot};
use gpumon::sinks::prometheus::PrometheusSink;
use gpumon::sinks::stdout::{StdoutFormat, StdoutSink};
use gpumon_mock::MockSampler;

#[path = "common/alloc.rs"]
mod counting;
use counting::{allocations, encoders, scrape, steady, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Eight consecutive snapshots of `profile` (different values, like consecutive ticks).
fn snapshots(profile: &str) -> Vec<Arc<Snapshot>> {
    let sampler = MockSampler::from_profile_name(profile).expect("built-in profile");
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    (0..8).map(|_| Arc::new(sampler.sample(&request).expect("mock sample"))).collect()
}

const FLEETS: [&str; 2] = ["h100x8", "h100x64"];

#[test]
fn encoders_allocate_nothing_per_tick_once_their_buffers_have_grown() {
    for fleet in FLEETS {
        let snaps = snapshots(fleet);
        for (encoder, per_tick) in encoders(&snaps) {
            assert_eq!(per_tick, 0.0, "{fleet}: {encoder}");
        }
    }
}

#[test]
fn the_sink_side_of_a_tick_allocates_only_the_boxed_export_future() {
    // The sinks' `export` is an `async_trait` method: each call boxes its future (one
    // allocation, whatever the fleet). Anything beyond that would be per-tick work of the sink.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for fleet in FLEETS {
        let snaps = snapshots(fleet);
        for format in [StdoutFormat::Human, StdoutFormat::Json] {
            let mut sink = StdoutSink::with_writer(format, tokio::io::sink());
            let per_tick = steady(&snaps, |s| rt.block_on(sink.export(s.clone())).unwrap());
            assert_eq!(per_tick, 1.0, "{fleet}: stdout sink export, {format:?}");
        }

        // Prometheus: a tick only stores the snapshot; the exposition is rendered per scrape.
        let mut prom = PrometheusSink::builder().build().unwrap();
        let per_tick = steady(&snaps, |s| rt.block_on(prom.export(s.clone())).unwrap());
        assert_eq!(per_tick, 1.0, "{fleet}: Prometheus sink export");
    }
}

#[test]
fn an_inline_export_allocates_nothing_per_tick() {
    // On the sampling thread there is no future to box: storing (Prometheus) or formatting into
    // the reused buffer and writing it (stdout to a file) allocates nothing once warm.
    for fleet in FLEETS {
        let snaps = snapshots(fleet);
        for format in [StdoutFormat::Human, StdoutFormat::Json] {
            let mut sink = StdoutSink::with_file(format, std::fs::File::create("/dev/null").unwrap());
            assert!(sink.exports_inline());
            let per_tick = steady(&snaps, |s| {
                sink.export_inline(s).unwrap();
            });
            assert_eq!(per_tick, 0.0, "{fleet}: stdout sink inline export, {format:?}");
        }
        let mut prom = PrometheusSink::builder().build().unwrap();
        assert!(prom.exports_inline());
        let per_tick = steady(&snaps, |s| {
            prom.export_inline(s).unwrap();
        });
        assert_eq!(per_tick, 0.0, "{fleet}: Prometheus sink inline export");
    }
}

#[test]
fn a_prometheus_scrape_allocates_a_constant_few_whatever_the_fleet() {
    // The render keeps a small sort scratch per scrape (label prefixes, point order): a fixed
    // number of allocations, not one per device or per series.
    let mut per_scrape = Vec::new();
    for fleet in FLEETS {
        per_scrape.push(scrape(&snapshots(fleet)).0);
    }
    assert!(per_scrape[0] <= 12.0, "8 GPUs: {} allocations per scrape", per_scrape[0]);
    assert_eq!(per_scrape[0], per_scrape[1], "allocations per scrape, 8 vs 64 GPUs");
}

#[test]
fn diagnosis_allocates_nothing_per_tick_while_no_finding_is_raised_or_cleared() {
    // A raise or a clear builds the finding's text and a new active list (an event, a few
    // allocations); a tick that changes nothing reads the snapshot, updates the windows and
    // shares the unchanged lists. Both a healthy fleet and one whose every GPU holds a finding.
    for fleet in FLEETS {
        for findings_held in [false, true] {
            let mut ticks: Vec<Snapshot> = snapshots(fleet).iter().map(|s| (**s).clone()).collect();
            if findings_held {
                // Memory 97 % full on every GPU: the memory-pressure finding holds every tick.
                for s in &mut ticks {
                    for d in &mut s.devices {
                        d.memory.used = d.memory.total.map(|t| t / 100 * 97);
                    }
                }
            }
            let len = ticks.len();
            let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).unwrap();
            diagnoser.attach(&ProcessorContext::new(Duration::from_secs(1)));
            // Past the 30-tick window, so that what is raised has been raised.
            for i in 0..64 {
                diagnoser.process(&mut ticks[i % len]);
            }
            let raised = ticks[0].output::<gpumon::core::Diagnosis>().map_or(0, |d| d.active.len());
            if findings_held {
                assert!(raised >= ticks[0].devices.len(), "{fleet}: {raised} findings raised, one per GPU expected");
            } else {
                assert_eq!(raised, 0, "{fleet}: healthy fleet");
            }
            // The snapshot's previous diagnosis is dropped by the assignment, not allocated.
            let n = per_tick(|i| diagnoser.process(&mut ticks[i % len]));
            if findings_held {
                only_on_refresh_ticks(&n, diagnoser.evidence_refresh_ticks(), ticks[0].devices.len(), fleet);
            } else {
                assert_eq!(n, [0; 48], "{fleet}: diagnosis, healthy fleet");
            }
        }
    }
}

/// The allocations of each of 48 ticks.
fn per_tick(mut tick: impl FnMut(usize)) -> [u64; 48] {
    let mut n = [0; 48];
    for (i, n) in n.iter_mut().enumerate() {
        *n = allocations(|| tick(i));
    }
    n
}

/// Ticks allocate only every `refresh` ticks, when each held finding's evidence is formatted
/// again (one string per GPU; the list is rebuilt only when a text changed), and never more
/// than two allocations per GPU there.
fn only_on_refresh_ticks(n: &[u64; 48], refresh: usize, gpus: usize, fleet: &str) {
    assert_eq!(refresh, 10, "a third of the 30-tick window");
    let allocating: Vec<usize> = (0..48).filter(|&i| n[i] > 0).collect();
    assert!(!allocating.is_empty() && allocating.len() <= 48usize.div_ceil(refresh), "{fleet}: {n:?}");
    assert!(allocating.windows(2).all(|w| w[1] - w[0] == refresh), "{fleet}: {n:?}");
    assert!(n.iter().all(|&k| k <= 2 * gpus as u64), "{fleet}: {n:?}");
}

#[test]
fn the_run_report_allocates_nothing_per_tick_while_findings_are_held() {
    // The report charges every held finding its lost time on each tick (the overview's time
    // lost per cause): that bookkeeping must stay allocation-free, like the diagnosis before it.
    for fleet in FLEETS {
        let mut ticks: Vec<Snapshot> = snapshots(fleet).iter().map(|s| (**s).clone()).collect();
        for s in &mut ticks {
            for d in &mut s.devices {
                d.memory.used = d.memory.total.map(|t| t / 100 * 97);
            }
        }
        let len = ticks.len();
        let context = ProcessorContext::new(Duration::from_secs(1));
        let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).unwrap();
        diagnoser.attach(&context);
        let (report, handle) = RunReport::new();
        let mut report = report
            .with_diagnosis(&DiagnoseConfig::default(), Sampling::new(Duration::from_secs(1), MetricSet::default()));
        report.attach(&context);
        let mut tick = |i: usize| {
            diagnoser.process(&mut ticks[i % len]);
            report.process(&mut ticks[i % len]);
        };
        for i in 0..64 {
            tick(i);
        }
        let n = per_tick(&mut tick);
        only_on_refresh_ticks(&n, 10, ticks[0].devices.len(), fleet);
        let r = handle.report();
        let held = r.gpus.iter().filter(|g| g.findings.iter().any(|f| f.active_at_exit)).count();
        assert_eq!(held, r.gpus.len(), "{fleet}: a finding held on every GPU");
        assert!(r.overview.main_cause.is_some());
    }
}

#[cfg(feature = "remote-write")]
#[test]
fn a_remote_write_encode_allocates_a_constant_few_whatever_the_fleet() {
    use gpumon::sinks::remote_write::encode::Encoder;
    use gpumon::sinks::remote_write::RemoteWriteConfig;
    // The series walk keeps the scrape's small per-snapshot scratch (point order, the info
    // series' CUDA version); the encoder's own buffers (device labels, one series' labels, the
    // request) are kept between snapshots. Nothing per device or per series.
    let mut per_snapshot = Vec::new();
    for fleet in FLEETS {
        let snaps = snapshots(fleet);
        let mut encoder = Encoder::from_config(&RemoteWriteConfig::new("http://127.0.0.1:9/api/v1/write"));
        let mut body = Vec::new();
        per_snapshot.push(steady(&snaps, |s| {
            body.clear();
            assert!(encoder.encode_snapshot(s, &mut body) > 0);
        }));
    }
    assert!(per_snapshot[0] <= 8.0, "8 GPUs: {} allocations per snapshot", per_snapshot[0]);
    assert_eq!(per_snapshot[0], per_snapshot[1], "allocations per snapshot, 8 vs 64 GPUs");
}

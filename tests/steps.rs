//! Training steps end to end: a scripted training loop marks steps against an agent sampling the
//! mock, and every reported step's figures are checked against the snapshots it took; marks
//! from other processes over the steps socket, including garbage and floods.
#![cfg(feature = "mock")]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gpumon::core::steps::socket::{SocketConfig, StepSocket, MAX_LINE};
use gpumon::core::steps::{Rejection, StepConfig, StepError, StepReport, StepTracker};
use gpumon::core::{Agent, AgentHandle, DeviceSample, SinkOptions, Snapshot};
use gpumon_mock::test_kit::TempDir;
use gpumon_mock::{MockSampler, RecordingSink};

const INTERVAL: Duration = Duration::from_millis(100);

fn agent(every_n: u64) -> (AgentHandle, RecordingSink, gpumon::core::steps::StepRegistry) {
    let (tracker, steps) = StepTracker::new(StepConfig::every_n(every_n)).unwrap();
    let rec = RecordingSink::new("rec");
    let handle = Agent::builder(MockSampler::from_profile_name("h100x8").unwrap())
        .interval(INTERVAL)
        .processor(tracker)
        .sink_with(rec.clone(), SinkOptions::default().capacity(10_000))
        .spawn()
        .unwrap();
    (handle, rec, steps)
}

/// Every step reported in `snapshots`, with the snapshot that reported it.
fn reported(snapshots: &[Arc<Snapshot>], job: &str) -> Vec<(Arc<Snapshot>, StepReport)> {
    let mut out = Vec::new();
    for s in snapshots {
        let Some(run) = s.output::<gpumon::core::steps::Steps>().and_then(|st| st.runs.iter().find(|r| r.job == job))
        else {
            continue;
        };
        for r in &run.reported {
            out.push((Arc::clone(s), r.clone()));
        }
    }
    out
}

fn util(d: &DeviceSample) -> (Option<f64>, Option<f64>) {
    let w = d.windows.gpu_utilization;
    (w.map(|w| w.mean).or(d.utilization.gpu), w.map(|w| w.max).or(d.utilization.gpu))
}

/// The share of `sample`'s period (from the sample before it) before the latest of `marks`
/// within it; `None` when no mark falls within it.
fn share_before_latest_mark(all: &[Arc<Snapshot>], sample: &Snapshot, marks: &[SystemTime]) -> Option<f64> {
    let prev = all.iter().find(|s| s.seq + 1 == sample.seq)?;
    let (from, to) = (prev.taken_at, sample.taken_at);
    let mark = marks.iter().filter(|m| **m > from && **m <= to).max()?;
    Some(mark.duration_since(from).ok()?.as_secs_f64() / to.duration_since(from).ok()?.as_secs_f64())
}

/// What the module docs promise, recomputed from the snapshots the report names and the marks'
/// times (`marks`, as the loop read the clock after each mark): the sample covering the step's
/// end counts by the share of its period before the last mark it holds, the one covering its
/// start (when the step began in an earlier sample) by the rest; a step within one sample takes
/// it whole.
fn check_figures(all: &[Arc<Snapshot>], report: &StepReport, marks: &[SystemTime], check_mean: bool) {
    let by_seq = |seq: u64| all.iter().find(|s| s.seq == seq).unwrap_or_else(|| panic!("snapshot {seq} missing"));
    let taken: Vec<&Arc<Snapshot>> = (report.first_seq..=report.last_seq).map(by_seq).collect();
    let before = all.iter().find(|s| s.seq + 1 == report.first_seq);
    assert_eq!(report.devices.len(), 8, "step {}", report.step);
    let weights: Vec<f64> = taken
        .iter()
        .map(|s| {
            if report.first_seq == report.last_seq {
                return 1.0;
            }
            let share = share_before_latest_mark(all, s, marks);
            if s.seq == report.last_seq {
                share.unwrap_or(1.0)
            } else if s.seq == report.first_seq {
                share.map_or(1.0, |before| 1.0 - before)
            } else {
                1.0
            }
        })
        .collect();
    for gpu in &report.devices {
        let samples: Vec<&DeviceSample> = taken.iter().map(|s| s.device(&gpu.uuid).unwrap()).collect();
        let weighted: Vec<(f64, f64)> =
            samples.iter().zip(&weights).filter_map(|(d, w)| util(d).0.map(|u| (u * w, *w))).collect();
        let want_mean = weighted.iter().map(|p| p.0).sum::<f64>() / weighted.iter().map(|p| p.1).sum::<f64>();
        let want_max = samples.iter().filter_map(|d| util(d).1).fold(f64::MIN, f64::max);
        let want_peak = samples.iter().filter_map(|d| d.memory.used).max();
        let step = report.step;
        // The loop's clock is read a few microseconds after the tracker's: the weights agree to
        // about 1e-4 at a 100 ms interval.
        let got = gpu.utilization_mean.unwrap();
        assert!(!check_mean || (got - want_mean).abs() < 1e-3, "step {step} mean {got} vs {want_mean}");
        assert_eq!(gpu.utilization_max, Some(want_max), "step {step} max");
        assert_eq!(gpu.memory_peak_bytes, want_peak, "step {step} peak memory");
        match before {
            Some(b) => {
                let base = b.device(&gpu.uuid).unwrap().power.energy_joules.unwrap();
                let last = samples.last().unwrap().power.energy_joules.unwrap();
                let covered = taken.last().unwrap().taken_at.duration_since(b.taken_at).unwrap();
                let share = (report.duration.as_secs_f64() / covered.as_secs_f64()).min(1.0);
                let want = (last - base) * share;
                let got = gpu.energy_joules.unwrap();
                assert!((got - want).abs() <= 1e-6 * want.max(1.0), "step {step} energy {got} vs {want}");
            }
            None => assert_eq!(gpu.energy_joules, None, "no baseline before the first sample"),
        }
    }
}

/// A scripted loop: steps of 250, 330, 180 ms (longer than the interval) then ten of 30 ms
/// (shorter). Every step is reported once, at the tick after its mark, with the figures of
/// exactly the samples overlapping it (those covering a mark split by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_step_figures_equal_the_samples_in_each_step() {
    let (handle, rec, steps) = agent(1);
    let mut stream = handle.subscribe();
    stream.recv().await.unwrap();
    let run = steps.run("train", Some(0)).unwrap();
    let durations: Vec<u64> = [250, 330, 180].into_iter().chain(std::iter::repeat_n(30, 10)).collect();
    let started = Instant::now();
    let loop_thread = std::thread::spawn(move || {
        let mut marks = Vec::new();
        for (i, ms) in durations.iter().enumerate() {
            std::thread::sleep(Duration::from_millis(*ms));
            let before = SystemTime::now();
            run.step(i as u64 + 1).unwrap();
            marks.push((before, SystemTime::now()));
        }
        marks
    });
    let marks = loop_thread.join().unwrap();
    let marked_for = started.elapsed();
    // Three ticks after the last mark (a fresh subscription: the old one holds a backlog), so
    // that the last mark is read.
    let mut stream = handle.subscribe();
    for _ in 0..3 {
        stream.recv().await.unwrap();
    }
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
    let all = rec.snapshots();
    let reps = reported(&all, "train");
    let numbers: Vec<u64> = reps.iter().map(|(_, r)| r.step).collect();
    assert_eq!(numbers, (1..=13).collect::<Vec<_>>(), "every step reported once, in order");
    for (snap, r) in &reps {
        assert_eq!(r.last_seq, snap.seq, "step {}: its figures end with the sample that covers its end", r.step);
        // A sample taken while `step()` ran may or may not hold the mark: its weights are not
        // known here (the odds: a few microseconds in 100 ms, per mark).
        let ambiguous = all.iter().any(|s| marks.iter().any(|(b, a)| s.taken_at >= *b && s.taken_at <= *a));
        check_figures(&all, r, &marks.iter().map(|(_, a)| *a).collect::<Vec<_>>(), !ambiguous);
    }
    // Steps longer than the interval span several samples; consecutive steps share the sample
    // covering the boundary.
    for w in reps.windows(2) {
        let (a, b) = (&w[0].1, &w[1].1);
        if a.last_seq != b.last_seq {
            assert_eq!(b.first_seq, a.last_seq, "step {} starts in the sample where step {} ended", b.step, a.step);
        }
    }
    assert!(reps[1].1.last_seq > reps[1].1.first_seq, "a 330 ms step spans several 100 ms samples");
    // The short steps: several end in one interval and take that sample alone (all but the
    // first of each group, which began in an earlier one), each with its own duration.
    let short = &reps[3..];
    let mut shared = 0;
    for w in short.windows(2) {
        if w[0].1.last_seq == w[1].1.last_seq {
            shared += 1;
            assert_eq!((w[1].1.first_seq, w[1].1.last_seq), (w[1].1.last_seq, w[1].1.last_seq));
        }
    }
    // Each with its own duration (the marks' times are kept), not the interval's mean.
    for (_, r) in short {
        let ms = r.duration.as_secs_f64() * 1000.0;
        assert!((30.0..100.0).contains(&ms), "step {} of 30 ms took {ms} ms", r.step);
    }
    assert!(shared >= 3, "30 ms steps at a 100 ms interval: several per sample ({shared})");
    // Durations add up to the loop's time (the first step counts from run()).
    let total: Duration = reps.iter().map(|(_, r)| r.duration).sum();
    let diff = total.as_secs_f64() - marked_for.as_secs_f64();
    assert!(diff.abs() < 0.05, "durations sum to {total:?}, the loop ran {marked_for:?}");
    assert!(reps[1].1.duration >= Duration::from_millis(330) && reps[1].1.duration < Duration::from_millis(400));
    // The gauges: last step and the last reported figures stay on later snapshots.
    let last =
        all.last().unwrap().output::<gpumon::core::steps::Steps>().unwrap().run("train", Some(0)).unwrap().clone();
    assert_eq!(last.last_step, Some(13));
    assert!(last.reported.is_empty());
    assert_eq!(last.last.as_ref().map(|r| r.step), Some(13));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_n_reports_every_nth_step_and_tracks_all() {
    let (handle, rec, steps) = agent(4);
    let mut stream = handle.subscribe();
    stream.recv().await.unwrap();
    let run = steps.run("train", None).unwrap();
    std::thread::spawn(move || {
        for i in 1..=18u64 {
            std::thread::sleep(Duration::from_millis(40));
            run.step(i).unwrap();
        }
    })
    .join()
    .unwrap();
    let mut stream = handle.subscribe();
    for _ in 0..3 {
        stream.recv().await.unwrap();
    }
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
    let all = rec.snapshots();
    let numbers: Vec<u64> = reported(&all, "train").iter().map(|(_, r)| r.step).collect();
    assert_eq!(numbers, vec![4, 8, 12, 16]);
    let last = all.last().unwrap().output::<gpumon::core::steps::Steps>().unwrap().runs[0].clone();
    assert_eq!(last.last_step, Some(18), "the step gauge follows every step");
    assert_eq!(last.last.map(|r| r.step), Some(16), "the figures, the last reported one");
    assert!(last.last_duration.is_some());
}

/// Four threads mark one run: the highest step wins, the loser of a race gets an error, and the
/// agent sees the final step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_of_one_run() {
    let (handle, rec, steps) = agent(1);
    let run = steps.run("train", Some(3)).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let run = run.clone();
            std::thread::spawn(move || {
                let mut refused = 0;
                for i in 0..2_000u64 {
                    match run.step(i * 4 + t) {
                        Ok(()) => {}
                        Err(StepError::NotIncreasing { last, got }) => {
                            assert!(last >= got);
                            refused += 1;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                refused
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(run.last_step(), Some(1_999 * 4 + 3));
    let mut stream = handle.subscribe();
    stream.recv().await.unwrap();
    stream.recv().await.unwrap();
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
    let last = rec.last().unwrap();
    assert_eq!(
        last.output::<gpumon::core::steps::Steps>().unwrap().run("train", Some(3)).unwrap().last_step,
        Some(1_999 * 4 + 3)
    );
}

/// A training loop keeps marking while the agent shuts down and after: every mark succeeds
/// quickly, nothing blocks or panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_while_the_agent_shuts_down() {
    let (handle, _rec, steps) = agent(1);
    let run = steps.run("train", Some(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let marker = {
        let (run, stop) = (run.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let t = Instant::now();
                run.step(n).unwrap();
                slowest = slowest.max(t.elapsed());
            }
            (n, slowest)
        })
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
    drop(handle);
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    let (n, slowest) = marker.join().unwrap();
    assert!(n > 1000, "the loop kept running: {n} marks");
    assert_eq!(run.last_step(), Some(n));
    // Generous: a mark is two atomics and a clock read; the bound only catches blocking.
    assert!(slowest < Duration::from_millis(100), "a mark took {slowest:?}");
    run.step(n + 1).unwrap();
}

fn send(path: &std::path::Path, bytes: &[u8]) {
    let mut s = UnixStream::connect(path).unwrap();
    s.write_all(bytes).unwrap();
}

/// Marks over the socket; garbage, oversized lines and a flood from many connections are
/// counted and dropped, and the agent keeps sampling on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_over_the_socket_with_garbage_and_a_flood() {
    let dir = TempDir::new("steps");
    let path = dir.path().join("steps.sock");
    // A stale socket file from a killed agent is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());

    let (handle, rec, steps) = agent(1);
    let mut config = SocketConfig::new(&path);
    config.max_connections = 8;
    let socket = StepSocket::bind(config, steps.clone()).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);
    }
    // A second agent on the same path is refused, and the live socket is left alone.
    assert!(StepSocket::bind(SocketConfig::new(&path), steps.clone()).is_err());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(socket.serve(async move {
        let _ = stop_rx.await;
    }));

    let p = path.clone();
    let mut oversized = vec![b'{'; MAX_LINE + 1];
    oversized.push(b'\n');
    tokio::task::spawn_blocking(move || {
        // One client, many steps on one connection; garbage in between does not close it.
        let mut s = UnixStream::connect(&p).unwrap();
        s.write_all(b"{\"job\":\"remote\",\"rank\":1,\"step\":1}\n").unwrap();
        s.write_all(b"not json\n\n").unwrap();
        s.write_all(&oversized).unwrap();
        s.write_all(b"{\"job\":\"remote\",\"rank\":1,\"step\":2}\n").unwrap();
        s.write_all(b"{\"job\":\"remote\",\"rank\":1,\"step\":2}\n").unwrap(); // not increasing
        s.write_all(b"{\"job\":\"\",\"step\":5}\n").unwrap(); // bad job
        s.write_all(b"{\"job\":\"remote\",\"rank\":1,\"step\":3,\"loss\":0.5}\r\n").unwrap();
        s.write_all(b"\xff\xfe\n").unwrap();
        // A line split over writes is one line.
        s.write_all(b"{\"job\":\"remote\",").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        s.write_all(b"\"rank\":1,\"step\":4}\n").unwrap();
    })
    .await
    .unwrap();
    let wait = |what: &str, cond: &dyn Fn(&gpumon::core::steps::StepRejections, Option<u64>) -> bool| {
        let started = Instant::now();
        loop {
            let rej = steps.rejections().unwrap();
            let last = steps.run("remote", Some(1)).unwrap().last_step();
            if cond(&rej, last) {
                return (rej, last);
            }
            assert!(started.elapsed() < Duration::from_secs(10), "never {what}: {rej:?} {last:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let (rej, last) = wait("accounted", &|r, last| r.total() >= 5 && last == Some(4));
    assert_eq!((rej.malformed, rej.oversized, rej.refused, rej.connections), (2, 1, 2, 0), "{rej:?}");
    assert_eq!(last, Some(4));

    // The flood: 32 clients at once, each 200 garbage lines and one oversized line.
    let seq_before = rec.last().map_or(0, |s| s.seq);
    let flood_started = Instant::now();
    let flooders: Vec<_> = (0..32)
        .map(|_| {
            let p = path.clone();
            std::thread::spawn(move || {
                let Ok(mut s) = UnixStream::connect(&p) else { return };
                let mut payload = b"garbage garbage\n".repeat(200);
                payload.extend(vec![b'x'; 5000]);
                payload.push(b'\n');
                let _ = s.write_all(&payload);
            })
        })
        .collect();
    for f in flooders {
        f.join().unwrap();
    }
    let (rej, _) = wait("flood accounted", &|r, _| {
        // Each connection either was served (200 malformed + 1 oversized) or refused.
        let served = r.oversized - 1;
        r.connections + served == 32 && r.malformed == 2 + served * 200
    });
    assert!(rej.oversized > 1, "some flooders were served: {rej:?}");
    // Sampling kept going through the flood.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ticks = rec.last().unwrap().seq - seq_before;
    let expected = (flood_started.elapsed().as_secs_f64() / INTERVAL.as_secs_f64()) as u64;
    assert!(ticks + 3 >= expected, "{ticks} ticks in {:?}", flood_started.elapsed());

    // Still accepting: one more good mark over a fresh connection.
    send(&path, b"{\"job\":\"remote\",\"rank\":1,\"step\":10}\n");
    wait("the mark after the flood", &|_, last| last == Some(10));
    // The exported counters.
    let mut stream = handle.subscribe();
    let snap = stream.recv().await.unwrap();
    let mut exported = 0;
    snap.visit_derived(|p| {
        if p.id() == Some(gpumon::core::MetricId::StepsRejected) {
            exported += 1;
        }
    });
    assert_eq!(exported, Rejection::ALL.len(), "one series per reason");

    stop_tx.send(()).unwrap();
    server.await.unwrap();
    assert!(!path.exists(), "the socket file is removed at shutdown");
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
    // A file that is not a socket is never deleted.
    std::fs::write(&path, "precious").unwrap();
    assert!(StepSocket::bind(SocketConfig::new(&path), steps).is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
}

/// A connection counts as open until its last mark is read, after the client closed it: what
/// `gpumon-agent run` waits for before the run's last sample, so that a burst written just
/// before the command exited is reported whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_counts_open_until_its_last_mark_is_read() {
    let dir = TempDir::new("steps-drain");
    let path = dir.path().join("steps.sock");
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let socket = StepSocket::bind(SocketConfig::new(&path), steps.clone()).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(socket.serve(async move {
        let _ = stop_rx.await;
    }));
    assert_eq!(steps.connections_open(), 0);
    let marks = 20_000u64;
    let p = path.clone();
    let until = |what: &str, cond: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !cond() {
            assert!(started.elapsed() < Duration::from_secs(20), "never {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let mut s = tokio::task::spawn_blocking(move || UnixStream::connect(&p).unwrap()).await.unwrap();
    until("accepted", &|| steps.connections_open() == 1);
    let lines: Vec<u8> =
        (1..=marks).flat_map(|i| format!("{{\"job\":\"burst\",\"step\":{i}}}\n").into_bytes()).collect();
    // Written whole and closed: the agent may still be reading when the writer is gone.
    tokio::task::spawn_blocking(move || {
        s.write_all(&lines).unwrap();
        drop(s);
    })
    .await
    .unwrap();
    until("read to its end", &|| steps.connections_open() == 0);
    assert_eq!(steps.run("burst", None).unwrap().last_step(), Some(marks), "every mark read when it stops counting");
    let _ = stop_tx.send(());
    server.await.unwrap();
}

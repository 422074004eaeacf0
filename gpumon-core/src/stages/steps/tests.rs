//! Unit tests of the hand-off and the tracker's arithmetic, on hand-made snapshots with
//! explicit times (the mock-driven tests are in the workspace's tests/steps.rs).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::model::{DeviceInfo, DeviceSample, Snapshot, SystemInfo, WindowStats};
use crate::stages::Processor;

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// One GPU at time `t` with utilisation `util` (window mean `util`, max `util + 0.05`), memory
/// used `mem` and energy counter `energy`.
fn snap(seq: u64, t: u64, util: f64, mem: u64, energy: f64) -> Snapshot {
    let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-a", "test")));
    gpu.utilization.gpu = Some(util);
    gpu.windows.gpu_utilization = Some(WindowStats { min: util - 0.05, max: util + 0.05, mean: util, count: 10 });
    gpu.memory.used = Some(mem);
    gpu.power.energy_joules = Some(energy);
    Snapshot::new(Arc::new(SystemInfo::new("h", "test")), vec![gpu])
        .with_seq(seq)
        .with_taken_at(UNIX_EPOCH + Duration::from_nanos(t))
}

/// A run whose first step starts at `created` (Unix nanos) instead of now.
fn run_at(steps: &StepRegistry, job: &str, rank: Option<u32>, created: u64) -> TrainingRun {
    let cell = steps.find_or_create(job, rank, created, None).unwrap();
    TrainingRun { cell, shared: Arc::clone(&steps.shared) }
}

/// The first run in what the tracker attached to `s`.
fn first_run(s: &Snapshot) -> &RunSteps {
    &s.output::<Steps>().expect("the tracker attached its Steps").runs[0]
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn step_numbers_only_go_up_and_bad_input_is_refused() {
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = steps.run("train", Some(1)).unwrap();
    assert_eq!(run.last_step(), None);
    run.step(0).unwrap();
    run.step(5).unwrap();
    assert_eq!(run.step(5), Err(StepError::NotIncreasing { last: 5, got: 5 }));
    assert_eq!(run.step(3), Err(StepError::NotIncreasing { last: 5, got: 3 }));
    assert_eq!(run.step(u64::MAX), Err(StepError::OutOfRange(u64::MAX)));
    assert_eq!(run.last_step(), Some(5));
    // The same (job, rank) is the same run; another rank is another.
    assert_eq!(steps.run("train", Some(1)).unwrap().last_step(), Some(5));
    assert_eq!(steps.run("train", None).unwrap().last_step(), None);
    assert!(matches!(steps.run("", None), Err(StepError::InvalidJob(_))));
    assert!(matches!(steps.run("a\nb", None), Err(StepError::InvalidJob(_))));
    assert!(matches!(steps.run(&"x".repeat(MAX_JOB_LEN + 1), None), Err(StepError::InvalidJob(_))));
    assert!(matches!(StepTracker::new(StepConfig::every_n(0)), Err(StepError::InvalidConfig(_))));
    assert_eq!(steps.record("train", Some(1), 4), Err(StepError::NotIncreasing { last: 5, got: 4 }));
}

#[test]
fn the_registry_is_bounded() {
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    for i in 0..MAX_RUNS {
        steps.run(&format!("job{i}"), None).unwrap();
    }
    assert_eq!(steps.run("one-more", None).unwrap_err(), StepError::TooManyRuns);
    // An existing run is still found.
    steps.run("job0", None).unwrap();
    assert_eq!(steps.len(), MAX_RUNS);
}

#[test]
fn concurrent_callers_the_highest_step_wins() {
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = steps.run("train", None).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let run = run.clone();
            std::thread::spawn(move || {
                let mut ok = 0u64;
                for i in 0..10_000u64 {
                    if run.step(i * 4 + t).is_ok() {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let accepted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(run.last_step(), Some(9_999 * 4 + 3));
    // Every accepted mark raised the step, so there cannot be more than there are numbers.
    assert!((1..=40_000).contains(&accepted), "{accepted}");
}

/// A loop whose wait sits at the step boundary (the loader's, between one step's mark and the
/// next batch's kernels) is read at its true busy share: the sample holding the boundary counts
/// in each step by the share of its interval on that step's side of the mark, not whole in
/// both — which read every step a third idle when it was a quarter (issue #42: the simulator's
/// offload jobs were called starved by their marks while their readings said busy).
#[test]
fn a_wait_at_the_step_boundary_counts_once() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let mut s0 = snap(1, T0, 0.5, 100, 0.0);
    tracker.process(&mut s0);
    let run = run_at(&steps, "train", Some(0), T0 - SEC / 2);
    // Steps of 2 s marked at T0 + 2k + 0.5 s: busy 1.5 s, then 0.5 s waiting for the next
    // batch. Samples every second: the one ending at an even second read the wait and the
    // next step's start (50 %), the one ending at an odd second read busy (100 %).
    let mut means = Vec::new();
    for k in 1..=12u64 {
        if k % 2 == 1 {
            run.step_at(k / 2 + 1, T0 + (k - 1) * SEC + SEC / 2).unwrap();
        }
        let mut s = snap(k + 1, T0 + k * SEC, if k % 2 == 1 { 0.5 } else { 1.0 }, 100, 0.0);
        tracker.process(&mut s);
        means.extend(first_run(&s).reported.iter().map(|r| r.devices[0].utilization_mean.unwrap()));
    }
    // The first step began before the first sample; every later one is 1.5 s busy in 2 s.
    assert!(means.len() >= 4, "{means:?}");
    for m in &means[1..] {
        assert!(approx(*m, 0.75), "{means:?}");
    }
}

/// Steps longer than the interval take every sample overlapping them; the sample covering the
/// end is shared with the next step, its utilisation split by the share of its interval on each
/// side of the mark.
#[test]
fn long_steps_take_every_overlapping_sample() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let mut s0 = snap(1, T0, 0.1, 100, 1000.0);
    tracker.process(&mut s0); // baseline, no run yet
    assert!(s0.output::<Steps>().is_none());
    let created = T0 + SEC / 2;
    let run = run_at(&steps, "train", Some(0), created);
    // Samples at T0+1s … T0+4s; step 1 ends at T0+2.5s, step 2 at T0+3.5s.
    let mut s1 = snap(2, T0 + SEC, 0.2, 300, 1100.0);
    tracker.process(&mut s1);
    let r = first_run(&s1);
    assert_eq!((r.last_step, r.reported.len()), (None, 0));
    let mut s2 = snap(3, T0 + 2 * SEC, 0.4, 200, 1300.0);
    tracker.process(&mut s2);
    run.step_at(1, T0 + 2 * SEC + SEC / 2).unwrap();
    let mut s3 = snap(4, T0 + 3 * SEC, 0.6, 150, 1600.0);
    tracker.process(&mut s3);
    let r = first_run(&s3);
    assert_eq!(r.last_step, Some(1));
    assert_eq!(r.reported.len(), 1);
    let rep = &r.reported[0];
    assert_eq!(rep.step, 1);
    assert_eq!(rep.duration, Duration::from_nanos(T0 + 2 * SEC + SEC / 2 - created));
    // The run was created between s0 and s1: samples s1, s2, s3 overlap the step.
    assert_eq!((rep.first_seq, rep.last_seq), (2, 4));
    let d = &rep.devices[0];
    // s3 covers 2–3 s and the step ends at 2.5 s: half of s3 is step 1's.
    assert!(approx(d.utilization_mean.unwrap(), (0.2 + 0.4 + 0.6 * 0.5) / 2.5));
    assert!(approx(d.utilization_max.unwrap(), 0.65));
    assert_eq!(d.memory_peak_bytes, Some(300));
    // Δcounter over s1..s3 = 600 J over 3 s covered; the step's share of that time.
    let share = rep.duration.as_secs_f64() / 3.0;
    assert!(approx(d.energy_joules.unwrap(), 600.0 * share.min(1.0)));
    assert_eq!(r.last.as_ref(), Some(rep));

    run.step_at(2, T0 + 3 * SEC + SEC / 2).unwrap();
    let mut s4 = snap(5, T0 + 4 * SEC, 0.8, 120, 2000.0);
    tracker.process(&mut s4);
    let r = first_run(&s4);
    let rep = &r.reported[0];
    assert_eq!((rep.step, rep.duration), (2, Duration::from_secs(1)));
    assert_eq!((rep.first_seq, rep.last_seq), (4, 5), "s3 covers the end of step 1 and the start of step 2");
    let d = &rep.devices[0];
    // Step 2 (2.5–3.5 s) holds the second half of s3 and the first half of s4.
    assert!(approx(d.utilization_mean.unwrap(), (0.6 * 0.5 + 0.8 * 0.5) / 1.0));
    assert!(approx(d.utilization_max.unwrap(), 0.85));
    assert_eq!(d.memory_peak_bytes, Some(150));
    // Δcounter from s2 (the baseline before s3) to s4: 700 J over 2 s; the step is 1 s of it.
    assert!(approx(d.energy_joules.unwrap(), 350.0));

    // No mark: nothing reported, but the gauges keep the last step.
    let mut s5 = snap(6, T0 + 5 * SEC, 0.9, 100, 2100.0);
    tracker.process(&mut s5);
    let r = first_run(&s5);
    assert!(r.reported.is_empty());
    assert_eq!(r.last.as_ref().map(|l| l.step), Some(2));
    assert_eq!(r.last_duration, Some(Duration::from_secs(1)));
}

/// Steps shorter than the interval take the figures of the sample that covers them; several in
/// one interval share its figures, each with its own duration.
#[test]
fn short_steps_take_the_covering_sample() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "train", None, T0);
    tracker.process(&mut snap(1, T0 + SEC, 0.5, 100, 1000.0));
    run.step_at(1, T0 + SEC + SEC / 10).unwrap(); // starts the clock for the next ones
    let mut s = snap(2, T0 + 2 * SEC, 0.5, 100, 1100.0);
    tracker.process(&mut s);
    // Steps 2..=5 end within (T0+2s, T0+3s].
    for (n, at) in
        [(2, 2 * SEC + SEC / 5), (3, 2 * SEC + 2 * SEC / 5), (4, 2 * SEC + 3 * SEC / 5), (5, 2 * SEC + 4 * SEC / 5)]
    {
        run.step_at(n, T0 + at).unwrap();
    }
    let mut s = snap(3, T0 + 3 * SEC, 0.3, 900, 1500.0);
    tracker.process(&mut s);
    let r = first_run(&s);
    assert_eq!(r.rank_label, "");
    assert_eq!(r.last_step, Some(5));
    let got: Vec<u64> = r.reported.iter().map(|p| p.step).collect();
    assert_eq!(got, vec![2, 3, 4, 5]);
    // Each its own: step 2 from T0+1.1s to T0+2.2s, the others 0.2 s.
    assert_eq!(r.reported[0].duration, Duration::from_millis(1100));
    let each = Duration::from_millis(200);
    for rep in &r.reported[1..] {
        assert_eq!(rep.duration, each);
        assert_eq!((rep.first_seq, rep.last_seq), (3, 3), "step {} overlaps only the sample at T0+3s", rep.step);
        let d = &rep.devices[0];
        assert!(approx(d.utilization_mean.unwrap(), 0.3));
        assert_eq!(d.memory_peak_bytes, Some(900));
        // 400 J over the 1 s sample, prorated to the step.
        assert!(approx(d.energy_joules.unwrap(), 400.0 * each.as_secs_f64()));
    }
    // Step 2 began at T0+1.1s, so it also overlaps the sample at T0+2s.
    assert_eq!((r.reported[0].first_seq, r.reported[0].last_seq), (2, 3));
}

#[test]
fn every_n_reports_only_multiples_but_tracks_every_step() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::every_n(3)).unwrap();
    let run = run_at(&steps, "train", Some(2), T0);
    let mut reported = Vec::new();
    for i in 1..=10u64 {
        run.step_at(i, T0 + i * SEC - SEC / 2).unwrap();
        let mut s = snap(i, T0 + i * SEC, 0.5, 1, 1.0);
        tracker.process(&mut s);
        let r = first_run(&s);
        assert_eq!(r.last_step, Some(i));
        reported.extend(r.reported.iter().map(|p| p.step));
        let last = r.last.as_ref().map(|l| l.step);
        assert_eq!(last, (i >= 3).then_some(i / 3 * 3));
    }
    assert_eq!(reported, vec![3, 6, 9]);
}

#[test]
fn a_mark_after_the_sample_waits_for_the_next_tick() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "train", None, T0);
    run.step_at(1, T0 + SEC + 1).unwrap();
    let mut s = snap(1, T0 + SEC, 0.5, 1, 1.0);
    tracker.process(&mut s);
    assert_eq!(first_run(&s).last_step, None);
    let mut s = snap(2, T0 + 2 * SEC, 0.5, 1, 1.0);
    tracker.process(&mut s);
    assert_eq!(first_run(&s).reported[0].step, 1);
}

#[test]
fn the_first_mark_over_the_socket_only_starts_the_clock() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    steps.record("remote", Some(3), 10).unwrap();
    let mut s = snap(1, SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 + SEC, 0.5, 1, 1.0);
    tracker.process(&mut s);
    let r = first_run(&s);
    assert_eq!((r.last_step, r.last_duration, r.reported.len()), (Some(10), None, 0));
    assert_eq!(r.rank_label, "3");
}

/// A run registered over the socket has no start, so its first mark only starts the clock; the
/// steps marked after it before the tracker's first turn are reported all the same (they were
/// all lost: `gpumon-run` reported 2 of 20 quick marks).
#[test]
fn the_steps_after_the_first_socket_mark_are_reported_at_the_first_tick() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let at = |ms: u64| UNIX_EPOCH + Duration::from_nanos(T0) + Duration::from_millis(ms);
    steps.record_at("remote", Some(0), 1, at(100)).unwrap();
    steps.record_at("remote", Some(0), 2, at(400)).unwrap();
    steps.record_at("remote", Some(0), 3, at(700)).unwrap();
    let mut s = snap(1, T0 + SEC, 0.5, 1, 1.0);
    tracker.process(&mut s);
    let r = first_run(&s);
    let reported: Vec<_> = r.reported.iter().map(|rep| (rep.step, rep.duration)).collect();
    assert_eq!(reported, [(2, Duration::from_millis(300)), (3, Duration::from_millis(300))]);
    assert_eq!(r.last_step, Some(3));
}

#[test]
fn derived_points_follow_the_catalogue() {
    use crate::metric::{MetricId, Scope};
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    tracker.process(&mut snap(1, T0, 0.5, 100, 1000.0));
    let run = run_at(&steps, "train", Some(0), T0);
    run.step_at(1, T0 + SEC / 2).unwrap();
    let mut s = snap(2, T0 + SEC, 0.5, 100, 1100.0);
    tracker.process(&mut s);
    let mut seen = Vec::new();
    s.visit_derived(|p| {
        let d = p.descriptor;
        let labels: Vec<_> = p.label_pairs().collect();
        assert_eq!(labels, vec![("job", "train"), ("rank", "0")]);
        assert_eq!(p.device.is_some(), d.scope == Scope::Device, "{:?}", p.id());
        seen.push((p.id().unwrap(), p.value.as_f64()));
    });
    let ids: Vec<_> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        vec![
            MetricId::TrainingStep,
            MetricId::StepDuration,
            MetricId::StepUtilization,
            MetricId::StepUtilizationMax,
            MetricId::StepMemoryPeak,
            MetricId::StepEnergy
        ]
    );
    assert_eq!(seen[0].1, 1.0);
    assert!(approx(seen[5].1, 50.0), "half of the 100 J sample: {}", seen[5].1);
}

#[cfg(feature = "serde")]
#[test]
fn steps_round_trip_through_serde() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "train", Some(0), T0);
    tracker.process(&mut snap(1, T0, 0.5, 100, 1000.0));
    run.step_at(1, T0 + SEC / 2).unwrap();
    let mut s = snap(2, T0 + SEC, 0.5, 100, 1100.0);
    tracker.process(&mut s);
    let json = serde_json::to_string(&s).unwrap();
    let back: Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back.output::<Steps>(), s.output::<Steps>());
    assert!(back.output::<Steps>().is_some());
}

#[test]
fn every_step_of_the_first_period_is_reported() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "train", Some(0), T0);
    let mut s0 = snap(1, T0, 0.5, 1, 0.0);
    tracker.process(&mut s0);
    // Two marks before the tracker's next turn: both steps are reported, each half the time.
    run.step_at(1, T0 + SEC / 2).unwrap();
    run.step_at(2, T0 + SEC).unwrap();
    let mut s1 = snap(2, T0 + SEC, 0.9, 1, 10.0);
    tracker.process(&mut s1);
    let r = first_run(&s1);
    let reported: Vec<_> = r.reported.iter().map(|rep| (rep.step, rep.duration)).collect();
    assert_eq!(reported, [(1, Duration::from_millis(500)), (2, Duration::from_millis(500))]);
    assert_eq!(r.last_step, Some(2));
}

#[test]
fn each_gpu_takes_the_steps_of_its_own_rank() {
    let ranked = |ranks: &[Option<u32>]| Steps {
        runs: ranks.iter().map(|r| RunSteps::new("train", *r)).collect(),
        ..Default::default()
    };
    // Rank r drives GPU r; a GPU no rank drives has no steps.
    let steps = ranked(&[Some(0), Some(1), Some(2)]);
    assert_eq!(steps.for_gpu(1).and_then(|r| r.rank), Some(1));
    assert_eq!(steps.for_gpu(2).and_then(|r| r.rank), Some(2));
    assert!(steps.for_gpu(5).is_none());
    // A single loop (the Python Monitor of rank 3, sampling its own GPU 6): its steps.
    assert_eq!(ranked(&[Some(3)]).for_gpu(6).and_then(|r| r.rank), Some(3));
    // Several runs, none for this GPU's index: the one without a rank.
    let steps = ranked(&[Some(0), None]);
    assert_eq!(steps.for_gpu(4).map(|r| r.rank), Some(None));
}

#[test]
fn evidence_names_the_rank_of_the_gpu_it_is_about() {
    let report = |uuid: &str, util: f64| {
        let mut r = StepReport::new(7, Duration::from_secs(2));
        let mut g = DeviceStep::new(uuid);
        g.utilization_mean = Some(util);
        r.devices.push(g);
        r
    };
    let mut runs = Vec::new();
    for rank in 0..2u32 {
        let mut run = RunSteps::new("train", Some(rank));
        // Every run's report carries every GPU's figures (the tracker sees the whole snapshot).
        let mut r = report("GPU-0", 0.9);
        r.devices.extend(report("GPU-1", 0.25).devices);
        run.last = Some(r);
        runs.push(run);
    }
    let steps = Steps { runs, ..Default::default() };
    assert_eq!(
        steps.evidence_for(1, "GPU-1").unwrap(),
        "step 7 of train rank 1 took 2.00 s, 1.50 s of it idle (25 % mean utilisation)"
    );
    assert!(steps.evidence_for(0, "GPU-0").unwrap().starts_with("step 7 of train rank 0 "));
    assert!(steps.evidence_for(3, "GPU-3").is_none());
}

/// A loop marking faster than the tracker reports one by one: the latest 64 steps of the tick
/// are reported, and `completed` counts all of them (the run report's step count reads it).
#[test]
fn steps_past_the_per_tick_report_limit_are_counted() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "train", Some(0), T0);
    let mut s0 = snap(1, T0, 0.5, 1, 0.0);
    tracker.process(&mut s0);
    for i in 1..=1000u64 {
        run.step_at(i, T0 + i * SEC / 1000).unwrap();
    }
    let mut s1 = snap(2, T0 + SEC, 0.9, 1, 10.0);
    tracker.process(&mut s1);
    let r = first_run(&s1);
    assert_eq!(r.completed, 1000);
    assert_eq!(r.reported.len(), 64);
    assert_eq!(r.reported.first().map(|p| p.step), Some(937));
    assert_eq!(r.last_duration, Some(Duration::from_millis(1)));
    // A tick with no new mark completes nothing.
    let mut s2 = snap(3, T0 + 2 * SEC, 0.9, 1, 20.0);
    tracker.process(&mut s2);
    assert_eq!(first_run(&s2).completed, 0);
}

#[test]
fn marks_recorded_at_given_times_are_reported_with_those_durations() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let at = |ns: u64| UNIX_EPOCH + Duration::from_nanos(ns);
    // The first mark of a recorded run has no known start: it sets the step, unreported.
    steps.record_at("sim", Some(0), 1, at(T0 + SEC / 2)).unwrap();
    let mut s = snap(1, T0 + SEC, 0.5, 1, 0.0);
    tracker.process(&mut s);
    assert!(first_run(&s).reported.is_empty());
    steps.record_at("sim", Some(0), 2, at(T0 + 3 * SEC / 2)).unwrap();
    let mut s = snap(2, T0 + 2 * SEC, 0.5, 1, 0.0);
    tracker.process(&mut s);
    let run = first_run(&s);
    assert_eq!(run.reported.len(), 1);
    assert_eq!(run.reported[0].duration, Duration::from_secs(1));
    assert!(steps.record_at("sim", Some(0), 2, at(T0 + 2 * SEC)).is_err());
}

fn peer(uid: u32, pid: u32) -> Peer {
    Peer::new(uid, uid, Some(pid))
}

#[test]
fn a_run_belongs_to_the_uid_that_registered_it() {
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let (alice, bob) = (peer(1001, 11), peer(1002, 22));
    steps.record_from(&bob, "train", Some(0), 5).unwrap();
    // alice can neither move bob's step forward nor make his next marks "not increasing".
    assert_eq!(steps.record_from(&alice, "train", Some(0), 1_000), Err(StepError::NotOwner { owner: 1002, uid: 1001 }));
    steps.record_from(&bob, "train", Some(0), 6).unwrap();
    // Another process of bob's (a restarted rank) is still bob: its pid becomes the run's.
    steps.record_from(&peer(1002, 33), "train", Some(0), 7).unwrap();
    let cell = Arc::clone(&steps.shared.runs.lock().unwrap()[0]);
    assert_eq!((cell.last(), cell.peer()), (Some(7), Some(peer(1002, 33))));
    // A run made in this process is no peer's; this process may mark a peer's run.
    let local = steps.run("local", None).unwrap();
    assert!(matches!(steps.record_from(&alice, "local", None, 1), Err(StepError::NotOwner { uid: 1001, .. })));
    local.step(1).unwrap();
    // ... and belongs to this process's user: a peer of that user marks it (a client of the
    // agent's own socket marking a run the agent registered), and the run keeps this process.
    let me = peer(super::self_uid(), 44);
    steps.record_from(&me, "local", None, 2).unwrap();
    assert_eq!(local.last_step(), Some(2));
    steps.record("train", Some(0), 8).unwrap();
    // The same job and rank under another uid is the same run: refused, not a second run.
    assert_eq!(steps.len(), 2);
}

#[test]
fn one_uid_cannot_fill_the_table() {
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    steps.set_peer_limits(4, Duration::from_secs(3600));
    let (alice, bob) = (peer(1001, 11), peer(1002, 22));
    for rank in 0..4 {
        steps.record_from(&alice, "junk", Some(rank), 1).unwrap();
    }
    assert_eq!(steps.record_from(&alice, "junk", Some(4), 1), Err(StepError::TooManyRunsForUid { uid: 1001, max: 4 }));
    // Her existing runs still take marks, and bob registers his.
    steps.record_from(&alice, "junk", Some(0), 2).unwrap();
    steps.record_from(&bob, "train", Some(0), 1).unwrap();
    // The whole table still bounds everyone together.
    steps.set_peer_limits(MAX_RUNS, Duration::from_secs(3600));
    let mut uid = 2000;
    while steps.len() < MAX_RUNS {
        uid += 1;
        steps.record_from(&peer(uid, uid), "fill", Some(uid), 1).unwrap();
    }
    assert_eq!(steps.record_from(&peer(9999, 1), "late", None, 1), Err(StepError::TooManyRuns));
}

#[test]
fn idle_peer_runs_are_evicted_and_the_tracker_keeps_the_others() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    steps.set_peer_limits(MAX_RUNS, Duration::from_secs(10));
    let now = steps.shared.clock.now();
    let local = run_at(&steps, "local", Some(0), now);
    steps.record_from(&peer(1001, 11), "idle", Some(0), 1).unwrap();
    steps.record_from(&peer(1002, 22), "busy", Some(0), 1).unwrap();
    let mut s = snap(1, now + SEC, 0.5, 1, 1.0);
    tracker.process(&mut s);
    assert_eq!(s.output::<Steps>().unwrap().runs.len(), 3);

    // 9 s later: nothing is idle for 10 s yet.
    let evict = |at: u64| {
        let mut runs = steps.shared.runs.lock().unwrap();
        steps.evict_idle_locked(&mut runs, at)
    };
    assert_eq!(evict(now + 9 * SEC), 0);
    // "busy" is marked at +8 s; at +12 s only "idle" (last mark at ~0 s) has been idle for 10 s.
    steps.shared.runs.lock().unwrap()[2].mark(2, now + 8 * SEC).unwrap();
    local.step_at(1, now + SEC / 2).unwrap();
    assert_eq!(evict(now + 12 * SEC), 1);
    assert_eq!(steps.evicted(), 1);
    let mut s = snap(2, now + 13 * SEC, 0.5, 1, 1.0);
    tracker.process(&mut s);
    let runs = &s.output::<Steps>().unwrap().runs;
    let names: Vec<&str> = runs.iter().map(|r| r.job.as_str()).collect();
    assert_eq!(names, ["local", "busy"]);
    // The survivors kept their state: "busy" reports step 2 from its first mark at step 1.
    assert_eq!(runs[1].last_step, Some(2));
    assert_eq!(runs[1].reported.iter().map(|r| r.step).collect::<Vec<_>>(), [2]);
    assert_eq!(runs[0].last_step, Some(1));
    // Runs made in this process are never evicted, however idle.
    assert_eq!(evict(now + 1_000 * SEC), 1);
    assert_eq!(steps.len(), 1);
    // An evicted run's next mark registers it again, for anyone.
    steps.record_from(&peer(1003, 33), "idle", Some(0), 1).unwrap();
}

#[test]
fn a_full_table_evicts_idle_runs_before_refusing() {
    let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    steps.set_peer_limits(2, Duration::from_millis(1));
    steps.record_from(&peer(1001, 11), "a", Some(0), 1).unwrap();
    steps.record_from(&peer(1001, 11), "a", Some(1), 1).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    // Both of alice's runs are idle past the timeout: her third one takes a place.
    steps.record_from(&peer(1001, 11), "a", Some(2), 1).unwrap();
    assert_eq!(steps.len(), 1);
}

/// A snapshot of GPUs `GPU-a` (pid 11, uid 1001) and `GPU-b` (pid 22, uid 1002).
fn two_tenants() -> Snapshot {
    use crate::attribution::Owner;
    use crate::model::ProcessSample;
    let gpu = |i: u32, uuid: &str, pid: u32, uid: u32| {
        let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(i, uuid, "test")));
        let owner = Owner { uid: Some(uid), ..Owner::default() };
        let mut p = ProcessSample::new(pid);
        p.owner = Some(Arc::new(owner));
        d.processes.push(p);
        d
    };
    Snapshot::new(Arc::new(SystemInfo::new("h", "test")), vec![gpu(0, "GPU-a", 11, 1001), gpu(1, "GPU-b", 22, 1002)])
}

#[test]
fn a_tenant_sees_the_runs_its_own_processes_registered() {
    let mut snapshot = two_tenants();
    let figures = |uuid: &str| {
        let mut d = DeviceStep::new(uuid);
        d.utilization_mean = Some(0.5);
        d
    };
    let mut report = StepReport::new(3, Duration::from_secs(1));
    report.devices = vec![figures("GPU-a"), figures("GPU-b")];
    let run = |job: &str, by: Option<Peer>| {
        let mut r = RunSteps::new(job, Some(0));
        r.last = Some(report.clone());
        r.reported = vec![report.clone()];
        r.registered_by = by;
        r
    };
    let steps = Steps {
        runs: vec![
            run("alice-job", Some(peer(1001, 11))),
            run("bob-job", Some(peer(1002, 22))),
            // bob's run whose pid alice's process now has: not alice's.
            run("bob-old", Some(peer(1002, 11))),
            run("local", None),
        ],
        rejected: Some(StepRejections::default()),
    };
    snapshot.attach(steps);

    let alice: crate::attribution::TenantSelector = "user=1001".parse().unwrap();
    let view = snapshot.scoped_to(&alice);
    let seen = view.output::<Steps>().expect("alice's run is in her view");
    assert_eq!(seen.runs.iter().map(|r| r.job.as_str()).collect::<Vec<_>>(), ["alice-job"]);
    assert_eq!(seen.rejected, None, "every user's refusals");
    let only_a = |r: &StepReport| r.devices.iter().map(|d| d.uuid.as_str()).collect::<Vec<_>>() == ["GPU-a"];
    assert!(only_a(seen.runs[0].last.as_ref().unwrap()) && only_a(&seen.runs[0].reported[0]));
    let nobody: crate::attribution::TenantSelector = "user=1003".parse().unwrap();
    assert!(snapshot.scoped_to(&nobody).output::<Steps>().is_none());
}

/// Eight GPUs (index `i`, UUID `GPU-i`) at time `t`: GPUs 0–3 busy at 40 %, 4–7 at 20 %.
#[cfg(feature = "steps-socket")]
fn eight_gpus(seq: u64, t: u64) -> Snapshot {
    let devices = (0..8u32)
        .map(|i| {
            let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(i, format!("GPU-{i}"), "test")));
            d.utilization.gpu = Some(if i < 4 { 0.4 } else { 0.2 });
            d.power.energy_joules = Some(100.0 * seq as f64);
            d
        })
        .collect();
    Snapshot::new(Arc::new(SystemInfo::new("h", "test")), devices)
        .with_seq(seq)
        .with_taken_at(UNIX_EPOCH + Duration::from_nanos(t))
}

#[cfg(feature = "steps-socket")]
#[test]
fn marks_that_name_their_gpu_are_that_gpus_steps() {
    use super::socket::handle_line;
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let me = peer(1001, 11);
    let mut logged = false;
    let mut send = |line: &str| handle_line(line.as_bytes(), &steps, &me, 1, &mut logged);
    // Ranks 0 and 1 of a job under CUDA_VISIBLE_DEVICES=4,5 (the second says it by UUID), and a
    // raw client that sends only a rank.
    let lines = |n: u64| {
        [
            format!(r#"{{"job":"ddp","rank":0,"step":{n},"gpu":"4"}}"#),
            format!(r#"{{"job":"ddp","rank":1,"step":{n},"gpu":"GPU-5"}}"#),
            format!(r#"{{"job":"old","rank":2,"step":{n}}}"#),
        ]
    };
    for (tick, n) in [(1u64, 1u64), (2, 2), (3, 3)] {
        lines(n).iter().for_each(|l| send(l));
        // Socket marks are stamped now: the sample is taken just after them.
        let mut s = eight_gpus(tick, steps.shared.clock.now() + 1);
        tracker.process(&mut s);
        if tick < 3 {
            continue;
        }
        let out = s.output::<Steps>().unwrap();
        let run = |job: &str, rank: u32| out.run(job, Some(rank)).unwrap();
        assert_eq!(run("ddp", 0).gpus, Some(vec![4]));
        assert_eq!(run("ddp", 1).gpus, Some(vec![5]));
        assert_eq!(run("old", 2).gpus, Some(vec![2]), "no gpu key: rank r is GPU r");
        // The named runs' figures are their own GPU's only (the step's energy is not 8 GPUs').
        let uuids = |r: &RunSteps| r.reported[0].devices.iter().map(|d| d.uuid.clone()).collect::<Vec<_>>();
        assert_eq!(uuids(run("ddp", 0)), ["GPU-4"]);
        assert_eq!(uuids(run("ddp", 1)), ["GPU-5"]);
        assert_eq!(uuids(run("old", 2)), ["GPU-2"]);
        // GPU 5 is rank 1's; GPUs 0 and 1 (another job's) are none of ddp's; the rank-only run
        // keeps GPU 2.
        assert_eq!(out.for_gpu(5).map(|r| (r.job.as_str(), r.rank)), Some(("ddp", Some(1))));
        assert_eq!(out.for_gpu(4).map(|r| (r.job.as_str(), r.rank)), Some(("ddp", Some(0))));
        assert!(out.for_gpu(0).is_none() && out.for_gpu(1).is_none());
        assert_eq!(out.for_gpu(2).map(|r| r.job.as_str()), Some("old"));
        // The samples at the step's ends count by their share of it, from wall-clock stamps: a
        // sum of shares, equal to 0.2 to within rounding (it read 0.19999999999999998 once).
        let level = out.reported_utilization(5, "GPU-5").expect("GPU 5's step level");
        assert!((level - 0.2).abs() < 1e-9, "{level}");
        assert!(out.evidence_for(5, "GPU-5").unwrap().starts_with("step 3 of ddp rank 1 "));
    }
    // A gpu value that is not CUDA_VISIBLE_DEVICES syntax: the line is malformed, nothing moves.
    send(r#"{"job":"ddp","rank":0,"step":9,"gpu":"four"}"#);
    assert_eq!(steps.shared.rejected[Rejection::Malformed as usize].load(Ordering::Relaxed), 1);
    assert_eq!(steps.last_step("ddp", Some(0)), Some(3));
    // "all" names no GPU in particular (rank 0: GPU 0, as without the key); an integer is an index.
    send(r#"{"job":"x","rank":0,"step":1,"gpu":"all"}"#);
    send(r#"{"job":"y","rank":0,"step":1,"gpu":7}"#);
    let mut s = eight_gpus(4, steps.shared.clock.now() + 1);
    tracker.process(&mut s);
    let out = s.output::<Steps>().unwrap();
    assert_eq!(
        (out.run("x", Some(0)).unwrap().gpus.clone(), out.run("y", Some(0)).unwrap().gpus.clone()),
        (Some(vec![0]), Some(vec![7]))
    );
}

#[test]
fn a_run_that_named_its_gpus_is_never_taken_for_another() {
    let mut named = RunSteps::new("ddp", Some(0));
    named.gpus = Some(vec![4]);
    // The only run registered, but it drives GPU 4: GPU 0 has no steps.
    let steps = Steps { runs: vec![named.clone()], ..Default::default() };
    assert!(steps.for_gpu(0).is_none());
    assert_eq!(steps.for_gpu(4).map(|r| r.rank), Some(Some(0)));
    // Named GPUs come before a rank that happens to equal the index.
    let steps = Steps { runs: vec![RunSteps::new("other", Some(4)), named], ..Default::default() };
    assert_eq!(steps.for_gpu(4).map(|r| r.job.as_str()), Some("ddp"));
}

/// Four GPUs (index `i`, UUID `GPU-i`) at time `t`, each with energy counter `energy`.
fn four_gpus(seq: u64, t: u64, energy: f64) -> Snapshot {
    let devices = (0..4u32)
        .map(|i| {
            let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(i, format!("GPU-{i}"), "test")));
            d.utilization.gpu = Some(0.5);
            d.power.energy_joules = Some(energy);
            d
        })
        .collect();
    Snapshot::new(Arc::new(SystemInfo::new("h", "test")), devices)
        .with_seq(seq)
        .with_taken_at(UNIX_EPOCH + Duration::from_nanos(t))
}

/// A node agent on four GPUs, marks without `gpu` (repro: `{"job":"train","rank":0,"step":n}`):
/// rank r's steps are GPU r's — its figures and energy, and its diagnosis — not every GPU's.
/// A run without a rank is every GPU's; so is a rank that is no sampled GPU's index.
#[test]
fn a_mark_without_gpu_is_its_ranks_gpu() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let at = |ns: u64| UNIX_EPOCH + Duration::from_nanos(ns);
    for (job, rank) in [("train", Some(0)), ("eval", None), ("far", Some(9))] {
        steps.record_at(job, rank, 1, at(T0)).unwrap();
    }
    let mut s0 = four_gpus(1, T0 + SEC / 10, 0.0);
    tracker.process(&mut s0);
    for (job, rank) in [("train", Some(0)), ("eval", None), ("far", Some(9))] {
        steps.record_at(job, rank, 2, at(T0 + SEC)).unwrap();
    }
    let mut s1 = four_gpus(2, T0 + SEC + SEC / 10, 100.0);
    tracker.process(&mut s1);
    let out = s1.output::<Steps>().unwrap();
    let uuids = |job: &str, rank| {
        let r = out.run(job, rank).unwrap();
        r.reported[0].devices.iter().map(|d| d.uuid.clone()).collect::<Vec<_>>()
    };
    assert_eq!(uuids("train", Some(0)), ["GPU-0"]);
    assert_eq!(out.run("train", Some(0)).unwrap().gpus, Some(vec![0]));
    assert_eq!(uuids("eval", None).len(), 4);
    assert_eq!(uuids("far", Some(9)).len(), 4);
    assert_eq!(
        (out.run("eval", None).unwrap().gpus.clone(), out.run("far", Some(9)).unwrap().gpus.clone()),
        (None, None)
    );
    // Diagnosis: GPU 0 is rank 0's; the others fall to the run without a rank.
    assert_eq!(out.for_gpu(0).map(|r| r.job.as_str()), Some("train"));
    assert_eq!(out.for_gpu(2).map(|r| r.job.as_str()), Some("eval"));

    // The same mark alone on the node: rank 0 is GPU 0's only, GPUs 1–3 have no steps.
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    steps.record_at("train", Some(0), 1, at(T0)).unwrap();
    tracker.process(&mut four_gpus(1, T0 + SEC / 10, 0.0));
    steps.record_at("train", Some(0), 2, at(T0 + SEC)).unwrap();
    let mut s1 = four_gpus(2, T0 + SEC + SEC / 10, 100.0);
    tracker.process(&mut s1);
    let out = s1.output::<Steps>().unwrap();
    let energy: Vec<_> = out.runs[0].reported[0].devices.iter().map(|d| (d.uuid.as_str(), d.energy_joules)).collect();
    assert_eq!(energy.len(), 1);
    assert_eq!(energy[0].0, "GPU-0");
    assert!(out.for_gpu(0).is_some() && out.for_gpu(1).is_none() && out.for_gpu(3).is_none());

    // A run made in the sampling process (the Python Monitor, `devices="all"`) chose the GPUs it
    // samples: its steps keep every one's figures.
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "local", Some(0), T0);
    tracker.process(&mut four_gpus(1, T0 + SEC / 10, 0.0));
    run.step_at(1, T0 + SEC).unwrap();
    let mut s1 = four_gpus(2, T0 + SEC + SEC / 10, 100.0);
    tracker.process(&mut s1);
    let local = &s1.output::<Steps>().unwrap().runs[0];
    assert_eq!((local.reported[0].devices.len(), local.gpus.clone()), (4, None));
}

/// Several steps ending in one sampling period are reported each with its own duration, not
/// the period's mean; past the marks kept per run, the older ones share the rest evenly.
#[test]
fn steps_in_one_period_keep_their_own_durations() {
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "train", Some(0), T0);
    tracker.process(&mut snap(1, T0, 0.5, 1, 0.0));
    // 0.1 s, 0.5 s, 0.1 s, 0.5 s …: ten steps in 3 s.
    let mut t = T0;
    for n in 1..=10u64 {
        t += if n % 2 == 1 { SEC / 10 } else { SEC / 2 };
        run.step_at(n, t).unwrap();
    }
    let mut s1 = snap(2, T0 + 5 * SEC, 0.9, 1, 10.0);
    tracker.process(&mut s1);
    let r = first_run(&s1);
    let took: Vec<_> = r.reported.iter().map(|p| p.duration.as_millis()).collect();
    assert_eq!(took, [100, 500, 100, 500, 100, 500, 100, 500, 100, 500]);
    assert_eq!(r.last_duration, Some(Duration::from_millis(500)));
    assert_eq!(r.completed_duration, Some(Duration::from_secs(3)));

    // 200 steps in one period: the latest 64 marks are kept; the 136 before them share the time
    // from the run's start to the oldest kept mark.
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let run = run_at(&steps, "fast", None, T0);
    tracker.process(&mut snap(1, T0, 0.5, 1, 0.0));
    let mut t = T0;
    for n in 1..=200u64 {
        t += if n > 136 && n % 2 == 0 { 3 * SEC / 1000 } else { SEC / 1000 };
        run.step_at(n, t).unwrap();
    }
    let mut s1 = snap(2, T0 + SEC, 0.9, 1, 10.0);
    tracker.process(&mut s1);
    let r = first_run(&s1);
    assert_eq!((r.completed, r.reported.len()), (200, 64));
    let took: Vec<_> = r.reported.iter().map(|p| (p.step, p.duration.as_millis())).collect();
    assert_eq!(took[0], (137, 1), "step 137's previous mark (136) is overwritten: the mean up to 137");
    assert_eq!(&took[1..3], [(138, 3), (139, 1)]);
    assert_eq!(r.completed_duration, Some(Duration::from_nanos(t - T0)));
}

/// A second fit in a new process (a new connection of the socket) numbers from 1 again: its
/// marks go to the run segment `train#2` — none refused, its first mark its start, so the gap
/// between the fits is no step — while the first client's own restart and a retried mark are
/// still refused.
#[cfg(feature = "steps-socket")]
#[test]
fn a_new_client_numbering_from_the_start_again_marks_in_a_run_segment_of_its_own() {
    use super::socket::handle_line;
    let (mut tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
    let me = peer(1001, 11);
    let (first, second, third) = (steps.new_client(), steps.new_client(), steps.new_client());
    let mut logged = false;
    let mut send = |client: u64, n: u64| {
        handle_line(format!(r#"{{"job":"train","rank":0,"step":{n}}}"#).as_bytes(), &steps, &me, client, &mut logged);
    };
    let refused = |steps: &StepRegistry| steps.shared.rejected[Rejection::Refused as usize].load(Ordering::Relaxed);
    let mut tick = 0;
    let mut sample = |tracker: &mut StepTracker| {
        tick += 1;
        let mut s = eight_gpus(tick, steps.shared.clock.now() + 1);
        tracker.process(&mut s);
        s
    };
    for n in 1..=5 {
        send(first, n);
        sample(&mut tracker);
    }
    // The first client going back on its own run is refused (numbering restarted each epoch).
    send(first, 1);
    assert_eq!(refused(&steps), 1);
    let mut reported = Vec::new();
    for n in 1..=4 {
        send(second, n);
        let s = sample(&mut tracker);
        let out = s.output::<Steps>().unwrap();
        reported.extend(out.run("train#2", Some(0)).into_iter().flat_map(|r| r.reported.iter().map(|p| p.step)));
        assert_eq!(out.run("train", Some(0)).unwrap().last_step, Some(5), "the first fit's run keeps its step");
    }
    assert_eq!(refused(&steps), 1, "no mark of the second fit refused");
    assert_eq!(reported, [2, 3, 4], "the segment's first mark starts it: the gap is no step");
    assert_eq!((steps.last_step("train", Some(0)), steps.last_step("train#2", Some(0))), (Some(5), Some(4)));
    // A retry of the segment's last mark from a new connection is a duplicate, not a segment;
    // a third fit opens the third segment, skipping a name a client took itself.
    send(third, 4);
    assert_eq!(refused(&steps), 2);
    let fourth = steps.new_client();
    handle_line(br#"{"job":"train#3","rank":0,"step":1}"#, &steps, &me, fourth, &mut false);
    send(third, 1);
    send(third, 2);
    assert_eq!(steps.last_step("train#4", Some(0)), Some(2));
    assert_eq!(steps.last_step("train#3", Some(0)), Some(1));
    assert_eq!(refused(&steps), 2);
}

//! The runtime's scheduling and isolation guarantees, driven with the mock backend and the mock
//! crate's recording/faulty sinks. The agent samples on its own thread, on a [`ManualClock`] the
//! tests step by hand, so every tick and every sample timeout happens exactly when a test says;
//! what follows a step (a sample, an export) happens in real time, so each step is followed by
//! a wait, under a deadline, for its outcome. Sinks' own timing (delays, shutdown deadlines) is
//! tokio's real time.
#![cfg(feature = "stdout")]

use std::time::{Duration, Instant};

use gpumon::core::{
    Agent, AgentBuilder, AgentError, AgentHandle, AgentStats, DeviceFilter, DeviceState, Family, InlineExport,
    ManualClock, MetricSet, SampleError, SampleRequest, Sampler, Sink, SinkError, SinkOptions, SinkState, Snapshot,
};
use gpumon_mock::{Behavior, FailKind, Fault, FaultySink, Gate, MockSampler, RecordingSink, Scenario};

const WAIT: Duration = Duration::from_secs(20);

fn h100x8() -> MockSampler {
    MockSampler::from_profile_name("h100x8").expect("built-in profile")
}

/// Waits, in real time and at most [`WAIT`], until `condition` holds.
async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Lets the agent's tasks run for a moment, so that something that should *not* happen would.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Steps `clock` by `by` and waits until `rec` holds `n` snapshots.
async fn tick(clock: &ManualClock, by: Duration, rec: &RecordingSink, n: usize) {
    clock.advance(by);
    assert!(rec.wait_for(n, WAIT).await, "expected {n} snapshots, got {}", rec.len());
}

/// The `h100x8` mock whose sample number `tick` (counting from 0, requested samples included)
/// hangs until `gate` is released.
/// The agent on the mock h100x8 under a manual clock, exporting to `sink` alone (at `options`).
fn one_sink_on_a_manual_clock(sink: FaultySink, options: SinkOptions) -> (ManualClock, AgentHandle) {
    let clock = ManualClock::new();
    let handle = Agent::builder(h100x8()).clock(clock.clone()).sink_with(sink, options).spawn().unwrap();
    (clock, handle)
}

/// Steps `clock` a second at a time after the first tick, each time until the tick was taken,
/// up to sample `last`.
async fn sample_up_to(clock: &ManualClock, handle: &AgentHandle, last: u64) {
    for n in 2..=last {
        clock.advance(Duration::from_secs(1));
        until("the tick was taken", || handle.stats().samples_taken == n).await;
    }
}

fn hangs_at(tick: u64, gate: &Gate) -> MockSampler {
    MockSampler::builder()
        .profile(gpumon_mock::FleetProfile::load("h100x8").unwrap())
        .fault(Fault::HangUntilReleased { at_tick: tick, gate: gate.clone() })
        .build()
        .unwrap()
}

/// `sampler`'s agent builder on a fresh [`ManualClock`], with a [`RecordingSink`] named `rec`;
/// tests add what they vary (the interval is the default, 1 s).
fn manual(sampler: impl Sampler) -> (ManualClock, RecordingSink, AgentBuilder) {
    let clock = ManualClock::new();
    let rec = RecordingSink::new("rec");
    let builder = Agent::builder(sampler).clock(clock.clone()).sink(rec.clone());
    (clock, rec, builder)
}

/// The first `n` snapshots `handle` publishes, stepping `clock` a second before each but the
/// first (call it right after `spawn`, so that none is missed).
async fn first_published(handle: &AgentHandle, clock: &ManualClock, n: usize) -> Vec<std::sync::Arc<Snapshot>> {
    let mut stream = handle.subscribe();
    let mut published = Vec::new();
    for i in 0..n {
        if i > 0 {
            clock.advance(Duration::from_secs(1));
        }
        published.push(tokio::time::timeout(WAIT, stream.recv()).await.unwrap().unwrap());
    }
    published
}

fn ticks(s: &AgentStats) -> u64 {
    s.samples_taken + s.sample_failures + s.skipped_ticks
}

#[tokio::test]
async fn samples_on_the_interval_and_numbers_snapshots() {
    let (clock, rec, builder) = manual(h100x8());
    let handle = builder.interval(Duration::from_secs(1)).spawn().unwrap();
    let mut stream = handle.subscribe();
    let mut arrivals = Vec::new();
    for i in 0..6 {
        if i > 0 {
            settle().await;
            assert_eq!(rec.len(), i, "nothing before the clock reaches the next tick");
            clock.advance(Duration::from_millis(999));
            settle().await;
            assert_eq!(rec.len(), i, "nothing a millisecond before the tick either");
            clock.advance(Duration::from_millis(1));
        }
        let s = tokio::time::timeout(WAIT, stream.recv()).await.unwrap().unwrap();
        arrivals.push((s.seq, clock.elapsed()));
    }
    let expected: Vec<_> = (1..=6).map(|i| (i, Duration::from_secs(i - 1))).collect();
    assert_eq!(arrivals, expected, "one snapshot per second, numbered from 1, the first at once");
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
    assert_eq!(rec.snapshots().iter().map(|s| s.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
    assert_eq!(rec.shutdown_count(), 1);
}

#[tokio::test]
async fn missed_ticks_are_skipped_and_the_schedule_keeps_its_grid() {
    let (clock, rec, builder) = manual(h100x8());
    let handle = builder.interval(Duration::from_secs(1)).spawn().unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    // 3.5 s at once: one sample (not three to catch up), then the grid goes on at t=4.
    tick(&clock, Duration::from_millis(3500), &rec, 2).await;
    settle().await;
    assert_eq!(rec.len(), 2, "missed ticks are skipped, not made up");
    clock.advance(Duration::from_millis(499));
    settle().await;
    assert_eq!(rec.len(), 2);
    tick(&clock, Duration::from_millis(1), &rec, 3).await;
    assert_eq!(handle.stats().skipped_ticks, 0, "a late tick is not a skipped one");
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test]
async fn a_hung_sink_delays_neither_the_sampler_nor_the_other_sinks() {
    let (clock, rec, builder) = manual(h100x8());
    let hung = FaultySink::new("hung").export_behavior(Behavior::Stall);
    let hung_calls = hung.calls();
    let handle = builder
        .interval(Duration::from_secs(1))
        .sink_with(hung, SinkOptions::default().capacity(2).export_timeout(Duration::from_secs(3600)))
        .spawn()
        .unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    until("the hung sink is in its first export", || hung_calls.exports() == 1).await;
    for i in 2..=11 {
        tick(&clock, Duration::from_secs(1), &rec, i).await;
    }
    settle().await;
    assert_eq!(rec.len(), 11, "the healthy sink got every snapshot");
    assert_eq!(hung_calls.exports(), 1, "the hung sink is still stuck in its first export");
    let status = handle.sink_status();
    let hung_status = status.iter().find(|s| s.name == "hung").unwrap();
    // 11 published: 1 taken into the stuck export, 2 queued, 8 dropped (oldest first) and counted.
    assert_eq!(hung_status.dropped, 8);
    assert_eq!(status.iter().find(|s| s.name == "rec").unwrap().dropped, 0);
    assert_eq!(handle.stats().samples_taken, 11);
}

#[tokio::test]
async fn shutdown_respects_its_deadline_with_a_hung_sink() {
    let (clock, rec, builder) = manual(h100x8());
    let hung = FaultySink::new("hung").export_behavior(Behavior::Stall).shutdown_behavior(Behavior::Stall);
    let handle =
        builder.sink_with(hung, SinkOptions::default().export_timeout(Duration::from_secs(3600))).spawn().unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    tick(&clock, Duration::from_secs(1), &rec, 2).await;
    tick(&clock, Duration::from_secs(1), &rec, 3).await;
    let start = Instant::now();
    let result = handle.shutdown(Duration::from_secs(2)).await;
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(2), "shutdown waits for the hung sink up to its deadline: {took:?}");
    assert!(took < Duration::from_millis(2500), "and returns at the deadline, not later: {took:?}");
    match result {
        Err(AgentError::Timeout { after, unfinished, failed }) => {
            assert_eq!(after, Duration::from_secs(2));
            assert_eq!(unfinished, ["hung"]);
            assert!(failed.is_empty());
        }
        other => panic!("expected a timeout naming the hung sink, got {other:?}"),
    }
    assert_eq!(rec.shutdown_count(), 1, "the healthy sink was drained and shut down");
    assert_eq!(rec.len(), 3);
    let status = handle.sink_status();
    assert_eq!(status.iter().find(|s| s.name == "hung").unwrap().state, SinkState::Aborted);
    assert_eq!(status.iter().find(|s| s.name == "rec").unwrap().state, SinkState::ShutDown);
    assert!(matches!(handle.shutdown(Duration::from_secs(1)).await, Err(AgentError::ShutDown)), "idempotent");
    clock.advance(Duration::from_secs(5));
    settle().await;
    assert_eq!(handle.stats().samples_taken, 3, "no tick after shutdown");
}

#[tokio::test]
async fn flush_exports_a_fresh_sample_then_flushes_every_sink() {
    let rec = RecordingSink::new("rec");
    let bad_flush = FaultySink::new("bad-flush").flush_behavior(Behavior::Fail(FailKind::Permanent));
    let bad_calls = bad_flush.calls();
    let handle = Agent::builder(h100x8()).scheduled(false).sink(rec.clone()).sink(bad_flush).spawn().unwrap();
    settle().await;
    assert_eq!(rec.len(), 0, "an unscheduled agent samples only when asked");

    match handle.flush(Duration::from_secs(5)).await {
        Err(AgentError::Sinks(failures)) => {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].sink, "bad-flush");
        }
        other => panic!("expected the failing flush to be reported, got {other:?}"),
    }
    assert_eq!(rec.len(), 1, "flush took and exported a sample");
    assert_eq!(rec.flush_count(), 1);
    assert_eq!((bad_calls.exports(), bad_calls.flushes()), (1, 1));
    assert_eq!(rec.snapshots()[0].devices.len(), 8);

    let now = handle.snapshot_now().await.unwrap();
    assert_eq!(now.seq, 2);
    settle().await;
    assert_eq!(rec.len(), 1, "snapshot_now does not export");
    // Shutdown flushes too, so the failing flush is reported again; the healthy sink is closed.
    match handle.shutdown(Duration::from_secs(1)).await {
        Err(AgentError::Sinks(failures)) => assert_eq!(failures[0].sink, "bad-flush"),
        other => panic!("expected the failing flush on shutdown, got {other:?}"),
    }
    assert_eq!(rec.shutdown_count(), 1);
}

#[tokio::test]
async fn flush_drains_what_is_queued_before_the_flush_sample() {
    let slow = FaultySink::new("slow").export_behavior(Behavior::Delay(Duration::from_millis(200)));
    let slow_calls = slow.calls();
    let slow_rec = slow.recorder();
    let (clock, handle) = one_sink_on_a_manual_clock(slow, SinkOptions::default().capacity(8));
    until("the first export began", || slow_calls.exports() == 1).await;
    sample_up_to(&clock, &handle, 4).await;
    assert!(slow_rec.len() < 4, "the slow sink is behind");
    handle.flush(Duration::from_secs(60)).await.unwrap();
    let seqs: Vec<_> = slow_rec.snapshots().iter().map(|s| s.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5], "queued snapshots first, in order, then the flush's own");
    handle.shutdown(Duration::from_secs(30)).await.unwrap();
}

#[tokio::test]
async fn panicking_and_failing_sinks_are_isolated_and_counted() {
    let (clock, rec, builder) = manual(h100x8());
    let panics = FaultySink::new("panics").export_behavior(Behavior::Panic);
    let flaky =
        FaultySink::new("flaky").on_export(|i| if i < 3 { Behavior::Fail(FailKind::Transient) } else { Behavior::Ok });
    let handle = builder.sink(panics).sink(flaky).spawn().unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    tick(&clock, Duration::from_secs(1), &rec, 2).await;
    tick(&clock, Duration::from_secs(1), &rec, 3).await;
    let get = |n: &str| handle.sink_status().into_iter().find(|s| s.name == n).unwrap();
    until("both faulty sinks saw three exports", || get("panics").panics == 3 && get("flaky").failures == 3).await;
    let p = get("panics");
    assert_eq!((p.panics, p.failures, p.consecutive_failures, p.exported), (3, 3, 3, 0));
    assert!(p.last_error.unwrap().contains("panicked"));
    let f = get("flaky");
    assert_eq!((f.failures, f.consecutive_failures, f.exported), (3, 3, 0));
    tick(&clock, Duration::from_secs(1), &rec, 4).await;
    until("the flaky sink's fourth export", || get("flaky").exported == 1).await;
    let f = get("flaky");
    assert_eq!((f.failures, f.consecutive_failures, f.exported), (3, 0, 1), "a success resets the run");
    assert_eq!(rec.len(), 4);
    assert!(handle.is_running());
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

/// A backend that ignores the device filter: the runtime must still drop hidden devices.
struct LeakySampler(MockSampler);

impl Sampler for LeakySampler {
    fn name(&self) -> &str {
        "leaky"
    }
    fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError> {
        self.0.sample(&SampleRequest::new(request.metrics, DeviceFilter::all()))
    }
}

#[tokio::test]
async fn hidden_devices_never_reach_a_sink() {
    for sampler in [Box::new(LeakySampler(h100x8())) as Box<dyn Sampler>, Box::new(h100x8())] {
        let (clock, rec, builder) = manual(sampler);
        let filter = DeviceFilter::parse("1,3").unwrap();
        let handle = builder.devices(filter).spawn().unwrap();
        assert!(rec.wait_for(1, WAIT).await);
        tick(&clock, Duration::from_secs(1), &rec, 2).await;
        handle.shutdown(Duration::from_secs(1)).await.unwrap();
        for s in rec.snapshots() {
            let idx: Vec<_> = s.devices.iter().map(|d| d.info.index).collect();
            assert_eq!(idx, [1, 3]);
        }
        assert_eq!(rec.len(), 2);
    }
}

#[tokio::test]
async fn a_lost_gpu_is_marked_and_the_others_keep_reporting() {
    let sampler = MockSampler::builder()
        .profile(gpumon_mock::FleetProfile::load("h100x8").unwrap())
        .scenario(Scenario::load("training").unwrap())
        .fault(Fault::DeviceLost { device: 3, at_tick: 2 })
        .build()
        .unwrap();
    let (clock, rec, builder) = manual(sampler);
    let handle = builder.spawn().unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    for n in 2..=5 {
        tick(&clock, Duration::from_secs(1), &rec, n).await;
    }
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
    let snaps = rec.snapshots();
    assert_eq!(snaps.len(), 5);
    for (tick, s) in snaps.iter().enumerate() {
        assert_eq!(s.devices.len(), 8, "the lost GPU stays listed");
        let lost = &s.devices[3];
        assert_eq!(lost.state == DeviceState::Lost, tick >= 2, "tick {tick}");
        for d in s.devices.iter().filter(|d| d.info.index != 3) {
            assert!(d.is_up());
            assert!(d.utilization.gpu.is_some() && d.memory.used.is_some() && d.power.usage_watts.is_some());
        }
    }
}

#[tokio::test]
async fn a_hanging_sample_is_abandoned_and_ticks_are_skipped_until_it_returns() {
    let gate = Gate::new();
    let sampler = hangs_at(2, &gate);
    let (clock, rec, builder) = manual(sampler);
    let handle = builder.interval(Duration::from_secs(1)).sample_timeout(Duration::from_millis(500)).spawn().unwrap();
    // Ticks at t=0 and t=1 (samples 0 and 1).
    assert!(rec.wait_for(1, WAIT).await);
    tick(&clock, Duration::from_secs(1), &rec, 2).await;
    // t=2: sample 2 hangs in the backend.
    clock.advance(Duration::from_secs(1));
    until("the sample hangs at the gate", || gate.waiting() == 1).await;
    clock.advance(Duration::from_millis(499));
    settle().await;
    assert_eq!(ticks(&handle.stats()), 2, "not abandoned before its timeout");
    clock.advance(Duration::from_millis(1)); // t=2.5: the sample timeout fires
    until("the timeout is reported", || handle.stats().sample_failures == 1).await;
    let s = handle.stats();
    assert_eq!((s.samples_taken, s.sample_failures, s.skipped_ticks), (2, 1, 0));
    assert!(s.last_sample_error.unwrap().contains("timed out"));
    assert!(rec.wait_for(3, WAIT).await, "the sinks hear of the timeout at once");
    // Requests are refused while the sample is stuck, and counted with the skipped ticks.
    assert!(matches!(handle.snapshot_now().await, Err(AgentError::Sample(SampleError::Busy))));
    assert_eq!(handle.stats().skipped_ticks, 1);
    for n in [2, 3] {
        clock.advance(Duration::from_millis(500)); // t=3, then t=4: skipped
        until("the tick is reported skipped", || handle.stats().skipped_ticks == n).await;
        clock.advance(Duration::from_millis(500));
        settle().await;
    }
    assert_eq!(handle.stats().skipped_ticks, 3, "no second sample while the first is stuck");
    assert_eq!(gate.waiting(), 1, "still the one call in the backend");
    gate.release();
    // At t=4.5 the stuck call returns; its late result is discarded and the next tick, t=5, is
    // sampled as usual.
    until("the stuck call returned", || gate.waiting() == 0).await;
    settle().await;
    assert_eq!(handle.stats().samples_taken, 2, "the late result is not counted as a sample");
    let before = ticks(&handle.stats());
    clock.advance(Duration::from_millis(500));
    until("the t=5 tick is sampled", || ticks(&handle.stats()) > before).await;
    let s = handle.stats();
    assert!(s.last_sample_ok, "sampling resumed after the hung call returned: {s:?}");
    assert_eq!((s.samples_taken, s.sample_failures, s.skipped_ticks), (3, 1, 3));
    settle().await;
    let snapshots = rec.snapshots();
    let sampled: Vec<_> = snapshots.iter().filter(|s| s.sampling.is_ok()).map(|s| s.seq).collect();
    assert_eq!(sampled, [1, 2, 3], "the late result of the hung call is discarded, not exported");
    // The sink heard of every tick without data, in order, numbered like the last sample.
    let failed: Vec<_> = snapshots.iter().filter_map(|s| s.sampling_failure().map(|r| (s.seq, r))).collect();
    assert_eq!(failed.len(), 3, "the timeout and the two skipped ticks: {failed:?}");
    assert!(failed[0].1.contains("timed out"), "{failed:?}");
    assert!(failed[1..].iter().all(|(_, r)| r.contains("already in flight") && r.contains("timed out")), "{failed:?}");
    assert!(failed.iter().all(|(seq, _)| *seq == 2), "{failed:?}");
    assert!(snapshots.iter().filter(|s| !s.sampling.is_ok()).all(|s| s.devices.is_empty()));
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test]
async fn a_requested_sample_that_hangs_times_out_and_the_next_request_is_served() {
    let gate = Gate::new();
    // The mock counts every sample; the first (tick 0) is the flush's.
    let sampler = hangs_at(0, &gate);
    let (clock, rec, builder) = manual(sampler);
    let handle = builder.scheduled(false).sample_timeout(Duration::from_secs(2)).spawn().unwrap();
    let flush = tokio::spawn({
        let handle = handle.clone();
        async move { handle.flush(Duration::from_secs(60)).await }
    });
    until("the flush's sample hangs", || gate.waiting() == 1).await;
    clock.advance(Duration::from_secs(2));
    match tokio::time::timeout(WAIT, flush).await.unwrap().unwrap() {
        Err(AgentError::Sample(SampleError::Timeout(d))) => assert_eq!(d, Duration::from_secs(2)),
        other => panic!("expected the flush to report the timeout, got {other:?}"),
    }
    assert_eq!(rec.len(), 1, "the sinks got the sampling-failed snapshot with the flush");
    assert!(rec.snapshots()[0].sampling_failure().unwrap().contains("timed out"));
    gate.release();
    until("the stuck call returned", || gate.waiting() == 0).await;
    let again = handle.snapshot_now().await.unwrap();
    assert_eq!(again.seq, 1, "the abandoned sample took no number");
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test]
async fn build_rejects_bad_settings_with_the_setting_named() {
    let e = Agent::builder(h100x8()).interval(Duration::from_millis(50)).build().unwrap_err();
    assert!(e.to_string().contains("interval"), "{e}");
    let e = Agent::builder(h100x8()).sink(RecordingSink::new("x")).sink(RecordingSink::new("x")).build().unwrap_err();
    assert!(e.to_string().contains("two sinks are named `x`"), "{e}");
    let e = Agent::builder(h100x8())
        .sink_with(RecordingSink::new("x"), SinkOptions::default().capacity(0))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("x.capacity"), "{e}");
}

#[tokio::test]
async fn opt_in_families_are_sampled_only_when_asked() {
    let rec = RecordingSink::new("rec");
    let handle = Agent::builder(h100x8())
        .metrics(MetricSet::default().with(Family::Processes).without(Family::Power))
        .clock(ManualClock::new())
        .sink(rec.clone())
        .spawn()
        .unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
    let s = rec.last().unwrap();
    assert!(s.devices.iter().all(|d| d.power.usage_watts.is_none()));
    assert!(s.devices.iter().any(|d| !d.processes.is_empty()));
}

#[tokio::test]
async fn queue_capacity_is_exact_and_every_loss_is_counted() {
    let hung = FaultySink::new("hung").export_behavior(Behavior::Stall);
    let hung_calls = hung.calls();
    let options = SinkOptions::default().capacity(3).export_timeout(Duration::from_secs(3600));
    let (clock, handle) = one_sink_on_a_manual_clock(hung, options);
    until("the first export is stuck", || hung_calls.exports() == 1).await;
    sample_up_to(&clock, &handle, 10).await;
    settle().await;
    // 10 published: 1 stuck in export, 3 queued (not 4: the capacity is exact), 6 dropped.
    assert_eq!(handle.sink_status()[0].dropped, 6);
}

#[tokio::test]
async fn flush_reports_a_failed_export_of_its_own_sample() {
    let failing = FaultySink::new("down").export_behavior(Behavior::Fail(FailKind::Transient));
    let handle = Agent::builder(h100x8()).scheduled(false).sink(failing).spawn().unwrap();
    match handle.flush(Duration::from_secs(5)).await {
        Err(AgentError::Sinks(f)) => {
            assert_eq!(f[0].sink, "down");
            assert!(f[0].error.is_retryable());
        }
        other => panic!("a flush whose export failed must say so, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_deadline_counts_from_the_call_even_when_the_agent_is_busy() {
    let gate = Gate::new();
    let sampler = hangs_at(1, &gate);
    let (clock, rec, builder) = manual(sampler);
    let hung = FaultySink::new("hung").shutdown_behavior(Behavior::Stall);
    let handle = builder
        .sample_timeout(Duration::from_secs(30))
        .sink_with(hung, SinkOptions::default().export_timeout(Duration::from_secs(3600)))
        .spawn()
        .unwrap();
    assert!(rec.wait_for(1, WAIT).await); // tick 0 done
    clock.advance(Duration::from_secs(1)); // t=1: tick 1 hangs for up to 30 s
    until("tick 1 hangs", || gate.waiting() == 1).await;
    let start = Instant::now();
    let result = handle.shutdown(Duration::from_secs(2)).await;
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "shutdown returned at its deadline although a sample is in flight: {took:?}"
    );
    match result {
        Err(AgentError::Timeout { after, unfinished, .. }) => {
            assert_eq!(after, Duration::from_secs(2));
            assert_eq!(unfinished, ["hung"]);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(rec.shutdown_count(), 1, "the healthy sink was shut down within the deadline");
    gate.release();
}

#[tokio::test]
async fn a_hostname_override_applies_to_every_snapshot_without_a_copy_per_tick() {
    let backend_host = h100x8().sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::all())).unwrap();
    assert_ne!(backend_host.system.hostname, "node-17");
    let rec = RecordingSink::new("rec");
    let clock = ManualClock::new();
    let handle = Agent::builder(h100x8())
        .interval(Duration::from_secs(1))
        .hostname("node-17")
        .clock(clock.clone())
        .sink(rec.clone())
        .spawn()
        .unwrap();
    let seen = first_published(&handle, &clock, 3).await;
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
    for s in &seen {
        assert_eq!(s.system.hostname, "node-17");
        assert_eq!(s.system.backend, "mock", "everything else is the backend's");
        assert_eq!(s.system.driver_version, backend_host.system.driver_version);
    }
    // One patched SystemInfo, shared by every snapshot (the mock shares its own the same way).
    assert!(std::sync::Arc::ptr_eq(&seen[0].system, &seen[2].system));
    assert!(rec.snapshots().iter().all(|s| s.system.hostname == "node-17"));
}

/// Tags each snapshot's first device name with its own name, so the order processors ran in can
/// be read back; panics on the ticks listed in `panic_on`.
struct Tagger {
    name: &'static str,
    panic_on: Vec<u64>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

impl gpumon::core::Processor for Tagger {
    fn name(&self) -> &str {
        self.name
    }
    fn process(&mut self, snapshot: &mut Snapshot) {
        self.seen.lock().unwrap().push(snapshot.seq);
        if self.panic_on.contains(&snapshot.seq) {
            panic!("{} fails on tick {}", self.name, snapshot.seq);
        }
        let dev = &mut snapshot.devices[0];
        let mut info = (*dev.info).clone();
        info.name.push_str(&format!("+{}", self.name));
        dev.info = std::sync::Arc::new(info);
    }
}

#[tokio::test]
async fn processors_run_in_order_before_the_sinks_and_a_panic_costs_only_its_data() {
    let rec = RecordingSink::new("rec");
    let seen_a = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen_b = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let clock = ManualClock::new();
    let handle = Agent::builder(h100x8())
        .interval(Duration::from_secs(1))
        .processor(Tagger { name: "a", panic_on: vec![2], seen: seen_a.clone() })
        .processor(Tagger { name: "b", panic_on: vec![], seen: seen_b.clone() })
        .clock(clock.clone())
        .sink(rec.clone())
        .spawn()
        .unwrap();
    let names: Vec<_> =
        first_published(&handle, &clock, 3).await.iter().map(|s| (s.seq, s.devices[0].info.name.clone())).collect();
    // snapshot_now is not processed: it would distort a processor's notion of ticks.
    let adhoc = handle.snapshot_now().await.unwrap();
    assert!(!adhoc.devices[0].info.name.contains('+'), "{}", adhoc.devices[0].info.name);
    handle.shutdown(Duration::from_secs(1)).await.unwrap();

    let base = "NVIDIA H100 80GB HBM3";
    assert_eq!(
        names,
        [(1, format!("{base}+a+b")), (2, format!("{base}+b")), (3, format!("{base}+a+b"))],
        "a then b, every tick; on tick 2 `a` panicked and the tick still shipped"
    );
    assert_eq!(*seen_a.lock().unwrap(), [1, 2, 3]);
    assert_eq!(*seen_b.lock().unwrap(), [1, 2, 3]);
    assert_eq!(handle.stats().processor_panics, 1);
    assert_eq!(rec.snapshots().len(), 3);
}

#[test]
fn two_processors_with_one_name_are_refused() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let err = Agent::builder(h100x8())
        .processor(Tagger { name: "a", panic_on: vec![], seen: seen.clone() })
        .processor(Tagger { name: "a", panic_on: vec![], seen })
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("two processors are named `a`"), "{err}");
}

/// What [`InlineProbe`] saw: every export with its sequence number, whether it came inline
/// ([`Sink::export_inline`]) and on which thread; its flushes.
#[derive(Default)]
struct ProbeLog {
    exports: Vec<(u64, bool, String)>,
    flushes: u32,
}

/// A sink that exports inline. It panics inline at `panic_at`, asks for its flush after
/// `flush_due_at`, and holds that flush on its task while `hold_flush` is set.
#[derive(Clone, Default)]
struct InlineProbe {
    log: std::sync::Arc<std::sync::Mutex<ProbeLog>>,
    panic_at: Option<u64>,
    flush_due_at: Option<u64>,
    hold_flush: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl InlineProbe {
    fn note(&self, seq: u64, inline: bool) {
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        self.log.lock().unwrap().exports.push((seq, inline, thread));
    }

    fn exports(&self) -> Vec<(u64, bool, String)> {
        self.log.lock().unwrap().exports.clone()
    }
}

#[async_trait::async_trait]
impl Sink for InlineProbe {
    fn name(&self) -> &str {
        "inline"
    }
    async fn export(&mut self, snapshot: std::sync::Arc<Snapshot>) -> Result<(), SinkError> {
        self.note(snapshot.seq, false);
        Ok(())
    }
    fn exports_inline(&self) -> bool {
        true
    }
    fn export_inline(&mut self, snapshot: &std::sync::Arc<Snapshot>) -> Result<InlineExport, SinkError> {
        if self.panic_at == Some(snapshot.seq) {
            panic!("inline boom at {}", snapshot.seq);
        }
        self.note(snapshot.seq, true);
        Ok(if self.flush_due_at == Some(snapshot.seq) { InlineExport::FlushDue } else { InlineExport::Done })
    }
    async fn flush(&mut self) -> Result<(), SinkError> {
        self.log.lock().unwrap().flushes += 1;
        while self.hold_flush.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
    async fn shutdown(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

#[tokio::test]
async fn an_inline_sink_exports_on_the_sampling_thread_and_its_panic_is_caught_counted_and_sampling_goes_on() {
    let (clock, rec, builder) = manual(h100x8());
    let probe = InlineProbe { panic_at: Some(3), ..InlineProbe::default() };
    let handle = builder.sink(probe.clone()).spawn().unwrap();
    let status = |h: &AgentHandle| h.sink_status().into_iter().find(|s| s.name == "inline").unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    // The first tick may reach the sink through its task (busy with the healthcheck then); from
    // the second on, its task is idle and every tick is exported inline.
    until("the inline sink's healthcheck", || status(&handle).healthy == Some(true)).await;
    for n in 2..=5 {
        tick(&clock, Duration::from_secs(1), &rec, n).await;
    }
    until("the inline sink saw every tick", || status(&handle).exported + status(&handle).failures == 5).await;
    let s = status(&handle);
    assert_eq!((s.exported, s.failures, s.panics, s.consecutive_failures), (4, 1, 1, 0), "{s:?}");
    assert!(s.last_error.as_deref().is_some_and(|e| e.contains("panicked") && e.contains("inline boom at 3")), "{s:?}");
    let exports = probe.exports();
    let seqs: Vec<u64> = exports.iter().map(|(seq, ..)| *seq).collect();
    assert_eq!(seqs, [1, 2, 4, 5], "in order, once each; the panicking tick lost");
    for (seq, inline, thread) in &exports[1..] {
        assert!(*inline && thread == "gpumon-sampler", "tick {seq}: inline {inline} on {thread:?}");
    }
    // Sampling went on, and the queued sink got every tick.
    let stats = handle.stats();
    assert_eq!((stats.samples_taken, stats.sample_failures, stats.skipped_ticks), (5, 0, 0));
    assert_eq!(rec.snapshots().iter().map(|s| s.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert!(handle.is_running());
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test]
async fn an_inline_sink_busy_on_its_task_gets_its_ticks_through_its_queue_in_order() {
    let (clock, rec, builder) = manual(h100x8());
    let probe = InlineProbe { flush_due_at: Some(2), ..InlineProbe::default() };
    probe.hold_flush.store(true, std::sync::atomic::Ordering::SeqCst);
    let handle = builder.sink(probe.clone()).spawn().unwrap();
    let status = |h: &AgentHandle| h.sink_status().into_iter().find(|s| s.name == "inline").unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    until("the inline sink's healthcheck", || status(&handle).healthy == Some(true)).await;
    // Tick 2 asks for a flush: the runtime runs it on the sink's task, where it hangs.
    tick(&clock, Duration::from_secs(1), &rec, 2).await;
    until("the flush asked for", || probe.log.lock().unwrap().flushes == 1).await;
    // Ticks 3 and 4 find the sink busy: they wait in its queue, sampling goes on.
    tick(&clock, Duration::from_secs(1), &rec, 3).await;
    tick(&clock, Duration::from_secs(1), &rec, 4).await;
    settle().await;
    assert_eq!(probe.exports().iter().map(|(seq, ..)| *seq).collect::<Vec<_>>(), [1, 2], "3 and 4 wait");
    assert_eq!(handle.stats().samples_taken, 4);
    probe.hold_flush.store(false, std::sync::atomic::Ordering::SeqCst);
    until("the queued ticks exported", || probe.exports().len() == 3 + 1).await;
    // With the queue empty and the task idle, tick 5 is inline again.
    tick(&clock, Duration::from_secs(1), &rec, 5).await;
    until("tick 5 exported", || probe.exports().len() == 5).await;
    let exports = probe.exports();
    assert_eq!(exports.iter().map(|(seq, ..)| *seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5], "in order");
    let via: Vec<bool> = exports[1..].iter().map(|(_, inline, _)| *inline).collect();
    assert_eq!(via, [true, false, false, true], "2 and 5 inline, 3 and 4 through the queue");
    assert_eq!(probe.log.lock().unwrap().flushes, 1);
    assert_eq!(status(&handle).dropped, 0);
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test]
async fn after_a_requested_sample_times_out_the_ticks_skipped_behind_it_say_why() {
    let gate = Gate::new();
    // Sample 0 is the first scheduled tick; sample 1, the request, hangs.
    let (clock, rec, builder) = manual(hangs_at(1, &gate));
    let handle = builder.sample_timeout(Duration::from_millis(500)).spawn().unwrap();
    assert!(rec.wait_for(1, WAIT).await);
    let request = tokio::spawn({
        let handle = handle.clone();
        async move { handle.snapshot_now().await }
    });
    until("the requested sample hangs", || gate.waiting() == 1).await;
    clock.advance(Duration::from_millis(500));
    match tokio::time::timeout(WAIT, request).await.unwrap().unwrap() {
        Err(AgentError::Sample(SampleError::Timeout(_))) => {}
        other => panic!("expected the request to time out, got {other:?}"),
    }
    // t = 1 s: the tick is skipped behind the stuck request, and the sinks hear why.
    clock.advance(Duration::from_millis(500));
    assert!(rec.wait_for(2, WAIT).await);
    let reason = rec.snapshots()[1].sampling_failure().map(str::to_owned);
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("timed out") && r.contains("already in flight")),
        "{reason:?}"
    );
    gate.release();
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test]
async fn a_hanging_sample_times_out_on_the_system_clock() {
    // The system clock's watchdog is told by a kernel timer, not woken every tick: it must still
    // abandon a stuck sample at its timeout, report the ticks behind it, and let sampling resume.
    let gate = Gate::new();
    let rec = RecordingSink::new("rec");
    let handle = Agent::builder(hangs_at(2, &gate))
        .interval(Duration::from_millis(100))
        .sample_timeout(Duration::from_millis(150))
        .sink(rec.clone())
        .spawn()
        .unwrap();
    until("the third sample hangs", || gate.waiting() == 1).await;
    let hung_at = Instant::now();
    until("the timeout is reported", || handle.stats().sample_failures == 1).await;
    assert!(hung_at.elapsed() < Duration::from_secs(5), "abandoned {:?} after the hang", hung_at.elapsed());
    until("ticks are skipped behind it", || handle.stats().skipped_ticks >= 2).await;
    assert!(handle.stats().last_sample_error.unwrap().contains("timed out"));
    gate.release();
    let taken = handle.stats().samples_taken;
    until("sampling resumed", || handle.stats().samples_taken >= taken + 3).await;
    let failures: Vec<String> =
        rec.snapshots().iter().filter_map(|s| s.sampling_failure().map(str::to_owned)).collect();
    assert!(failures[0].contains("timed out"), "{failures:?}");
    assert!(failures[1..].iter().all(|r| r.contains("timed out") && r.contains("already in flight")), "{failures:?}");
    handle.shutdown(Duration::from_secs(1)).await.unwrap();
}

/// A sink whose healthcheck hangs (its server accepts and never answers at start-up) loses none
/// of the ticks taken meanwhile: the queue holds the healthcheck's ticks beyond its capacity.
#[tokio::test]
async fn ticks_taken_during_a_hung_startup_healthcheck_are_kept() {
    let hanging = FaultySink::new("slow-start").healthcheck_behavior(Behavior::Stall);
    let calls = hanging.calls();
    // 2 s of healthcheck at a 500 ms interval: 4 ticks held beyond the capacity of 2.
    let options = SinkOptions::default().capacity(2).healthcheck_timeout(Duration::from_secs(2));
    let clock = ManualClock::new();
    let handle = Agent::builder(h100x8())
        .interval(Duration::from_millis(500))
        .clock(clock.clone())
        .sink_with(hanging, options)
        .spawn()
        .unwrap();
    until("the first tick was taken", || handle.stats().samples_taken == 1).await;
    for n in 2..=6 {
        clock.advance(Duration::from_millis(500));
        until("the tick was taken", || handle.stats().samples_taken == n).await;
    }
    assert_eq!(calls.exports(), 0, "still in its healthcheck");
    until("the healthcheck timed out and the queue drained", || calls.exports() == 6).await;
    let status = &handle.sink_status()[0];
    assert_eq!(status.dropped, 0, "{status:?}");
    assert_eq!(status.healthy, Some(false));
}

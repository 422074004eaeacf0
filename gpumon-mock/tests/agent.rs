//! The mock through the real runtime: call order on the sampler seam (mockall), and a hung sample
//! released by a gate.

use std::time::Duration;

use gpumon_core::Agent;
use gpumon_mock::{Fault, Gate, MockSampler, RecordingSink};

/// Polls `cond` for at most ~2 s of real time, moving paused time on by hand: while a sample
/// hangs on the blocking pool, tokio does not auto-advance paused time (a `spawn_blocking` task
/// is in flight), so `sleep` alone would wait forever.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..2000 {
        if cond() {
            return true;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

// The `mockall` seam is behind the `mockall` feature (`--all-features` runs this).
#[cfg(feature = "mockall")]
mod seam {
    use super::*;
    use std::sync::Arc;

    use gpumon_core::{Family, MetricSet, SampleError, Snapshot, SystemInfo};
    use gpumon_mock::MockSamplerSeam;
    use mockall::Sequence;

    fn marked(mark: &str) -> Snapshot {
        Snapshot::new(Arc::new(SystemInfo::new(mark, "seam")), Vec::new())
    }

    #[tokio::test(start_paused = true)]
    async fn agent_calls_the_sampler_in_order() {
        let metrics = MetricSet::default().with(Family::Processes);
        let mut seq = Sequence::new();
        let mut seam = MockSamplerSeam::new();
        seam.expect_name().return_const("seam".to_owned());
        seam.expect_sample()
            .times(1)
            .in_sequence(&mut seq)
            .withf(move |r| r.metrics == metrics && r.devices.is_all())
            .returning(|_| Err(SampleError::unavailable("scripted: first call fails")));
        seam.expect_sample().times(1).in_sequence(&mut seq).returning(|_| Ok(marked("second")));
        seam.expect_sample().times(1).in_sequence(&mut seq).returning(|_| Ok(marked("third")));
        seam.expect_sample().times(0..).in_sequence(&mut seq).returning(|_| Ok(marked("later")));
        let seam = Arc::new(seam);

        let rec = RecordingSink::default();
        let handle = Agent::builder_arc(seam.clone())
            .interval(Duration::from_secs(1))
            .metrics(metrics)
            .sink(rec.clone())
            .spawn()
            .unwrap();
        assert!(rec.wait_for(2, Duration::from_secs(30)).await);
        handle.shutdown(Duration::from_secs(5)).await.unwrap();

        let marks: Vec<(String, u64)> =
            rec.snapshots().iter().take(2).map(|s| (s.system.hostname.clone(), s.seq)).collect();
        assert_eq!(marks, [("second".to_owned(), 1), ("third".to_owned(), 2)]);
        // A call out of sequence would have panicked inside the sampler; the agent counts that.
        assert_eq!(handle.stats().sample_failures, 1, "only the scripted failure");

        // Every expectation was met: checkpoint once the agent has let go of the mock.
        assert!(eventually(|| Arc::strong_count(&seam) == 1).await, "agent still holds the sampler");
        let mut seam = Arc::try_unwrap(seam).ok().unwrap();
        seam.checkpoint();
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_sample_is_skipped_until_the_gate_opens() {
    let gate = Gate::new();
    let sampler =
        MockSampler::builder().fault(Fault::HangUntilReleased { at_tick: 1, gate: gate.clone() }).build().unwrap();
    let rec = RecordingSink::default();
    let handle = Agent::builder(sampler)
        .interval(Duration::from_secs(1))
        .sample_timeout(Duration::from_millis(500))
        .sink(rec.clone())
        .spawn()
        .unwrap();
    assert!(rec.wait_for(1, Duration::from_secs(30)).await, "tick 0 samples normally");
    // Tick 1 hangs: it times out, later ticks are skipped while it is stuck.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(eventually(|| handle.stats().skipped_ticks >= 2).await, "{:?}", handle.stats());
    assert_eq!(rec.len(), 1);
    assert!(handle.stats().sample_failures >= 1);
    gate.release();
    assert!(eventually(|| rec.len() >= 2).await, "sampling resumes after release");
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
}

//! The mock through the real runtime: call order on the sampler seam (mockall). (A hung sample
//! released by a gate is `tests/runtime.rs`'s `a_hanging_sample_is_abandoned_…`.)

// The `mockall` seam is behind the `mockall` feature (`--all-features` runs this).
#[cfg(feature = "mockall")]
mod seam {
    use std::sync::Arc;
    use std::time::Duration;

    use gpumon_core::{Agent, Family, ManualClock, MetricSet, SampleError, Snapshot, SystemInfo};
    use gpumon_mock::{MockSamplerSeam, RecordingSink};
    use mockall::Sequence;

    /// Polls `cond` for at most ~10 s of real time.
    async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        for _ in 0..10_000 {
            if cond() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        cond()
    }

    fn marked(mark: &str) -> Snapshot {
        Snapshot::new(Arc::new(SystemInfo::new(mark, "seam")), Vec::new())
    }

    #[tokio::test]
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
        let clock = ManualClock::new();
        let handle = Agent::builder_arc(seam.clone())
            .interval(Duration::from_secs(1))
            .metrics(metrics)
            .clock(clock.clone())
            .sink(rec.clone())
            .spawn()
            .unwrap();
        // The failed first call reaches the sink too, as a sampling-failed snapshot.
        for n in 1..=3 {
            assert!(rec.wait_for(n, Duration::from_secs(30)).await);
            clock.advance(Duration::from_secs(1));
        }
        handle.shutdown(Duration::from_secs(5)).await.unwrap();

        let snapshots = rec.snapshots();
        assert_eq!(snapshots[0].sampling_failure(), Some("GPU backend unavailable: scripted: first call fails"));
        assert_eq!((snapshots[0].seq, snapshots[0].system.backend.as_str()), (0, "seam"));
        let marks: Vec<(String, u64)> =
            snapshots[1..].iter().take(2).map(|s| (s.system.hostname.clone(), s.seq)).collect();
        assert_eq!(marks, [("second".to_owned(), 1), ("third".to_owned(), 2)]);
        // A call out of sequence would have panicked inside the sampler; the agent counts that.
        assert_eq!(handle.stats().sample_failures, 1, "only the scripted failure");

        // Every expectation was met: checkpoint once the agent has let go of the mock.
        assert!(eventually(|| Arc::strong_count(&seam) == 1).await, "agent still holds the sampler");
        let mut seam = Arc::try_unwrap(seam).ok().unwrap();
        seam.checkpoint();
    }
}

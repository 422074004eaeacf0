//! Record and replay, in process: an agent on a mock scenario that raises and clears findings
//! records its trace; the trace replayed as fast as possible through a fresh diagnosis stage
//! gives the same findings, tick for tick — and the same snapshots, marked `replay`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpumon::core::diagnose::{DiagnoseConfig, Diagnoser};
use gpumon::core::steps::{StepConfig, StepTracker};
use gpumon::core::trace::{RecordSink, ReplaySampler, ReplaySpeed, TraceReader};
use gpumon::core::{Agent, Family, MetricSet, Snapshot, Transition};
use gpumon_mock::test_kit::TempDir;
use gpumon_mock::{FleetProfile, MockSampler, RecordingSink, Scenario};

const TICKS: u64 = 80;

fn diagnoser() -> Diagnoser {
    // A 10 s window at 1 s: raised within 8 ticks, so 80 ticks see raises and clears.
    Diagnoser::new(DiagnoseConfig::default().with_window(Duration::from_secs(10))).unwrap()
}

/// What the live run exports: the default families and the processes.
fn exported() -> MetricSet {
    MetricSet::default().with(Family::Processes)
}

/// The live run: the mock scenario through the step tracker and diagnosis, sampling what a
/// default agent does (the opt-in families diagnosis reads too, not exported), every snapshot
/// recorded whole to `trace` and kept in memory as the sinks get it.
async fn live(scenario: &str, trace: &Path) -> Vec<Arc<Snapshot>> {
    let scenario = match scenario {
        // Findings that clear too: GPU 2's loader starves until the GPU is lost at tick 40.
        "starved-then-lost" => Scenario::from_toml_str(
            "workload = \"training\"\n[devices]\n2 = \"dataloader-starved\"\n\
             [[faults]]\nkind = \"device_lost\"\ndevice = 2\nat_tick = 40\n",
            "starved-then-lost",
        )
        .unwrap(),
        name => Scenario::load(name).unwrap(),
    };
    let sampler = MockSampler::builder()
        .profile(FleetProfile::load("h100x8").unwrap())
        .scenario(scenario)
        .seed(7)
        .build()
        .unwrap();
    let (tracker, registry) = StepTracker::new(StepConfig::every_n(1)).unwrap();
    let kept = RecordingSink::new("kept");
    let handle = Agent::builder(sampler)
        .interval(Duration::from_secs(1))
        .metrics(exported())
        .sample_for_processors(MetricSet::default().with_stage_inputs())
        // Driven tick by tick below: the same ticks however busy this machine is.
        .scheduled(false)
        .processor(tracker)
        .processor(diagnoser())
        .sink(RecordSink::create(trace).unwrap().with_sampling(exported().with_stage_inputs(), true))
        .sink(kept.clone())
        .spawn()
        .unwrap();
    let run = registry.run("train", Some(0)).unwrap();
    for tick in 0..TICKS {
        // A training loop marking a step every other tick: the starvation evidence quotes it.
        if tick % 2 == 1 {
            run.step(tick / 2 + 1).unwrap();
        }
        let _ = handle.flush(Duration::from_secs(10)).await;
    }
    handle.shutdown(Duration::from_secs(10)).await.unwrap();
    kept.snapshots()
}

/// The trace played back as fast as possible through a fresh diagnosis stage, exporting what
/// the live run did (as the agent assembles a replay: what the trace recorded is sampled).
async fn replay(trace: &Path) -> Vec<Arc<Snapshot>> {
    let sampler = ReplaySampler::open(trace).unwrap();
    assert_eq!(sampler.header().interval, Some(Duration::from_secs(1)));
    let recorded = sampler.header().metric_set().unwrap();
    let progress = sampler.progress();
    let kept = RecordingSink::new("kept");
    let handle = Agent::builder(sampler)
        .interval(Duration::from_secs(1))
        .metrics(exported())
        .sample_for_processors(recorded)
        .scheduled(false)
        .processor(diagnoser())
        .sink(kept.clone())
        .spawn()
        .unwrap();
    let played = progress.play(&handle, ReplaySpeed::Max, Duration::from_secs(10)).await.unwrap();
    assert_eq!(played, TICKS);
    handle.shutdown(Duration::from_secs(10)).await.unwrap();
    kept.snapshots()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_recorded_trace_gives_the_live_runs_findings() {
    let dir = TempDir::new("replay");
    let (mut raised, mut cleared) = (0, 0);
    for scenario in ["dataloader-starved", "imbalance", "thermal-throttling", "ecc-burst", "starved-then-lost"] {
        let trace = dir.path().join(format!("{scenario}.gpumon-trace.gz"));
        let live = live(scenario, &trace).await;
        let replayed = replay(&trace).await;
        assert_eq!(live.len(), TICKS as usize, "{scenario}");
        assert_eq!(replayed.len(), live.len(), "{scenario}");
        for (l, r) in live.iter().zip(&replayed) {
            let at = format!("{scenario}, seq {}", l.seq);
            // The same findings: raised and cleared at the same tick, with the same evidence,
            // times and totals.
            assert_eq!(r.output::<gpumon::core::Diagnosis>(), l.output::<gpumon::core::Diagnosis>(), "{at}");
            // Because the stage saw the same data, at the recorded times.
            assert_eq!((r.seq, r.taken_at, r.duration), (l.seq, l.taken_at, l.duration), "{at}");
            assert_eq!(r.devices, l.devices, "{at}");
            assert_eq!(r.output::<gpumon::core::steps::Steps>(), l.output::<gpumon::core::steps::Steps>(), "{at}");
            // Marked: replayed data never passes for a GPU's live data.
            assert_eq!((l.system.backend.as_str(), r.system.backend.as_str()), ("mock", "replay"), "{at}");
            assert_eq!(r.system.hostname, l.system.hostname, "{at}");
        }
        for s in &live {
            for e in &s.output::<gpumon::core::Diagnosis>().unwrap().events {
                raised += usize::from(e.transition == Transition::Raised);
                cleared += usize::from(e.transition == Transition::Cleared);
            }
        }
        if scenario == "dataloader-starved" {
            let steps = live.iter().filter(|s| s.output::<gpumon::core::steps::Steps>().is_some()).count();
            assert!(steps > 0, "the trace carries the recorded steps");
        }
    }
    assert!(raised >= 5 && cleared >= 1, "the scenarios raise and clear findings: {raised} raised, {cleared} cleared");
}

/// The limitations of a replay are those of what its trace carries: a replay runs no step
/// tracker (as the agent assembles it: no step marks in its settings), but a trace with the
/// recorded steps does not advise marking them, as the live run's report did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_a_trace_with_steps_does_not_advise_marking_steps() {
    use gpumon::core::diagnose::Sampling;
    use gpumon::core::report::RunReport;
    use gpumon::core::FindingKind;
    let dir = TempDir::new("replay");
    let trace = dir.path().join("steps.gpumon-trace.gz");
    let live = live("dataloader-starved", &trace).await;
    assert!(live.iter().any(|s| s.output::<gpumon::core::steps::Steps>().is_some()), "steps were recorded");

    let config = DiagnoseConfig::default().with_window(Duration::from_secs(10));
    let interval = Duration::from_secs(1);
    let (report, handle) = RunReport::new();
    let report = report.with_diagnosis(&config, Sampling::new(interval, MetricSet::default()).step_marks(false));
    let sampler = ReplaySampler::open(&trace).unwrap();
    let progress = sampler.progress();
    let agent = Agent::builder(sampler)
        .interval(interval)
        .scheduled(false)
        .processor(Diagnoser::new(config).unwrap())
        .processor(report)
        .spawn()
        .unwrap();
    progress.play(&agent, ReplaySpeed::Max, Duration::from_secs(10)).await.unwrap();
    agent.shutdown(Duration::from_secs(10)).await.unwrap();
    let r = handle.report();
    assert!(r.steps.is_some(), "the report has the recorded steps");
    let starvation = r
        .overview
        .limitations
        .iter()
        .find(|l| l.rules == [FindingKind::DataloaderStarvation])
        .expect("the driver-period caveat");
    assert!(starvation.remedy.starts_with("step marks are read"), "{starvation}");
    assert!(!r.to_string().contains("mark training steps"), "{r}");
}

#[test]
fn the_trace_of_a_live_run_reads_back_whole() {
    let dir = TempDir::new("replay");
    let trace = dir.path().join("whole.gpumon-trace.gz");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let live = rt.block_on(live("imbalance", &trace));
    let reader = TraceReader::open(&trace).unwrap();
    let header = reader.header().clone();
    assert_eq!(header.backend, "mock");
    assert_eq!(header.devices.len(), 8);
    assert_eq!(header.devices[0].uuid, live[0].devices[0].info.uuid);
    let read: Vec<Snapshot> = reader.map(Result::unwrap).collect();
    assert_eq!(read.len(), live.len());
    let sampled = header.metric_set().unwrap();
    assert_eq!(sampled, exported().with_stage_inputs(), "the header names what was sampled");
    for (r, l) in read.iter().zip(&live) {
        assert!(r.output::<gpumon::core::Diagnosis>().is_none(), "diagnosis is recomputed, never stored");
        // The trace holds what diagnosis read, the sinks got less.
        assert!(r.devices.iter().all(|d| d.windows.gpu_utilization.is_some()), "the windows are recorded");
        assert!(l.devices.iter().all(|d| d.windows.gpu_utilization.is_none()), "no sink got a window");
        let mut narrowed = r.clone();
        narrowed.retain_exported(sampled, exported());
        assert_eq!((r.seq, &narrowed.devices, &r.system), (l.seq, &l.devices, &l.system));
    }
}

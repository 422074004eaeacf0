//! [`Assembly::build`]: a config in, an agent out — the sampler by the backend rule, every sink,
//! every stage in its order, and the stages' background services as typed handles.

use std::sync::Arc;

use gpumon_core::diagnose::{Limitation, Sampling};
use gpumon_core::report::ReportHandle;
use gpumon_core::steps::StepRegistry;
use gpumon_core::trace::{ReplayProgress, ReplaySpeed, TraceHeader};
use gpumon_core::{Agent, AgentBuilder, DeviceFilter, MetricSet, Sampler};

use super::backend::{self, Backend, Source};
use super::config::AgentConfig;
use super::error::AssemblyError;
use super::plan::{AssemblyOptions, Parts, Plan};
use super::sinks::build::{self as sinks, Marks};
use super::sinks::Listeners;
use gpumon_core::stages::Services;

/// A trace being played back (`replay.file`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Replay {
    /// How far the sampler has got; [`ReplayProgress::play`] hands every snapshot to every sink.
    pub progress: ReplayProgress,
    /// How fast to play it (`replay.speed`).
    pub speed: ReplaySpeed,
    /// The trace's header: who recorded it, on which backend and host, at which interval.
    pub header: TraceHeader,
    /// The recorded GPUs the device selection keeps.
    pub gpus: usize,
}

/// An agent assembled from a config: the builder with every sink and stage added, and what runs
/// beside it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Assembled {
    /// The agent: the sampler, the interval, the families and devices, every sink, and the
    /// stages in order (attribution, the step tracker, diagnosis, the report). Spawn it
    /// ([`AgentBuilder::spawn`]) or build it.
    pub builder: AgentBuilder,
    /// What samples the GPUs, by the backend rule ([`backend::select`]); say a fallback.
    /// `None` when a trace is replayed ([`Assembled::replay`]).
    pub source: Option<Source>,
    /// The trace played back, with `backend = "replay"`: the agent takes no sample on its own
    /// clock; [`ReplayProgress::play`] hands each recorded snapshot on. The step tracker and
    /// attribution are not added (they read this host now; the trace carries the recorded steps
    /// and owners).
    pub replay: Option<Replay>,
    /// The sampler the builder holds, when GPUs are sampled (not a replay):
    /// [`Assembled::visible_devices`] asks it which devices there are before the agent runs.
    sampler: Option<SamplerRef>,
    /// The stages' background services (the steps socket, the kubelet refresher): start them
    /// once the agent runs.
    pub services: Services,
    /// The step tracker's registry, when one was added (`steps.socket`, or
    /// [`AssemblyOptions::in_process_steps`]): mark steps in this process through it.
    pub steps: Option<StepRegistry>,
    /// The path the steps socket is served at (`steps.socket`, checked), when one was added:
    /// what a command run under the agent is told to connect to.
    pub steps_socket: Option<std::path::PathBuf>,
    /// The run report, when [`AssemblyOptions::report`].
    pub report: Option<ReportHandle>,
    /// The settings under which diagnosis rules cannot work (empty when diagnosis is off): say
    /// them at start-up.
    pub limitations: Vec<Limitation>,
    /// The sinks' listeners.
    pub listeners: Listeners,
    /// What the agent was built from: the config and the options resolved, every value checked
    /// (the interval, the devices, the families, the sinks' queues, the timeouts, the mock's
    /// settings, the diagnosis window, the steps socket's path).
    pub plan: Plan,
}

/// The assembled agent's sampler, shared with its builder.
struct SamplerRef(Arc<dyn Sampler>);

impl std::fmt::Debug for SamplerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sampler")
    }
}

impl Assembled {
    /// Every device the sampler sees now, before the device selection (one enumeration, no
    /// metric read), so that a selection naming a GPU the node does not have can be refused at
    /// start; `None` when a trace is replayed.
    ///
    /// ## Errors
    ///
    /// The sampler's own, when it cannot enumerate now (a lazy NVML sampler without a driver).
    pub fn visible_devices(&self) -> Option<Result<Vec<Arc<gpumon_core::DeviceInfo>>, gpumon_core::SampleError>> {
        use gpumon_core::SampleRequest;
        let sampler = &self.sampler.as_ref()?.0;
        let request = SampleRequest::new(MetricSet::nothing(), DeviceFilter::all());
        Some(sampler.sample(&request).map(|s| s.devices.into_iter().map(|d| d.info).collect()))
    }
}

/// Builds an agent from an [`AgentConfig`]; see the [module docs](super).
#[derive(Debug)]
#[non_exhaustive]
pub struct Assembly;

impl Assembly {
    /// Resolves `config` and `options` without building anything: every value the agent would
    /// be built from, each checked (the errors are [`Assembly::build`]'s configuration errors).
    /// A replayed trace is opened to read its interval.
    ///
    /// ## Errors
    ///
    /// [`AssemblyError`]: a bad setting, naming its key; a trace that cannot be read.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gpumon::assembly::{config::AgentConfig, Assembly, AssemblyOptions};
    ///
    /// let config: AgentConfig = "[agent]\ninterval = \"2s\"\n".parse()?;
    /// let plan = Assembly::plan(&config, &AssemblyOptions::default())?;
    /// assert_eq!(plan.interval, Duration::from_secs(2));
    /// // The default window spans enough ticks of a long interval: derived here, once.
    /// assert_eq!(plan.diagnosis_window, Duration::from_secs(30));
    /// assert_eq!(plan.mock.interval, plan.interval);
    ///
    /// let too_fast: AgentConfig = "[agent]\ninterval = \"10ms\"\n".parse()?;
    /// let e = Assembly::plan(&too_fast, &AssemblyOptions::default()).unwrap_err();
    /// assert_eq!(e.key(), Some("agent.interval"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plan(config: &AgentConfig, options: &AssemblyOptions) -> Result<Plan, AssemblyError> {
        Plan::resolve(config, options).map(|(plan, _)| plan)
    }

    /// Resolves every section of `config` (each error names its key), builds the sinks (binding
    /// their listeners), selects the sampler by the backend rule — `auto` falls back to the mock
    /// only when no sink exports — and adds the stages in order: attribution (the stages after it
    /// read owners), the step tracker (diagnosis reads each tick's steps), diagnosis, and the
    /// run report (it reads each tick's findings).
    ///
    /// ## Errors
    ///
    /// [`AssemblyError`]: a bad setting (naming its key), a sink that cannot be built, a section
    /// this build has no feature for, a trace that cannot be read, or no sampler
    /// ([`AssemblyError::Backend`]; [`AssemblyError::is_config`] tells a bad setting from a
    /// backend that cannot run here).
    ///
    /// ## Panics
    ///
    /// Outside a tokio runtime when a sink serves a listener (Prometheus, the web view).
    pub fn build(config: &AgentConfig, options: AssemblyOptions) -> Result<Assembled, AssemblyError> {
        let (plan, parts) = Plan::resolve(config, &options)?;
        let Parts { replay, mut attribution, mut diagnose, steps } = parts;
        let Plan { backend, interval, metrics, .. } = plan;
        let devices = plan.devices.clone();
        if !attribution.processes && sinks::has_tenants(config) {
            // Allowed (a tenant may be configured ahead of attribution), but almost always a
            // mistake: without owners no GPU is any tenant's.
            tracing::warn!(
                "tenants are configured but attribution is off: every tenant sees no GPU \
                 (attribution.enabled = true or --attribution; docs/tenancy.md)"
            );
        }

        let mark = match backend {
            Backend::Mock => Some("mock"),
            Backend::Replay => Some(gpumon_core::REPLAY_BACKEND),
            Backend::Auto | Backend::Nvml => None,
        };
        let host = options.host.as_deref();
        // What is sampled: for a replay, what its trace recorded (a trace from before headers
        // said so: the flags), as the run that recorded it had it; the flags add nothing. Live,
        // the selection (exported) and the opt-in families the stages read (not exported).
        let (sampled, step_marks) = match &replay {
            Some((sampler, _)) => {
                let header = sampler.header();
                (header.metric_set().unwrap_or(metrics), header.step_marks.unwrap_or(false))
            }
            None => (metrics.union(plan.stage_inputs), steps.tracker.is_some()),
        };
        let recorded_backend =
            replay.as_ref().map(|(sampler, _)| sampler.header().backend.as_str()).filter(|b| !b.is_empty());
        let marks = Marks { backend: mark, recorded_backend, host, sampling: (sampled, step_marks) };
        let built = sinks::build(config, marks, options.report)?;
        let exporting = built.exporting();
        let listeners = built.listeners;

        let (mut builder, source, sampler, replay, sampling) = match replay {
            Some((sampler, speed)) => {
                let header = sampler.header().clone();
                let gpus = header.devices.iter().filter(|d| devices.allows(d)).count();
                let progress = sampler.progress();
                // Each snapshot is handed out by `play`, never by the clock.
                let builder = Agent::builder(sampler).scheduled(false);
                let sampling = Sampling::new(interval, sampled).devices(gpus).step_marks(step_marks);
                (builder, None, None, Some(Replay { progress, speed, header, gpus }), sampling)
            }
            None => {
                let selected = backend::select(backend, exporting, &plan.nvml, &plan.mock, options.mock)?;
                let builder = Agent::builder_arc(selected.sampler.clone()).scheduled(!options.once);
                let sampling = Sampling::new(interval, sampled).step_marks(step_marks);
                (builder, Some(selected.source), Some(SamplerRef(selected.sampler)), None, sampling)
            }
        };
        builder = builder.interval(interval).metrics(metrics).sample_for_processors(sampled).devices(devices);
        if let Some(t) = plan.sample_timeout {
            builder = builder.sample_timeout(t);
        }
        if let Some(host) = host {
            builder = builder.hostname(host.to_owned());
        }
        for sink in built.sinks {
            builder = builder.boxed_sink(sink, plan.sink_options);
        }
        let mut services = Services::default();
        let mut step_registry = None;
        let mut steps_socket = None;
        if replay.is_none() {
            // Attribution first, then the step tracker before diagnosis: processors run in order.
            builder = attribution.install(builder);
            if let Some((tracker, registry)) = steps.tracker {
                builder = builder.processor(tracker);
                step_registry = Some(registry);
            }
            if let Some(socket) = steps.socket {
                steps_socket = Some(socket.path().to_owned());
                services.add(socket);
            }
            if let Some(kubelet) = attribution.kubelet.take() {
                services.add(kubelet);
            }
        }
        let limitations = diagnose.limitations(&sampling);
        let (builder, report) = diagnose.install(builder, sampling, options.report);
        Ok(Assembled {
            builder,
            source,
            sampler,
            replay,
            services,
            steps: step_registry,
            steps_socket,
            report,
            limitations,
            listeners,
            plan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assembly::backend::BackendError;

    fn config(text: &str) -> AgentConfig {
        text.parse().unwrap()
    }

    /// An embedder's own device selection wins over `agent.devices`; the in-process step tracker
    /// is there without a socket, and marks through its registry reach the snapshots.
    #[cfg(feature = "mock")]
    #[test]
    fn an_embedder_chooses_devices_and_marks_steps_in_process() {
        let config = config("[agent]\nbackend = \"mock\"\ndevices = \"0,1,2\"\n[mock]\nprofile = \"a100x4\"\n");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let plain = Assembly::build(&config, AssemblyOptions::default().with_once(true)).unwrap();
            assert!(plain.steps.is_none(), "no socket, no in-process steps: no tracker");
            assert_eq!(plain.visible_devices().unwrap().unwrap().len(), 4, "every device, before the selection");

            let options = AssemblyOptions::default()
                .with_once(true)
                .with_devices(DeviceFilter::parse("3").unwrap())
                .with_in_process_steps(true);
            let assembled = Assembly::build(&config, options).unwrap();
            let run = assembled.steps.as_ref().expect("the in-process tracker").run("train", None).unwrap();
            let handle = assembled.builder.spawn().unwrap();
            let mut snapshots = handle.subscribe();
            run.step(1).unwrap();
            run.step(2).unwrap();
            handle.flush(std::time::Duration::from_secs(10)).await.unwrap();
            let snapshot = snapshots.recv().await.unwrap();
            let indices: Vec<u32> = snapshot.devices.iter().map(|d| d.info.index).collect();
            assert_eq!(indices, [3], "the embedder's selection, not agent.devices");
            let steps = snapshot.output::<gpumon_core::steps::Steps>().expect("the tracker's output");
            let run = steps.runs.iter().find(|r| r.job == "train").expect("the run");
            assert_eq!(run.last_step, Some(2), "the marks reached the snapshot: {steps:?}");
            handle.shutdown(std::time::Duration::from_secs(5)).await.unwrap();
        });
    }

    /// Every refusal names its key, before anything runs.
    #[cfg(feature = "mock")]
    #[test]
    fn errors_name_their_key() {
        let cases = [
            ("[agent]\ninterval = \"10ms\"\n", Some("agent.interval")),
            ("[agent]\ndevices = \"gpu0\"\n", Some("agent.devices")),
            ("[agent]\nsink_queue = 0\n", Some("agent.sink_queue")),
            // Large enough to abort on allocation before it was bounded.
            ("[agent]\nsink_queue = 99999999999999\n", Some("agent.sink_queue")),
            ("[agent]\nexport_timeout = \"0s\"\n", Some("agent.export_timeout")),
            ("[diagnose]\nwindow = \"100000000h\"\n", Some("diagnose.window")),
            ("[agent]\nenable = [\"telepathy\"]\n", Some("agent.enable")),
            ("[steps]\nsocket = \"/tmp/s\"\nevery_n = 0\n", Some("steps.every_n")),
            ("[diagnose]\nwindow = \"500ms\"\n", Some("diagnose.window")),
            ("[attribution]\nenabled = true\n[agent]\ndisable = [\"processes\"]\n", Some("attribution.enabled")),
            ("[record]\nfile = \"/nonexistent/dir/t.gz\"\n", Some("record.file")),
            ("[replay]\nfile = \"/nonexistent/t.gz\"\n", Some("replay.file")),
            ("[agent]\nbackend = \"nvml\"\n[replay]\nfile = \"/x.gz\"\n", Some("replay.file")),
            ("[agent]\nbackend = \"replay\"\n", None),
            ("[agent]\nbackend = \"mock\"\n[mock]\nprofile = \"dgx-z9\"\n", None),
        ];
        for (text, key) in cases {
            let e = Assembly::build(&config(text), AssemblyOptions::default()).unwrap_err();
            assert_eq!(e.key(), key, "{text}: {e}");
            assert!(e.is_config(), "{text}: {e}");
            if let Some(key) = key {
                assert!(e.to_string().starts_with(&format!("{key}: ")), "{e}");
            }
        }
        let e = Assembly::build(&config("[agent]\nbackend = \"mock\"\n"), AssemblyOptions::default().with_mock(None))
            .unwrap_err();
        assert!(matches!(e, AssemblyError::Backend(BackendError::NoMock)) && !e.is_config(), "{e}");
    }

    /// Stdout is the sink when nothing else (and no report) is; the trace keeps the data local,
    /// so `auto` may still fall back to the mock.
    #[cfg(feature = "mock")]
    #[test]
    fn stdout_by_default_and_the_mock_only_when_nothing_is_exported() {
        let no_nvml = "[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n";
        let local = Assembly::build(&config(no_nvml), AssemblyOptions::default()).unwrap();
        assert!(matches!(local.source, Some(Source::MockFallback { .. })), "{:?}", local.source);
        assert!(local.report.is_none() && local.services.is_empty() && local.replay.is_none());
        let reported = Assembly::build(&config(no_nvml), AssemblyOptions::default().with_report(true)).unwrap();
        assert!(reported.report.is_some());
        let dir = std::env::temp_dir().join(format!("gpumon-assembly-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("t.gz");
        let text = format!("{no_nvml}[record]\nfile = {:?}\n", trace.display().to_string());
        let recorded = Assembly::build(&config(&text), AssemblyOptions::default()).unwrap();
        assert!(matches!(recorded.source, Some(Source::MockFallback { .. })), "{:?}", recorded.source);
        drop(recorded);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A listener makes the data leave the process: no simulated data then, and the listener's
    /// address is handed back; the steps socket is a service to start.
    #[cfg(all(feature = "mock", feature = "prometheus"))]
    #[tokio::test]
    async fn listeners_and_services_are_handed_back() {
        let dir = std::env::temp_dir().join(format!("gpumon-assembly-steps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("steps.sock");
        let text = format!(
            "[agent]\nbackend = \"mock\"\n[prometheus]\nlisten = \"127.0.0.1:0\"\n[steps]\nsocket = {:?}\n",
            socket.display().to_string()
        );
        let mut assembled = Assembly::build(&config(&text), AssemblyOptions::default().with_host("node-7")).unwrap();
        assert_eq!(assembled.source, Some(Source::Mock));
        let prometheus = assembled.listeners.prometheus.expect("a listener");
        assert!(prometheus.addr.port() != 0 && prometheus.url().starts_with("http://127.0.0.1:"), "{prometheus:?}");
        assert_eq!(
            assembled.services.get::<crate::assembly::StepsSocket>().map(crate::assembly::StepsSocket::path),
            Some(socket.as_path())
        );
        assert!(!assembled.services.report_at_the_next_tick());
        assembled.services.start().unwrap();
        assert!(assembled.services.report_at_the_next_tick() && socket.exists());
        assembled.services.stop().await;
        assert!(
            !assembled.services.report_at_the_next_tick() && !socket.exists(),
            "the socket file is removed at stop"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

//! [`Assembly::build`]: a config in, an agent out — the sampler by the backend rule, every sink,
//! every stage in its order, and the stages' background services as typed handles.

use std::sync::Arc;
use std::time::Duration;

use gpumon_core::diagnose::{Limitation, Sampling};
use gpumon_core::report::ReportHandle;
use gpumon_core::steps::StepRegistry;
use gpumon_core::trace::{ReplayProgress, ReplaySampler, ReplaySpeed, TraceHeader};
use gpumon_core::{Agent, AgentBuilder, DeviceFilter, Family, MetricSet, Sampler, SinkOptions, MAX_SINK_QUEUE};

use super::backend::{self, Backend, BackendError, MockFactory, MockOptions, NvmlOptions, Source};
use super::config::{AgentConfig, AgentSection};
use super::error::AssemblyError;
use super::sinks::build::{self as sinks, Marks};
use super::sinks::Listeners;
use super::stages;
use gpumon_core::stages::Services;

/// Metric families chosen beside the config, over `agent.only` / `agent.enable` /
/// `agent.disable` (the agent's `--only`, `--enable` and `--disable`): `only` is the exact set,
/// whatever the config says; `enable` and `disable` refine the config's selection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Families {
    /// Exactly these families (the config's `only`, `enable` and `disable` are then ignored).
    pub only: Option<Vec<Family>>,
    /// Families turned on over the config's selection.
    pub enable: Vec<Family>,
    /// Families turned off over the config's selection.
    pub disable: Vec<Family>,
}

impl Families {
    /// Exactly `families`.
    pub fn only(families: impl IntoIterator<Item = Family>) -> Self {
        Self { only: Some(families.into_iter().collect()), ..Self::default() }
    }

    /// `families` turned on, over the config's selection.
    pub fn with_enabled(mut self, families: impl IntoIterator<Item = Family>) -> Self {
        self.enable.extend(families);
        self
    }

    /// `families` turned off, over the config's selection.
    pub fn with_disabled(mut self, families: impl IntoIterator<Item = Family>) -> Self {
        self.disable.extend(families);
        self
    }
}

/// What the assembly takes beside the config: what a run is rather than what the agent is.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AssemblyOptions {
    /// The host name for the `host` label, OTLP's `host.name` and the Pushgateway's `instance`
    /// (default: the system's).
    pub host: Option<String>,
    /// One sample on demand ([`gpumon_core::AgentHandle::flush`]) rather than one per interval.
    pub once: bool,
    /// Add the run report after diagnosis ([`Assembled::report`]); with it, stdout is not the
    /// default sink (the report is output of its own).
    pub report: bool,
    /// Metric families chosen beside the config.
    pub families: Families,
    /// The mock backend (default [`backend::MOCK`], this build's).
    pub mock: Option<MockFactory>,
    /// The device selection, over `agent.devices` and the environment (an embedder that
    /// resolves its own, such as gpumon-py's per-rank `Monitor`).
    pub devices: Option<DeviceFilter>,
    /// Add the step tracker even without `steps.socket`, for steps marked in this process
    /// through [`Assembled::steps`].
    pub in_process_steps: bool,
}

impl Default for AssemblyOptions {
    fn default() -> Self {
        Self {
            host: None,
            once: false,
            report: false,
            families: Families::default(),
            mock: backend::MOCK,
            devices: None,
            in_process_steps: false,
        }
    }
}

impl AssemblyOptions {
    /// The host name override.
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// One sample on demand rather than one per interval.
    pub fn with_once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }

    /// The run report after diagnosis.
    pub fn with_report(mut self, report: bool) -> Self {
        self.report = report;
        self
    }

    /// Metric families chosen beside the config.
    pub fn with_families(mut self, families: Families) -> Self {
        self.families = families;
        self
    }

    /// The mock backend to use (`None`: none in this build).
    pub fn with_mock(mut self, mock: Option<MockFactory>) -> Self {
        self.mock = mock;
        self
    }

    /// The device selection, over `agent.devices` and the environment.
    pub fn with_devices(mut self, devices: DeviceFilter) -> Self {
        self.devices = Some(devices);
        self
    }

    /// The step tracker even without `steps.socket` ([`Assembled::steps`]).
    pub fn with_in_process_steps(mut self, on: bool) -> Self {
        self.in_process_steps = on;
        self
    }
}

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
    /// The sampling interval (a replayed trace's own).
    pub interval: Duration,
    /// The families exported (the selection; the stages may read more, see
    /// [`Family::READ_BY_STAGES`]).
    pub metrics: MetricSet,
    /// Every sink's queue and export timeout.
    pub sink_options: SinkOptions,
    /// How long shutdown may take (`agent.shutdown_timeout`).
    pub shutdown_timeout: Duration,
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
        let a = &config.agent;
        let (backend, replay) = replay(config)?;
        let recorded = replay.as_ref().and_then(|(sampler, _)| sampler.header().interval);
        let plan = AgentPlan::resolve(config, &options, recorded)?;
        let AgentPlan { interval, devices, sink_options, .. } = plan.clone();
        let mut attribution = stages::attribution(&config.attribution)?;
        if !attribution.processes && sinks::has_tenants(config) {
            // Allowed (a tenant may be configured ahead of attribution), but almost always a
            // mistake: without owners no GPU is any tenant's.
            tracing::warn!(
                "tenants are configured but attribution is off: every tenant sees no GPU \
                 (attribution.enabled = true or --attribution; docs/tenancy.md)"
            );
        }
        let processes = Family::Processes.name();
        let processes_disabled =
            a.disable.iter().any(|n| n.trim() == processes) || options.families.disable.contains(&Family::Processes);
        let metrics = attribution.metrics(metrics(a, &options.families)?, processes_disabled)?;
        let mut diagnose = stages::diagnose(&config.diagnose, interval)?;
        let steps = stages::steps(&config.steps, options.in_process_steps)?;
        let stages_run =
            diagnose.is_on() || steps.tracker.is_some() || options.report || metrics.contains(Family::Accounts);
        let for_stages = stage_inputs(a, &options.families, stages_run)?;

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
            None => (for_stages.iter().fold(metrics, MetricSet::with), steps.tracker.is_some()),
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
                let nvml = NvmlOptions::from_config(config, metrics.contains(Family::Xid));
                let mock = MockOptions::from_config(config);
                let selected = backend::select(backend, exporting, &nvml, &mock, options.mock)?;
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
            builder = builder.boxed_sink(sink, sink_options);
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
            interval,
            metrics,
            sink_options,
            shutdown_timeout: plan.shutdown_timeout,
        })
    }
}

/// The `[agent]` settings resolved once from the config and the options: every default applied
/// and every value checked against its bounds, each error naming its key. Building reads these,
/// never the raw section.
#[derive(Clone, Debug)]
struct AgentPlan {
    /// The sampling interval: a replayed trace's own, else `agent.interval` or the default.
    interval: Duration,
    /// The device selection: the options', else `agent.devices`, else the environment's.
    devices: DeviceFilter,
    /// Every sink's queue (`agent.sink_queue`) and export timeout (`agent.export_timeout`).
    sink_options: SinkOptions,
    /// `agent.sample_timeout` (the runtime's default when unset).
    sample_timeout: Option<Duration>,
    /// `agent.shutdown_timeout`, or its default.
    shutdown_timeout: Duration,
}

impl AgentPlan {
    /// Resolves `[agent]`; `recorded` is a replayed trace's interval.
    fn resolve(
        config: &AgentConfig,
        options: &AssemblyOptions,
        recorded: Option<Duration>,
    ) -> Result<Self, AssemblyError> {
        let a = &config.agent;
        let mut interval = config.interval();
        // A replay runs at the recorded interval: the diagnosis windows and the report count
        // ticks of it, and a window of other ticks would not give the recorded findings.
        if let Some(recorded) = recorded {
            if a.interval.is_some_and(|i| i != recorded) {
                tracing::warn!(?recorded, "replay: --interval / agent.interval ignored; the trace's interval is used");
            }
            interval = recorded;
        }
        let interval = gpumon_core::Interval::new(interval)
            .map_err(|e| AssemblyError::invalid("agent.interval", e.to_string()))?
            .get();
        let devices = match (&options.devices, &a.devices) {
            (Some(chosen), _) => chosen.clone(),
            (None, Some(list)) => {
                DeviceFilter::parse(list).map_err(|e| AssemblyError::invalid("agent.devices", e.to_string()))?
            }
            (None, None) => {
                DeviceFilter::from_env().map_err(|e| AssemblyError::invalid("environment", e.to_string()))?
            }
        };
        let mut sink_options = SinkOptions::default();
        if let Some(q) = a.sink_queue {
            if !(1..=MAX_SINK_QUEUE).contains(&q) {
                return Err(AssemblyError::invalid("agent.sink_queue", format!("must be 1 to {MAX_SINK_QUEUE}")));
            }
            sink_options = sink_options.capacity(q);
        }
        if let Some(t) = a.export_timeout {
            // Checked here too, so that the error names the key the user wrote (the runtime
            // names the setting of one sink).
            if t.is_zero() {
                return Err(AssemblyError::invalid("agent.export_timeout", "must be greater than zero"));
            }
            sink_options = sink_options.export_timeout(t);
        }
        Ok(Self {
            interval,
            devices,
            sink_options,
            sample_timeout: a.sample_timeout,
            shutdown_timeout: config.shutdown_timeout(),
        })
    }
}

/// The backend, and the trace when it is `replay`. A trace (`replay.file`) without a backend
/// means `replay`; with another backend it is refused, since which one was meant is not obvious.
fn replay(config: &AgentConfig) -> Result<(Backend, Option<(ReplaySampler, ReplaySpeed)>), AssemblyError> {
    let trace = config.replay.file.as_ref();
    let backend = match (config.agent.backend, trace) {
        (None | Some(Backend::Replay), Some(_)) => Backend::Replay,
        (Some(Backend::Replay), None) => return Err(BackendError::NoTrace.into()),
        (Some(other), Some(_)) => return Err(AssemblyError::TraceWithBackend { backend: other }),
        (backend, None) => backend.unwrap_or_default(),
    };
    let Some(path) = trace else { return Ok((backend, None)) };
    let speed = |text: String| text.parse::<ReplaySpeed>().map_err(|e| AssemblyError::invalid("replay.speed", e));
    let speed = match &config.replay.speed {
        Some(toml::Value::String(text)) => speed(text.clone())?,
        Some(toml::Value::Integer(n)) => speed((*n as f64).to_string())?,
        Some(toml::Value::Float(f)) => speed(f.to_string())?,
        Some(other) => {
            return Err(AssemblyError::invalid("replay.speed", format!("expected \"max\" or a number, got {other}")))
        }
        None => ReplaySpeed::default(),
    };
    let sampler = ReplaySampler::open(path).map_err(AssemblyError::Trace)?;
    // The sampler has read its first snapshot ahead: finished already, it has none to play.
    let progress = sampler.progress();
    if progress.is_finished() {
        let header = sampler.header();
        return Err(AssemblyError::NoSnapshot {
            path: path.clone(),
            host: header.system.hostname.clone(),
            gpus: header.devices.len(),
            cause: progress.error(),
        });
    }
    Ok((backend, Some((sampler, speed))))
}

/// Metric families by name, for `key`: an unknown name is an error naming the key and every
/// known family; blank names are skipped.
///
/// ## Errors
///
/// [`AssemblyError::Invalid`] for the first unknown name.
pub fn parse_families(names: &[String], key: &str) -> Result<Vec<Family>, AssemblyError> {
    names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| {
            Family::from_name(n).ok_or_else(|| {
                let known: Vec<_> = Family::ALL.iter().map(|f| f.name()).collect();
                AssemblyError::invalid(key, format!("unknown metric family `{n}` (known: {})", known.join(", ")))
            })
        })
        .collect()
}

/// The opt-in families the built-in stages read ([`Family::READ_BY_STAGES`]), to sample for
/// them only: none when no stage runs (`stages_run`) or the selection is exact (`agent.only`,
/// `--only`: what it names is all that is read), and none that `agent.disable` or `--disable`
/// names (switched off: not read at all).
fn stage_inputs(a: &AgentSection, overrides: &Families, stages_run: bool) -> Result<MetricSet, AssemblyError> {
    if !stages_run || overrides.only.is_some() || a.only.is_some() {
        return Ok(MetricSet::nothing());
    }
    let disabled = parse_families(&a.disable, "agent.disable")?;
    Ok(Family::READ_BY_STAGES.into_iter().filter(|f| !disabled.contains(f) && !overrides.disable.contains(f)).collect())
}

/// The families to sample and export. `overrides.only` is the exact set (the config's selection ignored);
/// `agent.only` is the config's exact set, which `overrides.enable`/`disable` refine. `only`
/// with `enable`/`disable` in the config is refused (which would win is not obvious).
fn metrics(a: &AgentSection, overrides: &Families) -> Result<MetricSet, AssemblyError> {
    let set = |families: &[Family]| families.iter().copied().fold(MetricSet::nothing(), MetricSet::with);
    if let Some(only) = &overrides.only {
        return Ok(set(only));
    }
    let mut metrics = match &a.only {
        Some(_) if !a.enable.is_empty() || !a.disable.is_empty() => {
            return Err(AssemblyError::invalid("agent.only", "cannot be combined with agent.enable or agent.disable"));
        }
        Some(only) => {
            let families = parse_families(only, "agent.only")?;
            if families.is_empty() {
                return Err(AssemblyError::invalid("agent.only", "names no metric family"));
            }
            set(&families)
        }
        None => MetricSet::default(),
    };
    for f in parse_families(&a.enable, "agent.enable")?.into_iter().chain(overrides.enable.iter().copied()) {
        metrics = metrics.with(f);
    }
    for f in parse_families(&a.disable, "agent.disable")?.into_iter().chain(overrides.disable.iter().copied()) {
        metrics = metrics.without(f);
    }
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> AgentConfig {
        text.parse().unwrap()
    }

    #[test]
    fn families_from_the_config_and_beside_it() {
        let a = config("[agent]\nonly = [\"temperature\"]\n").agent;
        let only = |fs: &[Family]| fs.iter().copied().fold(MetricSet::nothing(), MetricSet::with);
        assert_eq!(metrics(&a, &Families::default()).unwrap(), only(&[Family::Temperature]));
        let power = Families::default().with_enabled([Family::Power]);
        assert_eq!(metrics(&a, &power).unwrap(), only(&[Family::Temperature, Family::Power]));
        assert_eq!(metrics(&a, &Families::only([Family::Power])).unwrap(), only(&[Family::Power]));
        let both = config("[agent]\nonly = [\"power\"]\ndisable = [\"fan\"]\n").agent;
        assert_eq!(metrics(&both, &Families::default()).unwrap_err().key(), Some("agent.only"));
        let empty = config("[agent]\nonly = []\n").agent;
        assert_eq!(
            metrics(&empty, &Families::default()).unwrap_err().to_string(),
            "agent.only: names no metric family"
        );
        let e = parse_families(&["telepathy".to_owned()], "--enable").unwrap_err().to_string();
        assert!(e.starts_with("--enable: unknown metric family `telepathy`"), "{e}");
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

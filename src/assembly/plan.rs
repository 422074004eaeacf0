//! [`Plan`]: the config and the options resolved once — every default applied, every value
//! checked against its bounds (each error naming its key), every value derived from another (a
//! replay's interval, the mock's, the diagnosis window, the steps socket's path) — before
//! anything is built. [`Assembly::build`](super::Assembly::build) only constructs from it; `run`,
//! the mock and the Python binding read their values from it ([`Assembled::plan`](super::Assembled::plan)),
//! never from the raw sections.

use std::path::PathBuf;
use std::time::Duration;

use gpumon_core::trace::{ReplaySampler, ReplaySpeed};
use gpumon_core::{DeviceFilter, Family, MetricSet, SinkOptions, MAX_SINK_QUEUE};

use super::backend::{self, Backend, BackendError, MockFactory, MockOptions, NvmlOptions};
use super::config::{AgentConfig, AgentSection};
use super::error::AssemblyError;
use super::stages::{self, AttributionPlan, DiagnosePlan, StepsPlan};

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
    /// The processes of the job the agent runs for (`gpumon-agent run`'s command and its
    /// descendants), which diagnosis takes for one job before anything else says
    /// ([`gpumon_core::diagnose::Diagnoser::with_run_job`]).
    pub run_job: Option<gpumon_core::diagnose::RunJob>,
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
            run_job: None,
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

    /// The processes of the job the agent runs for, one job to diagnosis
    /// ([`AssemblyOptions::run_job`]).
    pub fn with_run_job(mut self, job: gpumon_core::diagnose::RunJob) -> Self {
        self.run_job = Some(job);
        self
    }
}

/// The config and the options, resolved: what the agent will be, every value checked. Read it
/// from [`Assembly::plan`](super::Assembly::plan) without building, or from
/// [`Assembled::plan`](super::Assembled::plan) after.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Plan {
    /// The backend asked for (`agent.backend`; a trace without one means `replay`).
    pub backend: Backend,
    /// The sampling interval, within [`gpumon_core::Interval`]'s bounds: a replayed trace's own,
    /// else `agent.interval`, else [`gpumon_core::DEFAULT_INTERVAL`].
    pub interval: Duration,
    /// The device selection: the options', else `agent.devices`, else the environment's.
    pub devices: DeviceFilter,
    /// The families the agent samples and exports: the selection (`agent.only` / `enable` /
    /// `disable` and the options'), with what the stages need exported (attribution's
    /// processes).
    pub metrics: MetricSet,
    /// The opt-in families the built-in stages read ([`Family::READ_BY_STAGES`]), sampled for
    /// them only and exported by no sink: none when no stage runs, when the selection is exact
    /// (`agent.only`, `--only`), and none that `agent.disable` or `--disable` names.
    pub stage_inputs: MetricSet,
    /// Every sink's queue (`agent.sink_queue`) and export timeout (`agent.export_timeout`).
    pub sink_options: SinkOptions,
    /// `agent.sample_timeout` (the runtime's default when unset).
    pub sample_timeout: Option<Duration>,
    /// `agent.shutdown_timeout`, or its default.
    pub shutdown_timeout: Duration,
    /// The mock's settings (`[mock]`), at [`Plan::interval`]: used when the backend rule picks
    /// the mock.
    pub mock: MockOptions,
    /// How NVML is opened (`[nvml]`), its XID watcher on when the `xid` family is sampled.
    pub nvml: NvmlOptions,
    /// The diagnosis window (`diagnose.window`, else the default spanning enough ticks of the
    /// interval); diagnosis uses it when it is on, and `run` records it beside its report.
    pub diagnosis_window: Duration,
    /// The steps socket's path (`steps.socket`), checked (not a non-socket file, not too long),
    /// when set.
    pub steps_socket: Option<PathBuf>,
}

/// What resolving builds beside the [`Plan`] and the build consumes: the opened trace and the
/// stages, each from its resolved section.
pub(super) struct Parts {
    pub(super) replay: Option<(ReplaySampler, ReplaySpeed)>,
    pub(super) attribution: AttributionPlan,
    pub(super) diagnose: DiagnosePlan,
    pub(super) steps: StepsPlan,
}

impl Plan {
    /// Resolves `config` and `options`; see the [module docs](self).
    pub(super) fn resolve(config: &AgentConfig, options: &AssemblyOptions) -> Result<(Plan, Parts), AssemblyError> {
        let a = &config.agent;
        let (backend, replay) = replay(config)?;
        let recorded = replay.as_ref().and_then(|(sampler, _)| sampler.header().interval);
        let interval = interval(a, recorded)?;
        let devices = match (&options.devices, &a.devices) {
            (Some(chosen), _) => chosen.clone(),
            (None, Some(list)) => {
                DeviceFilter::parse(list).map_err(|e| AssemblyError::invalid("agent.devices", e.to_string()))?
            }
            (None, None) => {
                DeviceFilter::from_env().map_err(|e| AssemblyError::invalid("environment", e.to_string()))?
            }
        };
        let attribution = stages::attribution(&config.attribution)?;
        let selected = metrics(a, &options.families)?;
        // What `agent.disable` and the options switch off beyond the selection: not read for the
        // stages either. Its names were checked by `metrics` (where they count).
        let disabled: Vec<Family> = a
            .disable
            .iter()
            .filter_map(|n| Family::from_name(n.trim()))
            .chain(options.families.disable.iter().copied())
            .collect();
        let metrics = attribution.metrics(selected, disabled.contains(&Family::Processes))?;
        let diagnosis_window = stages::diagnosis_window(&config.diagnose, interval);
        let diagnose = stages::diagnose(&config.diagnose, interval, diagnosis_window, options.run_job.clone())?;
        let steps = stages::steps(&config.steps, options.in_process_steps)?;
        let stages_run =
            diagnose.is_on() || steps.tracker.is_some() || options.report || metrics.contains(Family::Accounts);
        let stage_inputs = stage_inputs(a, &options.families, &disabled, stages_run);
        let plan = Plan {
            backend,
            interval,
            devices,
            metrics,
            stage_inputs,
            sink_options: sink_options(a)?,
            sample_timeout: a.sample_timeout,
            shutdown_timeout: a.shutdown_timeout.unwrap_or(super::defaults::SHUTDOWN_TIMEOUT),
            mock: MockOptions::resolved(config, interval),
            nvml: NvmlOptions::from_config(config, metrics.contains(Family::Xid)),
            diagnosis_window,
            steps_socket: steps.socket.as_ref().map(|s| s.path().to_owned()),
        };
        Ok((plan, Parts { replay, attribution, diagnose, steps }))
    }
}

/// The sampling interval: a replayed trace's own (`recorded`), else `agent.interval`, else the
/// default; checked against [`gpumon_core::Interval`]'s bounds, the one place they live.
fn interval(a: &AgentSection, recorded: Option<Duration>) -> Result<Duration, AssemblyError> {
    let mut interval = a.interval.unwrap_or(gpumon_core::DEFAULT_INTERVAL);
    // A replay runs at the recorded interval: the diagnosis windows and the report count ticks
    // of it, and a window of other ticks would not give the recorded findings.
    if let Some(recorded) = recorded {
        if a.interval.is_some_and(|i| i != recorded) {
            tracing::warn!(?recorded, "replay: --interval / agent.interval ignored; the trace's interval is used");
        }
        interval = recorded;
    }
    Ok(gpumon_core::Interval::new(interval).map_err(|e| AssemblyError::invalid("agent.interval", e.to_string()))?.get())
}

/// Every sink's queue (`agent.sink_queue`) and export timeout (`agent.export_timeout`).
fn sink_options(a: &AgentSection) -> Result<SinkOptions, AssemblyError> {
    let mut sink_options = SinkOptions::default();
    if let Some(q) = a.sink_queue {
        if !(1..=MAX_SINK_QUEUE).contains(&q) {
            return Err(AssemblyError::invalid("agent.sink_queue", format!("must be 1 to {MAX_SINK_QUEUE}")));
        }
        sink_options = sink_options.capacity(q);
    }
    if let Some(t) = a.export_timeout {
        // Checked here too, so that the error names the key the user wrote (the runtime names
        // the setting of one sink).
        if t.is_zero() {
            return Err(AssemblyError::invalid("agent.export_timeout", "must be greater than zero"));
        }
        sink_options = sink_options.export_timeout(t);
    }
    Ok(sink_options)
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
/// names (`disabled`: switched off, not read at all).
fn stage_inputs(a: &AgentSection, overrides: &Families, disabled: &[Family], stages_run: bool) -> MetricSet {
    if !stages_run || overrides.only.is_some() || a.only.is_some() {
        return MetricSet::nothing();
    }
    Family::READ_BY_STAGES.into_iter().filter(|f| !disabled.contains(f)).collect()
}

/// The families to sample and export. `overrides.only` is the exact set (the config's selection ignored);
/// `agent.only` is the config's exact set, which `overrides.enable`/`disable` refine. `only`
/// with `enable`/`disable` in the config is refused (which would win is not obvious).
fn metrics(a: &AgentSection, overrides: &Families) -> Result<MetricSet, AssemblyError> {
    let set = |families: &[Family]| families.iter().copied().collect::<MetricSet>();
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
}

//! Starting a Monitor: its settings as the agent's configuration, built by the agent's own
//! assembly (`gpumon::assembly`), and an assembly error in the Monitor's words.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpumon::core::steps::TrainingRun;
use gpumon::core::Snapshot;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::sync::broadcast::error::RecvError;

use gpumon::core::report::ReportHandle;

use super::findings::FindingQueue;
use super::lifecycle::Running;
use crate::options::Settings;
use crate::{BackendUnavailableError, GpumonError};

/// Stores `s` as the latest snapshot unless a newer one is there already (`flush()` and the
/// subscriber task both store).
pub(super) fn keep_newest(slot: &Mutex<Option<Arc<Snapshot>>>, s: Arc<Snapshot>) {
    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if slot.as_ref().is_none_or(|cur| cur.seq <= s.seq) {
        *slot = Some(s);
    }
}

/// A started agent and what the Monitor keeps of it.
pub(super) struct Started {
    pub(super) running: Running,
    pub(super) latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
    pub(super) run: TrainingRun,
    pub(super) backend: &'static str,
    pub(super) prometheus_address: Option<SocketAddr>,
    pub(super) degraded: Option<String>,
    /// The run report (the stage `gpumon-run` prints from).
    pub(super) report: ReportHandle,
    /// Finding events not yet taken by Python.
    pub(super) findings: Arc<FindingQueue>,
}

pub(super) enum StartError {
    /// Bad settings (a profile that does not load, an invalid job name): ValueError.
    Config(String),
    /// The backend asked for cannot run: BackendUnavailableError.
    Unavailable(String),
    /// Anything else (a port in use, no threads): GpumonError.
    Other(String),
}

impl StartError {
    pub(super) fn into_py(self) -> PyErr {
        match self {
            StartError::Config(m) => PyValueError::new_err(m),
            StartError::Unavailable(m) => BackendUnavailableError::new_err(m),
            StartError::Other(m) => GpumonError::new_err(m),
        }
    }
}

pub(super) fn start(settings: Settings) -> Result<Started, StartError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(crate::logging::THREAD_NAME)
        .enable_all()
        .build()
        .map_err(|e| StartError::Other(format!("cannot start the runtime: {e}")))?;
    let result = {
        let _enter = runtime.enter();
        build(&settings)
    };
    let Built { builder, prometheus_address, backend, run, degraded, report } = match result {
        Ok(parts) => parts,
        Err(e) => {
            runtime.shutdown_timeout(Duration::from_millis(500));
            return Err(e);
        }
    };
    let (agent, handle) = {
        let _enter = runtime.enter();
        builder.build().map_err(|e| StartError::Config(e.to_string()))?
    };
    let latest: Arc<Mutex<Option<Arc<Snapshot>>>> = Arc::default();
    let mut updates = handle.subscribe();
    let slot = latest.clone();
    let findings = Arc::new(FindingQueue::default());
    let queue = findings.clone();
    runtime.spawn(async move {
        loop {
            match updates.recv().await {
                Ok(s) => {
                    queue.note(&s);
                    keep_newest(&slot, s);
                }
                Err(RecvError::Lagged(skipped)) => queue.lagged(skipped),
                Err(RecvError::Closed) => break,
            }
        }
    });
    runtime.spawn(agent.run());
    Ok(Started {
        running: Running { runtime, agent: handle },
        latest,
        run,
        backend,
        prometheus_address,
        degraded,
        report,
        findings,
    })
}

/// What the assembly built for a Monitor.
struct Built {
    builder: gpumon::core::AgentBuilder,
    prometheus_address: Option<SocketAddr>,
    backend: &'static str,
    run: TrainingRun,
    degraded: Option<String>,
    report: ReportHandle,
}

/// The agent's own assembly (`gpumon::assembly`, as `gpumon-agent` builds it) from the Monitor's
/// settings: the same backend rule, defaults, sinks and step tracker. Runs inside the runtime (the
/// Prometheus listener binds here).
fn build(s: &Settings) -> Result<Built, StartError> {
    use gpumon::assembly::Assembly;
    gpumon::sinks::tls::install_crypto_provider();
    let assembled = Assembly::build(&config(s), assembly_options(s)).map_err(|e| start_error(e, s))?;
    let source = assembled.source.as_ref().expect("the Monitor never replays a trace");
    say_fallback(source, s);
    if source.is_live() {
        // A backend that cannot enumerate now fails at the first tick with its own error.
        if let Some(Ok(found)) = assembled.visible_devices() {
            check_devices(&found, s)?;
        }
    }
    let steps = assembled.steps.as_ref().expect("asked for the in-process step tracker");
    let run = steps.run(&s.job, s.rank).map_err(|e| StartError::Config(format!("job: {e}")))?;
    let backend = if source.is_mock() { "mock" } else { "nvml" };
    let degraded = match source {
        gpumon::assembly::backend::Source::LazyNvml { reason } => Some(reason.to_string()),
        _ => None,
    };
    let report = assembled.report.expect("asked for the run report");
    Ok(Built {
        builder: assembled.builder,
        prometheus_address: assembled.listeners.prometheus.map(|l| l.addr),
        backend,
        run,
        degraded,
        report,
    })
}

/// The Monitor's settings as the agent's configuration. Every sink of the Monitor exports (no
/// stdout), so `auto` falls back to the mock only when there is none: simulated data never
/// leaves the process by accident. Diagnosis as `diagnose` (and `diagnose_window`) say.
fn config(s: &Settings) -> gpumon::assembly::config::AgentConfig {
    let mut c = gpumon::assembly::config::AgentConfig::default();
    c.agent.backend = Some(s.backend);
    c.agent.interval = Some(s.interval);
    c.mock.profile = Some(s.mock_profile.clone());
    c.mock.scenario.clone_from(&s.mock_scenario);
    c.stdout.enabled = Some(false);
    c.diagnose.enabled = Some(s.diagnose);
    c.diagnose.window = s.diagnose_window;
    if let Some(addr) = s.prometheus_listen {
        let mut p = gpumon::sinks::prometheus::PrometheusConfig::default();
        p.listen = Some(addr);
        c.prometheus = Some(p);
    }
    if let Some((url, db)) = &s.influx {
        let mut i = gpumon::sinks::influxdb::InfluxConfig::default();
        i.url.clone_from(url);
        i.db.clone_from(db);
        c.influxdb = Some(i);
    }
    if let Some(endpoint) = &s.otlp_endpoint {
        let mut o = gpumon::sinks::otlp::OtlpConfig::default();
        o.endpoint = Some(endpoint.clone());
        c.otlp = Some(o);
    }
    c
}

/// The Monitor's own device selection (per rank), its in-process step tracker and the run report.
fn assembly_options(s: &Settings) -> gpumon::assembly::AssemblyOptions {
    gpumon::assembly::AssemblyOptions::default()
        .with_devices(s.devices.clone())
        .with_in_process_steps(true)
        .with_report(true)
}

/// An assembly error in the Monitor's words: the argument that set the key, and the Python
/// exception its kind maps to.
fn start_error(e: gpumon::assembly::AssemblyError, s: &Settings) -> StartError {
    use gpumon::assembly::backend::{BackendError, MockError};
    use gpumon::assembly::AssemblyError;
    match e {
        AssemblyError::Sink { key: "prometheus", source } => {
            let addr = s.prometheus_listen.map(|a| a.to_string()).unwrap_or_default();
            StartError::Other(format!("prometheus_listen {addr}: {source}"))
        }
        AssemblyError::Sink { key: "influxdb", source } => StartError::Config(format!("influx_url: {source}")),
        AssemblyError::Sink { key: "otlp", source } => StartError::Config(format!("otlp_endpoint: {source}")),
        AssemblyError::Backend(BackendError::Mock(MockError::Profile { name, reason })) => {
            StartError::Config(format!("mock_profile `{name}`: {reason}"))
        }
        AssemblyError::Backend(BackendError::Mock(MockError::Scenario { name, reason })) => {
            StartError::Config(format!("mock_scenario `{name}`: {reason}"))
        }
        AssemblyError::Backend(BackendError::Nvml(reason)) => {
            StartError::Unavailable(format!("backend=\"nvml\": NVML unavailable ({reason})"))
        }
        e if e.key().is_some_and(|k| k.starts_with("diagnose.window")) => {
            StartError::Config(e.to_string().replacen("diagnose.window", "diagnose_window", 1))
        }
        e if e.is_config() => StartError::Config(e.to_string()),
        other => StartError::Unavailable(other.to_string()),
    }
}

/// Says a fallback of the backend rule in the Monitor's words, through Python's `logging`.
fn say_fallback(source: &gpumon::assembly::backend::Source, s: &Settings) {
    use gpumon::assembly::backend::Source;
    match source {
        Source::LazyNvml { reason } => tracing::warn!(
            target: "_gpumon",
            "NVML unavailable ({reason}); exporting no GPU data and retrying NVML — simulated data is exported only with backend=\"mock\""
        ),
        Source::MockFallback { reason } => tracing::warn!(
            target: "_gpumon",
            "NVML unavailable ({reason}); using the MOCK backend (profile `{}`): values are simulated",
            s.mock_profile
        ),
        _ => {}
    }
}

/// A selection that names a GPU the node does not have is a mistake (`devices="9"` on 8 GPUs),
/// not a request for an empty snapshot: one enumeration (no metric read) says which entries
/// match nothing, and the Monitor does not start.
fn check_devices(found: &[Arc<gpumon::core::DeviceInfo>], s: &Settings) -> Result<(), StartError> {
    use gpumon::core::DeviceFilter;
    let Some((source, list)) = &s.device_list else { return Ok(()) };
    let missing: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .filter(|part| match DeviceFilter::parse(part) {
            Ok(one) if !one.is_all() => !found.iter().any(|d| one.allows(d)),
            _ => false,
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // MIG instances carry their parent's index: count GPUs, not devices.
    let gpus = found.iter().map(|d| d.index).collect::<std::collections::BTreeSet<_>>().len();
    let indices = match gpus {
        0 => "none".to_owned(),
        1 => "index 0".to_owned(),
        n => format!("indices 0-{}", n - 1),
    };
    Err(StartError::Config(format!(
        "{source}: {} matches no device of this node ({gpus} GPUs, {indices})",
        missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ")
    )))
}

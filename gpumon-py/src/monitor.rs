//! `gpumon.Monitor`: the agent (sampler, processors, sinks) on a tokio runtime of its own, in
//! Rust threads; Python only hands it step marks and reads snapshots.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use gpumon_core::steps::{StepError, TrainingRun};
use gpumon_core::{AgentHandle, Snapshot};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::sync::broadcast::error::RecvError;

use crate::options::{Args, Settings};
use crate::{BackendUnavailableError, GpumonError};

/// How long `close()` (and interpreter exit) may take in all: the final sample that reports the
/// steps marked since the last tick, every sink's export and flush, and the shutdown. Documented
/// in `Monitor.close` and the README; a sink still busy then is abandoned and named in the log.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);
/// `flush()`'s default deadline.
const FLUSH_DEADLINE: Duration = Duration::from_secs(5);
/// How long `snapshot()` waits for a sample when none has been taken yet.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

/// Every live Monitor, so that the `atexit` hook can close those the program left open.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// The running agent.
struct Running {
    runtime: tokio::runtime::Runtime,
    agent: AgentHandle,
}

/// What a Monitor shares with the `atexit` registry.
struct Shared {
    /// `None` once closed.
    running: Mutex<Option<Running>>,
    /// The latest snapshot the agent published (with its derived data).
    latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
    /// The fork generation this Monitor was made in.
    generation: u64,
    /// Set by `close()`: read by `step()` without a lock.
    closed: std::sync::atomic::AtomicBool,
    /// Whether this Monitor asked for the SIGTERM hook (`handle_sigterm=True`).
    sigterm: bool,
}

impl Shared {
    fn is_foreign(&self) -> bool {
        crate::fork::generation() != self.generation
    }

    /// Stops the agent (flushing the sinks within the deadline) and its runtime. Blocks: call it
    /// without the GIL, which the thread that delivers log records to Python needs.
    fn close(&self) {
        if self.is_foreign() {
            return;
        }
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(r) = running {
            stop(r);
        }
    }
}

/// Reports what the sampling loop has not yet seen, then stops: a final sample (processed, so
/// the step tracker reports every step marked since the last tick) goes to every sink and each
/// sink flushes; then the agent shuts down. Both within [`SHUTDOWN_DEADLINE`] in all.
fn stop(r: Running) {
    // A runtime cannot be blocked on (or shut down) from a thread that drives one.
    off_runtime(move || stop_here(r));
}

fn stop_here(r: Running) {
    let until = std::time::Instant::now() + SHUTDOWN_DEADLINE;
    let left = || until.saturating_duration_since(std::time::Instant::now());
    let outcome = r.runtime.block_on(async {
        let flushed = r.agent.flush(left()).await;
        let shut = r.agent.shutdown(left()).await;
        (flushed, shut)
    });
    match outcome.0 {
        // A failed final sample (no NVML yet) still flushed the sinks; it is only worth a note.
        Ok(()) | Err(gpumon_core::AgentError::ShutDown) => {}
        Err(gpumon_core::AgentError::Sample(e)) => {
            tracing::debug!(target: "_gpumon", "close: the final sample failed ({e}); steps since the last tick not reported")
        }
        Err(e) => tracing::warn!(target: "_gpumon", "close: final flush incomplete: {e}"),
    }
    match outcome.1 {
        Ok(()) | Err(gpumon_core::AgentError::ShutDown) => tracing::debug!(target: "_gpumon", "monitor closed"),
        Err(e) => tracing::warn!(target: "_gpumon", "monitor closed, shutdown incomplete: {e}"),
    }
    // A sample stuck in the driver must not keep close() (or the interpreter's exit) waiting.
    r.runtime.shutdown_timeout(Duration::from_millis(500));
}

/// Runs `f`, which blocks on the agent's runtime, on this thread — or, when this thread drives
/// a tokio runtime already (Python code called back from an async task of another Rust
/// extension), where blocking panics, on a thread of its own for the call.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|scope| match scope.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl Drop for Shared {
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        let Some(r) = running else { return };
        if self.is_foreign() {
            // A forked child: the runtime's threads exist only in the parent. Dropping the
            // runtime would wait for them forever; leak it instead (the child's exit frees it).
            std::mem::forget(r);
            return;
        }
        // Dropped by Python's garbage collector, with the GIL held: release it while the agent
        // shuts down. While the interpreter is finalizing `try_attach` declines. `stop` runs no
        // Python code on this thread (its log records go to the delivery thread), so an
        // exception leaving the call that dropped the Monitor (`Monitor(...).step(-1)`) stays
        // pending.
        let mut slot = Some(r);
        if Python::try_attach(|py| py.detach(|| stop_owned(&mut slot))).is_none() {
            stop_owned(&mut slot);
        }
    }
}

fn stop_owned(r: &mut Option<Running>) {
    if let Some(r) = r.take() {
        stop(r);
    }
}

/// Runs the gpumon agent in background Rust threads: samples the GPUs every `interval`, exports
/// to the configured sinks, and turns `step(n)` marks into per-step GPU figures.
#[pyclass(module = "gpumon._gpumon", frozen)]
pub struct Monitor {
    shared: Arc<Shared>,
    run: TrainingRun,
    backend: &'static str,
    prometheus_address: Option<SocketAddr>,
    /// `backend="auto"` with a sink and no NVML: no GPU data, NVML retried (`Source::LazyNvml`).
    /// Why NVML is missing, while it is.
    degraded: Option<String>,
}

#[pymethods]
impl Monitor {
    #[new]
    #[pyo3(
        text_signature = "(backend='auto', interval='1s', prometheus_listen=None, influx_url=None, influx_db=None, otlp_endpoint=None, mock_profile=None, mock_scenario=None, devices=None, job=None, rank=None, handle_sigterm=True)"
    )]
    #[pyo3(signature = (backend="auto", interval=None, prometheus_listen=None, influx_url=None, influx_db=None,
        otlp_endpoint=None, mock_profile=None, mock_scenario=None, devices=None, job=None, rank=None, handle_sigterm=true))]
    #[allow(clippy::too_many_arguments)]
    fn new<'py>(
        py: Python<'py>,
        backend: &'py str,
        interval: Option<Bound<'py, PyAny>>,
        prometheus_listen: Option<String>,
        influx_url: Option<String>,
        influx_db: Option<String>,
        otlp_endpoint: Option<String>,
        mock_profile: Option<String>,
        mock_scenario: Option<String>,
        devices: Option<Bound<'py, PyAny>>,
        job: Option<String>,
        rank: Option<Bound<'py, PyAny>>,
        handle_sigterm: bool,
    ) -> PyResult<Self> {
        crate::logging::install();
        let settings = Args {
            backend,
            interval,
            prometheus_listen,
            influx_url,
            influx_db,
            otlp_endpoint,
            mock_profile,
            mock_scenario,
            devices,
            job,
            rank,
        }
        .resolve()?;
        let started = py.detach(|| {
            let started = start(settings);
            // The start's records (a backend fallback, the listener's address) are in the log
            // when the constructor returns.
            crate::logging::wait_delivered();
            started
        });
        let started = started.map_err(StartError::into_py)?;
        let shared = Arc::new(Shared {
            running: Mutex::new(Some(started.running)),
            latest: started.latest,
            generation: crate::fork::generation(),
            closed: std::sync::atomic::AtomicBool::new(false),
            sigterm: handle_sigterm,
        });
        {
            let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&shared));
        }
        let monitor = Monitor {
            shared,
            run: started.run,
            backend: started.backend,
            prometheus_address: started.prometheus_address,
            degraded: started.degraded,
        };
        if handle_sigterm {
            // gpumon/_signals.py: closes the open Monitors on a SIGTERM whose disposition is the
            // default, then lets it terminate the process.
            if let Err(e) = py.import("gpumon._signals").and_then(|m| m.call_method0("_monitor_opened")) {
                monitor.shared.close();
                return Err(e);
            }
        }
        Ok(monitor)
    }

    /// Marks the end of training step `n` (`n` = the last completed step). Cheap: a lock-free
    /// hand-off to the agent, with the GIL kept.
    ///
    /// Raises GpumonError after `close()` or in a forked child (whatever `n` is: a closed
    /// Monitor takes no mark), then TypeError when `n` is not an int (a bool is not a step
    /// number), ValueError when it is negative, above 2**64 - 2 or not above the last step
    /// marked.
    fn step(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.shared.closed.load(std::sync::atomic::Ordering::Relaxed) || self.shared.is_foreign() {
            return Err(GpumonError::new_err(if self.shared.is_foreign() {
                "step: this Monitor belongs to the parent process (fork)"
            } else {
                "step: the Monitor is closed"
            }));
        }
        let n = crate::options::step_number(n)?;
        match self.run.step(n) {
            Ok(()) => Ok(()),
            Err(StepError::NotIncreasing { last, got }) => Err(PyValueError::new_err(format!(
                "step: {got} is not after the last step marked ({last}); steps must increase"
            ))),
            Err(e @ StepError::OutOfRange(_)) => Err(PyValueError::new_err(format!("step: {e}"))),
            Err(e) => Err(GpumonError::new_err(format!("step: {e}"))),
        }
    }

    /// The latest snapshot as plain Python data: a dict with `system`, `devices` (a list of
    /// dicts) and, once steps are marked, `steps`. Releases the GIL while it waits.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.shared.is_foreign() {
            return Err(GpumonError::new_err("this Monitor belongs to the parent process (fork)"));
        }
        if self.shared.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(GpumonError::new_err("snapshot: the Monitor is closed"));
        }
        let json = py.detach(|| -> Result<String, String> {
            let latest = self.shared.latest.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let snapshot = match latest {
                Some(s) => s,
                None => {
                    // No tick published yet (just started): take one now.
                    let (rt, agent) = {
                        let running = self.shared.running.lock().unwrap_or_else(PoisonError::into_inner);
                        let r = running.as_ref().ok_or_else(|| "the Monitor is closed".to_owned())?;
                        (r.runtime.handle().clone(), r.agent.clone())
                    };
                    off_runtime(|| {
                        rt.block_on(async { tokio::time::timeout(SNAPSHOT_TIMEOUT, agent.snapshot_now()).await })
                    })
                    .map_err(|_| format!("no sample within {SNAPSHOT_TIMEOUT:?}"))?
                    .map_err(|e| match (&self.degraded, &e) {
                        (Some(_), gpumon_core::AgentError::Sample(gpumon_core::SampleError::Unavailable { .. })) => {
                            format!(
                                "snapshot: no GPU data: {e} (backend=\"auto\" with a sink and no NVML exports \
                                 gpumon_up 0 and retries NVML; snapshot() has nothing to return until it answers)"
                            )
                        }
                        _ => format!("sampling failed: {e}"),
                    })?
                }
            };
            serde_json::to_string(&*snapshot).map_err(|e| format!("cannot encode the snapshot: {e}"))
        });
        let json = json.map_err(GpumonError::new_err)?;
        py.import("json")?.call_method1("loads", (json,))
    }

    /// Reports every step marked so far and sends it to the sinks now: takes a sample at once
    /// (the step tracker reports the steps marked since the last tick, with the figures of the
    /// samples taken during them), hands it to every sink and waits — up to `timeout` seconds —
    /// for each sink to export and flush. Releases the GIL. The Monitor keeps running.
    ///
    /// Raises GpumonError when the Monitor is closed, the sample failed (the sinks are still
    /// flushed) or a sink did not finish in time (named in the message) — but not for the
    /// missing NVML of the degraded mode (`backend="auto"` with a sink and no NVML), whose
    /// `gpumon_up 0` is what there is to flush.
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let deadline = match &timeout {
            None => FLUSH_DEADLINE,
            Some(t) => crate::options::duration(t, "timeout")?,
        };
        if self.shared.is_foreign() {
            return Err(GpumonError::new_err("flush: this Monitor belongs to the parent process (fork)"));
        }
        let (rt, agent) = {
            let running = self.shared.running.lock().unwrap_or_else(PoisonError::into_inner);
            let r = running.as_ref().ok_or_else(|| GpumonError::new_err("flush: the Monitor is closed"))?;
            (r.runtime.handle().clone(), r.agent.clone())
        };
        py.detach(|| {
            // The flush's sample reaches the subscribers before the flush answers; reading it
            // here (not waiting for the task that follows them) makes `snapshot()` right after
            // `flush()` show it.
            let mut updates = agent.subscribe();
            let result = off_runtime(|| rt.block_on(agent.flush(deadline)));
            let mut newest = None;
            while let Ok(s) = updates.try_recv() {
                newest = Some(s);
            }
            if let Some(s) = newest {
                keep_newest(&self.shared.latest, s);
            }
            crate::logging::wait_delivered();
            match result {
                // The degraded mode's documented state, not a failure of the flush: the sinks
                // were flushed (`gpumon_up 0`); there are no GPU figures to report.
                Err(gpumon_core::AgentError::Sample(gpumon_core::SampleError::Unavailable { .. }))
                    if self.degraded.is_some() =>
                {
                    Ok(())
                }
                other => other,
            }
        })
        .map_err(|e| GpumonError::new_err(format!("flush: {e}")))
    }

    /// Stops the agent. First every step marked so far is reported (a final sample) and every
    /// sink exports what is queued and flushes; then listeners close. All of it within 5 s; a
    /// sink still busy then is abandoned (logged). Releases the GIL. Calling it again does
    /// nothing. A Ctrl-C meanwhile raises `KeyboardInterrupt` once the close has finished. The
    /// last open Monitor that took SIGTERM gives it its previous disposition back.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            self.shared.close();
            crate::logging::wait_delivered();
        });
        if self.shared.sigterm {
            release_sigterm(py)?;
        }
        Ok(())
    }

    /// The last step marked with `step()`, or None.
    #[getter]
    fn last_step(&self) -> Option<u64> {
        self.run.last_step()
    }

    /// Whether `close()` was called (or the Monitor belongs to the parent of a forked process).
    #[getter]
    fn closed(&self) -> bool {
        self.shared.is_foreign() || self.shared.running.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// The backend in use: `"nvml"` or `"mock"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The Prometheus endpoint's address (`"127.0.0.1:9400"`), or None without one.
    #[getter]
    fn prometheus_address(&self) -> Option<String> {
        self.prometheus_address.map(|a| a.to_string())
    }

    /// The job name step marks are reported under.
    #[getter]
    fn job(&self) -> &str {
        self.run.job()
    }

    /// The rank step marks are reported under (None without one).
    #[getter]
    fn rank(&self) -> Option<u32> {
        self.run.rank()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let py_opt = |v: Option<String>| v.unwrap_or_else(|| "None".to_owned());
        format!(
            "Monitor(backend='{}', job='{}', rank={}, prometheus_address={}, closed={})",
            self.backend,
            self.run.job().replace('\\', "\\\\").replace('\'', "\\'"),
            py_opt(self.run.rank().map(|r| r.to_string())),
            py_opt(self.prometheus_address.map(|a| format!("'{a}'"))),
            if self.closed() { "True" } else { "False" }
        )
    }
}

/// Tells gpumon/_signals.py that a Monitor with the SIGTERM hook closed: the last one gives
/// SIGTERM its previous disposition back. An error of its own is no reason for `close()` to
/// fail, but the Python code it runs also runs the handlers of signals that arrived during the
/// close: their KeyboardInterrupt (any exception that is not an `Exception`) is `close()`'s.
fn release_sigterm(py: Python<'_>) -> PyResult<()> {
    match py.import("gpumon._signals").and_then(|m| m.call_method0("_monitor_closed")) {
        Ok(_) => Ok(()),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => {
            tracing::debug!(target: "_gpumon", "close: SIGTERM disposition not restored: {e}");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// How many Monitors of this process that asked for the SIGTERM hook are open.
#[pyfunction]
pub fn _sigterm_monitors_open() -> usize {
    if crate::fork::generation() != 0 {
        return 0;
    }
    LIVE.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.sigterm && !s.closed.load(std::sync::atomic::Ordering::Relaxed))
        .count()
}

/// Closes every open Monitor of this process — each reports the steps marked since its last
/// tick and flushes its sinks, within `close()`'s deadline — for the SIGTERM hook, which then
/// terminates the process. Logging keeps going (the process has not finished yet).
#[pyfunction]
pub fn _close_for_sigterm(py: Python<'_>) {
    if crate::fork::generation() != 0 {
        return;
    }
    let live: Vec<Arc<Shared>> =
        LIVE.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect();
    py.detach(|| {
        // Side by side, so that the wait is one deadline, not one per Monitor.
        std::thread::scope(|scope| {
            for s in &live {
                scope.spawn(|| s.close());
            }
        });
        crate::logging::wait_delivered();
    });
}

/// Closes every Monitor still open (the `atexit` hook), then stops forwarding log records: the
/// interpreter is about to finalize.
#[pyfunction]
pub fn _atexit(py: Python<'_>) {
    if crate::fork::generation() == 0 {
        let live: Vec<Arc<Shared>> = std::mem::take(&mut *LIVE.lock().unwrap_or_else(PoisonError::into_inner))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        py.detach(|| {
            live.iter().for_each(|s| s.close());
            crate::logging::wait_delivered();
        });
    }
    crate::logging::silence();
}

/// Stores `s` as the latest snapshot unless a newer one is there already (`flush()` and the
/// subscriber task both store).
fn keep_newest(slot: &Mutex<Option<Arc<Snapshot>>>, s: Arc<Snapshot>) {
    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if slot.as_ref().is_none_or(|cur| cur.seq <= s.seq) {
        *slot = Some(s);
    }
}

struct Started {
    running: Running,
    latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
    run: TrainingRun,
    backend: &'static str,
    prometheus_address: Option<SocketAddr>,
    degraded: Option<String>,
}

enum StartError {
    /// Bad settings (a profile that does not load, an invalid job name): ValueError.
    Config(String),
    /// The backend asked for cannot run: BackendUnavailableError.
    Unavailable(String),
    /// Anything else (a port in use, no threads): GpumonError.
    Other(String),
}

impl StartError {
    fn into_py(self) -> PyErr {
        match self {
            StartError::Config(m) => PyValueError::new_err(m),
            StartError::Unavailable(m) => BackendUnavailableError::new_err(m),
            StartError::Other(m) => GpumonError::new_err(m),
        }
    }
}

fn start(settings: Settings) -> Result<Started, StartError> {
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
    let (builder, prometheus_address, backend, run, degraded) = match result {
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
    runtime.spawn(async move {
        loop {
            match updates.recv().await {
                Ok(s) => keep_newest(&slot, s),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            }
        }
    });
    runtime.spawn(agent.run());
    Ok(Started { running: Running { runtime, agent: handle }, latest, run, backend, prometheus_address, degraded })
}

type Built = (gpumon_core::AgentBuilder, Option<SocketAddr>, &'static str, TrainingRun, Option<String>);

/// The agent's own assembly (`gpumon::assembly`, as `gpumon-agent` builds it) from the Monitor's
/// settings: the same backend rule, defaults, sinks and step tracker. Runs inside the runtime (the
/// Prometheus listener binds here).
fn build(s: &Settings) -> Result<Built, StartError> {
    use gpumon::assembly::Assembly;
    gpumon_sinks::tls::install_crypto_provider();
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
    Ok((assembled.builder, assembled.listeners.prometheus.map(|l| l.addr), backend, run, degraded))
}

/// The Monitor's settings as the agent's configuration. Every sink of the Monitor exports (no
/// stdout), so `auto` falls back to the mock only when there is none: simulated data never
/// leaves the process by accident. Diagnosis stays off: the Monitor reports samples and steps.
fn config(s: &Settings) -> gpumon::assembly::config::AgentConfig {
    let mut c = gpumon::assembly::config::AgentConfig::default();
    c.agent.backend = Some(s.backend);
    c.agent.interval = Some(s.interval);
    c.mock.profile = Some(s.mock_profile.clone());
    c.mock.scenario.clone_from(&s.mock_scenario);
    c.stdout.enabled = Some(false);
    c.diagnose.enabled = Some(false);
    if let Some(addr) = s.prometheus_listen {
        let mut p = gpumon_sinks::prometheus::PrometheusConfig::default();
        p.listen = Some(addr);
        c.prometheus = Some(p);
    }
    if let Some((url, db)) = &s.influx {
        let mut i = gpumon_sinks::influxdb::InfluxConfig::default();
        i.url.clone_from(url);
        i.db.clone_from(db);
        c.influxdb = Some(i);
    }
    if let Some(endpoint) = &s.otlp_endpoint {
        let mut o = gpumon_sinks::otlp::OtlpConfig::default();
        o.endpoint = Some(endpoint.clone());
        c.otlp = Some(o);
    }
    c
}

/// The Monitor's own device selection (per rank) and its in-process step tracker.
fn assembly_options(s: &Settings) -> gpumon::assembly::AssemblyOptions {
    gpumon::assembly::AssemblyOptions::default().with_devices(s.devices.clone()).with_in_process_steps(true)
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
fn check_devices(found: &[Arc<gpumon_core::DeviceInfo>], s: &Settings) -> Result<(), StartError> {
    use gpumon_core::DeviceFilter;
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

//! `gpumon.Monitor`: the agent (sampler, processors, sinks) on a tokio runtime of its own, in
//! Rust threads; Python only hands it step marks and reads snapshots.

//!
//! The module is split by concern: this file is the Python class (its arguments checked in
//! `crate::options`); `assemble` builds and starts the agent; `lifecycle` stops it (and closes
//! the Monitors left open at exit or on SIGTERM, and keeps a forked child away from them);
//! `findings` keeps the diagnosis' events for Python.

mod assemble;
mod findings;
mod lifecycle;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpumon::core::report::ReportHandle;
use gpumon::core::steps::{StepError, TrainingRun};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::options::Args;
use crate::GpumonError;
use assemble::{keep_newest, start, StartError};
use findings::FindingQueue;
pub use lifecycle::{_atexit, _close_for_sigterm, _sigterm_monitors_open};
use lifecycle::{off_runtime, release_sigterm, Shared, LIVE};

/// `flush()`'s default deadline.
const FLUSH_DEADLINE: Duration = Duration::from_secs(5);
/// How long `snapshot()` waits for a sample when none has been taken yet.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Whether the diagnosis stage runs.
    diagnose: bool,
    /// The run report (kept after `close()`: the report of the whole run).
    report: ReportHandle,
    /// Finding events not yet taken (`finding_events()`).
    findings: Arc<FindingQueue>,
}

#[pymethods]
impl Monitor {
    #[new]
    #[pyo3(
        text_signature = "(backend='auto', interval='1s', prometheus_listen=None, influx_url=None, influx_db=None, otlp_endpoint=None, mock_profile=None, mock_scenario=None, devices=None, job=None, rank=None, handle_sigterm=True, diagnose=None, diagnose_window=None)"
    )]
    #[pyo3(signature = (backend="auto", interval=None, prometheus_listen=None, influx_url=None, influx_db=None,
        otlp_endpoint=None, mock_profile=None, mock_scenario=None, devices=None, job=None, rank=None, handle_sigterm=true,
        diagnose=None, diagnose_window=None))]
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
        diagnose: Option<bool>,
        diagnose_window: Option<Bound<'py, PyAny>>,
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
            diagnose,
            diagnose_window,
        }
        .resolve()?;
        let diagnose = settings.diagnose;
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
            diagnose,
            report: started.report,
            findings: started.findings,
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
                        (Some(_), gpumon::core::AgentError::Sample(gpumon::core::SampleError::Unavailable { .. })) => {
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
                Err(gpumon::core::AgentError::Sample(gpumon::core::SampleError::Unavailable { .. }))
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

    /// The run report, as `gpumon-run` prints it at the end of a job (`format="text"`), or as
    /// JSON (`format="json"`, the `report` object of `gpumon-run --report-format json`): the
    /// GPUs' time busy and idle, the findings the diagnosis raised and their main cause, the
    /// steps. An open Monitor first reports every step marked so far (a sample, as `flush()`);
    /// after `close()`, the report of the whole run. Releases the GIL.
    #[pyo3(signature = (format="text"))]
    fn report(&self, py: Python<'_>, format: &str) -> PyResult<String> {
        if !matches!(format, "text" | "json") {
            return Err(PyValueError::new_err(format!("format: `{format}` is not \"text\" or \"json\"")));
        }
        if self.shared.is_foreign() {
            return Err(GpumonError::new_err("report: this Monitor belongs to the parent process (fork)"));
        }
        if !self.closed() {
            // The steps marked since the last tick belong in the report; a failed sample only
            // leaves them out (said in the log), it does not withhold the report.
            if let Err(e) = self.flush(py, None) {
                tracing::warn!(target: "_gpumon", "report: {e}");
            }
        }
        py.detach(|| {
            let report = self.report.report();
            match format {
                "json" => serde_json::to_string(&report).map_err(|e| GpumonError::new_err(format!("report: {e}"))),
                _ => Ok(report.to_string()),
            }
        })
    }

    /// The findings the diagnosis raised or cleared since the last call, oldest first: dicts
    /// `{"transition": "raised" | "cleared", "finding": {"kind", "severity", "gpu", "uuid",
    /// "since", "evidence", "advice"}, "held_for"?}` (the agent's JSON). Every event of every
    /// tick is kept until taken (up to 1024; older ones are dropped and counted in
    /// `findings_dropped`). Empty with `diagnose=False`.
    fn finding_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = self.findings.take();
        py.import("json")?.call_method1("loads", (json,))
    }

    /// Finding events lost: dropped from a full queue, or on snapshots skipped by a slow reader.
    #[getter]
    fn findings_dropped(&self) -> u64 {
        self.findings.dropped()
    }

    /// Whether the diagnosis stage runs (`diagnose=`; by default unless `GPUMON_STEPS_SOCKET`
    /// is set, where `gpumon-run`'s agent diagnoses the job's GPUs).
    #[getter]
    fn diagnose(&self) -> bool {
        self.diagnose
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

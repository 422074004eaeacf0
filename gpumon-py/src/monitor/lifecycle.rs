//! A Monitor's life: the running agent, its stop (final sample, sinks flushed, within a
//! deadline), the registry of live Monitors that the `atexit` and SIGTERM hooks close, and
//! fork safety (a child never touches the parent's runtime).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use gpumon::core::{AgentHandle, Snapshot};
use pyo3::prelude::*;

/// How long `close()` (and interpreter exit) may take in all: the final sample that reports the
/// steps marked since the last tick, every sink's export and flush, and the shutdown. Documented
/// in `Monitor.close` and the README; a sink still busy then is abandoned and named in the log.
pub(super) const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// Every live Monitor, so that the `atexit` hook can close those the program left open.
pub(super) static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// The running agent.
pub(super) struct Running {
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) agent: AgentHandle,
}

/// What a Monitor shares with the `atexit` registry.
pub(super) struct Shared {
    /// `None` once closed.
    pub(super) running: Mutex<Option<Running>>,
    /// The latest snapshot the agent published (with its derived data).
    pub(super) latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
    /// The fork generation this Monitor was made in.
    pub(super) generation: u64,
    /// Set by `close()`: read by `step()` without a lock.
    pub(super) closed: std::sync::atomic::AtomicBool,
    /// Whether this Monitor asked for the SIGTERM hook (`handle_sigterm=True`).
    pub(super) sigterm: bool,
}

impl Shared {
    pub(super) fn is_foreign(&self) -> bool {
        crate::fork::generation() != self.generation
    }

    /// Stops the agent (flushing the sinks within the deadline) and its runtime. Blocks: call it
    /// without the GIL, which the thread that delivers log records to Python needs.
    pub(super) fn close(&self) {
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
        Ok(()) | Err(gpumon::core::AgentError::ShutDown) => {}
        Err(gpumon::core::AgentError::Sample(e)) => {
            tracing::debug!(target: "_gpumon", "close: the final sample failed ({e}); steps since the last tick not reported")
        }
        Err(e) => tracing::warn!(target: "_gpumon", "close: final flush incomplete: {e}"),
    }
    match outcome.1 {
        Ok(()) | Err(gpumon::core::AgentError::ShutDown) => tracing::debug!(target: "_gpumon", "monitor closed"),
        Err(e) => tracing::warn!(target: "_gpumon", "monitor closed, shutdown incomplete: {e}"),
    }
    // A sample stuck in the driver must not keep close() (or the interpreter's exit) waiting.
    r.runtime.shutdown_timeout(Duration::from_millis(500));
}

/// Runs `f`, which blocks on the agent's runtime, on this thread — or, when this thread drives
/// a tokio runtime already (Python code called back from an async task of another Rust
/// extension), where blocking panics, on a thread of its own for the call.
pub(super) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
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

/// Tells gpumon/_signals.py that a Monitor with the SIGTERM hook closed: the last one gives
/// SIGTERM its previous disposition back. An error of its own is no reason for `close()` to
/// fail, but the Python code it runs also runs the handlers of signals that arrived during the
/// close: their KeyboardInterrupt (any exception that is not an `Exception`) is `close()`'s.
pub(super) fn release_sigterm(py: Python<'_>) -> PyResult<()> {
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

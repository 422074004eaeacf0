//! `gpumon._gpumon`: the native half of the `gpumon` Python package (see gpumon-py/README.md).
//! The Python half (python/gpumon/) re-exports it and adds the socket client and the
//! integrations.

#![deny(missing_docs)]

mod cli;
mod fork;
mod logging;
mod monitor;
mod options;

use pyo3::prelude::*;

// Declared in the module `gpumon` (the package re-exports them there), not `gpumon._gpumon`:
// pickle finds a class by its `__module__` and name, and a user catches `gpumon.GpumonError`.
// Pickling an exception raised in a worker process (multiprocessing's error propagation)
// needs both.
pyo3::create_exception!(
    gpumon,
    GpumonError,
    pyo3::exceptions::PyRuntimeError,
    "A gpumon operation failed (sampling, a listener that cannot bind, a closed Monitor)."
);
pyo3::create_exception!(
    gpumon,
    BackendUnavailableError,
    GpumonError,
    "The backend asked for cannot run (backend=\"nvml\" without NVML)."
);

#[pymodule]
fn _gpumon(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fork::install();
    m.add_class::<monitor::Monitor>()?;
    m.add_function(wrap_pyfunction!(monitor::_atexit, m)?)?;
    m.add_function(wrap_pyfunction!(monitor::_close_for_sigterm, m)?)?;
    m.add_function(wrap_pyfunction!(monitor::_sigterm_monitors_open, m)?)?;
    m.add_function(wrap_pyfunction!(cli::agent_main, m)?)?;
    m.add_function(wrap_pyfunction!(options::_check_run, m)?)?;
    m.add_function(wrap_pyfunction!(options::_check_step, m)?)?;
    m.add_function(wrap_pyfunction!(options::_steps_gpu, m)?)?;
    m.add("GpumonError", m.py().get_type::<GpumonError>())?;
    m.add("BackendUnavailableError", m.py().get_type::<BackendUnavailableError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_JOB", options::DEFAULT_JOB)?;
    Ok(())
}

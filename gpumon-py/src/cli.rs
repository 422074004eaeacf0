//! `gpumon._gpumon.agent_main`: the `gpumon-agent` command line (`gpumon::cli`) inside the Python
//! process, so that the wheel's console scripts, `gpumon-agent` and `gpumon-run`, are the agent
//! itself — for people who installed nothing but the wheel.

use std::ffi::OsString;

use pyo3::prelude::*;

/// The program name clap prints in `--help`, usage lines and errors.
const PROGRAM: &str = "gpumon-agent";

/// Runs the `gpumon-agent` command line with `argv` (without the program name: `["run", "--",
/// "python", "train.py"]`, `["--once", "--backend", "mock"]`) and returns its exit code — the
/// agent's, or with `run`, the command's. The GIL is released while it runs (until the agent
/// stops: `--once`, `--duration`, SIGINT/SIGTERM, the end of `run`'s command).
///
/// It writes to the process's stdout and stderr (file descriptors 1 and 2, not `sys.stdout`), logs
/// to stderr after `--log` unless a `Monitor` has already routed gpumon's logs to Python's
/// `logging`, and does not exit the process: `--help`, `--version` and bad flags print what clap
/// prints and return 0 or 2. It installs SIGINT and SIGTERM handlers that stay after it returns
/// and still call Python's (a Ctrl-C then raises `KeyboardInterrupt` once it has returned): the
/// console scripts set both signals to their default action first (gpumon/_run.py).
#[pyfunction]
pub fn agent_main(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    let args: Vec<OsString> = std::iter::once(OsString::from(PROGRAM)).chain(argv).collect();
    py.detach(|| gpumon::cli::main(args, gpumon::assembly::backend::MOCK))
}

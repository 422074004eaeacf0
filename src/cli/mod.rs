//! The `gpumon-agent` command line (feature `agent`): the agent, `gpumon-agent run -- CMD ARGS…`
//! and `gpumon-agent compare`, behind one entry point, [`main`].
//!
//! It lives in the library so that every way of starting the agent runs the same code: the
//! `gpumon-agent` binary, the example agent (`cargo run --example agent`, which always has the
//! mock backend), and the Python package's `gpumon-agent` and `gpumon-run` console scripts
//! (`gpumon-nvml` on PyPI), for people who install nothing but the wheel.
//!
//! Exit codes: 0 success, 1 runtime failure (sampling or a sink failed in `--once`, shutdown
//! incomplete, the requested backend unavailable), 2 bad configuration or flags; `run` exits with
//! the command's code (docs/run.md).

use std::ffi::OsString;

use crate::assembly::backend::MockFactory;

pub(crate) mod app;
pub(crate) mod attribution;
pub(crate) mod backend;
pub(crate) mod common;
pub(crate) mod compare;
pub(crate) mod diagnose;
pub(crate) mod flags;
#[cfg(feature = "fleet")]
pub(crate) mod fleet;
pub(crate) mod run;
pub(crate) mod sampling;
pub(crate) mod sinks;
pub(crate) mod source;
pub(crate) mod steps;

/// Runs the `gpumon-agent` command line and returns its exit code.
///
/// `args` is the whole command line with the program name first, as [`std::env::args_os`] gives
/// it (clap names the program in `--help` and errors after its file name). `mock` is the mock
/// backend this build offers to `--backend mock` and to `auto`'s stdout-only fallback
/// ([`crate::assembly::backend::MOCK`] with the `mock` feature, else `None`).
///
/// It does not exit the process: `--help`, `--version` and bad flags print what clap prints and
/// return clap's code (0 or 2). It blocks until the agent stops — `--once`, `--duration`, SIGINT or
/// SIGTERM (for which it installs handlers, kept after it returns), or, for `run`, the command's
/// exit — and flushes stdout before it returns.
///
/// ```no_run
/// # #[cfg(feature = "mock")]
/// # fn demo() {
/// let code = gpumon::cli::main(["gpumon-agent", "--once", "--backend", "mock"].map(std::ffi::OsString::from), gpumon::assembly::backend::MOCK);
/// assert_eq!(code, 0);
/// # }
/// ```
pub fn main(args: impl IntoIterator<Item = OsString>, mock: Option<MockFactory>) -> u8 {
    let code = app::main(args.into_iter().collect(), mock);
    // A Rust binary flushes stdout when `main` returns; a host process (Python) would not.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn main_of(args: &[&str]) -> u8 {
        main(args.iter().map(OsString::from), None)
    }

    /// In a host process (Python) an exit would end the interpreter: help, errors and `run`'s
    /// early failures return their codes. (A bad flag first: were it to exit, the test binary
    /// would end with code 2, a failure, where `--version` would end it with 0.)
    #[test]
    fn help_errors_and_early_failures_return_their_code_instead_of_exiting() {
        assert_eq!(main_of(&["gpumon-agent", "--no-such-flag"]), 2);
        assert_eq!(main_of(&["gpumon-agent", "--version"]), 0);
        assert_eq!(main_of(&["gpumon-agent", "run", "--help"]), 0);
        assert_eq!(main_of(&["gpumon-agent", "run", "--interval", "soon", "--", "true"]), 2);
        assert_eq!(main_of(&["gpumon-agent", "run"]), 127, "no command");
        assert_eq!(main_of(&["gpumon-agent", "compare", "/nonexistent/a.json", "/nonexistent/b.json"]), 2);
        assert_eq!(main_of(&["gpumon-agent", "compare"]), 2, "two files needed");
    }
}

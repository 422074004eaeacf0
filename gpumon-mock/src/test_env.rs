//! The one gate rule for tests that need a real server or tool started by `scripts/test.sh`.
//!
//! Such a test is marked `#[ignore = "needs scripts/test.sh (<what>)"]`, so a plain
//! `cargo test` reports it as *ignored*, never as passed. `scripts/test.sh` starts the
//! backends, exports the `GPUMON_TEST_*` variables and runs the ignored tests too
//! (`-- --include-ignored`). A test that runs is therefore one that was asked for: a missing
//! variable is a failure with a message saying how to run it, never a silent early return.

/// The value of the environment variable `name`, set by `scripts/test.sh`.
///
/// # Panics
///
/// When `name` is unset or empty: the test was run by hand (`--ignored`) without the
/// backends; the message names the variable and says to run it through `scripts/test.sh`.
#[must_use]
pub fn require_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "{name} is not set: this test needs the real backends; run it through scripts/test.sh \
             (or start them with scripts/backends/start-*.sh and export {name}, see scripts/backends/README.md)"
        ),
    }
}

/// Polls `cond` every 20 ms until it holds, for tests that wait on something happening in the
/// background (a sink writing, a server coming back) instead of sleeping a fixed time and hoping.
///
/// # Panics
///
/// When `cond` still does not hold after `timeout`; the message says `what` was awaited.
pub async fn wait_for(timeout: std::time::Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

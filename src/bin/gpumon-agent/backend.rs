//! The backend, by the library's rule (`gpumon::assembly::backend`; a trace to replay aside,
//! app.rs): NVML, the mock, or — `auto` — NVML, falling back to the mock only where simulated data
//! cannot be mistaken for real data (stdout is the only sink). This file only says the outcome
//! in the agent's words: on the terminal, naming its flags.

use std::sync::Arc;

use gpumon::assembly::backend::{self, Backend, MockError, MockOptions, NvmlOptions, Source};
use gpumon::assembly::config::AgentConfig;
use gpumon::core::Sampler;

pub enum BackendError {
    /// Bad profile/scenario/settings: exit 2.
    Config(String),
    /// The requested backend cannot run: exit 1.
    Unavailable(String),
}

/// The sampler for `backend`, from the config (the flags already mapped onto it). `exporting`: a
/// sink other than stdout is configured, so the data leaves this process (a scrape endpoint, a
/// database, a collector) and must never be simulated unless `--backend mock` asked for it.
/// `watch_xid`: the `xid` family is sampled; without it NVML's XID watcher (a thread, an event
/// set, a registration per GPU at start-up) is not started, since nothing would read its counts.
pub fn select(
    backend: Backend,
    exporting: bool,
    watch_xid: bool,
    config: &AgentConfig,
) -> Result<Arc<dyn Sampler>, BackendError> {
    let mock = MockOptions::from_config(config);
    let nvml = NvmlOptions::from_config(config, watch_xid);
    let selected = backend::select(backend, exporting, &nvml, &mock, crate::mock::FACTORY).map_err(|e| match e {
        backend::BackendError::Mock(MockError::Profile { name, reason }) => {
            BackendError::Config(format!("mock.profile / --mock-profile `{name}`: {reason}"))
        }
        backend::BackendError::Mock(MockError::Scenario { name, reason }) => {
            BackendError::Config(format!("mock.scenario / --mock-scenario `{name}`: {reason}"))
        }
        backend::BackendError::Mock(e) => BackendError::Config(e.to_string()),
        backend::BackendError::Nvml(reason) => BackendError::Unavailable(reason),
        backend::BackendError::NoMock => BackendError::Unavailable(
            "the mock backend is not in this build of gpumon-agent (build with `--features mock`, or use `cargo run --example agent`)"
                .to_owned(),
        ),
        backend::BackendError::NoMockFallback { reason } => BackendError::Unavailable(format!(
            "NVML unavailable ({reason}), and the mock fallback is not in this build (build with `--features mock`, or use `cargo run --example agent`)"
        )),
        // `app::run_replay` plays traces; a replay never gets here.
        other => BackendError::Unavailable(format!("{other} (--replay FILE)")),
    })?;
    match &selected.source {
        Source::LazyNvml { reason } => tracing::warn!(
            "NVML unavailable ({reason}); exporting no GPU data (gpumon_up 0) and retrying NVML with backoff — simulated data is exported only with --backend mock"
        ),
        // One clear line, on stderr so stdout stays data-only.
        Source::MockFallback { reason } => eprintln!(
            "gpumon: NVML unavailable ({reason}); running on the MOCK backend with profile `{}` — values are simulated, not read from a GPU (only stdout shows them; exporting sinks never get simulated data unless --backend mock)",
            mock.profile
        ),
        _ => {}
    }
    Ok(selected.sampler)
}

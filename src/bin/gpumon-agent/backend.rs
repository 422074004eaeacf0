//! Chooses the backend (a trace to replay aside, app.rs): NVML, the mock, or — `auto` — NVML, falling back to the mock only where
//! simulated data cannot be mistaken for real data (stdout is the only sink).

use std::sync::Arc;

use gpumon::core::Sampler;

use crate::app::Cli;
use crate::config::{Backend, FileConfig};

pub enum BackendError {
    /// Bad profile/scenario/settings: exit 2.
    // Only the mock's settings can be bad; a build without the mock never makes one.
    #[cfg_attr(not(feature = "mock"), allow(dead_code))]
    Config(String),
    /// The requested backend cannot run: exit 1.
    Unavailable(String),
}

/// The sampler for `backend`. `exporting`: a sink other than stdout is configured, so the data
/// leaves this process (a scrape endpoint, a database, a collector) and must never be simulated
/// unless `--backend mock` asked for it. `watch_xid`: the `xid` family is sampled; without it
/// NVML's XID watcher (a thread, an event set, a registration per GPU at start-up) is not
/// started, since nothing would read its counts.
pub fn select(
    backend: Backend,
    exporting: bool,
    watch_xid: bool,
    cli: &Cli,
    file: &FileConfig,
) -> Result<Arc<dyn Sampler>, BackendError> {
    match backend {
        Backend::Mock => crate::mock::sampler(cli, file),
        // `app::run_replay` plays traces; a replay never gets here.
        Backend::Replay => Err(BackendError::Unavailable("the replay backend needs a trace (--replay FILE)".to_owned())),
        Backend::Nvml => nvml(cli, file, watch_xid).map_err(BackendError::Unavailable),
        Backend::Auto => match nvml(cli, file, watch_xid) {
            Ok(s) => Ok(s),
            Err(reason) if exporting => lazy_nvml(cli, file, watch_xid, &reason),
            Err(reason) if crate::mock::AVAILABLE => {
                let sampler = crate::mock::sampler(cli, file)?;
                // One clear line, on stderr so stdout stays data-only.
                eprintln!(
                    "gpumon: NVML unavailable ({reason}); running on the MOCK backend with profile `{}` — values are simulated, not read from a GPU (only stdout shows them; exporting sinks never get simulated data unless --backend mock)",
                    mock_profile_name(cli, file)
                );
                Ok(sampler)
            }
            Err(reason) => Err(BackendError::Unavailable(format!(
                "NVML unavailable ({reason}), and the mock fallback is not in this build (build with `--features mock`, or use `cargo run --example agent`)"
            ))),
        },
    }
}

/// The mock profile's name (`h100x8` unless configured).
pub fn mock_profile_name(cli: &Cli, file: &FileConfig) -> String {
    cli.mock_profile.clone().or_else(|| file.mock.profile.clone()).unwrap_or_else(|| "h100x8".to_owned())
}

#[cfg(feature = "nvml")]
fn nvml_builder(cli: &Cli, file: &FileConfig, watch_xid: bool) -> gpumon::core::nvml::NvmlSamplerBuilder {
    let mut builder = gpumon::core::nvml::NvmlSampler::builder().xid_events(watch_xid);
    if let Some(path) = cli.nvml_library.clone().or_else(|| file.nvml.library.clone()) {
        builder = builder.library_path(path);
    }
    if let Some(root) = file.nvml.sysfs_root.clone() {
        builder = builder.sysfs_root(root);
    }
    builder.wake_suspended(cli.wake_suspended || file.nvml.wake_suspended.unwrap_or(false))
}

#[cfg(feature = "nvml")]
fn nvml(cli: &Cli, file: &FileConfig, watch_xid: bool) -> Result<Arc<dyn Sampler>, String> {
    nvml_builder(cli, file, watch_xid).build().map(|s| Arc::new(s) as Arc<dyn Sampler>).map_err(|e| e.to_string())
}

/// NVML did not load, but sinks export: no simulated data. The lazy sampler retries NVML with
/// backoff (a driver can load after the agent starts); until then every sample fails, so the
/// sinks get no device data, the Prometheus endpoint serves `gpumon_up 0`, `/health` answers
/// 503 and `/live` 200.
#[cfg(feature = "nvml")]
fn lazy_nvml(cli: &Cli, file: &FileConfig, watch_xid: bool, reason: &str) -> Result<Arc<dyn Sampler>, BackendError> {
    tracing::warn!(
        "NVML unavailable ({reason}); exporting no GPU data (gpumon_up 0) and retrying NVML with backoff — simulated data is exported only with --backend mock"
    );
    Ok(Arc::new(nvml_builder(cli, file, watch_xid).build_lazy()))
}

#[cfg(not(feature = "nvml"))]
fn nvml(_: &Cli, _: &FileConfig, _: bool) -> Result<Arc<dyn Sampler>, String> {
    Err("this agent was built without the `nvml` feature".to_owned())
}

#[cfg(not(feature = "nvml"))]
fn lazy_nvml(_: &Cli, _: &FileConfig, _: bool, reason: &str) -> Result<Arc<dyn Sampler>, BackendError> {
    Err(BackendError::Unavailable(reason.to_owned()))
}

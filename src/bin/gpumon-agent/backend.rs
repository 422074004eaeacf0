//! Chooses the backend: NVML, the mock, or NVML-else-mock.

use std::sync::Arc;

use gpumon::core::Sampler;

use crate::config::{Backend, FileConfig};
use crate::Cli;

pub enum BackendError {
    /// Bad profile/scenario/settings: exit 2.
    Config(String),
    /// The requested backend cannot run: exit 1.
    Unavailable(String),
}

pub fn select(backend: Backend, cli: &Cli, file: &FileConfig) -> Result<Arc<dyn Sampler>, BackendError> {
    match backend {
        Backend::Mock => mock(cli, file),
        Backend::Nvml => nvml(cli, file).map_err(BackendError::Unavailable),
        Backend::Auto => match nvml(cli, file) {
            Ok(s) => Ok(s),
            Err(reason) => {
                let sampler = mock(cli, file)?;
                // One clear line, on stderr so stdout stays data-only.
                eprintln!(
                    "gpumon: NVML unavailable ({reason}); running on the MOCK backend with profile `{}` — values are simulated, not read from a GPU",
                    profile_name(cli, file)
                );
                Ok(sampler)
            }
        },
    }
}

fn profile_name(cli: &Cli, file: &FileConfig) -> String {
    cli.mock_profile.clone().or_else(|| file.mock.profile.clone()).unwrap_or_else(|| "h100x8".to_owned())
}

fn mock(cli: &Cli, file: &FileConfig) -> Result<Arc<dyn Sampler>, BackendError> {
    use gpumon::mock::{FleetProfile, MockSampler, Scenario};
    let profile_arg = profile_name(cli, file);
    let profile = FleetProfile::load(&profile_arg)
        .map_err(|e| BackendError::Config(format!("mock.profile / --mock-profile `{profile_arg}`: {e}")))?;
    let mut builder = MockSampler::builder().profile(profile);
    if let Some(s) = cli.mock_scenario.clone().or_else(|| file.mock.scenario.clone()) {
        let scenario = Scenario::load(&s)
            .map_err(|e| BackendError::Config(format!("mock.scenario / --mock-scenario `{s}`: {e}")))?;
        builder = builder.scenario(scenario);
    }
    if let Some(seed) = cli.mock_seed.or(file.mock.seed) {
        builder = builder.seed(seed);
    }
    let sampler = builder.build().map_err(|e| BackendError::Config(format!("mock backend: {e}")))?;
    Ok(Arc::new(sampler))
}

#[cfg(feature = "nvml")]
fn nvml(cli: &Cli, file: &FileConfig) -> Result<Arc<dyn Sampler>, String> {
    use gpumon::core::nvml::NvmlSampler;
    let mut builder = NvmlSampler::builder();
    if let Some(path) = cli.nvml_library.clone().or_else(|| file.nvml.library.clone()) {
        builder = builder.library_path(path);
    }
    builder.build().map(|s| Arc::new(s) as Arc<dyn Sampler>).map_err(|e| e.to_string())
}

#[cfg(not(feature = "nvml"))]
fn nvml(_: &Cli, _: &FileConfig) -> Result<Arc<dyn Sampler>, String> {
    Err("this agent was built without the `nvml` feature".to_owned())
}

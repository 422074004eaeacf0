//! The mock backend: scripted GPU fleets. `crate::mock_crate` is `gpumon::mock` in the binary
//! (feature `mock`) and the `gpumon-mock` dev-dependency in the example.

use std::sync::Arc;

use gpumon::core::Sampler;

use crate::app::Cli;
use crate::backend::BackendError;
use crate::config::FileConfig;
use crate::mock_crate::{FleetProfile, MockSampler, Scenario};

/// Whether this build can simulate GPUs.
pub const AVAILABLE: bool = true;

/// The mock fleet the configuration asks for.
pub fn sampler(cli: &Cli, file: &FileConfig) -> Result<Arc<dyn Sampler>, BackendError> {
    let profile_arg = crate::backend::mock_profile_name(cli, file);
    let profile = FleetProfile::load(&profile_arg)
        .map_err(|e| BackendError::Config(format!("mock.profile / --mock-profile `{profile_arg}`: {e}")))?;
    let scenario = match cli.mock_scenario.clone().or_else(|| file.mock.scenario.clone()) {
        Some(s) => Scenario::load(&s)
            .map_err(|e| BackendError::Config(format!("mock.scenario / --mock-scenario `{s}`: {e}")))?,
        None => Scenario::default(),
    };
    // One tick is one sampling interval of simulated time, so each tick's high-resolution
    // window holds the driver samples a real driver would have taken in it (a scenario's own
    // `tick_period_ms` wins).
    let interval = cli.interval.or(file.agent.interval).unwrap_or(gpumon::core::DEFAULT_INTERVAL);
    let mut builder = MockSampler::builder().profile(profile).scenario(scenario.following_interval(interval));
    if let Some(seed) = cli.mock_seed.or(file.mock.seed) {
        builder = builder.seed(seed);
    }
    let sampler = builder.build().map_err(|e| BackendError::Config(format!("mock backend: {e}")))?;
    Ok(Arc::new(sampler))
}

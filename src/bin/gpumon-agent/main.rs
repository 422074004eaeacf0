//! `gpumon-agent`: samples every visible GPU and sends the snapshots to the configured sinks.
//!
//! ```text
//! cargo install --path .          # installs gpumon-agent
//! gpumon-agent --prometheus-listen 0.0.0.0:9400
//! gpumon-agent --once --stdout-format json
//! ```
//! Run with `--help` for every flag. The same code is `cargo run --example agent`
//! (examples/agent/main.rs includes these files); the example always has the mock backend, this
//! binary only when built with the `mock` feature.

mod app;
mod attribution;
mod backend;
mod config;
mod diagnose;
mod sinks;
mod steps;
mod web;

// The mock backend, when this build has it (`--features mock`).
#[cfg(feature = "mock")]
use gpumon::mock as mock_crate;
#[cfg(feature = "mock")]
mod mock;
#[cfg(not(feature = "mock"))]
mod mock {
    //! This build has no mock backend.

    use std::sync::Arc;

    use gpumon::core::Sampler;

    use crate::app::Cli;
    use crate::backend::BackendError;
    use crate::config::FileConfig;

    /// Whether this build can simulate GPUs.
    pub const AVAILABLE: bool = false;

    pub fn sampler(_: &Cli, _: &FileConfig) -> Result<Arc<dyn Sampler>, BackendError> {
        Err(BackendError::Unavailable(
            "the mock backend is not in this build of gpumon-agent (build with `--features mock`, or use `cargo run --example agent`)"
                .to_owned(),
        ))
    }
}

fn main() -> std::process::ExitCode {
    app::main()
}

//! The agent's assembly, in one place: the configuration schema ([`config::AgentConfig`], the
//! TOML `gpumon-agent --config` reads), every default ([`defaults`]) and the backend rule
//! ([`backend::select`]). Both faces go through it: the `gpumon-agent` binary maps its flags onto
//! the config and builds from it; gpumon-py's `Monitor` checks its Python arguments and takes
//! the backend rule and the defaults from here.
//!
//! The shape is the OpenTelemetry Collector's and vector's: one config schema, read from a file or
//! mapped from flags, builds the pipeline; the command line only chooses the config.
//!
//! Building an agent on the mock from a config string (features `mock` and `stdout`):
//!
//! ```no_run
//! # #[cfg(all(feature = "mock", feature = "stdout"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use gpumon::assembly::{backend, config::AgentConfig};
//! use gpumon::core::Agent;
//! use gpumon::sinks::stdout::StdoutSink;
//!
//! let config: AgentConfig = r#"
//!     [agent]
//!     backend = "mock"
//!     interval = "500ms"
//!     [mock]
//!     profile = "a100x4"
//!     scenario = "training"
//! "#
//! .parse()?;
//! // The backend rule: stdout keeps the data on this machine, so nothing is exported.
//! let selected = backend::select(
//!     config.backend(),
//!     false,
//!     &backend::NvmlOptions::from_config(&config, true),
//!     &backend::MockOptions::from_config(&config),
//!     backend::MOCK,
//! )?;
//! assert!(selected.source.is_mock());
//! let handle = Agent::builder_arc(selected.sampler)
//!     .interval(config.interval())
//!     .sink(StdoutSink::new(config.stdout_format()))
//!     .spawn()?;
//! tokio::time::sleep(Duration::from_secs(2)).await;
//! handle.shutdown(config.shutdown_timeout()).await?;
//! # Ok(()) }
//! ```

pub mod backend;
pub mod config;
pub mod defaults;

use std::time::Duration;

impl config::AgentConfig {
    /// `agent.backend`, default [`backend::Backend::Auto`].
    pub fn backend(&self) -> backend::Backend {
        self.agent.backend.unwrap_or_default()
    }

    /// `agent.interval`, default [`gpumon_core::DEFAULT_INTERVAL`] (not checked against
    /// [`gpumon_core::MIN_INTERVAL`] here).
    pub fn interval(&self) -> Duration {
        self.agent.interval.unwrap_or(gpumon_core::DEFAULT_INTERVAL)
    }

    /// `agent.shutdown_timeout`, default [`defaults::SHUTDOWN_TIMEOUT`].
    pub fn shutdown_timeout(&self) -> Duration {
        self.agent.shutdown_timeout.unwrap_or(defaults::SHUTDOWN_TIMEOUT)
    }

    /// `stdout.format`, default [`defaults::STDOUT_FORMAT`].
    pub fn stdout_format(&self) -> gpumon_sinks::stdout::StdoutFormat {
        self.stdout.format.unwrap_or(defaults::STDOUT_FORMAT)
    }
}

//! The agent's assembly, in one place: the configuration schema ([`config::AgentConfig`], the
//! TOML `gpumon-agent --config` reads), every default ([`defaults`]), the backend rule
//! ([`backend::select`]), and [`Assembly::build`], which turns a config into an agent: the
//! sampler, every sink, every stage in its order, and the stages' background services.
//!
//! The shape is the OpenTelemetry Collector's and vector's: one config schema, read from a file or
//! mapped from flags, builds the pipeline; the command line only chooses the config. The
//! `gpumon-agent` binary is command line → [`config::AgentConfig`] → [`Assembly::build`]; it
//! keeps only what a run is (`--once`, `--duration`, how the report is printed, signals) and its
//! own words for errors (it names the flag beside the key). gpumon-py's `Monitor` is built here
//! too, from an [`config::AgentConfig`] made of its arguments
//! ([`AssemblyOptions::with_devices`] for its per-rank selection,
//! [`AssemblyOptions::with_in_process_steps`] for its step marks).
//!
//! What [`Assembly::build`] does, in order:
//! 1. resolves every section once into a [`Plan`] (`plan.rs`), each error an [`AssemblyError`]
//!    naming its key; the plan is every derived value, and what the rest reads
//!    ([`Assembled::plan`], [`Assembly::plan`] without building);
//! 2. builds the sinks — the listed ones (`sinks/listed/`: InfluxDB, OTLP, Prometheus, the
//!    Pushgateway, remote write, the web view, in the order of their files), the trace
//!    (`[record]`), and stdout when asked for or when nothing else is — binding their listeners
//!    ([`Listeners`]);
//! 3. selects the sampler by the backend rule (`auto` falls back to the mock only when no sink
//!    exports; [`Assembled::source`] says what was chosen), or opens the trace to replay;
//! 4. adds the stages, which run in order on the sampling thread: attribution, the step
//!    tracker, diagnosis, the run report;
//! 5. hands back the [`AgentBuilder`](gpumon_core::AgentBuilder) and typed handles for what runs
//!    beside it: [`Services`] (the steps socket, the kubelet refresher: `start` once the agent
//!    runs, `stop` before its last flush), the report's [`ReportHandle`](gpumon_core::report::ReportHandle),
//!    the [`Replay`] progress.
//!
//! Building an agent on the mock from a config string, one sample, with the run report
//! (feature `mock`):
//!
//! ```
//! # #[cfg(feature = "mock")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use gpumon::assembly::config::AgentConfig;
//! use gpumon::assembly::{Assembly, AssemblyOptions};
//!
//! let config: AgentConfig = r#"
//!     [agent]
//!     backend = "mock"
//!     interval = "500ms"
//!     [mock]
//!     profile = "a100x4"
//!     scenario = "training"
//!     [stdout]
//!     enabled = true
//!     format = "json"
//! "#
//! .parse()?;
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! runtime.block_on(async {
//!     let options = AssemblyOptions::default().with_once(true).with_report(true);
//!     let mut assembled = Assembly::build(&config, options)?;
//!     // The backend rule chose the mock, as asked: every sink marks the data `backend="mock"`.
//!     assert!(assembled.source.as_ref().is_some_and(|s| s.is_mock()));
//!     let agent = assembled.builder.spawn()?;
//!     assembled.services.start()?; // nothing configured here: no steps socket, no kubelet
//!     agent.flush(Duration::from_secs(10)).await?; // the one sample, exported by every sink
//!     assembled.services.stop().await;
//!     agent.shutdown(assembled.plan.shutdown_timeout).await?;
//!     let report = assembled.report.expect("asked for").report();
//!     assert_eq!(report.gpus.len(), 4);
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })
//! # }
//! # #[cfg(not(feature = "mock"))]
//! # fn main() {}
//! ```

pub mod backend;
mod build;
pub mod config;
pub mod defaults;
mod error;
mod plan;
pub(crate) mod sinks;
mod stages;

pub use build::{Assembled, Assembly, Replay};
pub use error::{AssemblyError, ServiceError};
pub use gpumon_core::stages::Services;
pub use plan::{parse_families, AssemblyOptions, Families, Plan};
pub use sinks::{Listener, Listeners};
pub use stages::{KubeletService, StepsSocket};

impl config::AgentConfig {
    /// `agent.backend`, default [`backend::Backend::Auto`].
    pub fn backend(&self) -> backend::Backend {
        self.agent.backend.unwrap_or_default()
    }

    /// `stdout.format`, default [`defaults::STDOUT_FORMAT`].
    pub fn stdout_format(&self) -> gpumon_sinks::stdout::StdoutFormat {
        self.stdout.format.unwrap_or(defaults::STDOUT_FORMAT)
    }
}

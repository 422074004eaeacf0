//! # gpumon
//!
//! Watch NVIDIA GPUs: sample every GPU through NVML and hand the samples to pluggable sinks —
//! Prometheus (scrape or Pushgateway), InfluxDB, an OpenTelemetry pipeline, or a terminal.
//!
//! This facade re-exports the member crates:
//! - [`core`] (`gpumon-core`): data model, `Sampler`/`Sink` traits, the `Agent` runtime, the NVML
//!   backend (feature `nvml`).
//! - [`mock`] (`gpumon-mock`, feature `mock`): scripted GPU fleets, workloads and faults.
//! - [`sinks`] (`gpumon-sinks`): stdout, Prometheus, InfluxDB, OTLP — each behind its feature.
//!
//! and assembles an agent from a configuration: [`assembly`] (feature `assembly`) holds the
//! config schema the `gpumon-agent` binary reads, every default, and the backend rule, shared by
//! the binary and the Python binding; `cli` (feature `agent`) is the `gpumon-agent` command
//! line itself, which the binary, the example agent and the Python package's console scripts run.
//!
//! ```no_run
//! # #[cfg(all(feature = "mock", feature = "stdout"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use gpumon::core::Agent;
//! use gpumon::mock::MockSampler;
//! use gpumon::sinks::stdout::{StdoutFormat, StdoutSink};
//!
//! let handle = Agent::builder(MockSampler::from_profile_name("h100x8")?)
//!     .interval(Duration::from_secs(1))
//!     .sink(StdoutSink::new(StdoutFormat::Human))
//!     .spawn()?;
//! tokio::time::sleep(Duration::from_secs(3)).await;
//! handle.shutdown(Duration::from_secs(2)).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub use gpumon_core as core;
#[cfg(feature = "mock")]
pub use gpumon_mock as mock;
pub use gpumon_sinks as sinks;

#[cfg(feature = "assembly")]
pub mod assembly;
#[cfg(feature = "agent")]
pub mod cli;

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(all(doctest, feature = "mock", feature = "stdout"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

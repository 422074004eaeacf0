//! The agent's command line, [`Cli`]: a few flags of its own (`--config`, `--once`, `--host`,
//! `--log`) and the flag groups, each in its own file and each setting its own flags onto the
//! config (flags win over the file): where the samples come from (`source.rs`), what is sampled
//! (`sampling.rs`), the sinks and the web view (`sinks.rs`), diagnosis and the report
//! (`diagnose.rs`), training steps (`steps.rs`) and attribution (`attribution.rs`). `run` takes
//! the same flags (`run.rs`).

use std::path::PathBuf;

use crate::assembly::backend::MockFactory;
use crate::assembly::config::AgentConfig;
use crate::assembly::AssemblyOptions;

use crate::cli::attribution::AttributionArgs;
use crate::cli::common::ConfigError;
use crate::cli::diagnose::DiagnoseArgs;
use crate::cli::sampling::SamplingArgs;
use crate::cli::sinks::SinkArgs;
use crate::cli::source::SourceArgs;
use crate::cli::steps::StepsArgs;

/// Watch NVIDIA GPUs: sample every GPU through NVML (or the mock backend) and export the samples to
/// stdout, Prometheus, a Pushgateway, InfluxDB or an OpenTelemetry collector.
///
/// Flags override the config file. Stdout is the sink when no other sink (and no --report) is
/// configured. Diagnosis is on by default (docs/diagnosis.md).
///
/// Also: `gpumon-agent run [FLAGS] -- CMD ARGS…` runs a command under the agent and prints its
/// run report at exit (docs/run.md); `gpumon-agent compare BEFORE.json AFTER.json` says what
/// changed between two runs' reports.
#[derive(Debug, clap::Parser)]
#[command(
    name = "gpumon-agent",
    version,
    about,
    long_about = None,
    after_help = "Also:\n  gpumon-agent run [FLAGS] -- CMD ARGS...      run CMD under the agent; its run report at exit, its exit code (docs/run.md)\n  gpumon-agent compare BEFORE.json AFTER.json  what changed between two runs' reports"
)]
pub struct Cli {
    /// TOML config file (see examples/agent/gpumon.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The backend, the mock, the trace (source.rs).
    #[command(flatten)]
    pub source: SourceArgs,
    /// Interval, devices, metric families (sampling.rs).
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Take one sample, export it, flush every sink, exit.
    #[arg(long)]
    pub once: bool,
    /// The sinks and the web view (sinks.rs).
    #[command(flatten)]
    pub sinks: SinkArgs,
    /// Host name for the `host` label/tag, OTLP's `host.name` and the Pushgateway's `instance`
    /// (default: GPUMON_HOST, else NODE_NAME — the Kubernetes Downward API convention —, else the
    /// system's host name).
    #[arg(long, env = "GPUMON_HOST", value_name = "NAME")]
    pub host: Option<String>,
    /// Log filter (RUST_LOG syntax), e.g. info, debug, gpumon_core=debug.
    #[arg(long, default_value = "info", env = "GPUMON_LOG", value_name = "FILTER")]
    pub log: String,
    /// Diagnosis, --duration and the run report (diagnose.rs).
    #[command(flatten)]
    pub diagnose: DiagnoseArgs,
    /// Training steps from other processes: --steps-socket (steps.rs).
    #[command(flatten)]
    pub steps: StepsArgs,
    /// Who uses which GPU: --attribution, --proc-root, --passwd-file (attribution.rs).
    #[command(flatten)]
    pub attribution: AttributionArgs,
}

impl Cli {
    /// `--host` / GPUMON_HOST, else NODE_NAME; blank values count as unset.
    fn host_override(&self) -> Option<String> {
        let node_name = || std::env::var("NODE_NAME").ok();
        self.host
            .clone()
            .filter(|h| !h.trim().is_empty())
            .or_else(node_name)
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
    }

    /// What a run is, beside the config: `--host`, `--once`, `--report`, the families' flags,
    /// and this build's mock (`mock`).
    ///
    /// ## Errors
    ///
    /// A zero `--duration`, a family flag that names no family.
    pub fn options(&self, mock: Option<MockFactory>) -> Result<AssemblyOptions, ConfigError> {
        if self.diagnose.duration.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError("--duration: must be greater than zero".into()));
        }
        let mut options = AssemblyOptions::default()
            .with_once(self.once)
            .with_report(self.diagnose.report_requested())
            .with_families(self.sampling.families()?)
            .with_mock(mock);
        if let Some(host) = self.host_override() {
            options = options.with_host(host);
        }
        Ok(options)
    }

    /// Every group's flags that set a config key, set onto the config (flags win over the
    /// file). The rest are what a run is ([`Cli::options`]): `--once`, `--host`, `--report`,
    /// `--duration`, the families.
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse (`--prometheus-listen`, `--otlp-protocol`, …), or one
    /// that would be silently ignored (`--replay-speed` without a trace, …).
    pub fn onto_config(&self, file: &mut AgentConfig) -> Result<(), ConfigError> {
        self.source.onto_config(file)?;
        self.sampling.onto_config(file);
        self.attribution.onto_config(&mut file.attribution)?;
        self.diagnose.onto_config(&mut file.diagnose);
        self.steps.onto_config(&mut file.steps);
        self.sinks.onto_config(file)
    }
}

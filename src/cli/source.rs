//! Where the samples come from: the flags `--backend`, `--record`, `--replay`, `--replay-speed`,
//! `--mock-*`, `--nvml-library` and `--wake-suspended`, set onto `[agent] backend`, `[mock]`,
//! `[nvml]`, `[record]` and `[replay]` (flags win over the file). The library resolves them
//! (`crate::assembly::backend`).

use std::path::PathBuf;

use crate::assembly::backend::Backend;
use crate::assembly::config::AgentConfig;
use crate::core::trace::ReplaySpeed;

use crate::cli::common::ConfigError;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct SourceArgs {
    /// Backend: NVML, the mock, a recorded trace (replay, with --replay), or auto: NVML; without
    /// NVML, simulated GPUs when stdout is the only sink, and otherwise no GPU data (gpumon_up 0)
    /// while NVML is retried with backoff.
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Record every snapshot to this trace file (gzip JSON lines; docs/replay.md), to replay
    /// later with --replay.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Play this trace back (implies --backend replay) through diagnosis and the configured
    /// sinks, its data marked backend=replay; the agent stops when the trace ends.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// Replay speed: 1 real time (default), 2x twice as fast, 0.5 half; max (or 0) as fast as
    /// the sinks take it.
    #[arg(long, value_name = "max|FACTOR", value_parser = clap::value_parser!(ReplaySpeed))]
    pub replay_speed: Option<ReplaySpeed>,
    /// Mock fleet: a built-in name (h100x8, a100x4, h200x8, rtx4090x2, a100x8-mig, ...) or a TOML file.
    #[arg(long, value_name = "NAME|FILE")]
    pub mock_profile: Option<String>,
    /// Mock workload scenario: a built-in name (training, idle, dataloader-starved, memory-bound,
    /// imbalance, thermal-throttling, power-capped, near-oom, idle-allocated, pcie-bound, lost-gpu,
    /// ecc-burst) or a TOML file.
    #[arg(long, value_name = "NAME|FILE")]
    pub mock_scenario: Option<String>,
    /// Seed for the mock backend's deterministic values.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub mock_seed: Option<u64>,
    /// Explicit path of libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,
    /// Read runtime-suspended GPUs anyway (wakes them; default: report them suspended, leave
    /// them asleep).
    #[arg(long)]
    pub wake_suspended: bool,
}

impl SourceArgs {
    /// Sets these flags onto `file`.
    ///
    /// ## Errors
    ///
    /// `--replay-speed` without a trace to play: it would be silently ignored.
    pub fn onto_config(&self, file: &mut AgentConfig) -> Result<(), ConfigError> {
        fn set<T: Clone>(flag: &Option<T>, key: &mut Option<T>) {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        set(&self.backend, &mut file.agent.backend);
        set(&self.mock_profile, &mut file.mock.profile);
        set(&self.mock_scenario, &mut file.mock.scenario);
        set(&self.mock_seed, &mut file.mock.seed);
        set(&self.nvml_library, &mut file.nvml.library);
        if self.wake_suspended {
            file.nvml.wake_suspended = Some(true);
        }
        set(&self.record, &mut file.record.file);
        set(&self.replay, &mut file.replay.file);
        if self.replay_speed.is_some() && file.replay.file.is_none() {
            return Err(ConfigError("--replay-speed: no trace to play (--replay FILE or [replay] file)".into()));
        }
        if let Some(speed) = self.replay_speed {
            file.replay.speed = Some(toml::Value::String(speed.to_string()));
        }
        Ok(())
    }
}

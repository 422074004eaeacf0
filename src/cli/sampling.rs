//! What is sampled and how often: the flags `--interval`, `--sample-timeout`, `--devices`
//! (set onto `[agent]`) and `--only`, `--enable`, `--disable` (the metric families, beside the
//! config: [`SamplingArgs::families`]).

use std::time::Duration;

use crate::assembly::config::AgentConfig;
use crate::assembly::{parse_families, Families};

use crate::cli::common::ConfigError;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct SamplingArgs {
    /// Sampling interval (e.g. 1s, 500ms, 1m 30s; at least 100ms).
    #[arg(long, value_parser = crate::sinks::duration::parse_duration, value_name = "DURATION", allow_hyphen_values = true)]
    pub interval: Option<Duration>,
    /// Longest one sample may take.
    #[arg(long, value_parser = crate::sinks::duration::parse_duration, value_name = "DURATION", allow_hyphen_values = true)]
    pub sample_timeout: Option<Duration>,
    /// Visible GPUs, CUDA_VISIBLE_DEVICES syntax (0,1 / GPU-uuid / 0:1 / all / none). Default: the
    /// CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES environment variable, else all.
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Turn on (export) metric families, comma-separated. Off by default: processes,
    /// pcie_throughput, nvlink_links, high_resolution, gpm, nvlink, pcie_link, ecc, remapped_rows,
    /// performance_state, clock_events_by_reason (docs/fleet.md §8; diagnosis reads some of them
    /// all the same, without exporting them).
    #[arg(long, value_delimiter = ',', value_name = "FAMILIES")]
    pub enable: Vec<String>,
    /// Turn off metric families, comma-separated: neither exported nor read for diagnosis.
    #[arg(long, value_delimiter = ',', value_name = "FAMILIES")]
    pub disable: Vec<String>,
    /// Sample and export exactly these metric families, comma-separated, whatever the defaults
    /// are (e.g. utilization,memory,temperature,power); diagnosis reads nothing more. Not with
    /// --enable/--disable.
    #[arg(long, value_delimiter = ',', value_name = "FAMILIES", conflicts_with_all = ["enable", "disable"])]
    pub only: Option<Vec<String>>,
}

impl SamplingArgs {
    /// `--interval`, `--sample-timeout` and `--devices`, set onto `[agent]`.
    pub fn onto_config(&self, file: &mut AgentConfig) {
        for (flag, key) in
            [(&self.interval, &mut file.agent.interval), (&self.sample_timeout, &mut file.agent.sample_timeout)]
        {
            if flag.is_some() {
                *key = *flag;
            }
        }
        if self.devices.is_some() {
            file.agent.devices.clone_from(&self.devices);
        }
    }

    /// `--only`, `--enable`, `--disable`: the families chosen beside the config. Flags override
    /// the file, so `--only` ignores the file's `enable`/`disable`, while `--enable`/`--disable`
    /// refine the file's `only` (the library's [`Families`]).
    ///
    /// ## Errors
    ///
    /// A name that is no family, or an `--only` that names none.
    pub fn families(&self) -> Result<Families, ConfigError> {
        let mut families = match &self.only {
            Some(names) => {
                let only = parse_families(names, "--only")?;
                if only.is_empty() {
                    return Err(ConfigError("--only: names no metric family".into()));
                }
                Families::only(only)
            }
            None => Families::default(),
        };
        families = families
            .with_enabled(parse_families(&self.enable, "--enable")?)
            .with_disabled(parse_families(&self.disable, "--disable")?);
        Ok(families)
    }
}

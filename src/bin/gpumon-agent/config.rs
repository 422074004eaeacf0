//! The agent's configuration: a TOML file, overridden by command-line flags.
//! (`examples/agent/gpumon.example.toml` shows every key.)
//!
//! ```toml
//! [agent]
//! backend = "auto"          # auto | nvml | mock
//! interval = "1s"           # >= 100ms
//! sample_timeout = "1s"
//! devices = "0,1"           # CUDA_VISIBLE_DEVICES syntax; default: the environment's, else all
//! enable = ["processes"]    # opt-in metric families
//! disable = ["fan"]
//! sink_queue = 16           # snapshots queued per sink before the oldest is dropped
//! export_timeout = "10s"
//!
//! [mock]
//! profile = "h100x8"        # built-in name or TOML file
//! scenario = "training"     # built-in name or TOML file
//! seed = 42
//!
//! [nvml]
//! library = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
//!
//! [stdout]
//! format = "human"          # human | json
//! enabled = true            # default: on when no other sink is configured
//!
//! [prometheus]              # gpumon_sinks::prometheus::PrometheusConfig
//! [pushgateway]             # gpumon_sinks::prometheus::PushgatewayConfig
//! [influxdb]                # gpumon_sinks::influxdb::InfluxConfig
//! [otlp]                    # gpumon_sinks::otlp::OtlpConfig
//! [diagnose]                # see diagnose.rs
//! ```
//! Unknown keys are errors: a typo must not silently turn a setting off.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Which backend samples the GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// NVML when it loads. Otherwise: the mock (saying so) when stdout is the only sink; with any
    /// exporting sink, no GPU data (`gpumon_up 0`) while NVML is retried with backoff.
    #[default]
    Auto,
    /// NVML only: fail if it cannot load.
    Nvml,
    /// The scripted mock backend.
    Mock,
}

/// The whole configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub agent: AgentSection,
    #[serde(default)]
    pub mock: MockSection,
    #[serde(default)]
    pub nvml: NvmlSection,
    #[serde(default)]
    pub stdout: StdoutSection,
    pub prometheus: Option<PrometheusSection>,
    pub pushgateway: Option<PushgatewaySection>,
    pub influxdb: Option<InfluxSection>,
    pub otlp: Option<OtlpSection>,
    #[serde(default)]
    pub diagnose: crate::diagnose::DiagnoseSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    pub backend: Option<Backend>,
    #[serde(default, with = "opt_duration")]
    pub interval: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub sample_timeout: Option<Duration>,
    pub devices: Option<String>,
    #[serde(default)]
    pub enable: Vec<String>,
    #[serde(default)]
    pub disable: Vec<String>,
    pub sink_queue: Option<usize>,
    #[serde(default, with = "opt_duration")]
    pub export_timeout: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub shutdown_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
// Parsed in every build (a config file stays valid); read only where the mock is available.
#[cfg_attr(not(feature = "mock"), allow(dead_code))]
pub struct MockSection {
    pub profile: Option<String>,
    pub scenario: Option<String>,
    pub seed: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmlSection {
    pub library: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdoutSection {
    pub format: Option<gpumon::sinks::stdout::StdoutFormat>,
    pub enabled: Option<bool>,
}

// A sink compiled out still has its section parsed, so that using it is a clear error
// ("built without the `x` feature") rather than an "unknown field".
#[cfg(feature = "prometheus")]
pub type PrometheusSection = gpumon::sinks::prometheus::PrometheusConfig;
#[cfg(not(feature = "prometheus"))]
pub type PrometheusSection = toml::Value;
#[cfg(feature = "pushgateway")]
pub type PushgatewaySection = gpumon::sinks::prometheus::PushgatewayConfig;
#[cfg(not(feature = "pushgateway"))]
pub type PushgatewaySection = toml::Value;
#[cfg(feature = "influxdb")]
pub type InfluxSection = gpumon::sinks::influxdb::InfluxConfig;
#[cfg(not(feature = "influxdb"))]
pub type InfluxSection = toml::Value;
#[cfg(feature = "otlp")]
pub type OtlpSection = gpumon::sinks::otlp::OtlpConfig;
#[cfg(not(feature = "otlp"))]
pub type OtlpSection = toml::Value;

/// Parses durations written as `"500ms"`, `"1s"`, `"1m 30s"` (humantime) or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
    }
    humantime::parse_duration(t).map_err(|e| format!("invalid duration `{s}`: {e} (examples: 500ms, 1s, 2m)"))
}

pub(crate) mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let raw = Option::<Raw>::deserialize(d)?;
        match raw {
            None => Ok(None),
            Some(Raw::Secs(s)) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
            Some(Raw::Secs(s)) => Err(serde::de::Error::custom(format!("invalid duration {s}"))),
            Some(Raw::Text(t)) => super::parse_duration(&t).map(Some).map_err(serde::de::Error::custom),
        }
    }
}

/// Reads and parses a config file; errors name the file, the key and why.
pub fn load(path: &std::path::Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("invalid config file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("fast").unwrap_err().contains("fast"));
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = toml::from_str::<FileConfig>("[agent]\nintervall = \"1s\"\n").unwrap_err().to_string();
        assert!(e.contains("intervall"), "{e}");
        let e = toml::from_str::<FileConfig>("[agent]\ninterval = \"soon\"\n").unwrap_err().to_string();
        assert!(e.contains("soon"), "{e}");
    }
}

//! The agent's configuration: a TOML file, overridden by command-line flags.
//! (`examples/agent/gpumon.example.toml` shows every key.)
//!
//! ```toml
//! [agent]
//! backend = "auto"          # auto | nvml | mock | replay
//! interval = "1s"           # >= 100ms; durations: 500ms, 2s, 1m 30s or seconds
//! sample_timeout = "1s"
//! devices = "0,1"           # CUDA_VISIBLE_DEVICES syntax; default: the environment's, else all
//! enable = ["processes"]    # opt-in metric families
//! disable = ["fan"]
//! # only = ["utilization", "memory"]   # exactly these families (not with enable/disable)
//! sink_queue = 16           # snapshots queued per sink before the oldest is dropped
//! export_timeout = "10s"
//!
//! [mock]
//! profile = "h100x8"        # built-in name or TOML file
//! scenario = "training"     # built-in name or TOML file
//! seed = 42
//!
//! [record]
//! file = "run.gpumon-trace.gz"   # --record: a trace of every snapshot (docs/replay.md)
//!
//! [replay]
//! file = "run.gpumon-trace.gz"   # --replay: play a trace back (backend "replay")
//! speed = "max"             # --replay-speed: max (or 0) as fast as possible, 1 real time, 2x, 0.5
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
//! [influxdb.tls]            # gpumon_sinks::tls::TlsConfig (also [otlp.tls], [pushgateway.tls], [remote_write.tls])
//! [remote_write]            # gpumon_sinks::remote_write::RemoteWriteConfig
//! [otlp]                    # gpumon_sinks::otlp::OtlpConfig
//! [web]                     # gpumon_sinks::web::WebConfig (live web view, see web.rs)
//! [diagnose]                # see diagnose.rs
//! [steps]                   # see steps.rs (training steps over a Unix socket)
//! [attribution]             # see attribution.rs (containers, pods and users of GPU processes)
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
    /// A recorded trace played back (`--replay FILE`; docs/replay.md).
    Replay,
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
    pub remote_write: Option<RemoteWriteSection>,
    pub web: Option<crate::web::WebSection>,
    #[serde(default)]
    pub diagnose: crate::diagnose::DiagnoseSection,
    #[serde(default)]
    pub steps: crate::steps::StepsSection,
    #[serde(default)]
    pub attribution: crate::attribution::AttributionSection,
    #[serde(default)]
    pub record: RecordSection,
    #[serde(default)]
    pub replay: ReplaySection,
}

/// `[record]`: `--record`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSection {
    /// The trace to write (created or truncated at start-up).
    pub file: Option<PathBuf>,
}

/// `[replay]`: `--replay`, `--replay-speed`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySection {
    /// The trace to play back (with `backend = "replay"`, or alone).
    pub file: Option<PathBuf>,
    /// `"max"` (or 0) or a factor of real time: a number (`2`) or a string (`"2x"`).
    pub speed: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    pub backend: Option<Backend>,
    #[serde(default, with = "gpumon::sinks::duration::opt")]
    pub interval: Option<Duration>,
    #[serde(default, with = "gpumon::sinks::duration::opt")]
    pub sample_timeout: Option<Duration>,
    pub devices: Option<String>,
    #[serde(default)]
    pub enable: Vec<String>,
    #[serde(default)]
    pub disable: Vec<String>,
    /// The exact families to sample (`--only`); not with `enable`/`disable`.
    pub only: Option<Vec<String>>,
    pub sink_queue: Option<usize>,
    #[serde(default, with = "gpumon::sinks::duration::opt")]
    pub export_timeout: Option<Duration>,
    #[serde(default, with = "gpumon::sinks::duration::opt")]
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
    /// Where sysfs is mounted, for the runtime-PM check (default /sys).
    pub sysfs_root: Option<PathBuf>,
    /// Read runtime-suspended GPUs anyway, waking them (default false: left asleep).
    pub wake_suspended: Option<bool>,
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
#[cfg(feature = "remote-write")]
pub type RemoteWriteSection = gpumon::sinks::remote_write::RemoteWriteConfig;
#[cfg(not(feature = "remote-write"))]
pub type RemoteWriteSection = toml::Value;
#[cfg(feature = "otlp")]
pub type OtlpSection = gpumon::sinks::otlp::OtlpConfig;
#[cfg(not(feature = "otlp"))]
pub type OtlpSection = toml::Value;

/// Reads and parses a config file; errors name the file, the key and why.
pub fn load(path: &std::path::Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("invalid config file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One grammar in every section: `1m 30s`, `500ms`, `2s` and plain seconds.
    #[test]
    fn durations_use_one_grammar_in_every_section() {
        let text = r#"
            [agent]
            interval = "1m 30s"
            export_timeout = "500ms"
            [prometheus]
            stale_after = "1m 30s"
            [pushgateway]
            url = "http://127.0.0.1:9091"
            timeout = "2s"
            [influxdb]
            url = "http://127.0.0.1:8086"
            db = "d"
            batch_interval = "1m 30s"
            [otlp]
            timeout = "1m 30s"
        "#;
        let c: FileConfig = toml::from_str(text).unwrap();
        assert_eq!(c.agent.interval, Some(Duration::from_secs(90)));
        assert_eq!(c.agent.export_timeout, Some(Duration::from_millis(500)));
        #[cfg(feature = "prometheus")]
        assert_eq!(c.prometheus.unwrap().stale_after, Some(Duration::from_secs(90)));
        #[cfg(feature = "pushgateway")]
        assert_eq!(c.pushgateway.unwrap().timeout, Duration::from_secs(2));
        #[cfg(feature = "influxdb")]
        assert_eq!(c.influxdb.unwrap().batch_interval, Duration::from_secs(90));
        #[cfg(feature = "otlp")]
        assert_eq!(c.otlp.unwrap().timeout, Some(Duration::from_secs(90)));
        // A bad value: the error names the key (the TOML parser shows the line) and the value.
        for (section, key) in [("agent", "sample_timeout"), ("influxdb", "timeout"), ("otlp", "export_interval")] {
            let e = toml::from_str::<FileConfig>(&format!("[{section}]\n{key} = \"soon\"\n")).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("`soon`") && e.contains("1m 30s"), "{e}");
        }
    }

    #[test]
    fn tls_tables_are_read_per_sink() {
        let text = r#"
            [influxdb]
            url = "https://127.0.0.1:8086"
            db = "d"
            [influxdb.tls]
            ca_file = "/etc/gpumon/ca.pem"
            client_cert_file = "/etc/gpumon/client.pem"
            client_key_file = "/etc/gpumon/client.key"
            [otlp.tls]
            insecure_skip_verify = true
            [pushgateway.tls]
            ca_file = "/ca.pem"
        "#;
        let c: FileConfig = toml::from_str(text).unwrap();
        #[cfg(feature = "influxdb")]
        {
            let tls = c.influxdb.unwrap().tls;
            assert_eq!(tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/gpumon/ca.pem")));
            assert_eq!(tls.client_key_file.as_deref(), Some(std::path::Path::new("/etc/gpumon/client.key")));
        }
        #[cfg(feature = "otlp")]
        assert!(c.otlp.unwrap().tls.insecure_skip_verify);
        #[cfg(feature = "pushgateway")]
        assert!(c.pushgateway.unwrap().tls.ca_file.is_some());
        let e = toml::from_str::<FileConfig>("[influxdb.tls]\ncafile = \"/x\"\n").unwrap_err().to_string();
        assert!(e.contains("cafile"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = toml::from_str::<FileConfig>("[agent]\nintervall = \"1s\"\n").unwrap_err().to_string();
        assert!(e.contains("intervall"), "{e}");
        let e = toml::from_str::<FileConfig>("[agent]\ninterval = \"soon\"\n").unwrap_err().to_string();
        assert!(e.contains("soon"), "{e}");
    }
}

#[cfg(test)]
#[path = "config_props.rs"]
mod props;

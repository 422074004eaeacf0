//! The agent's configuration schema: the TOML file `gpumon-agent --config` reads, and what the
//! command line's flags are mapped onto. (`examples/agent/gpumon.example.toml` shows every key.)
//!
//! ```toml
//! [agent]
//! backend = "auto"          # auto | nvml | mock | replay
//! interval = "1s"           # 100ms to 1h, with its unit; other durations: 500ms, 2s, 1m 30s or seconds
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
//! [influxdb]                # one section per sink of the list (src/assembly/sinks/mod.rs):
//! [influxdb.tls]            # prometheus, pushgateway, influxdb, remote_write, otlp, web
//! [diagnose]                # DiagnoseSection
//! [steps]                   # StepsSection (training steps over a Unix socket)
//! [attribution]             # AttributionSection (containers, pods and users of GPU processes)
//! ```
//! Unknown keys are errors: a typo must not silently turn a setting off. A sink compiled out of
//! this build still has its section parsed (as a plain TOML value), so that using it is a clear
//! error ("built without the `x` feature") rather than an "unknown field".

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::backend::Backend;

/// Declares [`AgentConfig`] with one optional section per listed sink
/// (`crate::assembly::sinks::for_each_sink!`), between the stdout section and diagnosis.
macro_rules! agent_config {
    ($($sink:ident),*) => {
        /// The whole configuration file.
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[non_exhaustive]
        pub struct AgentConfig {
            /// `[agent]`: backend, interval, devices, metric families, sink queues.
            #[serde(default)]
            pub agent: AgentSection,
            /// `[mock]`: the simulated fleet.
            #[serde(default)]
            pub mock: MockSection,
            /// `[nvml]`: where the driver library is, runtime power management.
            #[serde(default)]
            pub nvml: NvmlSection,
            /// `[stdout]`: the terminal sink.
            #[serde(default)]
            pub stdout: StdoutSection,
            $(
                #[doc = concat!("`[", stringify!($sink), "]`: the ", stringify!($sink), " sink (its section's type: \
                    the sink's config in `gpumon_sinks`, or a bare table in a build without it).")]
                pub $sink: Option<super::sinks::$sink::Section>,
            )*
            /// `[diagnose]`: diagnosis (on by default).
            #[serde(default)]
            pub diagnose: DiagnoseSection,
            /// `[steps]`: training-step marks over a Unix socket.
            #[serde(default)]
            pub steps: StepsSection,
            /// `[attribution]`: who uses which GPU.
            #[serde(default)]
            pub attribution: AttributionSection,
            /// `[record]`: a trace of every snapshot.
            #[serde(default)]
            pub record: RecordSection,
            /// `[replay]`: a recorded trace played back.
            #[serde(default)]
            pub replay: ReplaySection,
        }
    };
}
super::sinks::for_each_sink!(agent_config);

impl std::str::FromStr for AgentConfig {
    type Err = toml::de::Error;

    /// Parses a configuration document (the file's text).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        toml::from_str(text)
    }
}

/// Reads and parses a config file.
///
/// ## Errors
///
/// A message naming the file, and for a bad document the key and why.
pub fn load(path: &Path) -> Result<AgentConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("invalid config file {}: {e}", path.display()))
}

/// `[agent]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AgentSection {
    /// Which backend samples the GPUs (default [`Backend::Auto`]).
    pub backend: Option<Backend>,
    /// The sampling interval (default [`gpumon_core::DEFAULT_INTERVAL`]), within the bounds of
    /// [`gpumon_core::Interval`]. A string with its unit: a bare number (`interval = 5`) is
    /// refused, since seconds or milliseconds would be a guess.
    #[serde(default, with = "gpumon_sinks::duration::opt_with_unit")]
    pub interval: Option<Duration>,
    /// The longest one sample may take.
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub sample_timeout: Option<Duration>,
    /// The visible GPUs, CUDA_VISIBLE_DEVICES syntax (default: the environment's, else all).
    pub devices: Option<String>,
    /// Metric families turned on (exported) over the defaults, which leave out
    /// [`gpumon_core::Family::OPT_IN`].
    #[serde(default)]
    pub enable: Vec<String>,
    /// Metric families turned off: neither exported nor sampled for the stages.
    #[serde(default)]
    pub disable: Vec<String>,
    /// The exact families to sample and export (`--only`); not with `enable`/`disable`. The
    /// stages then read only these (no [`gpumon_core::Family::READ_BY_STAGES`] added).
    pub only: Option<Vec<String>>,
    /// Snapshots queued per sink before the oldest is dropped.
    pub sink_queue: Option<usize>,
    /// How long one sink's export may take.
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub export_timeout: Option<Duration>,
    /// How long shutdown may take (default [`super::defaults::SHUTDOWN_TIMEOUT`]).
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub shutdown_timeout: Option<Duration>,
}

/// `[mock]`: the simulated fleet ([`super::backend::MockOptions`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MockSection {
    /// A built-in fleet name or a TOML file (default [`super::defaults::MOCK_PROFILE`]).
    pub profile: Option<String>,
    /// A built-in workload scenario or a TOML file.
    pub scenario: Option<String>,
    /// Seed for the deterministic values.
    pub seed: Option<u64>,
}

/// `[nvml]` ([`super::backend::NvmlOptions`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NvmlSection {
    /// Explicit path of libnvidia-ml.so.1.
    pub library: Option<PathBuf>,
    /// Where sysfs is mounted, for the runtime-PM check (default /sys).
    pub sysfs_root: Option<PathBuf>,
    /// Read runtime-suspended GPUs anyway, waking them (default false: left asleep).
    pub wake_suspended: Option<bool>,
}

/// `[stdout]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StdoutSection {
    /// Human lines or JSON lines (default [`super::defaults::STDOUT_FORMAT`]).
    pub format: Option<gpumon_sinks::stdout::StdoutFormat>,
    /// Whether to print (default: on when no other sink is configured).
    pub enabled: Option<bool>,
}

/// `[record]`: `--record`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RecordSection {
    /// The trace to write (created or truncated at start-up).
    pub file: Option<PathBuf>,
}

/// `[replay]`: `--replay`, `--replay-speed`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ReplaySection {
    /// The trace to play back (with `backend = "replay"`, or alone).
    pub file: Option<PathBuf>,
    /// `"max"` (or 0) or a factor of real time: a number (`2`) or a string (`"2x"`).
    pub speed: Option<toml::Value>,
}

/// `[diagnose]`.
///
/// ```toml
/// [diagnose]
/// enabled = true            # default; --no-diagnose turns it off
/// window = "30s"            # --diagnose-window; default 30 s or 3 intervals; ≥ 1 interval
/// idle_grace = "60s"        # idle_allocated waits this long for a job that has not run yet
/// disable = ["imbalance"]   # rules switched off (stable kind names)
///
/// [diagnose.thresholds]     # gpumon_core::diagnose::Thresholds, every value a ratio 0–1
/// starvation_dip = 0.10
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DiagnoseSection {
    /// Whether diagnosis runs (default true).
    pub enabled: Option<bool>,
    /// How long a condition must hold to raise a finding (default
    /// [`gpumon_core::diagnose::DEFAULT_WINDOW`], or five sampling intervals when longer;
    /// at least one interval, at most [`gpumon_core::diagnose::MAX_WINDOW_TICKS`] of them).
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub window: Option<Duration>,
    /// How long idle_allocated waits for a job that has not run yet.
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub idle_grace: Option<Duration>,
    /// Rules switched off, by their stable kind names.
    #[serde(default)]
    pub disable: Vec<String>,
    /// Kept as a table so that an unknown or mistyped threshold is reported with its full key.
    pub thresholds: Option<toml::Table>,
}

/// `[steps]`: training steps from other processes.
///
/// ```toml
/// [steps]
/// socket = "/run/gpumon/steps.sock"   # --steps-socket; off when unset
/// every_n = 1                         # report every N-th step (default 1)
/// mode = "0660"                       # the socket file's permissions, octal (default 0660)
/// max_connections = 64                # clients served at once
/// max_connections_per_uid = 16        # clients of one Unix user served at once
/// max_runs_per_uid = 64               # runs one Unix user may hold
/// idle_timeout = "1h"                 # a run with no mark for this long is evicted
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StepsSection {
    /// The Unix socket step marks arrive on (off when unset).
    pub socket: Option<PathBuf>,
    /// Report every N-th step (default [`super::defaults::STEPS_EVERY_N`]).
    pub every_n: Option<u64>,
    /// The socket file's permissions, octal (default [`super::defaults::STEPS_SOCKET_MODE`]).
    pub mode: Option<String>,
    /// Clients served at once.
    pub max_connections: Option<usize>,
    /// Clients of one Unix user served at once.
    pub max_connections_per_uid: Option<usize>,
    /// Runs one Unix user may hold.
    pub max_runs_per_uid: Option<usize>,
    /// A run registered over the socket with no mark for this long is evicted.
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub idle_timeout: Option<Duration>,
}

/// `[attribution]`: who uses which GPU (docs/attribution.md).
///
/// ```toml
/// [attribution]
/// enabled = true             # --attribution; default off. Turns on the `processes` family.
/// proc_root = "/host/proc"   # --proc-root / GPUMON_PROC_ROOT; default /proc (the host's)
/// passwd_file = "/host/etc/passwd"   # --passwd-file / GPUMON_PASSWD_FILE; default /etc/passwd
/// kubelet = false            # GPU → pod from the kubelet's pod-resources API (`kubelet` feature)
/// kubelet_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"
/// kubelet_refresh = "10s"
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AttributionSection {
    /// Attribute GPU processes to containers, pods and users (default false).
    pub enabled: Option<bool>,
    /// Where the host's /proc is mounted.
    pub proc_root: Option<PathBuf>,
    /// The passwd file user names come from.
    pub passwd_file: Option<PathBuf>,
    /// Ask the kubelet which pod holds each GPU (default false).
    pub kubelet: Option<bool>,
    /// The kubelet's pod-resources socket (default [`super::defaults::KUBELET_SOCKET`]).
    pub kubelet_socket: Option<PathBuf>,
    /// How often the kubelet is asked (default [`super::defaults::KUBELET_REFRESH`]).
    #[serde(default, with = "gpumon_sinks::duration::opt")]
    pub kubelet_refresh: Option<Duration>,
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
        let c: AgentConfig = toml::from_str(text).unwrap();
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
            let e = toml::from_str::<AgentConfig>(&format!("[{section}]\n{key} = \"soon\"\n")).unwrap_err().to_string();
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
        let c: AgentConfig = toml::from_str(text).unwrap();
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
        let e = toml::from_str::<AgentConfig>("[influxdb.tls]\ncafile = \"/x\"\n").unwrap_err().to_string();
        assert!(e.contains("cafile"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = toml::from_str::<AgentConfig>("[agent]\nintervall = \"1s\"\n").unwrap_err().to_string();
        assert!(e.contains("intervall"), "{e}");
        let e = toml::from_str::<AgentConfig>("[agent]\ninterval = \"soon\"\n").unwrap_err().to_string();
        assert!(e.contains("soon"), "{e}");
    }
}

#[cfg(test)]
#[path = "config_props.rs"]
mod props;

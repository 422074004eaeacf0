//! Attribution — who uses which GPU: the flags `--attribution`, `--proc-root`, `--passwd-file`
//! and the `[attribution]` section (docs/attribution.md).
//!
//! ```toml
//! [attribution]
//! enabled = true             # --attribution; default off. Turns on the `processes` family.
//! proc_root = "/host/proc"   # --proc-root / GPUMON_PROC_ROOT; default /proc (the host's)
//! passwd_file = "/host/etc/passwd"   # --passwd-file / GPUMON_PASSWD_FILE; default /etc/passwd
//! kubelet = false            # GPU → pod from the kubelet's pod-resources API (`kubelet` feature)
//! kubelet_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"
//! kubelet_refresh = "10s"
//! ```
//! With `enabled`, every GPU process gets its container, pod and Unix user from the proc root,
//! and every GPU the distinct owners of its processes; with `kubelet`, every GPU (and MIG
//! instance) the pod the kubelet allocated it to. Either installs the attribution stage; both
//! together give a GPU its pod's `namespace`, `pod`, `container` and its processes' `user`.
//! Failures are counted in `gpumon_attribution_failures_total{source}`, never fatal.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpumon::assembly::config::AttributionSection;
use gpumon::assembly::defaults;
use gpumon::core::attribution::procfs::{DEFAULT_PASSWD_FILE, DEFAULT_PROC_ROOT};
use gpumon::core::attribution::{AllocationCache, AttributionConfig, AttributionStats};
use gpumon::core::{AgentBuilder, Family, MetricSet};

use crate::app::ConfigError;

pub use gpumon::assembly::defaults::{
    KUBELET_REFRESH as DEFAULT_KUBELET_REFRESH, KUBELET_SOCKET as DEFAULT_KUBELET_SOCKET,
};
/// Whether this build has the kubelet pod-resources client (the `kubelet` feature, default).
const KUBELET_IN_BUILD: bool = cfg!(feature = "kubelet");

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct AttributionArgs {
    /// Attribute GPU processes to their container, Kubernetes pod and Unix user, and label every
    /// GPU's series with its owners (namespace, pod, container, user). Turns on the processes
    /// family. See docs/attribution.md.
    #[arg(long)]
    pub attribution: bool,
    /// Where the host's /proc is mounted (default /proc): from inside a container, mount the
    /// host's /proc (e.g. at /host/proc) and point here.
    #[arg(long, env = "GPUMON_PROC_ROOT", value_name = "DIR")]
    pub proc_root: Option<PathBuf>,
    /// The passwd file user names come from (default /etc/passwd; in a container, the host's,
    /// mounted e.g. at /host/etc/passwd).
    #[arg(long, env = "GPUMON_PASSWD_FILE", value_name = "FILE")]
    pub passwd_file: Option<PathBuf>,
    /// Ask the kubelet's pod-resources API which pod holds each GPU and MIG device, and label
    /// their series with namespace, pod and container (`[attribution] kubelet`).
    /// See docs/kubernetes.md.
    #[arg(long)]
    pub kubelet: bool,
    /// The kubelet's pod-resources socket (default /var/lib/kubelet/pod-resources/kubelet.sock).
    #[arg(long, env = "GPUMON_KUBELET_SOCKET", value_name = "PATH")]
    pub kubelet_socket: Option<PathBuf>,
}

/// Where and how often to ask the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletPlan {
    pub socket: PathBuf,
    pub refresh: Duration,
}

/// The attribution settings resolved from the file and the flags, then what runs.
#[derive(Debug)]
pub struct Plan {
    /// Whether process attribution is on (it needs the processes family).
    processes: bool,
    /// The stage, when anything is attributed.
    config: Option<AttributionConfig>,
    kubelet: Option<(KubeletPlan, AllocationCache, Arc<AttributionStats>)>,
    /// Whatever keeps the kubelet refresher alive; dropped at stop.
    running: Option<Box<dyn std::any::Any + Send>>,
}

/// Resolves `[attribution]` and the flags; every error names the key.
pub fn resolve(args: &AttributionArgs, file: &AttributionSection) -> Result<Plan, ConfigError> {
    let processes = args.attribution || file.enabled.unwrap_or(defaults::ATTRIBUTION);
    let kubelet = args.kubelet || file.kubelet.unwrap_or(defaults::KUBELET);
    if kubelet && !KUBELET_IN_BUILD {
        return Err(ConfigError(
            "attribution.kubelet / --kubelet: this build of gpumon-agent has no kubelet client (build with the `kubelet` feature)"
                .into(),
        ));
    }
    let refresh = file.kubelet_refresh.unwrap_or(DEFAULT_KUBELET_REFRESH);
    if refresh < Duration::from_secs(1) {
        return Err(ConfigError(format!("attribution.kubelet_refresh: {refresh:?} is below the minimum of 1s")));
    }
    let socket = (args.kubelet_socket.clone().or_else(|| file.kubelet_socket.clone()))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_SOCKET));
    if socket.as_os_str().is_empty() {
        return Err(ConfigError("attribution.kubelet_socket / --kubelet-socket: empty path".into()));
    }
    let proc_root = args.proc_root.clone().or_else(|| file.proc_root.clone());
    let passwd_file = args.passwd_file.clone().or_else(|| file.passwd_file.clone());
    if processes {
        // A typo here would silently attribute nothing: refuse it. (The default /proc and
        // /etc/passwd are not checked: without them attribution degrades, counted and logged.)
        if let Some(root) = &proc_root {
            if !root.is_dir() {
                return Err(ConfigError(format!(
                    "attribution.proc_root / --proc-root: {} is not a directory",
                    root.display()
                )));
            }
        }
        if let Some(passwd) = &passwd_file {
            if !passwd.is_file() {
                return Err(ConfigError(format!(
                    "attribution.passwd_file / --passwd-file: {} is not a readable file",
                    passwd.display()
                )));
            }
        }
    }
    if !processes && !kubelet {
        return Ok(Plan { processes, config: None, kubelet: None, running: None });
    }
    let stats = Arc::new(AttributionStats::default());
    let mut config = AttributionConfig::new()
        .with_proc_root(proc_root.unwrap_or_else(|| PathBuf::from(DEFAULT_PROC_ROOT)))
        .with_passwd_file(passwd_file.unwrap_or_else(|| PathBuf::from(DEFAULT_PASSWD_FILE)))
        .with_stats(stats.clone());
    let kubelet = if kubelet {
        let cache = AllocationCache::new();
        config = config.with_allocations(cache.clone());
        Some((KubeletPlan { socket, refresh }, cache, stats))
    } else {
        None
    };
    Ok(Plan { processes, config: Some(config), kubelet, running: None })
}

impl Plan {
    /// The families to sample: process attribution needs the processes family. Refused when
    /// that family was switched off explicitly (`disabled`): which should win is not obvious.
    pub fn metrics(&self, metrics: MetricSet, disabled: bool) -> Result<MetricSet, ConfigError> {
        if !self.processes {
            return Ok(metrics);
        }
        if disabled {
            return Err(ConfigError(
                "attribution.enabled / --attribution: needs the `processes` family, which agent.disable / --disable \
                 turns off"
                    .into(),
            ));
        }
        Ok(metrics.with(Family::Processes))
    }

    /// Adds the attribution stage. Add it before the stages that read owners.
    pub fn install(&mut self, mut builder: AgentBuilder) -> AgentBuilder {
        if let Some(config) = self.config.take() {
            builder = builder.processor(config.build());
        }
        builder
    }

    /// Starts the kubelet refresher, if configured (inside the runtime).
    pub fn start(&mut self) -> Result<(), String> {
        let Some((plan, cache, stats)) = self.kubelet.take() else { return Ok(()) };
        tracing::info!(socket = %plan.socket.display(), refresh = ?plan.refresh, "asking the kubelet for GPU allocations");
        self.running = Some(spawn_kubelet(&plan, cache, stats)?);
        Ok(())
    }

    /// Stops the kubelet refresher.
    pub async fn stop(&mut self) {
        self.running = None;
    }
}

/// Starts the pod-resources refresher that fills `cache` every `plan.refresh`, off the sampling
/// path, and counts its failures in `stats` (docs/kubernetes.md). The returned handle stops the
/// refresher when dropped ([`Plan::stop`]).
#[cfg(feature = "kubelet")]
fn spawn_kubelet(
    plan: &KubeletPlan,
    cache: AllocationCache,
    stats: Arc<AttributionStats>,
) -> Result<Box<dyn std::any::Any + Send>, String> {
    use gpumon::core::attribution::kubelet::{spawn_refresher, KubeletConfig};
    let config = KubeletConfig::new(plan.socket.clone()).with_refresh(plan.refresh);
    Ok(Box::new(spawn_refresher(config, cache, stats)))
}

/// Without the `kubelet` feature `kubelet = true` is refused by [`resolve`], so this is never
/// reached; it says so if it were.
#[cfg(not(feature = "kubelet"))]
fn spawn_kubelet(
    plan: &KubeletPlan,
    cache: AllocationCache,
    stats: Arc<AttributionStats>,
) -> Result<Box<dyn std::any::Any + Send>, String> {
    let _ = (cache, stats);
    Err(format!("attribution.kubelet: this build has no kubelet client to ask {}", plan.socket.display()))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    fn section(text: &str) -> AttributionSection {
        toml::from_str(text).unwrap()
    }

    fn no_flags() -> AttributionArgs {
        AttributionArgs { attribution: false, proc_root: None, passwd_file: None, kubelet: false, kubelet_socket: None }
    }

    #[test]
    fn off_by_default_and_on_by_flag_or_file() {
        let plan = resolve(&no_flags(), &section("")).unwrap();
        assert!(plan.config.is_none());
        assert_eq!(plan.metrics(MetricSet::default(), false).unwrap(), MetricSet::default());

        for (args, text) in [(AttributionArgs { attribution: true, ..no_flags() }, ""), (no_flags(), "enabled = true")]
        {
            let plan = resolve(&args, &section(text)).unwrap();
            assert!(plan.config.is_some() && plan.kubelet.is_none());
            let metrics = plan.metrics(MetricSet::default(), false).unwrap();
            assert!(metrics.contains(Family::Processes));
            let e = plan.metrics(MetricSet::default(), true).unwrap_err();
            assert!(e.0.contains("processes"), "{}", e.0);
        }
    }

    #[test]
    fn paths_from_flags_win_and_bad_ones_name_their_key() {
        let dir = std::env::temp_dir();
        let args = AttributionArgs { attribution: true, proc_root: Some(dir.clone()), ..no_flags() };
        assert!(resolve(&args, &section("proc_root = \"/nonexistent/proc\"")).is_ok(), "the flag wins");
        for (text, key) in [
            ("enabled = true\nproc_root = \"/nonexistent/proc\"", "attribution.proc_root"),
            ("enabled = true\npasswd_file = \"/nonexistent/passwd\"", "attribution.passwd_file"),
            ("kubelet_refresh = \"100ms\"", "attribution.kubelet_refresh"),
            ("kubelet_socket = \"\"", "attribution.kubelet_socket"),
        ] {
            let e = resolve(&no_flags(), &section(text)).unwrap_err();
            assert!(e.0.contains(key), "{text}: {}", e.0);
        }
        let e = toml::from_str::<AttributionSection>("kubelet_sockett = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("kubelet_sockett"), "{e}");
        let e = toml::from_str::<AttributionSection>("kubelet_refresh = \"soon\"").unwrap_err().to_string();
        assert!(e.contains("soon"), "{e}");
    }

    /// The commented `[attribution]` block of the example file parses and shows the defaults.
    #[test]
    fn the_example_file_shows_every_key_with_its_default() {
        let text = include_str!("../../../examples/agent/gpumon.example.toml");
        let start = text.find("# [attribution]").expect("an [attribution] block");
        let block: String = text[start..]
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches('#').trim()))
            .collect();
        let file: FileAttribution = toml::from_str(&block).unwrap();
        let s = file.attribution;
        assert_eq!(s.enabled, Some(false));
        assert_eq!(s.proc_root.as_deref(), Some(std::path::Path::new(DEFAULT_PROC_ROOT)));
        assert_eq!(s.passwd_file.as_deref(), Some(std::path::Path::new(DEFAULT_PASSWD_FILE)));
        assert_eq!(s.kubelet, Some(false));
        assert_eq!(s.kubelet_socket.as_deref(), Some(std::path::Path::new(DEFAULT_KUBELET_SOCKET)));
        assert_eq!(s.kubelet_refresh, Some(DEFAULT_KUBELET_REFRESH));
    }

    #[derive(Deserialize)]
    struct FileAttribution {
        attribution: AttributionSection,
    }

    #[test]
    fn kubelet_without_the_client_is_a_clear_error() {
        if KUBELET_IN_BUILD {
            let plan = resolve(&no_flags(), &section("kubelet = true\nkubelet_refresh = \"30s\"")).unwrap();
            let (kubelet, _, _) = plan.kubelet.as_ref().unwrap();
            assert_eq!(kubelet.refresh, Duration::from_secs(30));
            assert_eq!(kubelet.socket, PathBuf::from(DEFAULT_KUBELET_SOCKET));
            // The flags turn it on too, and their socket wins over the file's.
            let args = AttributionArgs { kubelet: true, kubelet_socket: Some("/run/k.sock".into()), ..no_flags() };
            let plan = resolve(&args, &section("kubelet_socket = \"/x.sock\"")).unwrap();
            let (kubelet, _, _) = plan.kubelet.as_ref().unwrap();
            assert_eq!(kubelet.socket, PathBuf::from("/run/k.sock"));
            assert!(!plan.processes, "pods alone do not need the processes family");
        } else {
            let e = resolve(&no_flags(), &section("kubelet = true")).unwrap_err();
            assert!(e.0.contains("attribution.kubelet") && e.0.contains("feature"), "{}", e.0);
        }
    }
}

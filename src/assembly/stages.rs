//! The stages, resolved from their sections — diagnosis (`[diagnose]`), the step tracker and its
//! socket (`[steps]`), attribution and the kubelet refresher (`[attribution]`), the run report —
//! and the background services they run ([`Services`]), each a typed handle with a start/stop
//! lifecycle.
//!
//! Every error names its key. Processors run in the order they are added; [`super::Assembly`]
//! adds attribution first (the stages after it read owners), then the step tracker (diagnosis
//! reads each tick's steps), diagnosis, and the report last (it reads each tick's findings).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpumon_core::attribution::procfs::{DEFAULT_PASSWD_FILE, DEFAULT_PROC_ROOT};
use gpumon_core::attribution::{AllocationCache, AttributionConfig, AttributionStats};
use gpumon_core::diagnose::{
    limitations, DiagnoseConfig, Diagnoser, Limitation, RunJob, Sampling, Thresholds, DEFAULT_WINDOW, MIN_WINDOW_TICKS,
};
use gpumon_core::report::{ReportHandle, RunReport};
use gpumon_core::stages::{Service, ServiceError as CoreServiceError};
use gpumon_core::steps::socket::{SocketConfig, SocketError, StepSocket};
use gpumon_core::steps::{StepConfig, StepRegistry, StepTracker};
use gpumon_core::{AgentBuilder, Family, MetricSet};
use serde::Deserialize;

use super::config::{AttributionSection, DiagnoseSection, StepsSection};
use super::defaults;
use super::error::{AssemblyError, ServiceError};

/// Whether this build has the kubelet pod-resources client (the `kubelet` feature, default).
const KUBELET_IN_BUILD: bool = cfg!(feature = "kubelet");

// --- diagnosis and the report ---------------------------------------------------------------------

/// `[diagnose]`, resolved.
#[derive(Debug)]
pub(super) struct DiagnosePlan {
    diagnoser: Option<Diagnoser>,
    /// The diagnosis settings, when diagnosis is on (for the limitations of the run).
    config: Option<DiagnoseConfig>,
    thresholds: Thresholds,
}

/// The diagnosis window `[diagnose]` gives at `interval`: `diagnose.window`, else the default
/// spanning at least MIN_WINDOW_TICKS ticks (`--interval 1m` works as is, and without the
/// agent's own warning that the cross-tick rules need that many).
pub(super) fn diagnosis_window(file: &DiagnoseSection, interval: Duration) -> Duration {
    file.window.unwrap_or_else(|| DEFAULT_WINDOW.max(interval.saturating_mul(MIN_WINDOW_TICKS as u32)))
}

/// Resolves `[diagnose]` against the sampling interval and the window ([`diagnosis_window`]);
/// every error names the key. `run_job`: the processes of the job the agent runs for.
pub(super) fn diagnose(
    file: &DiagnoseSection,
    interval: Duration,
    window: Duration,
    run_job: Option<RunJob>,
) -> Result<DiagnosePlan, AssemblyError> {
    let mut cfg = DiagnoseConfig::default().with_window(window);
    cfg = cfg.disable_by_name(file.disable.iter().map(String::as_str))?;
    if let Some(table) = &file.thresholds {
        cfg = cfg.with_thresholds(thresholds(table)?);
    }
    if let Some(grace) = file.idle_grace {
        cfg = cfg.with_idle_grace(grace);
    }
    let enabled = file.enabled.unwrap_or(defaults::DIAGNOSE);
    // Checked even when diagnosis is off, except against the interval: a typo is a typo.
    cfg.validate(enabled.then_some(interval))?;
    let thresholds = cfg.thresholds;
    let config = enabled.then(|| cfg.clone());
    let diagnoser = match (enabled, run_job) {
        (false, _) => None,
        (true, None) => Some(Diagnoser::new(cfg)?),
        (true, Some(job)) => Some(Diagnoser::new(cfg)?.with_run_job(job)),
    };
    Ok(DiagnosePlan { diagnoser, config, thresholds })
}

/// `[diagnose.thresholds]` → [`Thresholds`], naming `diagnose.thresholds.<key>` on any error.
pub(super) fn thresholds(table: &toml::Table) -> Result<Thresholds, AssemblyError> {
    let mut values = toml::Table::new();
    for (key, value) in table {
        let name = format!("diagnose.thresholds.{key}");
        if !Thresholds::NAMES.contains(&key.as_str()) {
            return Err(AssemblyError::invalid(
                name,
                format!("unknown threshold (known: {})", Thresholds::NAMES.join(", ")),
            ));
        }
        let number = match value {
            toml::Value::Float(f) => *f,
            toml::Value::Integer(i) => *i as f64,
            other => return Err(AssemblyError::invalid(name, format!("expected a number (a ratio 0–1), got {other}"))),
        };
        values.insert(key.clone(), toml::Value::Float(number));
    }
    // All keys are known and numeric, so only the range and ordering checks remain, done by
    // `validate` (which names the key).
    let t = Thresholds::deserialize(toml::Value::Table(values))
        .map_err(|e| AssemblyError::invalid("diagnose.thresholds", e.to_string()))?;
    t.validate()?;
    Ok(t)
}

impl DiagnosePlan {
    /// Whether diagnosis runs.
    pub(super) fn is_on(&self) -> bool {
        self.diagnoser.is_some()
    }

    /// Adds the diagnosis stage and, when `report`, the run report after it (processors run in
    /// order: the report reads each tick's diagnosis events); the report lists the limitations
    /// of diagnosing under `sampling` in its overview.
    pub(super) fn install(
        &mut self,
        mut builder: AgentBuilder,
        sampling: Sampling,
        report: bool,
    ) -> (AgentBuilder, Option<ReportHandle>) {
        if let Some(d) = self.diagnoser.take() {
            builder = builder.processor(d);
        }
        // The GPU-time accounts read each tick's findings, as the report does (family `accounts`).
        if sampling.metrics().contains(Family::Accounts) {
            builder = builder.processor(gpumon_core::accounts::Accounts::new().0.with_thresholds(&self.thresholds));
        }
        if !report {
            return (builder, None);
        }
        let (stage, handle) = RunReport::new();
        let stage = match &self.config {
            Some(config) => stage.with_diagnosis(config, sampling),
            None => stage.with_thresholds(&self.thresholds),
        };
        (builder.processor(stage), Some(handle))
    }

    /// The settings under which diagnosis rules cannot work (none when diagnosis is off).
    pub(super) fn limitations(&self, sampling: &Sampling) -> Vec<Limitation> {
        self.config.as_ref().map(|c| limitations(c, sampling)).unwrap_or_default()
    }
}

// --- training steps -------------------------------------------------------------------------------

/// `[steps]`, resolved: the tracker and its registry (when `steps.socket` is set, or steps are
/// marked in-process), and the socket feeding it.
#[derive(Debug)]
pub(super) struct StepsPlan {
    pub(super) tracker: Option<(StepTracker, StepRegistry)>,
    pub(super) socket: Option<StepsSocket>,
}

/// Resolves `[steps]`; every error names the key. `in_process`: a tracker even without a socket.
pub(super) fn steps(file: &StepsSection, in_process: bool) -> Result<StepsPlan, AssemblyError> {
    let every_n = file.every_n.unwrap_or(defaults::STEPS_EVERY_N);
    if every_n == 0 {
        return Err(AssemblyError::invalid("steps.every_n", "must be at least 1"));
    }
    let mode = match &file.mode {
        Some(text) => {
            let digits = text.trim().trim_start_matches("0o");
            match u32::from_str_radix(digits, 8) {
                Ok(m) if m <= 0o777 => m,
                _ => {
                    return Err(AssemblyError::invalid(
                        "steps.mode",
                        format!("`{text}` is not an octal permission mode such as \"0660\""),
                    ))
                }
            }
        }
        None => defaults::STEPS_SOCKET_MODE,
    };
    for (key, value) in [
        ("steps.max_connections", file.max_connections),
        ("steps.max_connections_per_uid", file.max_connections_per_uid),
        ("steps.max_runs_per_uid", file.max_runs_per_uid),
    ] {
        if value == Some(0) {
            return Err(AssemblyError::invalid(key, "must be at least 1"));
        }
    }
    if file.idle_timeout.is_some_and(|t| t.is_zero()) {
        return Err(AssemblyError::invalid("steps.idle_timeout", "must be above 0"));
    }
    let tracker =
        || StepTracker::new(StepConfig::every_n(every_n)).map_err(|e| AssemblyError::invalid("steps", e.to_string()));
    let Some(path) = file.socket.clone() else {
        let tracker = if in_process { Some(tracker()?) } else { None };
        return Ok(StepsPlan { tracker, socket: None });
    };
    if path.as_os_str().is_empty() {
        return Err(AssemblyError::invalid("steps.socket", "empty path"));
    }
    // What can be known before binding (too long, not a socket) is a configuration error named
    // by its key rather than a failure of the running agent.
    gpumon_core::steps::socket::check_path(&path).map_err(|e| AssemblyError::invalid("steps.socket", e.to_string()))?;
    let mut config = SocketConfig::new(path);
    config.mode = mode;
    if let Some(n) = file.max_connections {
        config.max_connections = n;
    }
    if let Some(n) = file.max_connections_per_uid {
        config.max_connections_per_uid = n;
    }
    if let Some(n) = file.max_runs_per_uid {
        config.max_runs_per_uid = n;
    }
    if let Some(t) = file.idle_timeout {
        config.idle_timeout = t;
    }
    let (tracker, registry) = tracker()?;
    let socket = StepsSocket { config, registry: registry.clone(), running: None };
    Ok(StepsPlan { tracker: Some((tracker, registry)), socket: Some(socket) })
}

/// The steps socket (`steps.socket`): training processes write one JSON line per step to it
/// (protocol: [`gpumon_core::steps::socket`]), and the step tracker the assembly added reports
/// them. Bound by [`StepsSocket::start`], removed by [`StepsSocket::stop`].
#[derive(Debug)]
pub struct StepsSocket {
    config: SocketConfig,
    registry: StepRegistry,
    running: Option<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

impl StepsSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// The socket's settings (path, mode, connections).
    pub fn config(&self) -> &SocketConfig {
        &self.config
    }

    /// The registry the socket records marks in (mark steps in-process through it too).
    pub fn registry(&self) -> &StepRegistry {
        &self.registry
    }

    /// Binds the socket (replacing a stale one a killed agent left) and serves it on the
    /// current tokio runtime. Does nothing when already serving.
    ///
    /// ## Errors
    ///
    /// [`SocketError`]: another process listens on the path, the path is not a socket, or it
    /// cannot be bound.
    ///
    /// ## Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(&mut self) -> Result<(), SocketError> {
        if self.running.is_some() {
            return Ok(());
        }
        let socket = StepSocket::bind(self.config.clone(), self.registry.clone())?;
        tracing::info!(path = %socket.path().display(), "accepting training steps");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(socket.serve(async move {
            let _ = rx.await;
        }));
        self.running = Some((tx, task));
        Ok(())
    }

    /// Whether the socket is being served (marks may have arrived since the last tick).
    pub fn is_serving(&self) -> bool {
        self.running.is_some()
    }

    /// Stops serving and removes the socket file.
    pub async fn stop(&mut self) {
        if let Some((tx, task)) = self.running.take() {
            let _ = tx.send(());
            let _ = task.await;
        }
    }
}

// --- attribution ----------------------------------------------------------------------------------

/// `[attribution]`, resolved.
#[derive(Debug)]
pub(super) struct AttributionPlan {
    /// Whether process attribution is on (it needs the processes family).
    pub(super) processes: bool,
    /// The stage, when anything is attributed.
    config: Option<AttributionConfig>,
    /// The kubelet refresher, when `attribution.kubelet`.
    pub(super) kubelet: Option<KubeletService>,
}

/// Resolves `[attribution]`; every error names the key.
pub(super) fn attribution(file: &AttributionSection) -> Result<AttributionPlan, AssemblyError> {
    let processes = file.enabled.unwrap_or(defaults::ATTRIBUTION);
    let kubelet = file.kubelet.unwrap_or(defaults::KUBELET);
    if kubelet && !KUBELET_IN_BUILD {
        return Err(AssemblyError::invalid(
            "attribution.kubelet",
            "this build of gpumon has no kubelet client (build with the `kubelet` feature)",
        ));
    }
    let refresh = file.kubelet_refresh.unwrap_or(defaults::KUBELET_REFRESH);
    if refresh < Duration::from_secs(1) {
        return Err(AssemblyError::invalid(
            "attribution.kubelet_refresh",
            format!("{refresh:?} is below the minimum of 1s"),
        ));
    }
    let socket = file.kubelet_socket.clone().unwrap_or_else(|| PathBuf::from(defaults::KUBELET_SOCKET));
    if socket.as_os_str().is_empty() {
        return Err(AssemblyError::invalid("attribution.kubelet_socket", "empty path"));
    }
    if processes {
        // A typo here would silently attribute nothing: refuse it. (The default /proc and
        // /etc/passwd are not checked: without them attribution degrades, counted and logged.)
        if let Some(root) = &file.proc_root {
            if !root.is_dir() {
                return Err(AssemblyError::invalid(
                    "attribution.proc_root",
                    format!("{} is not a directory", root.display()),
                ));
            }
        }
        if let Some(passwd) = &file.passwd_file {
            if !passwd.is_file() {
                return Err(AssemblyError::invalid(
                    "attribution.passwd_file",
                    format!("{} is not a readable file", passwd.display()),
                ));
            }
        }
    }
    if !processes && !kubelet {
        return Ok(AttributionPlan { processes, config: None, kubelet: None });
    }
    let stats = Arc::new(AttributionStats::default());
    let mut config = AttributionConfig::new()
        .with_proc_root(file.proc_root.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_PROC_ROOT)))
        .with_passwd_file(file.passwd_file.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_PASSWD_FILE)))
        .with_stats(stats.clone());
    let kubelet = if kubelet {
        let cache = AllocationCache::new();
        config = config.with_allocations(cache.clone());
        Some(KubeletService { socket, refresh, cache, stats, running: None })
    } else {
        None
    };
    Ok(AttributionPlan { processes, config: Some(config), kubelet })
}

impl AttributionPlan {
    /// The families to sample: process attribution needs the processes family. Refused when
    /// that family was switched off explicitly (`disabled`): which should win is not obvious.
    pub(super) fn metrics(&self, metrics: MetricSet, disabled: bool) -> Result<MetricSet, AssemblyError> {
        if !self.processes {
            return Ok(metrics);
        }
        if disabled {
            return Err(AssemblyError::invalid(
                "attribution.enabled",
                "needs the `processes` family, which agent.disable / --disable turns off",
            ));
        }
        Ok(metrics.with(Family::Processes))
    }

    /// Adds the attribution stage. Add it before the stages that read owners.
    pub(super) fn install(&mut self, mut builder: AgentBuilder) -> AgentBuilder {
        if let Some(config) = self.config.take() {
            builder = builder.processor(config.build());
        }
        builder
    }
}

/// The kubelet refresher (`attribution.kubelet`): asks the kubelet's pod-resources API which
/// pod holds each GPU every `attribution.kubelet_refresh`, off the sampling path, for the
/// attribution stage the assembly added (docs/kubernetes.md). Failures are counted in
/// `gpumon_attribution_failures_total{source}`, never fatal.
#[derive(Debug)]
pub struct KubeletService {
    socket: PathBuf,
    refresh: Duration,
    cache: AllocationCache,
    stats: Arc<AttributionStats>,
    #[cfg(feature = "kubelet")]
    running: Option<gpumon_core::attribution::kubelet::KubeletRefresher>,
    #[cfg(not(feature = "kubelet"))]
    running: Option<std::convert::Infallible>,
}

impl KubeletService {
    /// The kubelet's pod-resources socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// How often the kubelet is asked.
    pub fn refresh(&self) -> Duration {
        self.refresh
    }

    /// Starts the refresher on the current tokio runtime. Does nothing when already running.
    ///
    /// ## Errors
    ///
    /// [`ServiceError::Kubelet`] in a build without the `kubelet` feature (which
    /// [`super::Assembly::build`] refuses before).
    ///
    /// ## Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(&mut self) -> Result<(), ServiceError> {
        if self.running.is_some() {
            return Ok(());
        }
        tracing::info!(socket = %self.socket.display(), refresh = ?self.refresh, "asking the kubelet for GPU allocations");
        #[cfg(feature = "kubelet")]
        {
            use gpumon_core::attribution::kubelet::{spawn_refresher, KubeletConfig};
            let config = KubeletConfig::new(self.socket.clone()).with_refresh(self.refresh);
            self.running = Some(spawn_refresher(config, self.cache.clone(), self.stats.clone()));
            Ok(())
        }
        #[cfg(not(feature = "kubelet"))]
        {
            let _ = (&self.cache, &self.stats);
            Err(ServiceError::Kubelet(format!("this build has no kubelet client to ask {}", self.socket.display())))
        }
    }

    /// Whether the refresher runs.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Stops the refresher.
    pub async fn stop(&mut self) {
        self.running = None;
    }
}

// --- the services as the stages' background work --------------------------------------------------

#[async_trait::async_trait]
impl Service for StepsSocket {
    fn name(&self) -> &str {
        "steps-socket"
    }

    fn start(&mut self) -> Result<(), CoreServiceError> {
        StepsSocket::start(self).map_err(|e| CoreServiceError::new(ServiceError::from(e)))
    }

    async fn stop(&mut self) {
        StepsSocket::stop(self).await;
    }

    fn is_running(&self) -> bool {
        self.is_serving()
    }

    /// Marks that arrived since the last tick are reported by the next sample.
    fn reports_at_the_next_tick(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl Service for KubeletService {
    fn name(&self) -> &str {
        "kubelet-refresher"
    }

    fn start(&mut self) -> Result<(), CoreServiceError> {
        KubeletService::start(self).map_err(CoreServiceError::new)
    }

    async fn stop(&mut self) {
        KubeletService::stop(self).await;
    }

    fn is_running(&self) -> bool {
        KubeletService::is_running(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[diagnose]` resolved at `interval`, with the window it gives there.
    fn diagnose_at(file: &DiagnoseSection, interval: Duration) -> Result<DiagnosePlan, AssemblyError> {
        diagnose(file, interval, diagnosis_window(file, interval), None)
    }

    fn section<T: serde::de::DeserializeOwned>(text: &str) -> T {
        toml::from_str(text).unwrap()
    }

    // --- diagnosis

    #[test]
    fn thresholds_from_the_table() {
        let s: DiagnoseSection = section("[thresholds]\nstarvation_dip = 0.2\nstarvation_peak = 0.7\nidle_level = 0\n");
        let plan = diagnose_at(&s, Duration::from_secs(1)).unwrap();
        let want = Thresholds::default();
        assert_eq!(plan.thresholds.starvation_dip, 0.2);
        assert_eq!(plan.thresholds.starvation_peak, 0.7);
        assert_eq!(plan.thresholds.idle_level, 0.0);
        assert_eq!(plan.thresholds.imbalance_busy, want.imbalance_busy);
    }

    /// The default window spans five ticks of a long interval: `--interval 1m30s` alone was
    /// refused for a window (30 s) the user never set, and three ticks drew the agent's own
    /// warning that starvation needs five. A window the user set is kept, and still checked
    /// against the interval.
    #[test]
    fn the_default_window_spans_enough_ticks_for_every_rule() {
        let window =
            |s: &DiagnoseSection, secs| diagnose_at(s, Duration::from_secs(secs)).map(|p| p.config.unwrap().window);
        let default = DiagnoseSection::default();
        assert_eq!(window(&default, 1).unwrap(), DEFAULT_WINDOW);
        assert_eq!(window(&default, 90).unwrap(), Duration::from_secs(450));
        // No window limitation at any interval with the default window.
        for secs in [1, 5, 7, 10, 15, 60, 90] {
            let interval = Duration::from_secs(secs);
            let config = diagnose_at(&default, interval).unwrap().config.unwrap();
            let sampling = Sampling::new(interval, gpumon_core::MetricSet::everything());
            let found = limitations(&config, &sampling);
            assert!(found.iter().all(|l| !l.reason.contains("window holds")), "{secs} s: {found:#?}");
        }
        let set: DiagnoseSection = section("window = \"30s\"\n");
        assert_eq!(window(&set, 10).unwrap(), Duration::from_secs(30));
        assert!(window(&set, 90).unwrap_err().to_string().contains("diagnose.window"));
    }

    /// The commented-out `# [header]` block of the example config file, uncommented.
    fn example_block(header: &str) -> String {
        let text = include_str!("../../examples/agent/gpumon.example.toml");
        let start = text.find(&format!("# {header}")).unwrap_or_else(|| panic!("a {header} block"));
        text[start..]
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches('#').trim()))
            .collect()
    }

    /// The commented `[diagnose.thresholds]` block of the example file parses, names every
    /// threshold, and shows the defaults.
    #[test]
    fn the_example_file_lists_every_threshold_with_its_default() {
        let file: toml::Table = toml::from_str(&example_block("[diagnose.thresholds]")).unwrap();
        let table = file["diagnose"]["thresholds"].as_table().unwrap();
        assert_eq!(table.len(), Thresholds::NAMES.len());
        assert_eq!(thresholds(table).unwrap(), Thresholds::default());
    }

    #[test]
    fn bad_diagnosis_settings_name_their_key() {
        let interval = Duration::from_secs(1);
        let cases = [
            ("[thresholds]\nstarvation_dipp = 0.1\n", "diagnose.thresholds.starvation_dipp"),
            ("[thresholds]\nidle_level = 1.5\n", "diagnose.thresholds.idle_level"),
            ("[thresholds]\nidle_level = \"low\"\n", "diagnose.thresholds.idle_level"),
            ("[thresholds]\nnear_oom_clear = 0.99\n", "diagnose.thresholds.near_oom_clear"),
            ("disable = [\"imbalanse\"]\n", "diagnose.disable"),
            ("window = \"500ms\"\n", "diagnose.window"),
        ];
        for (text, key) in cases {
            let e = diagnose_at(&section(text), interval).unwrap_err();
            assert_eq!(e.key(), Some(key), "{e}");
            assert!(e.to_string().starts_with(&format!("{key}: ")), "{e}");
        }
        let e = diagnose_at(&section("disable = [\"imbalanse\"]\n"), interval).unwrap_err().to_string();
        assert!(e.starts_with("diagnose.disable: unknown rule `imbalanse`"), "{e}");
    }

    #[test]
    fn diagnosis_is_on_by_default_and_off_by_the_file() {
        assert!(diagnose_at(&DiagnoseSection::default(), Duration::from_secs(1)).unwrap().is_on());
        let off = diagnose_at(&section("enabled = false\n"), Duration::from_secs(1)).unwrap();
        assert!(!off.is_on());
        let plan = diagnose_at(&section("window = \"5s\"\n"), Duration::from_secs(1)).unwrap();
        assert_eq!(plan.diagnoser.unwrap().config().window, Duration::from_secs(5));
    }

    // --- steps

    #[test]
    fn steps_are_off_without_a_socket_unless_marked_in_process() {
        let plan = steps(&section("every_n = 5"), false).unwrap();
        assert!(plan.tracker.is_none() && plan.socket.is_none());
        let plan = steps(&section("every_n = 5"), true).unwrap();
        assert!(plan.tracker.is_some() && plan.socket.is_none());
    }

    #[test]
    fn the_socket_mode_is_octal() {
        let plan = steps(&section("socket = \"/tmp/file.sock\"\nmode = \"0600\"\nmax_connections = 3"), false).unwrap();
        let socket = plan.socket.unwrap();
        assert_eq!(socket.path(), Path::new("/tmp/file.sock"));
        assert_eq!(socket.config().mode, 0o600);
        assert_eq!(socket.config().max_connections, 3);
        let plan = steps(
            &section("socket = \"/tmp/s\"\nmax_connections_per_uid = 2\nmax_runs_per_uid = 5\nidle_timeout = \"90s\""),
            false,
        )
        .unwrap();
        let config = plan.socket.unwrap().config().clone();
        assert_eq!((config.max_connections_per_uid, config.max_runs_per_uid), (2, 5));
        assert_eq!(config.idle_timeout, Duration::from_secs(90));
        assert!(!socket.is_serving());
        assert!(plan.tracker.is_some());
    }

    #[test]
    fn bad_steps_settings_name_their_key() {
        for (text, key) in [
            ("socket = \"/tmp/s\"\nevery_n = 0", "steps.every_n"),
            ("socket = \"/tmp/s\"\nmode = \"rw\"", "steps.mode"),
            ("socket = \"/tmp/s\"\nmode = \"1777\"", "steps.mode"),
            ("socket = \"/tmp/s\"\nmax_connections = 0", "steps.max_connections"),
            ("socket = \"/tmp/s\"\nmax_connections_per_uid = 0", "steps.max_connections_per_uid"),
            ("socket = \"/tmp/s\"\nmax_runs_per_uid = 0", "steps.max_runs_per_uid"),
            ("socket = \"/tmp/s\"\nidle_timeout = \"0s\"", "steps.idle_timeout"),
            ("socket = \"\"", "steps.socket"),
        ] {
            let e = steps(&section(text), true).unwrap_err();
            assert_eq!(e.key(), Some(key), "{text}: {e}");
        }
        assert!(toml::from_str::<StepsSection>("sockett = \"/x\"").is_err());
    }

    // --- attribution

    #[test]
    fn attribution_is_off_by_default_and_needs_the_processes_family() {
        let plan = attribution(&section("")).unwrap();
        assert!(plan.config.is_none());
        assert_eq!(plan.metrics(MetricSet::default(), false).unwrap(), MetricSet::default());

        let plan = attribution(&section("enabled = true")).unwrap();
        assert!(plan.config.is_some() && plan.kubelet.is_none());
        assert!(plan.metrics(MetricSet::default(), false).unwrap().contains(Family::Processes));
        let e = plan.metrics(MetricSet::default(), true).unwrap_err();
        assert_eq!(e.key(), Some("attribution.enabled"));
        assert!(e.to_string().contains("processes"), "{e}");
    }

    #[test]
    fn bad_attribution_paths_name_their_key() {
        let dir = std::env::temp_dir();
        let ok = format!("enabled = true\nproc_root = {:?}", dir.display().to_string());
        assert!(attribution(&section(&ok)).is_ok());
        for (text, key) in [
            ("enabled = true\nproc_root = \"/nonexistent/proc\"", "attribution.proc_root"),
            ("enabled = true\npasswd_file = \"/nonexistent/passwd\"", "attribution.passwd_file"),
            ("kubelet_refresh = \"100ms\"", "attribution.kubelet_refresh"),
            ("kubelet_socket = \"\"", "attribution.kubelet_socket"),
        ] {
            let e = attribution(&section(text)).unwrap_err();
            assert_eq!(e.key(), Some(key), "{text}: {e}");
        }
        let e = toml::from_str::<AttributionSection>("kubelet_sockett = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("kubelet_sockett"), "{e}");
        let e = toml::from_str::<AttributionSection>("kubelet_refresh = \"soon\"").unwrap_err().to_string();
        assert!(e.contains("soon"), "{e}");
    }

    /// The commented `[attribution]` block of the example file parses and shows the defaults.
    #[test]
    fn the_example_file_shows_every_attribution_key_with_its_default() {
        #[derive(Deserialize)]
        struct FileAttribution {
            attribution: AttributionSection,
        }
        let file: FileAttribution = toml::from_str(&example_block("[attribution]")).unwrap();
        let s = file.attribution;
        assert_eq!(s.enabled, Some(false));
        assert_eq!(s.proc_root.as_deref(), Some(Path::new(DEFAULT_PROC_ROOT)));
        assert_eq!(s.passwd_file.as_deref(), Some(Path::new(DEFAULT_PASSWD_FILE)));
        assert_eq!(s.kubelet, Some(false));
        assert_eq!(s.kubelet_socket.as_deref(), Some(Path::new(defaults::KUBELET_SOCKET)));
        assert_eq!(s.kubelet_refresh, Some(defaults::KUBELET_REFRESH));
    }

    #[test]
    fn kubelet_without_the_client_is_a_clear_error() {
        if KUBELET_IN_BUILD {
            let plan = attribution(&section("kubelet = true\nkubelet_refresh = \"30s\"")).unwrap();
            let kubelet = plan.kubelet.as_ref().unwrap();
            assert_eq!(kubelet.refresh(), Duration::from_secs(30));
            assert_eq!(kubelet.socket(), Path::new(defaults::KUBELET_SOCKET));
            assert!(!kubelet.is_running());
            assert!(!plan.processes, "pods alone do not need the processes family");
        } else {
            let e = attribution(&section("kubelet = true")).unwrap_err();
            assert_eq!(e.key(), Some("attribution.kubelet"));
            assert!(e.to_string().contains("feature"), "{e}");
        }
    }
}

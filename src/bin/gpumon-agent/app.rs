//! The agent's command line, settings and main loop (shared by the `gpumon-agent` binary and
//! the example agent).
//!
//! Exit codes: 0 success, 1 runtime failure (sampling or a sink failed in `--once`, shutdown
//! incomplete, the requested backend unavailable), 2 bad configuration or flags.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gpumon::core::diagnose::Sampling;
use gpumon::core::trace::{ReplaySampler, ReplaySpeed};
use gpumon::core::{Agent, AgentError, DeviceFilter, Family, MetricSet, SinkOptions};

use gpumon::assembly::backend::Backend;
use gpumon::assembly::config::{self, AgentConfig};
use gpumon::assembly::defaults;

use crate::backend;
use crate::sinks;

/// Watch NVIDIA GPUs: sample every GPU through NVML (or the mock backend) and export the samples to
/// stdout, Prometheus, a Pushgateway, InfluxDB or an OpenTelemetry collector.
///
/// Flags override the config file. Stdout is the sink when no other sink (and no --report) is
/// configured. Diagnosis is on by default (docs/diagnosis.md).
#[derive(Debug, Parser)]
#[command(name = "gpumon-agent", version, about, long_about = None)]
pub struct Cli {
    /// TOML config file (see examples/agent/gpumon.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    #[arg(long, value_name = "N")]
    pub mock_seed: Option<u64>,
    /// Explicit path of libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,
    /// Read runtime-suspended GPUs anyway (wakes them; default: report them suspended, leave
    /// them asleep).
    #[arg(long)]
    pub wake_suspended: bool,
    /// Sampling interval (e.g. 1s, 500ms, 1m 30s; at least 100ms).
    #[arg(long, value_parser = gpumon::sinks::duration::parse_duration, value_name = "DURATION")]
    pub interval: Option<Duration>,
    /// Longest one sample may take.
    #[arg(long, value_parser = gpumon::sinks::duration::parse_duration, value_name = "DURATION")]
    pub sample_timeout: Option<Duration>,
    /// Visible GPUs, CUDA_VISIBLE_DEVICES syntax (0,1 / GPU-uuid / 0:1 / all / none). Default: the
    /// CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES environment variable, else all.
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Turn on metric families, comma-separated (e.g. processes,pcie_throughput).
    #[arg(long, value_delimiter = ',', value_name = "FAMILIES")]
    pub enable: Vec<String>,
    /// Turn off metric families, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "FAMILIES")]
    pub disable: Vec<String>,
    /// Sample exactly these metric families, comma-separated, whatever the defaults are
    /// (e.g. utilization,memory,temperature,power). Not with --enable/--disable.
    #[arg(long, value_delimiter = ',', value_name = "FAMILIES", conflicts_with_all = ["enable", "disable"])]
    pub only: Option<Vec<String>>,
    /// Take one sample, export it, flush every sink, exit.
    #[arg(long)]
    pub once: bool,
    /// Stdout format.
    #[arg(long, value_name = "human|json")]
    pub stdout_format: Option<gpumon::sinks::stdout::StdoutFormat>,
    /// Also print to stdout when other sinks are configured.
    #[arg(long)]
    pub stdout: bool,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR")]
    pub prometheus_listen: Option<String>,
    /// Prometheus metric names: native (gpumon_*) or dcgm (dcgm-exporter's DCGM_FI_*).
    #[arg(long, value_name = "native|dcgm")]
    pub prometheus_naming: Option<String>,
    /// Push to this Prometheus Pushgateway URL every interval.
    #[arg(long, value_name = "URL")]
    pub pushgateway_url: Option<String>,
    /// Pushgateway job label.
    #[arg(long, value_name = "JOB")]
    pub pushgateway_job: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// Pushgateway (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub pushgateway_ca_file: Option<PathBuf>,
    /// Write to InfluxDB at this URL (v1 with --influx-db, v2 with --influx-org/--influx-bucket).
    #[arg(long, value_name = "URL")]
    pub influx_url: Option<String>,
    /// InfluxDB 1.x database.
    #[arg(long, value_name = "DB")]
    pub influx_db: Option<String>,
    /// InfluxDB 1.x user.
    #[arg(long, value_name = "USER")]
    pub influx_user: Option<String>,
    /// InfluxDB 1.x password (or GPUMON_INFLUX_PASSWORD).
    #[arg(long, env = "GPUMON_INFLUX_PASSWORD", hide_env_values = true, value_name = "PASSWORD")]
    pub influx_password: Option<String>,
    /// InfluxDB 2.x organisation.
    #[arg(long, value_name = "ORG")]
    pub influx_org: Option<String>,
    /// InfluxDB 2.x bucket.
    #[arg(long, value_name = "BUCKET")]
    pub influx_bucket: Option<String>,
    /// InfluxDB 2.x token (or GPUMON_INFLUX_TOKEN).
    #[arg(long, env = "GPUMON_INFLUX_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub influx_token: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// InfluxDB (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub influx_ca_file: Option<PathBuf>,
    /// Prometheus remote write to this URL (e.g. http://127.0.0.1:9090/api/v1/write; Mimir
    /// …/api/v1/push, VictoriaMetrics …/api/v1/write).
    #[arg(long, value_name = "URL")]
    pub remote_write_url: Option<String>,
    /// Remote-write metric and label names (default native).
    #[arg(long, value_name = "native|dcgm")]
    pub remote_write_naming: Option<String>,
    /// Remote-write bearer token (or GPUMON_REMOTE_WRITE_TOKEN).
    #[arg(long, env = "GPUMON_REMOTE_WRITE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub remote_write_token: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// remote-write URL (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub remote_write_ca_file: Option<PathBuf>,
    /// Export OTLP to this endpoint (e.g. http://127.0.0.1:4318).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport.
    #[arg(long, value_name = "grpc|http")]
    pub otlp_protocol: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// OTLP endpoint (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub otlp_ca_file: Option<PathBuf>,
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
    pub diagnose: crate::diagnose::DiagnoseArgs,
    /// The live web view (web.rs).
    #[command(flatten)]
    pub web: crate::web::WebArgs,
    /// Training steps from other processes: --steps-socket (steps.rs).
    #[command(flatten)]
    pub steps: crate::steps::StepsArgs,
    /// Who uses which GPU: --attribution, --proc-root, --passwd-file (attribution.rs).
    #[command(flatten)]
    pub attribution: crate::attribution::AttributionArgs,
}

/// A configuration problem: reported with the key and reason, exit code 2.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl<T: std::fmt::Display> From<T> for ConfigError {
    fn from(e: T) -> Self {
        ConfigError(e.to_string())
    }
}

/// Everything the agent needs, resolved from file + flags.
struct Settings {
    backend: Backend,
    interval: Duration,
    sample_timeout: Option<Duration>,
    devices: DeviceFilter,
    metrics: MetricSet,
    sink_options: SinkOptions,
    shutdown_timeout: Duration,
    once: bool,
    /// The host name override (`--host`, GPUMON_HOST, NODE_NAME), if any.
    host: Option<String>,
    /// Diagnosis, --duration and the run report.
    diagnose: crate::diagnose::Plan,
    /// The steps socket and tracker.
    steps: crate::steps::Plan,
    /// The attribution stage and the kubelet refresher.
    attribution: crate::attribution::Plan,
    /// `--backend replay`: the trace, opened, and how fast to play it.
    replay: Option<Replay>,
}

/// A trace to play back.
struct Replay {
    sampler: ReplaySampler,
    speed: ReplaySpeed,
}

/// The backend, and the trace when it is `replay`. A trace given (`--replay`, `replay.file`)
/// without a backend means `replay`; with another backend it is refused, since which one was
/// meant is not obvious.
fn resolve_replay(cli: &Cli, file: &AgentConfig) -> Result<(Backend, Option<Replay>), ConfigError> {
    let trace = cli.replay.clone().or_else(|| file.replay.file.clone());
    let backend = match (cli.backend.or(file.agent.backend), &trace) {
        (None | Some(Backend::Replay), Some(_)) => Backend::Replay,
        (Some(Backend::Replay), None) => {
            return Err(ConfigError("--backend replay: needs the trace to play (--replay FILE or replay.file)".into()))
        }
        (Some(other), Some(_)) => {
            return Err(ConfigError(format!(
                "--replay / replay.file: a trace is played with --backend replay, not {}",
                format!("{other:?}").to_lowercase()
            )))
        }
        (backend, None) => backend.unwrap_or_default(),
    };
    let Some(path) = trace else { return Ok((backend, None)) };
    let speed = match (cli.replay_speed, &file.replay.speed) {
        (Some(speed), _) => speed,
        (None, Some(toml::Value::String(text))) => {
            text.parse().map_err(|e| ConfigError(format!("replay.speed: {e}")))?
        }
        (None, Some(toml::Value::Integer(n))) => {
            (*n as f64).to_string().parse().map_err(|e| ConfigError(format!("replay.speed: {e}")))?
        }
        (None, Some(toml::Value::Float(f))) => {
            f.to_string().parse().map_err(|e| ConfigError(format!("replay.speed: {e}")))?
        }
        (None, Some(other)) => {
            return Err(ConfigError(format!("replay.speed: expected \"max\" or a number, got {other}")));
        }
        (None, None) => ReplaySpeed::default(),
    };
    let sampler = ReplaySampler::open(&path).map_err(|e| ConfigError(format!("--replay / replay.file: {e}")))?;
    Ok((backend, Some(Replay { sampler, speed })))
}

/// `--host` / GPUMON_HOST, else NODE_NAME; blank values count as unset.
fn host_override(cli: &Cli) -> Option<String> {
    let node_name = || std::env::var("NODE_NAME").ok();
    cli.host
        .clone()
        .filter(|h| !h.trim().is_empty())
        .or_else(node_name)
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

fn parse_families(names: &[String], key: &str) -> Result<Vec<Family>, ConfigError> {
    names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| {
            Family::from_name(n).ok_or_else(|| {
                let known: Vec<_> = Family::ALL.iter().map(|f| f.name()).collect();
                ConfigError(format!("{key}: unknown metric family `{n}` (known: {})", known.join(", ")))
            })
        })
        .collect()
}

/// The families to sample. `--only` (or `agent.only`) is the exact set; flags override the file,
/// so `--only` ignores the file's `enable`/`disable`, while `--enable`/`--disable` refine the
/// file's `only`. `only` with `enable`/`disable` from the same source is refused (which would win
/// is not obvious).
fn resolve_metrics(cli: &Cli, a: &config::AgentSection) -> Result<MetricSet, ConfigError> {
    let exact = |names: &[String], key: &str| -> Result<MetricSet, ConfigError> {
        let families = parse_families(names, key)?;
        if families.is_empty() {
            return Err(ConfigError(format!("{key}: names no metric family")));
        }
        Ok(families.into_iter().fold(MetricSet::nothing(), MetricSet::with))
    };
    if let Some(only) = &cli.only {
        return exact(only, "--only");
    }
    let mut metrics = match &a.only {
        Some(_) if !a.enable.is_empty() || !a.disable.is_empty() => {
            return Err(ConfigError("agent.only: cannot be combined with agent.enable or agent.disable".into()));
        }
        Some(only) => exact(only, "agent.only")?,
        None => MetricSet::default(),
    };
    for f in parse_families(&a.enable, "agent.enable")?.into_iter().chain(parse_families(&cli.enable, "--enable")?) {
        metrics = metrics.with(f);
    }
    for f in parse_families(&a.disable, "agent.disable")?.into_iter().chain(parse_families(&cli.disable, "--disable")?)
    {
        metrics = metrics.without(f);
    }
    Ok(metrics)
}

fn resolve(cli: &Cli, file: &AgentConfig) -> Result<Settings, ConfigError> {
    let a = &file.agent;
    let (backend, replay) = resolve_replay(cli, file)?;
    let mut interval = cli.interval.or(a.interval).unwrap_or(gpumon::core::DEFAULT_INTERVAL);
    // A replay runs at the recorded interval: the diagnosis windows and the report count ticks
    // of it, and a window of other ticks would not give the recorded findings.
    if let Some(recorded) = replay.as_ref().and_then(|r| r.sampler.header().interval) {
        if cli.interval.or(a.interval).is_some_and(|i| i != recorded) {
            tracing::warn!(?recorded, "replay: --interval / agent.interval ignored; the trace's interval is used");
        }
        interval = recorded;
    }
    if interval < gpumon::core::MIN_INTERVAL {
        return Err(ConfigError(format!(
            "agent.interval / --interval: {interval:?} is below the minimum of {:?}",
            gpumon::core::MIN_INTERVAL
        )));
    }
    let devices = match cli.devices.as_ref().or(a.devices.as_ref()) {
        Some(list) => DeviceFilter::parse(list).map_err(|e| ConfigError(format!("agent.devices / --devices: {e}")))?,
        None => DeviceFilter::from_env().map_err(|e| ConfigError(format!("environment: {e}")))?,
    };
    let attribution = crate::attribution::resolve(&cli.attribution, &file.attribution)?;
    let processes_disabled = a.disable.iter().chain(&cli.disable).any(|n| n.trim() == Family::Processes.name());
    let metrics = attribution.metrics(resolve_metrics(cli, a)?, processes_disabled)?;
    let mut sink_options = SinkOptions::default();
    if let Some(q) = a.sink_queue {
        if q == 0 {
            return Err(ConfigError("agent.sink_queue: must be at least 1".into()));
        }
        sink_options = sink_options.capacity(q);
    }
    if let Some(t) = a.export_timeout {
        sink_options = sink_options.export_timeout(t);
    }
    Ok(Settings {
        backend,
        interval,
        sample_timeout: cli.sample_timeout.or(a.sample_timeout),
        devices,
        metrics,
        sink_options,
        shutdown_timeout: file.shutdown_timeout(),
        once: cli.once,
        host: host_override(cli),
        diagnose: crate::diagnose::resolve(&cli.diagnose, &file.diagnose, interval)?,
        steps: crate::steps::resolve(&cli.steps, &file.steps)?,
        attribution,
        replay,
    })
}

/// The flags that set a config key, set onto the config (flags win over the file). The rest
/// are read beside it (`--once`, `--host`, the report), or still merged where they are read.
fn flags_onto_config(cli: &Cli, file: &mut AgentConfig) {
    fn set<T: Clone>(flag: &Option<T>, key: &mut Option<T>) {
        if flag.is_some() {
            key.clone_from(flag);
        }
    }
    set(&cli.backend, &mut file.agent.backend);
    set(&cli.interval, &mut file.agent.interval);
    set(&cli.sample_timeout, &mut file.agent.sample_timeout);
    set(&cli.devices, &mut file.agent.devices);
    set(&cli.mock_profile, &mut file.mock.profile);
    set(&cli.mock_scenario, &mut file.mock.scenario);
    set(&cli.mock_seed, &mut file.mock.seed);
    set(&cli.nvml_library, &mut file.nvml.library);
    if cli.wake_suspended {
        file.nvml.wake_suspended = Some(true);
    }
    set(&cli.record, &mut file.record.file);
    set(&cli.replay, &mut file.replay.file);
    set(&cli.stdout_format, &mut file.stdout.format);
}

/// Parses the command line, runs the agent, and returns the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    let mut file = match &cli.config {
        Some(path) => match config::load(path) {
            Ok(f) => f,
            Err(e) => return config_failure(&e),
        },
        None => AgentConfig::default(),
    };
    flags_onto_config(&cli, &mut file);
    let settings = match resolve(&cli, &file) {
        Ok(s) => s,
        Err(e) => return config_failure(&e.0),
    };
    // One thread runs the agent's control loop, every sink and the HTTP servers: they only hand
    // snapshots on and wait for I/O, so a second worker would only add cross-thread wake-ups per
    // tick. What can block (the driver's calls) runs on the agent's own sampling thread, under
    // its watchdog; the blocking pool serves what sinks hand it (a stdout pipe, the OTLP SDK).
    let runtime =
        match tokio::runtime::Builder::new_current_thread().thread_name("gpumon-blocking").enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("gpumon: cannot start the tokio runtime: {e}");
                return ExitCode::from(1);
            }
        };
    let code = runtime.block_on(run(cli, file, settings));
    // Dropping a runtime waits, without limit, for blocking tasks — such as a write to a stdout
    // pipe nobody reads. The agent has already flushed and shut down its sinks within its
    // deadline; don't let a stuck thread keep the process alive after that. (A sample stuck in
    // the driver is on the agent's own thread, which never holds the process.)
    runtime.shutdown_timeout(Duration::from_millis(500));
    code
}

fn config_failure(message: &str) -> ExitCode {
    eprintln!("gpumon: configuration error: {message}");
    ExitCode::from(2)
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("gpumon: invalid --log filter `{filter}` ({e}); using `info`");
        tracing_subscriber::EnvFilter::new("info")
    });
    // Logs go to stderr so that stdout carries only data (JSON lines stay parseable).
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

async fn run(cli: Cli, file: AgentConfig, mut settings: Settings) -> ExitCode {
    let mark = match settings.backend {
        Backend::Mock => Some("mock"),
        Backend::Replay => Some(gpumon::core::REPLAY_BACKEND),
        Backend::Auto | Backend::Nvml => None,
    };
    let marks = sinks::Marks { backend: mark, host: settings.host.as_deref() };
    let sinks = match sinks::build(&cli, &file, marks).await {
        Ok(s) => s,
        Err(e) => return config_failure(&e.0),
    };
    // Any sink but stdout (and the recording, a local file whose header names the backend)
    // sends the data out of this process, where simulated values could be taken for real ones.
    let exporting = sinks.iter().any(|s| s.name() != sinks::STDOUT && s.name() != sinks::RECORD);
    let watch_xid = settings.metrics.contains(Family::Xid);
    let replay = settings.replay.take();
    if let Some(replay) = replay {
        return run_replay(cli, settings, sinks, replay).await;
    }
    let sampler = match backend::select(settings.backend, exporting, watch_xid, &file) {
        Ok(s) => s,
        Err(backend::BackendError::Config(e)) => return config_failure(&e),
        Err(backend::BackendError::Unavailable(e)) => {
            eprintln!("gpumon: {e}");
            return ExitCode::from(1);
        }
    };
    let mut builder = Agent::builder_arc(sampler)
        .interval(settings.interval)
        .metrics(settings.metrics)
        .devices(settings.devices)
        .scheduled(!settings.once);
    if let Some(t) = settings.sample_timeout {
        builder = builder.sample_timeout(t);
    }
    if let Some(host) = &settings.host {
        builder = builder.hostname(host.clone());
    }
    for sink in sinks {
        builder = builder.boxed_sink(sink, settings.sink_options);
    }
    // Attribution first, then the step tracker before diagnosis: processors run in order.
    builder = settings.attribution.install(builder);
    builder = settings.steps.install(builder);
    let step_marks = cli.steps.steps_socket.is_some() || file.steps.socket.is_some();
    let sampling = Sampling::new(settings.interval, settings.metrics).step_marks(step_marks);
    settings.diagnose.say_limitations(&sampling);
    builder = settings.diagnose.install(builder, sampling);
    let handle = match builder.spawn() {
        Ok(h) => h,
        Err(e) => return config_failure(&e.to_string()),
    };
    if let Err(e) = settings.steps.start() {
        eprintln!("gpumon: {e}");
        let _ = handle.shutdown(settings.shutdown_timeout).await;
        return ExitCode::from(1);
    }
    if let Err(e) = settings.attribution.start() {
        eprintln!("gpumon: {e}");
        settings.steps.stop().await;
        let _ = handle.shutdown(settings.shutdown_timeout).await;
        return ExitCode::from(1);
    }

    if settings.once {
        let flushed = handle.flush(settings.shutdown_timeout.max(defaults::ONCE_FLUSH_TIMEOUT)).await;
        settings.steps.stop().await;
        settings.attribution.stop().await;
        let shut = handle.shutdown(settings.shutdown_timeout).await;
        settings.diagnose.print_report();
        return match (flushed, shut) {
            (Ok(()), Ok(())) => ExitCode::SUCCESS,
            (Err(e), _) | (Ok(()), Err(e)) => {
                eprintln!("gpumon: {e}");
                ExitCode::from(1)
            }
        };
    }

    tracing::info!(interval = ?settings.interval, "agent running; Ctrl-C or SIGTERM to stop");
    settings.diagnose.run_until(wait_for_signal()).await;
    tracing::info!("shutting down");
    let steps_on = settings.steps.is_serving();
    settings.steps.stop().await;
    settings.attribution.stop().await;
    // Marks read from the socket since the last tick would be lost at exit: one last sample
    // reports them (and the sinks flush it), within the same shutdown timeout as the rest.
    let until = tokio::time::Instant::now() + settings.shutdown_timeout;
    if steps_on {
        if let Err(e) = handle.flush(settings.shutdown_timeout).await {
            tracing::warn!(error = %e, "final report of the marked steps incomplete");
        }
    }
    let shut = handle.shutdown(until.saturating_duration_since(tokio::time::Instant::now())).await;
    settings.diagnose.print_report();
    match shut {
        Ok(()) | Err(AgentError::ShutDown) => {
            let stats = handle.stats();
            tracing::info!(samples = stats.samples_taken, failures = stats.sample_failures, "stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpumon: shutdown incomplete: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--backend replay`: the trace through the same stages (diagnosis, the report) and sinks,
/// every snapshot handed to every sink before the next (`ReplayProgress::play`), until the
/// trace ends, a signal, or `--duration`. The step tracker and attribution are not run: they
/// read this host now, and the trace carries the recorded steps and owners.
async fn run_replay(
    cli: Cli,
    mut settings: Settings,
    sinks: Vec<Box<dyn gpumon::core::Sink>>,
    replay: Replay,
) -> ExitCode {
    if cli.steps.steps_socket.is_some() || cli.attribution.attribution {
        tracing::warn!(
            "replay: --steps-socket and --attribution are ignored; the trace carries the recorded steps and owners"
        );
    }
    let header = replay.sampler.header();
    tracing::info!(
        recorded_by = %header.gpumon_version,
        backend = %header.backend,
        host = %header.system.hostname,
        gpus = header.devices.len(),
        interval = ?settings.interval,
        speed = %replay.speed,
        "replaying a trace"
    );
    let recorded_gpus = header.devices.iter().filter(|d| settings.devices.allows(d)).count();
    let progress = replay.sampler.progress();
    let mut builder = Agent::builder(replay.sampler)
        .interval(settings.interval)
        .metrics(settings.metrics)
        .devices(settings.devices)
        // Each snapshot is handed out by `play`, never by the clock.
        .scheduled(false);
    if let Some(t) = settings.sample_timeout {
        builder = builder.sample_timeout(t);
    }
    if let Some(host) = &settings.host {
        builder = builder.hostname(host.clone());
    }
    for sink in sinks {
        builder = builder.boxed_sink(sink, settings.sink_options);
    }
    let sampling = Sampling::new(settings.interval, settings.metrics).devices(recorded_gpus);
    settings.diagnose.say_limitations(&sampling);
    builder = settings.diagnose.install(builder, sampling);
    let handle = match builder.spawn() {
        Ok(h) => h,
        Err(e) => return config_failure(&e.to_string()),
    };
    let flush_deadline = settings.sink_options.export_timeout;
    let speed = if settings.once { ReplaySpeed::Max } else { replay.speed };
    let play = async {
        if settings.once {
            // One snapshot, as `--once` takes one sample.
            return match handle.flush(flush_deadline).await {
                Ok(()) | Err(AgentError::Sample(_)) => progress.error().map_or(Ok(1), Err),
                Err(e) => {
                    eprintln!("gpumon: {e}");
                    Ok(1)
                }
            };
        }
        progress.play(&handle, speed, flush_deadline).await
    };
    let outcome = tokio::select! {
        outcome = play => Some(outcome),
        () = settings.diagnose.run_until(wait_for_signal()) => None,
    };
    let shut = handle.shutdown(settings.shutdown_timeout).await;
    settings.diagnose.print_report();
    let mut code = ExitCode::SUCCESS;
    match outcome {
        Some(Ok(played)) => tracing::info!(snapshots = played, "replay finished"),
        Some(Err(e)) => {
            eprintln!("gpumon: replay stopped at a bad trace: {e}");
            code = ExitCode::from(1);
        }
        None => tracing::info!(snapshots = progress.played(), "replay interrupted"),
    }
    if let Err(e) = shut {
        eprintln!("gpumon: shutdown incomplete: {e}");
        code = ExitCode::from(1);
    }
    code
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

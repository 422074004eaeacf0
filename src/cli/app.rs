//! The agent's command line and main loop (shared by the `gpumon-agent` binary, the example
//! agent and the Python package's console scripts): the flags are set onto the config ([`flags_onto_config`]), the library builds the
//! agent from it (`crate::assembly::Assembly`), and this file runs it — `--once`, `--duration`,
//! signals, the report printed at exit.
//!
//! Exit codes: 0 success, 1 runtime failure (sampling or a sink failed in `--once`, shutdown
//! incomplete, the requested backend unavailable), 2 bad configuration or flags.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::assembly::backend::{Backend, MockFactory};
use crate::assembly::config::{self, AgentConfig};
use crate::assembly::{defaults, parse_families, Assembled, Assembly, AssemblyOptions, Families, Replay};
use crate::core::trace::ReplaySpeed;
use crate::core::{AgentError, Severity};
use clap::Parser;

/// Watch NVIDIA GPUs: sample every GPU through NVML (or the mock backend) and export the samples to
/// stdout, Prometheus, a Pushgateway, InfluxDB or an OpenTelemetry collector.
///
/// Flags override the config file. Stdout is the sink when no other sink (and no --report) is
/// configured. Diagnosis is on by default (docs/diagnosis.md).
///
/// Also: `gpumon-agent run [FLAGS] -- CMD ARGS…` runs a command under the agent and prints its
/// run report at exit (docs/run.md); `gpumon-agent compare BEFORE.json AFTER.json` says what
/// changed between two runs' reports.
#[derive(Debug, Parser)]
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
    pub stdout_format: Option<crate::sinks::stdout::StdoutFormat>,
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
    pub diagnose: crate::cli::diagnose::DiagnoseArgs,
    /// The live web view (web.rs).
    #[command(flatten)]
    pub web: crate::cli::web::WebArgs,
    /// Training steps from other processes: --steps-socket (steps.rs).
    #[command(flatten)]
    pub steps: crate::cli::steps::StepsArgs,
    /// Who uses which GPU: --attribution, --proc-root, --passwd-file (attribution.rs).
    #[command(flatten)]
    pub attribution: crate::cli::attribution::AttributionArgs,
}

/// A configuration problem: reported with the key and reason, exit code 2.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl<T: std::fmt::Display> From<T> for ConfigError {
    fn from(e: T) -> Self {
        ConfigError(e.to_string())
    }
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

/// `--only`, `--enable`, `--disable`: the families chosen beside the config. Flags override the
/// file, so `--only` ignores the file's `enable`/`disable`, while `--enable`/`--disable` refine
/// the file's `only` (the library's [`Families`]).
fn families(cli: &Cli) -> Result<Families, ConfigError> {
    let mut families = match &cli.only {
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
        .with_enabled(parse_families(&cli.enable, "--enable")?)
        .with_disabled(parse_families(&cli.disable, "--disable")?);
    Ok(families)
}

/// What a run is, beside the config: `--host`, `--once`, `--report`, the families' flags, and
/// this build's mock (`mock`).
pub fn options(cli: &Cli, mock: Option<MockFactory>) -> Result<AssemblyOptions, ConfigError> {
    if cli.diagnose.duration.is_some_and(|d| d.is_zero()) {
        return Err(ConfigError("--duration: must be greater than zero".into()));
    }
    let mut options = AssemblyOptions::default()
        .with_once(cli.once)
        .with_report(cli.diagnose.report_requested())
        .with_families(families(cli)?)
        .with_mock(mock);
    if let Some(host) = host_override(cli) {
        options = options.with_host(host);
    }
    Ok(options)
}

/// The flags that set a config key, set onto the config (flags win over the file). The rest are
/// what a run is ([`options`]): `--once`, `--host`, `--report`, `--duration`, the families.
///
/// ## Errors
///
/// A flag whose value does not parse (`--prometheus-listen`, `--otlp-protocol`, …).
pub fn flags_onto_config(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
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
    // Flags that would be silently ignored are refused (the sinks' own: `sinks::onto_config`).
    if cli.replay_speed.is_some() && file.replay.file.is_none() {
        return Err(ConfigError("--replay-speed: no trace to play (--replay FILE or [replay] file)".into()));
    }
    let kubelet = cli.attribution.kubelet || file.attribution.kubelet == Some(true);
    if cli.attribution.kubelet_socket.is_some() && !kubelet && std::env::var_os("GPUMON_KUBELET_SOCKET").is_none() {
        return Err(ConfigError(
            "--kubelet-socket: the kubelet is not asked (--kubelet or attribution.kubelet)".into(),
        ));
    }
    if let Some(speed) = cli.replay_speed {
        file.replay.speed = Some(toml::Value::String(speed.to_string()));
    }
    set(&cli.stdout_format, &mut file.stdout.format);
    crate::cli::diagnose::onto_config(&cli.diagnose, &mut file.diagnose);
    crate::cli::steps::onto_config(&cli.steps, &mut file.steps);
    crate::cli::attribution::onto_config(&cli.attribution, &mut file.attribution);
    crate::cli::sinks::onto_config(cli, file)
}

/// Parses the command line (`args` with the program name first, as `std::env::args_os`), runs
/// the agent, `run` or `compare`, and returns the exit code.
pub fn main(args: Vec<OsString>, mock: Option<MockFactory>) -> u8 {
    let mut args = args.into_iter();
    let program = args.next().unwrap_or_else(|| OsString::from("gpumon-agent"));
    let rest: Vec<OsString> = args.collect();
    match rest.first().and_then(|a| a.to_str()) {
        Some("run") => return crate::cli::run::main(rest[1..].to_vec(), mock),
        Some("compare") => return crate::cli::compare::main(rest[1..].to_vec()),
        #[cfg(feature = "fleet")]
        Some("fleet") => return crate::cli::fleet::main(rest[1..].to_vec()),
        _ => {}
    }
    let cli = match parse::<Cli>(std::iter::once(program).chain(rest)) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Err(e) = init_logging(&cli.log) {
        return config_failure(&e.0);
    }
    let mut file = match &cli.config {
        Some(path) => match config::load(path) {
            Ok(f) => f,
            Err(e) => return config_failure(&e),
        },
        None => AgentConfig::default(),
    };
    let options = match flags_onto_config(&cli, &mut file).and_then(|()| options(&cli, mock)) {
        Ok(options) => options,
        Err(e) => return config_failure(&e.0),
    };
    on_the_agent_runtime(run(cli, file, options))
}

/// Parses a command line as clap's `parse_from` does — help, version and errors printed the same
/// way, with the same exit code — but returns that code instead of exiting the process, which
/// is the Python interpreter's when the agent runs from the Python package.
pub fn parse<P: Parser>(args: impl IntoIterator<Item = OsString>) -> Result<P, u8> {
    P::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        u8::try_from(e.exit_code()).unwrap_or(2)
    })
}

/// Runs `main_loop` on the agent's runtime and returns its exit code.
///
/// One thread runs the agent's control loop, every sink and the HTTP servers: they only hand
/// snapshots on and wait for I/O, so a second worker would only add cross-thread wake-ups per
/// tick. What can block (the driver's calls) runs on the agent's own sampling thread, under its
/// watchdog; the blocking pool serves what sinks hand it (a stdout pipe, the OTLP SDK).
pub fn on_the_agent_runtime(main_loop: impl std::future::Future<Output = u8>) -> u8 {
    let runtime =
        match tokio::runtime::Builder::new_current_thread().thread_name("gpumon-blocking").enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("gpumon: cannot start the tokio runtime: {e}");
                return 1;
            }
        };
    let code = runtime.block_on(main_loop);
    // Dropping a runtime waits, without limit, for blocking tasks — such as a write to a stdout
    // pipe nobody reads. The agent has already flushed and shut down its sinks within its
    // deadline; don't let a stuck thread keep the process alive after that. (A sample stuck in
    // the driver is on the agent's own thread, which never holds the process.)
    runtime.shutdown_timeout(Duration::from_millis(500));
    code
}

/// Writes `text` to stdout, flushed. Unlike `print!`, it does not panic when stdout is a pipe
/// whose reader went away (`| head -1`): that ends the printing quietly (`false`); another
/// error is said on stderr.
pub fn print_stdout(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
        Err(e) => {
            eprintln!("gpumon: cannot write to stdout: {e}");
            false
        }
    }
}

pub fn config_failure(message: &str) -> u8 {
    eprintln!("gpumon: configuration error: {message}");
    2
}

/// Installs the log subscriber at `filter` (`--log` / `GPUMON_LOG`).
///
/// ## Errors
///
/// A filter that does not parse: the agent refuses it rather than log at a level not asked for.
pub fn init_logging(filter: &str) -> Result<(), ConfigError> {
    let filter = tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map_err(|e| ConfigError(format!("--log / GPUMON_LOG: `{filter}` is not a log filter ({e})")))?;
    // Logs go to stderr so that stdout carries only data (JSON lines stay parseable).
    use std::io::IsTerminal;
    // From the Python package, a `gpumon.Monitor` may have installed the process's subscriber
    // already: the agent's logs then go through that one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
    Ok(())
}

async fn run(cli: Cli, file: AgentConfig, options: AssemblyOptions) -> u8 {
    let once = options.once;
    let mut assembled = match Assembly::build(&file, options) {
        Ok(assembled) => assembled,
        Err(e) => return crate::cli::backend::failure(&e, &cli),
    };
    if let Some(web) = assembled.listeners.web {
        tracing::info!("web view on {}", web.url());
    }
    if let Some(source) = &assembled.source {
        crate::cli::backend::say(source, &file);
    }
    for l in &assembled.limitations {
        match l.severity {
            Severity::Info => tracing::info!("diagnosis limitation: {l}"),
            _ => tracing::warn!("diagnosis limitation: {l}"),
        }
    }
    if let Some(replay) = assembled.replay.take() {
        return run_replay(cli, assembled, replay, once).await;
    }
    let Assembled { builder, mut services, report, interval, shutdown_timeout, .. } = assembled;
    let handle = match spawn_with_services(builder, &mut services, shutdown_timeout).await {
        Ok(h) => h,
        Err(code) => return code,
    };

    if once {
        let flushed = handle.flush(shutdown_timeout.max(defaults::ONCE_FLUSH_TIMEOUT)).await;
        services.stop().await;
        let shut = handle.shutdown(shutdown_timeout).await;
        crate::cli::diagnose::print_report(&cli.diagnose, report.as_ref(), None);
        return match (flushed, shut) {
            (Ok(()), Ok(())) => 0,
            (Err(e), _) | (Ok(()), Err(e)) => {
                eprintln!("gpumon: {e}");
                1
            }
        };
    }

    tracing::info!(interval = ?interval, "agent running; Ctrl-C or SIGTERM to stop");
    crate::cli::diagnose::run_until(cli.diagnose.duration, wait_for_signal()).await;
    tracing::info!("shutting down");
    let steps_on = services.report_at_the_next_tick();
    services.stop().await;
    // Marks read from the socket since the last tick would be lost at exit: one last sample
    // reports them (and the sinks flush it), within the same shutdown timeout as the rest.
    let until = tokio::time::Instant::now() + shutdown_timeout;
    if steps_on {
        if let Err(e) = handle.flush(shutdown_timeout).await {
            tracing::warn!(error = %e, "final report of the marked steps incomplete");
        }
    }
    let shut = handle.shutdown(until.saturating_duration_since(tokio::time::Instant::now())).await;
    crate::cli::diagnose::print_report(&cli.diagnose, report.as_ref(), None);
    match shut {
        Ok(()) | Err(AgentError::ShutDown) => {
            let stats = handle.stats();
            tracing::info!(samples = stats.samples_taken, failures = stats.sample_failures, "stopped");
            0
        }
        Err(e) => {
            eprintln!("gpumon: shutdown incomplete: {e}");
            1
        }
    }
}

/// Spawns the assembled agent and starts its stages' services (the steps socket, the kubelet
/// refresher); when a service cannot start, stops what started and says why. The exit code on
/// failure: 2 for an agent that cannot be built or a steps socket that cannot be bound
/// (configuration), 1 for another service.
pub async fn spawn_with_services(
    builder: crate::core::AgentBuilder,
    services: &mut crate::assembly::Services,
    shutdown_timeout: Duration,
) -> Result<crate::core::AgentHandle, u8> {
    let handle = builder.spawn().map_err(|e| config_failure(&e.to_string()))?;
    if let Err(e) = services.start() {
        // A steps socket that cannot be bound is a path to choose again: a configuration error.
        let code = match e.0.downcast_ref::<crate::assembly::ServiceError>() {
            Some(crate::assembly::ServiceError::StepsSocket(e)) => {
                config_failure(&format!("--steps-socket / steps.socket: {e}"))
            }
            _ => {
                eprintln!("gpumon: {e}");
                1
            }
        };
        services.stop().await;
        let _ = handle.shutdown(shutdown_timeout).await;
        return Err(code);
    }
    Ok(handle)
}

/// `--backend replay`: the trace through the same stages (diagnosis, the report) and sinks,
/// every snapshot handed to every sink before the next (`ReplayProgress::play`), until the
/// trace ends, a signal, or `--duration`. The step tracker and attribution are not run: they
/// read this host now, and the trace carries the recorded steps and owners.
async fn run_replay(cli: Cli, assembled: Assembled, replay: Replay, once: bool) -> u8 {
    if cli.steps.steps_socket.is_some() || cli.attribution.attribution {
        tracing::warn!(
            "replay: --steps-socket and --attribution are ignored; the trace carries the recorded steps and owners"
        );
    }
    let Assembled { builder, report, interval, sink_options, shutdown_timeout, .. } = assembled;
    let header = &replay.header;
    let recorded_backend = header.backend.clone();
    tracing::info!(
        recorded_by = %header.gpumon_version,
        backend = %header.backend,
        host = %header.system.hostname,
        gpus = header.devices.len(),
        interval = ?interval,
        speed = %replay.speed,
        "replaying a trace"
    );
    let progress = replay.progress;
    let handle = match builder.spawn() {
        Ok(h) => h,
        Err(e) => return config_failure(&e.to_string()),
    };
    let flush_deadline = sink_options.export_timeout;
    let speed = if once { ReplaySpeed::Max } else { replay.speed };
    let play = async {
        if once {
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
        () = crate::cli::diagnose::run_until(cli.diagnose.duration, wait_for_signal()) => None,
    };
    let shut = handle.shutdown(shutdown_timeout).await;
    crate::cli::diagnose::print_report(&cli.diagnose, report.as_ref(), Some(&recorded_backend));
    let mut code = 0;
    match outcome {
        Some(Ok(played)) => tracing::info!(snapshots = played, "replay finished"),
        Some(Err(e)) => {
            eprintln!("gpumon: replay stopped at a bad trace: {e}");
            code = 1;
        }
        None => tracing::info!(snapshots = progress.played(), "replay interrupted"),
    }
    if let Err(e) = shut {
        eprintln!("gpumon: shutdown incomplete: {e}");
        code = 1;
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

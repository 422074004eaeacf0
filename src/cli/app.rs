//! The agent's main loop (shared by the `gpumon-agent` binary, the example agent and the Python
//! package's console scripts), and the dispatch to the other commands: the flags
//! (`crate::cli::flags::Cli`) are set onto the config, the library builds the agent from it
//! (`crate::assembly::Assembly`), and this file runs it — `--once`, `--duration`, signals, the
//! report printed at exit.
//!
//! Exit codes: 0 success, 1 runtime failure (sampling or a sink failed in `--once`, shutdown
//! incomplete, the requested backend unavailable), 2 bad configuration or flags.

use std::ffi::OsString;

use crate::assembly::backend::MockFactory;
use crate::assembly::config::{self, AgentConfig};
use crate::assembly::{defaults, Assembled, Assembly, AssemblyOptions, Plan, Replay};
use crate::core::trace::ReplaySpeed;
use crate::core::{AgentError, Severity};

use crate::cli::common::{config_failure, init_logging, on_the_agent_runtime, parse, spawn_with_services};
use crate::cli::flags::Cli;

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
    let options = match cli.onto_config(&mut file).and_then(|()| cli.options(mock)) {
        Ok(options) => options,
        Err(e) => return config_failure(&e.0),
    };
    on_the_agent_runtime(run(cli, file, options))
}

async fn run(cli: Cli, file: AgentConfig, options: AssemblyOptions) -> u8 {
    let once = options.once;
    let mut assembled = match Assembly::build(&file, options) {
        Ok(assembled) => assembled,
        Err(e) => return crate::cli::backend::failure(&e, cli.diagnose.diagnose_window.is_some()),
    };
    if let Some(web) = assembled.listeners.web {
        tracing::info!("web view on {}", web.url());
    }
    if let Some(source) = &assembled.source {
        crate::cli::backend::say(source, &assembled.plan);
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
    let Assembled { builder, mut services, report, plan, .. } = assembled;
    let Plan { interval, shutdown_timeout, .. } = plan;
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
    let Assembled { builder, report, plan, .. } = assembled;
    let Plan { interval, sink_options, shutdown_timeout, .. } = plan;
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

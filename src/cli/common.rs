//! What every command of the command line shares, apart from any of them: the configuration
//! error and its exit code, parsing without exiting the process, logging, the agent's runtime,
//! starting the agent with its services, and writing to stdout. It imports no other file of
//! `cli`, so that the commands and the flag groups can all use it without an import circle.

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;

/// A configuration problem: reported with the key and reason, exit code 2.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl<T: std::fmt::Display> From<T> for ConfigError {
    fn from(e: T) -> Self {
        ConfigError(e.to_string())
    }
}

/// Says `message` as a configuration error and returns its exit code, 2.
pub fn config_failure(message: &str) -> u8 {
    eprintln!("gpumon: configuration error: {message}");
    2
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

/// A section configured by a flag in a build without its sink: present, so that the library
/// names the missing feature.
#[allow(dead_code)]
pub fn configured(section: &mut Option<toml::Value>, by_flag: bool) {
    if by_flag && section.is_none() {
        *section = Some(toml::Value::Table(toml::Table::new()));
    }
}

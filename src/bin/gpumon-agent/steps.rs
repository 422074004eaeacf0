//! Training steps from other processes: the flag `--steps-socket` and the `[steps]` section.
//!
//! ```toml
//! [steps]
//! socket = "/run/gpumon/steps.sock"   # --steps-socket; off when unset
//! every_n = 1                         # report every N-th step (default 1)
//! mode = "0660"                       # the socket file's permissions, octal (default 0660)
//! max_connections = 64                # clients served at once
//! ```
//! A training process writes one JSON line per step, `{"job":"train","rank":0,"step":42}`, to
//! the socket (protocol: [`gpumon::core::steps::socket`]); the agent derives per-step GPU
//! figures (`gpumon_training_step`, `gpumon_step_*`, InfluxDB `gpu_step`, a stdout `STEP` line)
//! and counts what it drops in `gpumon_steps_rejected_total{reason}`. The socket file is
//! removed at shutdown; a stale one left by a killed agent is replaced.

use std::path::PathBuf;

use gpumon::assembly::config::StepsSection;
use gpumon::assembly::defaults;
use gpumon::core::steps::socket::{SocketConfig, StepSocket};
use gpumon::core::steps::{StepConfig, StepRegistry, StepTracker};
use gpumon::core::AgentBuilder;

use crate::app::ConfigError;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct StepsArgs {
    /// Accept training-step marks on this Unix socket (one JSON line per step:
    /// {"job":"train","rank":0,"step":42}); mode 0660 unless [steps] mode says otherwise.
    #[arg(long, value_name = "PATH")]
    pub steps_socket: Option<PathBuf>,
}

/// The steps settings resolved from the file and the flags, then the running socket.
#[derive(Debug)]
pub struct Plan {
    tracker: Option<StepTracker>,
    registry: Option<StepRegistry>,
    socket: Option<SocketConfig>,
    running: Option<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

/// Resolves `[steps]` and `--steps-socket`; every error names the key.
pub fn resolve(args: &StepsArgs, file: &StepsSection) -> Result<Plan, ConfigError> {
    let every_n = file.every_n.unwrap_or(defaults::STEPS_EVERY_N);
    let config = StepConfig::every_n(every_n);
    if every_n == 0 {
        return Err(ConfigError("steps.every_n: must be at least 1".into()));
    }
    let mode = match &file.mode {
        Some(text) => {
            let digits = text.trim().trim_start_matches("0o");
            match u32::from_str_radix(digits, 8) {
                Ok(m) if m <= 0o777 => m,
                _ => {
                    return Err(ConfigError(format!(
                        "steps.mode: `{text}` is not an octal permission mode such as \"0660\""
                    )))
                }
            }
        }
        None => defaults::STEPS_SOCKET_MODE,
    };
    if file.max_connections == Some(0) {
        return Err(ConfigError("steps.max_connections: must be at least 1".into()));
    }
    let Some(path) = args.steps_socket.clone().or_else(|| file.socket.clone()) else {
        return Ok(Plan { tracker: None, registry: None, socket: None, running: None });
    };
    if path.as_os_str().is_empty() {
        return Err(ConfigError("--steps-socket / steps.socket: empty path".into()));
    }
    let mut socket = SocketConfig::new(path);
    socket.mode = mode;
    if let Some(n) = file.max_connections {
        socket.max_connections = n;
    }
    let (tracker, registry) = StepTracker::new(config).map_err(|e| ConfigError(format!("steps: {e}")))?;
    Ok(Plan { tracker: Some(tracker), registry: Some(registry), socket: Some(socket), running: None })
}

impl Plan {
    /// Adds the step tracker. Call it before the diagnosis stage is added: processors run in
    /// order, so diagnosis then sees each tick's steps.
    pub fn install(&mut self, mut builder: AgentBuilder) -> AgentBuilder {
        if let Some(tracker) = self.tracker.take() {
            builder = builder.processor(tracker);
        }
        builder
    }

    /// Binds the socket and starts serving it (inside the runtime).
    pub fn start(&mut self) -> Result<(), String> {
        let (Some(config), Some(registry)) = (self.socket.take(), self.registry.clone()) else { return Ok(()) };
        let socket = StepSocket::bind(config, registry).map_err(|e| e.to_string())?;
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

    /// Stops the socket and removes its file.
    pub async fn stop(&mut self) {
        if let Some((tx, task)) = self.running.take() {
            let _ = tx.send(());
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> StepsSection {
        toml::from_str(text).unwrap()
    }

    fn no_flag() -> StepsArgs {
        StepsArgs { steps_socket: None }
    }

    #[test]
    fn off_without_a_socket() {
        let plan = resolve(&no_flag(), &section("every_n = 5")).unwrap();
        assert!(plan.tracker.is_none() && plan.socket.is_none());
    }

    #[test]
    fn flag_overrides_the_file_and_mode_is_octal() {
        let args = StepsArgs { steps_socket: Some("/tmp/flag.sock".into()) };
        let plan =
            resolve(&args, &section("socket = \"/tmp/file.sock\"\nmode = \"0600\"\nmax_connections = 3")).unwrap();
        let socket = plan.socket.unwrap();
        assert_eq!(socket.path, PathBuf::from("/tmp/flag.sock"));
        assert_eq!(socket.mode, 0o600);
        assert_eq!(socket.max_connections, 3);
        assert!(plan.tracker.is_some());
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("socket = \"/tmp/s\"\nevery_n = 0", "steps.every_n"),
            ("socket = \"/tmp/s\"\nmode = \"rw\"", "steps.mode"),
            ("socket = \"/tmp/s\"\nmode = \"1777\"", "steps.mode"),
            ("socket = \"/tmp/s\"\nmax_connections = 0", "steps.max_connections"),
            ("socket = \"\"", "steps.socket"),
        ] {
            let e = resolve(&no_flag(), &section(text)).unwrap_err();
            assert!(e.0.contains(key), "{text}: {}", e.0);
        }
        assert!(toml::from_str::<StepsSection>("sockett = \"/x\"").is_err());
    }
}

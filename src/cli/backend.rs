//! The library's outcome in the agent's words (`crate::assembly`): what the backend rule chose
//! (NVML, the mock, or — `auto` — NVML, falling back to the mock only where simulated data cannot
//! be mistaken for real data), and why an agent could not be assembled, naming the flag beside
//! the key it sets. On the terminal; exit code 2 for a bad setting, 1 for a backend that cannot
//! run here.

use crate::assembly::backend::{BackendError, MockError, Source};
use crate::assembly::{AssemblyError, Plan};

use crate::cli::common::config_failure;

/// Says why the agent could not be assembled, and returns the exit code. `window_flag`: whether
/// `--diagnose-window` was given (an error of `diagnose.window` then names the flag first).
pub fn failure(e: &AssemblyError, window_flag: bool) -> u8 {
    let unavailable = |message: &str| {
        eprintln!("gpumon: {message}");
        1
    };
    match e {
        AssemblyError::Backend(e) => match e {
            BackendError::Mock(MockError::Profile { name, reason }) => {
                config_failure(&format!("mock.profile / --mock-profile `{name}`: {reason}"))
            }
            BackendError::Mock(MockError::Scenario { name, reason }) => {
                config_failure(&format!("mock.scenario / --mock-scenario `{name}`: {reason}"))
            }
            BackendError::Mock(e) => config_failure(&e.to_string()),
            BackendError::NoTrace => {
                config_failure("--backend replay: needs the trace to play (--replay FILE or replay.file)")
            }
            BackendError::Nvml(reason) => unavailable(reason),
            BackendError::NoMock => unavailable(
                "the mock backend is not in this build of gpumon-agent (build with `--features mock`, or use `cargo run --example agent`)",
            ),
            BackendError::NoMockFallback { reason } => unavailable(&format!(
                "NVML unavailable ({reason}), and the mock fallback is not in this build (build with `--features mock`, or use `cargo run --example agent`)"
            )),
        },
        AssemblyError::TraceWithBackend { backend } => config_failure(&format!(
            "--replay / replay.file: a trace is played with --backend replay, not {}",
            format!("{backend:?}").to_lowercase()
        )),
        AssemblyError::FeatureMissing { what, feature, .. } => config_failure(&format!(
            "{what} is configured, but this agent was built without the `{feature}` feature (cargo run --example agent --features {feature})"
        )),
        other => config_failure(&with_flags(other, window_flag)),
    }
}

/// The error's message with the flag that sets its key named beside it
/// (`attribution.proc_root / --proc-root: …`).
fn with_flags(e: &AssemblyError, window_flag: bool) -> String {
    let message = e.to_string();
    let Some(key) = e.key() else { return message };
    // A credential from the environment is easily forgotten: say where it came from.
    let in_section = |section: &str| key == section || key.strip_prefix(section).is_some_and(|k| k.starts_with('.'));
    let notes: Vec<String> = crate::cli::sinks::from_env()
        .filter(|(section, var, _)| in_section(section) && std::env::var_os(var).is_some())
        .map(|(_, var, flag)| format!("{flag} is set from {var}"))
        .collect();
    let message = if notes.is_empty() { message } else { format!("{message} ({})", notes.join("; ")) };
    let alias = match key {
        "agent.interval" => "agent.interval / --interval",
        "agent.devices" => "agent.devices / --devices",
        "diagnose.window" if window_flag => "--diagnose-window / diagnose.window",
        "steps.socket" => "--steps-socket / steps.socket",
        "attribution.enabled" => "attribution.enabled / --attribution",
        "attribution.kubelet" => "attribution.kubelet / --kubelet",
        "attribution.kubelet_socket" => "attribution.kubelet_socket / --kubelet-socket",
        "attribution.proc_root" => "attribution.proc_root / --proc-root",
        "attribution.passwd_file" => "attribution.passwd_file / --passwd-file",
        "record.file" => "--record / record.file",
        "replay.file" => "--replay / replay.file",
        _ => return message,
    };
    match message.strip_prefix(key) {
        Some(rest) => format!("{alias}{rest}"),
        None => message,
    }
}

/// Says what the backend rule chose, when it was not what was asked for: on stderr, so that
/// stdout stays data-only.
pub fn say(source: &Source, plan: &Plan) {
    match source {
        Source::LazyNvml { reason } => tracing::warn!(
            "NVML unavailable ({reason}); exporting no GPU data (gpumon_up 0) and retrying NVML with backoff — simulated data is exported only with --backend mock"
        ),
        // One clear line.
        Source::MockFallback { reason } => eprintln!(
            "gpumon: NVML unavailable ({reason}); running on the MOCK backend with profile `{}` — values are simulated, not read from a GPU (only stdout shows them; exporting sinks never get simulated data unless --backend mock)",
            plan.mock.profile
        ),
        _ => {}
    }
}

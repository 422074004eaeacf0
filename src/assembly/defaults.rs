//! Every default of the agent, written once: the `gpumon-agent` binary and gpumon-py's `Monitor`
//! read them here. (The sampling interval, the diagnosis window and the sinks' own settings are
//! their crates' defaults: [`gpumon_core::DEFAULT_INTERVAL`],
//! [`gpumon_core::diagnose::DEFAULT_WINDOW`], each sink config's `Default`.)

use std::time::Duration;

/// The mock fleet when none is configured.
pub const MOCK_PROFILE: &str = "h100x8";
/// How long the agent's shutdown may take (`agent.shutdown_timeout`).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// How `--once` waits for its one sample to be exported at least (the shutdown timeout when it
/// is longer).
pub const ONCE_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// The stdout sink's format (`stdout.format`).
pub const STDOUT_FORMAT: gpumon_sinks::stdout::StdoutFormat = gpumon_sinks::stdout::StdoutFormat::Human;
/// Whether diagnosis runs (`diagnose.enabled`).
pub const DIAGNOSE: bool = true;
/// Report every N-th training step (`steps.every_n`).
pub const STEPS_EVERY_N: u64 = 1;
/// The steps socket file's permissions (`steps.mode`).
pub const STEPS_SOCKET_MODE: u32 = 0o660;
/// Whether GPU processes are attributed to containers, pods and users (`attribution.enabled`).
pub const ATTRIBUTION: bool = false;
/// Whether the kubelet is asked which pod holds each GPU (`attribution.kubelet`).
pub const KUBELET: bool = false;
/// The kubelet's pod-resources socket, where the kubelet puts it (`attribution.kubelet_socket`).
pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// How often the kubelet is asked for its allocations (`attribution.kubelet_refresh`).
pub const KUBELET_REFRESH: Duration = Duration::from_secs(10);

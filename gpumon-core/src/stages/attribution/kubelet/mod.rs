//! GPU → pod: which pod and container each GPU (and MIG device) is allocated to, from the
//! kubelet's pod-resources API (feature `kubelet`).
//!
//! The kubelet serves the pod-resources v1 gRPC API on a Unix socket,
//! [`DEFAULT_SOCKET`] unless configured otherwise; the agent reads it through the host
//! directory `/var/lib/kubelet/pod-resources` mounted into its pod. [`list_allocations`] calls
//! its `List` once and keeps, from every container, the devices of an NVIDIA GPU resource
//! ([`DEFAULT_RESOURCE_NAMES`], plus any configured names), keyed by the device plugin's device
//! ids — the GPU or MIG UUIDs, with time-slicing replica suffixes (`GPU-…::3`) folded onto the
//! GPU by [`Allocations::insert`]. dcgm-exporter reads the same call the same way.
//!
//! [`spawn_refresher`] runs that call on its own schedule in a tokio task and stores the result
//! in an [`AllocationCache`], which the attribution processor only reads: the sampling path
//! never waits on the kubelet. A failed refresh (socket missing, kubelet down, slow, refusing)
//! is counted in [`AttributionStats::kubelet_failures`] and keeps the previous allocations until
//! [`KubeletConfig::clear_after_failures`] refreshes in a row have failed; see
//! [`spawn_refresher`].
//!
//! # What is not mapped
//! - Devices from Dynamic Resource Allocation claims (`dynamic_resources`): their ids are DRA
//!   device names (`gpu-0`), not UUIDs. They are ignored for now.
//! - Device ids that are not UUIDs are stored as they come: with the NVIDIA device plugin's
//!   `deviceIDStrategy: index` (`0`, `1`, `0:1` for a MIG instance) the attribution stage falls
//!   back to matching a device's NVML index (and MIG index) when its UUID has no allocation;
//!   the default `uuid` strategy needs no fallback.
//!
//! # Example
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use gpumon_core::attribution::kubelet::{spawn_refresher, KubeletConfig};
//! use gpumon_core::attribution::{AllocationCache, AttributionStats};
//!
//! let config = KubeletConfig::default()
//!     .with_refresh(Duration::from_secs(10))
//!     .with_resource_name("nvidia.com/a100-shared");
//! let cache = AllocationCache::new();
//! let stats = Arc::new(AttributionStats::default());
//! let refresher = spawn_refresher(config, cache.clone(), stats.clone());
//! // Hand `cache` to the attribution processor; keep `refresher` alive as long as the agent.
//! if let Err(e) = refresher.refresh_now().await {
//!     eprintln!("no pod attribution yet: {e}");
//! }
//! for owner in cache.load().owners("GPU-8f2c0d5e-1b7a-4c2e-9d3f-0a1b2c3d4e5f") {
//!     println!("{:?}/{:?}", owner.namespace, owner.pod);
//! }
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

use super::{AllocationCache, Allocations, AttributionStats, Owner};
use crate::BoxError;

mod refresher;

pub use refresher::{spawn_refresher, KubeletRefresher};

/// The kubelet pod-resources v1 API, generated from `proto/podresources/v1/api.proto` (our
/// copy of the published API: same package, field numbers and types). The client is what
/// [`list_allocations`] uses; the server (feature `kubelet-server`) is what gpumon-mock's test
/// kubelet implements.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
}

/// Where the kubelet serves the pod-resources API (its directory is what a DaemonSet mounts).
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// How often [`spawn_refresher`] asks the kubelet, unless configured otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(10);

/// How long one call (connect and `List`) may take, unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest refresh interval [`spawn_refresher`] accepts; a shorter one is raised to it.
pub const MIN_REFRESH: Duration = Duration::from_millis(100);

/// The largest `List` reply accepted, unless configured otherwise: 16 MiB, the limit of the
/// kubelet's own Go client (a node with hundreds of pods and exclusive CPUs stays far below it;
/// tonic's default of 4 MiB is not always enough).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// After this many failed refreshes in a row the allocations are cleared, unless configured
/// otherwise (30 s at the default refresh interval).
pub const DEFAULT_CLEAR_AFTER_FAILURES: u32 = 3;

/// The extended resources of NVIDIA GPUs: whole GPUs, GPUs shared by time-slicing or MPS when
/// the device plugin renames them (`renameByDefault`), and MIG devices of every profile under
/// the `mixed` strategy (`nvidia.com/mig-1g.10gb`, `nvidia.com/mig-3g.40gb.shared`, …). A
/// trailing `*` matches any suffix.
pub const DEFAULT_RESOURCE_NAMES: [&str; 3] = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"];

/// Where and how often to ask the kubelet, and which resources are GPUs.
///
/// ```
/// use std::time::Duration;
/// use gpumon_core::attribution::kubelet::KubeletConfig;
///
/// let config = KubeletConfig::new("/host/kubelet/pod-resources/kubelet.sock")
///     .with_timeout(Duration::from_secs(1))
///     .with_resource_name("nvidia.com/gpu-*");
/// assert!(config.is_gpu_resource("nvidia.com/gpu"));
/// assert!(config.is_gpu_resource("nvidia.com/mig-1g.10gb"));
/// assert!(config.is_gpu_resource("nvidia.com/gpu-tesla"));
/// assert!(!config.is_gpu_resource("example.com/fpga"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KubeletConfig {
    /// The pod-resources socket ([`DEFAULT_SOCKET`]).
    pub socket: PathBuf,
    /// Interval between refreshes ([`DEFAULT_REFRESH`]; at least [`MIN_REFRESH`]).
    pub refresh: Duration,
    /// Limit on one call, connecting included ([`DEFAULT_TIMEOUT`]). A call past it fails with
    /// [`KubeletError::Timeout`].
    pub timeout: Duration,
    /// Extended resource names whose devices are GPUs: exact names, or prefixes ending in `*`
    /// ([`DEFAULT_RESOURCE_NAMES`]). Add the names a cluster's device plugin config gives its
    /// shared GPUs when they are not NVIDIA's defaults.
    pub resource_names: Vec<String>,
    /// Consecutive failed refreshes after which the allocations are cleared
    /// ([`DEFAULT_CLEAR_AFTER_FAILURES`]; 0 is taken as 1). See [`spawn_refresher`].
    pub clear_after_failures: u32,
    /// Largest `List` reply accepted, in bytes ([`DEFAULT_MAX_MESSAGE_BYTES`]).
    pub max_message_bytes: usize,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self::new(DEFAULT_SOCKET)
    }
}

impl KubeletConfig {
    /// The defaults, with the socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            refresh: DEFAULT_REFRESH,
            timeout: DEFAULT_TIMEOUT,
            resource_names: DEFAULT_RESOURCE_NAMES.iter().map(|&n| n.to_owned()).collect(),
            clear_after_failures: DEFAULT_CLEAR_AFTER_FAILURES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }

    /// Sets [`refresh`](Self::refresh).
    #[must_use]
    pub fn with_refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// Sets [`timeout`](Self::timeout).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds one GPU resource name (exact, or a prefix ending in `*`) to
    /// [`resource_names`](Self::resource_names).
    #[must_use]
    pub fn with_resource_name(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if !self.resource_names.contains(&name) {
            self.resource_names.push(name);
        }
        self
    }

    /// Sets [`clear_after_failures`](Self::clear_after_failures).
    #[must_use]
    pub fn with_clear_after_failures(mut self, failures: u32) -> Self {
        self.clear_after_failures = failures;
        self
    }

    /// Sets [`max_message_bytes`](Self::max_message_bytes).
    #[must_use]
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Whether devices of extended resource `name` are GPUs under this config.
    pub fn is_gpu_resource(&self, name: &str) -> bool {
        self.resource_names.iter().any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == pattern,
        })
    }
}

/// Why a call to the kubelet failed. Every message names the socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeletError {
    /// Nothing at the socket path: the kubelet is not running, or its
    /// `/var/lib/kubelet/pod-resources` directory is not mounted where the agent looks.
    #[error("kubelet pod-resources socket {} does not exist (is /var/lib/kubelet/pod-resources mounted into the agent?)", .socket.display())]
    SocketMissing {
        /// The configured socket.
        socket: PathBuf,
    },
    /// The socket exists but the connection failed: the kubelet is down (stale socket file) or
    /// the agent lacks permission on the socket.
    #[error("cannot connect to the kubelet pod-resources socket {}: {reason}", .socket.display())]
    Connect {
        /// The configured socket.
        socket: PathBuf,
        /// The innermost cause, e.g. `Connection refused (os error 111)`.
        reason: String,
        /// The full error.
        #[source]
        source: BoxError,
    },
    /// Connecting and `List` together took longer than [`KubeletConfig::timeout`].
    #[error("kubelet pod-resources call on {} timed out after {after:?}", .socket.display())]
    Timeout {
        /// The configured socket.
        socket: PathBuf,
        /// The configured timeout.
        after: Duration,
    },
    /// The kubelet answered `List` with an error status (or the reply could not be decoded).
    #[error("kubelet pod-resources List on {} failed: {code:?}: {message}", .socket.display())]
    Status {
        /// The configured socket.
        socket: PathBuf,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message and its causes.
        message: String,
    },
    /// [`KubeletRefresher::refresh_now`] found the refresher's task gone.
    #[error("the kubelet refresher for {} has stopped", .socket.display())]
    Stopped {
        /// The configured socket.
        socket: PathBuf,
    },
}

impl KubeletError {
    /// A short, stable name of the failure (`socket_missing`, `connect`, `timeout`, `status`,
    /// `stopped`), for logs and for telling one failure state from another.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SocketMissing { .. } => "socket_missing",
            Self::Connect { .. } => "connect",
            Self::Timeout { .. } => "timeout",
            Self::Status { .. } => "status",
            Self::Stopped { .. } => "stopped",
        }
    }
}

/// Calls the kubelet's pod-resources `List` once (a fresh connection, closed afterwards) and
/// maps every container's GPU devices to their [`Owner`] (namespace, pod, container).
///
/// # Errors
/// [`KubeletError::SocketMissing`], [`KubeletError::Connect`], [`KubeletError::Timeout`] (the
/// whole call, connecting included, is bounded by [`KubeletConfig::timeout`]) or
/// [`KubeletError::Status`].
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use gpumon_core::attribution::kubelet::{list_allocations, KubeletConfig};
///
/// let allocations = list_allocations(&KubeletConfig::default()).await?;
/// println!("{} GPUs are allocated to pods", allocations.len());
/// # Ok(()) }
/// ```
pub async fn list_allocations(config: &KubeletConfig) -> Result<Allocations, KubeletError> {
    let reply = tokio::time::timeout(config.timeout, list(config))
        .await
        .map_err(|_| KubeletError::Timeout { socket: config.socket.clone(), after: config.timeout })??;
    Ok(allocations_from(&reply, config))
}

/// One `List` call over a new connection. A connection per call (every 10 s by default) costs
/// a Unix-socket connect and an HTTP/2 handshake, and needs no reconnect logic: a kubelet that
/// restarted (and recreated its socket) is simply dialled afresh next time.
async fn list(config: &KubeletConfig) -> Result<proto::ListPodResourcesResponse, KubeletError> {
    let socket = config.socket.clone();
    let dial = socket.clone();
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            async move { UnixStream::connect(dial).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| connect_error(&socket, e))?;
    let mut client = proto::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .max_decoding_message_size(config.max_message_bytes);
    match client.list(proto::ListPodResourcesRequest {}).await {
        Ok(reply) => Ok(reply.into_inner()),
        Err(status) => {
            // The status's own Display repeats the code; keep its message and causes.
            let mut message = status.message().to_owned();
            if let Some(cause) = std::error::Error::source(&status) {
                message = format!("{message}: {}", crate::error_chain(cause));
            }
            Err(KubeletError::Status { socket, code: status.code(), message })
        }
    }
}

fn connect_error(socket: &Path, error: tonic::transport::Error) -> KubeletError {
    let io = std::iter::successors(Some(&error as &(dyn std::error::Error + 'static)), |e| e.source())
        .find_map(|e| e.downcast_ref::<std::io::Error>());
    if io.is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return KubeletError::SocketMissing { socket: socket.to_owned() };
    }
    // tonic's transport error displays as just "transport error"; the cause is underneath.
    let reason = io.map_or_else(|| crate::error_chain(&error), ToString::to_string);
    KubeletError::Connect { socket: socket.to_owned(), reason, source: Box::new(error) }
}

/// The GPU devices of every container in `reply`, by device id. One [`Owner`] per container,
/// shared by its devices; empty names stay unknown (`None`).
fn allocations_from(reply: &proto::ListPodResourcesResponse, config: &KubeletConfig) -> Allocations {
    fn known(name: &str) -> Option<String> {
        (!name.is_empty()).then(|| name.to_owned())
    }
    let mut allocations = Allocations::new();
    for pod in &reply.pod_resources {
        for container in &pod.containers {
            let mut owner = None;
            let ids = container
                .devices
                .iter()
                .filter(|d| config.is_gpu_resource(&d.resource_name))
                .flat_map(|d| &d.device_ids)
                .filter(|id| !id.is_empty());
            for id in ids {
                let owner = owner.get_or_insert_with(|| {
                    Arc::new(Owner {
                        namespace: known(&pod.namespace),
                        pod: known(&pod.name),
                        container: known(&container.name),
                        ..Owner::default()
                    })
                });
                allocations.insert(id, Arc::clone(owner));
            }
        }
    }
    allocations
}

/// Unit tests of the mapping; the client, the refresher and the test kubelet are tested
/// together in `tests/kubelet.rs`.
#[cfg(test)]
mod tests {
    use super::proto::{ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources};
    use super::*;

    fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
        ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|&i| i.into()).collect(),
            topology: None,
        }
    }

    fn pod(ns: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
        PodResources { name: name.into(), namespace: ns.into(), containers }
    }

    fn container(name: &str, devices: Vec<ContainerDevices>) -> ContainerResources {
        ContainerResources { name: name.into(), devices, ..ContainerResources::default() }
    }

    #[test]
    fn maps_gpu_and_mig_devices_per_container_and_ignores_other_resources() {
        let reply = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "team-a",
                    "train-0",
                    vec![
                        container("trainer", vec![devices("nvidia.com/gpu", &["GPU-a", "GPU-b"])]),
                        container("sidecar", vec![devices("example.com/nic", &["eth1"])]),
                    ],
                ),
                pod(
                    "team-b",
                    "infer-0",
                    vec![container(
                        "server",
                        vec![
                            devices("nvidia.com/mig-1g.10gb", &["MIG-c"]),
                            devices("intel.com/sriov", &["0000:3b:02.0"]),
                        ],
                    )],
                ),
            ],
        };
        let alloc = allocations_from(&reply, &KubeletConfig::default());
        assert_eq!(alloc.len(), 3, "{alloc:?}");
        let trainer = &alloc.owners("GPU-a")[0];
        assert_eq!(trainer.namespace.as_deref(), Some("team-a"));
        assert_eq!(trainer.pod.as_deref(), Some("train-0"));
        assert_eq!(trainer.container.as_deref(), Some("trainer"));
        assert!(Arc::ptr_eq(trainer, &alloc.owners("GPU-b")[0]), "one owner per container");
        assert_eq!(alloc.owners("MIG-c")[0].container.as_deref(), Some("server"));
        assert!(alloc.owners("eth1").is_empty());
        assert!(alloc.owners("0000:3b:02.0").is_empty());
    }

    #[test]
    fn empty_names_and_ids_stay_unknown() {
        let reply = ListPodResourcesResponse {
            pod_resources: vec![pod("", "p", vec![container("", vec![devices("nvidia.com/gpu", &["", "GPU-a"])])])],
        };
        let alloc = allocations_from(&reply, &KubeletConfig::default());
        assert_eq!(alloc.len(), 1);
        let owner = &alloc.owners("GPU-a")[0];
        assert_eq!(
            (owner.namespace.as_deref(), owner.pod.as_deref(), owner.container.as_deref()),
            (None, Some("p"), None)
        );
    }

    #[test]
    fn resource_names_match_exactly_or_by_prefix() {
        let config = KubeletConfig::default();
        for gpu in
            ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb.shared"]
        {
            assert!(config.is_gpu_resource(gpu), "{gpu}");
        }
        for other in ["nvidia.com/gpus", "nvidia.com/gpu.shared.x", "nvidia.com/mig", "amd.com/gpu", ""] {
            assert!(!config.is_gpu_resource(other), "{other}");
        }
        let custom = config.with_resource_name("nvidia.com/a100-40gb").with_resource_name("nvidia.com/a100-40gb");
        assert!(custom.is_gpu_resource("nvidia.com/a100-40gb"));
        assert_eq!(custom.resource_names.len(), DEFAULT_RESOURCE_NAMES.len() + 1, "no duplicates");
    }

    #[test]
    fn errors_name_the_socket() {
        let socket = PathBuf::from("/nowhere/kubelet.sock");
        let errors = [
            KubeletError::SocketMissing { socket: socket.clone() },
            KubeletError::Connect { socket: socket.clone(), reason: "refused".into(), source: "refused".into() },
            KubeletError::Timeout { socket: socket.clone(), after: Duration::from_secs(2) },
            KubeletError::Status { socket: socket.clone(), code: tonic::Code::Unavailable, message: "down".into() },
            KubeletError::Stopped { socket },
        ];
        for e in errors {
            assert!(e.to_string().contains("/nowhere/kubelet.sock"), "{e}");
        }
    }
}

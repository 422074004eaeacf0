//! Who a process or a GPU belongs to, as the model holds it: [`Owner`], filled in by the
//! attribution stage (`gpumon_core::attribution`) and read by sinks as labels
//! (`OwnerLabels`, computed there). Plain data: the model only carries it.

use std::sync::Arc;

/// The container runtime (or service manager) a process's cgroup path belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum ContainerRuntime {
    /// Docker (`docker-<id>.scope`, `/docker/<id>`).
    Docker,
    /// containerd, directly or through CRI (`cri-containerd-<id>.scope`).
    Containerd,
    /// CRI-O (`crio-<id>.scope`).
    Crio,
    /// Podman / libpod (`libpod-<id>.scope`).
    Podman,
    /// A systemd unit that is not a container (a service, a user session).
    Systemd,
}

impl ContainerRuntime {
    /// Lowercase name, as exported.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::Crio => "crio",
            Self::Podman => "podman",
            Self::Systemd => "systemd",
        }
    }
}

/// A Kubernetes pod's QoS class, as its cgroup path shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum QosClass {
    /// `Guaranteed` (pods directly under `kubepods`).
    Guaranteed,
    /// `Burstable`.
    Burstable,
    /// `BestEffort`.
    BestEffort,
}

/// Who a process (or a GPU allocation) belongs to. Every field is optional: a process outside
/// any container has only its user; a pod allocation from the kubelet has namespace, pod and
/// container names but no user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Owner {
    /// Kubernetes namespace.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub namespace: Option<String>,
    /// Kubernetes pod name.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub pod: Option<String>,
    /// Container: the Kubernetes container name (from the kubelet) for a pod; the runtime's
    /// container id shortened to 12 characters (as `docker ps` shows it) for a container outside
    /// Kubernetes; `None` for a pod's process seen only through its cgroup.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub container: Option<String>,
    /// Full container id from the cgroup path.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub container_id: Option<String>,
    /// The container runtime, or `Systemd` for a plain service.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub runtime: Option<ContainerRuntime>,
    /// Kubernetes pod UID from the cgroup path (dashes restored).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub pod_uid: Option<String>,
    /// Kubernetes QoS class from the cgroup path.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub qos: Option<QosClass>,
    /// systemd unit (`train.service`, `session-3.scope`) for processes outside containers.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub unit: Option<String>,
    /// Real user id of the process.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub uid: Option<u32>,
    /// Real group id of the process.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub gid: Option<u32>,
    /// User name for `uid` (from the host's passwd), when resolvable.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub user: Option<String>,
}

impl Owner {
    /// Whether nothing at all is known.
    pub fn is_unknown(&self) -> bool {
        *self == Self::default()
    }
}

/// A shared, cheaply cloned owner (many processes and devices point at the same one).
pub type SharedOwner = Arc<Owner>;

//! Who is sampled: the host ([`SystemInfo`]) and each GPU's identity and static facts
//! ([`DeviceInfo`], [`MigInfo`]), read once by the backend and carried by every snapshot.

use super::Clocks;

/// [`SystemInfo::backend`] of replayed data (a trace played back by `gpumon_core::trace`).
pub const REPLAY_BACKEND: &str = "replay";

/// Host-wide facts, read once by the backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct SystemInfo {
    /// The host's name (as the agent reports it; used as the `host` label/tag).
    pub hostname: String,
    /// Which backend produced the data: `"nvml"`, `"mock"`, or `"replay"` for a recorded trace
    /// played back.
    pub backend: String,
    /// NVIDIA driver version, e.g. `"570.86.15"`.
    pub driver_version: Option<String>,
    /// CUDA driver API version as NVML reports it, e.g. `12080` for 12.8.
    pub cuda_driver_version: Option<i32>,
    /// NVML library version.
    pub nvml_version: Option<String>,
    /// Of replayed data (`backend` [`REPLAY_BACKEND`]): the backend that recorded the trace
    /// (`"nvml"`, `"mock"`), so that a replay of simulated GPUs stays marked simulated
    /// ([`SystemInfo::is_simulated`]). `None` for live data.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub recorded_backend: Option<String>,
}

impl SystemInfo {
    /// Host-wide facts for `backend` on `hostname`; versions unknown.
    pub fn new(hostname: impl Into<String>, backend: impl Into<String>) -> Self {
        Self { hostname: hostname.into(), backend: backend.into(), ..Self::default() }
    }

    /// Whether the data is simulated (the `gpumon-mock` backend, [`SystemInfo::backend`] `"mock"`).
    /// Sinks mark every series, point and resource of simulated data so that it cannot pass for a
    /// GPU's.
    pub fn is_mock(&self) -> bool {
        self.backend == "mock"
    }

    /// Whether the data is played back from a recorded trace ([`SystemInfo::backend`]
    /// [`REPLAY_BACKEND`], `"replay"`): it was read from a GPU once, but not now.
    pub fn is_replay(&self) -> bool {
        self.backend == REPLAY_BACKEND
    }

    /// The mark sinks put on data that was not read from a GPU just now: `Some("mock")` for
    /// simulated data, `Some("replay")` for a replayed trace, `None` for live data. Every sink
    /// labels each series, point and resource of marked data `backend=<mark>`, so that neither
    /// can pass for a live GPU's in a query or on a dashboard.
    ///
    /// ```
    /// use gpumon_core::SystemInfo;
    ///
    /// assert_eq!(SystemInfo::new("node-1", "replay").marked_backend(), Some("replay"));
    /// assert_eq!(SystemInfo::new("node-1", "mock").marked_backend(), Some("mock"));
    /// assert_eq!(SystemInfo::new("node-1", "nvml").marked_backend(), None);
    /// ```
    pub fn marked_backend(&self) -> Option<&str> {
        (self.is_mock() || self.is_replay()).then_some(self.backend.as_str())
    }

    /// The second half of the mark of replayed data: the backend that recorded it (`"mock"` for
    /// a trace of simulated GPUs, `"nvml"` for a real node's), which sinks add beside
    /// `backend="replay"` as `recorded_backend=<it>`. `None` for live data and for a replay
    /// whose recording backend is unknown.
    ///
    /// ```
    /// use gpumon_core::SystemInfo;
    ///
    /// let mut replay = SystemInfo::new("node-1", "replay");
    /// replay.recorded_backend = Some("mock".into());
    /// assert_eq!(replay.marked_recorded_backend(), Some("mock"));
    /// assert!(replay.is_simulated());
    /// assert_eq!(SystemInfo::new("node-1", "mock").marked_recorded_backend(), None);
    /// ```
    pub fn marked_recorded_backend(&self) -> Option<&str> {
        self.recorded_backend.as_deref().filter(|b| self.is_replay() && !b.is_empty())
    }

    /// Whether the data is simulated: the mock's, or a replay of a trace the mock recorded.
    pub fn is_simulated(&self) -> bool {
        self.is_mock() || self.marked_recorded_backend() == Some("mock")
    }

    /// CUDA version as `"major.minor"`, if known.
    pub fn cuda_version(&self) -> Option<String> {
        self.cuda_driver_version.map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
    }
}

/// A GPU's identity and static facts, read once when the device is discovered.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct DeviceInfo {
    /// NVML index of the physical GPU (for a MIG instance: its parent's index).
    pub index: u32,
    /// `GPU-…` UUID, or `MIG-…` for a MIG instance. Stable across reboots; the primary key.
    pub uuid: String,
    /// Product name, e.g. `"NVIDIA H100 80GB HBM3"`.
    pub name: String,
    /// PCI bus id, e.g. `"00000000:17:00.0"`.
    pub pci_bus_id: Option<String>,
    /// Board serial number.
    pub serial: Option<String>,
    /// GPU architecture, e.g. `"Hopper"`.
    pub architecture: Option<String>,
    /// Set when this device is a MIG instance.
    pub mig: Option<MigInfo>,
    /// Total framebuffer memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Default power limit, watts.
    pub power_limit_default_watts: Option<f64>,
    /// Lowest settable power limit, watts.
    pub power_limit_min_watts: Option<f64>,
    /// Highest settable power limit, watts.
    pub power_limit_max_watts: Option<f64>,
    /// Maximum clocks, hertz.
    pub max_clocks: Clocks,
    /// Temperature at which the GPU slows down, °C.
    pub temperature_slowdown_celsius: Option<f64>,
    /// Temperature at which the GPU shuts down, °C.
    pub temperature_shutdown_celsius: Option<f64>,
    /// Maximum PCIe link generation.
    pub pcie_max_link_generation: Option<u32>,
    /// Maximum PCIe link width (lanes).
    pub pcie_max_link_width: Option<u32>,
}

impl DeviceInfo {
    /// A device with the given index, UUID and name; everything else unknown.
    pub fn new(index: u32, uuid: impl Into<String>, name: impl Into<String>) -> Self {
        Self { index, uuid: uuid.into(), name: name.into(), ..Self::default() }
    }

    /// `"nvidiaN"`, the device node name dcgm-exporter uses as its `device` label.
    pub fn device_node(&self) -> String {
        format!("nvidia{}", self.index)
    }
}

/// Where a MIG instance sits inside its parent GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct MigInfo {
    /// UUID of the parent GPU.
    pub parent_uuid: String,
    /// Index of this instance among the parent's MIG devices.
    pub mig_index: u32,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// Profile name, e.g. `"1g.10gb"`.
    pub profile: Option<String>,
}

impl MigInfo {
    /// A MIG placement.
    pub fn new(parent_uuid: impl Into<String>, mig_index: u32, gpu_instance_id: u32, compute_instance_id: u32) -> Self {
        Self { parent_uuid: parent_uuid.into(), mig_index, gpu_instance_id, compute_instance_id, profile: None }
    }
}

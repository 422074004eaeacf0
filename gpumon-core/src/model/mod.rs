//! The data model: what one sampling tick knows about every visible GPU.
//!
//! A [`Snapshot`] is immutable and shared as `Arc<Snapshot>` by every sink. Values are stored in
//! canonical base units (bytes, watts, joules, degrees Celsius, hertz, ratios in `0.0..=1.0`), so a
//! sink only ever rescales, never guesses. A value the GPU does not support — or that was not
//! asked for — is `None`; a value that failed for another reason (no permission, say) is `None`
//! *and* recorded in [`DeviceSample::errors`]. The rest of the snapshot still ships.
//!
//! The shape is `shared/STYLE.md`'s "Data model: an immutable `Snapshot`, not a registry" ("One
//! sampling tick produces one value, shared as `Arc<Snapshot>`"), with sysinfo's rule for
//! missing values ("A value that *may* be missing on a supported platform is an `Option`").
//!
//! # Files
//! - `mod.rs`: the snapshot, the device and process samples and their value groups;
//! - `identity.rs`: the host and each GPU's identity ([`SystemInfo`], [`DeviceInfo`]), read once;
//! - `owner.rs`: [`Owner`], who a process or GPU belongs to (filled in by attribution, which
//!   also turns it into labels);
//! - `output.rs`: what stages attach to a snapshot ([`StageOutput`], [`StageOutputs`]) and how
//!   sinks read it ([`Snapshot::visit_derived`], [`Snapshot::visit_events`]);
//! - `event.rs`: [`Event`], one thing that happened at a tick.
//!
//! The model names the catalogue ([`Family`]) and nothing else in the crate: metric names
//! (`metric/visit.rs`), owner labels (`stages/attribution/owners.rs`) and the stages read the
//! model, never the other way round.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::metric::Family;

mod event;
mod identity;
mod output;
mod owner;

pub use event::{no_rows, Event, EventField, EventRow, EventValue, Rows};
pub use identity::{DeviceInfo, MigInfo, SystemInfo, REPLAY_BACKEND};
pub use output::{AnyOutput, StageOutput, StageOutputs};
pub use owner::{ContainerRuntime, Owner, QosClass, SharedOwner};

/// One sampling tick: every visible device's values at one instant.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// Tick number, increasing by one per snapshot the runtime takes (0 for ad-hoc samples).
    pub seq: u64,
    /// When the sample was taken (wall clock).
    #[cfg_attr(feature = "serde", serde(with = "crate::model::unix_nanos"))]
    pub taken_at: SystemTime,
    /// How long the backend took to read every device.
    #[cfg_attr(feature = "serde", serde(default))]
    pub duration: Duration,
    /// Host-wide facts: host name, driver, backend.
    pub system: Arc<SystemInfo>,
    /// One entry per visible device (MIG instances are devices of their own).
    pub devices: Vec<DeviceSample>,
    /// Whether the backend could be read at this tick. [`SamplingState::Failed`] marks a
    /// *sampling-failed* snapshot ([`Snapshot::sampling_failed`]): no devices, no derived data,
    /// only the host and why — what sinks export as "up 0" for the host. Absent from JSON when
    /// sampling succeeded.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "SamplingState::is_ok"))]
    pub sampling: SamplingState,
    /// What the stages attached at this tick ([`crate::stages`]): diagnosis, training steps,
    /// attribution counters, an embedder's own. Read one with
    /// [`Snapshot::output`] (`snapshot.output::<Diagnosis>()`); sinks export them all through
    /// [`Snapshot::visit_derived`] and [`Snapshot::visit_events`]. In JSON each is a field of
    /// the snapshot named by its key (`"diagnosis": {…}`).
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub outputs: StageOutputs,
}

/// Whether a tick's sample succeeded; see [`Snapshot::sampling`].
///
/// When a sample fails (the driver is not loaded, the backend timed out or panicked), the
/// runtime still hands every *sink* a snapshot for that tick — one with no devices and
/// [`SamplingState::Failed`] — so that a sink that only learns from snapshots (InfluxDB, OTLP,
/// a push gateway) can export "this host's GPUs cannot be read" (`up = 0` without device labels)
/// instead of going silent. Subscribers (`AgentHandle::subscribe`) never see
/// these markers: they get sampled data only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum SamplingState {
    /// The backend answered; the snapshot carries its devices.
    #[default]
    Ok,
    /// The sample failed; the snapshot carries no device data.
    Failed {
        /// Why, as the sampling error says it (e.g. `backend unavailable: …`).
        reason: String,
    },
}

impl SamplingState {
    /// Whether sampling succeeded.
    pub fn is_ok(&self) -> bool {
        matches!(self, SamplingState::Ok)
    }
}

impl Snapshot {
    /// A snapshot taken now, with `seq` 0 (the runtime numbers the ones it takes).
    pub fn new(system: Arc<SystemInfo>, devices: Vec<DeviceSample>) -> Self {
        Self {
            seq: 0,
            taken_at: SystemTime::now(),
            duration: Duration::ZERO,
            system,
            devices,
            sampling: SamplingState::Ok,
            outputs: StageOutputs::default(),
        }
    }

    /// A *sampling-failed* snapshot taken now: no devices, [`SamplingState::Failed`] with
    /// `reason`. `system` names the host (and backend) the failure is about. Sinks export it as
    /// `up = 0` for the host and nothing per device; see [`SamplingState`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::{Snapshot, SystemInfo};
    ///
    /// let s = Snapshot::sampling_failed(Arc::new(SystemInfo::new("node-1", "nvml")), "driver not loaded");
    /// assert_eq!(s.sampling_failure(), Some("driver not loaded"));
    /// assert!(s.devices.is_empty());
    /// ```
    pub fn sampling_failed(system: Arc<SystemInfo>, reason: impl Into<String>) -> Self {
        Self { sampling: SamplingState::Failed { reason: reason.into() }, ..Self::new(system, Vec::new()) }
    }

    /// Why sampling failed at this tick; `None` for a snapshot with data.
    pub fn sampling_failure(&self) -> Option<&str> {
        match &self.sampling {
            SamplingState::Ok => None,
            SamplingState::Failed { reason } => Some(reason),
        }
    }

    /// Builder-style setter for the sequence number.
    #[must_use]
    pub fn with_seq(mut self, seq: u64) -> Self {
        self.seq = seq;
        self
    }

    /// Builder-style setter for the time the sample was taken.
    #[must_use]
    pub fn with_taken_at(mut self, taken_at: SystemTime) -> Self {
        self.taken_at = taken_at;
        self
    }

    /// Builder-style setter for the sampling duration.
    #[must_use]
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// UUIDs of the GPUs whose MIG instances are in this snapshot.
    pub(crate) fn mig_parents(&self) -> std::collections::HashSet<&str> {
        self.devices.iter().filter_map(|d| d.info.mig.as_ref().map(|m| m.parent_uuid.as_str())).collect()
    }

    /// Nanoseconds since the Unix epoch of [`Snapshot::taken_at`] (0 before 1970).
    pub fn timestamp_nanos(&self) -> u64 {
        self.taken_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// The device with this UUID, if present.
    pub fn device(&self, uuid: &str) -> Option<&DeviceSample> {
        self.devices.iter().find(|d| d.info.uuid == uuid)
    }

    /// The position in [`Snapshot::devices`] of the device with this UUID: what a derived point
    /// or an event names its device by.
    pub fn position(&self, uuid: &str) -> Option<usize> {
        self.devices.iter().position(|d| d.info.uuid == uuid)
    }
}

/// Whether a device answered this tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum DeviceState {
    /// The device answered.
    #[default]
    Ok,
    /// The device fell off the bus or needs a reset; it carries no values until it returns.
    Lost,
    /// The GPU is runtime-suspended (PCI runtime power management put it to sleep) and was not
    /// woken to be measured: it is present and healthy but carries no values this tick.
    Suspended,
}

/// Everything one device reported in one tick.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct DeviceSample {
    /// Identity and static facts (shared between ticks).
    pub info: Arc<DeviceInfo>,
    /// Whether the device answered.
    pub state: DeviceState,
    /// Engine utilisation, ratios.
    pub utilization: Utilization,
    /// Framebuffer memory, bytes.
    pub memory: Memory,
    /// Temperatures, °C.
    pub temperature: Temperature,
    /// Power and energy.
    pub power: Power,
    /// Current clocks, hertz.
    pub clocks: Clocks,
    /// Fan speed as a ratio of its maximum (first fan).
    pub fan_speed: Option<f64>,
    /// Performance state: 0 (P0, fastest) to 15 (P15, slowest).
    pub performance_state: Option<u32>,
    /// Why clocks are held below their maximum (NVML "clocks event reasons", formerly throttle reasons).
    pub clock_event_reasons: Option<ClockEventReasons>,
    /// Whether the reasons export as their bit mask only, without each reason's own series: set
    /// by the agent while [`Family::ClockEventsByReason`] is not exported. Not serialised (how a
    /// sink renders the mask, not a reading).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub clock_event_mask_only: bool,
    /// PCIe link and throughput.
    pub pcie: Pcie,
    /// ECC counters, retired pages and remapped rows.
    pub ecc: Ecc,
    /// XID errors seen since the agent started, one entry per XID code.
    pub xid_errors: Vec<XidCount>,
    /// Processes using the device (opt-in: [`Family::Processes`]).
    pub processes: Vec<ProcessSample>,
    /// Min/max/mean over the interval of values the driver buffers at a higher rate.
    pub windows: Windows,
    /// GPM profiling metrics (Hopper and newer).
    pub gpm: Gpm,
    /// NVLink links and counters; `None` on GPUs without NVLink (and when [`Family::Nvlink`]
    /// was not asked for) — never a list of zeros.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub nvlink: Option<Nvlink>,
    /// Per-metric failures this tick; the values concerned are `None`.
    pub errors: Vec<MetricFailure>,
    /// Who holds the device this tick ([`crate::attribution`]): the pod(s) the kubelet allocated
    /// it to and the distinct owners of its processes, without duplicates. Empty when
    /// attribution is off or nothing is known; see [`DeviceSample::owner_labels`].
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub owners: Vec<SharedOwner>,
}

impl DeviceSample {
    /// An empty sample for `info`: every value absent.
    pub fn new(info: Arc<DeviceInfo>) -> Self {
        Self { info, ..Self::default() }
    }

    /// A sample for a device that is lost: no values, state [`DeviceState::Lost`].
    pub fn lost(info: Arc<DeviceInfo>) -> Self {
        Self { info, state: DeviceState::Lost, ..Self::default() }
    }

    /// A sample for a runtime-suspended GPU: no values, state [`DeviceState::Suspended`].
    pub fn suspended(info: Arc<DeviceInfo>) -> Self {
        Self { info, state: DeviceState::Suspended, ..Self::default() }
    }

    /// Whether the device answered this tick.
    pub fn is_up(&self) -> bool {
        self.state == DeviceState::Ok
    }

    /// Whether the device is present: answering or runtime-suspended (not lost).
    pub fn is_present(&self) -> bool {
        self.state != DeviceState::Lost
    }

    /// The process with this pid, if the device lists it.
    pub fn process(&self, pid: u32) -> Option<&ProcessSample> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Records a per-metric failure.
    pub fn record_failure(&mut self, family: Family, reason: FailureReason) {
        self.errors.push(MetricFailure { family, reason });
    }

    /// The families in [`Self::errors`], each once, in the order they first failed: what is
    /// "not monitored" on this device this tick.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::{DeviceInfo, DeviceSample, FailureReason, Family};
    ///
    /// let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "H100")));
    /// gpu.record_failure(Family::Xid, FailureReason::Other("XID events not monitored".into()));
    /// gpu.record_failure(Family::Ecc, FailureReason::NoPermission);
    /// gpu.record_failure(Family::Xid, FailureReason::Timeout);
    /// assert_eq!(gpu.failed_families().collect::<Vec<_>>(), [Family::Xid, Family::Ecc]);
    /// ```
    pub fn failed_families(&self) -> impl Iterator<Item = Family> + '_ {
        let errors = &self.errors;
        errors
            .iter()
            .enumerate()
            .filter(|(i, e)| !errors[..*i].iter().any(|seen| seen.family == e.family))
            .map(|(_, e)| e.family)
    }
}

/// Engine utilisation over the driver's last sample period, ratios in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Utilization {
    /// Fraction of time one or more kernels ran.
    pub gpu: Option<f64>,
    /// Fraction of time the memory controller was busy (reads or writes).
    pub memory: Option<f64>,
    /// Video encoder.
    pub encoder: Option<f64>,
    /// Video decoder.
    pub decoder: Option<f64>,
}

/// Framebuffer memory, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Memory {
    /// Allocated by processes.
    pub used: Option<u64>,
    /// Available.
    pub free: Option<u64>,
    /// Installed.
    pub total: Option<u64>,
    /// Held by the driver and firmware.
    pub reserved: Option<u64>,
}

impl Memory {
    /// `used / total`, when both are known and total is not zero.
    pub fn used_ratio(&self) -> Option<f64> {
        match (self.used, self.total) {
            (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
            _ => None,
        }
    }
}

/// Temperatures, °C.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Temperature {
    /// GPU die.
    pub gpu: Option<f64>,
    /// HBM / memory (datacenter parts only).
    pub memory: Option<f64>,
}

/// Power draw, limit and energy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Power {
    /// Current draw, watts.
    pub usage_watts: Option<f64>,
    /// Enforced power limit, watts.
    pub limit_watts: Option<f64>,
    /// Energy consumed since the driver was loaded, joules (monotonic counter).
    pub energy_joules: Option<f64>,
}

/// Clocks, hertz.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Clocks {
    /// Graphics clock.
    pub graphics: Option<f64>,
    /// Streaming-multiprocessor clock.
    pub sm: Option<f64>,
    /// Memory clock.
    pub memory: Option<f64>,
    /// Video engine clock.
    pub video: Option<f64>,
}

/// NVML clocks-event (throttle) reasons, a bit set with NVML's own bit values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct ClockEventReasons(pub u64);

impl ClockEventReasons {
    /// Nothing running: clocks are low because the GPU is idle.
    pub const GPU_IDLE: u64 = 0x1;
    /// Application clocks setting.
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    /// Software power cap (power limit).
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown (temperature or power brake).
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Sync boost.
    pub const SYNC_BOOST: u64 = 0x10;
    /// Software thermal slowdown.
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    /// Hardware thermal slowdown.
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    /// Hardware power-brake slowdown.
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    /// Display clock setting.
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// Every reason with its stable snake_case name, in bit order. Sinks use these names as the
    /// `reason` label value.
    pub const ALL: [(u64, &'static str); 9] = [
        (Self::GPU_IDLE, "gpu_idle"),
        (Self::APPLICATIONS_CLOCKS_SETTING, "applications_clocks_setting"),
        (Self::SW_POWER_CAP, "sw_power_cap"),
        (Self::HW_SLOWDOWN, "hw_slowdown"),
        (Self::SYNC_BOOST, "sync_boost"),
        (Self::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (Self::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (Self::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (Self::DISPLAY_CLOCK_SETTING, "display_clock_setting"),
    ];

    /// Whether `bit` is set.
    pub fn contains(self, bit: u64) -> bool {
        self.0 & bit == bit
    }

    /// Whether any reason other than idle holds the clocks down — i.e. the GPU is throttled.
    pub fn is_throttled(self) -> bool {
        self.0 & !(Self::GPU_IDLE | Self::APPLICATIONS_CLOCKS_SETTING) != 0
    }

    /// Names of the reasons that are set.
    pub fn active_names(self) -> impl Iterator<Item = &'static str> {
        Self::ALL.into_iter().filter(move |(bit, _)| self.contains(*bit)).map(|(_, n)| n)
    }
}

/// PCIe link state and throughput.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Pcie {
    /// Current link generation.
    pub link_generation: Option<u32>,
    /// Current link width (lanes).
    pub link_width: Option<u32>,
    /// PCIe replay counter (monotonic).
    pub replays: Option<u64>,
    /// Transmit throughput, bytes/s (opt-in: [`Family::PcieThroughput`]).
    pub tx_bytes_per_second: Option<f64>,
    /// Receive throughput, bytes/s (opt-in: [`Family::PcieThroughput`]).
    pub rx_bytes_per_second: Option<f64>,
}

/// Memory-error counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Ecc {
    /// Corrected (single-bit) ECC errors, aggregate over the GPU's life.
    pub corrected: Option<u64>,
    /// Uncorrected (double-bit) ECC errors, aggregate.
    pub uncorrected: Option<u64>,
    /// Pages retired for single-bit errors.
    pub retired_pages_single_bit: Option<u64>,
    /// Pages retired for double-bit errors.
    pub retired_pages_double_bit: Option<u64>,
    /// Pages waiting to be retired at the next reboot.
    pub retired_pages_pending: Option<bool>,
    /// Rows remapped for correctable errors.
    pub remapped_rows_correctable: Option<u64>,
    /// Rows remapped for uncorrectable errors.
    pub remapped_rows_uncorrectable: Option<u64>,
    /// A remapping is pending (needs a GPU reset).
    pub remapped_rows_pending: Option<bool>,
    /// A remapping failed.
    pub remapped_rows_failure: Option<bool>,
}

/// How many XID errors of one code were seen, and when the last one was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct XidCount {
    /// The XID code (e.g. 48 = double-bit ECC error, 79 = fallen off the bus).
    pub code: u64,
    /// Events of this code since the agent started (monotonic).
    pub count: u64,
    /// When the last one was seen.
    #[cfg_attr(feature = "serde", serde(with = "crate::model::unix_nanos"))]
    pub last_seen: SystemTime,
}

impl XidCount {
    /// `count` events of `code`, the last at `last_seen`.
    pub fn new(code: u64, count: u64, last_seen: SystemTime) -> Self {
        Self { code, count, last_seen }
    }
}

/// One process's use of one device.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct ProcessSample {
    /// Process id (in the host's PID namespace).
    pub pid: u32,
    /// Process name, when known.
    pub name: Option<String>,
    /// Device memory used, bytes.
    pub memory_used: Option<u64>,
    /// SM utilisation attributed to the process, ratio.
    pub sm_utilization: Option<f64>,
    /// Memory-controller utilisation attributed to the process, ratio.
    pub memory_utilization: Option<f64>,
    /// Encoder utilisation, ratio.
    pub encoder_utilization: Option<f64>,
    /// Decoder utilisation, ratio.
    pub decoder_utilization: Option<f64>,
    /// Who the process belongs to (container, pod, user), when attribution is on and the
    /// process could be read ([`crate::attribution`]).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub owner: Option<SharedOwner>,
    /// The pid of the process that started it (its launcher: `torchrun`, `deepspeed`, `mpirun`,
    /// a shell), when attribution is on and could read it. Diagnosis takes the processes one
    /// parent started as one job when nothing else says which job a GPU runs.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub parent_pid: Option<u32>,
}

impl ProcessSample {
    /// A process with only its pid known.
    pub fn new(pid: u32) -> Self {
        Self { pid, ..Self::default() }
    }
}

/// Min, max and mean of a value the driver sampled several times during one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct WindowStats {
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// How many driver samples went into it.
    pub count: u32,
}

impl WindowStats {
    /// Statistics of `values`; `None` when there are none.
    pub fn from_values(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut it = values.into_iter();
        let first = it.next()?;
        let (mut min, mut max, mut sum, mut count) = (first, first, first, 1u32);
        for v in it {
            min = min.min(v);
            max = max.max(v);
            sum += v;
            count += 1;
        }
        Some(Self { min, max, mean: sum / f64::from(count), count })
    }
}

/// High-resolution windows over the sampling interval (from `nvmlDeviceGetSamples`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Windows {
    /// GPU utilisation, ratio.
    pub gpu_utilization: Option<WindowStats>,
    /// Memory-controller utilisation, ratio.
    pub memory_utilization: Option<WindowStats>,
    /// Power draw, watts.
    pub power_watts: Option<WindowStats>,
    /// SM clock, hertz.
    pub sm_clock: Option<WindowStats>,
    /// Memory clock, hertz.
    pub memory_clock: Option<WindowStats>,
}

/// GPM profiling metrics (Hopper and newer), ratios over the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Gpm {
    /// Graphics engine activity.
    pub graphics_activity: Option<f64>,
    /// Fraction of SMs with at least one warp resident, time-averaged.
    pub sm_activity: Option<f64>,
    /// Warps resident relative to the maximum.
    pub sm_occupancy: Option<f64>,
    /// Any tensor pipe active.
    pub tensor_activity: Option<f64>,
    /// DRAM bandwidth used relative to peak.
    pub dram_bandwidth: Option<f64>,
}

/// Whether an NVLink link is trained and carrying traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum NvlinkState {
    /// Active.
    #[default]
    Up,
    /// Inactive (not trained, or failed).
    Down,
}

/// What sits at the far end of an NVLink link (NVML `nvmlIntNvLinkDeviceType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum NvlinkRemote {
    /// Another GPU (direct GPU-to-GPU link).
    Gpu,
    /// An IBM NPU (POWER CPU).
    IbmNpu,
    /// An NVSwitch.
    Switch,
    /// The driver does not say.
    Unknown,
}

impl NvlinkRemote {
    /// From NVML's code (0 GPU, 1 IBM NPU, 2 switch, else unknown).
    pub fn from_nvml(code: u32) -> Self {
        match code {
            0 => Self::Gpu,
            1 => Self::IbmNpu,
            2 => Self::Switch,
            _ => Self::Unknown,
        }
    }

    /// NVML's code for this type.
    pub fn nvml_code(self) -> u32 {
        match self {
            Self::Gpu => 0,
            Self::IbmNpu => 1,
            Self::Switch => 2,
            Self::Unknown => 0xFF,
        }
    }
}

/// One NVLink link of a GPU: static facts read at discovery, state and counters per tick.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct NvlinkLink {
    /// Link number (0-based, as NVML numbers them).
    pub link: u32,
    /// Up or down this tick.
    pub state: NvlinkState,
    /// NVLink version (4 on Hopper, 3 on Ampere).
    pub version: Option<u32>,
    /// PCI bus id of the far end (a GPU's or an NVSwitch's).
    pub remote_pci_bus_id: Option<String>,
    /// What the far end is.
    pub remote_device_type: Option<NvlinkRemote>,
    /// Data bytes transmitted since the driver loaded (monotonic).
    pub tx_bytes: Option<u64>,
    /// Data bytes received since the driver loaded (monotonic).
    pub rx_bytes: Option<u64>,
    /// CRC errors (data-link layer, monotonic).
    pub crc_errors: Option<u64>,
    /// Replay errors (monotonic).
    pub replay_errors: Option<u64>,
    /// Recovery errors — link retrains (monotonic).
    pub recovery_errors: Option<u64>,
}

impl NvlinkLink {
    /// Link `link`, up, everything else unknown.
    pub fn new(link: u32) -> Self {
        Self { link, ..Self::default() }
    }

    /// Whether the link is up.
    pub fn is_up(&self) -> bool {
        self.state == NvlinkState::Up
    }
}

/// A GPU's NVLink links. Present only on GPUs that have links.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Nvlink {
    /// One entry per link, in link order.
    pub links: Vec<NvlinkLink>,
    /// Whether sinks export each link's own series ([`Family::NvlinkLinks`], opt-in: an H100
    /// has 18 links, so per-link series are two thirds of a host's); the per-GPU totals are
    /// exported either way. The backends set it from the families asked for; `true` for links
    /// built by hand ([`Nvlink::new`]).
    ///
    /// [`Family::NvlinkLinks`]: crate::Family::NvlinkLinks
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "is_true"))]
    pub per_link: bool,
}

#[cfg(feature = "serde")]
fn is_true(b: &bool) -> bool {
    *b
}

impl Default for Nvlink {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Nvlink {
    /// These links, each exported as series of its own.
    pub fn new(links: Vec<NvlinkLink>) -> Self {
        Self { links, per_link: true }
    }

    /// Sets [`Nvlink::per_link`].
    #[must_use]
    pub fn with_per_link(mut self, per_link: bool) -> Self {
        self.per_link = per_link;
        self
    }

    /// Links that are up.
    pub fn links_up(&self) -> u64 {
        self.links.iter().filter(|l| l.is_up()).count() as u64
    }

    fn sum(&self, f: impl Fn(&NvlinkLink) -> Option<u64>) -> Option<u64> {
        self.links.iter().filter_map(f).reduce(u64::saturating_add)
    }

    /// Bytes transmitted over all links; `None` when no link reports it.
    pub fn tx_bytes(&self) -> Option<u64> {
        self.sum(|l| l.tx_bytes)
    }
    /// Bytes received over all links.
    pub fn rx_bytes(&self) -> Option<u64> {
        self.sum(|l| l.rx_bytes)
    }
    /// CRC errors over all links.
    pub fn crc_errors(&self) -> Option<u64> {
        self.sum(|l| l.crc_errors)
    }
    /// Replay errors over all links.
    pub fn replay_errors(&self) -> Option<u64> {
        self.sum(|l| l.replay_errors)
    }
    /// Recovery errors over all links.
    pub fn recovery_errors(&self) -> Option<u64> {
        self.sum(|l| l.recovery_errors)
    }
    /// CRC + replay + recovery errors over all links.
    pub fn total_errors(&self) -> u64 {
        [self.crc_errors(), self.replay_errors(), self.recovery_errors()].into_iter().flatten().sum()
    }
}

/// A metric family that could not be read for a reason other than "not supported".
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct MetricFailure {
    /// The family that failed.
    pub family: Family,
    /// Why.
    pub reason: FailureReason,
}

impl MetricFailure {
    /// A failure of `family` for `reason`.
    pub fn new(family: Family, reason: FailureReason) -> Self {
        Self { family, reason }
    }
}

/// Why a metric family failed on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum FailureReason {
    /// The caller lacks the privilege (NVML `NoPermission`).
    NoPermission,
    /// The call timed out.
    Timeout,
    /// Anything else, with the backend's message.
    Other(String),
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoPermission => f.write_str("no permission"),
            Self::Timeout => f.write_str("timed out"),
            Self::Other(msg) => f.write_str(msg),
        }
    }
}

#[cfg(feature = "serde")]
pub(crate) mod unix_nanos {
    //! `SystemTime` as integer nanoseconds since the Unix epoch: stable, compact, and what
    //! line protocol and OTLP use anyway.
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    pub(crate) fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let nanos = t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        s.serialize_u64(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let nanos = <u64 as serde::Deserialize>::deserialize(d)?;
        Ok(UNIX_EPOCH + Duration::from_nanos(nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_stats_of_values() {
        let w = WindowStats::from_values([0.2, 0.9, 0.4]).unwrap();
        assert_eq!((w.min, w.max, w.count), (0.2, 0.9, 3));
        assert!((w.mean - 0.5).abs() < 1e-12);
        assert!(WindowStats::from_values(std::iter::empty()).is_none());
    }

    #[test]
    fn clock_event_reasons_names_and_throttled() {
        let r = ClockEventReasons(ClockEventReasons::GPU_IDLE | ClockEventReasons::HW_THERMAL_SLOWDOWN);
        assert_eq!(r.active_names().collect::<Vec<_>>(), ["gpu_idle", "hw_thermal_slowdown"]);
        assert!(r.is_throttled());
        assert!(!ClockEventReasons(ClockEventReasons::GPU_IDLE).is_throttled());
    }

    #[test]
    fn memory_used_ratio_needs_nonzero_total() {
        let m = Memory { used: Some(25), total: Some(100), ..Memory::default() };
        assert_eq!(m.used_ratio(), Some(0.25));
        assert_eq!(Memory { used: Some(1), total: Some(0), ..Memory::default() }.used_ratio(), None);
    }

    #[test]
    fn nvlink_totals_sum_links_and_count_up_links() {
        let mut a = NvlinkLink::new(0);
        a.tx_bytes = Some(10);
        a.crc_errors = Some(2);
        let mut b = NvlinkLink::new(1);
        b.tx_bytes = Some(5);
        b.state = NvlinkState::Down;
        b.recovery_errors = Some(1);
        let nv = Nvlink::new(vec![a, b]);
        assert_eq!((nv.tx_bytes(), nv.rx_bytes(), nv.links_up()), (Some(15), None, 1));
        assert_eq!(nv.total_errors(), 3);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn nvlink_json_is_absent_without_links() {
        let info = Arc::new(DeviceInfo::new(0, "GPU-x", "X"));
        let plain = serde_json::to_value(DeviceSample::new(info.clone())).unwrap();
        assert!(plain.get("nvlink").is_none(), "no NVLink: no key at all, not zeros");
        let mut s = DeviceSample::new(info);
        let mut l = NvlinkLink::new(3);
        l.remote_pci_bus_id = Some("00000000:05:00.0".into());
        l.remote_device_type = Some(NvlinkRemote::Switch);
        s.nvlink = Some(Nvlink::new(vec![l]));
        let v = serde_json::to_value(&s).unwrap();
        let link = &v["nvlink"]["links"][0];
        assert_eq!((link["link"].as_u64(), link["state"].as_str()), (Some(3), Some("up")));
        assert_eq!(link["remote_device_type"].as_str(), Some("switch"));
        let back: DeviceSample = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn cuda_version_formats_major_minor() {
        let s = SystemInfo { cuda_driver_version: Some(12080), ..SystemInfo::default() };
        assert_eq!(s.cuda_version().as_deref(), Some("12.8"));
    }
}

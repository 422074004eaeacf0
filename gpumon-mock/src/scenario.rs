//! Scenarios: what each GPU runs (phases over simulated time, or a tick-based workload), how
//! long a tick is, and which faults strike when.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use gpumon_core::Family;
use serde::Deserialize;

use crate::error::ConfigError;

/// The message of the failure a [`Fault::UnknownError`] records — the same text gpumon's NVML
/// backend records for `NVML_ERROR_UNKNOWN` (`gpumon_core::nvml::UNKNOWN_ERROR`).
pub const UNKNOWN_ERROR: &str = "NVML unknown error";

const BUILTIN: &[(&str, &str)] = &[
    ("training", include_str!("../profiles/scenarios/training.toml")),
    ("idle", include_str!("../profiles/scenarios/idle.toml")),
    ("dataloader-starved", include_str!("../profiles/scenarios/dataloader-starved.toml")),
    ("memory-bound", include_str!("../profiles/scenarios/memory-bound.toml")),
    ("imbalance", include_str!("../profiles/scenarios/imbalance.toml")),
    ("thermal-throttling", include_str!("../profiles/scenarios/thermal-throttling.toml")),
    ("power-capped", include_str!("../profiles/scenarios/power-capped.toml")),
    ("near-oom", include_str!("../profiles/scenarios/near-oom.toml")),
    ("idle-allocated", include_str!("../profiles/scenarios/idle-allocated.toml")),
    ("pcie-bound", include_str!("../profiles/scenarios/pcie-bound.toml")),
    ("lost-gpu", include_str!("../profiles/scenarios/lost-gpu.toml")),
    ("ecc-burst", include_str!("../profiles/scenarios/ecc-burst.toml")),
];

gpumon_core::named_enum! {
    /// What a GPU is doing over time, as a function of the tick. Every value is a pure function of
    /// (seed, device, tick).
    ///
    /// Each workload shows one pattern gpumon's diagnosis recognises, with its values clearly on one
    /// side of every threshold (see `docs/diagnosis.md`); `training` and `idle` are the healthy
    /// baselines that must raise nothing. Whatever the tick period, a tick's high-resolution window
    /// holds the shape the workload was written for (about ten driver samples per second of tick);
    /// a real driver samples at its own period. The built-in scenarios are written in phases
    /// ([`Phase`](crate::Phase)) for that reason; workloads remain for code ([`Scenario::new`]) and
    /// scenario files that name them.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    #[non_exhaustive]
    pub enum Workload as "workload" {
        /// Nothing running: utilisation ~0, no memory allocated, no processes, idle power and
        /// clocks, P8, `GPU_IDLE`.
        Idle = "idle",
        /// Steady training: utilisation 90–98 % (every driver sample at 85 % or more), memory controller
        /// 40–55 %, memory ~86 % ± 3 % used, power 88–95 % of the limit with a short `SW_POWER_CAP`
        /// event (one tick at 97–99 %, clocks 86–92 %) in about 60 % of each 30-tick block.
        #[default]
        Training = "training",
        /// Starved by the input pipeline: within each interval the GPU runs a batch (85–97 %) and
        /// then waits for the next (0–3 %), so the high-resolution window spans ~0 to ~0.9 with a
        /// mean of 25–41 % and the instantaneous reading jumps between the two; memory ~70 % used,
        /// memory controller 8–21 %, PCIe traffic low.
        #[serde(alias = "dataloader_starved", alias = "starved")]
        DataloaderStarved = "dataloader-starved",
        /// Memory-bandwidth bound: SM utilisation 30–35 % (GPM SM activity 24–32 %) while the memory
        /// controller is 76–86 % busy and GPM DRAM bandwidth 76–86 %; steady windows.
        #[serde(alias = "memory_bound")]
        MemoryBound = "memory-bound",
        /// GPUs in pairs by index: the even one trains, its odd twin waits (utilisation 3–11 %,
        /// same memory footprint).
        Imbalance = "imbalance",
        /// Training while cooling fails: temperature climbs past the slowdown threshold within
        /// ~60 ticks and hovers there; then SM clocks drop to 55–65 % of maximum with the thermal
        /// slowdown reasons set, and power falls to 70–78 % of the limit (no power-cap reason).
        #[serde(alias = "thermal_throttling", alias = "throttling")]
        ThermalThrottling = "thermal-throttling",
        /// Training pinned at the power limit: power 97.5–99.8 % of the limit, SM clocks 70–82 % of
        /// maximum and `SW_POWER_CAP` on 24 ticks in 25; on the 25th the draw dips to 92–95 % and
        /// the reason clears.
        #[serde(alias = "power_capped")]
        PowerCapped = "power-capped",
        /// Training with memory nearly full: used memory from 95.5 % of the total, rising ever more
        /// slowly toward 99 %, never falling.
        #[serde(alias = "near_oom")]
        NearOom = "near-oom",
        /// A process holds 32–58 % of memory and runs nothing: utilisation 0–1 % (no driver sample
        /// above 2 %), near-idle power, `GPU_IDLE`.
        #[serde(alias = "idle_allocated")]
        IdleAllocated = "idle-allocated",
        /// Bound by host-device copies: PCIe receive 74–86 % of the link's bandwidth (transmit
        /// 4–12 %), utilisation a steady 27–33 %, memory controller 10–19 %.
        #[serde(alias = "pcie_bound")]
        PcieBound = "pcie-bound",
    }
}

/// A latch a test opens to let a hung sample return (see [`Fault::HangUntilReleased`]).
///
/// Clones share the latch. Once released it stays open.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<GateState>, Condvar)>);

#[derive(Default)]
struct GateState {
    open: bool,
    /// Threads blocked in `wait` or `wait_timeout` now.
    waiting: usize,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.0 .0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens the gate, waking every waiter.
    pub fn release(&self) {
        self.lock().open = true;
        self.0 .1.notify_all();
    }

    /// Whether [`Gate::release`] was called.
    pub fn is_released(&self) -> bool {
        self.lock().open
    }

    /// How many threads are blocked at the gate now: a test knows a hung call has begun (the
    /// sampler is inside it) when this is above zero.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Blocks the calling thread until the gate is released.
    pub fn wait(&self) {
        let mut state = self.lock();
        state.waiting += 1;
        while !state.open {
            state = self.0 .1.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.waiting -= 1;
    }

    /// Blocks until released or `timeout` passes; returns whether it was released.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let mut state = self.lock();
        state.waiting += 1;
        let (mut state, _) =
            self.0 .1.wait_timeout_while(state, timeout, |s| !s.open).unwrap_or_else(PoisonError::into_inner);
        state.waiting -= 1;
        state.open
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("released", &self.is_released()).finish()
    }
}

impl PartialEq for Gate {
    /// Two gates are equal when they are the same latch.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A scheduled fault. Ticks count samples: the first sample is tick 0.
///
/// `device` is a physical GPU's NVML index; a fault on a GPU also hits its MIG instances.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Fault {
    /// From `at_tick` on, the GPU is lost ([`DeviceSample::lost`](gpumon_core::DeviceSample::lost)). Sticky.
    DeviceLost {
        /// Physical GPU index.
        device: u32,
        /// First tick it is lost.
        at_tick: u64,
    },
    /// The family's values are absent (as NVML `NotSupported`); no error is recorded.
    NotSupported {
        /// Physical GPU index; `None` = every GPU.
        device: Option<u32>,
        /// The family.
        family: Family,
    },
    /// The family's values are absent and a
    /// [`MetricFailure`](gpumon_core::MetricFailure) with
    /// [`FailureReason::NoPermission`](gpumon_core::FailureReason::NoPermission) is recorded.
    NoPermission {
        /// Physical GPU index; `None` = every GPU.
        device: Option<u32>,
        /// The family.
        family: Family,
    },
    /// The family's values are absent and a [`MetricFailure`](gpumon_core::MetricFailure) with
    /// [`FailureReason::Other`](gpumon_core::FailureReason::Other) carrying [`UNKNOWN_ERROR`] is
    /// recorded — what the NVML backend reports when a driver answers `NVML_ERROR_UNKNOWN` for
    /// the family's calls ("[Unknown Error]") while the GPU itself is fine.
    UnknownError {
        /// Physical GPU index; `None` = every GPU.
        device: Option<u32>,
        /// The family.
        family: Family,
    },
    /// The sample at `at_tick` blocks the calling thread for `duration` (then returns normally).
    Hang {
        /// The tick that hangs.
        at_tick: u64,
        /// How long it blocks.
        duration: Duration,
    },
    /// The sample at `at_tick` blocks the calling thread until `gate` is released. Not
    /// expressible in TOML.
    HangUntilReleased {
        /// The tick that hangs.
        at_tick: u64,
        /// Release it to let the sample return.
        gate: Gate,
    },
    /// Samples in `from_tick..until_tick` fail with
    /// [`SampleError::Unavailable`](gpumon_core::SampleError::Unavailable) (driver not loaded).
    Unavailable {
        /// First failing tick.
        from_tick: u64,
        /// First tick that works again; `None` = never.
        until_tick: Option<u64>,
    },
    /// At `at_tick`, `count` uncorrectable ECC errors: ECC uncorrected counters (and retired
    /// pages or remapped rows, by architecture) rise by `count` and `xid_errors` gets
    /// `count` events of code `xid`, from that tick on.
    EccBurst {
        /// Physical GPU index.
        device: u32,
        /// When it happens.
        at_tick: u64,
        /// XID code (48 = double-bit ECC error; 94/95 = contained/uncontained ECC error).
        xid: u64,
        /// How many errors.
        count: u64,
    },
    /// From `at_tick` on, NVLink link `link` of the GPU is down: its state reads down, its
    /// byte counters stop, its recovery counter rises by one. Sticky.
    NvlinkDown {
        /// Physical GPU index.
        device: u32,
        /// The link.
        link: u32,
        /// First tick it is down.
        at_tick: u64,
    },
    /// From `at_tick` on, NVLink link `link` of the GPU counts `per_tick` CRC errors per tick
    /// (and half as many replays, one recovery per 10 ticks).
    NvlinkErrors {
        /// Physical GPU index.
        device: u32,
        /// The link.
        link: u32,
        /// First tick with errors.
        at_tick: u64,
        /// CRC errors per tick.
        per_tick: u64,
    },
}

impl Fault {
    /// The physical GPU the fault is limited to, if any.
    pub fn device(&self) -> Option<u32> {
        match self {
            Fault::DeviceLost { device, .. }
            | Fault::EccBurst { device, .. }
            | Fault::NvlinkDown { device, .. }
            | Fault::NvlinkErrors { device, .. } => Some(*device),
            Fault::NotSupported { device, .. }
            | Fault::NoPermission { device, .. }
            | Fault::UnknownError { device, .. } => *device,
            Fault::Hang { .. } | Fault::HangUntilReleased { .. } | Fault::Unavailable { .. } => None,
        }
    }
}

/// What a fleet runs: phases over simulated time (or tick-based workloads), the tick period
/// and faults.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Scenario {
    /// Scenario name.
    pub name: String,
    /// One-line description.
    pub description: Option<String>,
    /// Workload of every GPU not listed in `device_workloads`.
    pub workload: Workload,
    /// Per-GPU workloads by physical index.
    pub device_workloads: BTreeMap<u32, Workload>,
    /// Simulated time between ticks (energy integrates power over it and phases run on it).
    /// Default 1 s; [`Scenario::following_interval`] makes it the sampling interval unless the
    /// scenario set it (`tick_period_ms`, [`Scenario::with_tick_period`]).
    pub tick_period: Duration,
    /// Whether `tick_period` was set rather than defaulted.
    tick_period_set: bool,
    /// Scheduled faults.
    pub faults: Vec<Fault>,
    /// Seed for workloads unless the sampler is given one.
    pub seed: Option<u64>,
    /// Phases over simulated time ([`Phase`](crate::Phase)): a GPU that any phase names runs them
    /// instead of its [`Workload`] — idle and empty outside them.
    pub phases: Vec<crate::Phase>,
    /// The driver's utilisation sampling period for GPUs on phases, seconds (default 1/6 s).
    pub driver_period_s: f64,
    /// Groups of GPUs (physical indices) that one process drives together — one program placed
    /// on several GPUs (`device_map="auto"`, `nn.DataParallel`): with processes sampled, every
    /// GPU of a group lists the same process. Other GPUs each run processes of their own.
    pub one_process: Vec<Vec<u32>>,
}

impl Default for Scenario {
    /// `training` on every GPU, 1 s ticks, no faults.
    fn default() -> Self {
        Self::new(Workload::Training)
    }
}

impl Scenario {
    /// Every GPU runs `workload`; 1 s ticks; no faults.
    pub fn new(workload: Workload) -> Self {
        Self {
            name: workload.name().to_owned(),
            description: None,
            workload,
            device_workloads: BTreeMap::new(),
            tick_period: Duration::from_secs(1),
            tick_period_set: false,
            faults: Vec::new(),
            seed: None,
            phases: Vec::new(),
            driver_period_s: crate::DEFAULT_DRIVER_PERIOD_S,
            one_process: Vec::new(),
        }
    }

    /// Builder-style: adds a phase ([`Phase`](crate::Phase)).
    #[must_use]
    pub fn with_phase(mut self, phase: crate::Phase) -> Self {
        self.phases.push(phase);
        self
    }

    /// Builder-style: the driver's utilisation sampling period for GPUs on phases.
    #[must_use]
    pub fn with_driver_period(mut self, period: Duration) -> Self {
        self.driver_period_s = period.as_secs_f64();
        self
    }

    /// Whether physical GPU `device` runs phases rather than a [`Workload`].
    pub fn has_phases(&self, device: u32) -> bool {
        self.phases.iter().any(|p| p.gpus.as_ref().is_none_or(|g| g.contains(&device)))
    }

    /// Builder-style: GPU `device` runs `workload`.
    #[must_use]
    pub fn with_device_workload(mut self, device: u32, workload: Workload) -> Self {
        self.device_workloads.insert(device, workload);
        self
    }

    /// Builder-style: adds a fault.
    #[must_use]
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Builder-style: sets the tick period.
    #[must_use]
    pub fn with_tick_period(mut self, period: Duration) -> Self {
        self.tick_period = period;
        self.tick_period_set = true;
        self
    }

    /// Builder-style: one tick is one sampling `interval` of simulated time — what a sampler
    /// called every `interval` sees, driver samples and all — unless the scenario set its own
    /// tick period. The agent and the Python binding run the mock this way.
    #[must_use]
    pub fn following_interval(mut self, interval: Duration) -> Self {
        if !self.tick_period_set && !interval.is_zero() {
            self.tick_period = interval;
        }
        self
    }

    /// The workload of physical GPU `device`.
    pub fn workload_of(&self, device: u32) -> Workload {
        self.device_workloads.get(&device).copied().unwrap_or(self.workload)
    }

    /// Names of the built-in scenarios. Each is written in phases ([`Phase`](crate::Phase)), so its
    /// driver samples are what a real driver would take at any interval.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// The TOML source of a built-in scenario.
    pub fn builtin_toml(name: &str) -> Option<&'static str> {
        BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// A built-in scenario.
    ///
    /// # Errors
    /// [`ConfigError::UnknownName`] listing the built-ins.
    pub fn builtin(name: &str) -> Result<Self, ConfigError> {
        match Self::builtin_toml(name) {
            Some(src) => Self::from_toml_str(src, name),
            None => Err(ConfigError::UnknownName {
                what: "scenario",
                name: name.to_owned(),
                known: Self::builtin_names().join(", "),
            }),
        }
    }

    /// A built-in name or the path of a TOML file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the bad key, the unreadable file, or the unknown name.
    pub fn load(name_or_path: &str) -> Result<Self, ConfigError> {
        crate::error::load_builtin_or_file(name_or_path, Self::builtin, Self::from_file)
    }

    /// Reads a TOML scenario file.
    ///
    /// # Errors
    /// [`ConfigError::Io`], or as [`Scenario::from_toml_str`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        crate::error::parse_file("scenario", path, Self::from_toml_str)
    }

    /// Parses a TOML scenario; `origin` is used in errors and as the default name.
    ///
    /// # Errors
    /// [`ConfigError::Toml`] for malformed TOML, unknown keys, workloads or families;
    /// [`ConfigError::Invalid`] for a fault missing a key, a bad device key or a zero tick period.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<Self, ConfigError> {
        let raw: ScenarioToml = toml::from_str(src).map_err(|e| ConfigError::toml("scenario", origin, src, &e))?;
        let tick_period = Duration::from_millis(raw.tick_period_ms.unwrap_or(1000));
        if tick_period.is_zero() {
            return Err(ConfigError::invalid("tick_period_ms", "must be above 0"));
        }
        let mut device_workloads = BTreeMap::new();
        for (k, w) in raw.devices {
            let i = k.trim().parse::<u32>().map_err(|_| {
                ConfigError::invalid(format!("devices.{k}"), "keys of [devices] are GPU indices (0, 1, ...)")
            })?;
            device_workloads.insert(i, w);
        }
        let faults = raw.faults.into_iter().enumerate().map(|(i, f)| f.into_fault(i)).collect::<Result<_, _>>()?;
        for (i, p) in raw.phases.iter().enumerate() {
            p.validate(i)?;
        }
        let driver_period_s = match raw.driver_period_ms {
            None => crate::DEFAULT_DRIVER_PERIOD_S,
            Some(0) => return Err(ConfigError::invalid("driver_period_ms", "must be above 0")),
            Some(ms) => ms as f64 / 1000.0,
        };
        Ok(Self {
            name: raw.name.unwrap_or_else(|| origin.to_owned()),
            description: raw.description,
            workload: raw.workload.unwrap_or_default(),
            device_workloads,
            tick_period,
            tick_period_set: raw.tick_period_ms.is_some(),
            faults,
            seed: raw.seed,
            phases: raw.phases,
            driver_period_s,
            one_process: raw.one_process,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioToml {
    name: Option<String>,
    description: Option<String>,
    workload: Option<Workload>,
    tick_period_ms: Option<u64>,
    seed: Option<u64>,
    #[serde(default)]
    devices: BTreeMap<String, Workload>,
    #[serde(default)]
    faults: Vec<FaultToml>,
    driver_period_ms: Option<u64>,
    #[serde(default)]
    phases: Vec<crate::Phase>,
    #[serde(default)]
    one_process: Vec<Vec<u32>>,
    /// What the diagnosis must find on this scenario (the accuracy corpus's `[expect]`, read by
    /// `tests/accuracy.rs`): not the mock's business, but a corpus file runs as it is
    /// (`--mock-scenario gpumon-mock/corpus/….toml`).
    #[serde(default, rename = "expect")]
    _expect: Option<toml::Table>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FaultKind {
    DeviceLost,
    NotSupported,
    NoPermission,
    UnknownError,
    Hang,
    Unavailable,
    EccBurst,
    NvlinkDown,
    NvlinkErrors,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultToml {
    kind: FaultKind,
    device: Option<u32>,
    at_tick: Option<u64>,
    family: Option<Family>,
    duration_ms: Option<u64>,
    from_tick: Option<u64>,
    until_tick: Option<u64>,
    xid: Option<u64>,
    count: Option<u64>,
    link: Option<u32>,
    per_tick: Option<u64>,
}

impl FaultToml {
    fn into_fault(self, i: usize) -> Result<Fault, ConfigError> {
        let missing = |key: &str, kind: &str| {
            ConfigError::invalid(format!("faults[{i}].{key}"), format!("required for kind = \"{kind}\""))
        };
        let unexpected = |key: &str, kind: &str| {
            ConfigError::invalid(format!("faults[{i}].{key}"), format!("not used by kind = \"{kind}\""))
        };
        // Reject keys that belong to another kind, so a typo'd fault does not silently differ.
        let used: &[&str] = match self.kind {
            FaultKind::DeviceLost => &["device", "at_tick"],
            FaultKind::NotSupported | FaultKind::NoPermission | FaultKind::UnknownError => &["device", "family"],
            FaultKind::Hang => &["at_tick", "duration_ms"],
            FaultKind::Unavailable => &["from_tick", "until_tick"],
            FaultKind::EccBurst => &["device", "at_tick", "xid", "count"],
            FaultKind::NvlinkDown => &["device", "link", "at_tick"],
            FaultKind::NvlinkErrors => &["device", "link", "at_tick", "per_tick"],
        };
        let kind = match self.kind {
            FaultKind::DeviceLost => "device_lost",
            FaultKind::NotSupported => "not_supported",
            FaultKind::NoPermission => "no_permission",
            FaultKind::UnknownError => "unknown_error",
            FaultKind::Hang => "hang",
            FaultKind::Unavailable => "unavailable",
            FaultKind::EccBurst => "ecc_burst",
            FaultKind::NvlinkDown => "nvlink_down",
            FaultKind::NvlinkErrors => "nvlink_errors",
        };
        for (key, present) in [
            ("device", self.device.is_some()),
            ("at_tick", self.at_tick.is_some()),
            ("family", self.family.is_some()),
            ("duration_ms", self.duration_ms.is_some()),
            ("from_tick", self.from_tick.is_some()),
            ("until_tick", self.until_tick.is_some()),
            ("xid", self.xid.is_some()),
            ("count", self.count.is_some()),
            ("link", self.link.is_some()),
            ("per_tick", self.per_tick.is_some()),
        ] {
            if present && !used.contains(&key) {
                return Err(unexpected(key, kind));
            }
        }
        Ok(match self.kind {
            FaultKind::DeviceLost => Fault::DeviceLost {
                device: self.device.ok_or_else(|| missing("device", kind))?,
                at_tick: self.at_tick.ok_or_else(|| missing("at_tick", kind))?,
            },
            FaultKind::NotSupported => {
                Fault::NotSupported { device: self.device, family: self.family.ok_or_else(|| missing("family", kind))? }
            }
            FaultKind::NoPermission => {
                Fault::NoPermission { device: self.device, family: self.family.ok_or_else(|| missing("family", kind))? }
            }
            FaultKind::UnknownError => {
                Fault::UnknownError { device: self.device, family: self.family.ok_or_else(|| missing("family", kind))? }
            }
            FaultKind::Hang => Fault::Hang {
                at_tick: self.at_tick.ok_or_else(|| missing("at_tick", kind))?,
                duration: Duration::from_millis(self.duration_ms.ok_or_else(|| missing("duration_ms", kind))?),
            },
            FaultKind::Unavailable => {
                let from_tick = self.from_tick.unwrap_or(0);
                if self.until_tick.is_some_and(|u| u <= from_tick) {
                    return Err(ConfigError::invalid(format!("faults[{i}].until_tick"), "must be after from_tick"));
                }
                Fault::Unavailable { from_tick, until_tick: self.until_tick }
            }
            FaultKind::EccBurst => Fault::EccBurst {
                device: self.device.ok_or_else(|| missing("device", kind))?,
                at_tick: self.at_tick.ok_or_else(|| missing("at_tick", kind))?,
                xid: self.xid.unwrap_or(48),
                count: self.count.unwrap_or(1),
            },
            FaultKind::NvlinkDown => Fault::NvlinkDown {
                device: self.device.ok_or_else(|| missing("device", kind))?,
                link: self.link.ok_or_else(|| missing("link", kind))?,
                at_tick: self.at_tick.ok_or_else(|| missing("at_tick", kind))?,
            },
            FaultKind::NvlinkErrors => Fault::NvlinkErrors {
                device: self.device.ok_or_else(|| missing("device", kind))?,
                link: self.link.ok_or_else(|| missing("link", kind))?,
                at_tick: self.at_tick.ok_or_else(|| missing("at_tick", kind))?,
                per_tick: self.per_tick.unwrap_or(10),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corpus_entry_loads_as_a_scenario_its_expectations_aside() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/slow-rank-busy-h100x8.toml");
        let s = Scenario::from_file(&path).unwrap();
        assert_eq!(s.name, "slow-rank-busy-h100x8");
        assert!(s.phases.iter().any(|p| p.gpus.as_deref() == Some(&[3][..])), "{s:?}");
        // Still strict elsewhere: a mistyped key is refused.
        let err = Scenario::from_toml_str("[expectt]\nfindings = []\n", "x").unwrap_err();
        assert!(err.to_string().contains("expectt"), "{err}");
    }

    #[test]
    fn builtins_load() {
        for name in Scenario::builtin_names() {
            let s = Scenario::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.name, name);
            assert_eq!(s.tick_period, Duration::from_secs(1));
        }
        // Every built-in is written in phases; only what phases cannot say stays a fault.
        for name in Scenario::builtin_names() {
            let s = Scenario::load(name).unwrap();
            assert!((0..8).all(|g| s.has_phases(g)), "{name}: every GPU runs phases");
            assert_eq!(s.driver_period_s, crate::DEFAULT_DRIVER_PERIOD_S, "{name}");
            assert!(!Scenario::builtin_toml(name).unwrap().contains("workload"), "{name}");
        }
        let lost = Scenario::load("lost-gpu").unwrap();
        assert!(lost.faults.is_empty());
        assert!(lost.phases.iter().any(|p| p.lost && p.gpus.as_deref() == Some(&[3][..]) && p.from_s == 5.0));
        assert_eq!(
            Scenario::load("ecc-burst").unwrap().faults,
            [Fault::EccBurst { device: 1, at_tick: 10, xid: 48, count: 4 }]
        );
        assert!(matches!(Scenario::load("nope"), Err(ConfigError::UnknownName { .. })));
    }

    #[test]
    fn ticks_follow_the_interval_unless_the_scenario_sets_them() {
        let ms = Duration::from_millis;
        assert_eq!(Scenario::builtin("training").unwrap().following_interval(ms(100)).tick_period, ms(100));
        assert_eq!(Scenario::new(Workload::Idle).following_interval(ms(2000)).tick_period, ms(2000));
        let set = Scenario::from_toml_str("tick_period_ms = 250", "x").unwrap();
        assert_eq!(set.following_interval(ms(100)).tick_period, ms(250));
        let built = Scenario::new(Workload::Idle).with_tick_period(ms(500));
        assert_eq!(built.following_interval(ms(100)).tick_period, ms(500));
    }

    #[test]
    fn full_toml() {
        let s = Scenario::from_toml_str(
            r#"
            workload = "idle"
            tick_period_ms = 250
            [devices]
            0 = "training"
            3 = "thermal-throttling"
            [[faults]]
            kind = "no_permission"
            family = "processes"
            [[faults]]
            kind = "hang"
            at_tick = 4
            duration_ms = 1500
            [[faults]]
            kind = "unavailable"
            from_tick = 2
            "#,
            "inline",
        )
        .unwrap();
        assert_eq!(s.name, "inline");
        assert_eq!(s.workload_of(0), Workload::Training);
        assert_eq!(s.workload_of(1), Workload::Idle);
        assert_eq!(s.workload_of(3), Workload::ThermalThrottling);
        assert_eq!(s.tick_period, Duration::from_millis(250));
        assert_eq!(
            s.faults,
            [
                Fault::NoPermission { device: None, family: Family::Processes },
                Fault::Hang { at_tick: 4, duration: Duration::from_millis(1500) },
                Fault::Unavailable { from_tick: 2, until_tick: None },
            ]
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = Scenario::from_toml_str("workload = \"training\"\nwrokload = 1", "x").unwrap_err();
        assert_eq!(e.key(), Some("wrokload"), "{e}");
        let e = Scenario::from_toml_str("workload = \"mining\"", "x").unwrap_err();
        assert!(e.to_string().contains("mining") && e.to_string().contains("dataloader-starved"), "{e}");
        let e = Scenario::from_toml_str("[[faults]]\nkind = \"device_lost\"\ndevice = 1", "x").unwrap_err();
        assert_eq!(e.key(), Some("faults[0].at_tick"), "{e}");
        let e = Scenario::from_toml_str("[[faults]]\nkind = \"hang\"\nat_tick = 1\nduration_ms = 5\ndevice = 2", "x")
            .unwrap_err();
        assert_eq!(e.key(), Some("faults[0].device"), "{e}");
        let e = Scenario::from_toml_str("[devices]\ngpu0 = \"idle\"", "x").unwrap_err();
        assert_eq!(e.key(), Some("devices.gpu0"), "{e}");
        let e = Scenario::from_toml_str("[[faults]]\nkind = \"not_supported\"\nfamily = \"fans\"", "x").unwrap_err();
        assert!(e.to_string().contains("fans"), "{e}");
    }

    #[test]
    fn gate_releases_waiters() {
        let g = Gate::new();
        assert!(!g.wait_timeout(Duration::from_millis(1)));
        let g2 = g.clone();
        let t = std::thread::spawn(move || g2.wait());
        g.release();
        t.join().unwrap();
        assert!(g.is_released() && g.wait_timeout(Duration::ZERO));
    }
}

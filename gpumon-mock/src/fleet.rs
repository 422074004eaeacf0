//! The pure model: a fleet of mock GPUs whose every value is a function of (seed, device, tick).
//!
//! [`MockSampler`](crate::MockSampler) and the fake `libnvidia-ml` both read GPUs through
//! [`MockFleet`], so the two mocks agree value for value. Values are quantised to the units NVML
//! reports (integer percent, MiB-aligned bytes, milliwatts, millijoules, MHz, °C, KB/s), so a
//! reading that goes through the fake NVML and back comes out identical.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use gpumon_core::{
    ClockEventReasons, DeviceFilter, DeviceInfo, DeviceSample, FailureReason, Family, MetricSet, MigInfo,
    ProcessSample, SampleError, SampleRequest, Snapshot, SystemInfo, WindowStats, XidCount,
};

use crate::error::ConfigError;
use crate::gpus::{mhz, GpuModel, MigProfile};
use crate::profile::FleetProfile;
use crate::rng::{hash, Draw};
use crate::scenario::{Fault, Scenario, Workload};

#[path = "fleet_load.rs"]
mod load;
#[path = "nvlink.rs"]
mod nvlink;
pub use nvlink::nvlink_share;

/// The seed used when neither the sampler, the scenario nor the profile sets one.
pub const DEFAULT_SEED: u64 = 0x6770_756D_6F6E; // "gpumon"

/// PCI bus numbers of the eight GPUs of a DGX H100 baseboard; larger fleets use more domains.
const PCI_BUSES: [u32; 8] = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB];

const MIB: u64 = 1024 * 1024;
/// Energy checkpoint spacing, ticks.
const CHECKPOINT: u64 = 256;

/// Independent random streams.
mod stream {
    pub(super) const GPU_UTIL: u64 = 1;
    pub(super) const MEM_UTIL: u64 = 2;
    pub(super) const POWER: u64 = 3;
    pub(super) const TEMP: u64 = 4;
    pub(super) const CLOCK: u64 = 5;
    pub(super) const VIDEO: u64 = 6;
    pub(super) const PCIE_TX: u64 = 8;
    pub(super) const PCIE_RX: u64 = 9;
    pub(super) const MEM_FRAC: u64 = 10;
    pub(super) const GPM: u64 = 11;
    pub(super) const POWER_CAP: u64 = 12;
    pub(super) const WINDOW: u64 = 100;
    /// Driver samples of a starved GPU's utilisation window: `STARVED + k` for sample `k`.
    pub(super) const STARVED: u64 = 1000;
}

/// Highest share of usable memory a workload allocates (`near-oom` approaches it).
const MAX_MEM_FRAC: f64 = 0.995;
/// From this share of usable memory on, MIG instances show their parent's fill without jitter.
const NEAR_FULL: f64 = 0.95;
/// Training's power-cap events: at most one tick per block of this many ticks, so any window
/// of that length holds at most two (≤ 7 % at 30 ticks).
const POWER_CAP_BLOCK: u64 = 30;
/// Share of blocks with a power-cap event.
const POWER_CAP_BLOCK_SHARE: f64 = 0.6;
/// GPUs on phases: the share of the power limit from which the draw counts as at the limit
/// (`sw_power_cap` reads only from there on).
const POWER_CAPPED: f64 = 0.97;
/// `power-capped`: one tick in this many the draw dips below the limit and the cap lifts.
const POWER_CAP_RELIEF: u64 = 25;

/// What a mock device is within the fleet.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum DeviceKind {
    /// A physical GPU; `mig` lists its MIG instances' positions in [`MockFleet::devices`].
    Gpu {
        /// Positions of its MIG instances (empty with MIG off).
        mig: Vec<usize>,
    },
    /// A MIG instance.
    Mig {
        /// Position of the parent GPU in [`MockFleet::devices`].
        parent: usize,
        /// Its profile.
        profile: MigProfile,
    },
}

/// One device of the fleet: its static facts, model and workload.
#[derive(Debug)]
pub struct MockDevice {
    info: Arc<DeviceInfo>,
    model: Arc<GpuModel>,
    kind: DeviceKind,
    position: usize,
    gpu: u32,
    workload: Workload,
    /// Energy at tick 0, mJ (physical GPUs).
    energy_base_mj: u64,
    energy: Mutex<EnergyCache>,
}

impl MockDevice {
    /// Static facts, as every sample carries them.
    pub fn info(&self) -> &Arc<DeviceInfo> {
        &self.info
    }
    /// The GPU model (for a MIG instance: its parent's).
    pub fn model(&self) -> &GpuModel {
        &self.model
    }
    /// Physical GPU or MIG instance.
    pub fn kind(&self) -> &DeviceKind {
        &self.kind
    }
    /// NVML index of the physical GPU (the parent's for a MIG instance).
    pub fn gpu_index(&self) -> u32 {
        self.gpu
    }
    /// The workload it runs.
    pub fn workload(&self) -> Workload {
        self.workload
    }
    /// Position in [`MockFleet::devices`].
    pub fn position(&self) -> usize {
        self.position
    }
    /// Whether this is a MIG instance.
    pub fn is_mig(&self) -> bool {
        matches!(self.kind, DeviceKind::Mig { .. })
    }
    /// For a physical GPU, whether MIG mode is on (it has instances).
    pub fn mig_enabled(&self) -> bool {
        matches!(&self.kind, DeviceKind::Gpu { mig } if !mig.is_empty())
    }
}

#[derive(Debug, Default)]
struct EnergyCache {
    /// Energy (mJ) at ticks 0, CHECKPOINT, 2·CHECKPOINT, …
    checkpoints: Vec<u64>,
    /// The last tick computed and its energy.
    last: Option<(u64, u64)>,
}

/// A physical GPU's activity at one tick, in NVML units.
#[derive(Clone, Copy, Debug)]
struct Load {
    gpu_pct: u32,
    mem_pct: u32,
    dec_pct: u32,
    /// Fraction of usable memory allocated.
    mem_frac: f64,
    power_mw: u64,
    limit_mw: u64,
    temp_c: u32,
    sm_mhz: u32,
    mem_mhz: u32,
    video_mhz: u32,
    reasons: u64,
    busy: bool,
    tx_kbps: u64,
    rx_kbps: u64,
    tensor_share: f64,
    /// Share of the interval the GPU was busy (the mean of its driver samples), ratio; what
    /// GPM activities scale with.
    activity: f64,
    /// GPM DRAM bandwidth, ratio of peak.
    dram: f64,
    /// The GPU-utilisation window when the workload shapes it itself (dips within the interval).
    util_window: Option<WindowStats>,
    /// Spread of the other driver samples around the latest when `util_window` is `None`.
    util_spread: f64,
    /// Spread of the power window's samples, share of the limit.
    power_spread: f64,
    /// The GPU runs a timeline: `util_window` is exactly the driver's samples in the interval,
    /// `None` when it took none.
    timeline: bool,
}

/// A fleet of mock GPUs: the pure model behind both mocks.
///
/// Devices are listed physical GPU first, followed by its MIG instances. Everything a sample
/// holds is a pure function of the seed, the device's position and the tick; the only state kept
/// is a cache of the energy integral, which does not change results.
#[derive(Debug)]
pub struct MockFleet {
    seed: u64,
    system: Arc<SystemInfo>,
    infos: Vec<Arc<DeviceInfo>>,
    devices: Vec<MockDevice>,
    gpu_positions: Vec<usize>,
    tick_period: Duration,
    faults: Vec<Fault>,
    epoch: SystemTime,
    /// By physical GPU index: its timeline when the scenario gives it phases.
    timelines: Vec<Option<crate::timeline::GpuTimeline>>,
    /// By device position: the position whose processes it lists — the first GPU of its
    /// scenario's `one_process` group (one program driving them all), else its own.
    process_of: Vec<usize>,
    /// By device position: whether it is in a `one_process` group (its program alone runs on it).
    in_one_process: Vec<bool>,
}

impl MockFleet {
    /// Builds the fleet `profile` describes, running `scenario`, with identities and values
    /// derived from `seed`. The XID `last_seen` epoch is now (see [`MockFleet::with_epoch`]).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] if the scenario names a GPU the fleet does not have.
    pub fn new(profile: &FleetProfile, scenario: &Scenario, seed: u64) -> Result<Self, ConfigError> {
        let gpu_count = profile.gpus.len();
        for &i in scenario.device_workloads.keys() {
            if i as usize >= gpu_count {
                return Err(ConfigError::invalid(format!("devices.{i}"), format!("the fleet has {gpu_count} GPUs")));
            }
        }
        for (n, f) in scenario.faults.iter().enumerate() {
            if let Some(d) = f.device() {
                if d as usize >= gpu_count {
                    return Err(ConfigError::invalid(
                        format!("faults[{n}].device"),
                        format!("GPU {d} does not exist; the fleet has {gpu_count} GPUs"),
                    ));
                }
            }
            if let Fault::NvlinkDown { device, link, .. } | Fault::NvlinkErrors { device, link, .. } = *f {
                let links = profile.gpus[device as usize].model.nvlink_links;
                if link >= links {
                    return Err(ConfigError::invalid(
                        format!("faults[{n}].link"),
                        format!("GPU {device} has {links} NVLink links (0..{links})"),
                    ));
                }
            }
        }
        // A phase may name GPUs beyond the fleet (a scenario written for eight GPUs runs on
        // four), but not only those: that is a typo or the wrong fleet.
        for (n, p) in scenario.phases.iter().enumerate() {
            if let Some(gpus) = p.gpus.as_ref().filter(|g| !g.is_empty() && g.iter().all(|&d| d as usize >= gpu_count))
            {
                return Err(ConfigError::invalid(
                    format!("phases[{n}].gpus"),
                    format!("GPU {} does not exist; the fleet has {gpu_count} GPUs", gpus[0]),
                ));
            }
        }
        let timelines = (0..gpu_count as u32)
            .map(|g| {
                scenario.has_phases(g).then(|| crate::timeline::GpuTimeline {
                    gpu: g,
                    phases: scenario.phases.clone(),
                    seed,
                    period: scenario.driver_period_s,
                    phase_offset: (hash(&[seed, 0xD5, u64::from(g)]) % 1_000_000) as f64 / 1e6
                        * scenario.driver_period_s,
                })
            })
            .collect();
        let mut system = SystemInfo::new(gpumon_core::hostname(), "mock");
        system.driver_version = Some(profile.driver_version.clone());
        system.cuda_driver_version = Some(profile.cuda_driver_version);
        system.nvml_version = Some(profile.nvml_version.clone());

        let mut devices = Vec::new();
        let mut gpu_positions = Vec::with_capacity(gpu_count);
        for (g, spec) in profile.gpus.iter().enumerate() {
            let index = g as u32;
            let model = Arc::new(spec.model.clone());
            let uuid = format_uuid("GPU", seed, index, 0);
            let domain = g / PCI_BUSES.len();
            let bus = PCI_BUSES[g % PCI_BUSES.len()];
            let pci = format!("{domain:08X}:{bus:02X}:00.0");
            let serial = format!("{}", 1_650_000_000_000 + hash(&[seed, 0x5E, u64::from(index)]) % 10_000_000_000);
            let info = Arc::new(model.device_info(index, uuid.clone(), pci, Some(serial)));
            let position = devices.len();
            gpu_positions.push(position);
            let workload = scenario.workload_of(index);
            let mig_positions: Vec<usize> = (0..spec.mig.len()).map(|m| position + 1 + m).collect();
            devices.push(MockDevice {
                info,
                model: model.clone(),
                kind: DeviceKind::Gpu { mig: mig_positions },
                position,
                gpu: index,
                workload,
                // Energy since the driver loaded: a few days at a few hundred watts.
                energy_base_mj: 1_000_000_000 + hash(&[seed, 0xE0, u64::from(index)]) % 100_000_000_000,
                energy: Mutex::new(EnergyCache::default()),
            });
            for (m, profile) in spec.mig.iter().enumerate() {
                let m = m as u32;
                let mut d = DeviceInfo::new(index, format_uuid("MIG", seed, index, m + 1), {
                    format!("{} MIG {}", model.name, profile.name)
                });
                d.pci_bus_id = devices[position].info.pci_bus_id.clone();
                d.architecture = Some(model.architecture.clone());
                d.memory_total_bytes = Some(profile.memory_bytes);
                let mut mig = MigInfo::new(uuid.clone(), m, m + 1, 0);
                mig.profile = Some(profile.name.clone());
                d.mig = Some(mig);
                devices.push(MockDevice {
                    info: Arc::new(d),
                    model: model.clone(),
                    kind: DeviceKind::Mig { parent: position, profile: profile.clone() },
                    position: position + 1 + m as usize,
                    gpu: index,
                    workload,
                    energy_base_mj: 0,
                    energy: Mutex::new(EnergyCache::default()),
                });
            }
        }
        let mut process_of: Vec<usize> = (0..devices.len()).collect();
        let mut in_one_process = vec![false; devices.len()];
        for group in &scenario.one_process {
            // GPUs beyond the fleet are ignored, as phases' are.
            let members: Vec<usize> = group.iter().filter_map(|&g| gpu_positions.get(g as usize).copied()).collect();
            if let Some(&first) = members.first() {
                for &m in &members {
                    process_of[m] = first;
                    in_one_process[m] = true;
                }
            }
        }
        Ok(Self {
            seed,
            system: Arc::new(system),
            infos: devices.iter().map(|d| d.info.clone()).collect(),
            devices,
            gpu_positions,
            tick_period: scenario.tick_period,
            faults: scenario.faults.clone(),
            epoch: SystemTime::now(),
            timelines,
            process_of,
            in_one_process,
        })
    }

    /// Builder-style: the instant tick 0 corresponds to (used for XID `last_seen`). Set it to
    /// compare samples from two fleets field for field.
    #[must_use]
    pub fn with_epoch(mut self, epoch: SystemTime) -> Self {
        self.epoch = epoch;
        self
    }

    /// Every device (physical GPUs, each followed by its MIG instances).
    pub fn devices(&self) -> &[Arc<DeviceInfo>] {
        &self.infos
    }

    /// The device at `position` in [`MockFleet::devices`], with its model and workload.
    pub fn device(&self, position: usize) -> Option<&MockDevice> {
        self.devices.get(position)
    }

    /// Every device with its model and workload.
    pub fn mock_devices(&self) -> &[MockDevice] {
        &self.devices
    }

    /// Number of physical GPUs.
    pub fn gpu_count(&self) -> usize {
        self.gpu_positions.len()
    }

    /// Position in [`MockFleet::devices`] of physical GPU `index`.
    pub fn gpu_position(&self, index: u32) -> Option<usize> {
        self.gpu_positions.get(index as usize).copied()
    }

    /// Host-wide facts: backend `"mock"`, this host's name, the profile's driver versions.
    pub fn system(&self) -> Arc<SystemInfo> {
        self.system.clone()
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Simulated time between ticks.
    pub fn tick_period(&self) -> Duration {
        self.tick_period
    }

    /// The scheduled faults.
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    /// The instant tick 0 corresponds to.
    pub fn epoch(&self) -> SystemTime {
        self.epoch
    }

    /// Whether the backend is unavailable at `tick` ([`Fault::Unavailable`]).
    pub fn is_unavailable(&self, tick: u64) -> bool {
        self.faults.iter().any(|f| {
            matches!(f, Fault::Unavailable { from_tick, until_tick }
                if tick >= *from_tick && until_tick.is_none_or(|u| tick < u))
        })
    }

    /// The hang scheduled for `tick`, if any ([`Fault::Hang`] or [`Fault::HangUntilReleased`]).
    pub fn hang_at(&self, tick: u64) -> Option<&Fault> {
        self.faults.iter().find(
            |f| matches!(f, Fault::Hang { at_tick, .. } | Fault::HangUntilReleased { at_tick, .. } if *at_tick == tick),
        )
    }

    /// Whether physical GPU `gpu` is lost at `tick` ([`Fault::DeviceLost`], sticky).
    pub fn is_lost(&self, gpu: u32, tick: u64) -> bool {
        self.faults
            .iter()
            .any(|f| matches!(f, Fault::DeviceLost { device, at_tick } if *device == gpu && tick >= *at_tick))
            || self.timeline(gpu).is_some_and(|t| t.phase_at(self.tick_end(tick)).is_some_and(|p| p.lost))
    }

    fn timeline(&self, gpu: u32) -> Option<&crate::timeline::GpuTimeline> {
        self.timelines.get(gpu as usize).and_then(Option::as_ref)
    }

    /// When the training loop on physical GPU `gpu` marked the end of a step during `tick`'s
    /// interval, oldest first: the cycle ends of the scenario's phases with `steps = true`
    /// ([`Phase::steps`](crate::Phase::steps)), on the clock of the snapshots' `taken_at`
    /// ([`MockFleet::epoch`] + simulated time). A test feeds them to
    /// [`StepRegistry::record_at`](gpumon_core::steps::StepRegistry::record_at) to mark the
    /// steps a real loop would have marked.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gpumon_mock::{FleetProfile, MockFleet, Scenario};
    ///
    /// let scenario = Scenario::from_toml_str(
    ///     "name = \"marked\"\n[[phases]]\nshape = \"square\"\nbusy_s = 0.2\nidle_s = 0.3\nsteps = true\n",
    ///     "marked",
    /// )?
    /// .with_tick_period(Duration::from_secs(1));
    /// let fleet = MockFleet::new(&FleetProfile::load("a100x4")?, &scenario, 1)?;
    /// assert_eq!(fleet.step_marks(0, 3).len(), 2); // 0.5 s steps in the third second
    /// # Ok::<(), gpumon_mock::ConfigError>(())
    /// ```
    pub fn step_marks(&self, gpu: u32, tick: u64) -> Vec<SystemTime> {
        let Some(timeline) = self.timeline(gpu) else { return Vec::new() };
        let end = self.tick_end(tick);
        timeline
            .step_marks(end - self.tick_period.as_secs_f64(), end)
            .into_iter()
            .map(|t| self.epoch + Duration::from_secs_f64(t.max(0.0)))
            .collect()
    }

    /// The simulated time at the end of `tick`'s interval, seconds.
    fn tick_end(&self, tick: u64) -> f64 {
        tick as f64 * self.tick_period.as_secs_f64()
    }

    /// Samples every device `request.devices` allows at `tick`. Hidden devices are skipped
    /// before anything about them is computed.
    ///
    /// # Errors
    /// [`SampleError::Unavailable`] while a [`Fault::Unavailable`] is in force.
    pub fn snapshot(&self, tick: u64, request: &SampleRequest) -> Result<Snapshot, SampleError> {
        if self.is_unavailable(tick) {
            return Err(SampleError::unavailable(format!(
                "mock backend: driver not loaded (scripted fault at tick {tick})"
            )));
        }
        // As the NVML backend: CUDA-ordered indices are refused on a mixed fleet.
        request
            .devices
            .check_device_order(self.infos.iter().map(|i| &**i))
            .map_err(|e| SampleError::Backend(Box::new(e)))?;
        Ok(Snapshot::new(self.system(), self.sample(tick, request.metrics, &request.devices)))
    }

    /// Samples the devices `filter` allows at `tick`; an ambiguous UUID prefix selects nothing
    /// ([`DeviceFilter::apply`]).
    pub fn sample(&self, tick: u64, metrics: MetricSet, filter: &DeviceFilter) -> Vec<DeviceSample> {
        let mut out: Vec<DeviceSample> = (0..self.devices.len())
            .filter(|&p| filter.allows(&self.infos[p]))
            .filter_map(|p| self.sample_device(p, tick, metrics))
            .collect();
        filter.apply(&mut out);
        out
    }

    /// One device's sample at `tick`: a pure function of seed, position and tick. `None` if
    /// there is no device at `position`.
    pub fn sample_device(&self, position: usize, tick: u64, metrics: MetricSet) -> Option<DeviceSample> {
        let dev = self.devices.get(position)?;
        if self.is_lost(dev.gpu, tick) {
            return Some(DeviceSample::lost(dev.info.clone()));
        }
        let mut s = match &dev.kind {
            DeviceKind::Gpu { mig } => self.sample_gpu(dev, mig, tick, metrics),
            DeviceKind::Mig { parent, profile } => self.sample_mig(dev, *parent, profile, tick, metrics),
        };
        self.apply_family_faults(dev.gpu, metrics, &mut s);
        Some(s)
    }

    /// Energy counter of physical GPU at `position` at `tick`, mJ: the integral of the reported
    /// power over the ticks so far.
    fn energy_mj(&self, position: usize, tick: u64) -> u64 {
        let dev = &self.devices[position];
        let period_ms = u64::try_from(self.tick_period.as_millis()).unwrap_or(u64::MAX);
        let step = |k: u64| {
            let p = self.load(position, k).power_mw;
            u64::try_from(u128::from(p) * u128::from(period_ms) / 1000).unwrap_or(u64::MAX)
        };
        let mut cache = dev.energy.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.checkpoints.is_empty() {
            cache.checkpoints.push(dev.energy_base_mj);
        }
        // Start from the latest known point at or before `tick`.
        let cp = ((tick / CHECKPOINT) as usize).min(cache.checkpoints.len() - 1);
        let (mut k, mut e) = (cp as u64 * CHECKPOINT, cache.checkpoints[cp]);
        if let Some((lt, le)) = cache.last {
            if lt <= tick && lt > k {
                (k, e) = (lt, le);
            }
        }
        while k < tick {
            k += 1;
            e = e.saturating_add(step(k));
            if k % CHECKPOINT == 0 && cache.checkpoints.len() as u64 == k / CHECKPOINT {
                cache.checkpoints.push(e);
            }
        }
        cache.last = Some((tick, e));
        e
    }

    fn sample_gpu(&self, dev: &MockDevice, mig: &[usize], tick: u64, metrics: MetricSet) -> DeviceSample {
        let position = dev.position;
        let m = &*dev.model;
        let caps = m.capabilities;
        let l = self.load(position, tick);
        let d = Draw::new(self.seed, position, tick);
        let mig_mode = !mig.is_empty();
        let mut s = DeviceSample::new(dev.info.clone());
        let usable = m.memory_total_bytes - m.memory_reserved_bytes;
        let used = if mig_mode {
            mig.iter()
                .map(|&p| match &self.devices[p].kind {
                    DeviceKind::Mig { profile, .. } => mig_used(self.seed, p, tick, &l, profile.memory_bytes),
                    DeviceKind::Gpu { .. } => 0,
                })
                .sum::<u64>()
        } else {
            align_down(l.mem_frac * usable as f64)
        };
        let ratio = |p: u32| f64::from(p) / 100.0;

        // In MIG mode NVML reports no whole-GPU utilisation.
        if metrics.contains(Family::Utilization) && !mig_mode {
            s.utilization.gpu = Some(ratio(l.gpu_pct));
            s.utilization.memory = Some(ratio(l.mem_pct));
            s.utilization.encoder = caps.encoder.then_some(0.0);
            s.utilization.decoder = caps.decoder.then(|| ratio(l.dec_pct));
        }
        if metrics.contains(Family::Memory) {
            s.memory.total = Some(m.memory_total_bytes);
            s.memory.reserved = Some(m.memory_reserved_bytes);
            s.memory.used = Some(used);
            s.memory.free = Some(usable - used);
        }
        if metrics.contains(Family::Temperature) {
            s.temperature.gpu = Some(f64::from(l.temp_c));
            s.temperature.memory =
                caps.memory_temperature.then(|| f64::from((l.temp_c + 4 + u32::from(l.busy) * 3).min(95)));
        }
        if metrics.contains(Family::Power) {
            s.power.usage_watts = Some(mw_to_watts(l.power_mw));
            s.power.limit_watts = Some(mw_to_watts(l.limit_mw));
        }
        if metrics.contains(Family::Energy) {
            s.power.energy_joules = Some(self.energy_mj(position, tick) as f64 / 1000.0);
        }
        if metrics.contains(Family::Clocks) {
            s.clocks.graphics = Some(mhz(l.sm_mhz.min(m.max_graphics_clock_mhz)));
            s.clocks.sm = Some(mhz(l.sm_mhz));
            s.clocks.memory = Some(mhz(l.mem_mhz));
            s.clocks.video = Some(mhz(l.video_mhz));
        }
        if metrics.contains(Family::Fan) && caps.fan {
            let heat = f64::from(l.temp_c) - m.temperature_idle_celsius;
            s.fan_speed = Some((30.0 + heat * 1.4).clamp(30.0, 100.0).floor() / 100.0);
        }
        if metrics.contains(Family::PerformanceState) {
            s.performance_state = Some(if !l.busy && caps.fan { 8 } else { 0 });
        }
        if metrics.contains(Family::ClockEvents) || metrics.contains(Family::ClockEventsByReason) {
            s.clock_event_reasons = Some(ClockEventReasons(l.reasons));
        }
        if metrics.contains(Family::PcieLink) {
            // Idle links train down to gen 1 to save power; traffic (copies while the SMs wait)
            // keeps a link trained up as work does.
            let link = pcie_link_kbps(m.pcie_max_link_generation, m.pcie_max_link_width);
            let carrying = l.rx_kbps.max(l.tx_kbps) as f64 > 0.05 * link;
            s.pcie.link_generation = Some(if l.busy || carrying { m.pcie_max_link_generation } else { 1 });
            s.pcie.link_width = Some(m.pcie_max_link_width);
            s.pcie.replays = Some(0);
        }
        if metrics.contains(Family::PcieThroughput) {
            s.pcie.tx_bytes_per_second = Some(l.tx_kbps as f64 * 1024.0);
            s.pcie.rx_bytes_per_second = Some(l.rx_kbps as f64 * 1024.0);
        }
        let (burst, xids) = self.ecc_bursts(dev.gpu, tick);
        if metrics.contains(Family::Ecc) && caps.ecc {
            s.ecc.corrected = Some(0);
            s.ecc.uncorrected = Some(burst);
        }
        if metrics.contains(Family::RetiredPages) && caps.ecc && caps.page_retirement {
            s.ecc.retired_pages_single_bit = Some(0);
            s.ecc.retired_pages_double_bit = Some(burst);
            s.ecc.retired_pages_pending = Some(burst > 0);
        }
        if metrics.contains(Family::RemappedRows) && caps.ecc && caps.row_remapping {
            s.ecc.remapped_rows_correctable = Some(0);
            s.ecc.remapped_rows_uncorrectable = Some(burst);
            s.ecc.remapped_rows_pending = Some(burst > 0);
            s.ecc.remapped_rows_failure = Some(false);
        }
        if metrics.contains(Family::Xid) {
            s.xid_errors = xids;
        }
        if metrics.contains(Family::Processes) && !mig_mode {
            s.processes = processes(self.seed, self.process_of[position], self.in_one_process[position], &l, used);
        }
        if metrics.contains(Family::HighResolution) {
            let n = self.window_len();
            let w = |v: f64, spread: f64, hi: f64, s: u64, quantum: f64| window(d, s, n, v, spread, hi, quantum);
            if !mig_mode {
                s.windows.gpu_utilization = if l.timeline {
                    l.util_window
                } else {
                    Some(l.util_window.unwrap_or_else(|| w(ratio(l.gpu_pct), l.util_spread, 1.0, 1, 0.01)))
                };
                s.windows.memory_utilization = Some(w(ratio(l.mem_pct), 0.04, 1.0, 2, 0.01));
            }
            let limit = mw_to_watts(l.limit_mw);
            s.windows.power_watts = Some(w(mw_to_watts(l.power_mw), l.power_spread * limit, limit, 3, 0.001));
            s.windows.sm_clock =
                Some(w(mhz(l.sm_mhz), 0.03 * mhz(m.max_sm_clock_mhz), mhz(m.max_sm_clock_mhz), 4, 1e6));
            let max_mem = mhz(m.max_memory_clock_mhz);
            s.windows.memory_clock = Some(w(mhz(l.mem_mhz), 0.0, max_mem, 5, 1e6));
        }
        if metrics.contains(Family::Gpm) && caps.gpm {
            gpm(&mut s, d, &l);
        }
        if metrics.contains(Family::Nvlink) || metrics.contains(Family::NvlinkLinks) {
            s.nvlink = self.nvlink(dev, tick).map(|nv| nv.with_per_link(metrics.contains(Family::NvlinkLinks)));
        }
        s
    }

    fn sample_mig(
        &self,
        dev: &MockDevice,
        parent: usize,
        profile: &MigProfile,
        tick: u64,
        metrics: MetricSet,
    ) -> DeviceSample {
        let l = self.load(parent, tick);
        let position = dev.position;
        let mut s = DeviceSample::new(dev.info.clone());
        let used = mig_used(self.seed, position, tick, &l, profile.memory_bytes);
        if metrics.contains(Family::Memory) {
            s.memory.total = Some(profile.memory_bytes);
            s.memory.reserved = Some(0);
            s.memory.used = Some(used);
            s.memory.free = Some(profile.memory_bytes - used);
        }
        if metrics.contains(Family::Processes) {
            s.processes = processes(self.seed, position, false, &l, used);
        }
        if metrics.contains(Family::Gpm) && dev.model.capabilities.gpm {
            gpm(&mut s, Draw::new(self.seed, position, tick), &l);
        }
        s
    }

    /// Uncorrectable ECC errors so far and the XID counts, for physical GPU `gpu` at `tick`.
    fn ecc_bursts(&self, gpu: u32, tick: u64) -> (u64, Vec<XidCount>) {
        let mut total = 0;
        let mut xids: Vec<XidCount> = Vec::new();
        for f in &self.faults {
            if let Fault::EccBurst { device, at_tick, xid, count } = *f {
                if device != gpu || at_tick > tick {
                    continue;
                }
                total += count;
                let when = self.epoch + self.tick_period.saturating_mul(u32::try_from(at_tick).unwrap_or(u32::MAX));
                match xids.iter_mut().find(|x| x.code == xid) {
                    Some(x) => {
                        x.count += count;
                        x.last_seen = x.last_seen.max(when);
                    }
                    None => xids.push(XidCount::new(xid, count, when)),
                }
            }
        }
        xids.sort_by_key(|x| x.code);
        (total, xids)
    }

    fn apply_family_faults(&self, gpu: u32, metrics: MetricSet, s: &mut DeviceSample) {
        for f in &self.faults {
            let (device, family, denied) = match f {
                Fault::NotSupported { device, family } => (device, family, None),
                Fault::NoPermission { device, family } => (device, family, Some(FailureReason::NoPermission)),
                Fault::UnknownError { device, family } => {
                    (device, family, Some(FailureReason::Other(crate::scenario::UNKNOWN_ERROR.to_owned())))
                }
                _ => continue,
            };
            if device.is_some_and(|d| d != gpu) || !metrics.contains(*family) {
                continue;
            }
            s.clear_family(*family);
            if let Some(reason) = denied {
                if !s.errors.iter().any(|e| e.family == *family) {
                    s.record_failure(*family, reason);
                }
            }
        }
    }

    /// Driver samples per interval for the high-resolution windows (about one per 100 ms).
    fn window_len(&self) -> u32 {
        u32::try_from(self.tick_period.as_millis() / 100).unwrap_or(u32::MAX).clamp(1, 20)
    }
}

fn gpm(s: &mut DeviceSample, d: Draw, l: &Load) {
    // GPM counts over the whole interval, so it follows the interval's mean activity, not the
    // latest driver sample.
    let gpu = round4(l.activity.clamp(0.0, 1.0));
    let sm = round4(gpu * d.range(stream::GPM + 1, 0.80, 0.92));
    s.gpm.graphics_activity = Some(gpu);
    s.gpm.sm_activity = Some(sm);
    s.gpm.sm_occupancy = Some(round4(sm * d.range(stream::GPM + 2, 0.45, 0.65)));
    s.gpm.tensor_activity = Some(round4(sm * l.tensor_share));
    s.gpm.dram_bandwidth = Some(round4(l.dram.clamp(0.0, 1.0)));
}

/// Memory a MIG instance has allocated.
fn mig_used(seed: u64, position: usize, tick: u64, l: &Load, total: u64) -> u64 {
    let jitter = Draw::new(seed, position, tick).range(stream::MEM_FRAC, -0.02, 0.02);
    let frac = if l.mem_frac >= NEAR_FULL {
        // A nearly full instance (`near-oom`) follows its parent's fill exactly, so it too never
        // frees memory.
        l.mem_frac
    } else if l.mem_frac > 0.0 {
        (l.mem_frac + jitter).clamp(0.0, 0.95)
    } else {
        0.0
    };
    align_down(frac * total as f64)
}

/// A few stable processes sharing the device's memory and utilisation; `position`: the device
/// whose processes they are (GPUs one process drives together name the same one); `shared`:
/// one program drives this GPU with others, and it alone runs on it.
fn processes(seed: u64, position: usize, shared: bool, l: &Load, used: u64) -> Vec<ProcessSample> {
    if used == 0 {
        return Vec::new();
    }
    let h = hash(&[seed, 0x9D, position as u64]);
    let pid = |slot: u64| 1000 + (hash(&[seed, 0x9D, position as u64, slot]) % 60_000) as u32;
    let gpu = f64::from(l.gpu_pct) / 100.0;
    let mem = f64::from(l.mem_pct) / 100.0;
    let mk = |slot: u64, name: &str, memory: u64, share: f64| {
        let mut p = ProcessSample::new(pid(slot));
        p.name = Some(name.to_owned());
        p.memory_used = Some(memory);
        p.sm_utilization = Some((gpu * share * 100.0).floor() / 100.0);
        p.memory_utilization = Some((mem * share * 100.0).floor() / 100.0);
        p.encoder_utilization = Some(0.0);
        p.decoder_utilization = Some(0.0);
        p
    };
    if !shared && h.is_multiple_of(3) && used >= 4 * 2 * MIB {
        // A notebook shares the GPU with the main job.
        let side = align_down(used as f64 / 16.0);
        vec![mk(0, "python3", used - side, 0.9), mk(1, "jupyter-kernel", side, 0.1)]
    } else {
        vec![mk(0, "python3", used, 1.0)]
    }
}

/// `n` driver samples around `value` (which is the latest of them), within `0..=hi`.
fn window(d: Draw, s: u64, n: u32, value: f64, spread: f64, hi: f64, quantum: f64) -> WindowStats {
    // Floor to the driver's resolution; dividing by an integer keeps e.g. milliwatts exact.
    let q = |v: f64| {
        let stepped = if quantum >= 1.0 {
            (v / quantum).floor() * quantum
        } else {
            let per_unit = (1.0 / quantum).round();
            (v * per_unit).floor() / per_unit
        };
        stepped.clamp(0.0, hi)
    };
    let earlier = (1..n).map(|k| q(value + d.range(stream::WINDOW + s * 64 + u64::from(k), -spread, spread)));
    let mut w = WindowStats::from_values(earlier.chain([value])).unwrap_or_default();
    // Guard against rounding in the mean: it lies within [min, max] by construction.
    w.mean = w.mean.clamp(w.min, w.max);
    w
}

/// Whether a training GPU is at one of its short power-cap events at `tick`: at most one tick in
/// each block of [`POWER_CAP_BLOCK`] ticks, in [`POWER_CAP_BLOCK_SHARE`] of the blocks — a
/// brief excursion to the limit (a burst of large GEMMs), never a sustained cap.
fn power_cap_blip(seed: u64, position: usize, tick: u64) -> bool {
    let block = tick / POWER_CAP_BLOCK;
    let d = Draw::new(seed, position, block);
    let at = (d.unit(stream::POWER_CAP + 1) * POWER_CAP_BLOCK as f64) as u64;
    d.unit(stream::POWER_CAP) < POWER_CAP_BLOCK_SHARE && tick % POWER_CAP_BLOCK == at
}

/// A starved GPU's utilisation over one interval.
struct StarvedWindow {
    /// The interval's driver samples.
    stats: WindowStats,
    /// The latest of them: the instantaneous reading.
    latest: f64,
}

/// Most driver samples in a window ([`MockFleet::window_len`] caps there).
const MAX_WINDOW: usize = 20;

/// `n` driver samples of a GPU starved by its input pipeline: it runs a batch (85–97 %) for
/// `busy` samples out of every `cycle`, then waits for the next one (0–3 %) — at 100 ms per
/// sample a step every 300 ms (a third of it busy) or 500 ms (two fifths), by device.
fn starved_window(seed: u64, position: usize, tick: u64, n: u32) -> StarvedWindow {
    let h = hash(&[seed, 0x57, position as u64]);
    let (cycle, busy) = if h.is_multiple_of(2) { (3, 1) } else { (5, 2) };
    let off = (h >> 8) % cycle;
    let n = (n as usize).clamp(1, MAX_WINDOW);
    // Sample k = 0 is the oldest, n - 1 the latest. The phase moves on one sample per tick, so
    // the instantaneous reading is busy on exactly busy/cycle of the ticks and jumps between
    // ~0 and ~95 % as `nvidia-smi` shows it for such a job.
    let mut running = [false; MAX_WINDOW];
    for (k, r) in running.iter_mut().enumerate().take(n) {
        *r = (tick + k as u64 + off) % cycle < busy;
    }
    // A window shorter than a cycle still shows both a batch and a wait.
    if n >= 2 {
        let busy_samples = running[..n].iter().filter(|&&r| r).count();
        if busy_samples == 0 {
            running[0] = true;
        } else if busy_samples == n {
            running[0] = false;
        }
    }
    let d = Draw::new(seed, position, tick);
    let mut values = [0.0; MAX_WINDOW];
    for (k, v) in values.iter_mut().enumerate().take(n) {
        let s = stream::STARVED + k as u64;
        let pct = if running[k] { d.range(s, 85.0, 98.0) } else { d.range(s, 0.0, 4.0) };
        *v = pct.floor() / 100.0;
    }
    let mut stats = WindowStats::from_values(values[..n].iter().copied()).unwrap_or_default();
    stats.mean = stats.mean.clamp(stats.min, stats.max);
    StarvedWindow { stats, latest: values[n - 1] }
}

/// `near-oom`'s share of usable memory at `tick`: from 95.5 % of the total, rising ever more
/// slowly toward 99 % (a cache or a fragmenting allocator that only grows), never falling.
fn near_oom_fraction(m: &GpuModel, tick: u64) -> f64 {
    let t = tick as f64;
    let of_total = 0.955 + 0.035 * t / (t + 900.0);
    let usable = (m.memory_total_bytes - m.memory_reserved_bytes) as f64;
    (of_total * m.memory_total_bytes as f64 / usable).min(MAX_MEM_FRAC)
}

/// One direction of a PCIe link's bandwidth, in the KB/s (1024 bytes) NVML reports throughput
/// in: per-lane GB/s after encoding overhead (gen 1–2 8b/10b, gen 3–5 128b/130b, gen 6 FLIT).
fn pcie_link_kbps(generation: u32, width: u32) -> f64 {
    let per_lane_gbs = match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        _ => 7.563,
    };
    per_lane_gbs * f64::from(width) * 1e9 / 1024.0
}

fn align_down(bytes: f64) -> u64 {
    let b = bytes.max(0.0) as u64;
    b / (2 * MIB) * (2 * MIB)
}

fn round4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

fn watts_to_mw(w: f64) -> u64 {
    (w * 1000.0).round().max(0.0) as u64
}

fn mw_to_watts(mw: u64) -> f64 {
    mw as f64 / 1000.0
}

/// `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from (seed, gpu, mig slot).
fn format_uuid(prefix: &str, seed: u64, gpu: u32, mig: u32) -> String {
    let a = hash(&[seed, 0x0D, u64::from(gpu), u64::from(mig)]);
    let b = hash(&[seed, 0x0E, u64::from(gpu), u64::from(mig)]);
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format() {
        let u = format_uuid("GPU", 1, 0, 0);
        assert_eq!(u.len(), 40, "{u}");
        let parts: Vec<&str> = u.split('-').collect();
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [3, 8, 4, 4, 4, 12]);
        assert!(u[4..].chars().all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(u, format_uuid("GPU", 1, 1, 0));
        assert_ne!(u, format_uuid("GPU", 2, 0, 0));
        assert!(format_uuid("MIG", 1, 0, 1).starts_with("MIG-"));
    }

    #[test]
    fn window_contains_value() {
        let d = Draw::new(3, 0, 9);
        for n in [1, 10, 20] {
            let w = window(d, 1, n, 0.5, 0.1, 1.0, 0.01);
            assert!(w.min <= 0.5 && 0.5 <= w.max && w.min <= w.mean && w.mean <= w.max, "{w:?}");
            assert_eq!(w.count, n);
        }
        let w = window(d, 1, 10, 1.0, 0.1, 1.0, 0.01);
        assert!(w.max <= 1.0);
    }

    fn phases(src: &str, profile: &str) -> Result<MockFleet, ConfigError> {
        MockFleet::new(&FleetProfile::load(profile).unwrap(), &Scenario::from_toml_str(src, "test").unwrap(), 1)
    }

    #[test]
    fn the_power_cap_lifts_when_the_draw_leaves_the_limit() {
        // Pinned at the limit, with a 1 s dip to 90 % every 5 s (seconds 0-1, 5-6, …).
        let f = phases(
            "[[phases]]\nshape = \"dips\"\nbusy = 0.98\nidle = 0.9\nperiod_s = 5.0\ndip_s = 1.0\npower = 1.0\nreasons = [\"sw_power_cap\"]",
            "h100x8",
        )
        .unwrap();
        for tick in 1..=10 {
            let l = f.load(0, tick);
            let capped = l.reasons & ClockEventReasons::SW_POWER_CAP != 0;
            let at_limit = l.power_mw as f64 >= POWER_CAPPED * l.limit_mw as f64;
            assert_eq!(capped, at_limit, "tick {tick}: {l:?}");
            assert_eq!(capped, tick % 5 != 1, "tick {tick}: the dip is the tick after each 5th second");
        }
    }

    #[test]
    fn a_gpu_with_nothing_running_idles_its_clocks() {
        let f = phases("[[phases]]\nbusy = 0.0\nmemory = 0.4", "h100x8").unwrap();
        let l = f.load(0, 3);
        assert_eq!(l.reasons, ClockEventReasons::GPU_IDLE);
        assert_eq!(l.sm_mhz, f.devices[0].model.idle_graphics_clock_mhz);
        assert!(l.mem_frac == 0.4 && !l.busy);
        // A busy one keeps its phase's clock and reasons.
        let busy = phases("[[phases]]\nbusy = 0.5\nsm_clock = 0.8", "h100x8").unwrap().load(0, 3);
        assert!(busy.reasons == 0 && busy.sm_mhz == (1980.0 * 0.8) as u32, "{busy:?}");
    }

    #[test]
    fn temperature_stays_below_shutdown() {
        // V100: slowdown 87 °C, shutdown 90 °C.
        let f = phases("[[phases]]\ntemperature_c = 95.0", "mixed").unwrap();
        let v100 = f.mock_devices().iter().find(|d| d.model().key == "v100-sxm2-32gb").unwrap().position();
        assert_eq!(f.load(v100, 2).temp_c, 89);
        assert_eq!(f.load(0, 2).temp_c, 91, "H100: shutdown 92 °C");
    }

    #[test]
    fn phases_may_name_gpus_beyond_the_fleet_but_not_only_those() {
        // Written for eight GPUs, run on two: GPU 1 takes the phase, 3, 5 and 7 are not there.
        let f = phases("[[phases]]\nbusy = 0.9\n[[phases]]\ngpus = [1, 3, 5, 7]\nbusy = 0.1", "rtx4090x2").unwrap();
        assert!(f.load(0, 3).gpu_pct >= 89 && f.load(f.gpu_position(1).unwrap(), 3).gpu_pct <= 10);
        let e = phases("[[phases]]\nbusy = 0.9\n[[phases]]\ngpus = [3, 5]\nbusy = 0.1", "rtx4090x2").unwrap_err();
        assert_eq!(e.key(), Some("phases[1].gpus"), "{e}");
        assert!(e.to_string().contains("GPU 3 does not exist"), "{e}");
    }

    #[test]
    fn energy_cache_is_transparent() {
        let p = FleetProfile::of_model("h100", 1).unwrap();
        let s = Scenario::new(Workload::Training);
        let a = MockFleet::new(&p, &s, 5).unwrap();
        let b = MockFleet::new(&p, &s, 5).unwrap();
        // `a` computes forward, backward and jumping; `b` computes each tick cold.
        let ticks = [0u64, 1, 2, 600, 300, 257, 256, 255, 1000, 999];
        let forward: Vec<u64> = ticks.iter().map(|&t| a.energy_mj(0, t)).collect();
        for (&t, &e) in ticks.iter().zip(&forward) {
            let cold = MockFleet::new(&p, &s, 5).unwrap();
            assert_eq!(cold.energy_mj(0, t), e, "tick {t}");
        }
        assert!(b.energy_mj(0, 1000) > b.energy_mj(0, 999));
    }
}

//! Where the fake's values come from: [`gpumon_mock::MockFleet`], the same pure model that
//! `gpumon_mock::MockSampler` samples — one source of truth for both mocks.

use std::sync::Arc;
use std::time::Duration;

use gpumon_core::{DeviceInfo, DeviceSample, MetricSet, SystemInfo};
use gpumon_mock::{FleetProfile, MockFleet, Scenario, DEFAULT_SEED};

use crate::config::Config;

/// Facts NVML reports that the core data model has no field for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceExtras {
    /// `pciDeviceId` (device id << 16 | 0x10DE).
    pub pci_device_id: u32,
    /// CUDA compute capability.
    pub compute_capability: (u32, u32),
    /// The model can run MIG (MIG mode reads 0 rather than NOT_SUPPORTED when it is off).
    pub mig_capable: bool,
    /// A GeForce (consumer) board: display mode enabled, persistence mode off.
    pub geforce: bool,
}

/// The fleet the fake serves.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The mock model.
    pub mock: Arc<MockFleet>,
    /// Every device in model order: physical GPUs, each followed by its MIG instances.
    pub devices: Vec<Arc<DeviceInfo>>,
    /// Per device (same order): facts the data model lacks.
    pub extras: Vec<DeviceExtras>,
    /// Host-wide facts (driver, CUDA and NVML versions).
    pub system: Arc<SystemInfo>,
}

impl Fleet {
    /// Every family: what the fake asks the model for.
    pub const METRICS: MetricSet = MetricSet::everything();

    /// The fleet `config` names: profile (default `h100x8`), scenario (default: the mock's),
    /// seed (precedence as `MockSamplerBuilder`: explicit, scenario's, profile's, default).
    ///
    /// # Errors
    /// The mock's configuration error, as text (it names the key or file at fault).
    pub fn load(config: &Config) -> Result<Fleet, String> {
        let profile = match &config.profile {
            Some(p) => FleetProfile::load(p).map_err(|e| e.to_string())?,
            None => FleetProfile::default(),
        };
        let scenario = match &config.scenario {
            Some(s) => Scenario::load(s).map_err(|e| e.to_string())?,
            None => Scenario::default(),
        };
        let seed = config.seed.or(scenario.seed).or(profile.seed).unwrap_or(DEFAULT_SEED);
        let mock = MockFleet::new(&profile, &scenario, seed).map_err(|e| e.to_string())?;
        Ok(Fleet::from_mock(Arc::new(mock)))
    }

    /// Serves an existing mock fleet.
    pub fn from_mock(mock: Arc<MockFleet>) -> Fleet {
        let devices = mock.devices().to_vec();
        let extras = mock
            .mock_devices()
            .iter()
            .map(|d| DeviceExtras {
                pci_device_id: d.model().pci_device_id,
                compute_capability: d.model().compute_capability,
                mig_capable: d.model().capabilities.mig,
                geforce: d.model().name.contains("GeForce"),
            })
            .collect();
        let system = mock.system();
        Fleet { mock, devices, extras, system }
    }

    /// The model's sample of device `index` (position in [`Fleet::devices`]) at `tick`, every
    /// family included — before the fake's own faults.
    pub fn sample(&self, index: usize, tick: u64) -> DeviceSample {
        self.mock
            .sample_device(index, tick, Self::METRICS)
            .unwrap_or_else(|| DeviceSample::lost(Arc::new(DeviceInfo::default())))
    }

    /// Whether the scenario makes the whole backend unavailable at `tick` (the fake then answers
    /// `NVML_ERROR_DRIVER_NOT_LOADED` from `nvmlDeviceGetCount*`).
    pub fn unavailable(&self, tick: u64) -> bool {
        self.mock.is_unavailable(tick)
    }

    /// How long the scenario makes the first `nvmlDeviceGetCount*` of `tick` block.
    pub fn hang(&self, tick: u64) -> Option<Duration> {
        match self.mock.hang_at(tick) {
            Some(gpumon_mock::Fault::Hang { duration, .. }) => Some(*duration),
            _ => None,
        }
    }
}

//! NVLink in the mock: topology, traffic that follows the workload, and link faults.
//!
//! * **Topology.** A GPU has its model's `nvlink_links` (18 on H100/H200 SXM, 12 on A100 SXM, 6
//!   on V100 SXM2, none on PCIe cards). In a fleet of 8 or more NVLink GPUs the links go to
//!   NVSwitches (as on HGX boards: four switches, link `l` to switch `l % 4`); with fewer, they
//!   go directly to the other GPUs round-robin (link `l` of GPU `g` to the
//!   `(l % (n − 1))`-th other GPU).
//! * **Traffic** per link and direction is a closed-form, monotonic byte counter: a base from
//!   the seed plus the integral of `rate · (1 + ½ sin(0.7 t + φ))` over the ticks, where `rate`
//!   is the link's per-direction bandwidth (25 GB/s on NVLink 3/4, 12.5 GB/s on NVLink 2)
//!   times the workload's share ([`nvlink_share`]). Counters are whole KiB, as NVML reports them.
//! * **Faults**: [`Fault::NvlinkDown`] (state down, counters stop, one recovery) and
//!   [`Fault::NvlinkErrors`] (CRC/replay/recovery counters rise per tick).

use gpumon_core::{DeviceSample, Nvlink, NvlinkLink, NvlinkRemote, NvlinkState};

use super::{DeviceKind, MockDevice, MockFleet};
use crate::rng::hash;
use crate::scenario::{Fault, Workload};

/// Number of NVSwitch chips links are spread over in switched fleets.
const SWITCHES: u32 = 4;
/// Fleets with at least this many NVLink GPUs are switched.
const SWITCHED_FROM: usize = 8;

/// Fraction of a link's bandwidth a workload keeps busy.
pub fn nvlink_share(workload: Workload) -> f64 {
    match workload {
        Workload::Idle | Workload::IdleAllocated => 0.0,
        Workload::Training | Workload::NearOom => 0.45,
        Workload::ThermalThrottling | Workload::PowerCapped => 0.35,
        Workload::Imbalance => 0.30,
        Workload::DataloaderStarved => 0.08,
        Workload::MemoryBound | Workload::PcieBound => 0.05,
    }
}

/// Bytes per second per direction of one link of `version`.
fn link_bandwidth(version: u32) -> f64 {
    if version >= 3 {
        25e9
    } else {
        12.5e9
    }
}

impl MockFleet {
    /// The NVLink view of physical GPU `dev` at `tick`, before faults; `None` without links.
    fn nvlink_base(&self, dev: &MockDevice, tick: u64) -> Option<Nvlink> {
        let m = &*dev.model;
        if m.nvlink_links == 0 || !matches!(dev.kind, DeviceKind::Gpu { .. }) {
            return None;
        }
        let peers: Vec<&MockDevice> = self
            .devices
            .iter()
            .filter(|d| matches!(d.kind, DeviceKind::Gpu { .. }) && d.model.nvlink_links > 0)
            .collect();
        let switched = peers.len() >= SWITCHED_FROM;
        let others: Vec<&&MockDevice> = peers.iter().filter(|d| d.gpu != dev.gpu).collect();
        let links = (0..m.nvlink_links)
            .map(|l| {
                let mut link = NvlinkLink::new(l);
                link.version = Some(m.nvlink_version);
                if switched {
                    let sw = l % SWITCHES;
                    link.remote_device_type = Some(NvlinkRemote::Switch);
                    link.remote_pci_bus_id = Some(format!("00000000:{:02X}:00.0", 0x05 + sw));
                } else if let Some(peer) = others.get(l as usize % others.len().max(1)) {
                    link.remote_device_type = Some(NvlinkRemote::Gpu);
                    link.remote_pci_bus_id = peer.info.pci_bus_id.clone();
                }
                link.tx_bytes = Some(self.nvlink_bytes(dev, l, 0, tick));
                link.rx_bytes = Some(self.nvlink_bytes(dev, l, 1, tick));
                link.crc_errors = Some(0);
                link.replay_errors = Some(0);
                link.recovery_errors = Some(0);
                link
            })
            .collect();
        Some(Nvlink::new(links))
    }

    /// Byte counter of one link and direction (0 tx, 1 rx) at `tick`, whole KiB.
    fn nvlink_bytes(&self, dev: &MockDevice, link: u32, dir: u64, tick: u64) -> u64 {
        let base = hash(&[self.seed, 0x4E56, u64::from(dev.gpu), u64::from(link), dir]) % (1 << 40);
        let rate = link_bandwidth(dev.model.nvlink_version) * nvlink_share(dev.workload);
        let period = self.tick_period.as_secs_f64();
        let phase = (u64::from(link) * 2 + dir) as f64 * 0.37;
        let t = tick as f64;
        // ∫₀ᵗ (1 + ½ sin(ω k + φ)) dk: never decreasing, since the integrand is ≥ ½.
        const W: f64 = 0.7;
        let integral = t + 0.5 * (phase.cos() - (W * t + phase).cos()) / W;
        let bytes = base as f64 + rate * period * integral;
        (bytes as u64) / 1024 * 1024
    }

    /// Physical GPU `dev`'s NVLink at `tick` with the scenario's NVLink faults applied.
    pub(super) fn nvlink(&self, dev: &MockDevice, tick: u64) -> Option<Nvlink> {
        let mut nv = self.nvlink_base(dev, tick)?;
        for f in &self.faults {
            self.apply_nvlink(dev, &mut nv, f, tick);
        }
        Some(nv)
    }

    /// Applies an NVLink fault ([`Fault::NvlinkDown`], [`Fault::NvlinkErrors`]) to the sample of
    /// the device at `position` at `tick` — what the scenario's own faults do, for callers (the
    /// fake `libnvidia-ml`) that add such faults at run time. Other faults, other devices and
    /// samples without NVLink are left alone.
    pub fn apply_nvlink_fault(&self, position: usize, sample: &mut DeviceSample, fault: &Fault, tick: u64) {
        let (Some(dev), Some(nv)) = (self.devices.get(position), sample.nvlink.as_mut()) else { return };
        self.apply_nvlink(dev, nv, fault, tick);
    }

    fn apply_nvlink(&self, dev: &MockDevice, nv: &mut Nvlink, fault: &Fault, tick: u64) {
        match *fault {
            Fault::NvlinkDown { device, link, at_tick } if device == dev.gpu && tick >= at_tick => {
                if let Some(l) = nv.links.iter_mut().find(|l| l.link == link) {
                    l.state = NvlinkState::Down;
                    let last = at_tick.saturating_sub(1);
                    l.tx_bytes = Some(self.nvlink_bytes(dev, link, 0, last));
                    l.rx_bytes = Some(self.nvlink_bytes(dev, link, 1, last));
                    l.recovery_errors = l.recovery_errors.map(|r| r + 1);
                }
            }
            Fault::NvlinkErrors { device, link, at_tick, per_tick } if device == dev.gpu && tick >= at_tick => {
                if let Some(l) = nv.links.iter_mut().find(|l| l.link == link) {
                    let n = tick - at_tick + 1;
                    l.crc_errors = l.crc_errors.map(|c| c + per_tick * n);
                    l.replay_errors = l.replay_errors.map(|c| c + per_tick / 2 * n);
                    l.recovery_errors = l.recovery_errors.map(|c| c + n.div_ceil(10));
                }
            }
            _ => {}
        }
    }
}

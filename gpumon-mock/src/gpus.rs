//! GPU models: the datasheet facts the mock (and the fake `libnvidia-ml`) present.
//!
//! Values follow what NVML / `nvidia-smi -q` report on the real boards (names exactly as
//! `nvmlDeviceGetName` returns them, memory totals as `nvmlDeviceGetMemoryInfo_v2` returns them).
//! Reserved memory and idle figures are typical readings, not guarantees: they vary with driver
//! version and are overridable per device in a fleet profile.

use gpumon_core::{Clocks, DeviceInfo};

const MIB: u64 = 1024 * 1024;

/// Most NVLink links a GPU has (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_NVLINK_LINKS: u32 = 18;

/// What a GPU model can report. A capability that is `false` leaves the matching values `None`
/// in every sample, exactly as NVML's `NotSupported` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// GPM profiling metrics (Hopper and newer).
    pub gpm: bool,
    /// HBM temperature sensor.
    pub memory_temperature: bool,
    /// ECC memory (counters).
    pub ecc: bool,
    /// Multi-Instance GPU.
    pub mig: bool,
    /// Video encoder (NVENC).
    pub encoder: bool,
    /// Video decoder (NVDEC).
    pub decoder: bool,
    /// A fan the driver controls (consumer boards; SXM parts are passively cooled).
    pub fan: bool,
    /// Dynamic page retirement (Volta and older datacenter parts).
    pub page_retirement: bool,
    /// Row remapping (Ampere and newer datacenter parts).
    pub row_remapping: bool,
    /// A board serial number (datacenter parts; GeForce reports none).
    pub serial: bool,
}

/// One MIG profile a model offers, e.g. `3g.40gb`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigProfile {
    /// Profile name as `nvidia-smi mig -lgip` prints it, e.g. `"1g.10gb"`.
    pub name: String,
    /// Compute slices (of 7) it takes.
    pub slices: u32,
    /// Memory the instance presents, bytes.
    pub memory_bytes: u64,
}

impl MigProfile {
    fn new(name: &str, slices: u32, memory_mib: u64) -> Self {
        Self { name: name.to_owned(), slices, memory_bytes: memory_mib * MIB }
    }
}

/// Datasheet facts of one GPU model.
///
/// Clocks are in MHz as datasheets give them; [`GpuModel::device_info`] converts to the core
/// model's hertz.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GpuModel {
    /// Short key used in profiles, e.g. `"h100-sxm5-80gb"`.
    pub key: String,
    /// Name as NVML reports it, e.g. `"NVIDIA H100 80GB HBM3"`.
    pub name: String,
    /// Architecture as NVML names it: `"Volta"`, `"Ampere"`, `"Ada"`, `"Hopper"`.
    pub architecture: String,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// PCI device id with vendor, as NVML's `pciDeviceId` (e.g. `0x233010DE`).
    pub pci_device_id: u32,
    /// Total framebuffer, bytes.
    pub memory_total_bytes: u64,
    /// Held by driver and firmware, bytes (`nvmlMemory_v2_t::reserved`).
    pub memory_reserved_bytes: u64,
    /// Whether the memory is HBM (memory clock stays at its maximum when idle).
    pub hbm: bool,
    /// Default (and enforced) power limit, watts.
    pub power_limit_default_watts: f64,
    /// Lowest settable power limit, watts.
    pub power_limit_min_watts: f64,
    /// Highest settable power limit, watts.
    pub power_limit_max_watts: f64,
    /// Typical draw at idle, watts.
    pub power_idle_watts: f64,
    /// Maximum graphics clock, MHz.
    pub max_graphics_clock_mhz: u32,
    /// Maximum SM clock, MHz.
    pub max_sm_clock_mhz: u32,
    /// Maximum memory clock, MHz.
    pub max_memory_clock_mhz: u32,
    /// Maximum video clock, MHz.
    pub max_video_clock_mhz: u32,
    /// Graphics/SM clock at idle, MHz.
    pub idle_graphics_clock_mhz: u32,
    /// Typical temperature at idle, °C.
    pub temperature_idle_celsius: f64,
    /// Temperature at which the GPU slows down, °C.
    pub temperature_slowdown_celsius: f64,
    /// Temperature at which the GPU shuts down, °C.
    pub temperature_shutdown_celsius: f64,
    /// Maximum PCIe generation.
    pub pcie_max_link_generation: u32,
    /// Maximum PCIe width, lanes.
    pub pcie_max_link_width: u32,
    /// What the model can report.
    pub capabilities: Capabilities,
    /// MIG profiles it offers (empty without MIG).
    pub mig_profiles: Vec<MigProfile>,
    /// NVLink links (SXM parts: 18 on H100/H200, 12 on A100, 6 on V100; PCIe cards 0).
    pub nvlink_links: u32,
    /// NVLink version of those links (4 Hopper, 3 Ampere, 2 Volta).
    pub nvlink_version: u32,
}

impl GpuModel {
    /// Every built-in model.
    pub fn builtin() -> Vec<GpuModel> {
        vec![a100_sxm4_40gb(), a100_sxm4_80gb(), h100_sxm5_80gb(), h200_sxm_141gb(), rtx_4090(), v100_sxm2_32gb()]
    }

    /// Keys of the built-in models, for error messages.
    pub fn builtin_keys() -> Vec<&'static str> {
        BUILTIN_KEYS.iter().map(|(k, _)| *k).collect()
    }

    /// A built-in model by key, alias (`h100`, `a100`, `rtx4090`, …) or NVML name, ignoring case.
    pub fn by_name(name: &str) -> Option<GpuModel> {
        let wanted = name.trim().to_ascii_lowercase();
        Self::builtin().into_iter().find(|m| {
            m.key == wanted
                || m.name.to_ascii_lowercase() == wanted
                || BUILTIN_KEYS.iter().any(|(k, aliases)| *k == m.key && aliases.contains(&wanted.as_str()))
        })
    }

    /// The MIG profile called `name` (e.g. `"1g.10gb"`), if this model offers it.
    pub fn mig_profile(&self, name: &str) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.name.eq_ignore_ascii_case(name.trim()))
    }

    /// Maximum clocks in hertz, as the core model stores them.
    pub fn max_clocks(&self) -> Clocks {
        let mut c = Clocks::default();
        c.graphics = Some(mhz(self.max_graphics_clock_mhz));
        c.sm = Some(mhz(self.max_sm_clock_mhz));
        c.memory = Some(mhz(self.max_memory_clock_mhz));
        c.video = Some(mhz(self.max_video_clock_mhz));
        c
    }

    /// Static [`DeviceInfo`] for a physical GPU of this model.
    pub fn device_info(&self, index: u32, uuid: String, pci_bus_id: String, serial: Option<String>) -> DeviceInfo {
        let mut d = DeviceInfo::new(index, uuid, self.name.clone());
        d.pci_bus_id = Some(pci_bus_id);
        d.serial = serial.filter(|_| self.capabilities.serial);
        d.architecture = Some(self.architecture.clone());
        d.memory_total_bytes = Some(self.memory_total_bytes);
        d.power_limit_default_watts = Some(self.power_limit_default_watts);
        d.power_limit_min_watts = Some(self.power_limit_min_watts);
        d.power_limit_max_watts = Some(self.power_limit_max_watts);
        d.max_clocks = self.max_clocks();
        d.temperature_slowdown_celsius = Some(self.temperature_slowdown_celsius);
        d.temperature_shutdown_celsius = Some(self.temperature_shutdown_celsius);
        d.pcie_max_link_generation = Some(self.pcie_max_link_generation);
        d.pcie_max_link_width = Some(self.pcie_max_link_width);
        d
    }

    /// Checks the facts are coherent (limits ordered, reserved below total, …).
    ///
    /// # Errors
    /// The first incoherent field, as `(key, reason)`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let bad = |key, reason: String| Err((key, reason));
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty".into());
        }
        if self.memory_total_bytes == 0 {
            return bad("memory_total_bytes", "must be above 0".into());
        }
        if self.nvlink_links > MAX_NVLINK_LINKS {
            return bad("nvlink_links", format!("must be at most {MAX_NVLINK_LINKS} (NVML_NVLINK_MAX_LINKS)"));
        }
        if self.memory_reserved_bytes >= self.memory_total_bytes {
            return bad(
                "memory_reserved_bytes",
                format!("must be below memory_total_bytes ({})", self.memory_total_bytes),
            );
        }
        let (min, def, max) = (self.power_limit_min_watts, self.power_limit_default_watts, self.power_limit_max_watts);
        if !(min > 0.0 && min <= def && def <= max) {
            return bad(
                "power_limit_default_watts",
                format!("need 0 < power_limit_min_watts ({min}) <= default ({def}) <= power_limit_max_watts ({max})"),
            );
        }
        if !(self.power_idle_watts > 0.0 && self.power_idle_watts < def) {
            return bad("power_idle_watts", format!("must be above 0 and below the default power limit ({def})"));
        }
        for (key, v) in [
            ("max_graphics_clock_mhz", self.max_graphics_clock_mhz),
            ("max_sm_clock_mhz", self.max_sm_clock_mhz),
            ("max_memory_clock_mhz", self.max_memory_clock_mhz),
            ("max_video_clock_mhz", self.max_video_clock_mhz),
        ] {
            if v == 0 {
                return bad(key, "must be above 0".into());
            }
        }
        if self.idle_graphics_clock_mhz > self.max_graphics_clock_mhz.min(self.max_sm_clock_mhz) {
            return bad("idle_graphics_clock_mhz", "must not exceed the maximum graphics/SM clock".into());
        }
        if !(self.temperature_idle_celsius < self.temperature_slowdown_celsius
            && self.temperature_slowdown_celsius < self.temperature_shutdown_celsius)
        {
            return bad(
                "temperature_slowdown_celsius",
                "need idle temperature < temperature_slowdown_celsius < temperature_shutdown_celsius".into(),
            );
        }
        if !(1..=6).contains(&self.pcie_max_link_generation) {
            return bad("pcie_max_link_generation", "must be 1 to 6".into());
        }
        if ![1, 2, 4, 8, 16, 32].contains(&self.pcie_max_link_width) {
            return bad("pcie_max_link_width", "must be 1, 2, 4, 8, 16 or 32".into());
        }
        Ok(())
    }
}

pub(crate) fn mhz(v: u32) -> f64 {
    f64::from(v) * 1e6
}

/// Keys with their aliases (lowercase).
const BUILTIN_KEYS: &[(&str, &[&str])] = &[
    ("a100-sxm4-40gb", &["a100", "a100-40gb"]),
    ("a100-sxm4-80gb", &["a100-80gb"]),
    ("h100-sxm5-80gb", &["h100", "h100-80gb", "h100-sxm"]),
    ("h200-sxm-141gb", &["h200", "h200-141gb"]),
    ("rtx4090", &["rtx-4090", "4090", "geforce-rtx-4090"]),
    ("v100-sxm2-32gb", &["v100", "v100-32gb"]),
];

const DATACENTER_HBM: Capabilities = Capabilities {
    gpm: false,
    memory_temperature: true,
    ecc: true,
    mig: false,
    encoder: false,
    decoder: true,
    fan: false,
    page_retirement: false,
    row_remapping: true,
    serial: true,
};

/// NVIDIA A100-SXM4-40GB (Ampere, 400 W). No NVENC on A100.
fn a100_sxm4_40gb() -> GpuModel {
    GpuModel {
        key: "a100-sxm4-40gb".into(),
        name: "NVIDIA A100-SXM4-40GB".into(),
        architecture: "Ampere".into(),
        compute_capability: (8, 0),
        pci_device_id: 0x20B0_10DE,
        memory_total_bytes: 40_960 * MIB,
        memory_reserved_bytes: 573 * MIB,
        hbm: true,
        power_limit_default_watts: 400.0,
        power_limit_min_watts: 100.0,
        power_limit_max_watts: 400.0,
        power_idle_watts: 55.0,
        max_graphics_clock_mhz: 1410,
        max_sm_clock_mhz: 1410,
        max_memory_clock_mhz: 1215,
        max_video_clock_mhz: 1290,
        idle_graphics_clock_mhz: 210,
        temperature_idle_celsius: 31.0,
        temperature_slowdown_celsius: 89.0,
        temperature_shutdown_celsius: 92.0,
        pcie_max_link_generation: 4,
        pcie_max_link_width: 16,
        capabilities: Capabilities { mig: true, ..DATACENTER_HBM },
        mig_profiles: vec![
            MigProfile::new("1g.5gb", 1, 4_864),
            MigProfile::new("1g.10gb", 1, 9_856),
            MigProfile::new("2g.10gb", 2, 9_856),
            MigProfile::new("3g.20gb", 3, 19_968),
            MigProfile::new("4g.20gb", 4, 19_968),
            MigProfile::new("7g.40gb", 7, 40_192),
        ],
        nvlink_links: 12,
        nvlink_version: 3,
    }
}

/// NVIDIA A100-SXM4-80GB (Ampere, 400 W).
fn a100_sxm4_80gb() -> GpuModel {
    GpuModel {
        key: "a100-sxm4-80gb".into(),
        name: "NVIDIA A100-SXM4-80GB".into(),
        pci_device_id: 0x20B2_10DE,
        memory_total_bytes: 81_920 * MIB,
        memory_reserved_bytes: 595 * MIB,
        max_memory_clock_mhz: 1593,
        mig_profiles: vec![
            MigProfile::new("1g.10gb", 1, 9_728),
            MigProfile::new("1g.20gb", 1, 19_968),
            MigProfile::new("2g.20gb", 2, 19_968),
            MigProfile::new("3g.40gb", 3, 40_192),
            MigProfile::new("4g.40gb", 4, 40_192),
            MigProfile::new("7g.80gb", 7, 80_896),
        ],
        ..a100_sxm4_40gb()
    }
}

/// NVIDIA H100 80GB HBM3, SXM5 (Hopper, 700 W). No NVENC on H100.
fn h100_sxm5_80gb() -> GpuModel {
    GpuModel {
        key: "h100-sxm5-80gb".into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        architecture: "Hopper".into(),
        compute_capability: (9, 0),
        pci_device_id: 0x2330_10DE,
        memory_total_bytes: 81_559 * MIB,
        memory_reserved_bytes: 551 * MIB,
        hbm: true,
        power_limit_default_watts: 700.0,
        power_limit_min_watts: 200.0,
        power_limit_max_watts: 700.0,
        power_idle_watts: 70.0,
        max_graphics_clock_mhz: 1980,
        max_sm_clock_mhz: 1980,
        max_memory_clock_mhz: 2619,
        max_video_clock_mhz: 1755,
        idle_graphics_clock_mhz: 345,
        temperature_idle_celsius: 32.0,
        temperature_slowdown_celsius: 90.0,
        temperature_shutdown_celsius: 92.0,
        pcie_max_link_generation: 5,
        pcie_max_link_width: 16,
        capabilities: Capabilities { gpm: true, mig: true, ..DATACENTER_HBM },
        mig_profiles: vec![
            MigProfile::new("1g.10gb", 1, 9_984),
            MigProfile::new("1g.20gb", 1, 19_968),
            MigProfile::new("2g.20gb", 2, 19_968),
            MigProfile::new("3g.40gb", 3, 40_320),
            MigProfile::new("4g.40gb", 4, 40_320),
            MigProfile::new("7g.80gb", 7, 80_896),
        ],
        nvlink_links: 18,
        nvlink_version: 4,
    }
}

/// NVIDIA H200, SXM (Hopper, 141 GB HBM3e, 700 W).
fn h200_sxm_141gb() -> GpuModel {
    GpuModel {
        key: "h200-sxm-141gb".into(),
        name: "NVIDIA H200".into(),
        pci_device_id: 0x2335_10DE,
        memory_total_bytes: 143_771 * MIB,
        memory_reserved_bytes: 566 * MIB,
        power_idle_watts: 75.0,
        max_memory_clock_mhz: 3201,
        mig_profiles: vec![
            MigProfile::new("1g.18gb", 1, 16_384),
            MigProfile::new("1g.35gb", 1, 32_768),
            MigProfile::new("2g.35gb", 2, 32_768),
            MigProfile::new("3g.71gb", 3, 69_632),
            MigProfile::new("4g.71gb", 4, 69_632),
            MigProfile::new("7g.141gb", 7, 140_288),
        ],
        ..h100_sxm5_80gb()
    }
}

/// NVIDIA GeForce RTX 4090 (Ada, 24 GB GDDR6X, 450 W): fan, NVENC/NVDEC; no ECC, MIG, GPM or
/// memory temperature.
fn rtx_4090() -> GpuModel {
    GpuModel {
        key: "rtx4090".into(),
        name: "NVIDIA GeForce RTX 4090".into(),
        architecture: "Ada".into(),
        compute_capability: (8, 9),
        pci_device_id: 0x2684_10DE,
        memory_total_bytes: 24_564 * MIB,
        memory_reserved_bytes: 346 * MIB,
        hbm: false,
        power_limit_default_watts: 450.0,
        power_limit_min_watts: 150.0,
        power_limit_max_watts: 600.0,
        power_idle_watts: 22.0,
        max_graphics_clock_mhz: 3105,
        max_sm_clock_mhz: 3105,
        max_memory_clock_mhz: 10_501,
        max_video_clock_mhz: 2415,
        idle_graphics_clock_mhz: 210,
        temperature_idle_celsius: 36.0,
        temperature_slowdown_celsius: 89.0,
        temperature_shutdown_celsius: 92.0,
        pcie_max_link_generation: 4,
        pcie_max_link_width: 16,
        capabilities: Capabilities {
            gpm: false,
            memory_temperature: false,
            ecc: false,
            mig: false,
            encoder: true,
            decoder: true,
            fan: true,
            page_retirement: false,
            row_remapping: false,
            serial: false,
        },
        mig_profiles: Vec::new(),
        nvlink_links: 0,
        nvlink_version: 0,
    }
}

/// Tesla V100-SXM2-32GB (Volta, 300 W): page retirement instead of row remapping, NVENC.
fn v100_sxm2_32gb() -> GpuModel {
    GpuModel {
        key: "v100-sxm2-32gb".into(),
        name: "Tesla V100-SXM2-32GB".into(),
        architecture: "Volta".into(),
        compute_capability: (7, 0),
        pci_device_id: 0x1DB5_10DE,
        memory_total_bytes: 32_768 * MIB,
        memory_reserved_bytes: 256 * MIB,
        hbm: true,
        power_limit_default_watts: 300.0,
        power_limit_min_watts: 150.0,
        power_limit_max_watts: 300.0,
        power_idle_watts: 42.0,
        max_graphics_clock_mhz: 1530,
        max_sm_clock_mhz: 1530,
        max_memory_clock_mhz: 877,
        max_video_clock_mhz: 1372,
        idle_graphics_clock_mhz: 135,
        temperature_idle_celsius: 33.0,
        temperature_slowdown_celsius: 87.0,
        temperature_shutdown_celsius: 90.0,
        pcie_max_link_generation: 3,
        pcie_max_link_width: 16,
        capabilities: Capabilities { encoder: true, page_retirement: true, row_remapping: false, ..DATACENTER_HBM },
        mig_profiles: Vec::new(),
        nvlink_links: 6,
        nvlink_version: 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_valid_and_findable() {
        for m in GpuModel::builtin() {
            m.validate().unwrap_or_else(|e| panic!("{}: {e:?}", m.key));
            assert_eq!(GpuModel::by_name(&m.key).unwrap().key, m.key);
            assert_eq!(GpuModel::by_name(&m.name.to_uppercase()).unwrap().key, m.key);
            for p in &m.mig_profiles {
                assert!(p.memory_bytes <= m.memory_total_bytes - m.memory_reserved_bytes, "{} {}", m.key, p.name);
            }
        }
        assert_eq!(GpuModel::by_name("h100").unwrap().name, "NVIDIA H100 80GB HBM3");
        assert_eq!(GpuModel::by_name("RTX4090").unwrap().name, "NVIDIA GeForce RTX 4090");
        assert!(GpuModel::by_name("b200").is_none());
        assert_eq!(GpuModel::builtin_keys().len(), GpuModel::builtin().len());
    }

    #[test]
    fn datasheet_facts() {
        let h200 = GpuModel::by_name("h200").unwrap();
        assert_eq!(h200.name, "NVIDIA H200");
        assert_eq!(h200.memory_total_bytes, 150_754_820_096);
        assert_eq!(h200.power_limit_default_watts, 700.0);
        let rtx = GpuModel::by_name("rtx4090").unwrap();
        let c = rtx.capabilities;
        assert!(c.fan && !c.ecc && !c.mig && !c.gpm && !c.memory_temperature);
        let a100 = GpuModel::by_name("a100").unwrap();
        assert_eq!(a100.memory_total_bytes, 42_949_672_960);
        assert!(!a100.capabilities.encoder && a100.capabilities.mig && !a100.capabilities.gpm);
    }

    #[test]
    fn validate_names_the_bad_key() {
        let mut m = GpuModel::by_name("h100").unwrap();
        m.memory_reserved_bytes = m.memory_total_bytes;
        assert_eq!(m.validate().unwrap_err().0, "memory_reserved_bytes");
        let mut m = GpuModel::by_name("h100").unwrap();
        m.power_limit_min_watts = 800.0;
        assert_eq!(m.validate().unwrap_err().0, "power_limit_default_watts");
    }
}

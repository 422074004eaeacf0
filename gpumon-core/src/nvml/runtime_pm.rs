//! PCI runtime power management: a GPU the kernel has runtime-suspended (D3) is left asleep.
//!
//! Any NVML query that reaches the GPU wakes it, which on a laptop or a workstation with an idle
//! second GPU costs watts just to measure idleness. Before touching a GPU the sampler reads
//! `<sysfs root>/bus/pci/devices/<domain:bus:dev.fn>/power/runtime_status`; `suspended` means
//! the GPU is reported as [`DeviceState::Suspended`](crate::DeviceState::Suspended) and gets no
//! further call this tick. Finding its bus id takes `nvmlDeviceGetHandleByIndex` and
//! `nvmlDeviceGetPciInfo` once (the driver answers both from what it read when it probed the
//! device, without waking it); later ticks use the cached id.
//!
//! Configure with [`NvmlSamplerBuilder::sysfs_root`](super::NvmlSamplerBuilder::sysfs_root)
//! (tests point it at a fixture directory) and
//! [`NvmlSamplerBuilder::wake_suspended`](super::NvmlSamplerBuilder::wake_suspended) (read
//! suspended GPUs anyway, waking them).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where sysfs is mounted unless configured otherwise.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// NVML's bus id (`00000000:18:00.0`, 8-digit domain, upper case) as sysfs names the device
/// (`0000:18:00.0`, 4-digit domain, lower case). `None` for an id of another shape.
pub fn sysfs_bus_id(nvml_bus_id: &str) -> Option<String> {
    let (domain, rest) = nvml_bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let (bus, dev, func) =
        (u32::from_str_radix(bus, 16).ok()?, u32::from_str_radix(dev, 16).ok()?, u32::from_str_radix(func, 16).ok()?);
    Some(format!("{:04x}:{bus:02x}:{dev:02x}.{func:x}", domain & 0xFFFF))
}

/// The `runtime_status` file of the device with NVML bus id `bus_id` under `root`.
pub fn runtime_status_path(root: &Path, bus_id: &str) -> Option<PathBuf> {
    Some(root.join("bus/pci/devices").join(sysfs_bus_id(bus_id)?).join("power/runtime_status"))
}

/// Whether the device is runtime-suspended. Anything unreadable (no sysfs, no runtime PM, an
/// odd bus id) counts as awake: measuring is then the safe default.
pub fn is_suspended(root: &Path, bus_id: &str) -> bool {
    RuntimeStatus::default().is_suspended(root, bus_id)
}

/// How long a `runtime_status` file that could not be opened is left alone before the next try.
pub const REOPEN_AFTER: Duration = Duration::from_secs(30);

/// One GPU's `runtime_status`, read every tick the way [`is_suspended`] reads it, but opened once
/// and re-read in place (one `pread` per tick instead of a path lookup, `open`, `read` and
/// `close`; sysfs attributes answer a read at offset 0 afresh each time). A file that cannot be
/// opened — no sysfs in a container, no runtime PM — counts as awake and is tried again after
/// [`REOPEN_AFTER`], not every tick; a read that fails (the device went away) closes it.
#[derive(Debug, Default)]
pub struct RuntimeStatus {
    file: Option<File>,
    /// When an open last failed.
    failed_at: Option<Instant>,
}

impl RuntimeStatus {
    /// Whether the device with NVML bus id `bus_id` under `root` is runtime-suspended.
    pub fn is_suspended(&mut self, root: &Path, bus_id: &str) -> bool {
        if self.file.is_none() {
            if self.failed_at.is_some_and(|at| at.elapsed() < REOPEN_AFTER) {
                return false;
            }
            self.file = runtime_status_path(root, bus_id).and_then(|p| File::open(p).ok());
            self.failed_at = self.file.is_none().then(Instant::now);
        }
        let Some(file) = &self.file else { return false };
        let mut buf = [0u8; 16];
        match file.read_at(&mut buf, 0) {
            Ok(n) => buf[..n].trim_ascii() == b"suspended",
            Err(_) => {
                self.file = None;
                self.failed_at = Some(Instant::now());
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_map_to_sysfs_names() {
        assert_eq!(sysfs_bus_id("00000000:18:00.0").as_deref(), Some("0000:18:00.0"));
        assert_eq!(sysfs_bus_id("00000001:AB:1F.3").as_deref(), Some("0001:ab:1f.3"));
        assert_eq!(sysfs_bus_id("garbage"), None);
    }

    /// A sysfs fixture under a temporary `name` holding GPU `00000000:2A:00.0`'s status file,
    /// with `content`: the directory and the file.
    fn fixture(name: &str, content: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let p = runtime_status_path(&dir, "00000000:2A:00.0").unwrap();
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        (dir, p)
    }

    #[test]
    fn reads_runtime_status_from_a_fixture() {
        let (dir, p) = fixture("gpumon-rtpm", "suspended\n");
        assert!(is_suspended(&dir, "00000000:2A:00.0"));
        std::fs::write(&p, "active\n").unwrap();
        assert!(!is_suspended(&dir, "00000000:2A:00.0"));
        assert!(!is_suspended(&dir, "00000000:18:00.0"), "missing file = awake");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_kept_open_status_file_follows_every_change_and_a_missing_one_is_not_retried_each_tick() {
        let (dir, p) = fixture("gpumon-rtpm-open", "active\n");
        let mut status = RuntimeStatus::default();
        assert!(!status.is_suspended(&dir, "00000000:2A:00.0"));
        for (content, suspended) in [("suspended\n", true), ("active\n", false), ("suspended", true), ("", false)] {
            std::fs::write(&p, content).unwrap();
            assert_eq!(status.is_suspended(&dir, "00000000:2A:00.0"), suspended, "{content:?}");
        }

        let mut missing = RuntimeStatus::default();
        let other = runtime_status_path(&dir, "00000000:18:00.0").unwrap();
        assert!(!missing.is_suspended(&dir, "00000000:18:00.0"), "missing file = awake");
        std::fs::create_dir_all(other.parent().unwrap()).unwrap();
        std::fs::write(&other, "suspended\n").unwrap();
        assert!(
            !missing.is_suspended(&dir, "00000000:18:00.0"),
            "a file that could not be opened is tried again only after REOPEN_AFTER"
        );
        missing.failed_at = Some(Instant::now() - REOPEN_AFTER);
        assert!(missing.is_suspended(&dir, "00000000:18:00.0"), "and then found");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

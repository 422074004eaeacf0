//! The NVML backend: [`NvmlSampler`] reads every GPU through NVIDIA's management library.
//!
//! `libnvidia-ml.so.1` is loaded at run time (nvml-wrapper, `dlopen`), so building needs no GPU
//! and no driver. A missing library or an unloaded driver is a clear
//! [`SampleError::Unavailable`]; a long-running agent uses [`NvmlSampler::lazy`], which keeps
//! retrying with exponential backoff.
//!
//! ## What is read
//! Static facts (name, PCI bus id, serial, architecture, limits, maximum clocks, thresholds,
//! PCIe maximums, MIG placement) once per device; per tick every family the
//! [`SampleRequest`] asks for:
//!
//! | Family | NVML |
//! |---|---|
//! | utilisation | `nvmlDeviceGetUtilizationRates`, `…Encoder/DecoderUtilization` |
//! | memory | `nvmlDeviceGetMemoryInfo_v2` (used excludes reserved) |
//! | temperature | `nvmlDeviceGetTemperature`; memory via field `NVML_FI_DEV_MEMORY_TEMP` |
//! | power / energy | `…PowerUsage`, `…EnforcedPowerLimit`, `…TotalEnergyConsumption` (mJ → J) |
//! | clocks | `…ClockInfo` (graphics, SM, memory, video; MHz → Hz) |
//! | fan, P-state | `…FanSpeed_v2(0)`, `…PerformanceState` |
//! | clock events | raw `…CurrentClocksEventReasons`, falling back to `…ThrottleReasons` |
//! | PCIe | `…CurrPcieLinkGeneration/Width`, `…PcieReplayCounter`; opt-in `…PcieThroughput` (KB/s → B/s) |
//! | ECC, retired pages, remapped rows | `…TotalEccErrors` (aggregate), raw `…RetiredPages` counts + pending, raw `…RemappedRows` |
//! | processes | `…Compute/GraphicsRunningProcesses_v3` + `…ProcessUtilization` with `lastSeenTimeStamp` carried between ticks; names from `/proc/<pid>/comm`, else `nvmlSystemGetProcessName` |
//! | high resolution | `nvmlDeviceGetSamples` (GPU/memory utilisation, power, SM/memory clock) since the last tick → min/max/mean |
//! | GPM | a baseline `nvmlGpmSampleGet` per GPU when the sampler is built, then one each tick and `nvmlGpmMetricsGet` between consecutive samples (so the first tick already has values; after a GPU is re-discovered, from its second tick) |
//! | XID | an event set on a dedicated thread; counted per code with the last-seen time |
//!
//! ## Errors
//! `NotSupported` (or a symbol an old driver lacks) → the value is `None`; a call that answered
//! `NotSupported` is left alone on that device for 30 s, then asked again (at once after the MIG
//! check sees the MIG mode change). `NoPermission`,
//! `Timeout`, `Unknown` (drivers answer "[Unknown Error]" for single fields of a healthy GPU)
//! and anything else → `None` plus a [`MetricFailure`](crate::MetricFailure) (`Unknown` as
//! `FailureReason::Other("NVML unknown error")`). `GpuLost` / `ResetRequired` — or any failure
//! of the device's handle, UUID or name — → that device is [`DeviceSample::lost`] this tick, the
//! others are still read, and it is re-discovered on a later tick, identity (UUID) and static
//! facts re-read, so a board swapped at the same index shows its new UUID. A GPU that cannot be
//! identified at all (lost before its first sample, or its UUID unreadable) is reported lost by
//! index, with an empty UUID and name. Nothing here panics on an NVML result.
//!
//! ## MIG layout
//! Read with the static facts, and re-checked every [`DEFAULT_MIG_RECHECK_TICKS`] ticks
//! ([`NvmlSamplerBuilder::mig_recheck_interval`]): MIG mode and the instances' handles and
//! UUIDs are compared with the known layout, and instances created or destroyed at run time are
//! picked up (carried state kept for the instances that stay). An instance destroyed between
//! two checks reports per-metric failures until the next one.
//!
//! ## Boundary
//! This folder is the only code in gpumon that names `nvml-wrapper`: it fills the model
//! ([`DeviceSample`], [`crate::MetricFailure`]) behind the [`Sampler`] seam and depends on the
//! model, the catalogue's [`Family`], the device filter and that trait — never on
//! a stage, a sink or the runtime. Its one `nvml-wrapper` type in the public API is the escape
//! hatch [`NvmlSampler::nvml`]. The shape is `shared/STYLE.md`'s ("Traits": the `Sampler`
//! trait, with "`NvmlSampler { nvml: Arc<nvml_wrapper::Nvml>, … }`" behind it in gpumon-core's
//! feature `nvml`), and the absence rule is sysinfo's ("Without the library the data is simply
//! absent and nothing fails").

mod errors;
mod read;
mod xid;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use crate::filter::DeviceFilter;
use crate::metric::Family;
use crate::model::{DeviceInfo, DeviceSample, FailureReason, Snapshot, SystemInfo};
use crate::sampler::{SampleError, SampleRequest, Sampler};

mod nvlink;
pub mod runtime_pm;

use errors::identity_lost;
use read::{Carry, Reader};
use xid::XidWatcher;

/// The library name NVML is loaded by when no path is given.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// How many ticks apart the MIG layout is re-checked by default.
pub const DEFAULT_MIG_RECHECK_TICKS: u32 = 30;

pub use errors::UNKNOWN_ERROR;

/// Samples GPUs through NVML.
///
/// ```no_run
/// use gpumon_core::nvml::NvmlSampler;
/// use gpumon_core::{SampleRequest, Sampler};
///
/// let sampler = NvmlSampler::new()?;
/// let snapshot = sampler.sample(&SampleRequest::default())?;
/// for d in &snapshot.devices {
///     println!("{} {:?}", d.info.name, d.utilization.gpu);
/// }
/// # Ok::<(), gpumon_core::SampleError>(())
/// ```
pub struct NvmlSampler {
    // Field order matters for Drop: the watcher thread and GPM samples go before `nvml`.
    xid: Option<XidWatcher>,
    state: Mutex<State>,
    system: Arc<SystemInfo>,
    library: String,
    nvml: Arc<Nvml>,
    mig_recheck: u32,
    /// sysfs root for runtime-PM checks; `None` = wake suspended GPUs (no check).
    sysfs_root: Option<PathBuf>,
}

impl std::fmt::Debug for NvmlSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSampler").field("library", &self.library).field("system", &self.system).finish()
    }
}

#[derive(Debug, Default)]
struct State {
    gpus: Vec<Gpu>,
    /// Ticks since the MIG layout was last re-checked.
    since_mig_check: u32,
}

/// One physical GPU's cached handle, identity and carried state.
#[derive(Debug, Default)]
struct Gpu {
    /// `nvmlDevice_t`, valid while `nvml` lives; dropped when the GPU is lost.
    handle: Option<usize>,
    uuid: Option<String>,
    info: Option<Arc<DeviceInfo>>,
    migs: Vec<Mig>,
    lost: bool,
    carry: Carry,
    /// The MIG mode at the last MIG check (`None`: not checked yet).
    mig_enabled: Option<bool>,
    /// NVML PCI bus id, read once (without waking the GPU) for the runtime-PM check.
    bus_id: Option<String>,
    runtime_status: runtime_pm::RuntimeStatus,
}

#[derive(Debug)]
struct Mig {
    handle: usize,
    info: Arc<DeviceInfo>,
    carry: Carry,
}

/// Default length of one `nvmlEventSetWait` of the XID watcher: the driver's wait sleeps in the
/// kernel, so a long wait costs nothing and the thread stays asleep between ticks.
pub const DEFAULT_XID_POLL: Duration = Duration::from_secs(5);

/// Configures an [`NvmlSampler`].
#[derive(Clone, Debug)]
#[must_use]
pub struct NvmlSamplerBuilder {
    library_path: Option<PathBuf>,
    xid_events: bool,
    xid_poll: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    mig_recheck: u32,
    sysfs_root: PathBuf,
    wake_suspended: bool,
}

impl Default for NvmlSamplerBuilder {
    fn default() -> Self {
        Self {
            library_path: None,
            xid_events: true,
            xid_poll: DEFAULT_XID_POLL,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            mig_recheck: DEFAULT_MIG_RECHECK_TICKS,
            sysfs_root: PathBuf::from(runtime_pm::DEFAULT_SYSFS_ROOT),
            wake_suspended: false,
        }
    }
}

impl NvmlSamplerBuilder {
    /// Load NVML from this file instead of searching for `libnvidia-ml.so.1`.
    pub fn library_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.library_path = Some(path.into());
        self
    }

    /// Whether to watch XID events on a background thread (default: yes). Without the watcher,
    /// samples carry no XID counts even when a request asks for [`Family::Xid`], and no failure
    /// says so: turn it off only when no request will ask (the agent does when the `xid`
    /// family is not sampled).
    pub fn xid_events(mut self, on: bool) -> Self {
        self.xid_events = on;
        self
    }

    /// How long one `nvmlEventSetWait` blocks (default [`DEFAULT_XID_POLL`]). The watcher thread
    /// wakes only at the end of a wait without events, and a GPU re-discovered meanwhile is
    /// registered then. Dropping the sampler waits for the thread only when this is at most
    /// 100 ms; with a longer wait the thread finishes its current wait and exits on its own
    /// (keeping the library loaded until then), so that a one-shot run is not held up.
    pub fn xid_poll_interval(mut self, poll: Duration) -> Self {
        self.xid_poll = poll.max(Duration::from_millis(1));
        self
    }

    /// Backoff of [`NvmlSamplerBuilder::build_lazy`]: first retry after `initial`, doubling up
    /// to `max` (default 1 s to 5 min).
    pub fn retry_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// Re-check every GPU's MIG layout (mode, instances) every `ticks` ticks, so instances
    /// created or destroyed at run time are picked up; `0` = only when a GPU is (re-)discovered
    /// (default [`DEFAULT_MIG_RECHECK_TICKS`]).
    pub fn mig_recheck_interval(mut self, ticks: u32) -> Self {
        self.mig_recheck = ticks;
        self
    }

    /// Where sysfs is mounted, for the runtime-PM check (default `/sys`; tests use a fixture
    /// directory). See [`runtime_pm`].
    pub fn sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = root.into();
        self
    }

    /// Read runtime-suspended GPUs anyway, waking them (default: no — they are reported
    /// [`DeviceState::Suspended`](crate::DeviceState::Suspended) and left asleep).
    pub fn wake_suspended(mut self, wake: bool) -> Self {
        self.wake_suspended = wake;
        self
    }

    fn library_name(&self) -> String {
        self.library_path.as_deref().map_or_else(|| DEFAULT_LIBRARY.to_owned(), |p| p.display().to_string())
    }

    /// Loads and initialises NVML.
    ///
    /// # Errors
    /// [`SampleError::Unavailable`] saying what was looked for and why it failed: library not
    /// found, not an NVML library, driver not loaded, or `nvmlInit` failing otherwise.
    pub fn build(self) -> Result<NvmlSampler, SampleError> {
        let library = self.library_name();
        let mut b = Nvml::builder();
        if let Some(p) = &self.library_path {
            b.lib_path(p.as_os_str());
        } else {
            b.lib_path(OsStr::new(DEFAULT_LIBRARY));
        }
        let nvml = b.init().map_err(|e| init_error(self.library_path.as_deref(), &library, e))?;
        let nvml = Arc::new(nvml);
        let mut system = SystemInfo::new(crate::hostname(), "nvml");
        system.driver_version = nvml.sys_driver_version().ok();
        system.cuda_driver_version = nvml.sys_cuda_driver_version().ok();
        system.nvml_version = nvml.sys_nvml_version().ok();
        let xid = self.xid_events.then(|| XidWatcher::start(nvml.clone(), self.xid_poll));
        let sampler = NvmlSampler {
            xid,
            state: Mutex::new(State::default()),
            system: Arc::new(system),
            library,
            nvml,
            mig_recheck: self.mig_recheck,
            sysfs_root: (!self.wake_suspended).then(|| self.sysfs_root.clone()),
        };
        sampler.prime();
        Ok(sampler)
    }

    /// A sampler that loads NVML on first use and, while it cannot, returns
    /// [`SampleError::Unavailable`] and retries with exponential backoff on later calls.
    pub fn build_lazy(self) -> LazyNvmlSampler {
        LazyNvmlSampler {
            state: Mutex::new(Lazy {
                sampler: None,
                next_try: None,
                backoff: self.backoff_initial,
                attempts: 0,
                last_error: String::new(),
            }),
            builder: self,
        }
    }
}

fn init_error(path: Option<&Path>, library: &str, e: NvmlError) -> SampleError {
    let reason = match &e {
        NvmlError::LibloadingError(le) => match path {
            None => format!("could not load {DEFAULT_LIBRARY} (looked in LD_LIBRARY_PATH and the ld.so cache): {le}"),
            Some(_) => format!("could not load {library}: {le}"),
        },
        NvmlError::FailedToLoadSymbol(s) => format!("{library} is not a usable NVML library: {s}"),
        NvmlError::DriverNotLoaded => {
            format!("{library} loaded, but the NVIDIA driver is not (nvmlInit: NVML_ERROR_DRIVER_NOT_LOADED)")
        }
        NvmlError::NoPermission => format!("{library} loaded, but nvmlInit was denied (NVML_ERROR_NO_PERMISSION)"),
        other => format!("{library} loaded, but nvmlInit failed: {other}"),
    };
    SampleError::Unavailable { reason, source: Some(Box::new(e)) }
}

impl NvmlSampler {
    /// Loads `libnvidia-ml.so.1` from the usual places.
    ///
    /// # Errors
    /// As [`NvmlSamplerBuilder::build`].
    pub fn new() -> Result<Self, SampleError> {
        Self::builder().build()
    }

    /// A builder (library path, XID watching, retry backoff).
    pub fn builder() -> NvmlSamplerBuilder {
        NvmlSamplerBuilder::default()
    }

    /// A sampler that keeps retrying to load NVML with exponential backoff; see
    /// [`LazyNvmlSampler`].
    pub fn lazy() -> LazyNvmlSampler {
        Self::builder().build_lazy()
    }

    /// Host-wide facts read at load time.
    pub fn system(&self) -> &Arc<SystemInfo> {
        &self.system
    }

    /// The underlying nvml-wrapper handle, for calls gpumon does not make.
    pub fn nvml(&self) -> &Arc<Nvml> {
        &self.nvml
    }

    fn device(&self, handle: usize) -> Device<'_> {
        // SAFETY: `handle` came from this `Nvml` (device_by_index / mig_device_by_index), which
        // outlives the returned borrow; NVML handles stay valid until nvmlShutdown.
        unsafe { Device::new(handle as nvml_wrapper_sys::bindings::nvmlDevice_t, &self.nvml) }
    }

    /// Discovery at construction: caches each GPU's handle and takes a GPM baseline sample, so
    /// the first tick already reports GPM over the interval since the sampler was built.
    fn prime(&self) {
        let Ok(count) = self.nvml.device_count() else { return };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.gpus.resize_with(count as usize, Gpu::default);
        for (i, gpu) in state.gpus.iter_mut().enumerate() {
            let Ok(d) = self.nvml.device_by_index(i as u32) else { continue };
            // SAFETY: only stored; turned back into a Device by `self.device`.
            gpu.handle = Some((unsafe { d.handle() }) as usize);
            if self.asleep(&d, gpu) {
                continue;
            }
            read::gpm_baseline(&self.nvml, &d, &mut gpu.carry);
        }
    }

    /// Whether the GPU is runtime-suspended and must be left asleep (never when waking is
    /// allowed). Reads the PCI bus id once — NVML answers it without waking the GPU.
    fn asleep(&self, d: &Device<'_>, gpu: &mut Gpu) -> bool {
        let Some(root) = &self.sysfs_root else { return false };
        if gpu.bus_id.is_none() {
            gpu.bus_id = gpu.info.as_ref().and_then(|i| i.pci_bus_id.clone()).or_else(|| read::bus_id(&self.nvml, d));
        }
        let Some(bus_id) = gpu.bus_id.as_deref() else { return false };
        gpu.runtime_status.is_suspended(root, bus_id)
    }

    /// The sample of a suspended GPU: its known identity, else its index and bus id.
    fn suspended_sample(index: u32, gpu: &Gpu) -> DeviceSample {
        let info = gpu.info.clone().unwrap_or_else(|| {
            let mut i = DeviceInfo::new(index, gpu.uuid.clone().unwrap_or_default(), String::new());
            i.pci_bus_id = gpu.bus_id.clone();
            Arc::new(i)
        });
        DeviceSample::suspended(info)
    }

    /// The `up = 0` sample of a GPU: its last known identity, else just its index (empty UUID
    /// and name) when it was never identified.
    fn lost_sample(index: u32, gpu: &Gpu) -> DeviceSample {
        let info = gpu
            .info
            .clone()
            .unwrap_or_else(|| Arc::new(DeviceInfo::new(index, gpu.uuid.clone().unwrap_or_default(), String::new())));
        DeviceSample::lost(info)
    }

    fn read_gpu(
        &self,
        index: u32,
        gpu: &mut Gpu,
        req: &SampleRequest,
        recheck_mig: bool,
        now: Instant,
        out: &mut Vec<DeviceSample>,
    ) {
        let filter: &DeviceFilter = &req.devices;
        // Reports the GPU lost (if the filter may show it) and drops its handle and state.
        let give_up = |this: &Self, gpu: &mut Gpu, out: &mut Vec<DeviceSample>| {
            this.forget(gpu);
            if filter.may_allow_gpu(index, gpu.uuid.as_deref().unwrap_or_default()) {
                out.push(Self::lost_sample(index, gpu));
            }
        };
        // Handle: cached, or (re-)fetched.
        let handle = match gpu.handle {
            Some(h) => h,
            None => match self.nvml.device_by_index(index) {
                // SAFETY: only stored; turned back into a Device by `self.device`.
                Ok(d) => (unsafe { d.handle() }) as usize,
                Err(e) => {
                    if identity_lost(&e) {
                        give_up(self, gpu, out);
                    }
                    return;
                }
            },
        };
        let d = self.device(handle);
        gpu.handle = Some(handle);
        // A runtime-suspended GPU is reported as such and not woken: no identity read, no
        // families, no MIG re-check.
        if self.asleep(&d, gpu) {
            if filter.may_allow_gpu(index, gpu.uuid.as_deref().unwrap_or_default()) {
                out.push(Self::suspended_sample(index, gpu));
            }
            return;
        }
        // Identity: cached while the GPU answers (not copied: this runs for every GPU every
        // tick); re-read after it was lost (it may be another board now).
        if gpu.uuid.is_none() || gpu.lost {
            match d.uuid() {
                Ok(u) => gpu.uuid = Some(u),
                Err(_) => {
                    // A GPU without a readable UUID cannot be reported; show it lost by index.
                    give_up(self, gpu, out);
                    return;
                }
            }
        }
        if gpu.lost {
            // Re-discovered: fresh static info and MIG layout, re-armed XID watch.
            gpu.lost = false;
            gpu.info = None;
            gpu.migs.clear();
            if let Some(x) = &self.xid {
                x.register(index);
            }
        }
        let uuid = gpu.uuid.as_deref().unwrap_or_default();
        if !filter.may_allow_gpu(index, uuid) {
            return;
        }
        let info = match &gpu.info {
            Some(i) => {
                let i = i.clone();
                if recheck_mig {
                    self.recheck_migs(&d, &i, gpu);
                }
                i
            }
            None => match read::static_info(&self.nvml, &d, index, uuid.to_owned()) {
                Ok(i) => {
                    let i = Arc::new(i);
                    gpu.migs = self.discover_migs(&d, &i);
                    gpu.info = Some(i.clone());
                    i
                }
                Err(e) => {
                    if identity_lost(&e) {
                        give_up(self, gpu, out);
                    }
                    return;
                }
            },
        };

        self.push_samples(&d, gpu, info, req, now, out);
    }

    /// The samples of an identified GPU the filter may show, and of its MIG instances: pushed
    /// onto `out`; when NVML loses the GPU midway, its MIG samples already pushed are taken back
    /// and the GPU is reported lost.
    fn push_samples(
        &self,
        d: &Device<'_>,
        gpu: &mut Gpu,
        info: Arc<DeviceInfo>,
        req: &SampleRequest,
        now: Instant,
        out: &mut Vec<DeviceSample>,
    ) {
        let filter: &DeviceFilter = &req.devices;
        let mut lost = false;
        if filter.allows(&info) {
            let mut sample = DeviceSample::new(info.clone());
            lost = self.read_families(d, req, &mut gpu.carry, &mut sample, now);
            if !lost {
                if let (true, Some(x)) = (req.metrics.contains(Family::Xid), &self.xid) {
                    // Not watched is not "no XID errors": say so in the sample.
                    match x.not_watched(&info.uuid) {
                        Some(reason) => sample.record_failure(Family::Xid, FailureReason::Other(reason)),
                        None => sample.xid_errors = x.counts(&info.uuid),
                    }
                }
                out.push(sample);
            }
        }
        if !lost {
            for mig in &mut gpu.migs {
                if !filter.allows(&mig.info) {
                    continue;
                }
                let md = self.device(mig.handle);
                let mut sample = DeviceSample::new(mig.info.clone());
                if self.read_families(&md, req, &mut mig.carry, &mut sample, now) {
                    lost = true;
                    break;
                }
                out.push(sample);
            }
        }
        if lost {
            self.forget(gpu);
            // Drop any MIG samples of this GPU already pushed, then report the GPU lost.
            out.retain(|s| s.info.mig.as_ref().is_none_or(|m| m.parent_uuid != info.uuid));
            out.push(DeviceSample::lost(info));
        }
    }

    /// Reads the requested families of one device (a GPU or a MIG instance) into `sample`;
    /// returns whether the device was lost meanwhile.
    fn read_families(
        &self,
        d: &Device<'_>,
        req: &SampleRequest,
        carry: &mut Carry,
        sample: &mut DeviceSample,
        now: Instant,
    ) -> bool {
        // Lent to the reader for this sample (the reads also borrow the rest of `carry`).
        let mut unsupported = std::mem::take(&mut carry.unsupported);
        let mut r = Reader { sample, lost: false, unsupported: &mut unsupported, now };
        read::families(&self.nvml, d, req.metrics, carry, &mut r);
        let lost = r.lost;
        carry.unsupported = unsupported;
        lost
    }

    /// Whether MIG is on, and the MIG instances of a GPU as NVML lists them now: `(handle,
    /// uuid)` in NVML's order; `None` when the GPU did not answer (lost) — then nothing is
    /// changed.
    fn mig_layout(&self, d: &Device<'_>) -> Option<(bool, Vec<(usize, String)>)> {
        let enabled = match d.mig_mode() {
            Ok(m) => m.current == 1,
            Err(e) if identity_lost(&e) => return None,
            Err(_) => false,
        };
        if !enabled {
            return Some((false, Vec::new()));
        }
        let count = match d.mig_device_count() {
            Ok(n) => n,
            Err(e) if identity_lost(&e) => return None,
            Err(_) => 0,
        };
        let mut layout = Vec::new();
        for i in 0..count {
            let Ok(md) = d.mig_device_by_index(i) else { continue };
            let Ok(uuid) = md.uuid() else { continue };
            // SAFETY: only compared / stored; see `device`.
            layout.push((unsafe { md.handle() } as usize, uuid));
        }
        Some((true, layout))
    }

    /// Picks up MIG instances created or destroyed since the last look; instances that stay
    /// keep their carried state.
    fn recheck_migs(&self, d: &Device<'_>, parent: &Arc<DeviceInfo>, gpu: &mut Gpu) {
        let Some((enabled, layout)) = self.mig_layout(d) else { return };
        // The MIG mode decides what the parent supports (its utilisation, for one): when it
        // changed, with or without instances yet, the parent's calls are all asked again.
        if gpu.mig_enabled != Some(enabled) {
            gpu.mig_enabled = Some(enabled);
            gpu.carry.unsupported = read::Unsupported::default();
        }
        let known: Vec<(usize, &str)> = gpu.migs.iter().map(|m| (m.handle, m.info.uuid.as_str())).collect();
        if layout.len() == known.len() && layout.iter().zip(&known).all(|((h, u), (kh, ku))| h == kh && u == ku) {
            return;
        }
        let mut fresh = self.discover_migs(d, parent);
        for m in &mut fresh {
            if let Some(old) = gpu.migs.iter_mut().find(|o| o.info.uuid == m.info.uuid && o.handle == m.handle) {
                m.carry = std::mem::take(&mut old.carry);
            }
        }
        for old in &mut gpu.migs {
            if let Some(s) = old.carry.gpm_prev.take() {
                read::free_gpm_sample(&self.nvml, s);
            }
        }
        gpu.migs = fresh;
    }

    fn discover_migs(&self, d: &Device<'_>, parent: &Arc<DeviceInfo>) -> Vec<Mig> {
        let enabled = d.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        if !enabled {
            return Vec::new();
        }
        let count = d.mig_device_count().unwrap_or(0);
        let mut migs = Vec::new();
        for i in 0..count {
            let Ok(md) = d.mig_device_by_index(i) else { continue };
            let Ok(info) = read::mig_info(&self.nvml, &md, parent, migs.len() as u32) else { continue };
            // SAFETY: only stored; see `device`.
            migs.push(Mig { handle: unsafe { md.handle() } as usize, info: Arc::new(info), carry: Carry::default() });
        }
        migs
    }

    /// Marks a GPU lost: its handles and carried state are dropped; it is re-discovered by index.
    fn forget(&self, gpu: &mut Gpu) {
        gpu.lost = true;
        gpu.handle = None;
        for c in std::iter::once(&mut gpu.carry).chain(gpu.migs.iter_mut().map(|m| &mut m.carry)) {
            if let Some(s) = c.gpm_prev.take() {
                read::free_gpm_sample(&self.nvml, s);
            }
            *c = Carry::default();
        }
    }
}

impl Sampler for NvmlSampler {
    fn name(&self) -> &str {
        "nvml"
    }

    fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError> {
        let started = Instant::now();
        let taken_at = SystemTime::now();
        let count = self.nvml.device_count().map_err(|e| match e {
            NvmlError::Uninitialized | NvmlError::DriverNotLoaded => SampleError::Unavailable {
                reason: format!("{}: NVML stopped answering: {e}", self.library),
                source: Some(Box::new(e)),
            },
            e => SampleError::Backend(Box::new(e)),
        })?;
        if request.devices.uses_cuda_indices() {
            // Every GPU's model, hidden ones included: CUDA's index order is only NVML's when
            // they are all the same.
            let names: Vec<DeviceInfo> = (0..count)
                .filter_map(|i| {
                    let name = self.nvml.device_by_index(i).and_then(|d| d.name()).ok()?;
                    Some(DeviceInfo::new(i, String::new(), name))
                })
                .collect();
            request.devices.check_device_order(&names).map_err(|e| SampleError::Backend(Box::new(e)))?;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = count as usize;
        if state.gpus.len() < n {
            state.gpus.resize_with(n, Gpu::default);
        }
        state.since_mig_check = state.since_mig_check.saturating_add(1);
        let recheck_mig = self.mig_recheck > 0 && state.since_mig_check >= self.mig_recheck;
        if recheck_mig {
            state.since_mig_check = 0;
        }
        let mut devices = Vec::with_capacity(n);
        for (i, gpu) in state.gpus.iter_mut().enumerate().take(n) {
            self.read_gpu(i as u32, gpu, request, recheck_mig, started, &mut devices);
        }
        drop(state);
        // A UUID prefix matching several GPUs selects none of them, here as in the runtime.
        request.devices.apply(&mut devices);
        Ok(Snapshot::new(self.system.clone(), devices).with_taken_at(taken_at).with_duration(started.elapsed()))
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.xid = None;
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for gpu in &mut state.gpus {
            for c in std::iter::once(&mut gpu.carry).chain(gpu.migs.iter_mut().map(|m| &mut m.carry)) {
                if let Some(s) = c.gpm_prev.take() {
                    read::free_gpm_sample(&self.nvml, s);
                }
            }
        }
    }
}

/// An [`NvmlSampler`] that is created on first use and re-created with exponential backoff
/// while NVML cannot be loaded (driver not installed yet, container started before the device
/// plugin, a driver upgrade): each sample in the meantime is [`SampleError::Unavailable`]
/// saying what failed and when the next attempt is. Between attempts no load is tried, so a
/// short interval costs nothing.
#[derive(Debug)]
pub struct LazyNvmlSampler {
    builder: NvmlSamplerBuilder,
    state: Mutex<Lazy>,
}

#[derive(Debug)]
struct Lazy {
    sampler: Option<NvmlSampler>,
    next_try: Option<Instant>,
    backoff: Duration,
    attempts: u32,
    last_error: String,
}

impl Lazy {
    /// Records a failed attempt (NVML not loadable, or gone from under a loaded sampler): the
    /// attempt is counted, the next one scheduled after the current backoff, which doubles.
    fn fail(&mut self, builder: &NvmlSamplerBuilder, reason: String, source: SampleError) -> SampleError {
        self.sampler = None;
        self.attempts += 1;
        self.last_error = reason;
        let wait = self.backoff;
        self.next_try = Some(Instant::now() + wait);
        self.backoff = (self.backoff * 2).min(builder.backoff_max);
        SampleError::Unavailable {
            reason: format!("{} (attempt {}; next retry in {:.1?})", self.last_error, self.attempts, wait),
            source: Some(Box::new(source)),
        }
    }
}

impl LazyNvmlSampler {
    /// Whether NVML is loaded now.
    pub fn is_loaded(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).sampler.is_some()
    }

    /// Failed attempts since the last successful sample: loads that failed, and loaded samplers
    /// dropped because NVML stopped answering.
    pub fn failed_attempts(&self) -> u32 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).attempts
    }
}

impl Sampler for LazyNvmlSampler {
    fn name(&self) -> &str {
        "nvml"
    }

    fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.sampler.is_none() {
            let now = Instant::now();
            if let Some(t) = s.next_try.filter(|t| now < *t) {
                return Err(SampleError::unavailable(format!(
                    "{} (attempt {}; next retry in {:.1?})",
                    s.last_error,
                    s.attempts,
                    t - now
                )));
            }
            match self.builder.clone().build() {
                // Attempts and backoff are reset by a successful sample, not by the load: a
                // driver that loads but does not answer must not be retried at full rate.
                Ok(sampler) => {
                    if s.attempts > 0 {
                        tracing::info!(failed_attempts = s.attempts, "NVML loaded; reading the GPUs");
                    }
                    s.sampler = Some(sampler);
                    s.next_try = None;
                }
                Err(e) => {
                    let reason = match &e {
                        SampleError::Unavailable { reason, .. } => reason.clone(),
                        other => other.to_string(),
                    };
                    return Err(s.fail(&self.builder, reason, e));
                }
            }
        }
        let result = s.sampler.as_ref().map(|x| x.sample(request));
        match result {
            Some(Err(SampleError::Unavailable { reason, source })) => {
                // NVML went away under us: start over with backoff.
                let e = SampleError::Unavailable { reason: reason.clone(), source };
                Err(s.fail(&self.builder, reason, e))
            }
            Some(Ok(snapshot)) => {
                s.attempts = 0;
                s.backoff = self.builder.backoff_initial;
                Ok(snapshot)
            }
            Some(Err(e)) => Err(e),
            None => Err(SampleError::unavailable("NVML is not loaded")),
        }
    }
}

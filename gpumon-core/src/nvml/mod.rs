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
//! | GPM | raw `nvmlGpmSampleGet` each tick, `nvmlGpmMetricsGet` between consecutive ticks (none on the first) |
//! | XID | an event set on a dedicated thread; counted per code with the last-seen time |
//!
//! ## Errors
//! `NotSupported` (or a symbol an old driver lacks) → the value is `None`. `NoPermission` →
//! `None` plus a [`MetricFailure`](crate::MetricFailure). `GpuLost` / `ResetRequired` /
//! `Unknown` → that device is [`DeviceSample::lost`] this tick, the others are still read, and it
//! is re-discovered on a later tick. Nothing here panics on an NVML result.

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
use crate::model::{DeviceInfo, DeviceSample, Snapshot, SystemInfo};
use crate::sampler::{SampleError, SampleRequest, Sampler};

use errors::{classify, Outcome};
use read::{Carry, Reader};
use xid::XidWatcher;

/// The library name NVML is loaded by when no path is given.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

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
}

impl std::fmt::Debug for NvmlSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSampler").field("library", &self.library).field("system", &self.system).finish()
    }
}

#[derive(Debug, Default)]
struct State {
    gpus: Vec<Gpu>,
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
}

#[derive(Debug)]
struct Mig {
    handle: usize,
    info: Arc<DeviceInfo>,
    carry: Carry,
}

/// Configures an [`NvmlSampler`].
#[derive(Clone, Debug)]
#[must_use]
pub struct NvmlSamplerBuilder {
    library_path: Option<PathBuf>,
    xid_events: bool,
    xid_poll: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
}

impl Default for NvmlSamplerBuilder {
    fn default() -> Self {
        Self {
            library_path: None,
            xid_events: true,
            xid_poll: Duration::from_millis(250),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }
}

impl NvmlSamplerBuilder {
    /// Load NVML from this file instead of searching for `libnvidia-ml.so.1`.
    pub fn library_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.library_path = Some(path.into());
        self
    }

    /// Whether to watch XID events on a background thread (default: yes).
    pub fn xid_events(mut self, on: bool) -> Self {
        self.xid_events = on;
        self
    }

    /// How long one `nvmlEventSetWait` blocks; also bounds how long dropping the sampler takes
    /// (default 250 ms).
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
        let xid = if self.xid_events { XidWatcher::start(nvml.clone(), self.xid_poll) } else { None };
        Ok(NvmlSampler { xid, state: Mutex::new(State::default()), system: Arc::new(system), library, nvml })
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

    fn read_gpu(&self, index: u32, gpu: &mut Gpu, req: &SampleRequest, out: &mut Vec<DeviceSample>) {
        let filter: &DeviceFilter = &req.devices;
        let lost_sample = |gpu: &Gpu| {
            let info = gpu.info.clone().unwrap_or_else(|| {
                Arc::new(DeviceInfo::new(index, gpu.uuid.clone().unwrap_or_default(), String::new()))
            });
            DeviceSample::lost(info)
        };
        // Handle: cached, or (re-)fetched.
        let handle = match gpu.handle {
            Some(h) => h,
            None => match self.nvml.device_by_index(index) {
                // SAFETY: only stored; turned back into a Device by `self.device`.
                Ok(d) => (unsafe { d.handle() }) as usize,
                Err(e) => {
                    if classify(&e) == Outcome::Lost
                        && gpu.uuid.as_deref().is_some_and(|u| filter.may_allow_gpu(index, u))
                    {
                        gpu.lost = true;
                        out.push(lost_sample(gpu));
                    }
                    return;
                }
            },
        };
        let d = self.device(handle);
        let uuid = match &gpu.uuid {
            Some(u) => u.clone(),
            None => match d.uuid() {
                Ok(u) => u,
                Err(_) => return,
            },
        };
        if !filter.may_allow_gpu(index, &uuid) {
            gpu.handle = Some(handle);
            gpu.uuid = Some(uuid);
            return;
        }
        if gpu.lost {
            // Re-discovered: refresh handle, static info and MIG layout, re-arm XID.
            gpu.lost = false;
            gpu.info = None;
            gpu.migs.clear();
            if let Some(x) = &self.xid {
                x.register(index);
            }
        }
        let info = match &gpu.info {
            Some(i) if i.uuid == uuid => i.clone(),
            _ => match read::static_info(&self.nvml, &d, index, uuid.clone()) {
                Ok(i) => {
                    let i = Arc::new(i);
                    gpu.migs = self.discover_migs(&d, &i);
                    gpu.info = Some(i.clone());
                    i
                }
                Err(e) => {
                    gpu.uuid = Some(uuid);
                    if classify(&e) == Outcome::Lost {
                        self.forget(gpu);
                        out.push(lost_sample(gpu));
                    }
                    return;
                }
            },
        };
        gpu.handle = Some(handle);
        gpu.uuid = Some(uuid);

        let mut lost = false;
        if filter.allows(&info) {
            let mut sample = DeviceSample::new(info.clone());
            let mut r = Reader { sample: &mut sample, lost: false };
            read::families(&self.nvml, &d, req.metrics, &mut gpu.carry, &mut r);
            lost = r.lost;
            if !lost {
                if let (true, Some(x)) = (req.metrics.contains(Family::Xid), &self.xid) {
                    sample.xid_errors = x.counts(&info.uuid);
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
                let mut r = Reader { sample: &mut sample, lost: false };
                read::families(&self.nvml, &md, req.metrics, &mut mig.carry, &mut r);
                if r.lost {
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
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = count as usize;
        if state.gpus.len() < n {
            state.gpus.resize_with(n, Gpu::default);
        }
        let mut devices = Vec::with_capacity(n);
        for (i, gpu) in state.gpus.iter_mut().enumerate().take(n) {
            self.read_gpu(i as u32, gpu, request, &mut devices);
        }
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

impl LazyNvmlSampler {
    /// Whether NVML is loaded now.
    pub fn is_loaded(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).sampler.is_some()
    }

    /// Failed load attempts since the last success.
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
            if s.next_try.is_some_and(|t| now < t) {
                let wait = s.next_try.map(|t| t - now).unwrap_or_default();
                return Err(SampleError::unavailable(format!(
                    "{} (attempt {}; next retry in {:.1?})",
                    s.last_error, s.attempts, wait
                )));
            }
            match self.builder.clone().build() {
                Ok(sampler) => {
                    s.sampler = Some(sampler);
                    s.attempts = 0;
                    s.backoff = self.builder.backoff_initial;
                    s.next_try = None;
                }
                Err(e) => {
                    s.attempts += 1;
                    s.last_error = match &e {
                        SampleError::Unavailable { reason, .. } => reason.clone(),
                        other => other.to_string(),
                    };
                    let wait = s.backoff;
                    s.next_try = Some(now + wait);
                    s.backoff = (s.backoff * 2).min(self.builder.backoff_max);
                    return Err(SampleError::Unavailable {
                        reason: format!("{} (attempt {}; next retry in {:.1?})", s.last_error, s.attempts, wait),
                        source: Some(Box::new(e)),
                    });
                }
            }
        }
        let result = s.sampler.as_ref().map(|x| x.sample(request));
        match result {
            Some(Err(SampleError::Unavailable { reason, source })) => {
                // NVML went away under us: start over with backoff.
                s.sampler = None;
                s.last_error = reason.clone();
                s.next_try = Some(Instant::now() + s.backoff);
                Err(SampleError::Unavailable { reason, source })
            }
            Some(r) => r,
            None => Err(SampleError::unavailable("NVML is not loaded")),
        }
    }
}

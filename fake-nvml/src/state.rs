//! The fake's process-global state: init refcount, the fleet, the clock, handles, faults, event
//! sets and GPM samples. One `Mutex` guards it all; NVML calls are short, so contention is moot.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gpumon_core::{DeviceInfo, DeviceSample, DeviceState, FailureReason, Family};

use crate::config::{Clock, Config, Fault};
use crate::expected::{faulted_sample, identity};
use crate::ffi::*;
use crate::model::{DeviceExtras, Fleet};

/// Most devices (GPUs plus MIG instances) the fake can present.
pub const MAX_SLOTS: usize = 512;

const fn make_handles() -> [nvmlDevice_st; MAX_SLOTS] {
    let mut a = [const { nvmlDevice_st { slot: 0 } }; MAX_SLOTS];
    let mut i = 0;
    while i < MAX_SLOTS {
        a[i].slot = i as u32;
        i += 1;
    }
    a
}

/// Device handles are addresses in this table; a handle is validated by address arithmetic and
/// never dereferenced, so a garbage pointer from a client cannot crash the fake.
static HANDLES: [nvmlDevice_st; MAX_SLOTS] = make_handles();

pub(crate) fn handle_of(slot: usize) -> nvmlDevice_t {
    std::ptr::from_ref(&HANDLES[slot.min(MAX_SLOTS - 1)]).cast_mut()
}

pub(crate) fn slot_of(handle: nvmlDevice_t) -> Option<usize> {
    let base = HANDLES.as_ptr() as usize;
    let addr = handle as usize;
    let size = std::mem::size_of::<nvmlDevice_st>();
    let off = addr.checked_sub(base)?;
    (off % size == 0 && off / size < MAX_SLOTS).then_some(off / size)
}

pub(crate) type Ret = nvmlReturn_t;

/// Everything that survives between calls.
#[derive(Default)]
pub(crate) struct Global {
    pub init_count: u32,
    /// Set through the control API; replaces the environment.
    pub override_config: Option<Config>,
    pub fake: Option<Fake>,
    pub calls: HashMap<&'static str, u64>,
}

pub(crate) struct Slot {
    pub gpu: u32,
    pub parent: Option<usize>,
    pub children: Vec<usize>,
    pub mig_index: Option<u32>,
}

pub(crate) struct EventSetState {
    /// (slot, event mask) per registered device; registering again adds to the mask. A GPU's
    /// registrations (its MIG instances' too) are dropped when it is lost, as a driver drops
    /// them when the GPU falls off the bus: a client must register it again once it is back.
    pub registered: Vec<(usize, u64)>,
    pub delivered: HashMap<(usize, u64), u64>,
    /// The tick at which a full scan found nothing left to deliver. Events only change with the
    /// tick (or a registration), so waiting at the same tick need not recompute every GPU's
    /// model sample again — the difference between a wait that costs nothing, as the real
    /// driver's does, and one that burns CPU in whichever process watches XIDs.
    pub quiet_tick: Option<u64>,
}

impl EventSetState {
    /// Registers `slot` for `mask` (added to what it is registered for already).
    pub fn register(&mut self, slot: usize, mask: u64) {
        self.quiet_tick = None;
        match self.registered.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, m)) => *m |= mask,
            None => self.registered.push((slot, mask)),
        }
    }
}

pub(crate) struct GpmSampleState {
    pub taken: Option<(usize, u64)>,
}

/// An initialised fake.
pub(crate) struct Fake {
    pub config: Config,
    pub fleet: Fleet,
    pub slots: Vec<Slot>,
    pub physical: Vec<usize>,
    started: Instant,
    epoch_us: u64,
    pub manual_tick: u64,
    cache: Vec<Option<(u64, Arc<DeviceSample>)>>,
    pub dev_calls: Vec<u64>,
    pub sticky_lost: Vec<bool>,
    pub faults: Vec<Fault>,
    pub event_sets: HashMap<usize, EventSetState>,
    pub gpm_samples: HashMap<usize, GpmSampleState>,
    pub hung_tick: Option<u64>,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

pub(crate) struct Locked(MutexGuard<'static, Option<Global>>);

impl std::ops::Deref for Locked {
    type Target = Global;
    fn deref(&self) -> &Global {
        self.0.as_ref().expect("initialised in lock()")
    }
}
impl std::ops::DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Global {
        self.0.as_mut().expect("initialised in lock()")
    }
}

/// Locks the global state (a poisoned lock is recovered: a panic was already turned into
/// `NVML_ERROR_UNKNOWN` for its caller).
pub(crate) fn lock() -> Locked {
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(Global::default());
    }
    Locked(g)
}

/// Runs one exported function: counts it, checks initialisation and function-wide faults, and
/// turns a panic into `NVML_ERROR_UNKNOWN` so nothing unwinds into C.
pub(crate) fn guard(name: &'static str, f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    let timing = TIMING.load(Ordering::Relaxed);
    let started = timing.then(Instant::now);
    let rc = guard_inner(name, f);
    if let Some(t) = started {
        TIME_NS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        CALLS_TIMED.fetch_add(1, Ordering::Relaxed);
    }
    rc
}

/// Wakes event waits (`nvmlEventSetWait`) when something that could deliver an event changed
/// other than the wall clock: the tick set by hand or stepped by a call, faults, registrations,
/// the configuration. A generation count under a mutex, with a condition variable; `WAITERS`
/// spares the far more frequent callers (every stepped call) the notify when nobody waits.
pub(crate) static EVENT_GENERATION: Mutex<u64> = Mutex::new(0);
pub(crate) static EVENT_CHANGED: std::sync::Condvar = std::sync::Condvar::new();
pub(crate) static EVENT_WAITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// See [`EVENT_GENERATION`]. Call after the change, with the global state unlocked or locked
/// (a waiter never holds the generation lock while it takes the global one).
pub(crate) fn wake_event_waiters() {
    if EVENT_WAITERS.load(Ordering::SeqCst) > 0 {
        *EVENT_GENERATION.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        EVENT_CHANGED.notify_all();
    }
}

/// Whether exported calls measure their own duration (benchmarks; off by default).
pub(crate) static TIMING: AtomicBool = AtomicBool::new(false);
/// Nanoseconds spent inside exported calls while [`TIMING`] was on.
pub(crate) static TIME_NS: AtomicU64 = AtomicU64::new(0);
/// Calls measured while [`TIMING`] was on.
pub(crate) static CALLS_TIMED: AtomicU64 = AtomicU64::new(0);

fn guard_inner(name: &'static str, f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    let run = || -> Result<(), Ret> {
        let stepped = {
            let mut g = lock();
            *g.calls.entry(name).or_insert(0) += 1;
            let stepped = g
                .fake
                .as_ref()
                .is_some_and(|f| matches!(&f.config.clock, Clock::Step { function } if function == name));
            if !name.starts_with("nvmlInit") {
                if g.init_count == 0 {
                    return Err(NVML_ERROR_UNINITIALIZED);
                }
                if let Some(fake) = &g.fake {
                    fake.function_fault(name, None)?;
                }
            }
            stepped
        };
        if stepped {
            wake_event_waiters();
        }
        f()
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

impl Global {
    /// The current tick.
    pub fn tick(&self) -> u64 {
        match &self.fake {
            Some(f) => f.tick(&self.calls),
            None => 0,
        }
    }

    /// `nvmlInit*`.
    pub fn init(&mut self) -> Result<(), Ret> {
        if self.fake.is_none() {
            let config = match &self.override_config {
                Some(c) => c.clone(),
                None => Config::from_env().map_err(|e| {
                    eprintln!("gpumon-fake-nvml: {e}");
                    NVML_ERROR_UNKNOWN
                })?,
            };
            let fleet = Fleet::load(&config).map_err(|e| {
                eprintln!("gpumon-fake-nvml: {e}");
                NVML_ERROR_UNKNOWN
            })?;
            self.fake = Some(Fake::new(config, fleet));
        }
        if let Some(f) = &self.fake {
            if f.faults.iter().any(|f| matches!(f, Fault::DriverNotLoaded)) {
                return Err(NVML_ERROR_DRIVER_NOT_LOADED);
            }
        }
        self.init_count += 1;
        Ok(())
    }

    pub fn fake_mut(&mut self) -> Result<&mut Fake, Ret> {
        self.fake.as_mut().ok_or(NVML_ERROR_UNINITIALIZED)
    }
}

/// What a device-taking export sees.
pub(crate) struct Dev {
    pub slot: usize,
    pub tick: u64,
    pub info: Arc<DeviceInfo>,
    pub extras: DeviceExtras,
    pub sample: Arc<DeviceSample>,
}

impl Fake {
    fn new(config: Config, fleet: Fleet) -> Fake {
        let n = fleet.devices.len().min(MAX_SLOTS);
        let mut slots: Vec<Slot> = Vec::with_capacity(n);
        let mut physical = Vec::new();
        for (i, d) in fleet.devices.iter().take(n).enumerate() {
            match &d.mig {
                None => {
                    physical.push(i);
                    slots.push(Slot { gpu: d.index, parent: None, children: Vec::new(), mig_index: None });
                }
                Some(m) => {
                    let parent = physical.iter().copied().find(|&p| fleet.devices[p].uuid == m.parent_uuid);
                    if let Some(p) = parent {
                        slots[p].children.push(i);
                    }
                    slots.push(Slot { gpu: d.index, parent, children: Vec::new(), mig_index: Some(m.mig_index) });
                }
            }
        }
        let gpus = physical.len();
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let tick_us = tick_us(&config.clock);
        let epoch_us = now_us.saturating_sub(config.start_tick.saturating_mul(tick_us));
        Fake {
            faults: config.faults.clone(),
            manual_tick: config.start_tick,
            config,
            fleet,
            slots,
            physical,
            started: Instant::now(),
            epoch_us,
            cache: vec![None; n],
            dev_calls: vec![0; gpus.max(1) + 64],
            sticky_lost: vec![false; gpus.max(1) + 64],
            event_sets: HashMap::new(),
            gpm_samples: HashMap::new(),
            hung_tick: None,
        }
    }

    pub fn tick(&self, calls: &HashMap<&'static str, u64>) -> u64 {
        match &self.config.clock {
            Clock::Wall { tick_ms } => {
                self.config.start_tick + (self.started.elapsed().as_millis() as u64) / (*tick_ms).max(1)
            }
            Clock::Manual => self.manual_tick,
            Clock::Step { function } => {
                self.config.start_tick + calls.get(function.as_str()).copied().unwrap_or(0).saturating_sub(1)
            }
        }
    }

    /// Microseconds since the epoch at which `tick` starts (for NVML timestamps).
    /// When the wall clock moves to the tick after `tick`; `None` for the other clocks (they
    /// move only when told, which wakes event waits).
    pub fn next_tick_at(&self, tick: u64) -> Option<Instant> {
        match &self.config.clock {
            Clock::Wall { tick_ms } => {
                let n = (tick + 1).saturating_sub(self.config.start_tick);
                Some(self.started + std::time::Duration::from_millis(n.saturating_mul((*tick_ms).max(1))))
            }
            Clock::Manual | Clock::Step { .. } => None,
        }
    }

    /// The first tick after `after` at which an XID event can appear: the next ECC burst, the
    /// model's or an injected one. Nothing else makes XIDs, so an event wait sleeps until then
    /// (or its timeout), as the driver's wait sleeps until an event; a change of faults or
    /// configuration wakes it early to look again.
    pub fn next_xid_tick(&self, after: u64) -> Option<u64> {
        let model = self.fleet.mock.faults().iter().filter_map(|f| match *f {
            gpumon_mock::Fault::EccBurst { at_tick, .. } => Some(at_tick),
            _ => None,
        });
        let injected = self.faults.iter().filter_map(|f| match *f {
            Fault::EccBurst { tick, .. } => Some(tick),
            _ => None,
        });
        model.chain(injected).filter(|&t| t > after).min()
    }

    pub fn tick_start_us(&self, tick: u64) -> u64 {
        self.epoch_us + tick.saturating_mul(tick_us(&self.config.clock))
    }

    pub fn tick_len_us(&self) -> u64 {
        tick_us(&self.config.clock)
    }

    /// The (faulted) model sample of `slot` at `tick`, cached per tick.
    pub fn sample(&mut self, slot: usize, tick: u64) -> Arc<DeviceSample> {
        if let Some((t, s)) = &self.cache[slot] {
            if *t == tick {
                return s.clone();
            }
        }
        let s = Arc::new(faulted_sample(&self.fleet, &self.faults, slot, tick));
        self.cache[slot] = Some((tick, s.clone()));
        s
    }

    /// Forgets the cached samples, and what event sets found at this tick: faults changed, so an
    /// XID injected at (or before) the current tick must be looked for now, not at the next
    /// scheduled one.
    pub fn clear_cache(&mut self) {
        self.cache.iter_mut().for_each(|c| *c = None);
        self.event_sets.values_mut().for_each(|s| s.quiet_tick = None);
    }

    /// A function-wide (or, with `gpu`, device-specific) injected fault for `name`.
    pub fn function_fault(&self, name: &str, gpu: Option<u32>) -> Result<(), Ret> {
        for f in &self.faults {
            let (function, only, code) = match f {
                Fault::NotSupported { function, gpu } => (function, gpu, NVML_ERROR_NOT_SUPPORTED),
                Fault::NoPermission { function, gpu } => (function, gpu, NVML_ERROR_NO_PERMISSION),
                Fault::Unknown { function, gpu } => (function, gpu, NVML_ERROR_UNKNOWN),
                _ => continue,
            };
            let applies = match (only, gpu) {
                (None, None) => true,
                (Some(o), Some(g)) => *o == g,
                _ => false,
            };
            if applies && function == name {
                return Err(code);
            }
        }
        Ok(())
    }

    /// Whether physical GPU `gpu` is lost at `tick` (faults and the model's own state). A lost
    /// GPU loses its event registrations.
    pub fn gpu_lost(&mut self, gpu: u32, tick: u64) -> bool {
        let g = gpu as usize;
        let lost = self.sticky_lost.get(g).copied().unwrap_or(false)
            || self.physical.get(g).copied().is_some_and(|slot| self.sample(slot, tick).state == DeviceState::Lost);
        if lost {
            self.drop_registrations(gpu);
        }
        lost
    }

    /// Removes every event registration of physical GPU `gpu` and its MIG instances.
    pub fn drop_registrations(&mut self, gpu: u32) {
        let slots = &self.slots;
        for set in self.event_sets.values_mut() {
            set.registered.retain(|(slot, _)| slots.get(*slot).is_none_or(|s| s.gpu != gpu));
        }
    }

    /// In how many event sets physical GPU `gpu` (the device itself) is registered.
    pub fn registrations(&self, gpu: u32) -> u64 {
        let Some(&slot) = self.physical.get(gpu as usize) else { return 0 };
        self.event_sets.values().filter(|s| s.registered.iter().any(|(r, _)| *r == slot)).count() as u64
    }

    /// Whether MIG slot `slot` is absent (destroyed, or not yet created) at `tick`.
    pub fn mig_absent(&self, slot: usize, tick: u64) -> bool {
        let Some(s) = self.slots.get(slot) else { return false };
        let Some(mig) = s.mig_index else { return false };
        self.faults.iter().any(|f| {
            matches!(*f, Fault::MigAbsent { gpu, mig: m, from, until }
                if gpu == s.gpu && m == mig && tick >= from && until.is_none_or(|u| tick < u))
        })
    }

    /// Resolves and checks a device handle for a device-taking export.
    pub fn device(&mut self, name: &str, handle: nvmlDevice_t, tick: u64, family: Option<Family>) -> Result<Dev, Ret> {
        let slot = slot_of(handle).filter(|&s| s < self.slots.len()).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let gpu = self.slots[slot].gpu;
        let g = gpu as usize;
        if g < self.dev_calls.len() {
            self.dev_calls[g] += 1;
            let calls = self.dev_calls[g];
            if self
                .faults
                .iter()
                .any(|f| matches!(*f, Fault::LostAfterCalls { gpu: fg, calls: n } if fg == gpu && calls > n))
            {
                self.sticky_lost[g] = true;
            }
        }
        if self.gpu_lost(gpu, tick) {
            return Err(NVML_ERROR_GPU_IS_LOST);
        }
        if self.mig_absent(slot, tick) {
            // A destroyed MIG instance's handle is no longer valid.
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        self.function_fault(name, Some(gpu))?;
        let sample = self.sample(slot, tick);
        if sample.state == DeviceState::Lost {
            self.drop_registrations(gpu);
            return Err(NVML_ERROR_GPU_IS_LOST);
        }
        if let Some(family) = family {
            if let Some(f) = sample.errors.iter().find(|f| f.family == family) {
                return Err(match f.reason {
                    FailureReason::NoPermission => NVML_ERROR_NO_PERMISSION,
                    FailureReason::Timeout => NVML_ERROR_TIMEOUT,
                    _ => NVML_ERROR_UNKNOWN,
                });
            }
        }
        Ok(Dev {
            slot,
            tick,
            info: identity(&self.fleet, &self.faults, slot, tick),
            extras: self.fleet.extras.get(slot).cloned().unwrap_or_default(),
            sample,
        })
    }
}

fn tick_us(clock: &Clock) -> u64 {
    match clock {
        Clock::Wall { tick_ms } => tick_ms.saturating_mul(1000).max(1),
        _ => 1_000_000,
    }
}

/// Runs `f` on a checked device under the lock.
pub(crate) fn with_device<R>(
    name: &'static str,
    handle: nvmlDevice_t,
    family: Option<Family>,
    f: impl FnOnce(&mut Fake, &Dev) -> Result<R, Ret>,
) -> Result<R, Ret> {
    let mut g = lock();
    let tick = g.tick();
    let fake = g.fake_mut()?;
    let dev = fake.device(name, handle, tick, family)?;
    f(fake, &dev)
}

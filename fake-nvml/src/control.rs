//! Controlling the fake from a test: in-process through these functions, or — when the fake is
//! loaded with `dlopen` (as `nvml-wrapper` does) and so is a *different copy* of this code than
//! the one linked into the test — through the exported `gpumon_fake_nvml_*` C symbols, called
//! via `libloading` on the same library path.
//!
//! | Rust | C symbol | Effect |
//! |---|---|---|
//! | [`configure`] | `gpumon_fake_nvml_configure(const char *spec)` | replace the configuration (`key=value;…`, see [`crate::config`]); resets state |
//! | [`set_tick`] | `gpumon_fake_nvml_set_tick(u64)` | set the tick (switches a `wall` clock to `manual`) |
//! | [`tick`] | `gpumon_fake_nvml_get_tick() -> u64` | the current tick |
//! | [`inject`] | `gpumon_fake_nvml_inject(const char *faults)` | add faults at run time |
//! | [`clear_faults`] | `gpumon_fake_nvml_clear_faults()` | remove every fault, lost GPUs return |
//! | [`call_count`] | `gpumon_fake_nvml_call_count(const char *fn) -> u64` | calls of one NVML function so far |
//! | [`event_registrations`] | `gpumon_fake_nvml_event_registrations(u32 gpu) -> u64` | event sets GPU `gpu` is registered in now (a lost GPU loses its registrations) |
//! | [`device_calls`] | `gpumon_fake_nvml_device_calls(u32 gpu) -> u64` | calls that took a handle of GPU `gpu` (or of its MIG instances) so far — what would wake a sleeping GPU |
//! | [`reset`] | `gpumon_fake_nvml_reset()` | forget everything (next `nvmlInit` reads the environment) |
//! | [`set_timing`] | `gpumon_fake_nvml_set_timing(int on)` | measure time spent inside NVML calls (benchmarks) |
//! | [`time_spent`] | `gpumon_fake_nvml_time_ns(u64 *calls) -> u64` | nanoseconds inside calls (and how many) since timing was switched on |
//!
//! The C functions return 0 on success and `NVML_ERROR_INVALID_ARGUMENT` for a bad spec (the
//! reason is printed to stderr).

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::config::{parse_faults, Clock, Config, ConfigError};
use crate::ffi::{nvmlReturn_t, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNKNOWN, NVML_SUCCESS};
use crate::state::{lock, wake_event_waiters};

/// Replaces the configuration; the fleet is rebuilt at the next call (or now, if NVML is
/// initialised). Counters, ticks and faults start afresh.
pub fn configure(config: Config) {
    {
        let mut g = lock();
        g.override_config = Some(config);
        g.fake = None;
        g.calls.clear();
        if g.init_count > 0 {
            let n = g.init_count;
            g.init_count = 0;
            for _ in 0..n {
                let _ = g.init();
            }
        }
    }
    wake_event_waiters();
}

/// Sets the tick; a `wall` clock becomes `manual`.
pub fn set_tick(tick: u64) {
    {
        let mut g = lock();
        if let Some(f) = g.fake.as_mut() {
            if !matches!(f.config.clock, Clock::Manual) {
                f.config.clock = Clock::Manual;
            }
            f.manual_tick = tick;
        } else {
            let c = g.override_config.get_or_insert_with(|| Config::from_env().unwrap_or_default());
            c.clock = Clock::Manual;
            c.start_tick = tick;
        }
    }
    wake_event_waiters();
}

/// The current tick.
pub fn tick() -> u64 {
    lock().tick()
}

/// Adds faults (see [`crate::config`]) to the running fake, or to the configuration it will
/// start with.
///
/// # Errors
/// [`ConfigError`] for a bad spec.
pub fn inject(spec: &str) -> Result<(), ConfigError> {
    let faults = parse_faults(spec)?;
    {
        let mut g = lock();
        match g.fake.as_mut() {
            Some(f) => {
                f.faults.extend(faults);
                f.clear_cache();
            }
            None => {
                g.override_config.get_or_insert_with(|| Config::from_env().unwrap_or_default()).faults.extend(faults)
            }
        }
    }
    wake_event_waiters();
    Ok(())
}

/// Removes every fault; lost GPUs answer again.
pub fn clear_faults() {
    {
        let mut g = lock();
        if let Some(f) = g.fake.as_mut() {
            f.faults.clear();
            f.sticky_lost.iter_mut().for_each(|l| *l = false);
            f.clear_cache();
        }
        if let Some(c) = g.override_config.as_mut() {
            c.faults.clear();
        }
    }
    wake_event_waiters();
}

/// How many times the named NVML function was called.
pub fn call_count(function: &str) -> u64 {
    lock().calls.get(function).copied().unwrap_or(0)
}

/// In how many event sets physical GPU `gpu` is registered now. Registrations are dropped
/// when the GPU is lost, so after it returns this is 0 until a client registers it again.
pub fn event_registrations(gpu: u32) -> u64 {
    lock().fake.as_ref().map_or(0, |f| f.registrations(gpu))
}

/// How many exported calls took a handle of physical GPU `gpu` (or of one of its MIG
/// instances) since the fake was configured — the calls that would reach, and wake, the GPU.
/// Handle lookups (`nvmlDeviceGetHandleByIndex*`, by UUID, …) count too.
pub fn device_calls(gpu: u32) -> u64 {
    lock().fake.as_ref().and_then(|f| f.dev_calls.get(gpu as usize).copied()).unwrap_or(0)
}

/// Forgets everything, including an in-process configuration.
pub fn reset() {
    {
        let mut g = lock();
        g.override_config = None;
        g.fake = None;
        g.calls.clear();
        g.init_count = 0;
    }
    wake_event_waiters();
}

fn c_str<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the contract of the C functions.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

fn ffi(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(NVML_ERROR_UNKNOWN)
}

fn report(e: &ConfigError) -> nvmlReturn_t {
    eprintln!("gpumon-fake-nvml: {e}");
    NVML_ERROR_INVALID_ARGUMENT
}

/// C: see [`configure`]. `spec` is `key=value;…`.
///
/// # Safety
/// `spec` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpumon_fake_nvml_configure(spec: *const c_char) -> nvmlReturn_t {
    ffi(|| match c_str(spec).map(Config::parse) {
        Some(Ok(c)) => {
            configure(c);
            NVML_SUCCESS
        }
        Some(Err(e)) => report(&e),
        None => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// C: see [`set_tick`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_set_tick(tick: u64) -> nvmlReturn_t {
    ffi(|| {
        set_tick(tick);
        NVML_SUCCESS
    })
}

/// C: see [`tick`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_get_tick() -> u64 {
    catch_unwind(tick).unwrap_or(0)
}

/// C: see [`inject`].
///
/// # Safety
/// `spec` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpumon_fake_nvml_inject(spec: *const c_char) -> nvmlReturn_t {
    ffi(|| match c_str(spec).map(inject) {
        Some(Ok(())) => NVML_SUCCESS,
        Some(Err(e)) => report(&e),
        None => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// C: see [`clear_faults`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_clear_faults() -> nvmlReturn_t {
    ffi(|| {
        clear_faults();
        NVML_SUCCESS
    })
}

/// C: see [`call_count`].
///
/// # Safety
/// `function` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpumon_fake_nvml_call_count(function: *const c_char) -> u64 {
    catch_unwind(|| c_str(function).map(call_count).unwrap_or(0)).unwrap_or(0)
}

/// C: see [`event_registrations`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_event_registrations(gpu: u32) -> u64 {
    catch_unwind(|| event_registrations(gpu)).unwrap_or(0)
}

/// C: see [`device_calls`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_device_calls(gpu: u32) -> u64 {
    catch_unwind(|| device_calls(gpu)).unwrap_or(0)
}

/// C: see [`reset`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_reset() -> nvmlReturn_t {
    ffi(|| {
        reset();
        NVML_SUCCESS
    })
}

/// Switches time measurement of every exported call on or off (and resets the totals).
pub fn set_timing(on: bool) {
    use std::sync::atomic::Ordering;
    crate::state::TIME_NS.store(0, Ordering::Relaxed);
    crate::state::CALLS_TIMED.store(0, Ordering::Relaxed);
    crate::state::TIMING.store(on, Ordering::Relaxed);
}

/// (nanoseconds spent inside exported calls, calls measured) since [`set_timing`]`(true)`.
pub fn time_spent() -> (u64, u64) {
    use std::sync::atomic::Ordering;
    (crate::state::TIME_NS.load(Ordering::Relaxed), crate::state::CALLS_TIMED.load(Ordering::Relaxed))
}

/// C: see [`set_timing`].
#[unsafe(no_mangle)]
pub extern "C" fn gpumon_fake_nvml_set_timing(on: std::ffi::c_int) -> nvmlReturn_t {
    set_timing(on != 0);
    NVML_SUCCESS
}

/// C: see [`time_spent`]; `calls` may be null.
///
/// # Safety
/// `calls` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpumon_fake_nvml_time_ns(calls: *mut u64) -> u64 {
    let (ns, n) = time_spent();
    if !calls.is_null() {
        // SAFETY: per the contract above.
        unsafe { calls.write_unaligned(n) };
    }
    ns
}

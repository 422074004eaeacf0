//! The fake's `nvmlEventSetWait` sleeps like the driver's: a wait with nothing to deliver lasts
//! its whole timeout, and a change that produces an event (here the tick, moved by hand) wakes it
//! at once — so gpumon's XID watcher can wait in long slices and still count an XID promptly.
//! On the wall clock it sleeps through quiet ticks until the tick of the next scheduled XID.
//! And dropping a sampler whose watcher waits in long slices does not wait for the slice.

mod common;

use std::time::{Duration, Instant};

use common::Fake;
use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler};

type Init = unsafe extern "C" fn() -> u32;
type Create = unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> u32;
type ByIndex = unsafe extern "C" fn(u32, *mut *mut std::ffi::c_void) -> u32;
type Register = unsafe extern "C" fn(*mut std::ffi::c_void, u64, *mut std::ffi::c_void) -> u32;
/// `nvmlEventData_t` as the fake lays it out: device, type, data, GPU and compute instance.
#[repr(C)]
#[derive(Default)]
struct EventData {
    device: usize,
    event_type: u64,
    event_data: u64,
    gpu_instance: u32,
    compute_instance: u32,
}
type Wait = unsafe extern "C" fn(*mut std::ffi::c_void, *mut EventData, u32) -> u32;

const XID_CRITICAL: u64 = 0x8;
const TIMEOUT: u32 = 10;

/// Initialises the fake, creates an event set with GPU 1 registered for critical XIDs, and
/// returns the set (as an address, to cross threads) and `nvmlEventSetWait_v2`.
fn xid_set_on_gpu1(fake: &Fake) -> (usize, Wait) {
    let (init, create, by_index, register): (Init, Create, ByIndex, Register) = (
        fake.raw("nvmlInit_v2"),
        fake.raw("nvmlEventSetCreate"),
        fake.raw("nvmlDeviceGetHandleByIndex_v2"),
        fake.raw("nvmlDeviceRegisterEvents"),
    );
    let mut set = std::ptr::null_mut();
    let mut gpu1 = std::ptr::null_mut();
    unsafe {
        assert_eq!(init(), 0);
        assert_eq!(create(&mut set), 0);
        assert_eq!(by_index(1, &mut gpu1), 0);
        assert_eq!(register(gpu1, XID_CRITICAL, set), 0);
    }
    (set as usize, fake.raw("nvmlEventSetWait_v2"))
}

#[test]
fn a_quiet_wait_lasts_its_timeout_and_a_tick_change_wakes_it_with_the_event() {
    let fake = Fake::new("scenario=idle;clock=manual;faults=ecc-burst:1@2:48");
    let (set, wait) = xid_set_on_gpu1(&fake);

    // Nothing happens: the wait returns TIMEOUT, and not before its timeout.
    let started = Instant::now();
    let mut ev = EventData::default();
    assert_eq!(unsafe { wait(set as *mut _, &mut ev, 300) }, TIMEOUT);
    assert!(started.elapsed() >= Duration::from_millis(300), "returned after {:?}", started.elapsed());

    // A long wait is woken by the tick moving to the XID's tick, and delivers it.
    let waiter = std::thread::spawn(move || {
        let mut ev = EventData::default();
        let started = Instant::now();
        let rc = unsafe { wait(set as *mut _, &mut ev, 20_000) };
        (rc, ev.event_type, ev.event_data, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    fake.set_tick(2);
    let (rc, kind, code, took) = waiter.join().unwrap();
    assert_eq!((rc, kind, code), (0, XID_CRITICAL, 48), "the XID of tick 2");
    assert!(took < Duration::from_secs(10), "woken by the change, not by the 20 s timeout: {took:?}");
}

/// Voluntary context switches of the calling thread so far: each sleep that ends is one.
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("/proc/thread-self/status");
    let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).expect("voluntary_ctxt_switches");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a count")
}

/// On the wall clock the wait sleeps through quiet ticks, as the driver's sleeps until an event:
/// with 2 ms ticks, a 400 ms wait with no XID ahead wakes a handful of times, not once per tick
/// (200 times); and with an ECC burst scheduled ahead, a long wait ends at that tick, with the
/// event, though nothing else moves.
#[test]
fn a_wall_clock_wait_sleeps_through_quiet_ticks_and_wakes_at_the_xid_tick() {
    let fake = Fake::new("scenario=idle;clock=wall;tick_ms=2;faults=ecc-burst:1@300:48");
    let (set, wait) = xid_set_on_gpu1(&fake);
    let started = Instant::now();
    let (rc, switches) = std::thread::spawn(move || {
        let mut ev = EventData::default();
        let before = voluntary_switches();
        let rc = unsafe { wait(set as *mut _, &mut ev, 400) };
        (rc, voluntary_switches() - before)
    })
    .join()
    .unwrap();
    assert_eq!(rc, TIMEOUT, "no XID before tick 300 (600 ms)");
    assert!(switches < 20, "the wait woke {switches} times in 400 ms of 2 ms ticks");

    // Tick 300 starts 600 ms after nvmlInit: a 20 s wait returns its XID then.
    let mut ev = EventData::default();
    assert_eq!(unsafe { wait(set as *mut _, &mut ev, 20_000) }, 0);
    let took = started.elapsed();
    assert_eq!((ev.event_type, ev.event_data), (XID_CRITICAL, 48));
    assert!(took >= Duration::from_millis(550), "delivered before its tick: {took:?}");
    assert!(took < Duration::from_secs(10), "woken at the XID's tick, not by the 20 s timeout: {took:?}");
}

/// An ECC burst injected at the current tick (on a wall clock whose next tick is far away) is
/// delivered to a wait already sleeping, at once — not at the wait's timeout.
#[test]
fn an_xid_injected_at_the_current_tick_wakes_a_sleeping_wait() {
    let fake = Fake::new("scenario=idle;clock=wall;tick_ms=600000");
    let (set, wait) = xid_set_on_gpu1(&fake);
    // A first wait scans tick 0 and finds nothing.
    let mut ev = EventData::default();
    assert_eq!(unsafe { wait(set as *mut _, &mut ev, 50) }, TIMEOUT);
    let waiter = std::thread::spawn(move || {
        let mut ev = EventData::default();
        let started = Instant::now();
        let rc = unsafe { wait(set as *mut _, &mut ev, 20_000) };
        (rc, ev.event_data, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    fake.inject(&format!("ecc-burst:1@{}:48", fake.tick()));
    let (rc, code, took) = waiter.join().unwrap();
    assert_eq!((rc, code), (0, 48), "the injected XID");
    assert!(took < Duration::from_secs(10), "woken by the injection, not by the 20 s timeout: {took:?}");
}

#[test]
fn an_xid_is_counted_promptly_with_a_long_watcher_slice_and_drop_does_not_wait_for_it() {
    let fake = Fake::new("scenario=idle;clock=manual;faults=ecc-burst:1@2:48");
    let s = NvmlSampler::builder()
        .library_path(fake.library())
        .xid_poll_interval(Duration::from_secs(30))
        .build()
        .expect("NvmlSampler on the fake");
    let all = SampleRequest::new(MetricSet::everything(), DeviceFilter::all());
    assert!(s.sample(&all).unwrap().devices[1].xid_errors.is_empty());
    fake.set_tick(2);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = s.sample(&all).unwrap();
        if let Some(x) = snap.devices[1].xid_errors.first() {
            assert_eq!((x.code, x.count), (48, 1));
            break;
        }
        assert!(Instant::now() < deadline, "XID not counted within 10 s with a 30 s watcher slice");
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    drop(s);
    assert!(started.elapsed() < Duration::from_secs(5), "drop waited {:?} for the watcher", started.elapsed());
}

//! Every NVML symbol (nvml.h's functions and everything nvml-wrapper-sys looks up) is exported;
//! the unimplemented ones answer NOT_SUPPORTED, and UNINITIALIZED before init.

mod common;

use common::Fake;

const SYMBOLS: &str = include_str!("../nvml/symbols.txt");

#[test]
fn every_listed_symbol_is_exported() {
    let fake = Fake::new("clock=manual");
    let lib = unsafe { libloading::Library::new(fake.library()) }.unwrap();
    let names: Vec<&str> = SYMBOLS.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    assert!(names.len() > 400, "symbols.txt lists {} names", names.len());
    let missing: Vec<&str> =
        names.iter().copied().filter(|n| unsafe { lib.get::<unsafe extern "C" fn()>(n.as_bytes()) }.is_err()).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // Both old and versioned names of the functions clients use.
    for n in [
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetPciInfo_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlEventSetWait",
        "nvmlEventSetWait_v2",
    ] {
        assert!(names.contains(&n), "{n}");
    }
}

#[test]
fn stubs_answer_not_supported_and_uninitialized_before_init() {
    let fake = Fake::new("clock=manual");
    type F0 = unsafe extern "C" fn() -> u32;
    let stub: F0 = fake.raw("nvmlDeviceGetBrand");
    let init: F0 = fake.raw("nvmlInit_v2");
    let shutdown: F0 = fake.raw("nvmlShutdown");
    unsafe {
        assert_eq!(stub(), 1, "UNINITIALIZED before nvmlInit");
        assert_eq!(init(), 0);
        assert_eq!(stub(), 3, "NOT_SUPPORTED");
        assert_eq!(shutdown(), 0);
    }
    assert_eq!(fake.calls("nvmlDeviceGetBrand"), 2);
}

#[test]
fn bad_pointers_and_short_buffers_are_errors_not_crashes() {
    let fake = Fake::new("clock=manual");
    type Init = unsafe extern "C" fn() -> u32;
    type ByIndex = unsafe extern "C" fn(u32, *mut *mut std::ffi::c_void) -> u32;
    type Name = unsafe extern "C" fn(*mut std::ffi::c_void, *mut std::ffi::c_char, u32) -> u32;
    type Procs = unsafe extern "C" fn(*mut std::ffi::c_void, *mut u32, *mut [u8; 24]) -> u32;
    type Power = unsafe extern "C" fn(*mut std::ffi::c_void, *mut u32) -> u32;
    let init: Init = fake.raw("nvmlInit_v2");
    let by_index: ByIndex = fake.raw("nvmlDeviceGetHandleByIndex_v2");
    let name: Name = fake.raw("nvmlDeviceGetName");
    let procs: Procs = fake.raw("nvmlDeviceGetComputeRunningProcesses_v3");
    let power: Power = fake.raw("nvmlDeviceGetPowerUsage");
    unsafe {
        assert_eq!(init(), 0);
        let mut h = std::ptr::null_mut();
        assert_eq!(by_index(0, std::ptr::null_mut()), 2, "null out-pointer");
        assert_eq!(by_index(99, &mut h), 2, "index out of range");
        assert_eq!(by_index(0, &mut h), 0);
        let mut buf = [0 as std::ffi::c_char; 4];
        assert_eq!(name(h, buf.as_mut_ptr(), 4), 7, "INSUFFICIENT_SIZE");
        let bogus = 0x1234usize as *mut std::ffi::c_void;
        let mut mw = 0u32;
        assert_eq!(power(bogus, &mut mw), 2, "a garbage handle is rejected, not dereferenced");
        assert_eq!(power(h, std::ptr::null_mut()), 2);
        let mut n = 0u32;
        let rc = procs(h, &mut n, std::ptr::null_mut());
        assert!(rc == 7 && n > 0, "count query: rc {rc}, n {n}");
        let mut small = 1u32;
        let mut one = [[0u8; 24]; 1];
        if n > 1 {
            assert_eq!(procs(h, &mut small, one.as_mut_ptr()), 7);
            assert_eq!(small, n, "required size written back");
        }
    }
}

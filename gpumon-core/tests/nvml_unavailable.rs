//! The NVML backend without NVML: clear `Unavailable` errors, and the lazy sampler's backoff.
//! (Everything that needs a library runs against the fake in fake-nvml/tests/.)
#![cfg(feature = "nvml")]

use std::time::Duration;

use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{SampleError, SampleRequest, Sampler};

#[test]
fn missing_library_names_the_path() {
    let e = NvmlSampler::builder().library_path("/nonexistent/libnvidia-ml.so.1").build().unwrap_err();
    match e {
        SampleError::Unavailable { reason, source } => {
            assert!(reason.starts_with("could not load /nonexistent/libnvidia-ml.so.1: "), "{reason}");
            assert!(source.is_some());
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_library_without_nvml_is_unavailable() {
    let libm = ["/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(libm) = libm else { return };
    let e = NvmlSampler::builder().library_path(libm).build().unwrap_err();
    assert!(e.to_string().contains("not a usable NVML library"), "{e}");
}

#[test]
fn lazy_sampler_backs_off_exponentially() {
    let lazy = NvmlSampler::builder()
        .library_path("/nonexistent/libnvidia-ml.so.1")
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(40))
        .build_lazy();
    assert_eq!(lazy.name(), "nvml");
    let req = SampleRequest::default();
    let start = std::time::Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_millis(200) {
        let e = lazy.sample(&req).unwrap_err();
        assert!(matches!(e, SampleError::Unavailable { .. }));
        assert!(e.to_string().contains("next retry in"), "{e}");
        calls += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    // Retries 10, 20, 40, 40, ... ms apart: far fewer attempts than calls, but more than one.
    let n = lazy.failed_attempts();
    assert!((3..=12).contains(&n) && calls > 2 * n, "{n} attempts in {calls} calls over 200 ms");
    assert!(!lazy.is_loaded());
}

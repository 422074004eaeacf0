//! One NVML sampling tick of 8 GPUs (`h100x8`) through gpumon's `NvmlSampler` on the fake,
//! split into time inside the fake's exported functions (measured by the fake itself) and time
//! in gpumon + nvml-wrapper (the rest). On real hardware the NVML share is what matters: a
//! real call costs tens of microseconds, so gpumon's own share should stay well below that.
//!
//! `cargo bench -p gpumon-fake-nvml --bench nvml_tick`

use std::ffi::c_int;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon_core::nvml::NvmlSampler;
use gpumon_core::{DeviceFilter, Family, MetricSet, SampleRequest, Sampler};

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("libgpumon_fake_nvml.so"))
        .find(|p| p.is_file())
        .expect("build the fake first: cargo build -p gpumon-fake-nvml --release");
    let dir = std::env::temp_dir().join(format!("gpumon-fake-nvml-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("libnvidia-ml.so.1");
    std::fs::copy(lib, &path).unwrap();
    path
}

struct Control {
    _lib: libloading::Library,
    set_timing: extern "C" fn(c_int) -> u32,
    time_ns: unsafe extern "C" fn(*mut u64) -> u64,
}

fn control(path: &PathBuf) -> Control {
    let lib = unsafe { libloading::Library::new(path) }.unwrap();
    unsafe {
        let configure: unsafe extern "C" fn(*const std::ffi::c_char) -> u32 =
            *lib.get(b"gpumon_fake_nvml_configure").unwrap();
        assert_eq!(configure(c"profile=h100x8;clock=manual".as_ptr()), 0);
        Control {
            set_timing: *lib.get(b"gpumon_fake_nvml_set_timing").unwrap(),
            time_ns: *lib.get(b"gpumon_fake_nvml_time_ns").unwrap(),
            _lib: lib,
        }
    }
}

fn split(name: &str, sampler: &NvmlSampler, ctl: &Control, req: &SampleRequest) {
    let n = 2000u32;
    for _ in 0..50 {
        sampler.sample(req).unwrap();
    }
    (ctl.set_timing)(1);
    let t = Instant::now();
    for _ in 0..n {
        black_box(sampler.sample(req).unwrap());
    }
    let total = t.elapsed();
    let mut calls = 0;
    let fake = Duration::from_nanos(unsafe { (ctl.time_ns)(&mut calls) });
    (ctl.set_timing)(0);
    let per = |d: Duration| d / n;
    let gpumon = total.saturating_sub(fake);
    println!(
        "{name}: tick {:?} = fake {:?} ({} NVML calls, {:?}/call) + gpumon/nvml-wrapper {:?} ({:.0}% / {:.0}%); \
         gpumon per NVML call {:?}",
        per(total),
        per(fake),
        calls / u64::from(n),
        fake / u32::try_from(calls.max(1)).unwrap_or(u32::MAX),
        per(gpumon),
        100.0 * fake.as_secs_f64() / total.as_secs_f64(),
        100.0 * gpumon.as_secs_f64() / total.as_secs_f64(),
        gpumon / u32::try_from(calls.max(1)).unwrap_or(u32::MAX),
    );
}

fn bench(c: &mut Criterion) {
    let path = library();
    let ctl = control(&path);
    let sampler = NvmlSampler::builder().library_path(&path).xid_events(false).build().unwrap();
    // What a default agent reads: the default families and the opt-in ones diagnosis reads.
    let default = SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::all());
    let everything = SampleRequest::new(MetricSet::everything(), DeviceFilter::all());
    let basic = SampleRequest::new(
        [Family::Utilization, Family::Memory, Family::Temperature, Family::Power].into_iter().collect(),
        DeviceFilter::all(),
    );
    split("basic (util, memory, temp, power)", &sampler, &ctl, &basic);
    split("default families", &sampler, &ctl, &default);
    split("every family", &sampler, &ctl, &everything);

    let mut g = c.benchmark_group("nvml_tick_8gpu");
    g.bench_function("basic", |b| b.iter(|| black_box(sampler.sample(&basic).unwrap())));
    g.bench_function("default", |b| b.iter(|| black_box(sampler.sample(&default).unwrap())));
    g.bench_function("everything", |b| b.iter(|| black_box(sampler.sample(&everything).unwrap())));
    g.finish();

    // One exported function called directly, no nvml-wrapper: the fake's per-call floor.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let by_index: unsafe extern "C" fn(u32, *mut *mut std::ffi::c_void) -> u32 =
        unsafe { *lib.get(b"nvmlDeviceGetHandleByIndex_v2").unwrap() };
    let power: unsafe extern "C" fn(*mut std::ffi::c_void, *mut u32) -> u32 =
        unsafe { *lib.get(b"nvmlDeviceGetPowerUsage").unwrap() };
    let mut h = std::ptr::null_mut();
    assert_eq!(unsafe { by_index(0, &mut h) }, 0);
    c.bench_function("fake_direct/nvmlDeviceGetPowerUsage", |b| {
        b.iter(|| {
            let mut mw = 0;
            unsafe { power(black_box(h), &mut mw) };
            black_box(mw)
        })
    });
    drop(sampler);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

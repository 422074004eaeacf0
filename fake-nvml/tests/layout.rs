//! The fake's `#[repr(C)]` structs against (a) nvml-wrapper-sys's bindgen output, always, and
//! (b) NVIDIA's own nvml.h through a C compiler. The header is not redistributable, so (b) is
//! `#[ignore]`d and run by `scripts/test.sh`, which exports `GPUMON_TEST_NVML_INCLUDE_DIR` (the
//! `nvidia-nvml-dev` wheel that `scripts/backends/install.sh` puts into the venv); nothing is
//! downloaded at test time. The C program is also linked against the fake and calls it through
//! the header's macros (`nvmlInit` → `nvmlInit_v2`, …).

mod common;

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use gpumon_fake_nvml::ffi as f;
use nvml_wrapper_sys::bindings as b;

macro_rules! same_layout {
    ($ours:ty, $theirs:ty, [$($field:ident),*]) => {{
        assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), "sizeof {}", stringify!($ours));
        $( assert_eq!(offset_of!($ours, $field), offset_of!($theirs, $field), "{}.{}", stringify!($ours), stringify!($field)); )*
    }};
}

#[test]
fn structs_match_nvml_wrapper_sys() {
    same_layout!(f::nvmlUtilization_t, b::nvmlUtilization_t, [gpu, memory]);
    same_layout!(f::nvmlMemory_t, b::nvmlMemory_t, [total, free, used]);
    same_layout!(f::nvmlMemory_v2_t, b::nvmlMemory_v2_t, [version, total, reserved, free, used]);
    same_layout!(
        f::nvmlPciInfo_t,
        b::nvmlPciInfo_t,
        [busIdLegacy, domain, bus, device, pciDeviceId, pciSubSystemId, busId]
    );
    same_layout!(f::nvmlProcessInfo_v1_t, b::nvmlProcessInfo_v1_t, [pid, usedGpuMemory]);
    same_layout!(f::nvmlProcessInfo_t, b::nvmlProcessInfo_t, [pid, usedGpuMemory, gpuInstanceId, computeInstanceId]);
    same_layout!(f::nvmlSample_t, b::nvmlSample_t, [timeStamp, sampleValue]);
    same_layout!(
        f::nvmlProcessUtilizationSample_t,
        b::nvmlProcessUtilizationSample_t,
        [pid, timeStamp, smUtil, memUtil, encUtil, decUtil]
    );
    same_layout!(
        f::nvmlFieldValue_t,
        b::nvmlFieldValue_t,
        [fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value]
    );
    same_layout!(
        f::nvmlEventData_t,
        b::nvmlEventData_t,
        [device, eventType, eventData, gpuInstanceId, computeInstanceId]
    );
    same_layout!(f::nvmlGpmMetric_t, b::nvmlGpmMetric_t, [metricId, nvmlReturn, value, metricInfo]);
    same_layout!(f::nvmlGpmSupport_t, b::nvmlGpmSupport_t, [version, isSupportedDevice]);
    assert_eq!(size_of::<f::nvmlValue_t>(), size_of::<b::nvmlValue_t>());
    for (name, ours, theirs) in [
        ("version", offset_of!(f::nvmlGpmMetricsGetHead_t, version), offset_of!(b::nvmlGpmMetricsGet_t, version)),
        (
            "numMetrics",
            offset_of!(f::nvmlGpmMetricsGetHead_t, numMetrics),
            offset_of!(b::nvmlGpmMetricsGet_t, numMetrics),
        ),
        ("sample1", offset_of!(f::nvmlGpmMetricsGetHead_t, sample1), offset_of!(b::nvmlGpmMetricsGet_t, sample1)),
        ("sample2", offset_of!(f::nvmlGpmMetricsGetHead_t, sample2), offset_of!(b::nvmlGpmMetricsGet_t, sample2)),
        ("metrics", offset_of!(f::nvmlGpmMetricsGetHead_t, metrics), offset_of!(b::nvmlGpmMetricsGet_t, metrics)),
    ] {
        assert_eq!(ours, theirs, "nvmlGpmMetricsGet_t.{name}");
    }
    assert_eq!(f::nvmlMemory_v2, 0x0200_0028);
    assert_eq!(size_of::<f::nvmlProcessInfo_t>(), 24);
}

/// The directory holding NVIDIA's nvml.h, as `scripts/test.sh` exports it.
fn header_dir() -> PathBuf {
    let dir = PathBuf::from(gpumon_mock::test_env::require_env("GPUMON_TEST_NVML_INCLUDE_DIR"));
    assert!(
        dir.join("nvml.h").is_file(),
        "no nvml.h in GPUMON_TEST_NVML_INCLUDE_DIR={} (scripts/backends/install.sh installs nvidia-nvml-dev)",
        dir.display()
    );
    dir
}

/// Rust's view of each (struct, field) as C's offsetof/sizeof lines print it.
fn rust_layout() -> Vec<String> {
    let mut v = Vec::new();
    macro_rules! s {
        ($c:literal, $t:ty, [$($field:ident),*]) => {{
            v.push(format!("sizeof {} {}", $c, size_of::<$t>()));
            $( v.push(format!("offsetof {}.{} {}", $c, stringify!($field), offset_of!($t, $field))); )*
        }};
    }
    s!("nvmlUtilization_t", f::nvmlUtilization_t, [gpu, memory]);
    s!("nvmlMemory_t", f::nvmlMemory_t, [total, free, used]);
    s!("nvmlMemory_v2_t", f::nvmlMemory_v2_t, [version, total, reserved, free, used]);
    s!("nvmlPciInfo_t", f::nvmlPciInfo_t, [busIdLegacy, domain, bus, device, pciDeviceId, pciSubSystemId, busId]);
    s!("nvmlProcessInfo_v1_t", f::nvmlProcessInfo_v1_t, [pid, usedGpuMemory]);
    s!("nvmlProcessInfo_t", f::nvmlProcessInfo_t, [pid, usedGpuMemory, gpuInstanceId, computeInstanceId]);
    s!("nvmlSample_t", f::nvmlSample_t, [timeStamp, sampleValue]);
    s!(
        "nvmlProcessUtilizationSample_t",
        f::nvmlProcessUtilizationSample_t,
        [pid, timeStamp, smUtil, memUtil, encUtil, decUtil]
    );
    s!(
        "nvmlFieldValue_t",
        f::nvmlFieldValue_t,
        [fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value]
    );
    s!("nvmlEventData_t", f::nvmlEventData_t, [device, eventType, eventData, gpuInstanceId, computeInstanceId]);
    s!("nvmlGpmMetric_t", f::nvmlGpmMetric_t, [metricId, nvmlReturn, value, metricInfo]);
    s!("nvmlGpmSupport_t", f::nvmlGpmSupport_t, [version, isSupportedDevice]);
    s!("nvmlTemperature_t", f::nvmlTemperature_t, [version, sensorType, temperature]);
    v.push(format!("sizeof nvmlValue_t {}", size_of::<f::nvmlValue_t>()));
    for (field, off) in [
        ("version", offset_of!(f::nvmlGpmMetricsGetHead_t, version)),
        ("numMetrics", offset_of!(f::nvmlGpmMetricsGetHead_t, numMetrics)),
        ("sample1", offset_of!(f::nvmlGpmMetricsGetHead_t, sample1)),
        ("sample2", offset_of!(f::nvmlGpmMetricsGetHead_t, sample2)),
        ("metrics", offset_of!(f::nvmlGpmMetricsGetHead_t, metrics)),
    ] {
        v.push(format!("offsetof nvmlGpmMetricsGet_t.{field} {off}"));
    }
    v.push(format!("version nvmlMemory_v2 {}", f::nvmlMemory_v2));
    v.push(format!("version nvmlTemperature_v1 {}", f::nvmlTemperature_v1));
    v
}

const C_PROGRAM: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include "nvml.h"
#define S(t) printf("sizeof %s %zu\n", #t, sizeof(t));
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(t, f));
int main(int argc, char **argv) {
    S(nvmlUtilization_t) O(nvmlUtilization_t, gpu) O(nvmlUtilization_t, memory)
    S(nvmlMemory_t) O(nvmlMemory_t, total) O(nvmlMemory_t, free) O(nvmlMemory_t, used)
    S(nvmlMemory_v2_t) O(nvmlMemory_v2_t, version) O(nvmlMemory_v2_t, total) O(nvmlMemory_v2_t, reserved) O(nvmlMemory_v2_t, free) O(nvmlMemory_v2_t, used)
    S(nvmlPciInfo_t) O(nvmlPciInfo_t, busIdLegacy) O(nvmlPciInfo_t, domain) O(nvmlPciInfo_t, bus) O(nvmlPciInfo_t, device) O(nvmlPciInfo_t, pciDeviceId) O(nvmlPciInfo_t, pciSubSystemId) O(nvmlPciInfo_t, busId)
    S(nvmlProcessInfo_v1_t) O(nvmlProcessInfo_v1_t, pid) O(nvmlProcessInfo_v1_t, usedGpuMemory)
    S(nvmlProcessInfo_t) O(nvmlProcessInfo_t, pid) O(nvmlProcessInfo_t, usedGpuMemory) O(nvmlProcessInfo_t, gpuInstanceId) O(nvmlProcessInfo_t, computeInstanceId)
    S(nvmlSample_t) O(nvmlSample_t, timeStamp) O(nvmlSample_t, sampleValue)
    S(nvmlProcessUtilizationSample_t) O(nvmlProcessUtilizationSample_t, pid) O(nvmlProcessUtilizationSample_t, timeStamp) O(nvmlProcessUtilizationSample_t, smUtil) O(nvmlProcessUtilizationSample_t, memUtil) O(nvmlProcessUtilizationSample_t, encUtil) O(nvmlProcessUtilizationSample_t, decUtil)
    S(nvmlFieldValue_t) O(nvmlFieldValue_t, fieldId) O(nvmlFieldValue_t, scopeId) O(nvmlFieldValue_t, timestamp) O(nvmlFieldValue_t, latencyUsec) O(nvmlFieldValue_t, valueType) O(nvmlFieldValue_t, nvmlReturn) O(nvmlFieldValue_t, value)
    S(nvmlEventData_t) O(nvmlEventData_t, device) O(nvmlEventData_t, eventType) O(nvmlEventData_t, eventData) O(nvmlEventData_t, gpuInstanceId) O(nvmlEventData_t, computeInstanceId)
    S(nvmlGpmMetric_t) O(nvmlGpmMetric_t, metricId) O(nvmlGpmMetric_t, nvmlReturn) O(nvmlGpmMetric_t, value) O(nvmlGpmMetric_t, metricInfo)
    S(nvmlGpmSupport_t) O(nvmlGpmSupport_t, version) O(nvmlGpmSupport_t, isSupportedDevice)
    S(nvmlTemperature_t) O(nvmlTemperature_t, version) O(nvmlTemperature_t, sensorType) O(nvmlTemperature_t, temperature)
    S(nvmlValue_t)
    O(nvmlGpmMetricsGet_t, version) O(nvmlGpmMetricsGet_t, numMetrics) O(nvmlGpmMetricsGet_t, sample1) O(nvmlGpmMetricsGet_t, sample2) O(nvmlGpmMetricsGet_t, metrics)
    printf("version nvmlMemory_v2 %u\n", (unsigned)nvmlMemory_v2);
    printf("version nvmlTemperature_v1 %u\n", (unsigned)nvmlTemperature_v1);
    /* Calls through the header's names (nvmlInit -> nvmlInit_v2, ...), against the fake.
       Each call is made before its results are printed (argument order is unspecified). */
    unsigned int n = 0; nvmlDevice_t d; int rc;
    rc = nvmlInit(); printf("call init %d\n", rc);
    rc = nvmlDeviceGetCount(&n); printf("call count %d %u\n", rc, n);
    rc = nvmlDeviceGetHandleByIndex(0, &d); printf("call handle %d\n", rc);
    nvmlMemory_v2_t m = {0}; m.version = nvmlMemory_v2;
    rc = nvmlDeviceGetMemoryInfo_v2(d, &m);
    printf("call memory_v2 %d %llu %llu %llu %llu\n", rc, m.total, m.reserved, m.free, m.used);
    nvmlMemory_v2_t bad = {0}; bad.version = 1;
    rc = nvmlDeviceGetMemoryInfo_v2(d, &bad); printf("call memory_v2_badversion %d\n", rc);
    unsigned int np = 0;
    rc = nvmlDeviceGetComputeRunningProcesses(d, &np, NULL); printf("call procs_count %d %u\n", rc, np);
    nvmlProcessInfo_t p[16]; unsigned int cap = 16;
    rc = nvmlDeviceGetComputeRunningProcesses(d, &cap, p);
    printf("call procs %d %u %u %llu\n", rc, cap, cap ? p[0].pid : 0, cap ? p[0].usedGpuMemory : 0ULL);
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    rc = nvmlDeviceGetName(d, name, sizeof name); printf("call name %d %s\n", rc, name);
    rc = nvmlShutdown(); printf("call shutdown %d\n", rc);
    rc = nvmlDeviceGetCount(&n); printf("call after_shutdown %d\n", rc);
    return 0;
}
"#;

#[test]
#[ignore = "needs scripts/test.sh (nvml.h from the venv, a C compiler)"]
fn structs_and_calls_match_nvidia_header() {
    let include = header_dir();
    assert!(Command::new("cc").arg("--version").output().is_ok(), "no C compiler (`cc`) in PATH");
    let fake = common::Fake::new("clock=manual;profile=h100x8");
    let dir = fake.dir.clone();
    std::fs::write(dir.join("check.c"), C_PROGRAM).unwrap();
    let exe = dir.join("check");
    let out = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(dir.join("check.c"))
        .arg("-I")
        .arg(&include)
        .arg(fake.library())
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .expect("cc");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).env("LD_LIBRARY_PATH", &dir).output().expect("run check");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let text = String::from_utf8_lossy(&run.stdout);
    let c_lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("call ")).collect();
    let rust = rust_layout();
    for line in &rust {
        assert!(c_lines.contains(&line.as_str()), "Rust `{line}` differs from nvml.h; C printed:\n{text}");
    }
    let call = |name: &str| -> Vec<String> {
        let l = text.lines().find(|l| l.starts_with(&format!("call {name} "))).unwrap_or_else(|| panic!("{name}"));
        l.split_whitespace().skip(2).map(str::to_owned).collect()
    };
    let fleet = gpumon_fake_nvml::Fleet::load(&gpumon_fake_nvml::Config::parse("profile=h100x8").unwrap()).unwrap();
    let s0 = fleet.sample(0, 0);
    assert_eq!(call("init"), ["0"]);
    assert_eq!(call("count"), ["0", "8"]);
    let m = s0.memory;
    assert_eq!(
        call("memory_v2"),
        [
            "0".to_owned(),
            m.total.unwrap().to_string(),
            m.reserved.unwrap().to_string(),
            m.free.unwrap().to_string(),
            m.used.unwrap().to_string()
        ]
    );
    assert_eq!(call("memory_v2_badversion"), ["25"], "ARGUMENT_VERSION_MISMATCH");
    assert_eq!(call("procs_count")[0], "7");
    let procs = call("procs");
    assert_eq!(procs[0], "0");
    assert_eq!(procs[1], s0.processes.len().to_string());
    assert_eq!(procs[2], s0.processes[0].pid.to_string());
    assert_eq!(procs[3], s0.processes[0].memory_used.unwrap().to_string());
    assert_eq!(call("name")[1..].join(" "), s0.info.name);
    assert_eq!(call("shutdown"), ["0"]);
    assert_eq!(call("after_shutdown")[0], "1", "UNINITIALIZED after nvmlShutdown");
}

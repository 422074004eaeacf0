//! Shared helpers: find the built fake, give each test its own copy (its own state), and drive
//! it through the exported control symbols — the copy `dlopen` loads is not the rlib linked into
//! the test.
#![allow(dead_code)]

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// `target/<profile>/examples/agent`, brought up to date with `cargo build --example agent` (a
/// no-op when `cargo test --workspace` just built it; without it a stale binary from an earlier
/// build would be tested).
pub fn agent() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let profile_dir = exe.ancestors().nth(2).unwrap().to_path_buf(); // target/<profile>
            let release = profile_dir.file_name().is_some_and(|n| n == "release");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let out = Command::new(cargo)
                .args(["build", "--example", "agent"])
                .args(release.then_some("--release"))
                .current_dir(workspace())
                .output()
                .expect("cargo build --example agent");
            assert!(
                out.status.success(),
                "cargo build --example agent failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let bin = profile_dir.join("examples/agent");
            assert!(bin.is_file(), "{} missing", bin.display());
            bin
        })
        .clone()
}

/// The cdylib cargo built for this package: `target/<profile>/libgpumon_fake_nvml.so`, found from
/// the test binary (`target/<profile>/deps/<test>-<hash>`).
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut candidates = Vec::new();
    for dir in exe.ancestors().skip(1).take(3) {
        candidates.push(dir.join("libgpumon_fake_nvml.so"));
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return found.clone();
    }
    // Not built (e.g. only the rlib was): build it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "-p", "gpumon-fake-nvml"])
        .status()
        .expect("run cargo build -p gpumon-fake-nvml");
    assert!(status.success(), "cargo build -p gpumon-fake-nvml failed");
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("libgpumon_fake_nvml.so not found next to {}; run `cargo build -p gpumon-fake-nvml`", exe.display())
    })
}

static COPIES: AtomicUsize = AtomicUsize::new(0);

/// A private copy of the fake (own globals), named `libnvidia-ml.so.1` in its own directory,
/// with a handle to its control symbols.
pub struct Fake {
    pub dir: PathBuf,
    pub path: PathBuf,
    lib: libloading::Library,
}

impl Fake {
    /// A fresh copy configured with `spec` (`key=value;…`).
    pub fn new(spec: &str) -> Fake {
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("gpumon-fake-nvml-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("libnvidia-ml.so.1");
        std::fs::copy(built_library(), &path).expect("copy the fake");
        // SAFETY: the fake's initialisers are trivial.
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the fake");
        let f = Fake { dir, path, lib };
        f.configure(spec);
        f
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names a symbol of this type.
        unsafe { *self.lib.get::<T>(name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}")) }
    }

    pub fn configure(&self, spec: &str) {
        let s = CString::new(spec).unwrap();
        let f: unsafe extern "C" fn(*const std::ffi::c_char) -> u32 = self.sym("gpumon_fake_nvml_configure");
        assert_eq!(unsafe { f(s.as_ptr()) }, 0, "configure({spec})");
    }

    pub fn set_tick(&self, tick: u64) {
        let f: extern "C" fn(u64) -> u32 = self.sym("gpumon_fake_nvml_set_tick");
        assert_eq!(f(tick), 0);
    }

    pub fn tick(&self) -> u64 {
        let f: extern "C" fn() -> u64 = self.sym("gpumon_fake_nvml_get_tick");
        f()
    }

    pub fn inject(&self, spec: &str) {
        let s = CString::new(spec).unwrap();
        let f: unsafe extern "C" fn(*const std::ffi::c_char) -> u32 = self.sym("gpumon_fake_nvml_inject");
        assert_eq!(unsafe { f(s.as_ptr()) }, 0, "inject({spec})");
    }

    pub fn clear_faults(&self) {
        let f: extern "C" fn() -> u32 = self.sym("gpumon_fake_nvml_clear_faults");
        assert_eq!(f(), 0);
    }

    pub fn calls(&self, function: &str) -> u64 {
        let s = CString::new(function).unwrap();
        let f: unsafe extern "C" fn(*const std::ffi::c_char) -> u64 = self.sym("gpumon_fake_nvml_call_count");
        unsafe { f(s.as_ptr()) }
    }

    /// In how many event sets physical GPU `gpu` is registered now.
    pub fn event_registrations(&self, gpu: u32) -> u64 {
        let f: extern "C" fn(u32) -> u64 = self.sym("gpumon_fake_nvml_event_registrations");
        f(gpu)
    }

    /// Calls that took a handle of physical GPU `gpu` so far.
    pub fn device_calls(&self, gpu: u32) -> u64 {
        let f: extern "C" fn(u32) -> u64 = self.sym("gpumon_fake_nvml_device_calls");
        f(gpu)
    }

    pub fn library(&self) -> &Path {
        &self.path
    }

    /// An [`NvmlSampler`](gpumon_core::nvml::NvmlSampler) on this copy, polling for XID events
    /// every `xid_poll`.
    pub fn sampler(&self, xid_poll: std::time::Duration) -> gpumon_core::nvml::NvmlSampler {
        gpumon_core::nvml::NvmlSampler::builder()
            .library_path(self.library())
            .xid_poll_interval(xid_poll)
            .build()
            .expect("NvmlSampler on the fake")
    }

    /// Raw access to any exported symbol.
    pub fn raw<T: Copy>(&self, name: &str) -> T {
        self.sym(name)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

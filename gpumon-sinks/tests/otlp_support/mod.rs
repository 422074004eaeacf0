//! Shared by the OTLP integration tests and the OTLP bench: snapshots with every metric family
//! filled in, a sampler that produces them, and a client for the test OTLP receiver.
#![allow(dead_code)]

use gpumon_mock::test_env::require_env;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpumon_core::{DeviceInfo, DeviceSample, MigInfo, SampleError, SampleRequest, Sampler, Snapshot, SystemInfo};

// The full GPU is the crate's one "every family present" device, shared with the unit tests.
#[path = "../device_support/mod.rs"]
mod device_support;
#[allow(unused_imports)] // each includer uses part of it
pub use device_support::{energy_marker, full_gpu};

/// A MIG instance of GPU 0.
pub fn mig_device(n: u64) -> DeviceSample {
    let parent = full_gpu(0, 0).info.uuid.clone();
    let mut info = DeviceInfo::new(0, "MIG-aaaabbbb-cccc-dddd-eeee-ffff00001111", "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
    let mut mig = MigInfo::new(parent, 0, 7, 0);
    mig.profile = Some("1g.10gb".into());
    info.mig = Some(mig);
    let mut s = DeviceSample::new(Arc::new(info));
    s.utilization.gpu = Some(0.5);
    s.memory.used = Some(1_000_000 + n);
    s.memory.total = Some(10_200_547_328);
    s
}

/// `gpus` full GPUs, plus (with `extras`) a MIG instance and a lost GPU.
pub fn fleet(gpus: u32, n: u64, extras: bool) -> Snapshot {
    let mut devices: Vec<DeviceSample> = (0..gpus).map(|i| full_gpu(i, n)).collect();
    if extras {
        devices.push(mig_device(n));
        devices.push(DeviceSample::lost(Arc::new(DeviceInfo::new(
            gpus,
            "GPU-dead0000-0000-0000-0000-000000000000",
            "NVIDIA H100 80GB HBM3",
        ))));
    }
    let mut system = SystemInfo::new(gpumon_core::hostname(), "test");
    system.driver_version = Some("570.86.15".into());
    system.cuda_driver_version = Some(12080);
    if extras {
        // What the attribution stage attaches: GPU 0 allocated to a pod, its first process
        // root's, its second one of an unknown owner.
        use gpumon_core::attribution::Owner;
        if let Some(d) = devices.first_mut() {
            let mut pod = Owner::default();
            pod.namespace = Some("team-a".into());
            pod.pod = Some("train-0".into());
            pod.container = Some("trainer".into());
            let mut root = Owner::default();
            root.user = Some("root".into());
            let root = Arc::new(root);
            d.processes[0].owner = Some(root.clone());
            d.owners = vec![Arc::new(pod), root];
        }
    }
    let first = devices.first().map(|d| (d.info.index, d.info.uuid.clone()));
    let mut snap = Snapshot::new(Arc::new(system), devices).with_seq(n);
    if extras {
        let mut attribution = gpumon_core::attribution::AttributionSummary::default();
        attribution.proc_read_failures = 1 + n;
        attribution.kubelet_failures = Some(0);
        snap.attach(attribution);
        // What a diagnosis stage attaches: a finding on the first GPU, one about the host.
        use gpumon_core::{Diagnosis, Finding, FindingCount, FindingKind, Severity};
        let since = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut d = Diagnosis::default();
        let mut active = vec![Finding::new(FindingKind::Imbalance, Severity::Info, None, since, "e", "a")];
        if let Some((index, uuid)) = &first {
            active.push(Finding::new(FindingKind::NearOom, Severity::Warning, Some((*index, uuid)), since, "e", "a"));
        }
        d.raised_total = Arc::from(vec![
            FindingCount::new(FindingKind::Imbalance, 1),
            FindingCount::new(FindingKind::NearOom, 2 + n),
        ]);
        d.active = Arc::from(active);
        snap.attach(d);
        // What a step tracker attaches: a run with rank 0 whose step n+1 was reported, with
        // figures for the first GPU, and the steps socket's rejection counters.
        use gpumon_core::steps::{DeviceStep, RunSteps, StepRejections, StepReport, Steps};
        let mut run = RunSteps::new("train", Some(0));
        let mut report = StepReport::new(n + 1, Duration::from_millis(500));
        if let Some((_, uuid)) = &first {
            let mut g = DeviceStep::new(uuid.clone());
            g.utilization_mean = Some(0.8);
            g.utilization_max = Some(0.95);
            g.memory_peak_bytes = Some(40 << 30);
            g.energy_joules = Some(300.0);
            report.devices.push(g);
        }
        run.last_step = Some(n + 1);
        run.last_duration = Some(report.duration);
        run.last = Some(report.clone());
        run.reported = vec![report];
        let mut steps = Steps::default();
        steps.runs = vec![run];
        steps.rejected = Some(StepRejections::default());
        snap.attach(steps);
    }
    snap
}

/// A sampler producing [`fleet`] snapshots, tick after tick.
#[derive(Debug)]
pub struct FleetSampler {
    pub gpus: u32,
    pub extras: bool,
    pub ticks: AtomicU64,
}

impl FleetSampler {
    pub fn new(gpus: u32, extras: bool) -> Self {
        Self { gpus, extras, ticks: AtomicU64::new(0) }
    }
}

impl Sampler for FleetSampler {
    fn name(&self) -> &str {
        "test-fleet"
    }
    fn sample(&self, _request: &SampleRequest) -> Result<Snapshot, SampleError> {
        let n = self.ticks.fetch_add(1, Ordering::SeqCst);
        Ok(fleet(self.gpus, n, self.extras))
    }
}

/// Where the test OTLP receiver listens, from the environment `scripts/test.sh` sets.
#[derive(Clone, Debug)]
pub struct Backends {
    pub grpc: String,
    pub http: String,
    pub received: String,
    pub dir: String,
}

/// The receiver's addresses; the tests that call this are `#[ignore]`d and run by
/// `scripts/test.sh`, so a missing variable is a failure naming it.
pub fn backends() -> Backends {
    Backends {
        grpc: require_env("GPUMON_TEST_OTLP_GRPC"),
        http: require_env("GPUMON_TEST_OTLP_HTTP"),
        received: require_env("GPUMON_TEST_OTLP_RECEIVED"),
        dir: require_env("GPUMON_TEST_BACKENDS_DIR"),
    }
}

/// `http://host:port/received` → `http://host:port/reset`.
pub fn reset_url(received: &str) -> String {
    format!("{}/reset", received.trim_end_matches("/received"))
}

pub async fn reset(received: &str) {
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    let resp = reqwest::Client::new().post(reset_url(received)).send().await.expect("POST /reset to the OTLP receiver");
    assert!(resp.status().is_success(), "POST /reset: {}", resp.status());
}

/// Every data point the receiver holds, one JSON object each.
pub async fn received(received: &str) -> Vec<serde_json::Value> {
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    let resp = reqwest::Client::new().get(received).send().await.expect("GET /received from the OTLP receiver");
    assert!(resp.status().is_success(), "GET /received: {}", resp.status());
    let text = resp.text().await.unwrap();
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

/// The data points of one test run (resource attribute `gpumon.test.run`), grouped per request.
pub fn requests_of_run(points: &[serde_json::Value], run: &str) -> BTreeMap<(String, u64), Vec<serde_json::Value>> {
    let mut out: BTreeMap<(String, u64), Vec<serde_json::Value>> = BTreeMap::new();
    for p in points {
        if p["resource"]["gpumon.test.run"].as_str() == Some(run) {
            let key = (p["transport"].as_str().unwrap_or("").to_owned(), p["received_unix_nano"].as_u64().unwrap_or(0));
            out.entry(key).or_default().push(p.clone());
        }
    }
    out
}

/// A run id unique across processes and tests.
pub fn run_id(test: &str) -> String {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    format!("{test}-{}-{nanos}", std::process::id())
}

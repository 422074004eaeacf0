//! Shared by the Prometheus/Pushgateway integration tests (`#[path]`-included, not a test crate).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::{
    ClockEventReasons, DeviceInfo, DeviceSample, Diagnosis, Finding, FindingCount, FindingKind, MigInfo, SampleError,
    SampleRequest, Sampler, Severity, Snapshot, SystemInfo, XidCount,
};

/// A GPU name with every character the exposition formats must escape, and some Unicode.
pub const NASTY_NAME: &str = "NVIDIA \"H100\" \\ 80GB\nline λ";
pub const HOST: &str = "gpumon-test-host";

/// The snapshot the test sampler returns at tick `seq`: constant values (so a scraped value can
/// be compared exactly), four GPUs: a full one, one with a nasty name, a MIG instance of GPU 0,
/// and a lost one.
pub fn test_snapshot(seq: u64) -> Snapshot {
    let mut system = SystemInfo::new(HOST, "test");
    system.driver_version = Some("570.86.15".into());
    system.cuda_driver_version = Some(12080);

    let gpu = |index: u32, uuid: &str, name: &str| {
        let mut info = DeviceInfo::new(index, uuid, name);
        info.pci_bus_id = Some(format!("00000000:{:02X}:00.0", 0x17 + index));
        info.serial = Some(format!("165000{index}"));
        info.architecture = Some("Hopper".into());
        let mut d = DeviceSample::new(Arc::new(info));
        let f = f64::from(index);
        d.utilization.gpu = Some(0.25 + f / 10.0);
        d.utilization.memory = Some(0.125);
        d.memory.used = Some((20 + u64::from(index)) << 30);
        d.memory.free = Some(60 << 30);
        d.memory.total = Some(80 << 30);
        d.memory.reserved = Some(512 << 20);
        d.temperature.gpu = Some(50.0 + f);
        d.temperature.memory = Some(60.0 + f);
        d.power.usage_watts = Some(300.5 + f);
        d.power.limit_watts = Some(700.0);
        d.power.energy_joules = Some(1_000_000.5 + f);
        d.clocks.graphics = Some(1.5e9);
        d.clocks.sm = Some(1.755e9);
        d.clocks.memory = Some(2.619e9);
        d.clocks.video = Some(1.2e9);
        d.fan_speed = Some(0.4);
        d.performance_state = Some(0);
        d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
        d.pcie.link_generation = Some(5);
        d.pcie.link_width = Some(16);
        d.pcie.replays = Some(7);
        d.ecc.corrected = Some(3);
        d.ecc.uncorrected = Some(1);
        d.ecc.retired_pages_single_bit = Some(2);
        d.ecc.retired_pages_double_bit = Some(1);
        d.ecc.retired_pages_pending = Some(false);
        d.ecc.remapped_rows_correctable = Some(4);
        d.ecc.remapped_rows_uncorrectable = Some(0);
        d.ecc.remapped_rows_pending = Some(false);
        d.ecc.remapped_rows_failure = Some(false);
        d.xid_errors.push(XidCount::new(79, 2 + u64::from(index), UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
        d.gpm.sm_activity = Some(0.625);
        d.gpm.tensor_activity = Some(0.5);
        d.gpm.dram_bandwidth = Some(0.375);
        d.nvlink = Some(gpumon_core::Nvlink::new(
            (0..2)
                .map(|l| {
                    let mut link = gpumon_core::NvlinkLink::new(l);
                    link.version = Some(4);
                    link.tx_bytes = Some((1 << 30) * (seq + 1) + u64::from(l));
                    link.rx_bytes = Some((1 << 30) * (seq + 1) + u64::from(index));
                    link.crc_errors = Some(u64::from(l));
                    link.replay_errors = Some(0);
                    link.recovery_errors = Some(0);
                    link
                })
                .collect(),
        ));
        d
    };
    let gpu0 = gpu(0, "GPU-00000000-aaaa-bbbb-cccc-000000000000", "NVIDIA H100 80GB HBM3");
    let gpu1 = gpu(1, "GPU-11111111-aaaa-bbbb-cccc-111111111111", NASTY_NAME);
    let mut mig_info = DeviceInfo::new(0, "MIG-22222222-aaaa-bbbb-cccc-222222222222", "NVIDIA H100 80GB HBM3");
    let mut mig = MigInfo::new("GPU-00000000-aaaa-bbbb-cccc-000000000000", 0, 7, 0);
    mig.profile = Some("1g.10gb".into());
    mig_info.mig = Some(mig);
    let mut mig = DeviceSample::new(Arc::new(mig_info));
    mig.utilization.gpu = Some(0.75);
    mig.memory.used = Some(5 << 30);
    mig.memory.total = Some(10 << 30);
    let lost =
        DeviceSample::lost(Arc::new(DeviceInfo::new(3, "GPU-33333333-aaaa-bbbb-cccc-333333333333", "NVIDIA H100")));
    let gpu0_uuid = gpu0.info.uuid.clone();
    let mut snap = Snapshot::new(Arc::new(system), vec![gpu0, gpu1, mig, lost])
        .with_seq(seq)
        .with_taken_at(SystemTime::now())
        .with_duration(Duration::from_millis(3));
    snap.attach(test_diagnosis(&gpu0_uuid));
    snap
}

/// What a diagnosis stage would attach: `near_oom` on GPU 0 (raised twice so far) and a
/// host-level `imbalance` (raised once).
pub fn test_diagnosis(gpu0_uuid: &str) -> Diagnosis {
    let since = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut d = Diagnosis::default();
    d.active = Arc::from(vec![
        Finding::new(FindingKind::NearOom, Severity::Warning, Some((0, gpu0_uuid)), since, "97 % used", "shrink"),
        Finding::new(FindingKind::Imbalance, Severity::Info, None, since, "GPU 0 busy, GPU 1 idle", "shard"),
    ]);
    d.raised_total =
        Arc::from(vec![FindingCount::new(FindingKind::NearOom, 2), FindingCount::new(FindingKind::Imbalance, 1)]);
    d
}

/// A sampler returning [`test_snapshot`] (or failing on request).
#[derive(Default)]
pub struct TestSampler {
    ticks: AtomicU64,
    pub fail: std::sync::atomic::AtomicBool,
    /// Leave GPU 1 out of the snapshots (it "disappears").
    pub hide_gpu1: std::sync::atomic::AtomicBool,
}

impl Sampler for TestSampler {
    fn name(&self) -> &str {
        "test"
    }
    fn sample(&self, _request: &SampleRequest) -> Result<Snapshot, SampleError> {
        if self.fail.load(Ordering::Relaxed) {
            return Err(SampleError::Backend("injected failure".into()));
        }
        let mut snap = test_snapshot(self.ticks.fetch_add(1, Ordering::Relaxed));
        if self.hide_gpu1.load(Ordering::Relaxed) {
            snap.devices.remove(1);
        }
        Ok(snap)
    }
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

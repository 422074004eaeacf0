//! The kubelet client and refresher against the test kubelet: a real pod-resources gRPC server
//! on a Unix socket in a temporary directory (no network, no external service).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumon_core::attribution::kubelet::{list_allocations, spawn_refresher, KubeletConfig, KubeletError};
use gpumon_core::attribution::{AllocationCache, Allocations, AttributionStats, OwnerLabels, SHARED};
use gpumon_mock::kubelet::{container, devices, pod, TestKubelet};

struct Setup {
    _dir: tempfile::TempDir,
    kubelet: TestKubelet,
    config: KubeletConfig,
}

/// A test kubelet in a fresh temporary directory, and a config pointing at it with a timeout
/// generous enough for a loaded test machine.
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path().join("kubelet.sock")).unwrap();
    let config = KubeletConfig::new(kubelet.socket()).with_timeout(Duration::from_secs(5));
    Setup { _dir: dir, kubelet, config }
}

/// `(namespace, pod, container)` of every owner of `uuid`, sorted.
fn owners(alloc: &Allocations, uuid: &str) -> Vec<(String, String, String)> {
    let mut owners: Vec<_> = alloc
        .owners(uuid)
        .iter()
        .map(|o| {
            let name = |v: &Option<String>| v.clone().unwrap_or_default();
            (name(&o.namespace), name(&o.pod), name(&o.container))
        })
        .collect();
    owners.sort();
    owners
}

fn owner(ns: &str, pod: &str, container: &str) -> (String, String, String) {
    (ns.into(), pod.into(), container.into())
}

/// Polls `condition` until it holds or `within` has passed.
async fn wait_until<F: Future<Output = bool>>(within: Duration, mut condition: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if condition().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition().await
}

#[tokio::test]
async fn gpus_and_mig_devices_of_two_pods_map_to_exactly_those_uuids() {
    let s = setup();
    s.kubelet.set_pods([
        pod(
            "team-a",
            "train-0",
            [
                container("trainer", [devices("nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"])]),
                container("logger", [devices("example.com/fpga", ["fpga-0"])]),
            ],
        ),
        pod(
            "team-b",
            "infer-0",
            [container(
                "server",
                [
                    devices("nvidia.com/mig-1g.10gb", ["MIG-cccc"]),
                    devices("nvidia.com/mig-3g.40gb", ["MIG-dddd"]),
                    devices("rdma/hca", ["mlx5_0"]),
                ],
            )],
        ),
        pod("kube-system", "cni-0", [container("cni", [devices("intel.com/sriov", ["0000:3b:02.0"])])]),
    ]);

    let alloc = list_allocations(&s.config).await.unwrap();

    let mut uuids: Vec<_> = alloc.iter().map(|(uuid, _)| uuid).collect();
    uuids.sort_unstable();
    assert_eq!(uuids, ["GPU-aaaa", "GPU-bbbb", "MIG-cccc", "MIG-dddd"], "exactly the GPU devices");
    assert_eq!(owners(&alloc, "GPU-aaaa"), [owner("team-a", "train-0", "trainer")]);
    assert_eq!(owners(&alloc, "GPU-bbbb"), [owner("team-a", "train-0", "trainer")]);
    assert_eq!(owners(&alloc, "MIG-cccc"), [owner("team-b", "infer-0", "server")]);
    assert_eq!(owners(&alloc, "MIG-dddd"), [owner("team-b", "infer-0", "server")]);
    for other in ["fpga-0", "mlx5_0", "0000:3b:02.0"] {
        assert!(alloc.owners(other).is_empty(), "{other} is not a GPU");
    }
    assert_eq!(s.kubelet.calls(), 1);
}

#[tokio::test]
async fn replicas_of_one_gpu_given_to_two_pods_are_two_owners() {
    let s = setup();
    // Time-slicing: the device plugin hands out replicas `GPU-x::N` of one GPU.
    s.kubelet.set_pods([
        pod("team-a", "a-0", [container("main", [devices("nvidia.com/gpu", ["GPU-shared::0", "GPU-shared::3"])])]),
        pod("team-a", "a-1", [container("main", [devices("nvidia.com/gpu.shared", ["GPU-shared::1"])])]),
        pod("team-b", "b-0", [container("main", [devices("nvidia.com/gpu", ["GPU-own::0"])])]),
    ]);

    let alloc = list_allocations(&s.config).await.unwrap();

    assert_eq!(alloc.len(), 2, "{alloc:?}");
    assert_eq!(owners(&alloc, "GPU-shared"), [owner("team-a", "a-0", "main"), owner("team-a", "a-1", "main")]);
    assert_eq!(owners(&alloc, "GPU-own"), [owner("team-b", "b-0", "main")]);
    let labels = OwnerLabels::merge(alloc.owners("GPU-shared").iter().map(|o| &**o));
    assert_eq!((labels.namespace, labels.pod), (Some("team-a"), Some(SHARED)));
}

#[tokio::test]
async fn extra_resource_names_are_gpus_too() {
    let s = setup();
    s.kubelet.set_pods([pod(
        "ns",
        "p",
        [container("c", [devices("nvidia.com/a100-timesliced", ["GPU-x::0"]), devices("nvidia.com/gpu", ["GPU-y"])])],
    )]);

    assert_eq!(list_allocations(&s.config).await.unwrap().len(), 1, "unknown names are not GPUs by default");
    let alloc = list_allocations(&s.config.clone().with_resource_name("nvidia.com/a100-*")).await.unwrap();
    assert_eq!(alloc.len(), 2);
    assert_eq!(owners(&alloc, "GPU-x"), [owner("ns", "p", "c")]);
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_the_path_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let config = KubeletConfig::new(&socket).with_refresh(Duration::from_secs(3600));

    let err = list_allocations(&config).await.unwrap_err();
    assert!(matches!(err, KubeletError::SocketMissing { .. }), "{err:?}");
    assert!(err.to_string().contains(&*socket.to_string_lossy()), "{err}");

    let cache = AllocationCache::new();
    let stats = Arc::new(AttributionStats::default());
    let refresher = spawn_refresher(config, cache.clone(), Arc::clone(&stats));
    // The first, scheduled refresh fails on its own; then one more on demand.
    assert!(wait_until(Duration::from_secs(5), || async { stats.kubelet_failures.load(Ordering::Relaxed) >= 1 }).await);
    let err = refresher.refresh_now().await.unwrap_err();
    assert_eq!(err.kind(), "socket_missing");
    assert_eq!(stats.kubelet_failures.load(Ordering::Relaxed), 2);
    assert_eq!(stats.kubelet_refreshes.load(Ordering::Relaxed), 0);
    assert!(stats.last_error().unwrap().contains(&*socket.to_string_lossy()));
    assert!(cache.load().is_empty());
}

#[tokio::test]
async fn a_kubelet_that_goes_down_is_counted_then_cleared_after_the_bound_and_comes_back_without_restart() {
    let mut s = setup();
    s.kubelet.set_pods([pod("team-a", "train-0", [container("trainer", [devices("nvidia.com/gpu", ["GPU-aaaa"])])])]);
    let config = s.config.clone().with_refresh(Duration::from_secs(3600)).with_clear_after_failures(3);
    let cache = AllocationCache::new();
    let stats = Arc::new(AttributionStats::default());
    let refresher = spawn_refresher(config, cache.clone(), Arc::clone(&stats));

    assert_eq!(refresher.refresh_now().await.unwrap(), 1);
    assert_eq!(owners(&cache.load(), "GPU-aaaa"), [owner("team-a", "train-0", "trainer")]);
    let refreshes = stats.kubelet_refreshes.load(Ordering::Relaxed);
    assert!(refreshes >= 1, "the scheduled first refresh and ours");

    s.kubelet.stop().await;
    for failure in 1..=2 {
        let err = refresher.refresh_now().await.unwrap_err();
        assert_eq!(err.kind(), "connect", "{err}");
        assert!(err.to_string().contains(&*s.kubelet.socket().to_string_lossy()), "{err}");
        assert_eq!(stats.kubelet_failures.load(Ordering::Relaxed), failure);
        assert_eq!(cache.load().len(), 1, "kept while under the bound (failure {failure})");
    }
    refresher.refresh_now().await.unwrap_err();
    assert_eq!(stats.kubelet_failures.load(Ordering::Relaxed), 3);
    assert!(cache.load().is_empty(), "cleared at the bound: the pod may have left");

    // The kubelet restarts, the pod has moved to another GPU.
    s.kubelet.set_pods([pod("team-a", "train-0", [container("trainer", [devices("nvidia.com/gpu", ["GPU-bbbb"])])])]);
    s.kubelet.restart().await.unwrap();
    assert_eq!(refresher.refresh_now().await.unwrap(), 1);
    let alloc = cache.load();
    assert_eq!(owners(&alloc, "GPU-bbbb"), [owner("team-a", "train-0", "trainer")]);
    assert!(alloc.owners("GPU-aaaa").is_empty());
    assert_eq!(stats.kubelet_refreshes.load(Ordering::Relaxed), refreshes + 1);
    assert_eq!(stats.kubelet_failures.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn a_slow_kubelet_times_out_is_counted_and_the_refresher_carries_on() {
    let s = setup();
    s.kubelet.set_pods([pod("ns", "p", [container("c", [devices("nvidia.com/gpu", ["GPU-aaaa"])])])]);
    let timeout = Duration::from_secs(1);
    let config = s.config.clone().with_timeout(timeout).with_refresh(Duration::from_secs(3600));
    let cache = AllocationCache::new();
    let stats = Arc::new(AttributionStats::default());
    let refresher = spawn_refresher(config, cache.clone(), Arc::clone(&stats));
    assert_eq!(refresher.refresh_now().await.unwrap(), 1);

    s.kubelet.set_delay(Duration::from_secs(30));
    let started = Instant::now();
    let err = refresher.refresh_now().await.unwrap_err();
    assert!(matches!(err, KubeletError::Timeout { after, .. } if after == timeout), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the timeout, not the kubelet: {:?}",
        started.elapsed()
    );
    assert_eq!(stats.kubelet_failures.load(Ordering::Relaxed), 1);
    assert!(stats.last_error().unwrap().contains("timed out"));
    assert_eq!(cache.load().len(), 1, "one failure keeps the allocations");

    s.kubelet.set_delay(Duration::ZERO);
    assert_eq!(refresher.refresh_now().await.unwrap(), 1, "the refresher carries on");
}

#[tokio::test]
async fn an_error_status_is_reported_with_its_code() {
    let s = setup();
    s.kubelet.set_failure(Some((tonic::Code::PermissionDenied, "not allowed")));
    let err = list_allocations(&s.config).await.unwrap_err();
    match &err {
        KubeletError::Status { code, message, .. } => {
            assert_eq!(*code, tonic::Code::PermissionDenied);
            assert!(message.contains("not allowed"), "{message}");
        }
        other => panic!("expected a status error, got {other:?}"),
    }
    assert!(err.to_string().contains(&*s.kubelet.socket().to_string_lossy()), "{err}");
}

#[tokio::test]
async fn the_refresher_runs_on_its_own_schedule_and_stops_when_dropped() {
    let s = setup();
    s.kubelet.set_pods([pod("ns", "p", [container("c", [devices("nvidia.com/gpu", ["GPU-aaaa"])])])]);
    let cache = AllocationCache::new();
    let stats = Arc::new(AttributionStats::default());
    let refresher =
        spawn_refresher(s.config.clone().with_refresh(Duration::from_millis(100)), cache.clone(), Arc::clone(&stats));

    assert!(
        wait_until(Duration::from_secs(5), || async { stats.kubelet_refreshes.load(Ordering::Relaxed) >= 3 }).await
    );
    assert_eq!(cache.load().len(), 1, "filled without anyone asking");

    drop(refresher);
    // Give an aborted-but-running call time to land, then nothing more may come.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let calls = s.kubelet.calls();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(s.kubelet.calls(), calls, "no calls after the handle is dropped");
}

#[tokio::test]
async fn replies_above_tonics_default_4_mib_are_accepted_up_to_the_configured_limit() {
    let s = setup();
    // ~6 MB of non-GPU device ids around one GPU: a big node's reply.
    let filler: Vec<String> = (0..100).map(|i| format!("{i:0>60}")).collect();
    let mut pods: Vec<_> = (0..1000)
        .map(|p| {
            pod(
                "ns",
                &format!("filler-{p}"),
                [container("c", [devices("example.com/thing", filler.iter().map(String::as_str))])],
            )
        })
        .collect();
    pods.push(pod("ns", "gpu-pod", [container("c", [devices("nvidia.com/gpu", ["GPU-aaaa"])])]));
    s.kubelet.set_pods(pods);

    let config = s.config.clone().with_timeout(Duration::from_secs(20));
    let alloc = list_allocations(&config).await.unwrap();
    assert_eq!(owners(&alloc, "GPU-aaaa"), [owner("ns", "gpu-pod", "c")]);

    let err = list_allocations(&config.with_max_message_bytes(1024 * 1024)).await.unwrap_err();
    assert_eq!(err.kind(), "status", "{err}");
}

/// What the refresher logs, captured for one test.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, level: &str, text: &str) -> usize {
        let logs = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        logs.lines().filter(|l| l.contains(level) && l.contains(text)).count()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn failures_are_logged_once_per_state_change_not_per_refresh() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    // The refresher's task runs on this thread (current-thread runtime), under this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut s = setup();
    s.kubelet.set_pods([pod("ns", "p", [container("c", [devices("nvidia.com/gpu", ["GPU-aaaa"])])])]);
    let config = s.config.clone().with_refresh(Duration::from_secs(3600)).with_clear_after_failures(3);
    let stats = Arc::new(AttributionStats::default());
    let refresher = spawn_refresher(config, AllocationCache::new(), Arc::clone(&stats));
    refresher.refresh_now().await.unwrap();

    s.kubelet.stop().await;
    for _ in 0..5 {
        refresher.refresh_now().await.unwrap_err();
    }
    assert_eq!(logs.count("WARN", "refresh failed"), 1, "five connect failures, one warning");
    assert_eq!(logs.count("WARN", "cleared GPU→pod allocations"), 1, "cleared once, at the bound");

    std::fs::remove_file(s.kubelet.socket()).unwrap();
    for _ in 0..3 {
        assert_eq!(refresher.refresh_now().await.unwrap_err().kind(), "socket_missing");
    }
    assert_eq!(logs.count("WARN", "refresh failed"), 2, "a different failure is a new state");
    assert_eq!(stats.kubelet_failures.load(Ordering::Relaxed), 8, "every failure is counted");

    s.kubelet.restart().await.unwrap();
    refresher.refresh_now().await.unwrap();
    refresher.refresh_now().await.unwrap();
    assert_eq!(logs.count("INFO", "answers again"), 1);
    assert_eq!(logs.count("WARN", "refresh failed"), 2);
}

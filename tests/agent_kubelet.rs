//! The agent against a test kubelet: a real pod-resources v1 gRPC server on a Unix socket
//! (`gpumon_mock::kubelet::TestKubelet`). The agent attaches the pod labels
//! to exactly the GPUs and MIG instances the kubelet lists; when the kubelet goes away the
//! failures are counted, the stale labels go after the documented bound, and sampling never
//! stops. Everything runs in-process and on a socket in a temp dir: no external service.
#![cfg(all(feature = "agent", feature = "prometheus", feature = "kubelet", feature = "tls"))]

use std::collections::BTreeMap;
use std::time::Duration;

mod common;
use common::{agent, agent_process, mock_once};
use gpumon_mock::kubelet::{container, devices, pod, TestKubelet};
use gpumon_mock::test_kit::{free_port, Scrape};

/// Scrapes `/metrics` every 50 ms until `done` holds for the body (30 s at most).
fn scrape_until(port: u16, what: &str, done: impl Fn(&str) -> bool) -> String {
    Scrape::port(port).timeout(Duration::from_secs(30)).until(what, |r| done(r.body())).body().to_owned()
}

/// `metric{labels} value` lines of `name`, as (uuid → label map).
fn series(text: &str, name: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(&format!("{name}{{"))) {
        let body = &line[name.len() + 1..line.rfind('}').unwrap()];
        let labels: BTreeMap<String, String> = body
            .split("\",")
            .filter_map(|kv| kv.split_once("=\""))
            .map(|(k, v)| (k.to_owned(), v.trim_end_matches('"').to_owned()))
            .collect();
        if let Some(uuid) = labels.get("uuid") {
            out.insert(uuid.clone(), labels);
        }
    }
    out
}

fn owner_of(labels: &BTreeMap<String, String>) -> Option<(String, String, String)> {
    Some((labels.get("namespace")?.clone(), labels.get("pod")?.clone(), labels.get("container")?.clone()))
}

fn counter(text: &str, line_prefix: &str) -> Option<u64> {
    text.lines().find(|l| l.starts_with(line_prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn the_agent_labels_exactly_the_gpus_and_mig_instances_the_kubelet_lists() {
    // The mock fleet's identities: 8 A100s, some in MIG mode.
    let fleet = mock_once(agent().args(["--mock-profile", "a100x8-mig"]));
    let gpus: Vec<&str> = fleet.devices.iter().filter(|d| d.info.mig.is_none()).map(|d| d.info.uuid.as_str()).collect();
    let migs: Vec<&str> = fleet.devices.iter().filter(|d| d.info.mig.is_some()).map(|d| d.info.uuid.as_str()).collect();
    assert!(gpus.len() >= 3 && !migs.is_empty(), "fleet: {gpus:?} {migs:?}");

    let dir = std::env::temp_dir().join(format!("gpumon-agent-kubelet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    let socket = dir.join("kubelet.sock");
    // The test kubelet serves on this runtime's workers; the test itself stays synchronous
    // (blocking scrapes).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut kubelet = {
        let _in_runtime = rt.enter();
        TestKubelet::start(&socket).unwrap()
    };
    // team-a's trainer holds GPU 0 and a time-sliced replica of GPU 1; team-b's server holds
    // one MIG instance; a CPU-only resource is not a GPU.
    kubelet.set_pods([
        pod(
            "team-a",
            "train-0",
            [container(
                "trainer",
                [
                    devices("nvidia.com/gpu", [gpus[0]]),
                    devices("nvidia.com/gpu.shared", [format!("{}::3", gpus[1]).as_str()]),
                    devices("example.com/fpga", [gpus[2]]),
                ],
            )],
        ),
        pod("team-b", "infer-0", [container("server", [devices("nvidia.com/mig-1g.5gb", [migs[0]])])]),
    ]);

    let config = dir.join("gpumon.toml");
    // The refresh interval has no flag; the kubelet itself is asked for on the command line.
    std::fs::write(&config, "[attribution]\nkubelet_refresh = \"1s\"\n").unwrap();
    let port = free_port();
    let _agent = agent_process()
        .args(["--backend", "mock", "--mock-profile", "a100x8-mig", "--interval", "200ms", "--stdout-format", "json"])
        .args(["--prometheus-listen", &format!("127.0.0.1:{port}")])
        // An empty proc root: the mock's simulated pids must not pick up owners from this machine.
        .args(["--attribution", "--kubelet", "--proc-root"])
        .arg(dir.join("proc"))
        .arg("--kubelet-socket")
        .arg(&socket)
        .arg("--config")
        .arg(&config)
        .spawn();

    let expected: BTreeMap<&str, (&str, &str, &str)> = [
        (gpus[0], ("team-a", "train-0", "trainer")),
        (gpus[1], ("team-a", "train-0", "trainer")),
        (migs[0], ("team-b", "infer-0", "server")),
    ]
    .into();
    let text = scrape_until(port, "the pod labels", |text| {
        series(text, "gpumon_gpu_info").values().filter_map(owner_of).count() == expected.len()
    });
    let info = series(&text, "gpumon_gpu_info");
    assert_eq!(info.len(), fleet.devices.len(), "{text}");
    for (uuid, labels) in &info {
        let want = expected.get(uuid.as_str()).map(|(n, p, c)| ((*n).to_owned(), (*p).to_owned(), (*c).to_owned()));
        assert_eq!(owner_of(labels), want, "{uuid}: {labels:?}");
    }
    // Every series of a held GPU carries its pod, not only the info series.
    let memory = series(&text, "gpumon_memory_used_bytes");
    assert_eq!(memory.get(gpus[0]).and_then(owner_of), Some(("team-a".into(), "train-0".into(), "trainer".into())));
    assert!(memory.get(gpus[3]).is_some_and(|l| !l.contains_key("namespace")), "{text}");
    assert_eq!(counter_for(&text, "kubelet").unwrap_or(0), 0, "the kubelet answered: {text}");

    // The kubelet goes away: failures are counted, the labels go after the bound (3 failed
    // refreshes at 1 s), and sampling goes on throughout.
    let seq_before = counter(&text, "gpumon_samples_total").expect("gpumon_samples_total");
    rt.block_on(kubelet.stop());
    let text = scrape_until(port, "the labels cleared and the failures counted", |text| {
        let labelled = series(text, "gpumon_gpu_info").values().filter_map(owner_of).count();
        labelled == 0 && counter_for(text, "kubelet").is_some_and(|n| n >= 3)
    });
    assert_eq!(series(&text, "gpumon_gpu_info").len(), fleet.devices.len(), "every device still exported: {text}");
    let after = counter(&text, "gpumon_samples_total").expect("gpumon_samples_total");
    assert!(after > seq_before + 10, "samples {seq_before} → {after}: sampling stalled without the kubelet");

    // Back again: the labels return without restarting the agent.
    rt.block_on(kubelet.restart()).unwrap();
    scrape_until(port, "the labels back", |text| {
        series(text, "gpumon_gpu_info").values().filter_map(owner_of).count() == expected.len()
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpumon_attribution_failures_total{…source="<source>"}`'s value.
fn counter_for(text: &str, source: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with("gpumon_attribution_failures_total{") && l.contains(&format!("source=\"{source}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

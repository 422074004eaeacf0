//! Diagnosis end to end, as a user runs it: the example agent on the `dataloader-starved` mock
//! scenario is scraped by a real Prometheus that loads `deploy/prometheus/gpumon-alerts.yml`;
//! the finding series reads 1 for every GPU and the `GpumonFindingActive` alert fires (its
//! `ALERTS` series appears).
#![cfg(all(feature = "agent", feature = "prometheus"))]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpumon_mock::test_kit::free_port;

mod common;
use common::{agent_process, env, promql_until, PrometheusInstance};

/// [`common::promql`] until it has at least `n` results (45 s at most).
fn wait_for(port: u16, q: &str, n: usize) -> Vec<(serde_json::Value, f64)> {
    promql_until(port, q, Duration::from_secs(45), |r| r.len() >= n)
}

#[test]
#[ignore = "needs scripts/test.sh (Prometheus)"]
fn starved_loader_is_diagnosed_scraped_and_alerted() {
    let dir = env("GPUMON_TEST_BACKENDS_DIR");
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/gpumon-alerts.yml");
    let (agent_port, prom_port) = (free_port(), free_port());
    let _agent = agent_process()
        .args(["--backend", "mock", "--mock-profile", "h100x8", "--mock-scenario", "dataloader-starved"])
        .args(["--interval", "500ms", "--diagnose-window", "3s"])
        .args(["--prometheus-listen", &format!("127.0.0.1:{agent_port}")])
        .spawn();
    let instance = format!("diag{}", std::process::id());
    let status = Command::new(format!("{dir}/start-prometheus.sh"))
        .env("BACKEND_INSTANCE", &instance)
        .env("PROM_PORT", prom_port.to_string())
        .env("PROM_SCRAPE_TARGETS", format!("127.0.0.1:{agent_port}"))
        .env("PROM_RULE_FILES", rules.to_str().unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "start-prometheus.sh failed");
    let _prometheus = PrometheusInstance(instance, dir);

    // The finding, on every GPU, and nothing else.
    let active = wait_for(prom_port, "gpumon_finding_active", 8);
    assert_eq!(active.len(), 8, "{active:?}");
    for (labels, value) in &active {
        assert_eq!(*value, 1.0);
        assert_eq!(labels["kind"], "dataloader_starvation", "{labels}");
        assert_eq!(labels["severity"], "warning", "{labels}");
        assert_eq!(labels["backend"], "mock", "simulated data is marked: {labels}");
        assert!(labels["uuid"].as_str().unwrap().starts_with("GPU-"), "{labels}");
    }
    let raised = wait_for(prom_port, "gpumon_findings_raised_total{kind=\"dataloader_starvation\"}", 1);
    assert_eq!(raised[0].1, 8.0);
    // The alert over the finding series fires, with the finding's labels.
    let alerts = wait_for(prom_port, "ALERTS{alertname=\"GpumonFindingActive\",alertstate=\"firing\"}", 8);
    for (labels, _) in &alerts {
        assert_eq!(labels["kind"], "dataloader_starvation", "{labels}");
    }
}

//! Against a real Pushgateway (Debian `prometheus-pushgateway` 1.5.1): pushes are read back, and
//! a gateway that is killed and restarted mid-run gets pushes again without restarting the agent.
//! `#[ignore]`d: `scripts/test.sh` runs it (`--include-ignored`); then it fails loudly.
#![cfg(feature = "pushgateway")]

#[path = "prometheus_support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::{Agent, AgentHandle, SinkOptions};
use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::free_port;
use gpumon_sinks::prometheus::{Naming, PushgatewayConfig, PushgatewaySink};
use serde_json::Value as Json;
use support::{eventually, test_snapshot, TestSampler};

fn backends_dir() -> String {
    require_env("GPUMON_TEST_BACKENDS_DIR")
}

/// The groups the gateway holds, as `/api/v1/metrics` returns them.
async fn groups(http: &reqwest::Client, base: &str) -> Option<Vec<Json>> {
    let r = http.get(format!("{base}/api/v1/metrics")).send().await.ok()?;
    let body: Json = serde_json::from_str(&r.text().await.ok()?).ok()?;
    body["data"].as_array().cloned()
}

/// The group whose grouping labels are exactly `labels`.
async fn group(http: &reqwest::Client, base: &str, labels: &BTreeMap<&str, &str>) -> Option<Json> {
    groups(http, base).await?.into_iter().find(|g| {
        let l = g["labels"].as_object().unwrap();
        l.len() == labels.len() && labels.iter().all(|(k, v)| l.get(*k).and_then(Json::as_str) == Some(v))
    })
}

/// The value of `metric` in `group` for the series whose `key` label is `value`.
fn value(group: &Json, metric: &str, key: &str, value: &str) -> Option<f64> {
    group[metric]["metrics"]
        .as_array()?
        .iter()
        .find(|m| m["labels"][key] == value)
        .and_then(|m| m["value"].as_str())
        .and_then(|v| v.parse().ok())
}

fn push_time(group: &Json) -> f64 {
    group["push_time_seconds"]["metrics"][0]["value"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

fn agent_with(sink: PushgatewaySink, interval: Duration) -> AgentHandle {
    Agent::builder_arc(Arc::new(TestSampler::default()))
        .interval(interval)
        .sink_with(sink, SinkOptions::default().export_timeout(Duration::from_secs(5)))
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (Pushgateway)"]
async fn pushes_are_read_back_in_both_namings() {
    let base = require_env("GPUMON_TEST_PUSHGATEWAY_URL");
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    assert!(
        http.get(format!("{base}/-/ready")).send().await.is_ok_and(|r| r.status() == 200),
        "no Pushgateway at {base} (GPUMON_TEST_PUSHGATEWAY_URL); start it with scripts/backends/start-pushgateway.sh"
    );
    let instance = format!("gpumon-test-{}", std::process::id());
    let snap = test_snapshot(0);

    for (naming, job, metric, key, scale) in [
        (Naming::Native, "gpumon-native", "gpumon_utilization_ratio", "uuid", 1.0),
        (Naming::Dcgm, "gpumon-dcgm", "DCGM_FI_DEV_GPU_UTIL", "UUID", 100.0),
    ] {
        let mut grouping = BTreeMap::new();
        grouping.insert("instance".to_owned(), instance.clone());
        // A value with '/' goes in the path as `@base64`.
        grouping.insert("rack".to_owned(), "row-3/rack-7".to_owned());
        let mut config = PushgatewayConfig::default();
        config.url = base.clone();
        config.job = job.to_owned();
        config.grouping = grouping;
        config.naming = naming;
        config.delete_on_shutdown = true;
        let sink = PushgatewaySink::from_config(&config).unwrap();
        assert!(sink.group_url().contains("/rack@base64/"), "{}", sink.group_url());
        let agent = agent_with(sink, Duration::from_millis(200));

        let labels: BTreeMap<&str, &str> =
            [("job", job), ("instance", instance.as_str()), ("rack", "row-3/rack-7")].into_iter().collect();
        let g = eventually(Duration::from_secs(10), "the pushed group", || async {
            group(&http, &base, &labels).await.filter(|g| g.get(metric).is_some())
        })
        .await;
        for dev in &snap.devices[..2] {
            let want = dev.utilization.gpu.unwrap() * scale;
            assert_eq!(value(&g, metric, key, &dev.info.uuid), Some(want), "{job}: {metric} of {}", dev.info.uuid);
        }
        // Self-metrics travel too; the lost GPU only as up=0.
        assert_eq!(value(&g, "gpumon_up", key, &snap.devices[3].info.uuid), Some(0.0));
        assert!(g.get("gpumon_samples_total").is_some(), "{g}");
        let status = agent.sink_status();
        assert_eq!(status[0].name, "pushgateway");
        assert!(status[0].exported >= 1 && status[0].consecutive_failures == 0, "{status:?}");

        // PUT replaces the group: after the next pushes it still holds exactly one series per
        // device for the metric, and the push time moves on.
        let t0 = push_time(&g);
        let g = eventually(Duration::from_secs(10), "a later push", || async {
            group(&http, &base, &labels).await.filter(|g| push_time(g) > t0)
        })
        .await;
        let n = g[metric]["metrics"].as_array().unwrap().len();
        assert_eq!(n, 3, "one series per answering device (2 GPUs + 1 MIG): {}", g[metric]);

        // Shutdown deletes the group (delete_on_shutdown), leaving no frozen values.
        agent.shutdown(Duration::from_secs(5)).await.unwrap();
        eventually(Duration::from_secs(5), "group deleted", || async {
            group(&http, &base, &labels).await.is_none().then_some(())
        })
        .await;
    }
}

/// Runs a private Pushgateway through the project's scripts (its own port and state name, so
/// the shared one is untouched); stops it when dropped.
struct PrivateGateway {
    dir: String,
    port: u16,
}

const INSTANCE: &str = "gpumon-sinks-outage";

impl PrivateGateway {
    fn script(&self, name: &str, keep_data: bool) {
        let out = Command::new(format!("{}/{name}", self.dir))
            .env("BACKEND_INSTANCE", INSTANCE)
            .env("PUSHGW_PORT", self.port.to_string())
            .env("KEEP_DATA", if keep_data { "1" } else { "0" })
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}/{name}: {e}", self.dir));
        assert!(
            out.status.success(),
            "{name} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateGateway {
    fn drop(&mut self) {
        let _ = Command::new(format!("{}/stop-pushgateway.sh", self.dir))
            .env("BACKEND_INSTANCE", INSTANCE)
            .env("PUSHGW_PORT", self.port.to_string())
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (Pushgateway binary and scripts/backends)"]
async fn pushes_resume_after_the_gateway_restarts() {
    let gw = PrivateGateway { dir: backends_dir(), port: free_port() };
    // A leftover from an aborted run would make the start script refuse.
    let _ = Command::new(format!("{}/stop-pushgateway.sh", gw.dir)).env("BACKEND_INSTANCE", INSTANCE).output();
    gw.script("start-pushgateway.sh", false);
    let base = format!("http://127.0.0.1:{}", gw.port);
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().unwrap();

    let sink = PushgatewaySink::builder(&base)
        .job("gpumon-outage")
        .grouping("instance", "outage-test")
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let agent = agent_with(sink, Duration::from_millis(300));
    let labels: BTreeMap<&str, &str> = [("job", "gpumon-outage"), ("instance", "outage-test")].into_iter().collect();
    eventually(Duration::from_secs(10), "first push", || async {
        group(&http, &base, &labels).await.filter(|g| g.get("gpumon_utilization_ratio").is_some())
    })
    .await;

    // Kill the gateway: exports fail, visibly.
    gw.script("stop-pushgateway.sh", true);
    let status = eventually(Duration::from_secs(15), "failures in sink status", || async {
        let s = agent.sink_status().pop()?;
        (s.consecutive_failures >= 2).then_some(s)
    })
    .await;
    let err = status.last_error.clone().unwrap_or_default();
    assert!(err.contains("error pushing to") && err.contains(&base), "{err}");
    assert!(agent.is_running());

    // Bring it back (same port, kept data): pushes resume, same agent.
    let restarted = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    gw.script("start-pushgateway.sh", true);
    eventually(Duration::from_secs(20), "a push after the restart", || async {
        let g = group(&http, &base, &labels).await?;
        (push_time(&g) >= restarted).then_some(())
    })
    .await;
    let status = eventually(Duration::from_secs(10), "sink healthy again", || async {
        let s = agent.sink_status().pop()?;
        (s.consecutive_failures == 0).then_some(s)
    })
    .await;
    assert!(status.failures >= 2, "{status:?}");
    let g = group(&http, &base, &labels).await.unwrap();
    assert_eq!(value(&g, "gpumon_utilization_ratio", "uuid", &test_snapshot(0).devices[0].info.uuid), Some(0.25));
    // The agent's self-metrics, pushed with the data, record the outage.
    let failures = value(&g, "gpumon_sink_failures_total", "sink", "pushgateway").unwrap();
    assert!(failures >= 2.0, "{g}");
    agent.shutdown(Duration::from_secs(5)).await.unwrap();
}

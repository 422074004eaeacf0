//! Against a real Prometheus server (Debian `prometheus` 2.42) and `promtool`: the sink's
//! endpoint, fed by a real agent, is scraped in both namings and both exposition formats, the
//! stored values are compared with the snapshot, and every query of the Grafana dashboard is
//! run. `#[ignore]`d: `scripts/test.sh` runs it (`--include-ignored`); then it fails loudly.
#![cfg(feature = "prometheus-http")]

#[path = "backend_support/mod.rs"]
mod backend_support;
#[path = "prometheus_support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use backend_support::promtool_check_metrics;
use gpumon_core::{Agent, AgentHandle, MetricId, MetricSet, Snapshot};
use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::{free_port, KillOnDrop, TempDir};
use gpumon_sinks::prometheus::{Format, Naming, PrometheusConfig, PrometheusSink};
use serde_json::Value as Json;
use support::{eventually, test_snapshot, TestSampler, HOST, NASTY_NAME};

struct Target {
    job: &'static str,
    naming: Naming,
    agent: AgentHandle,
    sampler: Arc<TestSampler>,
    addr: std::net::SocketAddr,
    handle: gpumon_sinks::prometheus::PrometheusHandle,
}

fn start_target(job: &'static str, naming: Naming, openmetrics: bool) -> Target {
    let mut config = PrometheusConfig::default();
    config.listen = Some("127.0.0.1:0".parse().unwrap());
    config.naming = naming;
    config.openmetrics = openmetrics;
    let sink = PrometheusSink::from_config(&config).unwrap();
    let addr = sink.local_addr().unwrap();
    let handle = sink.handle();
    let sampler = Arc::new(TestSampler::default());
    // Every family exported, the opt-in ones too: the dashboard has panels over them (each says
    // which family it needs), checked below to return data.
    let agent = Agent::builder_arc(sampler.clone())
        .interval(Duration::from_millis(250))
        .metrics(MetricSet::everything())
        .sink(sink)
        .spawn()
        .unwrap();
    Target { job, naming, agent, sampler, addr, handle }
}

struct Prom {
    base: String,
    http: reqwest::Client,
}

type Series = Vec<(BTreeMap<String, String>, f64)>;

impl Prom {
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Json, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.base), params).unwrap();
        let r = self.http.get(url).send().await.map_err(|e| e.to_string())?;
        let status = r.status();
        let text = r.text().await.map_err(|e| e.to_string())?;
        let body: Json = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        if !status.is_success() || body["status"] != "success" {
            return Err(format!("{path} {params:?}: HTTP {status}: {body}"));
        }
        Ok(body["data"].clone())
    }

    /// An instant query's vector result.
    async fn query(&self, q: &str) -> Series {
        let data = self.api("/api/v1/query", &[("query", q)]).await.unwrap_or_else(|e| panic!("query {q}: {e}"));
        assert_eq!(data["resultType"], "vector", "{q}");
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect();
                let v: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
                (labels, v)
            })
            .collect()
    }

    /// The single value of `q`; panics unless exactly one series matches.
    async fn one(&self, q: &str) -> (BTreeMap<String, String>, f64) {
        let mut r = self.query(q).await;
        assert_eq!(r.len(), 1, "{q} should match one series, got {r:?}");
        r.pop().unwrap()
    }
}

fn write_config(dir: &std::path::Path, targets: &[Target]) -> std::path::PathBuf {
    let mut yml = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
    );
    for t in targets {
        yml.push_str(&format!("  - job_name: {}\n    static_configs:\n      - targets: ['{}']\n", t.job, t.addr));
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, yml).unwrap();
    path
}

/// Values of the first three devices of the test snapshot in both namings.
async fn check_values(prom: &Prom, t: &Target, snap: &Snapshot) {
    let job = t.job;
    let gpu0 = &snap.devices[0];
    let gpu1 = &snap.devices[1];
    let mig = &snap.devices[2];
    let lost = &snap.devices[3];
    // In dcgm naming a MIG instance carries its parent's UUID; `GPU_I_ID=""` picks the GPU.
    let (uuid, up, name_label, host_label, whole_gpu) = match t.naming {
        Naming::Native => ("uuid", "gpumon_up", "name", "host", ""),
        _ => ("UUID", "gpumon_up", "modelName", "Hostname", ",GPU_I_ID=\"\""),
    };
    // (metric, value of gpu0, value of gpu1) for a set of families, both namings from the
    // catalogue, so the names cannot drift from what the sink uses.
    let families: [(MetricId, f64, f64); 9] = [
        (MetricId::GpuUtilization, gpu0.utilization.gpu.unwrap(), gpu1.utilization.gpu.unwrap()),
        (MetricId::MemoryUsed, gpu0.memory.used.unwrap() as f64, gpu1.memory.used.unwrap() as f64),
        (MetricId::GpuTemperature, gpu0.temperature.gpu.unwrap(), gpu1.temperature.gpu.unwrap()),
        (MetricId::PowerUsage, gpu0.power.usage_watts.unwrap(), gpu1.power.usage_watts.unwrap()),
        (MetricId::EnergyConsumed, gpu0.power.energy_joules.unwrap(), gpu1.power.energy_joules.unwrap()),
        (MetricId::ClockSm, gpu0.clocks.sm.unwrap(), gpu1.clocks.sm.unwrap()),
        (MetricId::PcieReplays, gpu0.pcie.replays.unwrap() as f64, gpu1.pcie.replays.unwrap() as f64),
        (MetricId::EccUncorrected, gpu0.ecc.uncorrected.unwrap() as f64, gpu1.ecc.uncorrected.unwrap() as f64),
        (MetricId::GpmSmActivity, gpu0.gpm.sm_activity.unwrap(), gpu1.gpm.sm_activity.unwrap()),
    ];
    for (id, v0, v1) in families {
        let d = id.descriptor();
        let (name, scale) = match (t.naming, d.dcgm) {
            (Naming::Dcgm, Some(dcgm)) => (dcgm.name.to_owned(), dcgm.scale),
            _ => (d.prometheus_name(), 1.0),
        };
        for (dev, want) in [(gpu0, v0), (gpu1, v1)] {
            let (_, got) = prom.one(&format!("{name}{{job=\"{job}\",{uuid}=\"{}\"{whole_gpu}}}", dev.info.uuid)).await;
            assert_eq!(got, want * scale, "{job}: {name} of {}", dev.info.uuid);
        }
    }

    // A labelled family: XID counts by code.
    let xid = MetricId::XidErrors.descriptor();
    let xid_name = match t.naming {
        Naming::Dcgm => xid.dcgm.unwrap().name.to_owned(),
        _ => xid.prometheus_name(),
    };
    let (labels, v) = prom.one(&format!("{xid_name}{{job=\"{job}\",{uuid}=\"{}\",xid=\"79\"}}", gpu1.info.uuid)).await;
    assert_eq!(v, gpu1.xid_errors[0].count as f64);
    assert_eq!(labels["gpu"], "1");
    // Throttle reasons, one 0/1 series per reason.
    let reasons = prom
        .query(&format!(
            "{}{{job=\"{job}\",{uuid}=\"{}\"}}",
            MetricId::ClockEventActive.descriptor().prometheus_name(),
            gpu0.info.uuid
        ))
        .await;
    assert_eq!(reasons.len(), gpumon_core::ClockEventReasons::ALL.len());
    for (l, v) in reasons {
        assert_eq!(v, if l["reason"] == "sw_power_cap" { 1.0 } else { 0.0 }, "{l:?}");
    }

    // Identity labels, the nasty name included, round-trip exactly.
    match t.naming {
        Naming::Native => {
            let (l, v) = prom.one(&format!("gpumon_gpu_info{{job=\"{job}\",uuid=\"{}\"}}", gpu1.info.uuid)).await;
            assert_eq!(v, 1.0);
            assert_eq!(l[name_label], NASTY_NAME);
            assert_eq!(l["pci_bus_id"], "00000000:18:00.0");
            assert_eq!(l["driver_version"], "570.86.15");
            assert_eq!(l["cuda_version"], "12.8");
            assert_eq!(l["serial"], "1650001");
            assert_eq!(l[host_label], HOST);
            let (l, v) =
                prom.one(&format!("gpumon_utilization_ratio{{job=\"{job}\",uuid=\"{}\"}}", mig.info.uuid)).await;
            assert_eq!(v, mig.utilization.gpu.unwrap());
            assert_eq!(
                (l["gpu"].as_str(), l["gpu_instance_id"].as_str(), l["mig_profile"].as_str()),
                ("0", "7", "1g.10gb")
            );
        }
        _ => {
            let (l, _) = prom.one(&format!("DCGM_FI_DEV_GPU_UTIL{{job=\"{job}\",UUID=\"{}\"}}", gpu1.info.uuid)).await;
            assert_eq!(l[name_label], NASTY_NAME);
            assert_eq!(l["device"], "nvidia1");
            assert_eq!(l["gpu"], "1");
            assert_eq!(l["pci_bus_id"], "00000000:18:00.0");
            assert_eq!(l[host_label], HOST);
            assert_eq!(l["DCGM_FI_DRIVER_VERSION"], "570.86.15");
            // MIG: UUID is the parent's, told apart by GPU_I_ID.
            let (l, v) = prom
                .one(&format!("DCGM_FI_DEV_GPU_UTIL{{job=\"{job}\",UUID=\"{}\",GPU_I_ID=\"7\"}}", gpu0.info.uuid))
                .await;
            assert_eq!(v, mig.utilization.gpu.unwrap() * 100.0);
            assert_eq!(l["GPU_I_PROFILE"], "1g.10gb");
        }
    }

    // Findings: native names in both namings; the device finding with the device's labels, the
    // host-level one and the counter with only the host label (+ their own).
    let (l, v) = prom.one(&format!("gpumon_finding_active{{job=\"{job}\",kind=\"near_oom\"}}")).await;
    assert_eq!(v, 1.0);
    assert_eq!(
        (l[uuid].as_str(), l["gpu"].as_str(), l["severity"].as_str()),
        (gpu0.info.uuid.as_str(), "0", "warning")
    );
    assert_eq!(l[host_label], HOST);
    let (l, v) = prom.one(&format!("gpumon_finding_active{{job=\"{job}\",kind=\"imbalance\"}}")).await;
    assert_eq!(v, 1.0);
    assert!(!l.contains_key(uuid) && !l.contains_key("gpu"), "host-level finding has no device labels: {l:?}");
    assert_eq!((l[host_label].as_str(), l["severity"].as_str()), (HOST, "info"));
    let (l, v) = prom.one(&format!("gpumon_findings_raised_total{{job=\"{job}\",kind=\"near_oom\"}}")).await;
    assert_eq!(v, 2.0);
    assert!(!l.contains_key(uuid), "{l:?}");

    // The lost device: up 0 and nothing else.
    let (_, v) = prom.one(&format!("{up}{{job=\"{job}\",{uuid}=\"{}\"}}", lost.info.uuid)).await;
    assert_eq!(v, 0.0);
    let all = prom.query(&format!("{{job=\"{job}\",{uuid}=\"{}\"}}", lost.info.uuid)).await;
    assert_eq!(all.len(), 1, "a lost device exports only its up series: {all:?}");

    // Self-metrics.
    let (_, v) = prom.one(&format!("gpumon_last_sample_success{{job=\"{job}\"}}")).await;
    assert_eq!(v, 1.0);
    let (_, v) = prom.one(&format!("gpumon_samples_total{{job=\"{job}\"}}")).await;
    assert!(v >= 1.0);
    let (_, v) = prom.one(&format!("gpumon_sink_failures_total{{job=\"{job}\",sink=\"prometheus\"}}")).await;
    assert_eq!(v, 0.0);
}

/// `promtool check metrics` on the 0.0.4 rendering: no problem at all for native names; for
/// dcgm names only the lint dcgm-exporter's own names trigger.
fn promtool_check(promtool: &str, t: &Target) {
    let text = t.handle.render(Format::Text);
    let (passed, report) = promtool_check_metrics(promtool, &text);
    match t.naming {
        Naming::Native => {
            assert!(passed && report.trim().is_empty(), "promtool on {}:\n{report}", t.job);
        }
        _ => {
            for line in report.lines().filter(|l| !l.trim().is_empty()) {
                let expected = line.contains("counter metrics should have \"_total\" suffix")
                    || line.contains("metric name should not include type 'counter'")
                    || line.contains("metric names should be written in 'snake_case'")
                    || line.contains("label names should be written in 'snake_case'");
                assert!(expected, "unexpected promtool problem on {}: {line}\n{report}", t.job);
            }
        }
    }
}

/// Dashboard panels that show gpumon's diagnosis findings (`gpumon_finding_active`,
/// `gpumon_findings_raised_total`). The agents of this test export no findings (their snapshots
/// come straight from a test sampler, no diagnosis stage), so these panels' queries must be
/// valid PromQL but may return nothing; an end-to-end test with a finding-producing scenario
/// checks them with data.
const FINDINGS_PANELS: &[&str] = &["Active findings", "Findings raised"];

/// Dashboard panels over training steps (`gpumon_training_step`, `gpumon_step_*`,
/// `gpumon_steps_rejected_total`). The agents of this test run no step tracker, so these queries
/// must be valid PromQL but may return nothing; the agent's steps tests check the series.
const STEPS_PANELS: &[&str] = &[
    "Training step",
    "Step duration",
    "Utilisation per step",
    "Peak memory per step",
    "Energy per step",
    "Step marks rejected",
];

/// Dashboard panels over the tenants of the GPUs (`namespace`, `pod`, `container` labels from
/// attribution, per-process series). The snapshots of this test carry no owners and no
/// processes, so these queries must be valid PromQL but return nothing here;
/// `tests/tenant_promql.rs` (root crate) runs them on owned GPUs and checks their sums exactly.
const TENANT_PANELS: &[&str] = &["GPU use by namespace", "Memory by container"];

/// Every panel and template query of the native dashboard, with the template variables
/// substituted, returns data (the [`FINDINGS_PANELS`], the [`STEPS_PANELS`], the
/// [`TENANT_PANELS`] and the annotation queries: they run).
async fn check_dashboard(prom: &Prom, job: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../dashboards/prometheus-native.json");
    let json: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let subst = |q: &str| {
        q.replace("$__rate_interval", "1m")
            .replace("$__interval", "1m")
            .replace("$__range", "5m")
            .replace("${host:regex}", ".*")
            .replace("${gpu:regex}", ".*")
            .replace("${host}", ".*")
            .replace("${gpu}", ".*")
            .replace("$host", ".*")
            .replace("$gpu", ".*")
            .replace("$job", job)
    };
    let mut exprs = Vec::new();
    fn walk(v: &Json, out: &mut Vec<(String, String)>) {
        if let Some(panels) = v.get("panels").and_then(Json::as_array) {
            for p in panels {
                let title = p["title"].as_str().unwrap_or("?").to_owned();
                for t in p.get("targets").and_then(Json::as_array).into_iter().flatten() {
                    if let Some(e) = t["expr"].as_str() {
                        out.push((title.clone(), e.to_owned()));
                    }
                }
                walk(p, out);
            }
        }
    }
    walk(&json, &mut exprs);
    // Every panel target of the dashboard (rows included) is an expression checked below: 41,
    // the five of the NVLink row, the two of the findings panels, the six of the steps panels and
    // the two of the tenants row.
    assert_eq!(exprs.len(), 56, "panel queries found in the dashboard");
    let may_be_empty = |title: &str| [FINDINGS_PANELS, STEPS_PANELS, TENANT_PANELS].iter().any(|l| l.contains(&title));
    for name in FINDINGS_PANELS.iter().chain(STEPS_PANELS).chain(TENANT_PANELS) {
        assert!(
            exprs.iter().any(|(title, _)| title == name),
            "FINDINGS/STEPS/TENANT_PANELS name `{name}`, not in the dashboard"
        );
    }
    for (title, expr) in &exprs {
        let q = subst(expr);
        assert!(!q.contains('$'), "unsubstituted variable in panel {title}: {q}");
        // `query` panics unless Prometheus accepts the query, so every panel is checked for that.
        let r = prom.query(&q).await;
        if !may_be_empty(title) {
            assert!(!r.is_empty(), "dashboard panel `{title}` returned no data: {q}");
        }
    }
    // Annotation queries (the findings overlay): valid PromQL.
    let annotations = json["annotations"]["list"].as_array().unwrap();
    let mut annotation_queries = 0;
    for a in annotations {
        if let Some(e) = a["expr"].as_str() {
            let q = subst(e);
            assert!(!q.contains('$'), "unsubstituted variable in annotation {}: {q}", a["name"]);
            prom.query(&q).await;
            annotation_queries += 1;
        }
    }
    assert_eq!(annotation_queries, 1, "the findings annotation");
    // Template variables: label_values(metric, label) → the series API. Every variable but the
    // data-source picker is one, and each must have values.
    let mut vars = 0;
    for var in json["templating"]["list"].as_array().unwrap() {
        if var["type"] == "datasource" {
            continue;
        }
        vars += 1;
        let def =
            var["definition"].as_str().or_else(|| var["query"]["query"].as_str()).or_else(|| var["query"].as_str());
        let def = def.unwrap_or_else(|| panic!("variable {} has no query", var["name"]));
        let inner = def
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {} is not label_values(..): {def}", var["name"]));
        let (selector, label) = inner.rsplit_once(',').unwrap();
        let selector = subst(selector.trim());
        let data = prom.api("/api/v1/series", &[("match[]", &selector)]).await.unwrap();
        let values: Vec<_> = data.as_array().unwrap().iter().filter_map(|s| s[label.trim()].as_str()).collect();
        assert!(!values.is_empty(), "template variable {} has no values: {def}", var["name"]);
    }
    assert_eq!(vars, 2, "template variables host and gpu");
    eprintln!("dashboard: {} panel queries returned data", exprs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (Prometheus and promtool)"]
async fn real_prometheus_scrapes_both_namings_and_formats() {
    let prometheus = require_env("GPUMON_TEST_PROMETHEUS_BIN");
    let promtool = require_env("GPUMON_TEST_PROMTOOL");

    let targets = vec![
        start_target("native-om", Naming::Native, true),
        start_target("native-text", Naming::Native, false),
        start_target("dcgm-om", Naming::Dcgm, true),
        start_target("dcgm-text", Naming::Dcgm, false),
    ];
    let dir = TempDir::new("prometheus");
    let config = write_config(dir.path(), &targets);
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let child = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {prometheus}: {e}"));
    let _prometheus = KillOnDrop(child);
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    let prom = Prom { base: format!("http://127.0.0.1:{port}"), http: reqwest::Client::new() };
    let log_tail = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();

    eventually(Duration::from_secs(30), "prometheus ready", || async {
        let r = prom.http.get(format!("{}/-/ready", prom.base)).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    // First scrape comes 5-6 s after ready.
    let wait_up = tokio::time::timeout(Duration::from_secs(40), async {
        loop {
            let up = prom.query("up == 1").await;
            if up.len() == targets.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if wait_up.is_err() {
        let t = prom.api("/api/v1/targets", &[]).await.unwrap();
        panic!("targets not all up after 40 s: {t}\nprometheus log:\n{}", log_tail());
    }
    // Which format each target was scraped in (Prometheus keeps no record of it, so ask the
    // sink the same way Prometheus does): OpenMetrics-capable targets must have been accepted by
    // the strict OpenMetrics parser — being up proves it.

    let snap = test_snapshot(0);
    for t in &targets {
        // Wait for a scrape that has the self-metrics of a running agent.
        eventually(Duration::from_secs(10), "self-metrics scraped", || async {
            let r = prom.query(&format!("gpumon_samples_total{{job=\"{}\"}} >= 1", t.job)).await;
            (!r.is_empty()).then_some(())
        })
        .await;
        check_values(&prom, t, &snap).await;
        promtool_check(&promtool, t);
    }

    // Every dashboard query returns data (native names); rate() needs a few scrapes first.
    eventually(Duration::from_secs(15), "three scrapes for rate()", || async {
        let r = prom.query("count_over_time(up{job=\"native-om\"}[1m]) >= 3").await;
        (!r.is_empty()).then_some(())
    })
    .await;
    check_dashboard(&prom, "native-om").await;

    // A device that disappears from the snapshots disappears from Prometheus (staleness marker
    // at the next scrape), instead of freezing at its last value.
    let t = &targets[0];
    let gone = &snap.devices[1].info.uuid;
    t.sampler.hide_gpu1.store(true, Ordering::Relaxed);
    eventually(Duration::from_secs(10), "vanished GPU goes stale", || async {
        prom.query(&format!("{{job=\"native-om\",uuid=\"{gone}\"}}")).await.is_empty().then_some(())
    })
    .await;
    assert!(!prom
        .query(&format!("gpumon_up{{job=\"native-om\",uuid=\"{}\"}}", snap.devices[0].info.uuid))
        .await
        .is_empty());

    for t in targets {
        t.agent.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

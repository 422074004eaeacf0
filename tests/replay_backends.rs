//! #44 item 6, against the real servers `scripts/test.sh` starts on 127.0.0.1: a trace recorded
//! on the mock and replayed arrives marked in every backend — `backend="replay"` and
//! `recorded_backend="mock"` on the Prometheus scrape, the Pushgateway and remote write (into
//! VictoriaMetrics and into Prometheus), the InfluxDB tags, and the OTLP resource of both
//! pipelines. Simulated data never passes for recorded GPUs' through the replay door.
//!
//! `#[ignore]`d: `scripts/test.sh` starts the servers and runs them (`--include-ignored`).
#![cfg(all(
    feature = "agent",
    feature = "prometheus",
    feature = "pushgateway",
    feature = "influxdb",
    feature = "otlp",
    feature = "remote-write"
))]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gpumon_mock::test_env::require_env as env;
use gpumon_mock::test_kit::{free_port, Ready};

mod common;
use common::{agent, agent_process, run, PrometheusInstance};

/// A seed no other test uses, so the fleet's UUIDs are this run's own on shared servers.
fn unique_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    (u64::from(std::process::id()) << 32) | u64::from(nanos)
}

fn http() -> reqwest::blocking::Client {
    #[cfg(feature = "tls")]
    gpumon::sinks::tls::install_crypto_provider();
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

fn get_text(url: &str, query: &[(&str, &str)]) -> String {
    let resp = http().get(url).query(query).send().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.text().unwrap()
}

/// Records 2 s of the mock (`a100x4`, ticks of 200 ms) with `seed`: the trace, the UUID of its
/// first GPU and how many snapshots it holds.
fn record(seed: u64) -> (PathBuf, String, usize) {
    let dir = std::env::temp_dir().join(format!("gpumon-replay-backends-{seed}"));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("mock.gpumon-trace.gz");
    let (code, _, stderr) = run(agent()
        .args(["--backend", "mock", "--mock-profile", "a100x4", "--mock-seed", &seed.to_string()])
        .args(["--interval", "200ms", "--duration", "2s", "--record"])
        .arg(&trace));
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) =
        run(agent().arg("--replay").arg(&trace).args(["--replay-speed", "max", "--stdout-format", "json"]));
    assert_eq!(code, 0, "{stderr}");
    let ticks = stdout.lines().count();
    assert!(ticks >= 8, "{stdout}");
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(
        (first["system"]["backend"].as_str(), first["system"]["recorded_backend"].as_str()),
        (Some("replay"), Some("mock"))
    );
    (trace, first["devices"][0]["info"]["uuid"].as_str().unwrap().to_owned(), ticks)
}

/// Polls `query` on the Prometheus-API server at `base` until it returns a series (30 s at
/// most): the label sets found.
fn wait_for_series(base: &str, query: &str) -> Vec<serde_json::Value> {
    let started = Instant::now();
    loop {
        let body = get_text(&format!("{base}/api/v1/query"), &[("query", query)]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if let Some(rs) = v["data"]["result"].as_array().filter(|r| !r.is_empty()) {
            return rs.iter().map(|r| r["metric"].clone()).collect();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no series for {query} after 30 s: {body}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The OTLP receiver's decoded data points of `service` (the official protobuf classes).
fn otlp_points(service: &str) -> Vec<serde_json::Value> {
    get_text(&env("GPUMON_TEST_OTLP_RECEIVED"), &[])
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|p| p["resource"]["service.name"] == service)
        .collect()
}

/// Every OTLP point of `service` comes from a resource that says replayed and simulated when
/// recorded; at least one point is about `uuid`.
fn assert_otlp_marked(service: &str, uuid: &str) {
    let points = otlp_points(service);
    assert!(points.iter().any(|p| p["attributes"]["hw.id"] == uuid), "no OTLP point of {uuid} for {service}");
    for p in &points {
        let r = &p["resource"];
        assert_eq!(
            (r["gpumon.backend"].as_str(), r["gpumon.recorded_backend"].as_str()),
            (Some("replay"), Some("mock")),
            "{p}"
        );
    }
}

/// A mock trace replayed slowly (10 ticks over 20 s) with the Prometheus endpoint scraped by a
/// real Prometheus, remote write into that Prometheus, the Pushgateway, InfluxDB and the OTLP
/// receiver (SDK pipeline: its resource comes from the agent's config alone).
#[test]
#[ignore = "needs Prometheus, Pushgateway, InfluxDB and the OTLP receiver: run by scripts/test.sh"]
fn a_replayed_mock_trace_arrives_marked_in_prometheus_pushgateway_influxdb_and_otlp() {
    let seed = unique_seed();
    let (trace, uuid, ticks) = record(seed);
    let (scrape_port, prom_port) = (free_port(), free_port());
    let job = format!("replay-{seed}");
    let service = format!("gpumon-replay-sdk-{seed}");
    let prom = format!("http://127.0.0.1:{prom_port}");
    // A replayed snapshot is as old as its recording: the endpoint serves it with a long
    // stale_after (docs/replay.md).
    let config = trace.with_file_name("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[prometheus]\nlisten = \"127.0.0.1:{scrape_port}\"\nstale_after = \"1h\"\n\n\
             [otlp]\nendpoint = \"{}\"\nprotocol = \"http\"\npipeline = \"sdk\"\nservice_name = \"{service}\"\n",
            env("GPUMON_TEST_OTLP_HTTP")
        ),
    )
    .unwrap();
    let mut replay = agent_process()
        .arg("--config")
        .arg(&config)
        .arg("--replay")
        .arg(&trace)
        .args(["--replay-speed", "0.1"])
        .args(["--pushgateway-url", &env("GPUMON_TEST_PUSHGATEWAY_URL"), "--pushgateway-job", &job])
        .args(["--influx-url", &env("GPUMON_TEST_INFLUXDB_URL"), "--influx-db", &env("GPUMON_TEST_INFLUXDB_DB")])
        .args(["--remote-write-url", &format!("{prom}/api/v1/write")])
        .ready(Ready::Port(([127, 0, 0, 1], scrape_port).into()))
        .ready_timeout(Duration::from_secs(30))
        .spawn();
    let dir = env("GPUMON_TEST_BACKENDS_DIR");
    let instance = format!("replay{seed}");
    let status = Command::new(format!("{dir}/start-prometheus.sh"))
        .env("BACKEND_INSTANCE", &instance)
        .env("PROM_PORT", prom_port.to_string())
        .env("PROM_SCRAPE_TARGETS", format!("127.0.0.1:{scrape_port}"))
        .status()
        .unwrap();
    assert!(status.success(), "start-prometheus.sh failed");
    let _prometheus = PrometheusInstance(instance, dir);

    // Scraped (the target's `instance` label) and remote-written (no `job`): both marked.
    let scraped = wait_for_series(
        &prom,
        &format!("gpumon_utilization_ratio{{uuid=\"{uuid}\",instance=\"127.0.0.1:{scrape_port}\"}}"),
    );
    let written = wait_for_series(&prom, &format!("gpumon_utilization_ratio{{uuid=\"{uuid}\",job=\"\"}}"));
    for labels in scraped.iter().chain(&written) {
        assert_eq!(
            (labels["backend"].as_str(), labels["recorded_backend"].as_str()),
            (Some("replay"), Some("mock")),
            "{labels}"
        );
    }
    assert!(replay.wait_timeout(Duration::from_secs(60)).success(), "{}", replay.log());

    // Pushgateway: the group of this job.
    let pushed = get_text(&format!("{}/metrics", env("GPUMON_TEST_PUSHGATEWAY_URL")), &[]);
    let lines: Vec<&str> = pushed
        .lines()
        .filter(|l| l.starts_with("gpumon_utilization_ratio{") && l.contains(&format!("job=\"{job}\"")))
        .collect();
    assert!(lines.iter().any(|l| l.contains(&uuid)), "no pushed series of {uuid}: {lines:?}");
    for l in &lines {
        assert!(l.contains("backend=\"replay\"") && l.contains("recorded_backend=\"mock\""), "{l}");
    }

    // InfluxDB: every `gpu` point of the GPU carries both tags.
    let q = format!("SELECT \"utilization\", \"backend\", \"recorded_backend\" FROM \"gpu\" WHERE \"uuid\" = '{uuid}'");
    let db = env("GPUMON_TEST_INFLUXDB_DB");
    let body = get_text(&format!("{}/query", env("GPUMON_TEST_INFLUXDB_URL")), &[("db", &db), ("q", &q)]);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = v["results"][0]["series"][0]["values"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), ticks, "one point per replayed tick: {body}");
    for row in &rows {
        assert_eq!((row[2].as_str(), row[3].as_str()), (Some("replay"), Some("mock")), "{body}");
    }

    // OTLP, SDK pipeline: the resource the agent built from its config says it.
    assert_otlp_marked(&service, &uuid);
}

/// The same trace replayed as fast as it goes, with remote write into VictoriaMetrics and the
/// OTLP receiver through the direct pipeline (the default).
#[test]
#[ignore = "needs VictoriaMetrics and the OTLP receiver: run by scripts/test.sh"]
fn a_replayed_mock_trace_arrives_marked_in_victoria_metrics_and_otlp_direct() {
    let seed = unique_seed();
    let (trace, uuid, ticks) = record(seed);
    let service = format!("gpumon-replay-direct-{seed}");
    let vm = env("GPUMON_TEST_VM_URL");
    let (code, _, stderr) = run(agent()
        .arg("--replay")
        .arg(&trace)
        .args(["--replay-speed", "max", "--remote-write-url", &format!("{vm}/api/v1/write")])
        .args(["--otlp-endpoint", &env("GPUMON_TEST_OTLP_HTTP"), "--otlp-protocol", "http"])
        .env("OTEL_SERVICE_NAME", &service));
    assert_eq!(code, 0, "{stderr}");
    // VictoriaMetrics makes what it ingested searchable within a few seconds, even after a
    // forced flush: read until every tick is there, for up to 15 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let (body, series) = loop {
        let _ = http().get(format!("{vm}/internal/force_flush")).send();
        let body = get_text(
            &format!("{vm}/api/v1/export"),
            &[("match[]", &format!("gpumon_utilization_ratio{{uuid=\"{uuid}\"}}")), ("start", "0")],
        );
        let series: Vec<serde_json::Value> = body.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let complete = series.len() == 1 && series[0]["values"].as_array().map(Vec::len) == Some(ticks);
        if complete || std::time::Instant::now() >= deadline {
            break (body, series);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(series.len(), 1, "{body}");
    let labels = &series[0]["metric"];
    assert_eq!(
        (labels["backend"].as_str(), labels["recorded_backend"].as_str()),
        (Some("replay"), Some("mock")),
        "{body}"
    );
    assert_eq!(series[0]["values"].as_array().map(Vec::len), Some(ticks), "every replayed tick: {body}");
    assert_otlp_marked(&service, &uuid);
}

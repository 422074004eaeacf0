//! The example agent, as a user runs it, against the real servers `scripts/test.sh` starts on
//! 127.0.0.1: every value must arrive equal to what the mock profile produced.
//!
//! `#[ignore]`d: a plain `cargo test` lists these as ignored; `scripts/test.sh` starts the servers
//! and runs them (`--include-ignored`), and then a missing server is a failure.
#![cfg(all(
    feature = "agent",
    feature = "prometheus",
    feature = "pushgateway",
    feature = "influxdb",
    feature = "otlp"
))]

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use gpumon::core::{DeviceFilter, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_mock::{FleetProfile, MockSampler};

use gpumon_mock::test_env::require_env as env;

mod common;
use common::{agent, agent_process, PrometheusInstance};
use gpumon_mock::test_kit::{free_port, Ready};

/// A seed no other test uses, so the fleet's UUIDs are this run's own on shared servers.
fn unique_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    (u64::from(std::process::id()) << 32) | u64::from(nanos)
}

fn sampler(seed: u64) -> MockSampler {
    MockSampler::builder().profile(FleetProfile::load("a100x4").unwrap()).seed(seed).build().unwrap()
}

fn sample(s: &MockSampler) -> Snapshot {
    s.sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::all())).unwrap()
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

/// The data points of `service` the OTLP receiver decoded (with the official protobuf classes).
fn otlp_points(service: &str) -> Vec<serde_json::Value> {
    get_text(&env("GPUMON_TEST_OTLP_RECEIVED"), &[])
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|p| p["resource"]["service.name"] == service)
        .collect()
}

#[test]
#[ignore = "needs scripts/test.sh (Pushgateway, InfluxDB, OTLP receiver)"]
fn once_delivers_tick_zero_to_pushgateway_influxdb_and_otlp_exactly() {
    let seed = unique_seed();
    let expected = sample(&sampler(seed));
    let job = format!("e2e-{seed}");
    let service = format!("gpumon-e2e-{seed}");
    let out = agent()
        .args(["--backend", "mock", "--mock-profile", "a100x4", "--mock-seed", &seed.to_string(), "--once"])
        .args(["--pushgateway-url", &env("GPUMON_TEST_PUSHGATEWAY_URL"), "--pushgateway-job", &job])
        .args(["--influx-url", &env("GPUMON_TEST_INFLUXDB_URL"), "--influx-db", &env("GPUMON_TEST_INFLUXDB_DB")])
        .args(["--otlp-endpoint", &env("GPUMON_TEST_OTLP_HTTP"), "--otlp-protocol", "http"])
        .env("OTEL_SERVICE_NAME", &service)
        .output()
        .unwrap();
    assert!(out.status.success(), "agent failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "stdout is off when other sinks are configured");

    // Pushgateway: the group of this job, read back as exposition text.
    let pushed = get_text(&format!("{}/metrics", env("GPUMON_TEST_PUSHGATEWAY_URL")), &[]);
    let job_label = format!("job=\"{job}\"");
    for d in &expected.devices {
        let uuid = format!("uuid=\"{}\"", d.info.uuid);
        let pick = |metric: &str| {
            pushed
                .lines()
                .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&uuid) && l.contains(&job_label))
                .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        assert_eq!(
            pick("gpumon_utilization_ratio"),
            want(d.utilization.gpu, "utilization"),
            "pushgateway utilization of {uuid}"
        );
        assert_eq!(
            pick("gpumon_memory_used_bytes"),
            want(d.memory.used.map(|v| v as f64), "memory used"),
            "pushgateway memory of {uuid}"
        );
        assert_eq!(pick("gpumon_power_usage_watts"), want(d.power.usage_watts, "power"), "pushgateway power of {uuid}");
    }

    // InfluxDB: one `gpu` point per GPU, with this tick's values.
    let db = env("GPUMON_TEST_INFLUXDB_DB");
    for d in &expected.devices {
        let q = format!(
            "SELECT \"utilization\", \"memory_used\", \"temperature\" FROM \"gpu\" WHERE \"uuid\" = '{}'",
            d.info.uuid
        );
        let body = get_text(&format!("{}/query", env("GPUMON_TEST_INFLUXDB_URL")), &[("db", &db), ("q", &q)]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let rows = &v["results"][0]["series"][0]["values"];
        assert_eq!(rows.as_array().map(Vec::len), Some(1), "one point for {}: {body}", d.info.uuid);
        assert_eq!(rows[0][1].as_f64(), want(d.utilization.gpu, "utilization"), "{body}");
        assert_eq!(rows[0][2].as_u64(), want(d.memory.used, "memory used"), "{body}");
        assert_eq!(rows[0][3].as_f64(), want(d.temperature.gpu, "temperature"), "{body}");
    }

    // OTLP: the receiver decoded the export with the official protobuf classes.
    let points = otlp_points(&service);
    assert!(!points.is_empty(), "no OTLP data points for service {service}");
    for d in &expected.devices {
        let util: Vec<_> = points
            .iter()
            .filter(|p| {
                p["name"] == "hw.gpu.utilization"
                    && p["attributes"]["hw.id"] == d.info.uuid.as_str()
                    && p["attributes"]["hw.gpu.task"] == "general"
            })
            .collect();
        assert_eq!(util.len(), 1, "one utilization point for {}", d.info.uuid);
        assert_eq!(util[0]["value"].as_f64(), want(d.utilization.gpu, "utilization"));
        assert_eq!(util[0]["unit"], "1");
        let mem: Vec<_> = points
            .iter()
            .filter(|p| p["name"] == "hw.gpu.memory.usage" && p["attributes"]["hw.id"] == d.info.uuid.as_str())
            .collect();
        assert_eq!(mem.len(), 1);
        assert_eq!(mem[0]["value"].as_u64(), want(d.memory.used, "memory used"));
    }
}

/// A node whose driver did not load, as `auto` with exporting sinks runs on it: no simulated
/// GPUs anywhere, and every sink says "up 0" for the host — InfluxDB `up=0i` without device tags,
/// OTLP `hw.status` failed/ok = 1/0 without GPU attributes, the Pushgateway `gpumon_up 0`.
#[test]
#[ignore = "needs scripts/test.sh (Pushgateway, InfluxDB, OTLP receiver)"]
fn without_a_driver_every_sink_gets_up_0_for_the_host_and_no_gpu() {
    let seed = unique_seed();
    let host = format!("e2e-nodriver-{seed}");
    let job = format!("e2e-nodriver-{seed}");
    let service = format!("gpumon-e2e-nodriver-{seed}");
    let out = agent()
        .args(["--backend", "auto", "--nvml-library", "/nonexistent/libnvidia-ml.so.1", "--once", "--host", &host])
        .args(["--pushgateway-url", &env("GPUMON_TEST_PUSHGATEWAY_URL"), "--pushgateway-job", &job])
        .args(["--influx-url", &env("GPUMON_TEST_INFLUXDB_URL"), "--influx-db", &env("GPUMON_TEST_INFLUXDB_DB")])
        .args(["--otlp-endpoint", &env("GPUMON_TEST_OTLP_HTTP"), "--otlp-protocol", "http"])
        .env("OTEL_SERVICE_NAME", &service)
        .env("LD_LIBRARY_PATH", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `--once` whose only sample failed exits 1, after every sink got the failed tick.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent/libnvidia-ml.so.1"), "says why: {stderr}");
    assert!(!stderr.contains("MOCK"), "{stderr}");

    // InfluxDB: one `up` point about the host, in the GPUs' measurement, with no device tags.
    let db = env("GPUMON_TEST_INFLUXDB_DB");
    let q = format!("SELECT \"up\", \"uuid\", \"gpu\", \"backend\" FROM \"gpu\" WHERE \"host\" = '{host}'");
    let body = get_text(&format!("{}/query", env("GPUMON_TEST_INFLUXDB_URL")), &[("db", &db), ("q", &q)]);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = &v["results"][0]["series"][0]["values"];
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "one point: {body}");
    assert_eq!(rows[0][1].as_i64(), Some(0), "up = 0: {body}");
    assert!(rows[0][2].is_null() && rows[0][3].is_null() && rows[0][4].is_null(), "no device tags, no mock: {body}");

    // OTLP: `hw.status` about the host (no GPU attributes), failed = 1, ok = 0, and nothing else.
    let points = otlp_points(&service);
    let mut states: Vec<(String, Option<i64>)> = points
        .iter()
        .map(|p| {
            assert_eq!(p["name"], "hw.status", "no GPU series: {p}");
            assert!(p["attributes"]["hw.id"].is_null(), "about the host, not a GPU: {p}");
            (p["attributes"]["hw.state"].as_str().unwrap_or_default().to_owned(), p["value"].as_i64())
        })
        .collect();
    states.sort();
    assert_eq!(states, [("failed".to_owned(), Some(1)), ("ok".to_owned(), Some(0))], "{points:?}");
    assert_eq!(points[0]["resource"]["host.name"], host.as_str());

    // Pushgateway: the job's group (its `instance` is the host, `--host` included) holds
    // `gpumon_up 0` and no GPU series.
    let pushed = get_text(&format!("{}/metrics", env("GPUMON_TEST_PUSHGATEWAY_URL")), &[]);
    let job_label = format!("job=\"{job}\"");
    let ours: Vec<_> = pushed.lines().filter(|l| !l.starts_with('#') && l.contains(&job_label)).collect();
    let up: Vec<_> = ours.iter().filter(|l| l.starts_with("gpumon_up{")).collect();
    assert_eq!(up, [&format!("gpumon_up{{instance=\"{host}\",{job_label}}} 0")], "{ours:?}");
    assert!(!ours.iter().any(|l| l.contains("uuid=\"")), "no GPU series: {ours:?}");
}

/// An expected value the mock always fills in, as `Some`: comparing against it can never pass
/// as `None == None`.
fn want<T>(v: Option<T>, what: &str) -> Option<T> {
    assert!(v.is_some(), "the mock profile has no {what}: the comparison would be vacuous");
    v
}

fn prom_query(port: u16, q: &str) -> Vec<(String, f64)> {
    let body = get_text(&format!("http://127.0.0.1:{port}/api/v1/query"), &[("query", q)]);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| (r["metric"].to_string(), r["value"][1].as_str().unwrap().parse::<f64>().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "needs scripts/test.sh (Prometheus)"]
fn prometheus_scrapes_the_running_agent_in_both_namings() {
    let seed = unique_seed();
    // Every value the mock can produce in the first few hundred ticks, per GPU.
    let s = sampler(seed);
    let snaps: Vec<_> = (0..400).map(|_| sample(&s)).collect();
    let first = &snaps[0];
    let seen = |uuid: &str, f: &dyn Fn(&gpumon::core::DeviceSample) -> Option<f64>| -> BTreeSet<u64> {
        snaps.iter().filter_map(|s| s.device(uuid).and_then(f)).map(f64::to_bits).collect()
    };

    let (native_port, dcgm_port, prom_port) = (free_port(), free_port(), free_port());
    // Prometheus's first scrape must find both agents listening.
    let spawn = |port: u16, naming: &str| {
        agent_process()
            .args(["--backend", "mock", "--mock-profile", "a100x4", "--mock-seed", &seed.to_string()])
            .args(["--interval", "500ms", "--prometheus-naming", naming])
            .args(["--prometheus-listen", &format!("127.0.0.1:{port}")])
            .ready(Ready::Port(([127, 0, 0, 1], port).into()))
            .ready_timeout(Duration::from_secs(30))
            .spawn()
    };
    let dir = env("GPUMON_TEST_BACKENDS_DIR");
    let instance = format!("e2e{seed}");
    let _agents = [spawn(native_port, "native"), spawn(dcgm_port, "dcgm")];
    let status = Command::new(format!("{dir}/start-prometheus.sh"))
        .env("BACKEND_INSTANCE", &instance)
        .env("PROM_PORT", prom_port.to_string())
        .env("PROM_SCRAPE_TARGETS", format!("127.0.0.1:{native_port},127.0.0.1:{dcgm_port}"))
        .status()
        .unwrap();
    assert!(status.success(), "start-prometheus.sh failed");
    let _prometheus = PrometheusInstance(instance, dir);

    let uuid = first.devices[1].info.uuid.clone();
    let wait_for = |q: &str| {
        let started = Instant::now();
        loop {
            let r = prom_query(prom_port, q);
            if !r.is_empty() {
                return r;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no data for {q} after 30 s");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    // Static values: exact.
    let total = wait_for(&format!("gpumon_memory_total_bytes{{uuid=\"{uuid}\"}}"));
    assert_eq!(total[0].1, first.devices[1].memory.total.unwrap() as f64);
    let total_mib = wait_for(&format!("DCGM_FI_DEV_FB_TOTAL{{UUID=\"{uuid}\"}}"));
    assert_eq!(total_mib[0].1, (first.devices[1].memory.total.unwrap() / 1_048_576) as f64);
    let info = wait_for(&format!("gpumon_gpu_info{{uuid=\"{uuid}\"}}"));
    assert!(info[0].0.contains("NVIDIA A100-SXM4-40GB"), "{info:?}");
    // Changing values: each must be one the mock produced for that GPU.
    let util = wait_for(&format!("gpumon_utilization_ratio{{uuid=\"{uuid}\"}}"));
    assert!(seen(&uuid, &|d| d.utilization.gpu).contains(&util[0].1.to_bits()), "{util:?}");
    let util_pct = wait_for(&format!("DCGM_FI_DEV_GPU_UTIL{{UUID=\"{uuid}\"}}"));
    let pct: BTreeSet<u64> = seen(&uuid, &|d| d.utilization.gpu.map(|u| u * 100.0)).into_iter().collect();
    assert!(pct.contains(&util_pct[0].1.to_bits()), "{util_pct:?}");
    let temp = wait_for(&format!("gpumon_temperature_celsius{{uuid=\"{uuid}\"}}"));
    assert!(seen(&uuid, &|d| d.temperature.gpu).contains(&temp[0].1.to_bits()), "{temp:?}");
    let power = wait_for(&format!("DCGM_FI_DEV_POWER_USAGE{{UUID=\"{uuid}\"}}"));
    assert!(seen(&uuid, &|d| d.power.usage_watts).contains(&power[0].1.to_bits()), "{power:?}");
    // All four GPUs up, from each agent (the dcgm naming keeps native names, like `gpumon_up`,
    // for what dcgm-exporter has no field for).
    for port in [native_port, dcgm_port] {
        assert_eq!(wait_for(&format!("count(gpumon_up{{instance=\"127.0.0.1:{port}\"}} == 1)"))[0].1, 4.0);
    }
    assert_eq!(wait_for("count(DCGM_FI_DEV_GPU_TEMP)")[0].1, 4.0);
}

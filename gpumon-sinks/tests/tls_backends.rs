//! Every outbound sink over https against its real server, TLS turned on by the project's scripts
//! (`scripts/test.sh` runs `make-test-certs.sh`, `start-influxdb-tls.sh`,
//! `start-pushgateway-tls.sh`, `start-otlp-receiver-tls.sh` and `start-victoria-metrics-tls.sh`,
//! and exports the variables read here). The certificates are made at test time: a CA, a server
//! leaf for 127.0.0.1, a client certificate, and an unrelated CA that must be refused.
//!
//! Ignored under a plain `cargo test`; run through `scripts/test.sh`, where a missing variable
//! fails the test.
#![cfg(all(feature = "tls", feature = "influxdb-http", feature = "pushgateway", feature = "otlp-grpc"))]

#[path = "prometheus_support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpumon_core::Sink;
use gpumon_sinks::influxdb::{InfluxConfig, InfluxSink};
use gpumon_sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use gpumon_sinks::prometheus::{PushgatewayConfig, PushgatewaySink};
use gpumon_sinks::tls::TlsConfig;
use serde_json::Value as Json;
use support::{eventually, test_snapshot};

const IGNORE: &str = "needs scripts/test.sh (TLS backends)";

/// A variable `scripts/test.sh` exports; its absence fails the test (never a silent pass).
fn var(name: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!("{name} is not set: this test {IGNORE}, which exports it (see scripts/backends/README.md)")
    })
}

fn cert(name: &str) -> PathBuf {
    PathBuf::from(var("GPUMON_TEST_TLS_CERTS_DIR")).join(name)
}

fn trusting(ca: &str) -> TlsConfig {
    TlsConfig::with_ca_file(cert(ca))
}

fn with_client_cert(tls: TlsConfig) -> TlsConfig {
    tls.client_cert(cert("client.pem"), cert("client.key"))
}

/// A reqwest client for reading back, trusting the test CA and presenting the client certificate.
fn reader() -> reqwest::Client {
    gpumon_sinks::tls::install_crypto_provider();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(cert("ca.pem")).unwrap()).unwrap();
    let mut pem = std::fs::read(cert("client.pem")).unwrap();
    pem.extend(std::fs::read(cert("client.key")).unwrap());
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn run_id(test: &str) -> String {
    format!("tls_{test}_{}", std::process::id())
}

// --- InfluxDB 1.x, https-enabled -------------------------------------------------------------

fn influx(tls: TlsConfig, measurement: &str) -> InfluxSink {
    let mut c = InfluxConfig::v1(var("GPUMON_TEST_INFLUXDB_TLS_URL"), var("GPUMON_TEST_INFLUXDB_DB"));
    c.measurement = measurement.to_owned();
    c.batch_interval = Duration::from_secs(600);
    c.retry_initial = Duration::from_millis(50);
    c.retry_max = Duration::from_millis(200);
    c.tls = tls;
    InfluxSink::from_config(&c).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn influxdb_over_https_stores_the_points() {
    let measurement = run_id("influx");
    let mut sink = influx(trusting("ca.pem"), &measurement);
    sink.export(Arc::new(test_snapshot(0))).await.unwrap();
    sink.flush().await.unwrap();
    let written = sink.stats().lines_written;
    assert!(written > 0);

    // Read back over https: the points are in the database.
    let base = var("GPUMON_TEST_INFLUXDB_TLS_URL");
    let db = var("GPUMON_TEST_INFLUXDB_DB");
    let http = reader();
    let q = format!("SELECT count(*) FROM \"{measurement}\"");
    let body: Json = eventually(Duration::from_secs(10), "points readable", || async {
        let mut url = reqwest::Url::parse(&format!("{base}/query")).unwrap();
        url.query_pairs_mut().append_pair("db", &db).append_pair("q", &q);
        let j: Json = serde_json::from_str(&http.get(url).send().await.ok()?.text().await.ok()?).ok()?;
        j["results"][0]["series"].is_array().then_some(j)
    })
    .await;
    let counts = &body["results"][0]["series"][0]["values"][0];
    assert!(counts.as_array().is_some_and(|v| v.iter().skip(1).any(|c| c.as_u64().is_some_and(|n| n > 0))), "{body}");
    sink.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn influxdb_with_the_wrong_ca_fails_naming_the_url() {
    let mut sink = influx(trusting("other-ca.pem"), &run_id("influx_wrong_ca"));
    sink.export(Arc::new(test_snapshot(0))).await.unwrap();
    let e = sink.flush().await.unwrap_err().to_string();
    let url = var("GPUMON_TEST_INFLUXDB_TLS_URL");
    assert!(e.contains(&format!("{url}/write")), "{e}");
    assert!(e.contains("certificate") && e.contains("influxdb.tls.ca_file"), "{e}");
    assert_eq!(sink.stats().lines_written, 0);
}

// --- Pushgateway, --web.config.file with a required client certificate -----------------------

fn pushgateway(tls: TlsConfig, job: &str) -> PushgatewaySink {
    let mut c = PushgatewayConfig::default();
    c.url = var("GPUMON_TEST_PUSHGATEWAY_TLS_URL");
    c.job = job.to_owned();
    c.timeout = Duration::from_secs(3);
    c.tls = tls;
    PushgatewaySink::from_config(&c).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn pushgateway_over_mutual_tls_accepts_the_push() {
    let job = run_id("pushgw");
    let mut sink = pushgateway(with_client_cert(trusting("ca.pem")), &job);
    sink.export(Arc::new(test_snapshot(0))).await.unwrap();

    let base = var("GPUMON_TEST_PUSHGATEWAY_TLS_URL");
    let http = reader();
    let body = http.get(format!("{base}/api/v1/metrics")).send().await.unwrap().text().await.unwrap();
    let groups: Json = serde_json::from_str(&body).unwrap();
    let group = groups["data"].as_array().unwrap().iter().find(|g| g["labels"]["job"] == job.as_str()).cloned();
    let group = group.unwrap_or_else(|| panic!("no group for job {job}: {groups}"));
    assert!(group.get("gpumon_utilization_ratio").is_some(), "{group}");
    let deleted =
        http.delete(format!("{base}/metrics/job/{job}/instance/{}", group["labels"]["instance"].as_str().unwrap()));
    assert!(deleted.send().await.unwrap().status().is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn pushgateway_refuses_a_client_without_certificate_and_the_wrong_ca_is_named() {
    let url = var("GPUMON_TEST_PUSHGATEWAY_TLS_URL");
    // The server requires a client certificate: without one the handshake is refused.
    let mut sink = pushgateway(trusting("ca.pem"), &run_id("pushgw_nocert"));
    let e = sink.export(Arc::new(test_snapshot(0))).await.unwrap_err().to_string();
    eprintln!("{e}");
    assert!(e.contains(&url), "{e}");
    // The client does not trust the server: the error names the URL and the setting to check.
    let mut sink = pushgateway(with_client_cert(trusting("other-ca.pem")), &run_id("pushgw_wrong_ca"));
    let e = sink.export(Arc::new(test_snapshot(0))).await.unwrap_err().to_string();
    eprintln!("{e}");
    assert!(e.contains(&url) && e.contains("pushgateway.tls.ca_file"), "{e}");
}

// --- OTLP receiver over TLS: gRPC and HTTP, direct and SDK pipelines ---------------------------

async fn otlp_arrives(protocol: Protocol, pipeline: Pipeline) {
    let endpoint = match protocol {
        Protocol::Grpc => var("GPUMON_TEST_OTLP_TLS_GRPC"),
        _ => var("GPUMON_TEST_OTLP_TLS_HTTP"),
    };
    let run = run_id(&format!("otlp_{}_{}", protocol.as_str().replace('/', "_"), pipeline.as_str()));
    let mut cfg = OtlpConfig::new(endpoint, protocol);
    cfg.service_name = Some(run.clone());
    cfg.timeout = Some(Duration::from_secs(5));
    cfg.pipeline = Some(pipeline);
    cfg.tls = trusting("ca.pem");
    let mut sink = OtlpSink::from_config(&cfg).unwrap();
    sink.export(Arc::new(test_snapshot(0))).await.unwrap();
    sink.flush().await.unwrap();

    let received = var("GPUMON_TEST_OTLP_TLS_RECEIVED");
    let http = reader();
    let want = match protocol {
        Protocol::Grpc => "grpc",
        _ => "http",
    };
    let points = eventually(Duration::from_secs(10), "points received over TLS", || async {
        let body = http.get(&received).send().await.ok()?.text().await.ok()?;
        let mine: Vec<Json> = body
            .lines()
            .filter_map(|l| serde_json::from_str::<Json>(l).ok())
            .filter(|p| p["resource"]["service.name"] == run.as_str())
            .collect();
        (!mine.is_empty()).then_some(mine)
    })
    .await;
    assert!(points.iter().all(|p| p["transport"] == want), "{:?}", points[0]);
    assert!(
        points.iter().any(|p| p["name"] == "hw.gpu.utilization"),
        "{} points, none hw.gpu.utilization",
        points.len()
    );
    sink.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn otlp_http_over_tls_direct_and_sdk() {
    otlp_arrives(Protocol::HttpProtobuf, Pipeline::Direct).await;
    otlp_arrives(Protocol::HttpProtobuf, Pipeline::Sdk).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn otlp_grpc_over_tls_direct_and_sdk() {
    otlp_arrives(Protocol::Grpc, Pipeline::Direct).await;
    otlp_arrives(Protocol::Grpc, Pipeline::Sdk).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (TLS backends)"]
async fn otlp_with_the_wrong_ca_fails_naming_the_endpoint() {
    for (protocol, endpoint) in
        [(Protocol::HttpProtobuf, var("GPUMON_TEST_OTLP_TLS_HTTP")), (Protocol::Grpc, var("GPUMON_TEST_OTLP_TLS_GRPC"))]
    {
        let mut cfg = OtlpConfig::new(endpoint.clone(), protocol);
        cfg.timeout = Some(Duration::from_secs(5));
        cfg.tls = trusting("other-ca.pem");
        let mut sink = OtlpSink::from_config(&cfg).unwrap();
        let e = sink.export(Arc::new(test_snapshot(0))).await.unwrap_err().to_string();
        eprintln!("{protocol}: {e}");
        assert!(e.contains(&endpoint) && e.contains("otlp.tls.ca_file"), "{protocol}: {e}");
    }
}

// --- Prometheus remote write to VictoriaMetrics over https (`-tls`) ---------------------------

#[cfg(feature = "remote-write")]
mod remote_write {
    use super::*;
    use gpumon_sinks::remote_write::{RemoteWriteConfig, RemoteWriteSink};

    fn sink(tls: TlsConfig, run: &str) -> RemoteWriteSink {
        let mut c = RemoteWriteConfig::default();
        c.url = format!("{}/api/v1/write", var("GPUMON_TEST_VM_TLS_URL"));
        c.external_labels.insert("run".into(), run.to_owned());
        c.batch_interval = Duration::from_secs(600);
        c.retry_initial = Duration::from_millis(50);
        c.retry_max = Duration::from_millis(200);
        c.tls = tls;
        RemoteWriteSink::from_config(&c).unwrap()
    }

    /// VictoriaMetrics' raw export of the series labelled `run`, over https: (name, timestamps).
    async fn exported(run: &str) -> Vec<(String, Vec<i64>)> {
        let base = var("GPUMON_TEST_VM_TLS_URL");
        let http = reader();
        let _ = http.get(format!("{base}/internal/force_flush")).send().await;
        let mut url = reqwest::Url::parse(&format!("{base}/api/v1/export")).unwrap();
        url.query_pairs_mut().append_pair("match[]", &format!("{{run={run:?}}}")).append_pair("start", "0");
        let body = http.get(url).send().await.unwrap().error_for_status().unwrap().text().await.unwrap();
        body.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let j: Json = serde_json::from_str(l).unwrap();
                let name = j["metric"]["__name__"].as_str().unwrap().to_owned();
                (name, j["timestamps"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect())
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs scripts/test.sh (TLS backends)"]
    async fn remote_write_over_https_lands_in_victoria_metrics() {
        let run = run_id("remote_write");
        let mut sink = sink(trusting("ca.pem"), &run);
        for seq in 0..3 {
            sink.export(Arc::new(test_snapshot(seq))).await.unwrap();
        }
        sink.flush().await.unwrap();
        let stats = sink.stats();
        assert!(stats.samples_written > 0 && stats.samples_dropped == 0, "{stats:?}");
        // Searchable ~1-1.5 s after the flush: poll.
        let series = eventually(Duration::from_secs(20), "the samples in VictoriaMetrics over https", || async {
            let s = exported(&run).await;
            let total: usize = s.iter().map(|(_, t)| t.len()).sum();
            (total as u64 == stats.samples_written).then_some(s)
        })
        .await;
        assert!(series.iter().any(|(name, _)| name == "gpumon_utilization_ratio"), "{series:?}");
        sink.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs scripts/test.sh (TLS backends)"]
    async fn remote_write_with_the_wrong_ca_fails_naming_the_url() {
        let run = run_id("remote_write_wrong_ca");
        let mut sink = sink(trusting("other-ca.pem"), &run);
        sink.export(Arc::new(test_snapshot(0))).await.unwrap();
        let e = sink.flush().await.unwrap_err().to_string();
        let url = var("GPUMON_TEST_VM_TLS_URL");
        assert!(e.contains(&format!("{url}/api/v1/write")), "{e}");
        assert!(e.contains("certificate") && e.contains("remote_write.tls.ca_file"), "{e}");
        assert_eq!(sink.stats().samples_written, 0);
        assert!(exported(&run).await.is_empty(), "nothing may land over an untrusted connection");
    }
}

//! A stage of the embedder's own (`examples/custom_stage/stage.rs`: the `thermal_headroom`
//! series and the `thermal` event) through the real sinks to the real servers started by
//! `scripts/backends` (see `scripts/test.sh`): InfluxDB 1.6, the OTLP receiver (both pipelines,
//! HTTP and gRPC), remote write to VictoriaMetrics and Prometheus, and a Prometheus scraping the
//! scrape endpoint. Each reads the data back and checks the values (`limit − temperature`), not
//! only that something arrived. `custom_stage.rs` checks the same data in process.
//!
//! Every test is `#[ignore]`d; `scripts/test.sh` starts the servers and runs them with
//! `--include-ignored`, and a missing server is a failure. The data is simulated (the mock's
//! `thermal-throttling` scenario), so every sink marks it `backend=mock`.
#![cfg(all(feature = "influxdb-http", feature = "otlp", feature = "remote-write", feature = "prometheus-http"))]

#[path = "../../examples/custom_stage/stage.rs"]
mod stage;

mod otlp_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::{DeviceFilter, MetricSet, Processor, SampleRequest, Sampler, Sink, Snapshot, SystemInfo};
use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::free_port;
use gpumon_mock::{MockSampler, Scenario};
use gpumon_sinks::influxdb::{InfluxConfig, InfluxSink};
use gpumon_sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use gpumon_sinks::prometheus::{Format, Naming, PrometheusConfig, PrometheusSink};
use gpumon_sinks::remote_write::{RemoteWriteConfig, RemoteWriteSink};
use serde_json::Value as Json;

#[path = "backend_support/mod.rs"]
mod backend_support;
use backend_support::{client, promtool_check_metrics, range_samples};

/// The stage's limit, °C: the scenario's GPUs climb from 67 °C past it within [`TICKS`].
const LIMIT: f64 = 85.0;
/// Ticks sampled (one scenario second each).
const TICKS: usize = 50;
/// The stage's series under each sink's naming.
const PROM_NAME: &str = "gpumon_thermal_headroom_celsius";
const OTEL_NAME: &str = "acme.gpu.thermal.headroom";

/// A name unique across test processes and reruns: the host of this test's snapshots, its
/// InfluxDB `run` tag, its OTLP `gpumon.test.run`, its Prometheus instance.
fn unique(test: &str) -> String {
    backend_support::unique(&format!("cs-{test}"))
}

/// The run of the mock's `thermal-throttling` scenario through the stage.
struct Run {
    /// Every tick, the stage's output attached; host `host`, one second apart, the last one
    /// second ago (millisecond timestamps, as remote write sends them).
    snapshots: Vec<Arc<Snapshot>>,
    /// Tick 0 as sampled, before the stage ran (no stage output).
    raw_first: Arc<Snapshot>,
    /// The first tick with a `thermal` event (a GPU went over the limit).
    crossing: usize,
}

fn thermal_run(host: &str) -> Run {
    let sampler = MockSampler::builder().scenario(Scenario::builtin("thermal-throttling").unwrap()).build().unwrap();
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    let mut headroom = stage::ThermalHeadroom::new(LIMIT);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let base = UNIX_EPOCH + Duration::from_millis(now_ms) - Duration::from_secs(TICKS as u64);
    let mut snapshots = Vec::new();
    let mut raw_first = None;
    for tick in 0..TICKS {
        let mut s = sampler.sample(&request).unwrap();
        let mut system = SystemInfo::clone(&s.system);
        system.hostname = host.to_owned();
        s.system = Arc::new(system);
        s.taken_at = base + Duration::from_secs(tick as u64);
        if tick == 0 {
            raw_first = Some(Arc::new(s.clone()));
        }
        headroom.process(&mut s);
        snapshots.push(Arc::new(s));
    }
    let crossing = snapshots.iter().position(|s| !crossings(s).is_empty()).expect("a GPU crosses 85 °C within the run");
    let run = Run { snapshots, raw_first: raw_first.unwrap(), crossing };
    // What the tests rely on, checked on the data itself.
    assert!(run.raw_first.output::<stage::Headroom>().is_none());
    assert!(run.crossing > 0, "the GPUs start below the limit");
    for s in &run.snapshots {
        assert_eq!(expected_headroom(s).len(), s.devices.len(), "every GPU has a temperature");
        assert!(s.system.is_mock(), "simulated data");
    }
    for (uuid, hot, temperature) in crossings(&run.snapshots[run.crossing]) {
        assert!(hot && temperature > LIMIT, "{uuid}: {temperature} °C");
        let before = &run.snapshots[run.crossing - 1];
        let i = before.devices.iter().position(|d| d.info.uuid == uuid).unwrap();
        assert!(before.devices[i].temperature.gpu.unwrap() <= LIMIT);
    }
    run
}

/// `limit − temperature` per GPU (uuid → °C), from the samples, not from the stage.
fn expected_headroom(s: &Snapshot) -> BTreeMap<String, f64> {
    let from_samples: BTreeMap<String, f64> =
        s.devices.iter().filter_map(|d| Some((d.info.uuid.clone(), LIMIT - d.temperature.gpu?))).collect();
    // … and what the stage attached agrees.
    if let Some(h) = s.output::<stage::Headroom>() {
        let attached: BTreeMap<String, f64> = h.gpus.iter().map(|g| (g.uuid.clone(), g.headroom_c)).collect();
        assert_eq!(attached, from_samples);
    }
    from_samples
}

/// The crossings of one tick: (uuid, over the limit now, temperature).
fn crossings(s: &Snapshot) -> Vec<(String, bool, f64)> {
    s.output::<stage::Headroom>()
        .map(|h| h.crossings.iter().map(|c| (c.uuid.clone(), c.hot, c.temperature_c)).collect())
        .unwrap_or_default()
}

fn millis(s: &Snapshot) -> i64 {
    s.taken_at.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Equal up to a few ulps (JSON float parsing) or VictoriaMetrics' 12 significant digits.
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-11 * want.abs().max(1.0)
}

// ------------------------------------------------------------------------------------ InfluxDB

async fn influxql(url: &str, db: &str, q: &str) -> Json {
    backend_support::influxql(url, db, None, q).await
}

/// The rows of a `SELECT`, each as column → value.
fn rows(body: &Json) -> Vec<BTreeMap<String, Json>> {
    let mut out = Vec::new();
    for s in body["results"][0]["series"].as_array().into_iter().flatten() {
        let columns: Vec<&str> = s["columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        for row in s["values"].as_array().unwrap() {
            out.push(columns.iter().map(|c| (*c).to_owned()).zip(row.as_array().unwrap().iter().cloned()).collect());
        }
    }
    out
}

/// Through the real InfluxDB sink: `gpu_derived` holds `thermal_headroom` for every GPU at every
/// tick, `gpu_thermal` the crossings (`state=hot`, the temperature and the limit as fields).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs InfluxDB: scripts/test.sh starts it"]
async fn influxdb_stores_the_stages_series_and_events() {
    let (url, db) = (require_env("GPUMON_TEST_INFLUXDB_URL"), require_env("GPUMON_TEST_INFLUXDB_DB"));
    let run_tag = unique("influx");
    let run = thermal_run(&run_tag);
    let mut cfg = InfluxConfig::v1(&url, &db);
    cfg.batch_interval = Duration::from_millis(100);
    cfg.tags.insert("run".into(), run_tag.clone());
    let mut sink = InfluxSink::from_config(&cfg).unwrap();
    for s in &run.snapshots {
        sink.export(s.clone()).await.unwrap();
    }
    sink.shutdown().await.expect("every batch written");
    let stats = sink.stats();
    assert_eq!((stats.lines_rejected, stats.lines_dropped, stats.failed_requests), (0, 0, 0), "{stats:?}");

    // The series: one point per GPU and tick, `limit − temperature`, with the GPU's tags.
    let body = influxql(&url, &db, &format!("SELECT * FROM \"gpu_derived\" WHERE \"run\" = '{run_tag}'")).await;
    let mut stored: BTreeMap<(i64, String), f64> = BTreeMap::new();
    for r in rows(&body) {
        assert_eq!(r["host"], run_tag.as_str(), "{r:?}");
        assert_eq!(r["backend"], "mock", "simulated data is marked: {r:?}");
        let uuid = r["uuid"].as_str().unwrap().to_owned();
        let gpu = run.snapshots[0].devices.iter().find(|d| d.info.uuid == uuid).expect("a GPU of the run");
        assert_eq!(r["gpu"], gpu.info.index.to_string().as_str(), "{r:?}");
        let key = (r["time"].as_i64().unwrap(), uuid);
        assert!(stored.insert(key, r["thermal_headroom"].as_f64().unwrap()).is_none(), "one point per GPU and tick");
    }
    let mut want: BTreeMap<(i64, String), f64> = BTreeMap::new();
    for s in &run.snapshots {
        for (uuid, h) in expected_headroom(s) {
            want.insert((s.timestamp_nanos() as i64, uuid), h);
        }
    }
    assert_eq!(stored.len(), TICKS * run.snapshots[0].devices.len());
    assert_eq!(stored.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "a point per GPU per tick");
    for (k, w) in &want {
        assert!(close(stored[k], *w), "{k:?}: stored {} != {w}", stored[k]);
    }
    // One tick read by itself: the crossing tick's GPU 0.
    let at = &run.snapshots[run.crossing];
    let gpu0 = &at.devices[0];
    let q = format!(
        "SELECT \"thermal_headroom\" FROM \"gpu_derived\" WHERE \"run\" = '{run_tag}' AND \"gpu\" = '0' AND time = {}",
        at.timestamp_nanos()
    );
    let one = rows(&influxql(&url, &db, &q).await);
    assert_eq!(one.len(), 1, "{one:?}");
    assert!(close(one[0]["thermal_headroom"].as_f64().unwrap(), LIMIT - gpu0.temperature.gpu.unwrap()));

    // The events: one point per crossing, at its tick's time.
    let body = influxql(&url, &db, &format!("SELECT * FROM \"gpu_thermal\" WHERE \"run\" = '{run_tag}'")).await;
    let mut stored = BTreeSet::new();
    for r in rows(&body) {
        assert_eq!((r["host"].as_str(), r["backend"].as_str()), (Some(run_tag.as_str()), Some("mock")), "{r:?}");
        assert_eq!(r["limit_celsius"].as_f64(), Some(LIMIT), "{r:?}");
        let t = r["temperature_celsius"].as_f64().unwrap();
        stored.insert((
            r["time"].as_i64().unwrap(),
            r["uuid"].as_str().unwrap().to_owned(),
            r["gpu"].as_str().unwrap().to_owned(),
            r["state"].as_str().unwrap().to_owned(),
            t.to_bits(),
        ));
    }
    let mut want = BTreeSet::new();
    for s in &run.snapshots {
        for (uuid, hot, t) in crossings(s) {
            let gpu = s.devices.iter().find(|d| d.info.uuid == uuid).unwrap().info.index.to_string();
            let state = if hot { "hot" } else { "cool" };
            want.insert((s.timestamp_nanos() as i64, uuid, gpu, state.to_owned(), t.to_bits()));
        }
    }
    assert!(!want.is_empty());
    assert_eq!(stored, want, "the crossings, each once");
    assert!(
        stored.iter().any(|(t, _, _, state, _)| *t == at.timestamp_nanos() as i64 && state == "hot"),
        "the crossing tick's event"
    );
    eprintln!("InfluxDB: {} headroom points, {} thermal events", TICKS * at.devices.len(), want.len());
}

// ------------------------------------------------------------------------------------ OTLP

/// The data points of `request` for the GPU energy counters of `snapshot`: whether the request
/// is that snapshot's export.
fn is_export_of(request: &[Json], snapshot: &Snapshot) -> bool {
    snapshot.devices.iter().all(|d| {
        d.power.energy_joules.is_none_or(|e| {
            request.iter().any(|j| {
                j["name"] == "hw.energy"
                    && j["attributes"]["hw.id"] == d.info.uuid.as_str()
                    && j["value"].as_f64().is_some_and(|v| close(v, e))
            })
        })
    })
}

/// One OTLP sink (`protocol`, `pipeline`) exports tick 0 without the stage's output, then three
/// ticks with it (before the crossing, the crossing, the last): the first export has no
/// headroom instrument (the sink has never seen it), each later one has it: a gauge in `Cel`,
/// one point per GPU with its `hw.id`, `limit − temperature`. With the SDK pipeline this is the
/// instrument learnt at the first export that carries it.
async fn otlp_exports_the_stage(protocol: Protocol, pipeline: Pipeline) {
    let b = otlp_support::backends();
    let transport = if protocol == Protocol::Grpc { "grpc" } else { "http" };
    let tag = unique(&format!("otlp-{transport}-{}", pipeline.as_str()));
    let run = thermal_run(&tag);
    let mut cfg = OtlpConfig::new(if protocol == Protocol::Grpc { &b.grpc } else { &b.http }, protocol);
    cfg.service_name = Some("gpumon-custom-stage-it".into());
    cfg.timeout = Some(Duration::from_secs(5));
    cfg.pipeline = Some(pipeline);
    cfg.resource_attributes.insert("gpumon.test.run".into(), tag.clone());
    let mut sink = OtlpSink::from_config(&cfg).unwrap();
    assert_eq!(sink.pipeline(), pipeline);
    let with_stage = [run.crossing - 1, run.crossing, TICKS - 1];
    sink.export(run.raw_first.clone()).await.expect("export without the stage");
    for &i in &with_stage {
        sink.export(run.snapshots[i].clone()).await.expect("export with the stage");
    }
    sink.shutdown().await.expect("shutdown");

    let points = otlp_support::received(&b.received).await;
    let requests = otlp_support::requests_of_run(&points, &tag);
    let what = format!("[{transport}, {pipeline:?}]");
    let request_of = |s: &Snapshot| -> &Vec<Json> {
        requests
            .values()
            .find(|r| is_export_of(r, s))
            .unwrap_or_else(|| panic!("{what} no request carries tick {}", s.seq))
    };
    let first = request_of(&run.raw_first);
    assert!(first.iter().all(|j| j["name"] != OTEL_NAME), "{what} headroom before any snapshot carried it");
    assert!(first.iter().any(|j| j["name"] == "hw.temperature"), "{what} the GPU series are there");
    for &i in &with_stage {
        let s = &run.snapshots[i];
        let request = request_of(s);
        let headroom: Vec<&Json> = request.iter().filter(|j| j["name"] == OTEL_NAME).collect();
        let want = expected_headroom(s);
        assert_eq!(headroom.len(), want.len(), "{what} tick {i}: one point per GPU: {headroom:?}");
        let mut got = BTreeMap::new();
        for j in headroom {
            assert_eq!(j["transport"], transport);
            assert_eq!(j["type"], "gauge", "{what} {j}");
            assert_eq!(j["unit"], "Cel", "{what} {j}");
            assert_eq!(j["value_type"], "double", "{what} {j}");
            assert_eq!(j["description"], stage::HEADROOM.help, "{what} {j}");
            assert_eq!(j["resource"]["service.name"], "gpumon-custom-stage-it");
            let a = &j["attributes"];
            let uuid = a["hw.id"].as_str().unwrap_or_else(|| panic!("{what} no hw.id: {j}")).to_owned();
            let d = s.devices.iter().find(|d| d.info.uuid == uuid).unwrap();
            assert_eq!(a["hw.name"], format!("nvidia{}", d.info.index), "{what} {j}");
            assert!(a.get("gpumon.gpu.index").is_none(), "{what}: the index is on hw.status only: {j}");
            assert_eq!(a["hw.type"], "gpu", "{what} {j}");
            // Simulated data is marked: the direct pipeline on its resource, the SDK pipeline
            // (whose resource is fixed before any snapshot) on every point.
            match pipeline {
                Pipeline::Direct => assert_eq!(j["resource"]["gpumon.backend"], "mock", "{what} {j}"),
                _ => assert_eq!(a["gpumon.backend"], "mock", "{what} {j}"),
            }
            assert!(got.insert(uuid, j["value"].as_f64().unwrap()).is_none(), "{what} one point per GPU");
        }
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what} tick {i}");
        for (uuid, w) in &want {
            assert!(close(got[uuid], *w), "{what} tick {i} {uuid}: {} != {w}", got[uuid]);
        }
    }
    eprintln!("{what}: {} requests, headroom in each export after the first", requests.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the OTLP receiver: scripts/test.sh starts it"]
async fn otlp_http_exports_the_stages_series_through_both_pipelines() {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        otlp_exports_the_stage(Protocol::HttpProtobuf, pipeline).await;
    }
}

#[cfg(feature = "otlp-grpc")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the OTLP receiver: scripts/test.sh starts it"]
async fn otlp_grpc_exports_the_stages_series_through_both_pipelines() {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        otlp_exports_the_stage(Protocol::Grpc, pipeline).await;
    }
}

// ------------------------------------------------------------------------------------ remote write

/// The raw samples of `selector` over the last hour, per series (its labels), from a Prometheus
/// query API (Prometheus' or VictoriaMetrics').
async fn raw_samples(url: &str, selector: &str) -> BTreeMap<BTreeMap<String, String>, Vec<(i64, f64)>> {
    // VictoriaMetrics makes what it took searchable ~1 s after a flush (8-9 s without).
    let _ = client().get(format!("{url}/internal/force_flush")).send().await;
    range_samples(url, &format!("{selector}[1h]")).await.into_iter().collect()
}

/// Pushes the whole run through the remote-write sink to `write_url`, then reads
/// `gpumon_thermal_headroom_celsius` of this run's host back from `read_url`: one series per
/// GPU with its labels, a sample per tick at the tick's time, `limit − temperature`.
async fn remote_write_round_trip(write_url: &str, read_url: &str, naming: Naming, backend: &str) {
    let host = unique(&format!("rw-{backend}-{naming:?}").to_lowercase());
    let run = thermal_run(&host);
    let mut cfg = RemoteWriteConfig::new(write_url);
    cfg.naming = naming;
    cfg.retry_initial = Duration::from_millis(50);
    cfg.retry_max = Duration::from_millis(500);
    let mut sink = RemoteWriteSink::from_config(&cfg).unwrap();
    for s in &run.snapshots {
        sink.export(s.clone()).await.unwrap();
    }
    sink.flush().await.unwrap();
    let stats = sink.stats();
    assert_eq!((stats.samples_rejected, stats.samples_dropped), (0, 0), "{stats:?}");

    let host_label = if naming == Naming::Dcgm { "Hostname" } else { "host" };
    let selector = format!("{PROM_NAME}{{{host_label}={host:?}}}");
    let gpus = run.snapshots[0].devices.len();
    let mut got = BTreeMap::new();
    for _ in 0..50 {
        got = raw_samples(read_url, &selector).await;
        if got.len() == gpus && got.values().all(|v| v.len() == TICKS) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let what = format!("[{backend}, {naming:?}]");
    assert_eq!(got.len(), gpus, "{what} one series per GPU: {:?}", got.keys().collect::<Vec<_>>());
    for (labels, points) in &got {
        let uuid_label = if naming == Naming::Dcgm { "UUID" } else { "uuid" };
        let uuid = &labels[uuid_label];
        let d = run.snapshots[0].devices.iter().find(|d| &d.info.uuid == uuid).expect("a GPU of the run");
        assert_eq!(labels["gpu"], d.info.index.to_string(), "{what} {labels:?}");
        assert_eq!(labels["backend"], "mock", "{what} simulated data is marked: {labels:?}");
        let want: Vec<(i64, f64)> = run.snapshots.iter().map(|s| (millis(s), expected_headroom(s)[uuid])).collect();
        let ts = |v: &[(i64, f64)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(ts(points), ts(&want), "{what} {uuid}: a sample per tick, at its time");
        for ((_, g), (t, w)) in points.iter().zip(&want) {
            assert!(close(*g, *w), "{what} {uuid} at {t}: {g} != {w}");
        }
    }
    // The crossing tick's GPU 0 by itself, as a dashboard would ask.
    let at = &run.snapshots[run.crossing];
    let gpu0 = &at.devices[0];
    let one = &got.iter().find(|(l, _)| l["gpu"] == "0").unwrap().1;
    let v = one.iter().find(|p| p.0 == millis(at)).unwrap().1;
    assert!(close(v, LIMIT - gpu0.temperature.gpu.unwrap()), "{what} {v}");
    eprintln!("{what}: {} series of {TICKS} samples", got.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs VictoriaMetrics: scripts/test.sh starts it"]
async fn remote_write_to_victoria_metrics_carries_the_stages_series() {
    let vm = require_env("GPUMON_TEST_VM_URL");
    for naming in [Naming::Native, Naming::Dcgm] {
        remote_write_round_trip(&format!("{vm}/api/v1/write"), &vm, naming, "victoria-metrics").await;
    }
}

/// A private Prometheus instance (`start-prometheus.sh`), stopped when the test ends.
struct PrivateProm {
    dir: String,
    instance: String,
    url: String,
}

impl PrivateProm {
    fn start(test: &str, scrape_target: Option<std::net::SocketAddr>) -> Self {
        let dir = require_env("GPUMON_TEST_BACKENDS_DIR");
        let instance = unique(test);
        let port = free_port();
        let mut cmd = Command::new(format!("{dir}/start-prometheus.sh"));
        cmd.env("BACKEND_INSTANCE", &instance).env("PROM_PORT", port.to_string());
        if let Some(t) = scrape_target {
            cmd.env("PROM_SCRAPE_TARGETS", t.to_string()).env("PROM_JOB_NAME", "custom-stage");
        }
        let status = cmd.status().expect("run start-prometheus.sh");
        assert!(status.success(), "start-prometheus.sh failed");
        PrivateProm { dir, instance, url: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for PrivateProm {
    fn drop(&mut self) {
        let _ =
            Command::new(format!("{}/stop-prometheus.sh", self.dir)).env("BACKEND_INSTANCE", &self.instance).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Prometheus: scripts/test.sh provides start-prometheus.sh"]
async fn remote_write_to_prometheus_carries_the_stages_series() {
    let prom = PrivateProm::start("rw-prom", None);
    remote_write_round_trip(&format!("{}/api/v1/write", prom.url), &prom.url, Naming::Native, "prometheus").await;
}

// ------------------------------------------------------------------------------------ scrape

async fn prom_api(url: &str, path: &str, params: &[(&str, &str)]) -> Json {
    let u = reqwest::Url::parse_with_params(&format!("{url}{path}"), params).unwrap();
    let j: Json = serde_json::from_str(&client().get(u).send().await.unwrap().text().await.unwrap()).unwrap();
    assert_eq!(j["status"], "success", "{path} {params:?}: {j}");
    j["data"].clone()
}

/// A real Prometheus scrapes a scrape endpoint that holds the crossing tick:
/// `gpumon_thermal_headroom_celsius{gpu="0"}` (and every GPU's) is `limit − temperature`, its
/// metadata (TYPE gauge, HELP) is what the descriptor says, and `promtool check metrics` finds
/// nothing wrong with the stage's family.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Prometheus and promtool: scripts/test.sh provides them"]
async fn prometheus_scrapes_the_stages_series() {
    let promtool = require_env("GPUMON_TEST_PROMTOOL");
    let run = thermal_run(&unique("scrape"));
    let at = run.snapshots[run.crossing].clone();
    let mut config = PrometheusConfig::default();
    config.listen = Some("127.0.0.1:0".parse().unwrap());
    let mut sink = PrometheusSink::from_config(&config).unwrap();
    let addr = sink.local_addr().unwrap();
    let handle = sink.handle();
    sink.export(at.clone()).await.unwrap();

    // The exposition itself: HELP and TYPE of the stage's family, and promtool's lint.
    let text = handle.render(Format::Text);
    assert!(text.contains(&format!("# HELP {PROM_NAME} {}\n", stage::HEADROOM.help)), "{text}");
    assert!(text.contains(&format!("# TYPE {PROM_NAME} gauge\n")), "{text}");
    let (passed, report) = promtool_check_metrics(&promtool, &text);
    assert!(passed && report.trim().is_empty(), "promtool check metrics:\n{report}");

    let prom = PrivateProm::start("scrape", Some(addr));
    // The first scrape comes 5-6 s after Prometheus is ready.
    let q = format!("{PROM_NAME}{{job=\"custom-stage\"}}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let result = loop {
        let data = prom_api(&prom.url, "/api/v1/query", &[("query", &q)]).await;
        let result = data["result"].as_array().unwrap().clone();
        if result.len() == at.devices.len() {
            break result;
        }
        assert!(tokio::time::Instant::now() < deadline, "{q} not scraped after 20 s: {data}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let want = expected_headroom(&at);
    for r in &result {
        let m = &r["metric"];
        let uuid = m["uuid"].as_str().unwrap();
        let d = at.devices.iter().find(|d| d.info.uuid == uuid).unwrap();
        assert_eq!(m["gpu"], d.info.index.to_string().as_str(), "{r}");
        assert_eq!(m["backend"], "mock", "{r}");
        let v: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
        assert_eq!(v, want[uuid], "{r}");
    }
    // GPU 0 by itself.
    let data = prom_api(&prom.url, "/api/v1/query", &[("query", &format!("{PROM_NAME}{{gpu=\"0\"}}"))]).await;
    let result = data["result"].as_array().unwrap();
    assert_eq!(result.len(), 1, "{data}");
    let v: f64 = result[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(v, LIMIT - at.devices[0].temperature.gpu.unwrap());
    // What Prometheus took from HELP and TYPE.
    let meta = prom_api(&prom.url, "/api/v1/metadata", &[("metric", PROM_NAME)]).await;
    let meta = &meta[PROM_NAME][0];
    assert_eq!(meta["type"], "gauge", "{meta}");
    assert_eq!(meta["help"], stage::HEADROOM.help, "{meta}");
    sink.shutdown().await.unwrap();
    eprintln!("Prometheus scraped {} headroom series", want.len());
}

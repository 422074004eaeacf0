//! The OTLP sink against a real OTLP receiver (`scripts/backends/otlp_receiver.py`: the official
//! `opentelemetry-proto` classes over grpcio and HTTP), driven by a real `gpumon_core::Agent`.
//!
//! The tests that need the receiver are `#[ignore]`d; `scripts/test.sh` starts it, sets the
//! `GPUMON_TEST_OTLP_*` variables and runs them (`--include-ignored`).
#![cfg(feature = "otlp")]

mod otlp_support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumon_core::{Agent, DeviceSample, MetricId, MetricKind, MetricSet, Snapshot, Unit, Value};
use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::free_port;
use gpumon_sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use otlp_support::{backends, fleet, received, requests_of_run, reset, run_id, FleetSampler};
use serde_json::Value as Json;

/// The tests share one receiver and reset it: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config(endpoint: &str, protocol: Protocol, run: &str) -> OtlpConfig {
    let mut cfg = OtlpConfig::new(endpoint, protocol);
    cfg.service_name = Some("gpumon-it".into());
    cfg.timeout = Some(Duration::from_secs(5));
    cfg.resource_attributes.insert("gpumon.test.run".into(), run.into());
    cfg
}

fn attr_matches(json: &Json, want: &str) -> bool {
    match json {
        Json::String(s) => s == want,
        Json::Number(n) => n.to_string() == want,
        Json::Bool(b) => b.to_string() == want,
        _ => false,
    }
}

/// Checks that `request` (the data points of one export) carries exactly `snapshot`.
fn assert_request_is_snapshot(request: &[Json], snapshot: &Snapshot, transport: &str) {
    let mut expected_points = 0;
    for device in &snapshot.devices {
        device.visit_points(|p| {
            let d = p.id.descriptor();
            let mut want: Vec<(String, String)> = vec![("hw.id".into(), device.info.uuid.clone())];
            if let Some((k, v)) = d.otel.attribute {
                want.push((k.into(), v.into()));
            }
            if let (Some(label), Some(value)) = (d.label, p.label) {
                let key = match label {
                    "pid" => "process.pid".to_owned(),
                    other => format!("gpumon.{other}"),
                };
                want.push((key, value.to_string()));
            }
            let hits: Vec<&Json> = request
                .iter()
                .filter(|j| j["name"] == d.otel.name)
                .filter(|j| want.iter().all(|(k, v)| attr_matches(&j["attributes"][k.as_str()], v)))
                .collect();
            assert_eq!(hits.len(), 1, "[{transport}] {:?} {want:?}: {hits:?}", p.id);
            let j = hits[0];
            assert_eq!(j["unit"], d.otel_unit(), "[{transport}] unit of {}", d.otel.name);
            assert!(!j["description"].as_str().unwrap_or("").is_empty());
            let (kind, monotonic) = match (d.otel.up_down, d.kind) {
                (true, _) => ("sum", Some(false)),
                (false, MetricKind::Counter) => ("sum", Some(true)),
                _ => ("gauge", None),
            };
            assert_eq!(j["type"], kind, "[{transport}] type of {}", d.otel.name);
            if let Some(m) = monotonic {
                assert_eq!(j["is_monotonic"], m, "[{transport}] {}", d.otel.name);
                assert_eq!(j["aggregation_temporality"], "cumulative", "[{transport}] {}", d.otel.name);
            }
            let integral = matches!(d.unit, Unit::Count | Unit::Bytes);
            assert_eq!(j["value_type"], if integral { "int" } else { "double" }, "[{transport}] {}", d.otel.name);
            match p.value {
                Value::Int(v) => assert_eq!(j["value"].as_u64(), Some(v), "[{transport}] {} {want:?}", d.otel.name),
                Value::Float(v) if integral => {
                    assert_eq!(j["value"].as_i64(), Some(v.round() as i64), "[{transport}] {}", d.otel.name)
                }
                // serde_json's default float parser may be off by one ulp.
                Value::Float(v) => {
                    let got = j["value"].as_f64().unwrap();
                    assert!((got - v).abs() <= v.abs() * 1e-15, "[{transport}] {} {want:?}: {got} != {v}", d.otel.name)
                }
            }
            // Every point names its GPU; the GPU attribute set of the semantic conventions comes
            // once per GPU, on its hw.status points (and on no other point).
            let a = &j["attributes"];
            assert_eq!(a["hw.type"], "gpu");
            assert!(a["hw.name"].as_str().is_some_and(|n| n.starts_with("nvidia")));
            if d.otel.name != "hw.status" {
                for once in
                    ["hw.vendor", "hw.model", "hw.driver_version", "gpumon.gpu.index", "hw.serial_number", "hw.parent"]
                {
                    assert!(a.get(once).is_none(), "[{transport}] {once} on {}: {a}", d.otel.name);
                }
            } else {
                assert_eq!(a["hw.vendor"], "nvidia");
                assert_eq!(a["hw.model"], device.info.name.as_str());
                match &snapshot.system.driver_version {
                    Some(v) => assert_eq!(a["hw.driver_version"], v.as_str()),
                    None => assert!(a.get("hw.driver_version").is_none()),
                }
                assert_eq!(a["gpumon.gpu.index"], device.info.index);
                if let Some(serial) = &device.info.serial {
                    assert_eq!(a["hw.serial_number"], serial.as_str());
                }
                match &device.info.mig {
                    Some(mig) => assert_eq!(a["hw.parent"], mig.parent_uuid.as_str()),
                    None => assert!(a.get("hw.parent").is_none()),
                }
            }
            expected_points += 1;
        });
        // hw.status has one series per state.
        let states: BTreeMap<String, i64> = request
            .iter()
            .filter(|j| j["name"] == "hw.status" && j["attributes"]["hw.id"] == device.info.uuid.as_str())
            .map(|j| (j["attributes"]["hw.state"].as_str().unwrap().to_owned(), j["value"].as_i64().unwrap()))
            .collect();
        let up = i64::from(device.is_up());
        assert_eq!(states, BTreeMap::from([("ok".into(), up), ("failed".into(), 1 - up)]), "[{transport}]");
    }
    // Derived series (findings): the device's attributes or none, plus `gpumon.<label>`.
    snapshot.visit_derived(|p| {
        let d = p.descriptor;
        let mut want: Vec<(String, String)> =
            p.label_pairs().map(|(k, v)| (format!("gpumon.{k}"), v.to_owned())).collect();
        if let Some(i) = p.device {
            want.push(("hw.id".into(), snapshot.devices[i].info.uuid.clone()));
        }
        let hits: Vec<&Json> = request
            .iter()
            .filter(|j| j["name"] == d.otel.name)
            .filter(|j| want.iter().all(|(k, v)| attr_matches(&j["attributes"][k.as_str()], v)))
            .filter(|j| p.device.is_some() || j["attributes"].get("hw.id").is_none())
            .collect();
        assert_eq!(hits.len(), 1, "[{transport}] {:?} {want:?}: {hits:?}", p.id());
        let j = hits[0];
        // Int points arrive as ints, float points (step figures) as doubles, each exactly.
        match p.value {
            Value::Int(v) => assert_eq!(j["value"].as_u64(), Some(v), "[{transport}] {:?}", p.id()),
            Value::Float(v) => assert_eq!(j["value"].as_f64(), Some(v), "[{transport}] {:?}", p.id()),
        }
        let (kind, monotonic) = if d.kind == MetricKind::Counter { ("sum", Some(true)) } else { ("gauge", None) };
        assert_eq!(j["type"], kind, "[{transport}] type of {}", d.otel.name);
        if let Some(m) = monotonic {
            assert_eq!(j["is_monotonic"], m);
            assert_eq!(j["aggregation_temporality"], "cumulative");
        }
        expected_points += 1;
    });
    assert_eq!(request.len(), expected_points + snapshot.devices.len(), "[{transport}] data points in the request");
    for j in request {
        assert_eq!(j["transport"], transport);
        assert_eq!(j["resource"]["service.name"], "gpumon-it");
        assert_eq!(j["resource"]["host.name"], gpumon_core::hostname().as_str());
        assert_eq!(j["scope"]["name"], "gpumon");
        assert_eq!(j["scope"]["version"], env!("CARGO_PKG_VERSION"));
    }
}

/// Whether `request` is the export of `snapshot`: every GPU's energy counter and memory usage
/// (values that change from tick to tick) match.
fn is_export_of(request: &[Json], snapshot: &Snapshot) -> bool {
    let close = |j: &Json, v: f64| j.as_f64().is_some_and(|x| (x - v).abs() <= v.abs() * 1e-12);
    snapshot.devices.iter().all(|d| {
        let find = |name: &str| {
            request
                .iter()
                .find(|j| j["name"] == name && j["attributes"]["hw.id"] == d.info.uuid.as_str())
                .map(|j| &j["value"])
        };
        d.power.energy_joules.is_none_or(|e| find("hw.energy").is_some_and(|j| close(j, e)))
            && d.memory.used.is_none_or(|m| find("hw.gpu.memory.usage").is_some_and(|j| j.as_u64() == Some(m)))
    })
}

/// Semantic-convention checks written out by hand (not derived from the catalogue).
fn assert_semantic_conventions(request: &[Json]) {
    let one = |name: &str, attr: (&str, &str)| -> &Json {
        let gpu0 = otlp_support::full_gpu(0, 0).info.uuid.clone();
        request
            .iter()
            .find(|j| {
                j["name"] == name
                    && j["attributes"]["hw.id"] == gpu0.as_str()
                    && attr_matches(&j["attributes"][attr.0], attr.1)
            })
            .unwrap_or_else(|| panic!("no {name} {attr:?} for GPU 0"))
    };
    for task in ["general", "encoder", "decoder"] {
        let j = one("hw.gpu.utilization", ("hw.gpu.task", task));
        assert_eq!(
            (j["type"].as_str(), j["unit"].as_str(), j["value_type"].as_str()),
            (Some("gauge"), Some("1"), Some("double"))
        );
    }
    for name in ["hw.gpu.memory.usage", "hw.gpu.memory.limit"] {
        let j = one(name, ("hw.type", "gpu"));
        assert_eq!(
            (j["type"].as_str(), j["is_monotonic"].as_bool(), j["unit"].as_str()),
            (Some("sum"), Some(false), Some("By"))
        );
        assert_eq!(j["value_type"], "int");
    }
    assert_eq!(one("hw.gpu.memory.limit", ("hw.type", "gpu"))["value"], 85_520_809_984u64);
    assert_eq!(one("hw.gpu.memory.utilization", ("hw.type", "gpu"))["unit"], "1");
    let power = one("hw.power", ("hw.type", "gpu"));
    assert_eq!((power["type"].as_str(), power["unit"].as_str()), (Some("gauge"), Some("W")));
    let energy = one("hw.energy", ("hw.type", "gpu"));
    assert_eq!(
        (energy["type"].as_str(), energy["unit"].as_str(), energy["is_monotonic"].as_bool()),
        (Some("sum"), Some("J"), Some(true))
    );
    assert_eq!(energy["aggregation_temporality"], "cumulative");
    for loc in ["gpu", "memory"] {
        assert_eq!(one("hw.temperature", ("hw.sensor_location", loc))["unit"], "Cel");
    }
    for t in ["corrected", "uncorrected"] {
        let j = one("hw.errors", ("error.type", t));
        assert_eq!((j["type"].as_str(), j["is_monotonic"].as_bool()), (Some("sum"), Some(true)));
    }
    let status = one("hw.status", ("hw.state", "ok"));
    assert_eq!(
        (status["type"].as_str(), status["is_monotonic"].as_bool(), status["value"].as_i64()),
        (Some("sum"), Some(false), Some(1))
    );
    assert_eq!(one("gpumon.gpu.xid.errors", ("gpumon.xid", "79"))["type"], "sum");
    assert!(one("gpumon.gpu.process.memory.usage", ("process.pid", "1000"))["value"].as_u64().is_some());
    // Attribution: the GPU's owners on its points, a process's own on its points.
    let util = one("hw.gpu.utilization", ("hw.gpu.task", "general"));
    for (k, v) in [("k8s.namespace.name", "team-a"), ("k8s.pod.name", "train-0"), ("k8s.container.name", "trainer")] {
        assert_eq!(util["attributes"][k], v, "{util}");
    }
    assert_eq!(util["attributes"]["user.name"], "root", "{util}");
    let process = one("gpumon.gpu.process.memory.usage", ("process.pid", "1000"));
    assert_eq!(process["attributes"]["user.name"], "root", "{process}");
    assert!(process["attributes"].get("k8s.pod.name").is_none(), "{process}");
    let unknown = one("gpumon.gpu.process.memory.usage", ("process.pid", "1001"));
    assert!(unknown["attributes"].get("user.name").is_none(), "{unknown}");
    assert_eq!(one("gpumon.gpu.clock_event.active", ("gpumon.reason", "sw_power_cap"))["value"], 1);
}

/// A real agent exports to the receiver; every snapshot it published arrives intact. The sampler
/// is the hand-built fleet (every family, a MIG instance, a lost GPU) or the mock `h100x8`.
/// Both pipelines, one after the other.
async fn end_to_end(protocol: Protocol, transport: &str, with_fleet: bool) {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        end_to_end_with(protocol, transport, with_fleet, pipeline).await;
    }
}

async fn end_to_end_with(protocol: Protocol, transport: &str, with_fleet: bool, pipeline: Pipeline) {
    let b = backends();
    let _serial = SERIAL.lock().await;
    let endpoint = if protocol == Protocol::Grpc { &b.grpc } else { &b.http };
    let run = run_id(transport);
    reset(&b.received).await;

    let mut cfg = config(endpoint, protocol, &run);
    cfg.pipeline = Some(pipeline);
    let sink = OtlpSink::from_config(&cfg).expect("sink");
    assert_eq!(sink.pipeline(), pipeline);
    let builder = if with_fleet {
        Agent::builder(FleetSampler::new(8, true))
    } else {
        Agent::builder(gpumon_mock::MockSampler::from_profile_name("h100x8").expect("mock h100x8"))
    };
    let handle =
        builder.interval(Duration::from_millis(250)).metrics(MetricSet::everything()).sink(sink).spawn().unwrap();
    let mut rx = handle.subscribe();
    let mut snapshots: Vec<Arc<Snapshot>> = Vec::new();
    while snapshots.len() < 3 {
        snapshots.push(tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a snapshot").unwrap());
    }
    handle.flush(Duration::from_secs(10)).await.expect("flush");
    let status = handle.sink_status().into_iter().find(|s| s.name == "otlp").unwrap();
    assert_eq!(status.failures, 0, "{status:?}");
    handle.shutdown(Duration::from_secs(10)).await.expect("shutdown");

    let points = received(&b.received).await;
    let requests = requests_of_run(&points, &run);
    assert!(requests.len() >= snapshots.len(), "{} requests for {} snapshots", requests.len(), snapshots.len());
    let mut max_lag = Duration::ZERO;
    for snapshot in &snapshots {
        let request = requests
            .values()
            .find(|r| is_export_of(r, snapshot))
            .unwrap_or_else(|| panic!("[{transport}, {pipeline:?}] no request carries snapshot {}", snapshot.seq));
        assert_request_is_snapshot(request, snapshot, transport);
        if with_fleet {
            assert_semantic_conventions(request);
        }
        // The direct pipeline stamps every point with the sample's time; the SDK stamps it at
        // collection, right after the snapshot.
        let taken = snapshot.timestamp_nanos();
        for j in request {
            let t = j["time_unix_nano"].as_u64().unwrap();
            assert!(t >= taken, "[{transport}] point stamped before its sample");
            if pipeline == Pipeline::Direct {
                assert_eq!(t, taken, "[{transport}, direct] {}", j["name"]);
            }
            max_lag = max_lag.max(Duration::from_nanos(t - taken));
        }
    }
    let sampler = if with_fleet { "fleet" } else { "mock h100x8" };
    eprintln!(
        "[{transport}, {sampler}, {pipeline:?}] {} requests; data point time - sample time: max {max_lag:?}",
        requests.len()
    );
    assert!(max_lag < Duration::from_secs(2), "{max_lag:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (OTLP receiver)"]
async fn http_end_to_end_with_an_agent() {
    end_to_end(Protocol::HttpProtobuf, "http", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (OTLP receiver)"]
async fn http_end_to_end_with_the_mock_h100x8() {
    end_to_end(Protocol::HttpProtobuf, "http", false).await;
}

#[cfg(feature = "otlp-grpc")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (OTLP receiver)"]
async fn grpc_end_to_end_with_an_agent() {
    end_to_end(Protocol::Grpc, "grpc", true).await;
}

#[cfg(feature = "otlp-grpc")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (OTLP receiver)"]
async fn grpc_end_to_end_with_the_mock_h100x8() {
    end_to_end(Protocol::Grpc, "grpc", false).await;
}

/// `OTEL_*` variables are process-wide, so this test runs its exports in a child process:
/// the test binary itself, filtered to `child_exports_with_environment`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (OTLP receiver)"]
async fn environment_variables_configure_the_sink() {
    let b = backends();
    let _serial = SERIAL.lock().await;
    let run = run_id("env");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(["subprocess_exports_with_environment", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("GPUMON_OTLP_CHILD_RUN", &run)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &b.http)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        .env("OTEL_SERVICE_NAME", "svc-from-env")
        .env("OTEL_RESOURCE_ATTRIBUTES", format!("deployment.environment=ci,gpumon.test.run={run},team=gpu%20infra"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("child exported"), "the child test did not run");

    let points = received(&b.received).await;
    let from_env = requests_of_run(&points, &run);
    assert_eq!(from_env.len(), 1, "{from_env:?}");
    let r = &from_env.values().next().unwrap()[0]["resource"];
    assert_eq!(r["service.name"], "svc-from-env");
    assert_eq!(r["deployment.environment"], "ci");
    assert_eq!(r["team"], "gpu infra");
    assert_eq!(r["host.name"], gpumon_core::hostname().as_str());
    // The same environment, but explicit settings: they win.
    let explicit = requests_of_run(&points, &format!("{run}-explicit"));
    assert_eq!(explicit.len(), 1);
    let r = &explicit.values().next().unwrap()[0]["resource"];
    assert_eq!(r["service.name"], "explicit-wins");
    assert_eq!(r["deployment.environment"], "ci");
}

/// Not a test of its own: the child process of `environment_variables_configure_the_sink`, which
/// runs it with `--ignored`. `scripts/test.sh` skips it (`--skip subprocess_`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of environment_variables_configure_the_sink"]
async fn subprocess_exports_with_environment() {
    let run = require_env("GPUMON_OTLP_CHILD_RUN");
    let snapshot = Arc::new(fleet(1, 0, false));
    // Nothing configured: endpoint, protocol, compression and resource come from OTEL_*.
    let mut sink = OtlpSink::from_config(&OtlpConfig::default()).expect("sink from the environment");
    assert!(sink.endpoint().unwrap().0.ends_with("/v1/metrics"), "{:?}", sink.endpoint());
    gpumon_core::Sink::export(&mut sink, snapshot.clone()).await.expect("export");
    gpumon_core::Sink::shutdown(&mut sink).await.expect("shutdown");
    let mut cfg = OtlpConfig::default();
    cfg.service_name = Some("explicit-wins".into());
    cfg.resource_attributes.insert("gpumon.test.run".into(), format!("{run}-explicit"));
    let mut sink = OtlpSink::from_config(&cfg).unwrap();
    gpumon_core::Sink::export(&mut sink, snapshot).await.expect("export");
    gpumon_core::Sink::shutdown(&mut sink).await.expect("shutdown");
    println!("child exported");
}

/// Stops a private receiver instance when the test ends, whatever happens.
struct PrivateReceiver {
    dir: String,
    instance: String,
}

impl PrivateReceiver {
    fn start(dir: &str, instance: &str, grpc: u16, http: u16) -> PrivateReceiver {
        let out = Command::new(format!("{dir}/start-otlp-receiver.sh"))
            .env("BACKEND_INSTANCE", instance)
            .env("OTLP_GRPC_PORT", grpc.to_string())
            .env("OTLP_HTTP_PORT", http.to_string())
            .output()
            .expect("run start-otlp-receiver.sh");
        assert!(out.status.success(), "start-otlp-receiver.sh failed: {}", String::from_utf8_lossy(&out.stderr));
        PrivateReceiver { dir: dir.to_owned(), instance: instance.to_owned() }
    }
}

impl Drop for PrivateReceiver {
    fn drop(&mut self) {
        let _ = Command::new(format!("{}/stop-otlp-receiver.sh", self.dir))
            .env("BACKEND_INSTANCE", &self.instance)
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (OTLP receiver)"]
async fn receiver_down_at_start_then_up_data_arrives_without_restart() {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        receiver_down_then_up(pipeline).await;
    }
}

async fn receiver_down_then_up(pipeline: Pipeline) {
    let b = backends();
    let (grpc_port, http_port) = (free_port(), free_port());
    let instance = format!("otlp-outage-{}-{}", std::process::id(), pipeline.as_str());
    let run = run_id("outage");

    let mut http = config(&format!("http://127.0.0.1:{http_port}"), Protocol::HttpProtobuf, &run);
    http.pipeline = Some(pipeline);
    let mut sinks = vec![OtlpSink::from_config(&http).unwrap().with_name("otlp-http")];
    if cfg!(feature = "otlp-grpc") {
        let mut grpc = config(&format!("http://127.0.0.1:{grpc_port}"), Protocol::Grpc, &run);
        grpc.pipeline = Some(pipeline);
        sinks.push(OtlpSink::from_config(&grpc).unwrap().with_name("otlp-grpc"));
    }
    let names: Vec<String> = sinks.iter().map(|s| gpumon_core::Sink::name(s).to_owned()).collect();
    let mut builder = Agent::builder(FleetSampler::new(2, false)).interval(Duration::from_millis(200));
    for sink in sinks {
        builder = builder.sink(sink);
    }
    let handle = builder.spawn().unwrap();

    // Down: every OTLP sink reports the failure; sampling goes on.
    let start = Instant::now();
    loop {
        let status = handle.sink_status();
        if status.iter().all(|s| s.failures >= 2 && s.last_error.is_some()) {
            for s in &status {
                eprintln!("while down, {} ({pipeline:?}): {}", s.name, s.last_error.as_deref().unwrap_or(""));
            }
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "sinks never reported the outage: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken = handle.stats().samples_taken;
    assert!(taken >= 2 && handle.stats().last_sample_ok);

    // Up: the same agent's data arrives over every transport.
    let _receiver = PrivateReceiver::start(&b.dir, &instance, grpc_port, http_port);
    let up_at = Instant::now();
    let url = format!("http://127.0.0.1:{http_port}/received");
    let want: Vec<&str> = if names.len() == 2 { vec!["grpc", "http"] } else { vec!["http"] };
    loop {
        let requests = requests_of_run(&received(&url).await, &run);
        let transports: std::collections::BTreeSet<&str> = requests.keys().map(|(t, _)| t.as_str()).collect();
        if want.iter().all(|t| transports.contains(t)) {
            eprintln!("receiver up -> data over {transports:?} after {:?}", up_at.elapsed());
            break;
        }
        assert!(up_at.elapsed() < Duration::from_secs(30), "no data after the receiver came up: {transports:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // … and the status recovers.
    let start = Instant::now();
    while !handle.sink_status().iter().all(|s| s.consecutive_failures == 0 && s.last_success.is_some()) {
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", handle.sink_status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown(Duration::from_secs(10)).await.expect("shutdown");
}

/// Sanity check of the helpers (runs without backends).
#[test]
fn fleet_has_every_metric() {
    let snap = fleet(1, 0, true);
    let mut seen = std::collections::BTreeSet::new();
    snap.devices[0].visit_points(|p| {
        seen.insert(p.id);
    });
    snap.visit_derived(|p| {
        seen.insert(p.id().expect("catalogue series only"));
    });
    // The suspended state is not part of the fleet (it would change the device counts the
    // backend tests check); its one extra series is checked here.
    DeviceSample::suspended(snap.devices[0].info.clone()).visit_points(|p| {
        seen.insert(p.id);
    });
    // Nor is a family that cannot be read (its `metric_failure` series).
    let mut unwatched = snap.devices[0].clone();
    unwatched.record_failure(gpumon_core::Family::Xid, gpumon_core::FailureReason::Other("not monitored".into()));
    unwatched.visit_points(|p| {
        seen.insert(p.id);
    });
    // Nor are the GPU-time accounts (an accounts stage after diagnosis; they would change the
    // series counts too): a tick that raised the fleet's findings, which opens their lost
    // series, then the next one.
    let mut accounts = gpumon_core::accounts::Accounts::new().0;
    let mut raised = snap.clone();
    let mut diagnosis = snap.output::<gpumon_core::Diagnosis>().expect("the fleet has a diagnosis").clone();
    diagnosis.events = diagnosis
        .active
        .iter()
        .map(|f| gpumon_core::FindingEvent::new(gpumon_core::Transition::Raised, f.clone(), None))
        .collect();
    raised.attach(diagnosis);
    gpumon_core::Processor::process(&mut accounts, &mut raised);
    let mut accounted = snap.clone();
    gpumon_core::Processor::process(&mut accounts, &mut accounted);
    accounted.visit_derived(|p| {
        seen.insert(p.id().expect("catalogue series only"));
    });
    let missing: Vec<MetricId> = MetricId::ALL.iter().copied().filter(|id| !seen.contains(id)).collect();
    assert!(missing.is_empty(), "the test fleet lacks {missing:?}");
    let _ = DeviceSample::default();
}

/// CPU time (user + system) of this process, from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based) of the whole line: 11 and 12 after `) `.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ = 100 on Linux
}

fn process_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

/// Whole-process CPU and RSS of an agent sampling 8 GPUs (every family) at 1 Hz, first without
/// a sink, then with the OTLP sink. Manual: `cargo test --release -p gpumon-sinks --features
/// otlp-grpc --test otlp_receiver -- --ignored footprint --nocapture` (with the receiver up;
/// `GPUMON_FOOTPRINT_SECS`, default 30, per phase).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "manual measurement (scripts/test.sh skips it: --skip manual_)"]
async fn manual_footprint_of_an_agent_with_the_otlp_sink_at_1hz() {
    let b = backends();
    let secs: u64 = std::env::var("GPUMON_FOOTPRINT_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    for with_sink in [None, Some(Pipeline::Direct), Some(Pipeline::Sdk)] {
        let mut builder = Agent::builder(FleetSampler::new(8, false))
            .interval(Duration::from_secs(1))
            .metrics(MetricSet::everything());
        if let Some(pipeline) = with_sink {
            let mut cfg = config(&b.http, Protocol::HttpProtobuf, &run_id("footprint"));
            cfg.pipeline = Some(pipeline);
            builder = builder.sink(OtlpSink::from_config(&cfg).unwrap());
        }
        let handle = builder.spawn().unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await; // warm-up
        let (cpu0, wall0) = (process_cpu(), Instant::now());
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (cpu, wall) = (process_cpu() - cpu0, wall0.elapsed());
        let stats = handle.stats();
        handle.shutdown(Duration::from_secs(10)).await.unwrap();
        eprintln!(
            "{}: CPU {:.3}% of one core ({cpu:?} over {wall:?}), RSS {} KiB, samples {}, sink status {:?}",
            match with_sink {
                Some(p) => format!("agent + OTLP/HTTP sink ({} pipeline)", p.as_str()),
                None => "agent, no sink".to_owned(),
            },
            cpu.as_secs_f64() / wall.as_secs_f64() * 100.0,
            process_rss_kib(),
            stats.samples_taken,
            stats.sinks.iter().map(|s| (s.exported, s.failures)).collect::<Vec<_>>(),
        );
    }
}

//! Unit tests of the sink: an in-process exporter for the encoding, closed and black-hole ports
//! for failures and deadlines.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gpumon_core::{DeviceInfo, DeviceSample, MetricId, ProcessSample, Sink, SinkError, Snapshot, SystemInfo, Value};
use gpumon_mock::test_env::HttpStub;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};

use super::*;

/// One exported data point, flattened.
#[derive(Clone, Debug, PartialEq)]
struct Dp {
    name: String,
    unit: String,
    kind: &'static str,
    monotonic: bool,
    temporality: Option<Temporality>,
    attrs: BTreeMap<String, String>,
    value: f64,
    time: SystemTime,
}

#[derive(Clone, Debug, Default)]
struct Capture(Arc<Mutex<Vec<Vec<Dp>>>>);

impl Capture {
    fn batches(&self) -> Vec<Vec<Dp>> {
        self.0.lock().unwrap().clone()
    }
}

fn flatten(rm: &ResourceMetrics) -> Vec<Dp> {
    let mut out = Vec::new();
    for scope in rm.scope_metrics() {
        for m in scope.metrics() {
            let mut push = |kind, monotonic, temporality, attrs: BTreeMap<String, String>, value: f64, time| {
                out.push(Dp {
                    name: m.name().to_owned(),
                    unit: m.unit().to_owned(),
                    kind,
                    monotonic,
                    temporality,
                    attrs,
                    value,
                    time,
                })
            };
            let attrs = |it: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                it.map(|kv| (kv.key.to_string(), kv.value.to_string())).collect::<BTreeMap<_, _>>()
            };
            macro_rules! walk {
                ($data:expr) => {
                    match $data {
                        MetricData::Gauge(g) => {
                            for p in g.data_points() {
                                push("gauge", false, None, attrs(&mut p.attributes()), p.value() as f64, g.time());
                            }
                        }
                        MetricData::Sum(s) => {
                            for p in s.data_points() {
                                push(
                                    "sum",
                                    s.is_monotonic(),
                                    Some(s.temporality()),
                                    attrs(&mut p.attributes()),
                                    p.value() as f64,
                                    s.time(),
                                );
                            }
                        }
                        _ => panic!("unexpected aggregation for {}", m.name()),
                    }
                };
            }
            match m.data() {
                AggregatedMetrics::F64(d) => walk!(d),
                AggregatedMetrics::U64(d) => walk!(d),
                AggregatedMetrics::I64(d) => walk!(d),
            }
        }
    }
    out
}

impl PushMetricExporter for Capture {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        self.0.lock().unwrap().push(flatten(metrics));
        Ok(())
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

fn provider_with_capture(interval: Duration) -> (SdkMeterProvider, Capture) {
    let capture = Capture::default();
    let reader = PeriodicReader::builder(capture.clone()).with_interval(interval).build();
    (SdkMeterProvider::builder().with_reader(reader).build(), capture)
}

fn gpu(index: u32) -> DeviceSample {
    let mut info = DeviceInfo::new(index, format!("GPU-{index:04}"), "NVIDIA H100 80GB HBM3");
    info.serial = Some(format!("SN{index}"));
    let mut s = DeviceSample::new(Arc::new(info));
    s.utilization.gpu = Some(0.25 + f64::from(index) / 100.0);
    s.utilization.encoder = Some(0.0);
    s.memory.used = Some(10 << 30);
    s.memory.total = Some(80 << 30);
    s.temperature.gpu = Some(55.0);
    s.power.usage_watts = Some(350.5);
    s.power.energy_joules = Some(1.5e6);
    s.ecc.corrected = Some(7);
    let mut proc = ProcessSample::new(4242);
    proc.memory_used = Some(1 << 30);
    s.processes.push(proc);
    s
}

fn snapshot(devices: Vec<DeviceSample>) -> Arc<Snapshot> {
    let mut system = SystemInfo::new("node-1", "test");
    system.driver_version = Some("570.86.15".into());
    Arc::new(Snapshot::new(Arc::new(system), devices))
}

fn find<'a>(dps: &'a [Dp], name: &str, attr: (&str, &str)) -> Vec<&'a Dp> {
    dps.iter().filter(|d| d.name == name && d.attrs.get(attr.0).map(String::as_str) == Some(attr.1)).collect()
}

#[tokio::test]
async fn each_snapshot_is_exported_once_with_catalogue_names_kinds_and_values() {
    let (provider, capture) = provider_with_capture(DRIVEN_READER_INTERVAL);
    let mut sink = OtlpSink::with_meter_provider(provider.clone());
    let snap = snapshot(vec![gpu(0), gpu(1)]);
    sink.export(snap.clone()).await.unwrap();
    let batches = capture.batches();
    assert_eq!(batches.len(), 1, "one export per snapshot");
    let dps = &batches[0];

    // Every point of the snapshot is there, with the catalogue's name, unit and value.
    let mut expected = 0;
    for device in &snap.devices {
        device.visit_points(|p| {
            let d = p.id.descriptor();
            let matches: Vec<_> = find(dps, d.otel.name, ("hw.id", &device.info.uuid))
                .into_iter()
                .filter(|dp| d.otel.attribute.is_none_or(|(k, v)| dp.attrs.get(k).map(String::as_str) == Some(v)))
                .filter(|dp| match (d.label, p.label) {
                    (Some(l), Some(v)) => dp.attrs.get(&*encode::label_key(l)) == Some(&v.to_string()),
                    _ => true,
                })
                .collect();
            assert_eq!(matches.len(), 1, "{:?} on {}: {matches:?}", p.id, device.info.uuid);
            let dp = matches[0];
            assert_eq!(dp.unit, d.otel_unit(), "{}", dp.name);
            let want = match p.value {
                Value::Int(i) => i as f64,
                Value::Float(f) => f,
            };
            assert!((dp.value - want).abs() <= want.abs() * 1e-12, "{}: {} != {want}", dp.name, dp.value);
            expected += 1;
        });
    }
    // … plus hw.status{hw.state=failed} per device, and nothing else.
    assert_eq!(dps.len(), expected + snap.devices.len());

    let energy = find(dps, "hw.energy", ("hw.id", "GPU-0000"));
    assert_eq!(
        (energy[0].kind, energy[0].monotonic, energy[0].temporality),
        ("sum", true, Some(Temporality::Cumulative))
    );
    let mem = find(dps, "hw.gpu.memory.usage", ("hw.id", "GPU-0000"));
    assert_eq!((mem[0].kind, mem[0].monotonic), ("sum", false));
    let errors = find(dps, "hw.errors", ("error.type", "corrected"));
    assert_eq!((errors[0].kind, errors[0].monotonic, errors[0].value), ("sum", true, 7.0));
    let util = find(dps, "hw.gpu.utilization", ("hw.gpu.task", "general"));
    assert_eq!(util.len(), 2);
    assert_eq!(util[0].kind, "gauge");
    let procs = find(dps, "gpumon.gpu.process.memory.usage", ("process.pid", "4242"));
    assert_eq!(procs.len(), 2);
    let status_failed = find(dps, "hw.status", ("hw.state", "failed"));
    assert!(status_failed.iter().all(|d| d.value == 0.0));
    for d in dps {
        assert_eq!(d.attrs.get("hw.type").map(String::as_str), Some("gpu"), "{}", d.name);
        // The device's whole identity once, on its hw.status points; the others name it by hw.id.
        let once = if d.name == "hw.status" { Some("570.86.15") } else { None };
        assert_eq!(d.attrs.get("hw.driver_version").map(String::as_str), once, "{}", d.name);
    }

    // The data point time is the collection time: right after the snapshot.
    let lag = util[0].time.duration_since(snap.taken_at).unwrap();
    assert!(lag < Duration::from_secs(2), "{lag:?}");

    sink.shutdown().await.unwrap();
    provider.shutdown().unwrap();
}

/// The SDK pipeline exports findings the same way as the direct one.
#[tokio::test]
async fn sdk_pipeline_exports_findings() {
    use gpumon_core::{Diagnosis, Finding, FindingCount, FindingKind, Severity};
    let (provider, capture) = provider_with_capture(DRIVEN_READER_INTERVAL);
    let mut sink = OtlpSink::with_meter_provider(provider.clone());
    let mut snap = (*snapshot(vec![gpu(0), gpu(1)])).clone();
    let mut d = Diagnosis::default();
    d.active = Arc::from(vec![
        Finding::new(
            FindingKind::DataloaderStarvation,
            Severity::Warning,
            Some((1, "GPU-0001")),
            SystemTime::UNIX_EPOCH,
            "e",
            "a",
        ),
        Finding::new(FindingKind::Imbalance, Severity::Info, None, SystemTime::UNIX_EPOCH, "e", "a"),
    ]);
    d.raised_total = Arc::from(vec![FindingCount::new(FindingKind::DataloaderStarvation, 3)]);
    snap.attach(d);
    sink.export(Arc::new(snap)).await.unwrap();
    let dps = &capture.batches()[0];
    let active = find(dps, "gpumon.finding.active", ("gpumon.kind", "dataloader_starvation"));
    assert_eq!(active.len(), 1);
    assert_eq!((active[0].kind, active[0].value), ("gauge", 1.0));
    assert_eq!(active[0].attrs["hw.id"], "GPU-0001");
    assert_eq!(active[0].attrs["gpumon.severity"], "warning");
    let host = find(dps, "gpumon.finding.active", ("gpumon.kind", "imbalance"));
    assert_eq!(host[0].attrs.keys().map(String::as_str).collect::<Vec<_>>(), ["gpumon.kind", "gpumon.severity"]);
    let raised = find(dps, "gpumon.findings.raised", ("gpumon.kind", "dataloader_starvation"));
    assert_eq!(
        (raised[0].kind, raised[0].monotonic, raised[0].temporality, raised[0].value),
        ("sum", true, Some(Temporality::Cumulative), 3.0)
    );
    sink.shutdown().await.unwrap();
    provider.shutdown().unwrap();
}

#[tokio::test]
async fn series_that_vanish_are_no_longer_reported() {
    let (provider, capture) = provider_with_capture(DRIVEN_READER_INTERVAL);
    let mut sink = OtlpSink::with_meter_provider(provider.clone());
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    let mut next = gpu(0);
    next.processes.clear();
    sink.export(snapshot(vec![next, DeviceSample::lost(Arc::new(DeviceInfo::new(1, "GPU-0001", "X")))])).await.unwrap();
    let batches = capture.batches();
    assert_eq!(batches.len(), 2);
    assert_eq!(find(&batches[0], "gpumon.gpu.process.memory.usage", ("process.pid", "4242")).len(), 1);
    assert!(find(&batches[1], "gpumon.gpu.process.memory.usage", ("process.pid", "4242")).is_empty());
    // The lost GPU reports only hw.status: failed = 1, ok = 0.
    let lost: Vec<_> =
        batches[1].iter().filter(|d| d.attrs.get("hw.id").map(String::as_str) == Some("GPU-0001")).collect();
    assert_eq!(lost.len(), 2, "{lost:?}");
    assert!(lost.iter().all(|d| d.name == "hw.status"));
    let failed = lost.iter().find(|d| d.attrs["hw.state"] == "failed").unwrap();
    assert_eq!(failed.value, 1.0);
    sink.shutdown().await.unwrap();
    provider.shutdown().unwrap();
}

#[tokio::test]
async fn from_meter_only_records_and_the_owner_exports() {
    let (provider, capture) = provider_with_capture(DRIVEN_READER_INTERVAL);
    let mut sink = OtlpSink::from_meter(opentelemetry::metrics::MeterProvider::meter(&provider, "embedder"));
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    sink.flush().await.unwrap();
    assert!(capture.batches().is_empty(), "the sink must not export an embedder's meter");
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.force_flush()).await.unwrap().unwrap();
    let batches = capture.batches();
    assert_eq!(batches.len(), 1);
    assert!(!find(&batches[0], "hw.power", ("hw.id", "GPU-0000")).is_empty());
    // After the sink shuts down, the embedder's exports no longer carry stale GPU values.
    sink.shutdown().await.unwrap();
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.force_flush()).await.unwrap().unwrap();
    assert!(capture.batches().iter().skip(1).all(|b| !b.iter().any(|d| d.name == "hw.power")));
    assert!(matches!(sink.export(snapshot(vec![gpu(0)])).await, Err(SinkError::AlreadyShutdown)));
    provider.shutdown().unwrap();
}

#[tokio::test]
async fn periodic_mode_exports_on_the_sdk_schedule() {
    let (provider, capture) = provider_with_capture(Duration::from_millis(100));
    let mut sink = OtlpSink::with_meter_provider(provider.clone()).flush_on_export(false);
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    let start = Instant::now();
    while capture.batches().is_empty() && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!capture.batches().is_empty());
    sink.shutdown().await.unwrap();
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.shutdown()).await.unwrap().unwrap();
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_collector_is_reported_and_shutdown_respects_its_deadline() {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        unreachable_collector(pipeline).await;
    }
}

async fn unreachable_collector(pipeline: Pipeline) {
    let port = closed_port();
    let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf);
    cfg.pipeline = Some(pipeline);
    let mut sink = OtlpSink::from_config(&cfg).unwrap().shutdown_timeout(Duration::from_secs(1));
    assert_eq!(sink.pipeline(), pipeline);
    assert_eq!(sink.endpoint().unwrap().0, format!("http://127.0.0.1:{port}/v1/metrics"));
    assert!(sink.healthcheck().await.is_err());
    let err = sink.export(snapshot(vec![gpu(0)])).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    let start = Instant::now();
    let _ = sink.shutdown().await;
    assert!(start.elapsed() < Duration::from_millis(1500), "shutdown took {:?}", start.elapsed());
    assert!(matches!(sink.export(snapshot(vec![gpu(0)])).await, Err(SinkError::AlreadyShutdown)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_collector_times_out_and_shutdown_respects_its_deadline() {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        black_hole_collector(pipeline).await;
    }
}

async fn black_hole_collector(pipeline: Pipeline) {
    // Accepts connections (the kernel's backlog does) but never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let cfg = OtlpConfig {
        timeout: Some(Duration::from_secs(30)),
        pipeline: Some(pipeline),
        ..OtlpConfig::new(format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf)
    };
    let mut sink = OtlpSink::from_config(&cfg)
        .unwrap()
        .export_timeout(Duration::from_millis(300))
        .shutdown_timeout(Duration::from_millis(700));
    let start = Instant::now();
    assert!(matches!(sink.export(snapshot(vec![gpu(0)])).await, Err(SinkError::Timeout(_))));
    assert!(start.elapsed() < Duration::from_secs(1));
    let err = sink.export(snapshot(vec![gpu(0)])).await.unwrap_err();
    match pipeline {
        // The hung SDK export is still in flight: the next snapshot only updates values.
        Pipeline::Sdk => assert!(err.to_string().contains("still in progress"), "{err}"),
        // The direct pipeline dropped the hung request; the next one times out as well.
        _ => assert!(matches!(err, SinkError::Timeout(_)), "{err}"),
    }
    let start = Instant::now();
    let _ = sink.shutdown().await;
    assert!(start.elapsed() < Duration::from_millis(1000), "shutdown took {:?}", start.elapsed());
    drop(hole);
}

#[tokio::test]
async fn grpc_without_the_feature_names_it() {
    let cfg = OtlpConfig::new("http://127.0.0.1:4317", Protocol::Grpc);
    let result = OtlpSink::from_config(&cfg);
    if cfg!(feature = "otlp-grpc") {
        let sink = result.unwrap();
        assert_eq!(sink.endpoint(), Some(("http://127.0.0.1:4317", Protocol::Grpc)));
    } else {
        let e = result.unwrap_err().to_string();
        assert!(e.contains("otlp-grpc"), "{e}");
    }
}

#[test]
fn grpc_outside_a_runtime_is_a_clear_error() {
    if cfg!(feature = "otlp-grpc") {
        let e = OtlpSink::from_config(&OtlpConfig::new("http://127.0.0.1:4317", Protocol::Grpc)).unwrap_err();
        assert!(e.to_string().contains("tokio runtime"), "{e}");
    }
}

/// A `-bin` key is gRPC binary metadata: tonic panics when it is inserted as ASCII metadata, so
/// both pipelines refuse it when the sink is built, naming the header and where it came from.
#[cfg(feature = "otlp-grpc")]
#[tokio::test]
async fn grpc_binary_metadata_header_is_a_config_error_not_a_panic() {
    for pipeline in [Pipeline::Direct, Pipeline::Sdk] {
        let mut cfg = OtlpConfig::new("http://127.0.0.1:4317", Protocol::Grpc);
        cfg.pipeline = Some(pipeline);
        cfg.headers.insert("X-Token-Bin".into(), "AAEC".into());
        let e = OtlpSink::from_config(&cfg).expect_err("a -bin header must be refused").to_string();
        assert!(e.contains("otlp.headers") && e.contains("`x-token-bin`") && e.contains("-bin"), "{pipeline:?}: {e}");
        // The same header over HTTP is an ordinary header.
        let mut http = cfg.clone();
        http.protocol = Some(Protocol::HttpProtobuf);
        http.endpoint = Some("http://127.0.0.1:4318".into());
        OtlpSink::from_config(&http).unwrap_or_else(|e| panic!("{pipeline:?} over HTTP: {e}"));
    }
}

#[test]
fn metric_ids_all_map_to_an_instrument() {
    let plan = encode::Plan::new();
    let total: usize = plan.instruments.iter().map(|i| i.members.len()).sum();
    assert_eq!(total, MetricId::ALL.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_pipeline_exports_each_snapshot_and_holds_within_an_export_interval() {
    let server = HttpStub::recording();
    let port = server.addr().port();
    let cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf);
    let mut sink = OtlpSink::from_config(&cfg).unwrap();
    assert_eq!(sink.pipeline(), Pipeline::Direct);
    assert!(sink.meter_provider().is_none());
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    sink.export(snapshot(vec![gpu(0), gpu(1)])).await.unwrap();
    assert!(sink.points() > 0);
    sink.flush().await.unwrap();
    sink.shutdown().await.unwrap();
    assert_eq!(server.count(), 2);

    let server = HttpStub::recording();
    let port = server.addr().port();
    let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf);
    cfg.export_interval = Some(Duration::from_secs(3600));
    let mut sink = OtlpSink::from_config(&cfg).unwrap();
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    sink.export(snapshot(vec![gpu(0)])).await.unwrap();
    assert_eq!(server.count(), 1, "held within the interval");
    sink.flush().await.unwrap();
    assert_eq!(server.count(), 2, "flush sends the held snapshot");
    sink.flush().await.unwrap();
    sink.shutdown().await.unwrap();
    assert_eq!(server.count(), 2, "nothing left to send");
}

/// The direct pipeline lends its encoding buffer to the HTTP client as the request body and takes
/// it back after the response (no copy of the ~450 KB an 8-GPU request weighs): every request
/// must still carry exactly its own snapshot, one after another, plain and gzip.
#[tokio::test]
async fn consecutive_direct_requests_each_carry_their_own_snapshot() {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value;
    use opentelemetry_proto::tonic::metrics::v1::metric;
    use prost::Message as _;
    use std::io::Read as _;

    for compression in [Compression::None, Compression::Gzip] {
        let server = HttpStub::recording();
        let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{}", server.addr().port()), Protocol::HttpProtobuf);
        cfg.compression = Some(compression);
        let mut sink = OtlpSink::from_config(&cfg).unwrap();
        for n in [1u32, 3, 2, 2] {
            sink.export(snapshot((0..n).map(gpu).collect())).await.unwrap();
        }
        let gpus_per_request: Vec<usize> = server
            .requests()
            .iter()
            .map(|r| {
                let body = match compression {
                    Compression::Gzip => {
                        assert_eq!(r.header("content-encoding"), Some("gzip"));
                        let mut plain = Vec::new();
                        flate2::read::GzDecoder::new(r.body.as_slice()).read_to_end(&mut plain).unwrap();
                        plain
                    }
                    _ => r.body.clone(),
                };
                let request = ExportMetricsServiceRequest::decode(body.as_slice()).expect("a whole request");
                let mut ids = std::collections::BTreeSet::new();
                for m in request.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
                    let points = match &m.data {
                        Some(metric::Data::Gauge(g)) => &g.data_points,
                        Some(metric::Data::Sum(s)) => &s.data_points,
                        _ => continue,
                    };
                    for kv in points.iter().flat_map(|p| &p.attributes).filter(|kv| kv.key == "hw.id") {
                        if let Some(any_value::Value::StringValue(v)) = kv.value.as_ref().and_then(|v| v.value.as_ref())
                        {
                            ids.insert(v.clone());
                        }
                    }
                }
                ids.len()
            })
            .collect();
        assert_eq!(gpus_per_request, [1, 3, 2, 2], "{compression:?}");
        sink.shutdown().await.unwrap();
    }
}

/// The direct pipeline's OTLP/HTTP answers go through the shared HTTP client: the one retry
/// table decides transient or permanent, the sink does not retry by itself (the next export is
/// the next try), and the error carries the status and the collector's message.
#[tokio::test]
async fn direct_http_answers_are_classified_by_the_shared_retry_table() {
    use gpumon_mock::test_env::HttpReply;
    for (status, retryable) in [(503, true), (429, true), (408, true), (401, false), (404, false), (400, false)] {
        let server = HttpStub::start(move |_| HttpReply::with(status, &[], "collector says no"));
        let cfg = OtlpConfig::new(format!("http://127.0.0.1:{}", server.addr().port()), Protocol::HttpProtobuf);
        let mut sink = OtlpSink::from_config(&cfg).unwrap();
        let err = sink.export(snapshot(vec![gpu(0)])).await.unwrap_err();
        assert_eq!(err.is_retryable(), retryable, "{status}: {err}");
        let text = err.to_string();
        assert!(text.contains(&format!("HTTP {status}")) && text.contains(": collector says no"), "{text}");
        assert!(text.contains(&format!("127.0.0.1:{}", server.addr().port())), "{text}");
        let head = &server.requests()[0];
        assert!(head.header("user-agent").is_some_and(|ua| ua.starts_with("gpumon/")), "{head:?}");
        assert_eq!(server.count(), 1, "{status}: not retried by the sink itself");
    }
}

//! A stage of the embedder's own (`examples/custom_stage/stage.rs`: a thermal-headroom series
//! and a `thermal` event) is exported by every sink, though no sink knows it: stdout (human and
//! JSON), the Prometheus text and OpenMetrics expositions, remote write, InfluxDB line protocol
//! and OTLP. These tests check each encoder's output in process; `custom_stage_backends.rs`
//! sends the same data to the real servers. The last test guards the other half of the claim:
//! no production file of gpumon-sinks names a stage.
#![cfg(all(
    feature = "stdout",
    feature = "prometheus",
    feature = "influxdb",
    feature = "otlp",
    feature = "remote-write"
))]

#[path = "../../examples/custom_stage/stage.rs"]
mod stage;

use std::sync::Arc;

use gpumon_core::{DeviceFilter, MetricSet, Processor, SampleRequest, Sampler, Snapshot};
use gpumon_mock::{MockSampler, Scenario};
use gpumon_sinks::influxdb::LineProtocolEncoder;
use gpumon_sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use gpumon_sinks::prometheus::{Format, PrometheusSink};
use gpumon_sinks::remote_write::encode::{Encoder, WriteRequest};
use gpumon_sinks::remote_write::RemoteWriteConfig;
use gpumon_sinks::stdout::{format_snapshot, StdoutFormat};
use prost::Message as _;

const LIMIT: f64 = 85.0;

/// The mock's `thermal-throttling` ticks through the stage, until the tick at which a GPU
/// crosses the limit: `(that tick, the tick before)`.
fn crossing() -> (Arc<Snapshot>, Arc<Snapshot>) {
    let sampler = MockSampler::builder().scenario(Scenario::builtin("thermal-throttling").unwrap()).build().unwrap();
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    let mut stage = stage::ThermalHeadroom::new(LIMIT);
    let mut before = None;
    for _ in 0..120 {
        let mut s = sampler.sample(&request).unwrap();
        stage.process(&mut s);
        let s = Arc::new(s);
        if s.output::<stage::Headroom>().is_some_and(|h| !h.crossings.is_empty()) {
            return (s, before.expect("no crossing at the first tick"));
        }
        before = Some(s);
    }
    panic!("no GPU crossed {LIMIT} °C in 120 ticks");
}

/// GPU 0's temperature in `s`, and its headroom.
fn gpu0(s: &Snapshot) -> (String, f64) {
    let d = &s.devices[0];
    (d.info.uuid.clone(), LIMIT - d.temperature.gpu.unwrap())
}

#[test]
fn stdout_prints_the_event_and_writes_the_output_in_json() {
    let (hot, quiet) = crossing();
    let mut out = String::new();
    format_snapshot(&mut out, &hot, StdoutFormat::Human).unwrap();
    let (uuid, _) = gpu0(&hot);
    let t = hot.devices[0].temperature.gpu.unwrap();
    // The mock's data: the line says so after its time.
    let line = format!("] MOCK THERMAL gpu 0 {uuid} hot: {t:.1} °C, limit 85.0 °C");
    assert_eq!(out.lines().filter(|l| l.ends_with(&line)).count(), 1, "{out}");
    out.clear();
    format_snapshot(&mut out, &quiet, StdoutFormat::Human).unwrap();
    assert!(!out.contains("THERMAL"), "no event without a crossing: {out}");

    out.clear();
    format_snapshot(&mut out, &hot, StdoutFormat::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let h = &v["thermal_headroom"];
    assert_eq!(h["limit_c"], LIMIT);
    assert_eq!(h["gpus"].as_array().unwrap().len(), hot.devices.len());
    assert_eq!(h["gpus"][0]["headroom_c"].as_f64(), Some(gpu0(&hot).1));
    assert_eq!(h["crossings"][0]["hot"], true);
    // Read back, the snapshot keeps gpumon's own outputs; an embedder's is written, not read.
    let back: Snapshot = serde_json::from_str(&out).unwrap();
    assert_eq!(back.devices.len(), hot.devices.len());
    assert!(back.output::<stage::Headroom>().is_none());
}

#[test]
fn prometheus_exposes_the_series_with_its_help_type_and_unit() {
    let (hot, _) = crossing();
    let prom = PrometheusSink::builder().build().unwrap();
    let handle = prom.handle();
    handle.store(hot.clone());
    let (uuid, headroom) = gpu0(&hot);
    for format in [Format::Text, Format::OpenMetrics] {
        let mut out = String::new();
        handle.render_to(&mut out, format);
        assert!(
            out.contains("# HELP gpumon_thermal_headroom_celsius Degrees below the site's temperature limit"),
            "{out}"
        );
        assert!(out.contains("# TYPE gpumon_thermal_headroom_celsius gauge\n"), "{out}");
        if format == Format::OpenMetrics {
            assert!(out.contains("# UNIT gpumon_thermal_headroom_celsius celsius\n"), "{out}");
        }
        let series: Vec<&str> = out.lines().filter(|l| l.starts_with("gpumon_thermal_headroom_celsius{")).collect();
        assert_eq!(series.len(), hot.devices.len(), "one series per GPU");
        let gpu0 = series.iter().find(|l| l.contains(&format!("uuid=\"{uuid}\""))).expect("GPU 0's series");
        assert!(gpu0.contains("gpu=\"0\"") && gpu0.contains("backend=\"mock\""), "{gpu0}");
        let value: f64 = gpu0.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(value, headroom);
        // One family: every series of it right after its header.
        let header = out.find("# TYPE gpumon_thermal_headroom_celsius").unwrap();
        let first = out.find("\ngpumon_thermal_headroom_celsius{").unwrap();
        assert!(!out[header..first].contains("\ngpumon_up"), "the family is contiguous");
    }
}

#[test]
fn remote_write_carries_the_series() {
    let (hot, _) = crossing();
    let mut encoder = Encoder::from_config(&RemoteWriteConfig::new("http://127.0.0.1:9/api/v1/write"));
    let mut body = Vec::new();
    encoder.encode_snapshot(&hot, &mut body);
    let request = WriteRequest::decode(body.as_slice()).unwrap();
    let series: Vec<_> = request
        .timeseries
        .iter()
        .filter(|ts| ts.label("__name__") == Some("gpumon_thermal_headroom_celsius"))
        .collect();
    assert_eq!(series.len(), hot.devices.len());
    let (uuid, headroom) = gpu0(&hot);
    let gpu0 = series.iter().find(|ts| ts.label("uuid") == Some(uuid.as_str())).unwrap();
    assert_eq!(gpu0.label("gpu"), Some("0"));
    assert_eq!(gpu0.samples[0].value, headroom);
    assert_eq!(gpu0.samples[0].timestamp, gpumon_sinks::remote_write::encode::timestamp_millis(&hot));
}

#[test]
fn influxdb_writes_the_series_and_the_events() {
    let (hot, quiet) = crossing();
    let encoder = LineProtocolEncoder::default();
    let mut out = String::new();
    encoder.encode_snapshot(&hot, &mut out);
    let (uuid, headroom) = gpu0(&hot);
    let mut derived = 0;
    let mut events = 0;
    for line in out.lines() {
        let parsed: Vec<_> = influxdb_line_protocol::parse_lines(line).collect();
        let point = match &parsed[..] {
            [Ok(p)] => p,
            other => panic!("{line}: {other:?}"),
        };
        let tag = |k: &str| {
            point
                .series
                .tag_set
                .as_ref()
                .and_then(|t| t.iter().find(|(key, _)| key.as_str() == k).map(|(_, v)| v.to_string()))
        };
        let field = |k: &str| point.field_set.iter().find(|(key, _)| key.as_str() == k).map(|(_, v)| v.to_string());
        match point.series.measurement.as_str() {
            "gpu_derived" => {
                derived += 1;
                assert_eq!(tag("backend").as_deref(), Some("mock"), "{line}");
                if tag("uuid").as_deref() == Some(uuid.as_str()) {
                    assert_eq!(field("thermal_headroom"), Some(headroom.to_string()), "{line}");
                    assert_eq!(tag("gpu").as_deref(), Some("0"));
                }
            }
            "gpu_thermal" => {
                events += 1;
                assert_eq!(tag("state").as_deref(), Some("hot"), "{line}");
                assert!(tag("uuid").is_some() && tag("gpu").is_some(), "the GPU's tags: {line}");
                assert_eq!(field("limit_celsius"), Some("85".to_owned()), "{line}");
                assert!(field("temperature_celsius").is_some(), "{line}");
            }
            _ => {}
        }
    }
    assert_eq!(derived, hot.devices.len(), "{out}");
    let crossings = hot.output::<stage::Headroom>().unwrap().crossings.len();
    assert_eq!(events, crossings, "{out}");
    out.clear();
    encoder.encode_snapshot(&quiet, &mut out);
    assert!(!out.contains("gpu_thermal"), "no event without a crossing");
}

#[test]
fn otlp_carries_the_series_as_an_instrument_of_its_own() {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value as Number};

    let (hot, quiet) = crossing();
    let mut cfg = OtlpConfig::new("http://127.0.0.1:9", Protocol::HttpProtobuf);
    cfg.pipeline = Some(Pipeline::Direct);
    let mut sink = OtlpSink::from_config(&cfg).unwrap();
    // The series is learnt at the first snapshot that carries it; the one before has none.
    let mut plain = Snapshot::new(quiet.system.clone(), quiet.devices.clone());
    plain.seq = quiet.seq;
    sink.encode_request(&plain).unwrap();
    let bytes = sink.encode_request(&hot).unwrap().to_vec();
    let request = ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap();
    let metrics: Vec<_> =
        request.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics).collect();
    let metric = metrics.iter().find(|m| m.name == "acme.gpu.thermal.headroom").expect("the stage's instrument");
    assert_eq!(metric.unit, "Cel");
    assert_eq!(metric.description, stage::HEADROOM.help);
    let Some(Data::Gauge(gauge)) = &metric.data else { panic!("a gauge: {metric:?}") };
    assert_eq!(gauge.data_points.len(), hot.devices.len());
    let (uuid, headroom) = gpu0(&hot);
    let point = gauge
        .data_points
        .iter()
        .find(|p| {
            p.attributes.iter().any(|kv| {
                kv.key == "hw.id"
                    && kv.value.as_ref().and_then(|v| v.value.as_ref()) == Some(&Any::StringValue(uuid.clone()))
            })
        })
        .expect("GPU 0's point");
    assert_eq!(point.value, Some(Number::AsDouble(headroom)));
    // Still there at the next encode (the learnt instrument stays).
    let again = ExportMetricsServiceRequest::decode(sink.encode_request(&hot).unwrap()).unwrap();
    let n = again
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == "acme.gpu.thermal.headroom")
        .count();
    assert_eq!(n, 1);
}

/// "No stage named anywhere in gpumon-sinks": the production code (test modules and test files
/// aside) names neither gpumon's own stages' types nor their series.
#[test]
fn no_production_file_of_gpumon_sinks_names_a_stage() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let forbidden = [
        "Diagnosis",
        "FindingEvent",
        "FindingKind",
        "Finding::",
        "steps::",
        "StepReport",
        "RunSteps",
        "AttributionSummary",
        "FindingActive",
        "TrainingStep",
        "StepDuration",
        "AttributionFailures",
        "finding_measurement",
        "step_measurement",
    ];
    let mut files = vec![root];
    let mut offenders = Vec::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // Test files and the property-test fixtures build stage data on purpose.
        if !name.ends_with(".rs") || name == "tests.rs" || name == "props.rs" || name.starts_with("test_") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let production = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        for (n, line) in production.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            if let Some(word) = forbidden.iter().find(|w| code.contains(*w)) {
                offenders.push(format!("{}:{}: {word}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "stages named in gpumon-sinks:\n{}", offenders.join("\n"));
}

//! Property tests across every encoder: one hostile snapshot (any strings for host, GPU, UUID,
//! serial, process and finding text; any floats, NaN and infinities included; any integers)
//! through the Prometheus text and OpenMetrics renderings, the InfluxDB line protocol, the OTLP
//! direct pipeline's protobuf request and stdout (human and JSON).
//!
//! Cases are bounded for CI: [`config`] runs 64 unless `PROPTEST_CASES` says otherwise.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use gpumon_core::{
    DeviceInfo, DeviceSample, Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, ProcessSample, Severity,
    Snapshot, SystemInfo, Transition, XidCount,
};
use proptest::prelude::*;

/// The case count for every property test in the crate's unit tests: `PROPTEST_CASES` when set
/// (CI can raise or lower it), otherwise 64 — each case renders a whole snapshot in five
/// formats, so this keeps `cargo test` in seconds on a 2-core runner.
pub(crate) fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

/// Any string, with the characters that break text formats made frequent.
pub(crate) fn hostile() -> impl Strategy<Value = String> {
    let special = prop::sample::select(vec![
        ",", " ", "=", "\"", "\\", "\n", "\r", "\t", "\0", "#", "{", "}", "'", "é", "🚀", "\u{85}", "\u{2028}", "a",
        "0",
    ]);
    prop_oneof![prop::collection::vec(special, 0..12).prop_map(|v| v.concat()), any::<String>(), "[ -~]{0,16}"]
}

/// Any float, with the ones a format can mishandle made frequent.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN, -0.0, 1e-310, -1.5]),
    ]
}

/// The free parts of one device.
#[derive(Clone, Debug)]
struct Dev {
    name: String,
    uuid: String,
    serial: String,
    process: String,
    floats: [f64; 6],
    ints: [u64; 3],
}

fn dev() -> impl Strategy<Value = Dev> {
    (hostile(), hostile(), hostile(), hostile(), prop::array::uniform6(float()), prop::array::uniform3(any::<u64>()))
        .prop_map(|(name, uuid, serial, process, floats, ints)| Dev { name, uuid, serial, process, floats, ints })
}

/// The free parts of one snapshot: host, devices, one finding's texts.
#[derive(Clone, Debug)]
struct Spec {
    host: String,
    devices: Vec<Dev>,
    evidence: String,
    advice: String,
}

fn spec() -> impl Strategy<Value = Spec> {
    (hostile(), prop::collection::vec(dev(), 1..4), hostile(), hostile())
        .prop_map(|(host, devices, evidence, advice)| Spec { host, devices, evidence, advice })
}

/// The snapshot `spec` describes. With `json_safe`, non-finite floats become `None`: JSON has no
/// NaN or infinity, so the stdout JSON sink writes them as `null`, which reads back as absent —
/// the round trip is exact for everything else.
fn build(spec: &Spec, json_safe: bool) -> Snapshot {
    let f = |v: f64| if json_safe && !v.is_finite() { None } else { Some(v) };
    let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let devices: Vec<DeviceSample> = spec
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut info = DeviceInfo::new(i as u32, d.uuid.clone(), d.name.clone());
            info.serial = Some(d.serial.clone());
            let mut s = DeviceSample::new(Arc::new(info));
            s.utilization.gpu = f(d.floats[0]);
            s.temperature.gpu = f(d.floats[1]);
            s.power.usage_watts = f(d.floats[2]);
            s.power.energy_joules = f(d.floats[3]);
            s.clocks.sm = f(d.floats[4]);
            s.memory.used = Some(d.ints[0]);
            s.memory.total = Some(d.ints[1]);
            s.ecc.corrected = Some(d.ints[2]);
            s.xid_errors.push(XidCount::new(d.ints[2], d.ints[0], at));
            let mut p = ProcessSample::new(4242 + i as u32);
            p.name = Some(d.process.clone());
            p.memory_used = Some(d.ints[1]);
            p.sm_utilization = f(d.floats[5]);
            s.processes.push(p);
            s
        })
        .collect();
    let first = &spec.devices[0];
    let finding = Finding::new(
        FindingKind::NearOom,
        Severity::Warning,
        Some((0, first.uuid.as_str())),
        at,
        spec.evidence.clone(),
        spec.advice.clone(),
    );
    let host_finding =
        Finding::new(FindingKind::Imbalance, Severity::Info, None, at, spec.advice.clone(), spec.evidence.clone());
    let mut diagnosis = Diagnosis::default();
    diagnosis.active = vec![finding.clone(), host_finding.clone()].into();
    diagnosis.events = vec![
        FindingEvent::new(Transition::Raised, finding, None),
        FindingEvent::new(Transition::Cleared, host_finding, Some(Duration::from_secs(90))),
    ];
    diagnosis.raised_total =
        vec![FindingCount::new(FindingKind::NearOom, 1), FindingCount::new(FindingKind::Imbalance, 2)].into();
    let mut snapshot = Snapshot::new(Arc::new(SystemInfo::new(spec.host.clone(), "nvml")), devices)
        .with_taken_at(at + Duration::from_secs(5));
    snapshot.attach(diagnosis);
    snapshot
}

#[cfg(feature = "prometheus")]
mod prometheus {
    use super::*;
    use crate::prometheus::tests::check_structure;
    use crate::prometheus::{Format, Naming, PrometheusSink};

    proptest! {
        #![proptest_config(config())]

        /// Every line is a comment or a sample of a declared family, no series repeats, every
        /// value parses as a number, and no label leaks a raw newline or an unbalanced quote.
        #[test]
        fn renderings_stay_well_formed(spec in spec()) {
            let snapshot = Arc::new(build(&spec, false));
            for naming in [Naming::Native, Naming::Dcgm] {
                let sink = PrometheusSink::builder().naming(naming).build().unwrap();
                sink.handle().store(snapshot.clone());
                for format in [Format::Text, Format::OpenMetrics] {
                    let text = sink.handle().render(format);
                    check_structure(&text, format);
                    for line in text.lines().filter(|l| !l.starts_with('#')) {
                        let (series, value) = line.rsplit_once(' ').unwrap();
                        let parsed = match value {
                            "+Inf" => Ok(f64::INFINITY),
                            "-Inf" => Ok(f64::NEG_INFINITY),
                            v => v.parse::<f64>(),
                        };
                        prop_assert!(parsed.is_ok(), "value of {}", line);
                        if let Some((_, labels)) = series.split_once('{') {
                            prop_assert!(labels.ends_with('}'), "{}", line);
                            // Outside escapes, quotes pair up.
                            let mut quotes = 0;
                            let mut bytes = labels.bytes();
                            while let Some(b) = bytes.next() {
                                match b {
                                    b'\\' => { bytes.next(); }
                                    b'"' => quotes += 1,
                                    _ => {}
                                }
                            }
                            prop_assert_eq!(quotes % 2, 0, "{}", line);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(feature = "influxdb")]
mod influxdb {
    use super::*;
    use crate::influxdb::LineProtocolEncoder;

    proptest! {
        #![proptest_config(config())]

        /// Device lines, derived lines and finding lines (evidence with newlines and quotes)
        /// all parse with an independent line-protocol parser, one point per line.
        #[test]
        fn every_line_parses(spec in spec()) {
            let snapshot = build(&spec, false);
            let encoder = LineProtocolEncoder::new("gpumon");
            let mut out = String::new();
            encoder.encode_snapshot(&snapshot, &mut out);
            encoder.encode_derived(&snapshot, &mut out);
            let before = out.len();
            encoder.encode_events(&snapshot, &mut out);
            prop_assert!(out.len() > before, "finding events are written");
            for line in out.lines() {
                let parsed: Vec<_> = influxdb_line_protocol::parse_lines(line).collect();
                prop_assert_eq!(parsed.len(), 1, "{}", line);
                prop_assert!(parsed[0].is_ok(), "{}: {:?}", line, parsed[0]);
            }
            let evidence: Vec<String> = influxdb_line_protocol::parse_lines(&out[before..])
                .filter_map(Result::ok)
                .filter_map(|l| l.field_set.iter().find(|(k, _)| k.as_str() == "evidence").map(|(_, v)| v.to_string()))
                .collect();
            prop_assert_eq!(evidence.len(), 2);
        }
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use super::*;
    use crate::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value;
    use prost::Message as _;

    /// The string attribute values under `key` on every data point of `request`.
    fn attribute_values(request: &ExportMetricsServiceRequest, key: &str) -> std::collections::BTreeSet<String> {
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        let mut out = std::collections::BTreeSet::new();
        for metric in request.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
            let attrs: Vec<_> = match &metric.data {
                Some(Data::Gauge(g)) => g.data_points.iter().flat_map(|p| &p.attributes).collect(),
                Some(Data::Sum(s)) => s.data_points.iter().flat_map(|p| &p.attributes).collect(),
                _ => Vec::new(),
            };
            for kv in attrs.into_iter().filter(|kv| kv.key == key) {
                if let Some(any_value::Value::StringValue(v)) = kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    out.insert(v.clone());
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(config())]

        /// The direct pipeline's request decodes with prost, and the GPU identity attributes
        /// are the input strings, byte for byte.
        #[test]
        fn request_decodes_to_the_input_strings(spec in spec()) {
            let snapshot = build(&spec, false);
            let mut cfg = OtlpConfig::new("http://127.0.0.1:9", Protocol::HttpProtobuf);
            cfg.pipeline = Some(Pipeline::Direct);
            let mut sink = OtlpSink::from_config(&cfg).unwrap();
            let bytes = sink.encode_request(&snapshot).expect("a direct sink encodes");
            let request = ExportMetricsServiceRequest::decode(bytes).expect("valid protobuf");
            let expect = |f: fn(&Dev) -> &String| -> std::collections::BTreeSet<String> {
                spec.devices.iter().map(|d| f(d).clone()).filter(|s| !s.is_empty()).collect()
            };
            prop_assert_eq!(attribute_values(&request, "hw.id"), spec.devices.iter().map(|d| d.uuid.clone()).collect());
            prop_assert_eq!(attribute_values(&request, "hw.model"), expect(|d| &d.name));
            prop_assert_eq!(attribute_values(&request, "hw.serial_number"), expect(|d| &d.serial));
        }
    }
}

#[cfg(feature = "stdout")]
mod stdout {
    use super::*;
    use crate::stdout::{format_snapshot, StdoutFormat};

    proptest! {
        #![proptest_config(config())]

        /// JSON: one line that reads back to the same snapshot (non-finite floats read back as
        /// absent, see [`build`]). Human: one line per device and per finding event, whatever
        /// the names and evidence hold.
        #[test]
        fn json_round_trips_and_human_lines_stay_lines(spec in spec()) {
            let mut out = String::new();
            format_snapshot(&mut out, &build(&spec, false), StdoutFormat::Json).unwrap();
            prop_assert_eq!(out.lines().count(), 1);
            let back: Snapshot = serde_json::from_str(out.trim_end()).unwrap();
            prop_assert_eq!(back, build(&spec, true));

            let mut out = String::new();
            let snapshot = build(&spec, false);
            format_snapshot(&mut out, &snapshot, StdoutFormat::Human).unwrap();
            prop_assert_eq!(out.split('\n').count() - 1, snapshot.devices.len() + 2, "{:?}", out);
        }
    }
}

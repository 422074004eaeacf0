//! The direct pipeline: an `ExportMetricsServiceRequest` (the generated types of the
//! `opentelemetry-proto` crate) built straight from the snapshot, encoded with prost and sent
//! over OTLP/HTTP (async reqwest) or OTLP/gRPC (tonic's generated `MetricsServiceClient`).
//!
//! Names, units, descriptions, kinds and attributes come from the same [`Plan`] and
//! [`Plan::walk`] the SDK pipeline uses. The request is kept between exports: while a series
//! stays where it was (same device identity, metric and label), only its value and time are
//! rewritten, so a steady-state export allocates almost nothing besides the HTTP request.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpumon_core::{BuildError, LabelValue, MetricId, SinkError, Snapshot, Value};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;

use super::config::{Compression, Protocol, Resolved};
use super::encode::{label_key, to_i64, to_u64, AttributeCache, InstrumentSpec, Plan, Series, Shape};
use super::SCOPE_NAME;
use crate::http::client::{Auth, ClientConfig, HttpClient};

/// The request, the per-instrument series and the transport of one direct sink.
pub(crate) struct Direct {
    /// One resource, one scope; the scope's `metrics` is filled only while encoding for gRPC.
    #[cfg_attr(not(feature = "otlp-grpc"), allow(dead_code))] // read by gRPC and the tests
    request: ExportMetricsServiceRequest,
    /// `ResourceMetrics.resource` and `ScopeMetrics.scope`, encoded once (key included).
    resource_field: Vec<u8>,
    scope_field: Vec<u8>,
    instruments: Vec<InstrumentState>,
    /// Per device position: the attribute set last converted, and its protobuf form (a device's
    /// points and its processes' points have different sets; converted only to build a point).
    devices: Vec<(Arc<[opentelemetry::KeyValue]>, Vec<KeyValue>)>,
    /// `start_time_unix_nano` of every cumulative series: when the sink was created.
    start_time: u64,
    /// The encoded request. Kept between exports (lent to the HTTP client and taken back), so
    /// that an export whose series are those of the last one only rewrites each point's time
    /// and value in place ([`Direct::encode`]).
    buf: Vec<u8>,
    /// Where each point's `time_unix_nano` field starts in `buf`, in encoding order; its value
    /// field follows it directly.
    time_at: Vec<usize>,
    /// Bumped whenever [`Direct::update`] changes the series or the resource (not only values).
    layout: u64,
    /// `layout` and length of the request in `buf`, as [`Direct::encode`] last wrote it whole.
    encoded: Option<(u64, usize)>,
    /// The last update's time was 0 (before the epoch), so its points have no time field.
    timeless: bool,
    /// Debug builds: where the whole encoding is made to check a rewrite against (kept, so that
    /// the check allocates nothing in the steady state either).
    #[cfg(debug_assertions)]
    check: Vec<u8>,
    /// Exports whose values were rewritten in place (tests).
    #[cfg(test)]
    rewrites: usize,
    gzip_buf: Vec<u8>,
    points: usize,
    /// gzip the HTTP body.
    gzip: bool,
    transport: Transport,
    /// Whether the resource already says `gpumon.backend=mock` (or `replay`).
    marked_mock: bool,
}

/// The resource attribute that marks simulated (`mock`) and replayed (`replay`) data; its value
/// is [`SystemInfo::marked_backend`](gpumon_core::SystemInfo::marked_backend).
pub(crate) const BACKEND_ATTRIBUTE: &str = "gpumon.backend";
/// Beside `gpumon.backend=replay`: the backend that recorded the trace
/// ([`SystemInfo::marked_recorded_backend`](gpumon_core::SystemInfo::marked_recorded_backend)),
/// `mock` for a replay of simulated GPUs.
pub(crate) const RECORDED_BACKEND_ATTRIBUTE: &str = "gpumon.recorded_backend";

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").field("points", &self.points).finish_non_exhaustive()
    }
}

struct InstrumentState {
    shape: Shape,
    /// Name, unit, description and the data points of the latest snapshot.
    metric: Metric,
    /// What each data point of `metric` is, to tell whether it can be updated in place.
    keys: Vec<SeriesKey>,
    /// Each data point's `attributes` (field 7 entries), encoded when the point was built.
    attrs: Vec<Vec<u8>>,
    /// `Metric` fields `name`, `description`, `unit`, encoded once.
    header: Vec<u8>,
    /// Field number of the data (`gauge` = 5, `sum` = 7).
    data_field: u32,
    /// `Sum` fields `aggregation_temporality`, `is_monotonic` (empty for a gauge).
    sum_fields: Vec<u8>,
    /// Encoded length of the `data` message and of the whole `Metric` (this export).
    data_len: usize,
    metric_len: usize,
    /// Data points the current snapshot produced so far.
    seen: usize,
}

#[derive(Debug, PartialEq)]
enum OwnedLabel {
    Int(u64),
    Str(String),
}

#[derive(Debug)]
struct SeriesKey {
    device: usize,
    /// The attribute set the cache gave (a new one when the device's identity or owners, or the
    /// process's owner, change). Held, not just its address, so that the address cannot be
    /// reused by a later set while this key compares against it.
    base: Arc<[opentelemetry::KeyValue]>,
    id: Option<MetricId>,
    attribute: Option<(&'static str, &'static str)>,
    label: Option<OwnedLabel>,
    /// A derived point's label values (empty for sampled points).
    derived: Vec<String>,
}

impl SeriesKey {
    fn of(s: &Series<'_>) -> SeriesKey {
        SeriesKey {
            device: s.device,
            base: s.base.clone(),
            id: s.id,
            attribute: s.attribute,
            label: s.label.map(|(_, v)| match v {
                LabelValue::Int(i) => OwnedLabel::Int(i),
                LabelValue::Str(v) => OwnedLabel::Str(v.to_owned()),
            }),
            derived: s.derived.pairs().map(|(_, v)| v.to_owned()).collect(),
        }
    }

    fn matches(&self, s: &Series<'_>) -> bool {
        let label = match (&self.label, s.label) {
            (None, None) => true,
            (Some(OwnedLabel::Int(a)), Some((_, LabelValue::Int(b)))) => *a == b,
            (Some(OwnedLabel::Str(a)), Some((_, LabelValue::Str(b)))) => a == b,
            _ => false,
        };
        label
            && self.derived.len() == s.derived.keys.len()
            && self.derived.iter().zip(s.derived.pairs()).all(|(a, (_, b))| a == b)
            && self.device == s.device
            && Arc::ptr_eq(&self.base, s.base)
            && self.id == s.id
            && same_attribute(self.attribute, s.attribute)
    }
}

/// Whether two attributes are the same. They are `'static` strings from the catalogue, so the
/// same series passes the same pointers every export; comparing those first spares reading the
/// bytes (a `memcmp` per point was a tenth of the steady-state update).
fn same_attribute(a: Option<(&'static str, &'static str)>, b: Option<(&'static str, &'static str)>) -> bool {
    let same = |x: &'static str, y: &'static str| std::ptr::eq(x, y) || x == y;
    match (a, b) {
        (None, None) => true,
        (Some((ka, va)), Some((kb, vb))) => same(ka, kb) && same(va, vb),
        _ => false,
    }
}

fn any(value: any_value::Value) -> Option<AnyValue> {
    Some(AnyValue { value: Some(value) })
}

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue { key: key.to_owned(), value: any(any_value::Value::StringValue(value.to_owned())), ..KeyValue::default() }
}

/// An OpenTelemetry API attribute (as the attribute cache builds them) in protobuf form.
fn proto_kv(kv: &opentelemetry::KeyValue) -> KeyValue {
    use opentelemetry::Value as V;
    let value = match &kv.value {
        V::Bool(b) => any_value::Value::BoolValue(*b),
        V::I64(i) => any_value::Value::IntValue(*i),
        V::F64(f) => any_value::Value::DoubleValue(*f),
        V::String(s) => any_value::Value::StringValue(s.as_str().to_owned()),
        other => any_value::Value::StringValue(other.to_string()),
    };
    KeyValue { key: kv.key.as_str().to_owned(), value: any(value), ..KeyValue::default() }
}

fn number(shape: Shape, v: Value) -> number_data_point::Value {
    match shape {
        Shape::GaugeF64 | Shape::CounterF64 => number_data_point::Value::AsDouble(v.as_f64()),
        Shape::GaugeI64 | Shape::UpDownI64 => number_data_point::Value::AsInt(to_i64(v)),
        Shape::CounterU64 => number_data_point::Value::AsInt(i64::try_from(to_u64(v)).unwrap_or(i64::MAX)),
    }
}

fn points_mut(metric: &mut Metric) -> &mut Vec<NumberDataPoint> {
    if !matches!(metric.data, Some(metric::Data::Gauge(_) | metric::Data::Sum(_))) {
        metric.data = Some(metric::Data::Gauge(Gauge::default()));
    }
    match &mut metric.data {
        Some(metric::Data::Sum(s)) => &mut s.data_points,
        Some(metric::Data::Gauge(g)) => &mut g.data_points,
        _ => unreachable!("set above"),
    }
}

const GAUGE_FIELD: u32 = 5;
const SUM_FIELD: u32 = 7;
/// Protobuf wire types.
const I64: u32 = 1;
const LEN: u32 = 2;

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn varint_len(v: usize) -> usize {
    let bits = usize::BITS - (v | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

/// A field key; every field number here is below 16, so one byte.
fn key(buf: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(buf, u64::from(field << 3 | wire_type));
}

/// A message-typed field: key, length, the message.
fn field_message(buf: &mut Vec<u8>, field: u32, msg: &impl prost::Message) {
    key(buf, field, LEN);
    // Encoding into a Vec cannot run out of room.
    let _ = msg.encode_length_delimited(buf);
}

/// Encoded length of a `NumberDataPoint` (attributes pre-encoded).
fn point_len(p: &NumberDataPoint, attrs: &[u8]) -> usize {
    let fixed = |present: bool| if present { 9 } else { 0 };
    attrs.len() + fixed(p.start_time_unix_nano != 0) + fixed(p.time_unix_nano != 0) + fixed(p.value.is_some())
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The resource and scope of every request (the SDK pipeline's, attribute for attribute).
fn skeleton(resource: impl Iterator<Item = (String, String)>) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource.map(|(k, v)| string_kv(&k, &v)).collect(),
                ..Resource::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    }
}

/// The per-instrument state of `spec`, before any point.
fn instrument_state(spec: &InstrumentSpec) -> InstrumentState {
    let data = match spec.shape {
        Shape::GaugeF64 | Shape::GaugeI64 => metric::Data::Gauge(Gauge::default()),
        Shape::CounterF64 | Shape::CounterU64 | Shape::UpDownI64 => metric::Data::Sum(Sum {
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: spec.shape != Shape::UpDownI64,
            ..Sum::default()
        }),
    };
    let mut metric = Metric {
        name: spec.name.to_owned(),
        description: spec.description.clone(),
        unit: spec.unit.to_owned(),
        ..Metric::default()
    };
    let header = metric.encode_to_vec();
    let (data_field, sum_fields) = match &data {
        metric::Data::Sum(sum) => (SUM_FIELD, sum.encode_to_vec()),
        _ => (GAUGE_FIELD, Vec::new()),
    };
    metric.data = Some(data);
    InstrumentState {
        shape: spec.shape,
        metric,
        keys: Vec::new(),
        attrs: Vec::new(),
        header,
        data_field,
        sum_fields,
        data_len: 0,
        metric_len: 0,
        seen: 0,
    }
}

impl Direct {
    /// The request part only, without a transport (tests, benches of the encoder).
    fn with_transport(
        plan: &Plan,
        resource: impl Iterator<Item = (String, String)>,
        gzip: bool,
        transport: Transport,
    ) -> Direct {
        let instruments = plan.instruments.iter().map(instrument_state).collect();
        let request = skeleton(resource);
        let rm = &request.resource_metrics[0];
        let mut resource_field = Vec::new();
        if let Some(r) = &rm.resource {
            field_message(&mut resource_field, 1, r);
        }
        let mut scope_field = Vec::new();
        if let Some(scope) = &rm.scope_metrics[0].scope {
            field_message(&mut scope_field, 1, scope);
        }
        Direct {
            request,
            resource_field,
            scope_field,
            instruments,
            devices: Vec::new(),
            start_time: unix_nanos(SystemTime::now()),
            buf: Vec::new(),
            time_at: Vec::new(),
            layout: 0,
            encoded: None,
            timeless: false,
            #[cfg(debug_assertions)]
            check: Vec::new(),
            #[cfg(test)]
            rewrites: 0,
            gzip_buf: Vec::new(),
            points: 0,
            gzip,
            transport,
            marked_mock: false,
        }
    }

    /// A direct exporter for the resolved settings.
    pub(crate) fn new(plan: &Plan, r: &Resolved) -> Result<Direct, BuildError> {
        let transport = match r.protocol {
            Protocol::HttpProtobuf => Transport::http(r)?,
            Protocol::Grpc => Transport::grpc(r)?,
        };
        let gzip = r.compression == Compression::Gzip;
        Ok(Direct::with_transport(plan, r.resource.iter().map(|(k, v)| (k.clone(), v.clone())), gzip, transport))
    }

    /// Data points of the latest snapshot.
    pub(crate) fn points(&self) -> usize {
        self.points
    }

    /// Adds `gpumon.backend=<mark>` (`mock`, `replay`) to the resource (once): simulated or
    /// replayed data must never pass for a live GPU's, whoever built the sink. The agent also
    /// sets it through the config, so the SDK pipeline carries it too; here it is not added twice.
    fn mark_mock(&mut self, mark: &str, recorded: Option<&str>) {
        let Some(resource) = self.request.resource_metrics[0].resource.as_mut() else { return };
        let has = |key: &str| resource.attributes.iter().any(|kv| kv.key == key);
        let add_backend = !has(BACKEND_ATTRIBUTE);
        let add_recorded = recorded.filter(|_| !has(RECORDED_BACKEND_ATTRIBUTE));
        if !add_backend && add_recorded.is_none() {
            return;
        }
        if add_backend {
            resource.attributes.push(string_kv(BACKEND_ATTRIBUTE, mark));
        }
        if let Some(recorded) = add_recorded {
            resource.attributes.push(string_kv(RECORDED_BACKEND_ATTRIBUTE, recorded));
        }
        self.layout += 1;
        self.resource_field.clear();
        field_message(&mut self.resource_field, 1, resource);
    }

    /// Adds the state of the instruments `plan` learnt since (a stage's own series); the next
    /// encode lays the request out afresh.
    pub(crate) fn learn(&mut self, plan: &Plan) {
        for spec in &plan.instruments[self.instruments.len()..] {
            self.instruments.push(instrument_state(spec));
        }
        self.layout += 1;
    }

    /// Updates the per-instrument data points to `snapshot`.
    fn update(&mut self, plan: &Plan, cache: &mut AttributeCache, snapshot: &Snapshot) {
        if let Some(mark) = snapshot.system.marked_backend().filter(|_| !self.marked_mock) {
            self.marked_mock = true;
            self.mark_mock(mark, snapshot.system.marked_recorded_backend());
        }
        let time = unix_nanos(snapshot.taken_at);
        // A point without a time has no time field: the layout differs, from and back to it.
        let mut relaid = time == 0 || self.timeless;
        self.timeless = time == 0;
        let Direct { instruments, devices, start_time, .. } = self;
        let start_time = *start_time;
        for st in instruments.iter_mut() {
            st.seen = 0;
        }
        plan.walk(snapshot, cache, |series| {
            let st = &mut instruments[series.instrument];
            let n = st.seen;
            st.seen += 1;
            let value = number(st.shape, series.value);
            let points = points_mut(&mut st.metric);
            if st.keys.get(n).is_some_and(|k| k.matches(&series)) && n < points.len() {
                let p = &mut points[n];
                p.time_unix_nano = time;
                p.value = Some(value);
                return;
            }
            relaid = true;
            st.keys.truncate(n);
            st.attrs.truncate(n);
            points.truncate(n);
            st.keys.push(SeriesKey::of(&series));
            if devices.len() <= series.device {
                // Placeholders (each its own allocation): replaced just below.
                devices.resize_with(series.device + 1, || (Arc::from(Vec::new()), Vec::new()));
            }
            let device = &mut devices[series.device];
            if !Arc::ptr_eq(&device.0, series.base) {
                *device = (series.base.clone(), series.base.iter().map(proto_kv).collect());
            }
            let mut attributes = Vec::with_capacity(device.1.len() + 2);
            attributes.extend_from_slice(&device.1);
            if let Some((k, v)) = series.attribute {
                attributes.push(string_kv(k, v));
            }
            if let Some((label, v)) = series.label {
                let value = match v {
                    LabelValue::Int(i) => any_value::Value::IntValue(i64::try_from(i).unwrap_or(i64::MAX)),
                    LabelValue::Str(s) => any_value::Value::StringValue(s.to_owned()),
                };
                attributes.push(KeyValue {
                    key: label_key(label).into_owned(),
                    value: any(value),
                    ..KeyValue::default()
                });
            }
            // An empty value means "no such label" (a run without a rank): no attribute.
            for (label, v) in series.derived.pairs().filter(|(_, v)| !v.is_empty()) {
                attributes.push(string_kv(&label_key(label), v));
            }
            let mut encoded = Vec::new();
            for kv in &attributes {
                field_message(&mut encoded, 7, kv);
            }
            st.attrs.push(encoded);
            let cumulative = !matches!(st.shape, Shape::GaugeF64 | Shape::GaugeI64);
            points.push(NumberDataPoint {
                attributes,
                start_time_unix_nano: if cumulative { start_time } else { 0 },
                time_unix_nano: time,
                value: Some(value),
                ..NumberDataPoint::default()
            });
        });
        let mut total = 0;
        for st in instruments.iter_mut() {
            relaid |= st.keys.len() != st.seen;
            st.keys.truncate(st.seen);
            st.attrs.truncate(st.seen);
            points_mut(&mut st.metric).truncate(st.seen);
            total += st.seen;
        }
        self.points = total;
        if relaid {
            self.layout += 1;
        }
    }

    /// Moves the non-empty metrics into the request (and back with [`Direct::restore`]).
    #[cfg_attr(not(feature = "otlp-grpc"), allow(dead_code))]
    fn fill(&mut self) {
        let metrics = &mut self.request.resource_metrics[0].scope_metrics[0].metrics;
        metrics.clear();
        for st in &mut self.instruments {
            if st.seen > 0 {
                metrics.push(std::mem::take(&mut st.metric));
            }
        }
    }

    #[cfg_attr(not(feature = "otlp-grpc"), allow(dead_code))]
    fn restore(&mut self) {
        let mut metrics = self.request.resource_metrics[0].scope_metrics[0].metrics.drain(..);
        for st in &mut self.instruments {
            if st.seen > 0 {
                if let Some(m) = metrics.next() {
                    st.metric = m;
                }
            }
        }
    }

    /// Builds the request for `snapshot` and encodes it into the reused buffer.
    ///
    /// The bytes are exactly the protobuf encoding of the kept `ExportMetricsServiceRequest`
    /// (a test decodes them and compares), but framed here: prost would recompute the length of
    /// every nested message once per enclosing level, and each point's attributes are encoded
    /// once, when the point is built, not at every export.
    ///
    /// When the series are those of the request already in the buffer (the steady state: same
    /// devices, metrics and labels), only each point's time and value are rewritten there: at
    /// 1 Hz every byte this touches is cold, and the request for 8 GPUs is ~450 KB, of which the
    /// times and values are ~6 %. Debug builds check the result against a whole encoding.
    pub(crate) fn encode(&mut self, plan: &Plan, cache: &mut AttributeCache, snapshot: &Snapshot) -> &[u8] {
        self.update(plan, cache, snapshot);
        if self.encoded == Some((self.layout, self.buf.len())) {
            self.rewrite_values();
            #[cfg(test)]
            {
                self.rewrites += 1;
            }
            #[cfg(debug_assertions)]
            {
                // Encode the whole request into the check buffer and compare; the rewritten
                // bytes stay the output.
                let rewritten = std::mem::replace(&mut self.buf, std::mem::take(&mut self.check));
                self.encode_whole();
                assert!(rewritten == self.buf, "the values rewritten in place differ from a whole encoding");
                self.check = std::mem::replace(&mut self.buf, rewritten);
            }
        } else {
            self.encode_whole();
        }
        &self.buf
    }

    /// Rewrites every point's time and value in the kept request (same layout).
    fn rewrite_values(&mut self) {
        let mut at = self.time_at.iter();
        for st in &mut self.instruments {
            if st.seen == 0 {
                continue;
            }
            for p in points_mut(&mut st.metric).iter() {
                let Some(&i) = at.next() else { return };
                // Key bytes stay as they are: the layout says they are the same fields.
                self.buf[i + 1..i + 9].copy_from_slice(&p.time_unix_nano.to_le_bytes());
                let value = match p.value {
                    Some(number_data_point::Value::AsDouble(v)) => v.to_le_bytes(),
                    Some(number_data_point::Value::AsInt(v)) => v.to_le_bytes(),
                    None => continue,
                };
                self.buf[i + 10..i + 18].copy_from_slice(&value);
            }
        }
    }

    /// Encodes the whole request into the buffer and notes where each point's time sits.
    fn encode_whole(&mut self) {
        self.time_at.clear();
        // Lengths, bottom up.
        let mut scope_len = self.scope_field.len();
        for st in &mut self.instruments {
            if st.seen == 0 {
                continue;
            }
            let mut data_len = st.sum_fields.len();
            for (p, attrs) in points_mut(&mut st.metric).iter().zip(&st.attrs) {
                let len = point_len(p, attrs);
                data_len += 1 + varint_len(len) + len;
            }
            st.data_len = data_len;
            st.metric_len = st.header.len() + 1 + varint_len(data_len) + data_len;
            scope_len += 1 + varint_len(st.metric_len) + st.metric_len;
        }
        let rm_len = self.resource_field.len() + 1 + varint_len(scope_len) + scope_len;
        // Bytes, top down.
        let buf = &mut self.buf;
        buf.clear();
        key(buf, 1, LEN); // ExportMetricsServiceRequest.resource_metrics
        varint(buf, rm_len as u64);
        buf.extend_from_slice(&self.resource_field);
        key(buf, 2, LEN); // ResourceMetrics.scope_metrics
        varint(buf, scope_len as u64);
        buf.extend_from_slice(&self.scope_field);
        for st in &mut self.instruments {
            if st.seen == 0 {
                continue;
            }
            key(buf, 2, LEN); // ScopeMetrics.metrics
            varint(buf, st.metric_len as u64);
            buf.extend_from_slice(&st.header);
            key(buf, st.data_field, LEN); // Metric.gauge / Metric.sum
            varint(buf, st.data_len as u64);
            for (p, attrs) in points_mut(&mut st.metric).iter().zip(&st.attrs) {
                key(buf, 1, LEN); // Gauge.data_points / Sum.data_points
                varint(buf, point_len(p, attrs) as u64);
                buf.extend_from_slice(attrs);
                if p.start_time_unix_nano != 0 {
                    key(buf, 2, I64);
                    buf.extend_from_slice(&p.start_time_unix_nano.to_le_bytes());
                }
                if p.time_unix_nano != 0 {
                    self.time_at.push(buf.len());
                    key(buf, 3, I64);
                    buf.extend_from_slice(&p.time_unix_nano.to_le_bytes());
                }
                match p.value {
                    Some(number_data_point::Value::AsDouble(v)) => {
                        key(buf, 4, I64);
                        buf.extend_from_slice(&v.to_le_bytes());
                    }
                    Some(number_data_point::Value::AsInt(v)) => {
                        key(buf, 6, I64);
                        buf.extend_from_slice(&v.to_le_bytes());
                    }
                    None => {}
                }
            }
            buf.extend_from_slice(&st.sum_fields);
        }
        self.encoded = Some((self.layout, self.buf.len()));
    }

    /// The kept request as the generated type (what gRPC sends; tests).
    #[cfg_attr(not(feature = "otlp-grpc"), allow(dead_code))]
    fn message(&mut self) -> ExportMetricsServiceRequest {
        self.fill();
        let request = self.request.clone();
        self.restore();
        request
    }

    /// The request for `snapshot`, as sent (tests).
    #[cfg(test)]
    pub(crate) fn request_of(
        &mut self,
        plan: &Plan,
        cache: &mut AttributeCache,
        snapshot: &Snapshot,
    ) -> ExportMetricsServiceRequest {
        let bytes = self.encode(plan, cache, snapshot);
        ExportMetricsServiceRequest::decode(bytes).expect("the encoding decodes")
    }

    /// Exports `snapshot`. `what` names the endpoint in error messages.
    pub(crate) async fn export(
        &mut self,
        plan: &Plan,
        cache: &mut AttributeCache,
        snapshot: &Snapshot,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<(), SinkError> {
        #[cfg(feature = "otlp-grpc")]
        if matches!(self.transport, Transport::Grpc(_)) {
            // The generated client takes the message by value: send a copy of the kept one.
            self.update(plan, cache, snapshot);
            let request = self.message();
            if let Transport::Grpc(grpc) = &mut self.transport {
                return grpc.send(request, what).await;
            }
        }
        self.encode(plan, cache, snapshot);
        // The request body is the kept buffer itself, lent to the HTTP client and taken back
        // after the response: a request for 8 GPUs is ~450 KB, and copying it into a fresh
        // allocation per export was the sink's largest cost.
        let payload = if self.gzip {
            let mut gz = flate2::write::GzEncoder::new(std::mem::take(&mut self.gzip_buf), flate2::Compression::fast());
            match gz.write_all(&self.buf).and_then(|()| gz.finish()) {
                Ok(out) => out,
                Err(e) => return Err(SinkError::permanent(format!("{} failed: gzip: {e}", what()))),
            }
        } else {
            std::mem::take(&mut self.buf)
        };
        let body = bytes::Bytes::from(payload);
        let result = match &self.transport {
            Transport::Http(http) => http.send(body.clone(), what).await,
            #[cfg(feature = "otlp-grpc")]
            Transport::Grpc(_) => Ok(()),
        };
        // The client has dropped its handle once the response is read; if it still holds one
        // (a timeout mid-send), the next export starts from a new buffer.
        // The plain body is the kept request (its bytes are rewritten in place next time).
        let mut reclaimed = body.try_into_mut().map(Vec::from).unwrap_or_default();
        if self.gzip {
            reclaimed.clear();
            self.gzip_buf = reclaimed;
        } else {
            self.buf = reclaimed;
        }
        result
    }
}

enum Transport {
    Http(HttpTransport),
    #[cfg(feature = "otlp-grpc")]
    Grpc(GrpcTransport),
}

struct HttpTransport {
    client: HttpClient,
    url: reqwest::Url,
    timeout: Duration,
}

impl Transport {
    fn http(r: &Resolved) -> Result<Transport, BuildError> {
        use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
        let url = reqwest::Url::parse(&r.endpoint)
            .map_err(|e| BuildError::InvalidEndpoint { endpoint: r.endpoint.clone(), reason: e.to_string() })?;
        let mut headers = HeaderMap::new();
        for (k, v) in &r.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| BuildError::invalid("otlp.headers", format!("`{k}`: {e}")))?;
            let mut value = HeaderValue::from_str(v.expose())
                .map_err(|e| BuildError::invalid("otlp.headers", format!("value of `{k}`: {e}")))?;
            // The client's `Debug` shows its headers: a configured value shows as sensitive.
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"));
        if r.compression == Compression::Gzip {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        let client = HttpClient::new(ClientConfig {
            key: "otlp",
            tls: &r.tls,
            url: &url,
            timeout: Some(r.timeout),
            connect_timeout: r.timeout,
            auth: Auth::None, // credentials are headers (`otlp.headers`)
            headers,
        })?;
        Ok(Transport::Http(HttpTransport { client, url, timeout: r.timeout }))
    }

    #[cfg(feature = "otlp-grpc")]
    fn grpc(r: &Resolved) -> Result<Transport, BuildError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(BuildError::invalid(
                "otlp.protocol",
                "an OTLP/gRPC sink must be built inside a tokio runtime (its channel runs on it)",
            ));
        }
        let metadata = super::grpc_metadata(&r.headers)?;
        let channel = crate::tls::grpc_channel(&r.tls, "otlp.tls", &r.endpoint, r.timeout)?;
        let mut client =
            opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient::new(
                channel,
            );
        if r.compression == Compression::Gzip {
            client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        Ok(Transport::Grpc(GrpcTransport { client, metadata, timeout: r.timeout }))
    }

    #[cfg(not(feature = "otlp-grpc"))]
    fn grpc(r: &Resolved) -> Result<Transport, BuildError> {
        Err(super::grpc_missing(r))
    }
}

impl HttpTransport {
    /// Posts the request; a retryable failure is transient (the agent counts it and the next
    /// export tries again), any other permanent, by the one retry table ([`crate::http::retry`]).
    async fn send(&self, body: bytes::Bytes, what: &(dyn Fn() -> String + Sync)) -> Result<(), SinkError> {
        let request = self.client.request(reqwest::Method::POST, self.url.clone()).body(body);
        match self.client.send(request).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_timeout() => Err(SinkError::Timeout(self.timeout)),
            Err(e) => Err(e.into_failure(&format!("{} failed", what())).into()),
        }
    }
}

#[cfg(feature = "otlp-grpc")]
struct GrpcTransport {
    client: opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient<
        tonic::transport::Channel,
    >,
    metadata: tonic::metadata::MetadataMap,
    timeout: Duration,
}

#[cfg(feature = "otlp-grpc")]
impl GrpcTransport {
    async fn send(
        &mut self,
        message: ExportMetricsServiceRequest,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<(), SinkError> {
        use tonic::Code;
        let mut request = tonic::Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        request.set_timeout(self.timeout);
        match self.client.export(request).await {
            Ok(_) => Ok(()),
            Err(status) => {
                // tonic's Display shows "transport error" only; the cause (refused, a rejected
                // certificate) is in the source chain.
                let mut detail = format!("{:?}: {}", status.code(), status.message());
                if let Some(source) = std::error::Error::source(&status) {
                    let chain = gpumon_core::error_chain(source);
                    if !status.message().contains(&chain) && !chain.contains(status.message()) {
                        detail = format!("{detail} ({chain})");
                    }
                }
                let hint = crate::tls::certificate_hint(&detail, "otlp.tls");
                let message = format!("{} failed: {detail}{hint}", what());
                match status.code() {
                    Code::DeadlineExceeded => Err(SinkError::Timeout(self.timeout)),
                    Code::Unavailable
                    | Code::ResourceExhausted
                    | Code::Aborted
                    | Code::Cancelled
                    | Code::OutOfRange
                    | Code::DataLoss
                    | Code::Unknown
                    | Code::Internal => Err(SinkError::transient(message)),
                    _ => Err(SinkError::permanent(message)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumon_core::{DeviceInfo, DeviceSample, SystemInfo};
    use std::time::UNIX_EPOCH;

    fn offline(plan: &Plan) -> Direct {
        let url = reqwest::Url::parse("http://127.0.0.1:9/v1/metrics").unwrap();
        let config = ClientConfig {
            key: "otlp",
            tls: &crate::tls::TlsConfig::default(),
            url: &url,
            timeout: Some(Duration::from_secs(1)),
            connect_timeout: Duration::from_secs(1),
            auth: Auth::None,
            headers: reqwest::header::HeaderMap::new(),
        };
        let transport = Transport::Http(HttpTransport {
            client: HttpClient::new(config).unwrap(),
            url,
            timeout: Duration::from_secs(1),
        });
        Direct::with_transport(plan, [("service.name".to_owned(), "t".to_owned())].into_iter(), false, transport)
    }

    fn snapshot(taken_at: SystemTime, energy: f64) -> Snapshot {
        let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-0", "X")));
        gpu.utilization.gpu = Some(0.5);
        gpu.power.energy_joules = Some(energy);
        gpu.memory.used = Some(1024);
        let mut snap = Snapshot::new(Arc::new(SystemInfo::new("h", "mock")), vec![gpu]);
        snap.taken_at = taken_at;
        snap
    }

    fn all_points(r: &ExportMetricsServiceRequest) -> Vec<(&Metric, &NumberDataPoint)> {
        let mut out = Vec::new();
        for m in &r.resource_metrics[0].scope_metrics[0].metrics {
            let points = match &m.data {
                Some(metric::Data::Gauge(g)) => &g.data_points,
                Some(metric::Data::Sum(s)) => &s.data_points,
                _ => panic!("unexpected data of {}", m.name),
            };
            out.extend(points.iter().map(|p| (m, p)));
        }
        out
    }

    #[test]
    fn time_unix_nano_is_the_snapshot_time_and_start_time_is_stable() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let t1 = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let r1 = direct.request_of(&plan, &mut cache, &snapshot(t1, 10.0));
        let p1 = all_points(&r1);
        assert!(!p1.is_empty());
        assert_eq!(p1.len(), direct.points());
        for (m, p) in &p1 {
            assert_eq!(p.time_unix_nano, 1_700_000_000_123_456_789, "{}", m.name);
        }
        let t2 = t1 + Duration::from_secs(1);
        let r2 = direct.request_of(&plan, &mut cache, &snapshot(t2, 20.0));
        let p2 = all_points(&r2);
        assert_eq!(p1.len(), p2.len());
        for ((m1, a), (_, b)) in p1.iter().zip(&p2) {
            assert_eq!(b.time_unix_nano, 1_700_000_001_123_456_789);
            assert_eq!(a.attributes, b.attributes);
            assert_eq!(a.start_time_unix_nano, b.start_time_unix_nano, "{}", m1.name);
        }
        let energy = p2.iter().find(|(m, _)| m.name == "hw.energy").unwrap();
        assert_eq!(energy.1.value, Some(number_data_point::Value::AsDouble(20.0)));
        assert!(energy.1.start_time_unix_nano > 0);
        match &energy.0.data {
            Some(metric::Data::Sum(s)) => {
                assert!(s.is_monotonic);
                assert_eq!(s.aggregation_temporality, AggregationTemporality::Cumulative as i32);
            }
            other => panic!("{other:?}"),
        }
        let usage = p2.iter().find(|(m, _)| m.name == "hw.gpu.memory.usage").unwrap();
        assert_eq!(usage.1.value, Some(number_data_point::Value::AsInt(1024)));
        let r = &r2.resource_metrics[0];
        assert_eq!(r.scope_metrics[0].scope.as_ref().unwrap().name, SCOPE_NAME);
        assert_eq!(r.resource.as_ref().unwrap().attributes[0].key, "service.name");
    }

    fn resource_values<'a>(r: &'a ExportMetricsServiceRequest, key: &str) -> Vec<&'a AnyValue> {
        let resource = r.resource_metrics[0].resource.as_ref().expect("a resource");
        resource.attributes.iter().filter(|kv| kv.key == key).filter_map(|kv| kv.value.as_ref()).collect()
    }

    #[test]
    fn simulated_data_is_marked_on_the_resource_once() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        for n in 0..2 {
            let r = direct.request_of(&plan, &mut cache, &snapshot(UNIX_EPOCH + Duration::from_secs(n), 1.0));
            let values = resource_values(&r, "gpumon.backend");
            assert_eq!(values, [&any(any_value::Value::StringValue("mock".into())).unwrap()], "export {n}");
            // The gRPC message (the generated type) says the same.
            assert_eq!(resource_values(&direct.message(), "gpumon.backend").len(), 1);
        }
        // A replayed trace is marked the same way, with its own value.
        let mut direct = offline(&plan);
        let mut replayed = snapshot(UNIX_EPOCH + Duration::from_secs(1), 1.0);
        replayed.system = Arc::new(SystemInfo::new("h", "replay"));
        let r = direct.request_of(&plan, &mut cache, &replayed);
        assert_eq!(
            resource_values(&r, "gpumon.backend"),
            [&any(any_value::Value::StringValue("replay".into())).unwrap()]
        );
        assert!(resource_values(&r, "gpumon.recorded_backend").is_empty(), "unknown: not said");
    }

    #[test]
    fn a_replay_of_simulated_data_says_it_was_recorded_on_the_mock() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let mut replayed = snapshot(UNIX_EPOCH + Duration::from_secs(1), 1.0);
        let mut system = SystemInfo::new("h", "replay");
        system.recorded_backend = Some("mock".into());
        replayed.system = Arc::new(system);
        let string = |s: &str| any(any_value::Value::StringValue(s.into())).unwrap();
        for n in 0..2 {
            let r = direct.request_of(&plan, &mut cache, &replayed);
            assert_eq!(resource_values(&r, "gpumon.backend"), [&string("replay")], "export {n}");
            assert_eq!(resource_values(&r, "gpumon.recorded_backend"), [&string("mock")], "export {n}");
            assert_eq!(resource_values(&direct.message(), "gpumon.recorded_backend").len(), 1);
        }
    }

    #[test]
    fn real_data_carries_no_backend_attribute() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let mut snap = snapshot(UNIX_EPOCH, 1.0);
        snap.system = Arc::new(SystemInfo::new("h", "nvml"));
        let r = direct.request_of(&plan, &mut cache, &snap);
        assert!(resource_values(&r, "gpumon.backend").is_empty());
        assert_eq!(resource_values(&r, "service.name").len(), 1);
    }

    #[test]
    fn the_framed_encoding_is_the_generated_one() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        for n in 0..3u32 {
            let mut snap = snapshot(UNIX_EPOCH + Duration::from_secs(u64::from(n)), f64::from(n));
            if n == 1 {
                let mut other = snap.devices[0].clone();
                other.info = Arc::new(DeviceInfo::new(1, "GPU-1", "Y"));
                snap.devices.push(other);
            }
            let bytes = direct.encode(&plan, &mut cache, &snap).to_vec();
            let generated = direct.message();
            assert_eq!(bytes.len(), generated.encoded_len());
            assert_eq!(ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap(), generated);
        }
    }

    /// The steady state rewrites times and values in the kept request; whatever came before,
    /// the bytes are those a new sink encodes for the same snapshot — through a layout change
    /// (a second GPU), back, through a time of 0 (no time field) and back, and through a metric
    /// that vanishes (no energy reading) and returns. The first export also marks the resource
    /// as simulated.
    #[test]
    fn values_rewritten_in_place_are_the_whole_encoding() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let no_energy = |mut snap: Snapshot| {
            snap.devices[0].power.energy_joules = None;
            snap
        };
        let two_gpus = |mut snap: Snapshot| {
            let mut other = snap.devices[0].clone();
            other.info = Arc::new(DeviceInfo::new(1, "GPU-1", "Y"));
            other.utilization.gpu = Some(0.25);
            snap.devices.push(other);
            snap
        };
        let steps = [
            (1, snapshot(UNIX_EPOCH + Duration::from_secs(1), 1.0), false),
            (2, snapshot(UNIX_EPOCH + Duration::from_secs(2), 2.5), true),
            (3, two_gpus(snapshot(UNIX_EPOCH + Duration::from_secs(3), 3.0)), false),
            (4, two_gpus(snapshot(UNIX_EPOCH + Duration::from_secs(4), 4.0)), true),
            (5, snapshot(UNIX_EPOCH + Duration::from_secs(5), 5.0), false),
            (6, snapshot(UNIX_EPOCH, 6.0), false),
            (7, snapshot(UNIX_EPOCH + Duration::from_secs(7), 7.0), false),
            (8, snapshot(UNIX_EPOCH + Duration::from_secs(8), 8.0), true),
            (9, no_energy(snapshot(UNIX_EPOCH + Duration::from_secs(9), 0.0)), false),
            (10, no_energy(snapshot(UNIX_EPOCH + Duration::from_secs(10), 0.0)), true),
            (11, snapshot(UNIX_EPOCH + Duration::from_secs(11), 11.0), false),
        ];
        for (n, snap, in_place) in steps {
            let rewrites = direct.rewrites;
            let bytes = direct.encode(&plan, &mut cache, &snap).to_vec();
            assert_eq!(direct.rewrites == rewrites + 1, in_place, "step {n}: rewritten in place");
            let mut fresh = offline(&plan);
            fresh.start_time = direct.start_time;
            let expected = fresh.encode(&plan, &mut AttributeCache::default(), &snap).to_vec();
            assert!(bytes == expected, "step {n}: the kept request differs from a new sink's");
            let r = ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap();
            assert!(all_points(&r).iter().all(|(_, p)| p.time_unix_nano == unix_nanos(snap.taken_at)), "step {n}");
        }
    }

    fn with_findings(taken_at: SystemTime, active: &[(gpumon_core::FindingKind, Option<(u32, &str)>)]) -> Snapshot {
        use gpumon_core::{Diagnosis, Finding, FindingCount, Severity};
        let mut snap = snapshot(taken_at, 1.0);
        let mut d = Diagnosis::default();
        d.active = active
            .iter()
            .map(|&(kind, device)| Finding::new(kind, Severity::Warning, device, UNIX_EPOCH, "e", "a"))
            .collect();
        d.raised_total = active.iter().map(|&(kind, _)| FindingCount::new(kind, 2)).collect();
        snap.attach(d);
        snap
    }

    fn attrs(p: &NumberDataPoint) -> std::collections::BTreeMap<String, String> {
        p.attributes
            .iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    Some(any_value::Value::IntValue(i)) => i.to_string(),
                    other => format!("{other:?}"),
                };
                (kv.key.clone(), v)
            })
            .collect()
    }

    /// The bytes of one 8-GPU request (mock `h100x8`, default families), as encoded and gzip'd
    /// as the sink sends it, with the GPU's whole identity on every point (as before #28) and
    /// once per GPU (now): the figure of BENCHMARKS.md's "Bytes on the wire", printed with
    /// `--nocapture`. The identity must go out once per GPU, not once per point.
    #[test]
    fn identity_once_per_gpu_shrinks_an_8_gpu_request() {
        use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler as _};
        let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
        let snap = sampler.sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::all())).unwrap();
        let plan = Plan::new();
        let gzip = |bytes: &[u8]| {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(bytes).unwrap();
            gz.finish().unwrap().len()
        };
        let mut sizes = Vec::new();
        for every_point in [true, false] {
            let mut cache = AttributeCache::default();
            cache.identity_on_every_point = every_point;
            let bytes = offline(&plan).encode(&plan, &mut cache, &snap).to_vec();
            let r = ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap();
            let points = all_points(&r);
            let with_model = points.iter().filter(|(_, p)| attrs(p).contains_key("hw.model")).count();
            println!(
                "identity on every point: {every_point}: {} points, {} with hw.model, {} B as encoded, {} B gzip",
                points.len(),
                with_model,
                bytes.len(),
                gzip(&bytes)
            );
            sizes.push((points.len(), with_model, bytes.len()));
        }
        let (before, after) = (sizes[0], sizes[1]);
        assert_eq!(before.0, after.0, "the same points");
        assert_eq!(before.1, before.0, "before: the model on every point");
        assert_eq!(after.1, 2 * 8, "after: on each GPU's two hw.status points only");
        assert!(after.2 < before.2, "{sizes:?}");
    }

    #[test]
    fn findings_are_exported_from_the_catalogue() {
        use gpumon_core::FindingKind;
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let snap = with_findings(
            UNIX_EPOCH + Duration::from_secs(5),
            &[(FindingKind::NearOom, Some((0, "GPU-0"))), (FindingKind::Imbalance, None)],
        );
        let bytes = direct.encode(&plan, &mut cache, &snap).to_vec();
        let r = ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap();
        let points = all_points(&r);
        let active: Vec<_> = points.iter().filter(|(m, _)| m.name == "gpumon.finding.active").collect();
        assert_eq!(active.len(), 2);
        assert!(matches!(active[0].0.data, Some(metric::Data::Gauge(_))));
        let a0 = attrs(active[0].1);
        assert_eq!(a0.get("hw.id").map(String::as_str), Some("GPU-0"), "{a0:?}");
        assert_eq!(a0.get("hw.name").map(String::as_str), Some("nvidia0"));
        assert_eq!(a0.get("gpumon.gpu.index"), None, "the index is on the device's hw.status only");
        assert_eq!((a0["gpumon.kind"].as_str(), a0["gpumon.severity"].as_str()), ("near_oom", "warning"));
        assert_eq!(active[0].1.value, Some(number_data_point::Value::AsInt(1)));
        // Host-level: only its own attributes (the resource names the host).
        let a1 = attrs(active[1].1);
        assert_eq!(a1.keys().map(String::as_str).collect::<Vec<_>>(), ["gpumon.kind", "gpumon.severity"]);
        assert_eq!(a1["gpumon.kind"], "imbalance");
        let raised: Vec<_> = points.iter().filter(|(m, _)| m.name == "gpumon.findings.raised").collect();
        assert_eq!(raised.len(), 2);
        match &raised[0].0.data {
            Some(metric::Data::Sum(s)) => {
                assert!(s.is_monotonic);
                assert_eq!(s.aggregation_temporality, AggregationTemporality::Cumulative as i32);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(attrs(raised[0].1).keys().map(String::as_str).collect::<Vec<_>>(), ["gpumon.kind"]);
        assert_eq!(raised[0].1.value, Some(number_data_point::Value::AsInt(2)));
        assert!(raised[0].1.start_time_unix_nano > 0);

        // The finding clears: its series goes, the other one's attributes are rebuilt right.
        let snap = with_findings(UNIX_EPOCH + Duration::from_secs(6), &[(FindingKind::Imbalance, None)]);
        let r = direct.request_of(&plan, &mut cache, &snap);
        let points = all_points(&r);
        let active: Vec<_> = points.iter().filter(|(m, _)| m.name == "gpumon.finding.active").collect();
        assert_eq!(active.len(), 1);
        assert_eq!(attrs(active[0].1)["gpumon.kind"], "imbalance");
        assert!(!attrs(active[0].1).contains_key("hw.id"));
        assert_eq!(direct.points(), points.len());
        // No diagnosis: no finding series at all.
        let r = direct.request_of(&plan, &mut cache, &snapshot(UNIX_EPOCH + Duration::from_secs(7), 1.0));
        assert!(all_points(&r).iter().all(|(m, _)| !m.name.starts_with("gpumon.finding")));
    }

    #[test]
    fn a_changed_device_set_rebuilds_the_series() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let one = snapshot(UNIX_EPOCH, 1.0);
        let n1 = all_points(&direct.request_of(&plan, &mut cache, &one)).len();
        let mut two = snapshot(UNIX_EPOCH, 1.0);
        let mut other = two.devices[0].clone();
        other.info = Arc::new(DeviceInfo::new(1, "GPU-1", "Y"));
        two.devices.push(other);
        let r = direct.request_of(&plan, &mut cache, &two);
        let p = all_points(&r);
        assert_eq!(p.len(), 2 * n1);
        let ids: std::collections::BTreeSet<String> = p
            .iter()
            .filter_map(|(_, p)| p.attributes.iter().find(|kv| kv.key == "hw.id"))
            .map(|kv| format!("{:?}", kv.value))
            .collect();
        assert_eq!(ids.len(), 2);
        let back = all_points(&direct.request_of(&plan, &mut cache, &one)).len();
        assert_eq!(back, n1);
    }

    fn owner(
        ns: Option<&str>,
        pod: Option<&str>,
        container: Option<&str>,
        user: Option<&str>,
    ) -> gpumon_core::attribution::SharedOwner {
        let mut o = gpumon_core::attribution::Owner::default();
        o.namespace = ns.map(Into::into);
        o.pod = pod.map(Into::into);
        o.container = container.map(Into::into);
        o.user = user.map(Into::into);
        Arc::new(o)
    }

    /// The owner attributes (and `process.pid`) of every point of `name`, in order.
    fn owner_attrs(r: &ExportMetricsServiceRequest, name: &str) -> Vec<Vec<(String, String)>> {
        const KEYS: [&str; 6] =
            ["k8s.namespace.name", "k8s.pod.name", "k8s.container.name", "container.id", "user.name", "process.pid"];
        all_points(r)
            .into_iter()
            .filter(|(m, _)| m.name == name)
            .map(|(_, p)| attrs(p).into_iter().filter(|(k, _)| KEYS.contains(&k.as_str())).collect())
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn owner_attributes_follow_the_owners_and_processes_carry_their_own() {
        let plan = Plan::new();
        let mut cache = AttributeCache::default();
        let mut direct = offline(&plan);
        let pod = owner(Some("team-a"), Some("train-0"), Some("trainer"), None);
        let root = owner(None, None, None, Some("root"));
        let docker = owner(None, None, Some("0123456789ab"), Some("alice"));
        let snap = |owners: Vec<gpumon_core::attribution::SharedOwner>, process_owner| {
            let mut s = snapshot(UNIX_EPOCH, 1.0);
            let mut p = gpumon_core::ProcessSample::new(42);
            p.memory_used = Some(7);
            p.owner = process_owner;
            s.devices[0].processes.push(p);
            s.devices[0].owners = owners;
            s
        };

        let r = direct.request_of(&plan, &mut cache, &snap(vec![pod.clone(), root.clone()], Some(root.clone())));
        let device = pairs(&[
            ("k8s.container.name", "trainer"),
            ("k8s.namespace.name", "team-a"),
            ("k8s.pod.name", "train-0"),
            ("user.name", "root"),
        ]);
        assert_eq!(owner_attrs(&r, "hw.gpu.utilization"), [device]);
        assert_eq!(
            owner_attrs(&r, "gpumon.gpu.process.memory.usage"),
            [pairs(&[("process.pid", "42"), ("user.name", "root")])]
        );

        // The owners change (the pod went, a Docker container of alice runs): the cached device
        // and process attributes are rebuilt, not reused.
        let r = direct.request_of(&plan, &mut cache, &snap(vec![docker.clone()], Some(docker.clone())));
        let outside = pairs(&[("container.id", "0123456789ab"), ("user.name", "alice")]);
        let mut process = outside.clone();
        assert_eq!(owner_attrs(&r, "hw.gpu.utilization"), [outside]);
        process.insert(1, ("process.pid".to_owned(), "42".to_owned()));
        assert_eq!(owner_attrs(&r, "gpumon.gpu.process.memory.usage"), [process]);

        // Nobody known: no owner attribute at all; the SDK pipeline agrees.
        let r = direct.request_of(&plan, &mut cache, &snap(vec![], None));
        assert_eq!(owner_attrs(&r, "hw.gpu.utilization"), [Vec::<(String, String)>::new()]);
        let enc = plan.encode(&snap(vec![pod.clone()], None), &mut cache);
        let slot = plan.instruments.iter().position(|i| i.name == "hw.gpu.utilization").unwrap();
        let owners: Vec<_> = enc.by_instrument[slot][0]
            .attributes
            .iter()
            .filter(|kv| kv.key.as_str().starts_with("k8s.") || kv.key.as_str().starts_with("user."))
            .map(|kv| (kv.key.as_str().to_owned(), kv.value.to_string()))
            .collect();
        assert_eq!(
            owners,
            pairs(&[("k8s.namespace.name", "team-a"), ("k8s.pod.name", "train-0"), ("k8s.container.name", "trainer")])
        );
    }
}

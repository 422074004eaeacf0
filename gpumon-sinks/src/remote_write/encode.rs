//! The remote-write 1.0 wire format: the protobuf messages and a direct encoder.
//!
//! Messages from the specification (<https://prometheus.io/docs/specs/prw/remote_write_spec/>,
//! "Protocol"), which points at `prometheus/prompb/remote.proto` and `types.proto`; the field
//! numbers and types below are those of the spec. Fields a 1.0 sender does not use (exemplars,
//! native histograms, metadata) are left out: a decoder skips unknown fields and an encoder simply
//! does not write them. The prost structs are for decoding (tests, embedders); the hot path
//! writes the same bytes directly, without building a `TimeSeries` per series.
//!
//! The series come from the Prometheus family's series layer (`prometheus::series`): the walk
//! that the scrape endpoint's text renderer consumes too, so names, labels, `up 0` and the
//! self-metrics are decided in one place, and nothing is rendered as text or parsed here. The
//! shape is metrics-exporter-prometheus' (one snapshot of the series feeds both its text and its
//! protobuf renderer; shared/STYLE.md, anchor 1), visited rather than materialised — see the
//! series layer's docs for why.
//!
//! A `WriteRequest` is nothing but repeated field 1 (`TimeSeries`), so the concatenation of
//! encoded `timeseries` fields from several snapshots is itself a valid `WriteRequest`: a batch
//! is built by appending, and snappy-compressed whole when sent.

use std::ops::Range;
use std::time::UNIX_EPOCH;

use gpumon_core::{Snapshot, Telemetry};
use prost::encoding::encoded_len_varint;

use crate::prometheus::series::{walk, Family, Label as SeriesLabel, Owners, Scope, Series, Text, Visitor, Walk};
use crate::prometheus::RenderOptions;

/// `message WriteRequest { repeated TimeSeries timeseries = 1; reserved 2; repeated
/// MetricMetadata metadata = 3; }` (metadata is not sent).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    /// The series, each with its samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `message TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; }` — labels
/// sorted by name, `__name__` among them; samples in timestamp order.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// The series' labels, sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Its samples, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

impl TimeSeries {
    /// The value of the label `name` (`"__name__"`: the metric name), if the series has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|l| l.name == name).map(|l| l.value.as_str())
    }
}

/// `message Label { string name = 1; string value = 2; }`
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value (never empty: an empty value means "no such label").
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `message Sample { double value = 1; int64 timestamp = 2; }` — timestamp in milliseconds since
/// the Unix epoch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// The snapshot's time in milliseconds since the Unix epoch (every sample of one snapshot
/// carries it).
pub fn timestamp_millis(snapshot: &Snapshot) -> i64 {
    snapshot.taken_at.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Encodes snapshots as `timeseries` fields of a `WriteRequest`; keeps its buffers between calls.
/// The sink uses it; it is public for benchmarks and for embedders who send requests themselves.
#[derive(Debug)]
pub struct Encoder {
    opts: RenderOptions,
    /// Sorted by name.
    external: Vec<(String, String)>,
    /// Every device's label set, per snapshot.
    devices: Labels,
    /// Per device of the snapshot: where its label sets are in `devices`.
    sets: Vec<DeviceSet>,
    /// One series' own labels (and a device's while its set is built).
    own: Labels,
    /// The last series' `__name__` label.
    name: (Labels, &'static str),
}

/// One device's label sets, as ranges of [`Labels::labels`], each sorted by name.
#[derive(Debug, Clone)]
struct DeviceSet {
    /// Identity and owners: what every series of the device carries.
    all: Range<usize>,
    /// Identity only: what a process's series starts with (it adds its process's owner).
    identity: Range<usize>,
    /// `all` and the external labels it lacks: the whole label set of a device series with no
    /// label of its own but its name, which is most of them.
    whole: Range<usize>,
    /// Where `__name__` goes in `whole`.
    name_at: usize,
}

/// Labels encoded as `Label` fields (`TimeSeries` tag 1), back to back, with where each one's
/// field and name are. Encoding a label as soon as the walk yields it means nothing borrowed
/// from the walk outlives the call that yielded it, and sorting is a sort of these small
/// records by their encoded names.
///
/// The encoder keeps every device's label set in one of these, sorted by name, built once per
/// snapshot: most series are a device's and share its labels, so a series costs a merge of
/// those bytes with its own few labels (name, metric label) rather than a sort and an encoding
/// of all of them. (The text renderer keeps each device's labels escaped for the same reason.)
#[derive(Debug, Default)]
struct Labels {
    bytes: Vec<u8>,
    labels: Vec<EncodedLabel>,
}

#[derive(Debug, Clone)]
struct EncodedLabel {
    /// The whole field in `bytes`.
    field: Range<usize>,
    /// The label's name in `bytes`.
    name: Range<usize>,
    /// The name's first 8 bytes as a big-endian number (zero-padded): comparing these orders
    /// almost every pair of names without a `memcmp` call, which profiling showed dominated
    /// the merge.
    prefix: u64,
}

fn name_prefix(name: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = name.len().min(8);
    b[..n].copy_from_slice(&name[..n]);
    u64::from_be_bytes(b)
}

/// Byte-wise order of two names, as Prometheus sorts labels (upper case sorts before
/// `__name__`). Equal prefixes mean either the same short name or a tie in the first 8
/// bytes; names hold no NUL byte, so the zero padding orders a shorter name first, as
/// byte-wise order does.
fn name_order(a: (u64, &[u8]), b: (u64, &[u8])) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1))
}

/// Appends a varint: protobuf's base-128 encoding, inlined (prost's is not, and a series
/// writes a dozen of them).
#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The key byte of a length-delimited field with `tag` (< 16).
const fn ld_key(tag: u8) -> u8 {
    (tag << 3) | 2
}

impl Labels {
    fn clear(&mut self) {
        self.bytes.clear();
        self.labels.clear();
    }

    /// Encodes one label, unless its value is empty: an empty value is "no label" in
    /// Prometheus, and receivers reject it on the wire.
    fn push(&mut self, (k, v): SeriesLabel<'_>) {
        if v.is_empty() {
            return;
        }
        let mut digits = itoa::Buffer::new();
        let (a, b) = v.parts(&mut digits);
        let at = self.bytes.len();
        let value_len = a.len() + b.len();
        let body = string_field_len(1, k.len()) + string_field_len(1, value_len);
        self.bytes.reserve(body + 4);
        // The field's key and length and the name's key and length, in one copy.
        let mut head = [0u8; 22];
        head[0] = ld_key(1);
        let mut n = 1 + varint_into(&mut head[1..], body as u64);
        head[n] = ld_key(1);
        n += 1 + varint_into(&mut head[n + 1..], k.len() as u64);
        self.bytes.extend_from_slice(&head[..n]);
        let name = self.bytes.len()..self.bytes.len() + k.len();
        self.bytes.extend_from_slice(k.as_bytes());
        put_string(&mut self.bytes, 2, a, b);
        let prefix = name_prefix(k.as_bytes());
        self.labels.push(EncodedLabel { field: at..self.bytes.len(), name, prefix });
    }

    fn name(&self, l: &EncodedLabel) -> &[u8] {
        &self.bytes[l.name.clone()]
    }

    fn key<'b>(&'b self, l: &EncodedLabel) -> (u64, &'b [u8]) {
        (l.prefix, self.name(l))
    }

    fn has(&self, labels: &[EncodedLabel], name: &str) -> bool {
        labels.iter().any(|l| self.name(l) == name.as_bytes())
    }

    /// Sorts the labels byte-wise by name, as Prometheus does (upper case sorts before
    /// `__name__`).
    fn sort(&mut self) {
        let bytes = &self.bytes;
        self.labels.sort_unstable_by(|a, b| {
            name_order((a.prefix, &bytes[a.name.clone()]), (b.prefix, &bytes[b.name.clone()]))
        });
    }

    /// Appends `from`'s labels in their order, back to back; returns their range in `labels`.
    fn append(&mut self, from: &Labels) -> Range<usize> {
        let start = self.labels.len();
        for l in &from.labels {
            // The same field at `at` here instead of at `l.field.start` there.
            let at = self.bytes.len();
            let moved = |r: &Range<usize>| r.start - l.field.start + at..r.end - l.field.start + at;
            self.labels.push(EncodedLabel { field: moved(&l.field), name: moved(&l.name), prefix: l.prefix });
            self.bytes.extend_from_slice(&from.bytes[l.field.clone()]);
        }
        start..self.labels.len()
    }

    /// Where consecutive labels of one [`Self::append`] lie in `bytes`.
    fn run(&self, labels: &[EncodedLabel]) -> Range<usize> {
        match (labels.first(), labels.last()) {
            (Some(first), Some(last)) => first.field.start..last.field.end,
            _ => 0..0,
        }
    }
}

fn string_field_len(tag_len: usize, len: usize) -> usize {
    tag_len + encoded_len_varint(len as u64) + len
}

fn put_string(out: &mut Vec<u8>, tag: u8, a: &str, b: &str) {
    out.push(ld_key(tag));
    put_varint(out, (a.len() + b.len()) as u64);
    out.extend_from_slice(a.as_bytes());
    if !b.is_empty() {
        out.extend_from_slice(b.as_bytes());
    }
}

/// Appends one `timeseries` field (tag 1) holding `labels` (sorted, non-empty values) and one
/// sample: [`put_series`] without device labels (the tests' reference).
#[cfg(test)]
fn put_labels(out: &mut Vec<u8>, labels: &[SeriesLabel<'_>], value: f64, timestamp_ms: i64) {
    let mut own = Labels::default();
    labels.iter().for_each(|l| own.push(*l));
    put_series(out, &Labels::default(), &[], &own, value, timestamp_ms);
}

/// Appends one `timeseries` field (tag 1): `labels` (encoded `Label` fields, in order) and one
/// sample.
fn put_sample(out: &mut Vec<u8>, labels: &[&[u8]], value: f64, timestamp_ms: i64) {
    let sample_len = 1 + 8 + 1 + encoded_len_varint(timestamp_ms as u64);
    let labels_len: usize = labels.iter().map(|l| l.len()).sum();
    let series_len = labels_len + 1 + encoded_len_varint(sample_len as u64) + sample_len;
    out.push(ld_key(1));
    put_varint(out, series_len as u64);
    labels.iter().for_each(|l| out.extend_from_slice(l));
    finish_sample(out, sample_len, value, timestamp_ms);
}

/// The `samples` field of a `TimeSeries` (one sample), assembled on the stack and appended in
/// one copy (byte-by-byte pushes showed in the profile).
fn finish_sample(out: &mut Vec<u8>, sample_len: usize, value: f64, timestamp_ms: i64) {
    let mut b = [0u8; 32];
    b[0] = ld_key(2);
    let mut n = 1 + varint_into(&mut b[1..], sample_len as u64);
    // `double value = 1` (fixed 64-bit: wire type 1), `int64 timestamp = 2` (varint: 0).
    b[n] = (1 << 3) | 1;
    b[n + 1..n + 9].copy_from_slice(&value.to_le_bytes());
    b[n + 9] = 2 << 3;
    n += 10;
    // int64 is written as the two's-complement varint of the u64 (protobuf's rule).
    n += varint_into(&mut b[n..], timestamp_ms as u64);
    out.extend_from_slice(&b[..n]);
}

/// Writes a varint at the start of `b` (room for 10 bytes); returns its length.
#[inline]
fn varint_into(b: &mut [u8], mut v: u64) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        b[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    b[i] = v as u8;
    i + 1
}

/// Appends one `timeseries` field (tag 1) with the labels `shared` (consecutive labels of
/// `devices`, sorted) and `own` (sorted), merged by name, and one sample.
fn put_series(
    out: &mut Vec<u8>,
    devices: &Labels,
    shared: &[EncodedLabel],
    own: &Labels,
    value: f64,
    timestamp_ms: i64,
) {
    let sample_len = 1 + 8 + 1 + encoded_len_varint(timestamp_ms as u64);
    let labels_len = devices.run(shared).len() + own.labels.iter().map(|l| l.field.len()).sum::<usize>();
    let series_len = labels_len + 1 + encoded_len_varint(sample_len as u64) + sample_len;
    out.push(ld_key(1));
    put_varint(out, series_len as u64);
    // Shared labels lie back to back, so each stretch of them between two own labels is one
    // copy.
    let mut rest = shared;
    for l in &own.labels {
        let key = own.key(l);
        let split = rest.iter().position(|s| name_order(devices.key(s), key).is_gt()).unwrap_or(rest.len());
        out.extend_from_slice(&devices.bytes[devices.run(&rest[..split])]);
        rest = &rest[split..];
        out.extend_from_slice(&own.bytes[l.field.clone()]);
    }
    out.extend_from_slice(&devices.bytes[devices.run(rest)]);
    finish_sample(out, sample_len, value, timestamp_ms);
}

impl Encoder {
    /// The encoder a sink with `config` uses (naming, external labels).
    pub fn from_config(config: &super::RemoteWriteConfig) -> Self {
        let opts = RenderOptions {
            naming: config.naming,
            dcgm_lowercase_hostname: config.dcgm_lowercase_hostname,
            ..RenderOptions::default()
        };
        Self::new(opts, config.external_labels.clone())
    }

    /// Appends every series of `snapshot` (as the scrape endpoint shows it without an agent's
    /// self-metrics) to `out`; returns the number of samples. `out` is then a valid, uncompressed
    /// `WriteRequest` (see [`compress`]).
    pub fn encode_snapshot(&mut self, snapshot: &Snapshot, out: &mut Vec<u8>) -> usize {
        self.encode(snapshot, None, out)
    }

    pub(crate) fn new(opts: RenderOptions, external: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut external: Vec<(String, String)> = external.into_iter().collect();
        external.sort();
        Self {
            opts,
            external,
            devices: Labels::default(),
            sets: Vec::new(),
            own: Labels::default(),
            name: (Labels::default(), ""),
        }
    }

    /// Appends every series the scrape endpoint would show for `snapshot` (and `telemetry`'s
    /// self-metrics) as `timeseries` fields, each with one sample at the snapshot's time; returns
    /// the number of samples.
    pub(crate) fn encode(&mut self, snapshot: &Snapshot, telemetry: Option<&Telemetry>, out: &mut Vec<u8>) -> usize {
        self.devices.clear();
        self.sets.clear();
        let mut series = SeriesEncoder {
            out,
            external: &self.external,
            devices: &mut self.devices,
            sets: &mut self.sets,
            own: &mut self.own,
            name: &mut self.name,
            timestamp_ms: timestamp_millis(snapshot),
            n: 0,
        };
        walk(Some(snapshot), telemetry, &self.opts, &mut series);
        series.n
    }
}

/// The series layer's walk, written as `timeseries` fields: no text in between.
struct SeriesEncoder<'e> {
    out: &'e mut Vec<u8>,
    /// Sorted by name.
    external: &'e [(String, String)],
    /// This snapshot's device label sets, built at its first device series.
    devices: &'e mut Labels,
    /// Ranges of `devices.labels` per device (see [`Encoder`]).
    sets: &'e mut Vec<DeviceSet>,
    own: &'e mut Labels,
    /// The `__name__` label of the series before, encoded: a family's series share it.
    name: &'e mut (Labels, &'static str),
    timestamp_ms: i64,
    n: usize,
}

/// The `__name__` label of `name` in `cache` (encoded once per family: the series of a family
/// come one after the other).
fn name_label<'c>(cache: &'c mut (Labels, &'static str), name: &'static str) -> &'c Labels {
    let (labels, of) = cache;
    if !std::ptr::eq(*of, name) {
        labels.clear();
        labels.push(("__name__", Text::Str(name)));
        *of = name;
    }
    labels
}

impl SeriesEncoder<'_> {
    /// Fills [`Self::devices`] once per walk.
    fn device_labels(&mut self, walk: &Walk<'_>) {
        let n = walk.device_count();
        if !self.sets.is_empty() || n == 0 {
            return;
        }
        let own = &mut *self.own;
        for index in 0..n {
            own.clear();
            walk.device_labels(index, |l| own.push(l));
            own.sort();
            let identity = self.devices.append(own);
            let owners = walk.device_owners(index);
            let all = if owners.is_empty() {
                identity.clone()
            } else {
                walk.owner_labels(owners, |l| own.push(l));
                own.sort();
                self.devices.append(own)
            };
            // External labels never override a series' own label (Prometheus' rule).
            let before = own.labels.len();
            for (k, v) in self.external {
                if !own.has(&own.labels, k) {
                    own.push((k, Text::Str(v)));
                }
            }
            let whole = if own.labels.len() == before {
                all.clone()
            } else {
                own.sort();
                self.devices.append(own)
            };
            let name = (name_prefix(b"__name__"), &b"__name__"[..]);
            let name_at =
                own.labels.iter().position(|l| name_order(own.key(l), name).is_gt()).unwrap_or(own.labels.len());
            self.sets.push(DeviceSet { all, identity, whole, name_at });
        }
    }
}

impl Visitor for SeriesEncoder<'_> {
    fn family(&mut self, _: Family) {
        // Remote write 1.0 carries no family metadata: series only.
    }

    fn series(&mut self, walk: &Walk<'_>, s: &Series<'_>) {
        if let (Scope::Device { index, owners: Owners::Device }, []) = (s.scope, s.extra) {
            // Most series: the device's whole set, its name inserted where it sorts.
            self.device_labels(walk);
            let set = &self.sets[index];
            let whole = &self.devices.labels[set.whole.clone()];
            let (before, after) = whole.split_at(set.name_at);
            let name = &name_label(self.name, s.name).bytes;
            let (before, after) =
                (&self.devices.bytes[self.devices.run(before)], &self.devices.bytes[self.devices.run(after)]);
            put_sample(self.out, &[before, name, after], s.value.as_f64(), self.timestamp_ms);
            self.n += 1;
            return;
        }
        let shared = match s.scope {
            Scope::Device { index, owners } => {
                self.device_labels(walk);
                let DeviceSet { all, identity, .. } = self.sets[index].clone();
                self.own.clear();
                match owners {
                    Owners::Device => all,
                    Owners::Process(labels) => {
                        walk.owner_labels(labels, |l| self.own.push(l));
                        identity
                    }
                }
            }
            Scope::Host => 0..0,
        };
        let own = &mut *self.own;
        match s.scope {
            Scope::Device { .. } => s.extra.iter().for_each(|l| own.push(*l)),
            Scope::Host => {
                own.clear();
                walk.labels(s, |l| own.push(l));
            }
        }
        own.append(name_label(self.name, s.name));
        let shared = &self.devices.labels[shared];
        for (k, v) in self.external {
            // External labels never override a series' own label (Prometheus' rule).
            if !own.has(&own.labels, k) && !self.devices.has(shared, k) {
                own.push((k, Text::Str(v)));
            }
        }
        own.sort();
        put_series(self.out, self.devices, shared, own, s.value.as_f64(), self.timestamp_ms);
        self.n += 1;
    }
}

/// Snappy *block* format (not the framed format), as the spec requires.
///
/// # Errors
/// Only for a body over snappy's block limit (about 4 GiB).
pub fn compress(body: &[u8]) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Encoder::new().compress_vec(body)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use gpumon_core::{DeviceInfo, DeviceSample, SystemInfo};
    use prost::Message as _;

    use super::*;
    use crate::prometheus::Naming;

    fn snapshot_at(ms: u64) -> Snapshot {
        let mut s = Snapshot::new(
            Arc::new(SystemInfo::new("node-1", "mock")),
            vec![DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-a", "A100")))],
        );
        s.taken_at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        s
    }

    fn decode(bytes: &[u8]) -> WriteRequest {
        WriteRequest::decode(bytes).unwrap()
    }

    fn pairs(ts: &TimeSeries) -> Vec<(&str, &str)> {
        ts.labels.iter().map(|l| (l.name.as_str(), l.value.as_str())).collect()
    }

    /// Golden: the `WriteRequest` of a one-GPU mock snapshot, decoded with prost.
    #[test]
    fn golden_decode_of_a_write_request() {
        let mut enc = Encoder::new(RenderOptions::default(), [("cluster".to_owned(), "eu-1".to_owned())]);
        let mut out = Vec::new();
        let n = enc.encode(&snapshot_at(1_700_000_000_123), None, &mut out);
        let req = decode(&out);
        assert_eq!(req.timeseries.len(), n);
        let up = req.timeseries.iter().find(|t| t.label("__name__") == Some("gpumon_up")).expect("gpumon_up");
        assert_eq!(
            pairs(up),
            [
                ("__name__", "gpumon_up"),
                ("backend", "mock"),
                ("cluster", "eu-1"),
                ("gpu", "0"),
                ("host", "node-1"),
                ("uuid", "GPU-a"),
            ]
        );
        assert_eq!(up.samples, [Sample { value: 1.0, timestamp: 1_700_000_000_123 }]);
        for ts in &req.timeseries {
            let names: Vec<&str> = ts.labels.iter().map(|l| l.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(names, sorted, "labels sorted and unique");
            assert!(ts.labels.iter().all(|l| !l.value.is_empty()));
            assert_eq!(ts.samples.len(), 1);
            assert_eq!(ts.samples[0].timestamp, 1_700_000_000_123);
        }
        // The snapshot-time self-metric is the snapshot's own time, in seconds.
        let t = req
            .timeseries
            .iter()
            .find(|t| t.labels[0].value == "gpumon_last_sample_timestamp_seconds")
            .expect("self-metric");
        assert_eq!(t.samples[0].value, 1_700_000_000.123);
    }

    #[test]
    fn a_replay_of_the_mock_is_labelled_replayed_and_recorded_on_the_mock_on_every_series() {
        let mut enc = Encoder::new(RenderOptions::default(), []);
        let mut snap = snapshot_at(1_700_000_000_123);
        let mut system = SystemInfo::new("node-1", "replay");
        system.recorded_backend = Some("mock".into());
        snap.system = Arc::new(system);
        let mut out = Vec::new();
        let n = enc.encode(&snap, None, &mut out);
        let req = decode(&out);
        assert!(n > 0 && req.timeseries.len() == n);
        for ts in &req.timeseries {
            assert_eq!(ts.label("backend"), Some("replay"), "{:?}", pairs(ts));
            assert_eq!(ts.label("recorded_backend"), Some("mock"), "{:?}", pairs(ts));
            let names: Vec<&str> = ts.labels.iter().map(|l| l.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort_unstable();
            assert_eq!(names, sorted, "labels sorted");
        }
    }

    #[test]
    fn a_failed_sample_pushes_up_0_for_the_host_only() {
        let mut failed = Snapshot::sampling_failed(Arc::new(SystemInfo::new("node-1", "nvml")), "no driver");
        failed.taken_at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut enc = Encoder::new(RenderOptions::default(), []);
        let mut out = Vec::new();
        assert_eq!(enc.encode_snapshot(&failed, &mut out), 1);
        let req = decode(&out);
        assert_eq!(pairs(&req.timeseries[0]), [("__name__", "gpumon_up"), ("host", "node-1")]);
        assert_eq!(req.timeseries[0].samples, [Sample { value: 0.0, timestamp: 1_700_000_000_123 }]);
    }

    #[test]
    fn dcgm_naming_sorts_upper_case_first_and_external_labels_do_not_override() {
        let opts = RenderOptions { naming: Naming::Dcgm, ..RenderOptions::default() };
        let mut enc = Encoder::new(opts, [("Hostname".to_owned(), "other".to_owned())]);
        let mut out = Vec::new();
        enc.encode(&snapshot_at(5), None, &mut out);
        let req = decode(&out);
        let ts = &req.timeseries[1];
        let p = pairs(ts);
        assert!(p.iter().any(|&(k, v)| k == "Hostname" && v == "node-1"), "{p:?}");
        assert_eq!(p.iter().filter(|(k, _)| *k == "Hostname").count(), 1);
        let name_at = p.iter().position(|(k, _)| *k == "__name__").unwrap();
        assert!(p[..name_at].iter().all(|(k, _)| k.as_bytes()[0].is_ascii_uppercase()), "{p:?}");
    }

    #[test]
    fn concatenated_snapshots_are_one_request_and_snappy_round_trips() {
        let mut enc = Encoder::new(RenderOptions::default(), []);
        let mut out = Vec::new();
        let a = enc.encode(&snapshot_at(1000), None, &mut out);
        let b = enc.encode(&snapshot_at(2000), None, &mut out);
        let compressed = compress(&out).unwrap();
        assert!(compressed.len() < out.len());
        let raw = snap::raw::Decoder::new().decompress_vec(&compressed).unwrap();
        assert_eq!(raw, out);
        let req = decode(&raw);
        assert_eq!(req.timeseries.len(), a + b);
        assert_eq!(req.timeseries[0].samples[0].timestamp, 1000);
        assert_eq!(req.timeseries[a].samples[0].timestamp, 2000);
    }

    /// The buffers are kept from one snapshot to the next: a steady stream of snapshots encodes
    /// without allocating.
    #[test]
    fn buffers_are_kept_between_snapshots() {
        let mut enc = Encoder::new(RenderOptions::default(), []);
        assert!(enc.encode(&snapshot_at(1), None, &mut Vec::new()) > 0);
        let at =
            |e: &Encoder| (e.devices.bytes.as_ptr(), e.devices.labels.as_ptr(), e.sets.as_ptr(), e.own.bytes.as_ptr());
        let before = at(&enc);
        assert!(!enc.devices.labels.is_empty(), "the device's labels were encoded once");
        assert!(enc.encode(&snapshot_at(2), None, &mut Vec::new()) > 0);
        assert_eq!(at(&enc), before);
    }

    #[test]
    fn direct_encoding_equals_prost_encoding() {
        // Text, a number and a prefixed number: each label value kind the series layer yields.
        let labels = [
            ("__name__", Text::Str("m")),
            ("a", Text::Str("ü\"x")),
            ("gpu", Text::Int(17)),
            ("device", Text::Prefixed("nvidia", 3)),
        ];
        let strings = [("__name__", "m"), ("a", "ü\"x"), ("gpu", "17"), ("device", "nvidia3")];
        for (value, ts) in [(1.5, 1_700_000_000_000i64), (f64::NAN, 0), (-0.0, -1)] {
            let mut direct = Vec::new();
            put_labels(&mut direct, &labels, value, ts);
            let msg = WriteRequest {
                timeseries: vec![TimeSeries {
                    labels: strings.iter().map(|(k, v)| Label { name: (*k).into(), value: (*v).into() }).collect(),
                    samples: vec![Sample { value, timestamp: ts }],
                }],
            };
            // prost leaves out default values (0.0, 0) that the direct encoder writes; both decode
            // to the same message.
            let back = decode(&direct);
            assert_eq!(back.timeseries[0].labels, msg.timeseries[0].labels);
            assert_eq!(back.timeseries[0].samples[0].timestamp, ts);
            assert_eq!(back.timeseries[0].samples[0].value.to_bits(), value.to_bits());
            if value != 0.0 && ts != 0 {
                assert_eq!(direct, msg.encode_to_vec());
            }
        }
    }
}

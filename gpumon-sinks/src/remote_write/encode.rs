//! The remote-write 1.0 wire format: the protobuf messages and a direct encoder.
//!
//! Messages from the specification (<https://prometheus.io/docs/specs/prw/remote_write_spec/>,
//! "Protocol"), which points at `prometheus/prompb/remote.proto` and `types.proto`; the field
//! numbers and types below are those of the spec. Fields a 1.0 sender does not use (exemplars,
//! native histograms, metadata) are left out: a decoder skips unknown fields and an encoder simply
//! does not write them. The prost structs are for decoding (tests, embedders); the hot path
//! writes the same bytes directly, without building a `TimeSeries` per series.
//!
//! A `WriteRequest` is nothing but repeated field 1 (`TimeSeries`), so the concatenation of
//! encoded `timeseries` fields from several snapshots is itself a valid `WriteRequest`: a batch
//! is built by appending, and snappy-compressed whole when sent.

use std::time::UNIX_EPOCH;

use gpumon_core::{Snapshot, Telemetry};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

use crate::prometheus::series::visit_series;
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
    text: String,
}

fn string_field_len(tag_len: usize, s: &str) -> usize {
    tag_len + encoded_len_varint(s.len() as u64) + s.len()
}

fn label_len(name: &str, value: &str) -> usize {
    string_field_len(1, name) + string_field_len(1, value)
}

fn put_string(out: &mut Vec<u8>, tag: u32, s: &str) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

/// Appends one `timeseries` field (tag 1) holding `labels` (sorted, non-empty values) and one
/// sample.
pub(crate) fn put_series(out: &mut Vec<u8>, labels: &[(&str, &str)], value: f64, timestamp_ms: i64) {
    let sample_len = 1 + 8 + 1 + encoded_len_varint(timestamp_ms as u64);
    let mut series_len = 1 + encoded_len_varint(sample_len as u64) + sample_len;
    for (k, v) in labels {
        let l = label_len(k, v);
        series_len += 1 + encoded_len_varint(l as u64) + l;
    }
    encode_key(1, WireType::LengthDelimited, out);
    encode_varint(series_len as u64, out);
    for (k, v) in labels {
        encode_key(1, WireType::LengthDelimited, out);
        encode_varint(label_len(k, v) as u64, out);
        put_string(out, 1, k);
        put_string(out, 2, v);
    }
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(sample_len as u64, out);
    encode_key(1, WireType::SixtyFourBit, out);
    out.extend_from_slice(&value.to_le_bytes());
    encode_key(2, WireType::Varint, out);
    // int64 is written as the two's-complement varint of the u64 (protobuf's rule).
    encode_varint(timestamp_ms as u64, out);
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
        Self { opts, external, text: String::new() }
    }

    /// Appends every series the scrape endpoint would show for `snapshot` (and `telemetry`'s
    /// self-metrics) as `timeseries` fields, each with one sample at the snapshot's time; returns
    /// the number of samples.
    pub(crate) fn encode(&mut self, snapshot: &Snapshot, telemetry: Option<&Telemetry>, out: &mut Vec<u8>) -> usize {
        let ts = timestamp_millis(snapshot);
        let external = &self.external;
        let mut n = 0;
        // One allocation for every series: each series' borrowed labels live in it in turn (the
        // empty vector is handed from one lifetime to the next; `collect` reuses its storage).
        let mut spare: Vec<(&'static str, &'static str)> = Vec::with_capacity(24);
        visit_series(&mut self.text, snapshot, telemetry, &self.opts, |s| {
            let mut labels: Vec<(&str, &str)> = std::mem::take(&mut spare).into_iter().map(|_| ("", "")).collect();
            labels.push(("__name__", s.name));
            // An empty value is "no label" in Prometheus; receivers reject it on the wire.
            labels.extend(s.labels.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (*k, v.as_ref())));
            for (k, v) in external {
                // External labels never override a series' own label (Prometheus' rule).
                if !labels.iter().any(|(have, _)| have == k) {
                    labels.push((k, v));
                }
            }
            // Byte-wise order, as Prometheus sorts (upper case sorts before `__name__`).
            labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
            put_series(out, &labels, s.value, ts);
            n += 1;
            labels.clear();
            spare = labels.into_iter().map(|_| ("", "")).collect();
        });
        n
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
        let up = req
            .timeseries
            .iter()
            .find(|t| t.labels.iter().any(|l| l.name == "__name__" && l.value == "gpumon_up"))
            .expect("gpumon_up");
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

    #[test]
    fn direct_encoding_equals_prost_encoding() {
        let labels = [("__name__", "m"), ("a", "ü\"x")];
        for (value, ts) in [(1.5, 1_700_000_000_000i64), (f64::NAN, 0), (-0.0, -1)] {
            let mut direct = Vec::new();
            put_series(&mut direct, &labels, value, ts);
            let msg = WriteRequest {
                timeseries: vec![TimeSeries {
                    labels: labels.iter().map(|(k, v)| Label { name: (*k).into(), value: (*v).into() }).collect(),
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

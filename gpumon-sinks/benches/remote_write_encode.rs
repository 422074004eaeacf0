//! Remote-write cost per 8-GPU snapshot, in one run: the series layer's direct encoding
//! (`encode`) against the path it replaced (`encode_via_text`: render the exposition text, parse
//! it back, encode; gpumon before issue #27), and the scrape endpoint's render of the same
//! snapshot.
//!
//! `cargo bench -p gpumon-sinks --features remote-write --bench remote_write_encode`
//!
//! Prints the bytes on the wire first: the exposition text a scrape transfers (uncompressed), the
//! protobuf `WriteRequest`, and the snappy-compressed request body remote write sends; and checks
//! that both paths produce the same bytes, so that the two figures compare the same work.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon_core::{SampleRequest, Sampler, Snapshot};
use gpumon_sinks::prometheus::{Format, PrometheusHandle, PrometheusSink};
use gpumon_sinks::remote_write::encode::{compress, timestamp_millis, Encoder};
use gpumon_sinks::remote_write::RemoteWriteConfig;

fn snapshot() -> Arc<Snapshot> {
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    Arc::new(sampler.sample(&SampleRequest::default()).unwrap())
}

// The old exposition parser, shared with the unit tests (their oracle).
#[path = "../tests/prometheus_support/exposition.rs"]
mod exposition;

/// The encoder as it was before the series layer (`prometheus/series.rs`' `visit_series` and
/// `remote_write/encode.rs`' `Encoder::encode` at def79bc), kept here only to measure against:
/// render the exposition into a reused `String`, parse every sample line back into borrowed
/// labels ([`exposition::parse_sample_line`]), then sort and write each series as the encoder
/// still does.
mod via_text {
    use std::borrow::Cow;

    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

    pub struct OldEncoder {
        pub text: String,
    }

    impl OldEncoder {
        pub fn encode(&mut self, handle: &super::PrometheusHandle, timestamp_ms: i64, out: &mut Vec<u8>) -> usize {
            self.text.clear();
            handle.render_to(&mut self.text, super::Format::Text);
            let mut n = 0;
            // As the old code: one label buffer for every series, handed from one lifetime to
            // the next through an empty `collect` (no external labels in this configuration).
            let mut spare: Vec<(&'static str, &'static str)> = Vec::with_capacity(24);
            let mut parsed: Vec<(&str, Cow<'_, str>)> = Vec::with_capacity(16);
            for line in self.text.lines() {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                parsed.clear();
                let Some((name, value)) = super::exposition::parse_sample_line(line, &mut parsed) else { continue };
                let mut labels: Vec<(&str, &str)> = std::mem::take(&mut spare).into_iter().map(|_| ("", "")).collect();
                labels.push(("__name__", name));
                labels.extend(parsed.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (*k, v.as_ref())));
                labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
                put_series(out, &labels, value, timestamp_ms);
                n += 1;
                labels.clear();
                spare = labels.into_iter().map(|_| ("", "")).collect();
            }
            n
        }
    }

    fn label_len(name: &str, value: &str) -> usize {
        1 + encoded_len_varint(name.len() as u64)
            + name.len()
            + 1
            + encoded_len_varint(value.len() as u64)
            + value.len()
    }

    fn put_string(out: &mut Vec<u8>, tag: u32, s: &str) {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(s.len() as u64, out);
        out.extend_from_slice(s.as_bytes());
    }

    fn put_series(out: &mut Vec<u8>, labels: &[(&str, &str)], value: f64, timestamp_ms: i64) {
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
        encode_varint(timestamp_ms as u64, out);
    }
}

fn bench(c: &mut Criterion) {
    let snap = snapshot();
    let sink = PrometheusSink::builder().build().unwrap();
    let handle = sink.handle();
    handle.store(snap.clone());
    let config = RemoteWriteConfig::new("http://127.0.0.1:9090/api/v1/write");
    let mut encoder = Encoder::from_config(&config);
    let mut old = via_text::OldEncoder { text: String::new() };
    let ts = timestamp_millis(&snap);

    let text = handle.render(Format::Text);
    let mut body = Vec::new();
    let samples = encoder.encode_snapshot(&snap, &mut body);
    let mut old_body = Vec::new();
    assert_eq!(old.encode(&handle, ts, &mut old_body), samples);
    assert!(old_body == body, "the two paths must encode the same request");
    let wire = compress(&body).unwrap();
    eprintln!(
        "8-GPU snapshot (h100x8): {samples} series; scrape text {} B; WriteRequest {} B; snappy {} B ({:.1} B/sample)",
        text.len(),
        body.len(),
        wire.len(),
        wire.len() as f64 / samples as f64
    );

    let mut g = c.benchmark_group("remote_write_8gpu");
    g.bench_function("scrape_render_text", |b| b.iter(|| black_box(handle.render(Format::Text))));
    g.bench_function("encode_via_text", |b| {
        b.iter(|| {
            old_body.clear();
            black_box(old.encode(&handle, ts, &mut old_body))
        })
    });
    g.bench_function("encode", |b| {
        b.iter(|| {
            body.clear();
            black_box(encoder.encode_snapshot(&snap, &mut body))
        })
    });
    g.bench_function("encode_via_text_and_compress", |b| {
        b.iter(|| {
            old_body.clear();
            old.encode(&handle, ts, &mut old_body);
            black_box(compress(&old_body).unwrap())
        })
    });
    g.bench_function("encode_and_compress", |b| {
        b.iter(|| {
            body.clear();
            encoder.encode_snapshot(&snap, &mut body);
            black_box(compress(&body).unwrap())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Sink tests against the scripted loopback server (no real receiver; those are in
//! `gpumon-sinks/tests/remote_write_backends.rs`).

use std::sync::Arc;
use std::time::Duration;

use gpumon_core::{DeviceInfo, DeviceSample, Sink, Snapshot, SystemInfo};
use prost::Message as _;

use super::encode::{Encoder, WriteRequest};
use super::*;
use crate::http::test_server::{Reply, TestServer};
use crate::prometheus::RenderOptions;

/// One GPU reporting only `up`, at `ms`.
fn snapshot(ms: u64) -> Arc<Snapshot> {
    let device = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-x", "X")));
    let mut s = Snapshot::new(Arc::new(SystemInfo::new("h", "mock")), vec![device]);
    s.taken_at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    Arc::new(s)
}

/// Samples in one `snapshot()`.
fn per_snapshot() -> usize {
    let mut enc = Encoder::new(RenderOptions::default(), []);
    enc.encode(&snapshot(1), None, &mut Vec::new())
}

fn config(url: &str) -> RemoteWriteConfig {
    let mut c = RemoteWriteConfig::new(format!("{url}/api/v1/write"));
    c.batch_interval = Duration::from_secs(600); // only flush (or batch_samples) seals
    c.retry_initial = Duration::from_millis(10);
    c.retry_max = Duration::from_millis(50);
    c
}

/// A receiver answering `reply`, and a sink writing to it with [`config`] as `set` changes it.
async fn sink_to(reply: Reply, set: impl FnOnce(&mut RemoteWriteConfig)) -> (TestServer, RemoteWriteSink) {
    let server = TestServer::start(reply).await;
    let mut c = config(&server.url);
    set(&mut c);
    (server, RemoteWriteSink::from_config(&c).unwrap())
}

fn decode_body(body: &[u8]) -> WriteRequest {
    let raw = snap::raw::Decoder::new().decompress_vec(body).expect("snappy block format");
    WriteRequest::decode(raw.as_slice()).expect("a WriteRequest")
}

#[tokio::test]
async fn posts_snappy_protobuf_with_the_required_headers_and_auth() {
    let (server, mut sink) = sink_to(Reply::status(204), |c| {
        c.bearer_token = Some("s3cret".into());
        c.headers.insert("X-Scope-OrgID".into(), "tenant-1".into());
        c.external_labels.insert("cluster".into(), "eu-1".into());
    })
    .await;
    sink.export(snapshot(1_000)).await.unwrap();
    sink.export(snapshot(2_000)).await.unwrap();
    sink.flush().await.unwrap();
    let received = server.received();
    assert_eq!(received.len(), 1, "two snapshots, one batch");
    let (head, body) = &received[0];
    assert!(head.starts_with("post /api/v1/write "), "{head}");
    for h in [
        "content-encoding: snappy",
        "content-type: application/x-protobuf",
        "x-prometheus-remote-write-version: 0.1.0",
        "authorization: bearer s3cret",
        "x-scope-orgid: tenant-1",
        "user-agent: gpumon/",
    ] {
        assert!(head.contains(h), "missing {h} in {head}");
    }
    let req = decode_body(body);
    let n = per_snapshot();
    assert_eq!(req.timeseries.len(), 2 * n);
    assert!(req.timeseries[..n].iter().all(|t| t.samples[0].timestamp == 1_000));
    assert!(req.timeseries[n..].iter().all(|t| t.samples[0].timestamp == 2_000));
    assert!(req.timeseries.iter().all(|t| t.labels.iter().any(|l| l.name == "cluster" && l.value == "eu-1")));
    let stats = sink.stats();
    assert_eq!((stats.samples_written, stats.batches_written, stats.requests), (2 * n as u64, 1, 1));
}

/// A healthcheck starts the writer; after `shutdown` it is refused.
#[tokio::test]
async fn healthcheck_after_shutdown_is_refused() {
    let (_server, mut sink) = sink_to(Reply::status(204), |_| {}).await;
    sink.healthcheck().await.unwrap();
    sink.shutdown().await.unwrap();
    assert!(matches!(sink.healthcheck().await, Err(gpumon_core::SinkError::AlreadyShutdown)));
}

#[tokio::test]
async fn batches_by_samples() {
    let n = per_snapshot();
    // Sealed after every second snapshot.
    let (server, mut sink) = sink_to(Reply::status(204), |c| c.batch_samples = 2 * n).await;
    for i in 0..4 {
        sink.export(snapshot(1000 * (i + 1))).await.unwrap();
    }
    server.wait_for_requests(2, Duration::from_secs(5), "two full batches are sent without a flush").await;
    let sizes: Vec<usize> = server.received().iter().map(|(_, b)| decode_body(b).timeseries.len()).collect();
    assert_eq!(sizes, [2 * n, 2 * n]);
}

#[tokio::test]
async fn batches_by_time() {
    let (server, mut sink) = sink_to(Reply::status(204), |c| c.batch_interval = Duration::from_millis(50)).await;
    sink.export(snapshot(1000)).await.unwrap();
    server.wait_for_requests(1, Duration::from_secs(5), "the open batch is sent after batch_interval").await;
}

/// An export that comes about a batch interval or more after the previous one is sealed at once: its
/// batch would wait out the interval alone and be sent alone anyway (the agent at 1 s with the
/// default 1 s interval). Faster exports are still batched.
#[tokio::test]
async fn exports_slower_than_the_batch_interval_are_sent_at_once() {
    let interval = Duration::from_secs(2);
    let (server, mut sink) = sink_to(Reply::status(204), |c| c.batch_interval = interval).await;
    sink.export(snapshot(1000)).await.unwrap();
    sink.export(snapshot(2000)).await.unwrap();
    sink.flush().await.unwrap();
    assert_eq!(server.requests(), 1, "back to back: one batch");
    tokio::time::sleep(interval).await;
    sink.export(snapshot(3000)).await.unwrap();
    server.wait_for_requests(2, Duration::from_millis(1500), "not sent at once: waiting out the interval").await;
    let sizes: Vec<usize> = server.received().iter().map(|(_, b)| decode_body(b).timeseries.len()).collect();
    assert_eq!(sizes, [2 * per_snapshot(), per_snapshot()]);
}

#[tokio::test]
async fn server_errors_are_retried_until_accepted() {
    let (server, mut sink) = sink_to(Reply::with(503, &[], "ingester unavailable"), |_| {}).await;
    sink.export(snapshot(1000)).await.unwrap();
    let e = sink.flush().await.unwrap_err().to_string();
    assert!(e.starts_with("transient") && e.contains("503") && e.contains("ingester unavailable"), "{e}");
    assert!(e.contains(&format!("({} samples buffered)", per_snapshot())), "{e}");
    server.set(Reply::status(204));
    sink.flush().await.unwrap();
    let received = server.received();
    assert!(received.len() >= 2);
    // The retry sends the same samples (same timestamps), once accepted.
    let first = decode_body(&received[0].1);
    let last = decode_body(&received.last().unwrap().1);
    assert_eq!(first, last);
    assert_eq!(sink.stats().samples_written, per_snapshot() as u64);
}

#[tokio::test]
async fn a_400_is_not_retried_and_its_message_is_kept() {
    let body = "out of order sample";
    let (server, mut sink) = sink_to(Reply::with(400, &[], body), |_| {}).await;
    sink.export(snapshot(1000)).await.unwrap();
    sink.flush().await.unwrap(); // refused and dropped: nothing left to send
                                 // Proves a retry does *not* happen: with retry_initial 10 ms and retry_max 50 ms, a retrying
                                 // writer would have sent again several times within 200 ms.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.requests(), 1, "no retry after a 400");
    let stats = sink.stats();
    assert_eq!(stats.samples_rejected, per_snapshot() as u64);
    assert_eq!(stats.samples_buffered, 0);
    let e = stats.last_error.unwrap();
    assert!(e.contains("HTTP 400") && e.contains("out of order sample"), "{e}");
    // The next batch goes out normally.
    server.set(Reply::status(204));
    sink.export(snapshot(2000)).await.unwrap_err(); // still reports the last failure
    sink.flush().await.unwrap();
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let (server, mut sink) = sink_to(Reply::with(429, &["Retry-After: 30"], "rate limited"), |_| {}).await;
    sink.export(snapshot(1000)).await.unwrap();
    assert!(sink.flush().await.unwrap_err().to_string().contains("429"));
    let e = sink.flush().await.unwrap_err().to_string();
    assert!(e.contains("Retry-After"), "{e}");
    // Proves the writer does *not* retry before the 30 s the server asked for: its own backoff
    // (at most 50 ms here) would have sent again several times within 200 ms.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_drops_are_counted_and_reported_to_the_agent() {
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    // Nothing listens there: every write fails.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut c = config(&format!("http://127.0.0.1:{port}"));
    let sample = gpumon_core::Sampler::sample(&sampler, &gpumon_core::SampleRequest::default()).unwrap();
    let per = Encoder::new(RenderOptions::default(), []).encode(&sample, None, &mut Vec::new());
    c.batch_samples = 10;
    c.buffer_max_samples = per + per / 2;
    let sink = RemoteWriteSink::from_config(&c).unwrap();
    let stats = sink.stats_handle();
    let agent = gpumon_core::Agent::builder(sampler).scheduled(false).sink(sink).spawn().unwrap();
    for _ in 0..4 {
        let _ = agent.flush(Duration::from_secs(5)).await;
    }
    let s = stats.stats();
    assert!(s.samples_dropped > 0 && s.samples_buffered as usize <= c.buffer_max_samples, "{s:?}");
    let status = agent.sink_status().into_iter().find(|s| s.name == "remote_write").unwrap();
    assert_eq!(status.dropped, s.samples_dropped, "{status:?}");
    let _ = agent.shutdown(Duration::from_secs(5)).await;
}

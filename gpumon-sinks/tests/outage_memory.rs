//! Memory comes back after an outage (#31 item 6): the InfluxDB sink's outage buffer fills while
//! its server is down (connections refused), the server comes back, the backlog drains, and the
//! process's RSS returns to within 20 % of what it was before the outage.
//!
//! Its own test binary, with one test, so that RSS (`VmRSS` of /proc/self/status) measures this
//! scenario alone. The server is a minimal HTTP/1.1 responder on 127.0.0.1 in this process that
//! reads and discards each request and answers 204 (what InfluxDB answers to a write); the
//! outage is real: the listener and its connections are closed, so the sink's writes fail with
//! "connection refused" and its keep-alive connection breaks, as when InfluxDB stops.
#![cfg(all(feature = "influxdb-http", target_os = "linux"))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler, Sink, Snapshot};
use gpumon_mock::MockSampler;
use gpumon_sinks::influxdb::{InfluxConfig, InfluxSink};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// One keep-alive connection: reads each request's head and body, discards them, answers 204.
async fn answer(mut stream: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    let mut head: Vec<u8> = Vec::with_capacity(4096);
    loop {
        // The head, up to the blank line (what follows in `head` is the body's start).
        let end = loop {
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        };
        let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
        let length: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let in_head = head.len() - end;
        if in_head >= length {
            head.drain(..end + length);
        } else {
            head.clear();
            let mut have = in_head;
            while have < length {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        have += n;
                        // Bytes past this body are the next request's start (not sent by reqwest,
                        // which does not pipeline, but kept all the same).
                        if have > length {
                            head.extend_from_slice(&buf[n - (have - length)..n]);
                        }
                    }
                }
            }
        }
        if stream.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").await.is_err() {
            return;
        }
    }
}

/// Serves on `addr` until aborted; aborting closes the listener and every connection.
async fn serve(addr: std::net::SocketAddr) -> JoinHandle<()> {
    let listener = TcpListener::bind(addr).await.expect("bind the stand-in server");
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            connections.spawn(answer(stream));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rss_returns_within_20_percent_after_an_outage_drains() {
    // A free port, then the server on it.
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let mut server = serve(addr).await;

    let mut config = InfluxConfig::v1(format!("http://{addr}"), "gpumon");
    config.retry_initial = Duration::from_millis(20);
    config.retry_max = Duration::from_millis(200);
    let mut sink = InfluxSink::from_config(&config).expect("build the sink");
    let stats = sink.stats_handle();

    // 60 distinct snapshots of an 8-GPU node, exported in turn: the agent's line protocol.
    let sampler = MockSampler::from_profile_name("h100x8").unwrap();
    let request = SampleRequest::new(MetricSet::default(), DeviceFilter::all());
    let snapshots: Vec<Arc<Snapshot>> = (0..60).map(|_| Arc::new(sampler.sample(&request).unwrap())).collect();
    let mut next = snapshots.iter().cycle();

    // Steady state with the server up: what the process holds in normal operation.
    for _ in 0..3 {
        for _ in 0..600 {
            sink.export(next.next().unwrap().clone()).await.expect("export while the server is up");
        }
        sink.flush().await.expect("flush while the server is up");
    }
    let before = rss_kib();

    // The outage: ~6.5 min of a 10 Hz agent (4 000 snapshots of 80 lines, ~100 MiB of line
    // protocol: what the default 128 MiB bound holds) buffered while writes are refused.
    server.abort();
    let _ = (&mut server).await;
    let outage = 4000;
    for _ in 0..outage {
        let _ = sink.export(next.next().unwrap().clone()).await; // Err: the write error, data kept
    }
    let held = stats.stats();
    assert_eq!(held.lines_dropped, 0, "the default bounds hold this outage: {held:?}");
    assert!(held.bytes_buffered > 20 << 20, "the outage should buffer tens of MiB: {held:?}");
    let peak = rss_kib();
    assert!(peak > before + (20 << 10), "RSS should grow with the buffer: {before} -> {peak} KiB");

    // The server comes back; the backlog drains.
    let server = serve(addr).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.flush().await.is_err() {
        assert!(Instant::now() < deadline, "the backlog did not drain: {:?}", stats.stats());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = stats.stats();
    assert_eq!(drained.lines_buffered, 0, "{drained:?}");
    assert_eq!(drained.lines_dropped, 0, "{drained:?}");

    // The memory is handed back off the writer's task (a blocking-pool call after the last
    // batch of the backlog is written): poll for it, bounded.
    let limit = before + before / 5;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = rss_kib();
    while after > limit && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = rss_kib();
    }
    assert!(
        after <= limit,
        "RSS after the drain must be within 20 % of before the outage: before {before} KiB, \
         peak {peak} KiB, after {after} KiB (limit {limit} KiB)"
    );
    eprintln!("RSS before {before} KiB, peak {peak} KiB, after the drain {after} KiB");
    sink.shutdown().await.unwrap();
    server.abort();
}

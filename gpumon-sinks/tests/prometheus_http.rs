//! The scrape endpoint over real loopback sockets: endpoints, auth, TLS and hostile clients.
//! Needs no external server.
#![cfg(feature = "prometheus-http")]

#[path = "prometheus_support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumon_core::{Agent, Sink};
use gpumon_sinks::prometheus::{Auth, Format, PrometheusSink, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
use support::{eventually, test_snapshot, TestSampler};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

fn client() -> reqwest::Client {
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap()
}

/// Writes `request` and reads until the server closes or `timeout` passes; returns what came back.
async fn raw(addr: SocketAddr, request: &[u8], timeout: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(timeout, s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_serves_metrics_health_and_errors() {
    let sink = PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0)).build().unwrap();
    let addr = sink.local_addr().unwrap();
    let sampler = Arc::new(TestSampler::default());
    let agent = Agent::builder_arc(sampler.clone()).interval(Duration::from_millis(100)).sink(sink).spawn().unwrap();
    let http = client();
    let url = format!("http://{addr}");

    eventually(Duration::from_secs(5), "/health 200", || async {
        let r = http.get(format!("{url}/health")).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;

    // Liveness: the process serves.
    let r = http.get(format!("{url}/live")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "live\n");

    // Text format by default.
    let r = http.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], TEXT_CONTENT_TYPE);
    let text = r.text().await.unwrap();
    assert!(text.contains("\ngpumon_utilization_ratio{gpu=\"0\",uuid=\"GPU-00000000-aaaa-bbbb-cccc-000000000000\",host=\"gpumon-test-host\"} 0.25\n"), "{text}");
    assert!(text.contains("gpumon_sink_exported_total{host=\"gpumon-test-host\",sink=\"prometheus\"}"), "{text}");
    assert!(text.contains("gpumon_last_sample_success{host=\"gpumon-test-host\"} 1\n"));
    assert!(!text.contains("# EOF"));

    // OpenMetrics when the scraper prefers it (as Prometheus does).
    let r = http.get(format!("{url}/metrics")).header("accept", PROMETHEUS_ACCEPT).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], OPENMETRICS_CONTENT_TYPE);
    assert!(r.text().await.unwrap().ends_with("# EOF\n"));

    // HEAD: headers only.
    let r = http.head(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap().is_empty());

    // 404, 405.
    assert_eq!(http.get(format!("{url}/")).send().await.unwrap().status(), 404);
    assert_eq!(http.get(format!("{url}/metrics/x")).send().await.unwrap().status(), 404);
    let r = http.post(format!("{url}/metrics")).body("x").send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    assert_eq!(http.delete(format!("{url}/health")).send().await.unwrap().status(), 405);

    // Failing samples: /health 503 with the reason; the success gauge drops to 0.
    sampler.fail.store(true, Ordering::Relaxed);
    let body = eventually(Duration::from_secs(5), "/health 503", || async {
        let r = http.get(format!("{url}/health")).send().await.ok()?;
        if r.status() == 503 {
            r.text().await.ok()
        } else {
            None
        }
    })
    .await;
    assert!(body.contains("injected failure"), "{body}");
    // Readiness stays 503 as long as sampling fails (several more ticks), while liveness stays
    // 200: an orchestrator must not restart an agent that waits for its backend.
    let failures = agent.stats().sample_failures;
    eventually(Duration::from_secs(5), "three more failed samples", || async {
        (agent.stats().sample_failures >= failures + 3).then_some(())
    })
    .await;
    assert_eq!(http.get(format!("{url}/health")).send().await.unwrap().status(), 503);
    let r = http.get(format!("{url}/live")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "live\n");
    assert_eq!(http.head(format!("{url}/live")).send().await.unwrap().status(), 200);
    assert_eq!(http.post(format!("{url}/live")).body("x").send().await.unwrap().status(), 405);
    let text = http.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("gpumon_last_sample_success{host=\"gpumon-test-host\"} 0\n"), "{text}");
    assert!(!text.contains("gpumon_sample_failures_total{host=\"gpumon-test-host\"} 0\n"));
    sampler.fail.store(false, Ordering::Relaxed);
    eventually(Duration::from_secs(5), "/health 200 again", || async {
        let r = http.get(format!("{url}/health")).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;

    // Shutting the agent down shuts the listener.
    agent.shutdown(Duration::from_secs(5)).await.unwrap();
    eventually(Duration::from_secs(5), "listener closed", || async {
        TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_and_basic_auth() {
    let http = client();
    for (auth, good, bad) in [
        (Auth::bearer("s3cret-token"), "Bearer s3cret-token", "Bearer s3cret-tokeN"),
        (Auth::basic("prom", "pa:ss"), "Basic cHJvbTpwYTpzcw==", "Basic cHJvbTpwYTpzeA=="),
    ] {
        let mut sink =
            PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0)).with_auth(auth.clone()).build().unwrap();
        sink.export(Arc::new(test_snapshot(1))).await.unwrap();
        let url = format!("http://{}/metrics", sink.local_addr().unwrap());

        let r = http.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 401);
        let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(
            challenge.starts_with(if matches!(auth, Auth::Bearer { .. }) { "Bearer " } else { "Basic " }),
            "{challenge}"
        );
        assert_eq!(http.get(&url).header("authorization", bad).send().await.unwrap().status(), 401);
        let r = http.get(&url).header("authorization", good).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("gpumon_up{"));
        // Probes need no credentials.
        let health = url.replace("/metrics", "/health");
        assert_eq!(http.get(&health).send().await.unwrap().status(), 200);
        sink.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_do_not_starve_scrapers() {
    // A long header timeout: the scraper must get through because idle connections are evicted,
    // not because they time out.
    let mut sink = PrometheusSink::builder()
        .with_http_listener(([127, 0, 0, 1], 0))
        .max_connections(8)
        .header_read_timeout(Duration::from_secs(30))
        .max_header_bytes(8192)
        .build()
        .unwrap();
    sink.export(Arc::new(test_snapshot(1))).await.unwrap();
    let addr = sink.local_addr().unwrap();
    let http = client();
    let url = format!("http://{addr}/metrics");
    let scrape_ok = |http: reqwest::Client, url: String, stage: &'static str| async move {
        let r = http.get(&url).send().await.unwrap_or_else(|e| panic!("{stage}: {e:?}"));
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("gpumon_up{"));
    };

    // 1. Oversized request head: 431, and the next client is served.
    let mut big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 64 * 1024));
    big.extend_from_slice(b"\r\n\r\n");
    let reply = raw(addr, &big, Duration::from_secs(5)).await;
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply:.200}");
    let mut many = b"GET /metrics HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..500 {
        many.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let reply = raw(addr, &many, Duration::from_secs(5)).await;
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply:.200}");
    scrape_ok(http.clone(), url.clone(), "after oversized heads").await;

    // 2. Garbage: 400 or a closed connection, never a dead server.
    for garbage in [
        &b"\x00\xff\xfe GARBAGE \x01\x02\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"GET /metrics HTTP/9.9\r\n\r\n",
    ] {
        let reply = raw(addr, garbage, Duration::from_secs(5)).await;
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 4") || reply.starts_with("HTTP/1.1 505"),
            "{reply:.200}"
        );
    }
    scrape_ok(http.clone(), url.clone(), "after garbage").await;

    // 3. A crowd of idle connections and slow-loris clients (far more than max_connections).
    let mut idle = Vec::new();
    for i in 0..120 {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            if i % 2 == 0 {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: slow").await;
            }
            idle.push(s);
        }
    }
    // Wait until the server has taken the crowd in: each connection it accepts beyond its 8
    // slots evicts (closes) the oldest idle one, in accept order, so once all but the last 8
    // are closed the crowd holds every slot.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let in_place = idle.len().saturating_sub(8);
    for (i, s) in idle.iter_mut().take(in_place).enumerate() {
        let mut buf = [0u8; 512];
        loop {
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Err(_) => panic!("idle connection {i} of {} was never evicted", idle.len()),
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => {} // whatever the server said before closing it
            }
        }
    }
    for _ in 0..5 {
        let started = Instant::now();
        scrape_ok(http.clone(), url.clone(), "kept-alive scraper among idle crowd").await;
        assert!(started.elapsed() < Duration::from_secs(3), "scrape took {:?}", started.elapsed());
    }
    // And a fresh client (new connection each time) too.
    for _ in 0..3 {
        #[cfg(feature = "tls")]
        gpumon_sinks::tls::install_crypto_provider();
        let fresh =
            reqwest::Client::builder().timeout(Duration::from_secs(5)).pool_max_idle_per_host(0).build().unwrap();
        scrape_ok(fresh, url.clone(), "new connection among idle crowd").await;
    }
    drop(idle);
    sink.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_header_timeout() {
    let mut sink = PrometheusSink::builder()
        .with_http_listener(([127, 0, 0, 1], 0))
        .header_read_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    sink.export(Arc::new(test_snapshot(1))).await.unwrap();
    let addr = sink.local_addr().unwrap();

    // Silent connection: closed (hyper answers 408 or just closes) well before our 5 s patience.
    let started = Instant::now();
    let reply = raw(addr, b"", Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(reply.is_empty() || reply.starts_with("HTTP/1.1 408"), "{reply}");

    // Slow loris: a partial head is cut off too.
    let started = Instant::now();
    let _ = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n", Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(3));

    // A kept-alive connection is served, then closed once idle.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let started = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    sink.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_is_gzip_compressed_when_the_scraper_takes_it() {
    use std::io::Read as _;
    let mut sink = PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0)).build().unwrap();
    let url = format!("http://{}/metrics", sink.local_addr().unwrap());
    sink.export(Arc::new(test_snapshot(1))).await.unwrap();
    let http = client();
    let get = |encoding: Option<&'static str>| {
        let mut r = http.get(&url);
        if let Some(e) = encoding {
            r = r.header("accept-encoding", e);
        }
        async move { r.send().await.unwrap() }
    };

    let plain = get(None).await;
    assert!(plain.headers().get("content-encoding").is_none());
    assert_eq!(plain.headers()["vary"], "accept-encoding");
    let plain = plain.bytes().await.unwrap();

    // What Prometheus sends: gzip.
    let r = get(Some("gzip")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    assert_eq!(r.headers()["content-type"], TEXT_CONTENT_TYPE);
    let wire = r.bytes().await.unwrap();
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&wire[..]).read_to_end(&mut text).unwrap();
    assert_eq!(text, plain, "the same exposition");
    assert!(wire.len() * 3 < plain.len(), "{} bytes compressed of {}", wire.len(), plain.len());

    // Among others, any case, with a quality; refused with q=0; not offered.
    for (accept, gzipped) in [
        ("deflate, GZIP;q=0.5", true),
        ("*", true),
        ("gzip;q=0", false),
        ("gzip; q=0.0, identity", false),
        ("identity", false),
    ] {
        let r = get(Some(accept)).await;
        assert_eq!(r.headers().get("content-encoding").is_some(), gzipped, "Accept-Encoding: {accept}");
    }
}

#[tokio::test]
async fn handle_renders_without_a_listener() {
    let mut sink = PrometheusSink::builder().build().unwrap();
    assert_eq!(sink.local_addr(), None);
    let handle = sink.handle();
    sink.export(Arc::new(test_snapshot(1))).await.unwrap();
    let mut buf = String::new();
    handle.render_to(&mut buf, handle.negotiate(Some(PROMETHEUS_ACCEPT)));
    assert!(buf.ends_with("# EOF\n"));
    assert!(handle.render(Format::Text).contains("gpumon_gpu_info{"));
}

#[cfg(feature = "prometheus-tls")]
mod tls {
    use super::*;
    use gpumon_sinks::prometheus::TlsConfig;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::CertificateDer;

    // The crate's one set of test certificates (src/testdata/tls: a CA and a leaf for
    // localhost/127.0.0.1 signed by it), shared with the unit tests' TLS server.
    const CA: &str = include_str!("../src/testdata/tls/ca.pem");
    const LEAF: &str = include_str!("../src/testdata/tls/localhost.pem");
    const KEY: &str = include_str!("../src/testdata/tls/localhost.key");

    fn connector() -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(CA.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// A client connection to `addr` through a completed handshake, trusting the test CA.
    async fn tls_connect(addr: std::net::SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector().connect(name, tcp).await.unwrap()
    }

    /// A directory of this test's PEM files, removed when dropped (also when the test fails).
    struct PemDir(std::path::PathBuf);

    impl PemDir {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("gpumon-{test}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            PemDir(dir)
        }

        fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).unwrap();
            path
        }

        /// The test leaf certificate and its key, as a listener's TLS settings.
        fn leaf_tls(&self) -> TlsConfig {
            TlsConfig::new(self.write("cert.pem", LEAF), self.write("key.pem", KEY))
        }
    }

    impl Drop for PemDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// PEM files without what they should hold, or broken, are build errors naming the file.
    #[test]
    fn unusable_pem_files_are_named() {
        let dir = PemDir::new("tls-bad");
        let write = |name: &str, text: &str| dir.write(name, text);
        let (leaf, key) = (write("leaf.pem", LEAF), write("key.pem", KEY));
        let not_pem = write("notes.txt", "just some text\n");
        let truncated = write("truncated.pem", &KEY[..KEY.len() - 30]);
        let build = |cert: &std::path::Path, key: &std::path::Path| {
            PrometheusSink::builder()
                .with_http_listener(([127, 0, 0, 1], 0))
                .with_tls(TlsConfig::new(cert, key))
                .build()
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let e = build(&not_pem, &key);
        assert!(e.contains("prometheus.tls.cert") && e.contains("no certificate found in"), "{e}");
        let e = build(&leaf, &leaf); // a certificate where the key should be
        assert!(e.contains("prometheus.tls.key") && e.contains("no private key found in"), "{e}");
        let e = build(&leaf, &truncated);
        assert!(e.contains(&format!("bad PEM in {}", truncated.display())), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn https_scrape_with_auth() {
        let dir = PemDir::new("tls");
        let mut sink = PrometheusSink::builder()
            .with_http_listener(([127, 0, 0, 1], 0))
            .with_tls(dir.leaf_tls())
            .with_auth(Auth::bearer("tok"))
            .header_read_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        sink.export(Arc::new(test_snapshot(1))).await.unwrap();
        let addr = sink.local_addr().unwrap();

        let get = |auth: &'static str| async move {
            let mut tls = tls_connect(addr).await;
            let req = format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\r\n");
            tls.write_all(req.as_bytes()).await.unwrap();
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut buf)).await;
            String::from_utf8_lossy(&buf).into_owned()
        };
        let ok = get("Authorization: Bearer tok\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok:.300}");
        assert!(ok.contains("gpumon_utilization_ratio{"));
        let denied = get("").await;
        assert!(denied.starts_with("HTTP/1.1 401"), "{denied:.300}");

        // Plain HTTP and a client that never finishes the handshake do no harm.
        let plain = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_secs(3)).await;
        assert!(!plain.contains("gpumon_"), "{plain:.200}");
        let _stalled = TcpStream::connect(addr).await.unwrap();
        assert!(get("Authorization: Bearer tok\r\n").await.starts_with("HTTP/1.1 200"));
        sink.shutdown().await.unwrap();
    }

    /// The web view over the same TLS and auth: the page and a live stream over HTTPS.
    #[cfg(feature = "web")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn https_web_view_and_live_stream_with_basic_auth() {
        use gpumon_sinks::web::{WebConfig, WebSink};
        let dir = PemDir::new("tls-web");
        let mut cfg = WebConfig::default();
        cfg.listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.tls = Some(dir.leaf_tls());
        cfg.auth = Some(Auth::basic("ops", "pw"));
        let mut sink = WebSink::from_config(&cfg).unwrap();
        sink.export(Arc::new(test_snapshot(1))).await.unwrap();
        let addr = sink.local_addr().unwrap();
        let connect = || tls_connect(addr);
        // "ops:pw" in base64.
        let auth = "Authorization: Basic b3BzOnB3\r\n";
        let mut tls = connect().await;
        tls.write_all(format!("GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\r\n").as_bytes())
            .await
            .unwrap();
        let mut page = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut page)).await;
        let page = String::from_utf8_lossy(&page);
        assert!(page.starts_with("HTTP/1.1 200"), "{page:.300}");
        assert!(page.contains("<script src=\"app.js\""), "{page:.600}");

        let mut denied = connect().await;
        denied.write_all(b"GET /api/stream HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), denied.read_to_end(&mut buf)).await;
        assert!(buf.starts_with(b"HTTP/1.1 401"), "{}", String::from_utf8_lossy(&buf));

        let mut stream = connect().await;
        stream
            .write_all(format!("GET /api/stream HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n").as_bytes())
            .await
            .unwrap();
        let mut seen = String::new();
        let mut chunk = [0u8; 16384];
        // The latest snapshot at once, then the next one as it is exported.
        for (seq, export) in [(1, false), (2, true)] {
            if export {
                sink.export(Arc::new(test_snapshot(seq))).await.unwrap();
            }
            while !seen.contains(&format!("\"seq\":{seq},")) {
                let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await.unwrap().unwrap();
                assert!(n > 0, "{seen:.500}");
                seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        }
        assert!(seen.contains("text/event-stream"), "{seen:.500}");
        sink.shutdown().await.unwrap();
    }
}

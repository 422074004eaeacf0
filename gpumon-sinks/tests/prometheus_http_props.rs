//! Property test of the scrape endpoint's request handling: arbitrary request bytes (methods,
//! paths, headers, lengths, bodies, plain garbage) over a real loopback socket. The server
//! answers with a well-formed HTTP status line or closes/keeps silent, never panics, and
//! still serves a normal `GET /metrics` afterwards. Cases: 64 unless `PROPTEST_CASES` is set.
#![cfg(feature = "prometheus-http")]

#[path = "prometheus_support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpumon_core::Sink;
use gpumon_sinks::prometheus::{Auth, PrometheusSink};
use proptest::prelude::*;
use support::test_snapshot;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Panics anywhere in the process (a server task's included: tokio would swallow them).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["", " ", "\t", ":", "\r", "\n", "\0", "é", "\u{7f}", "/", "?", "%", "..", "a"])
            .prop_map(str::to_owned),
        "[ -~]{0,24}",
        any::<String>(),
    ]
}

/// One of the `known` values (ones the server treats specially), or any token.
fn known_or_token(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![prop::sample::select(known).prop_map(str::to_owned), token()]
}

/// One request, mostly HTTP-shaped, sometimes not at all.
fn request() -> impl Strategy<Value = Vec<u8>> {
    let method = known_or_token(&["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "get", ""]);
    let path = known_or_token(&["/metrics", "/health", "/live", "/", "*", "/metrics?x=1", "//metrics", "/metrics/"]);
    let version = prop::sample::select(vec!["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "", "http/1.1"]);
    let header_name = known_or_token(&[
        "Host",
        "Accept",
        "Authorization",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Accept-Encoding",
        "Expect",
        "Upgrade",
    ]);
    let header_value = known_or_token(&[
        "application/openmetrics-text;version=1.0.0",
        "text/plain;q=0",
        "*/*;q=abc",
        "Bearer tok",
        "Bearer wrong",
        "Basic Og==",
        "Basic !!!",
        "chunked",
        "close",
        "100-continue",
        "-1",
        "18446744073709551616",
        "0",
        "5",
        "h2c",
    ]);
    let headers = prop::collection::vec((header_name, header_value), 0..6);
    let body = prop::collection::vec(any::<u8>(), 0..64);
    let shaped = (method, path, version, headers, body, any::<bool>()).prop_map(
        |(method, path, version, headers, body, terminate)| {
            let mut r = format!("{method} {path} {version}\r\n").into_bytes();
            for (k, v) in headers {
                r.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
            }
            if terminate {
                r.extend_from_slice(b"\r\n");
            }
            r.extend_from_slice(&body);
            r
        },
    );
    prop_oneof![4 => shaped, 1 => prop::collection::vec(any::<u8>(), 0..256)]
}

/// Sends `request`, returns the first line that comes back (empty: closed or silent).
async fn first_line(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_millis(700), async {
        while !buf.windows(2).any(|w| w == b"\r\n") {
            match s.read(&mut tmp).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&buf);
    text.split("\r\n").next().unwrap_or_default().to_owned()
}

/// `HTTP/1.x NNN reason`.
fn is_status_line(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("HTTP/1.1 ").or_else(|| line.strip_prefix("HTTP/1.0 ")) else { return false };
    let code = rest.get(..3).unwrap_or("");
    code.len() == 3
        && code.bytes().all(|b| b.is_ascii_digit())
        && (b'1'..=b'5').contains(&code.as_bytes()[0])
        && rest.as_bytes().get(3).is_none_or(|b| *b == b' ')
}

async fn scrape(addr: SocketAddr, auth: &str) -> String {
    first_line(addr, format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes()).await
}

#[test]
fn any_request_bytes_get_a_status_line_or_nothing_and_the_server_keeps_serving() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // One open sink and one behind bearer auth: the auth check parses hostile headers too.
    let (open, guarded) = rt.block_on(async {
        let build = |auth: Option<Auth>| {
            let mut b = PrometheusSink::builder()
                .with_http_listener(([127, 0, 0, 1], 0))
                .header_read_timeout(Duration::from_millis(500));
            if let Some(auth) = auth {
                b = b.with_auth(auth);
            }
            b.build().unwrap()
        };
        let (mut open, mut guarded) = (build(None), build(Some(Auth::bearer("tok"))));
        open.export(Arc::new(test_snapshot(1))).await.unwrap();
        guarded.export(Arc::new(test_snapshot(1))).await.unwrap();
        (open, guarded)
    });
    let addrs = [(open.local_addr().unwrap(), ""), (guarded.local_addr().unwrap(), "Authorization: Bearer tok\r\n")];
    for (addr, auth) in addrs {
        let line = rt.block_on(scrape(addr, auth));
        assert!(line.starts_with("HTTP/1.1 200"), "baseline scrape: {line}");
    }

    let (cases, silent) = (AtomicUsize::new(0), AtomicUsize::new(0));
    proptest!(config(), |(req in request())| {
        cases.fetch_add(1, Ordering::Relaxed);
        for (addr, auth) in addrs {
            let line = rt.block_on(first_line(addr, &req));
            silent.fetch_add(usize::from(line.is_empty()), Ordering::Relaxed);
            prop_assert!(line.is_empty() || is_status_line(&line), "{:?} answered {:?}", String::from_utf8_lossy(&req), line);
            let after = rt.block_on(scrape(addr, auth));
            prop_assert!(after.starts_with("HTTP/1.1 200"), "after {:?}: {}", String::from_utf8_lossy(&req), after);
            prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a panic while serving {:?}", String::from_utf8_lossy(&req));
        }
    });
    let cases = cases.into_inner();
    eprintln!("{cases} requests, {} answered with nothing", silent.into_inner());
    assert!(cases >= config().cases as usize, "the property ran");
    // Unauthenticated requests to the guarded sink were refused, not served.
    assert!(rt.block_on(scrape(addrs[1].0, "")).starts_with("HTTP/1.1 401"));
    rt.block_on(async {
        let (mut open, mut guarded) = (open, guarded);
        open.shutdown().await.unwrap();
        guarded.shutdown().await.unwrap();
    });
}

//! Helpers shared by the HTTP-client sinks (Pushgateway, InfluxDB, OTLP): error text, `Retry-After`,
//! and reading a server's error body without trusting its size.

#[cfg(feature = "_http-client")]
use std::time::Duration;

#[cfg(feature = "_http-client")]
use crate::delivery::retry::parse_retry_after;

/// Most bytes of an error response body that are read (the rest is never received): enough for
/// any real server message, and a misbehaving server cannot make the sink buffer megabytes.
#[cfg(feature = "_http-client")]
pub(crate) const MAX_ERROR_BODY: usize = 4096;

#[cfg_attr(not(any(feature = "_http-client", feature = "otlp")), allow(dead_code))]
/// `error: source: source…` — reqwest's own `Display` hides the cause (e.g. "connection refused").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = cause.source();
    }
    s
}

/// The response's `Retry-After`, when given in seconds.
#[cfg(feature = "_http-client")]
pub(crate) fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after)
}

/// The start of a response body, at most `cap` bytes, read chunk by chunk: once `cap` bytes are
/// in, the rest is not read (the connection is dropped, not reused). Invalid UTF-8 is replaced; a
/// character cut by the cap is left out. A body that fails midway yields what arrived.
#[cfg(feature = "_http-client")]
pub(crate) async fn read_body_capped(mut response: reqwest::Response, cap: usize) -> String {
    let mut body: Vec<u8> = Vec::new();
    while body.len() < cap {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(cap - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    // Drop an incomplete UTF-8 sequence at the cut rather than turning it into U+FFFD.
    if let Err(e) = std::str::from_utf8(&body) {
        if e.error_len().is_none() {
            body.truncate(e.valid_up_to());
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// A scripted HTTP/1.1 server on 127.0.0.1 for unit tests: every request gets the next response
/// from `respond` (status line, extra headers, body); requests are counted.
#[cfg(all(test, feature = "_http-client"))]
pub(crate) mod test_server {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What one request is answered with.
    #[derive(Clone, Debug)]
    pub(crate) enum Reply {
        /// `status`, extra header lines (`"Retry-After: 30"`), a body.
        Fixed { status: u16, headers: Vec<String>, body: String },
        /// `status`, then a chunked body that begins with `prefix` and never ends.
        Endless { status: u16, prefix: String },
    }

    impl Reply {
        pub(crate) fn status(status: u16) -> Self {
            Reply::Fixed { status, headers: Vec::new(), body: String::new() }
        }
        pub(crate) fn with(status: u16, headers: &[&str], body: &str) -> Self {
            Reply::Fixed { status, headers: headers.iter().map(|h| (*h).to_owned()).collect(), body: body.to_owned() }
        }
    }

    /// One request: its head (lower-cased) and body.
    pub(crate) type Received = (String, Vec<u8>);

    /// The running server.
    #[derive(Clone, Debug)]
    pub(crate) struct TestServer {
        pub(crate) url: String,
        pub(crate) requests: Arc<AtomicUsize>,
        reply: Arc<Mutex<Reply>>,
        /// Every request received: its head (lower-cased) and body.
        pub(crate) received: Arc<Mutex<Vec<Received>>>,
    }

    impl TestServer {
        /// Starts answering every request with `reply` (change it with [`TestServer::set`]).
        pub(crate) async fn start(reply: Reply) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let server = TestServer {
                url: format!("http://{}", listener.local_addr().unwrap()),
                requests: Arc::new(AtomicUsize::new(0)),
                reply: Arc::new(Mutex::new(reply)),
                received: Arc::default(),
            };
            let s = server.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream, s.clone()));
                }
            });
            server
        }

        /// The same over TLS (`https://localhost:port`) with the test certificate in
        /// `src/testdata/tls` (signed by `ca.pem`, for `localhost` and `127.0.0.1`). Requests
        /// counted are those that arrived through a completed handshake.
        #[cfg(feature = "tls")]
        pub(crate) async fn start_tls(reply: Reply) -> Self {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let certs = CertificateDer::pem_slice_iter(include_bytes!("testdata/tls/localhost.pem").as_slice())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(include_bytes!("testdata/tls/localhost.key")).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let server = TestServer {
                url: format!("https://localhost:{}", listener.local_addr().unwrap().port()),
                requests: Arc::new(AtomicUsize::new(0)),
                reply: Arc::new(Mutex::new(reply)),
                received: Arc::default(),
            };
            let s = server.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (acceptor, s) = (acceptor.clone(), s.clone());
                    tokio::spawn(async move {
                        if let Ok(tls) = acceptor.accept(stream).await {
                            serve(tls, s).await;
                        }
                    });
                }
            });
            server
        }

        pub(crate) fn set(&self, reply: Reply) {
            *self.reply.lock().unwrap() = reply;
        }

        pub(crate) fn requests(&self) -> usize {
            self.requests.load(Ordering::SeqCst)
        }
    }

    async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S, server: TestServer) {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 8192];
        loop {
            // Read one request: head, then Content-Length bytes of body.
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                match stream.read(&mut tmp).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&tmp[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                match stream.read(&mut tmp).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&tmp[..n]),
                }
            }
            let body = buf[head_end..head_end + len].to_vec();
            buf.drain(..head_end + len);
            server.received.lock().unwrap().push((head, body));
            server.requests.fetch_add(1, Ordering::SeqCst);
            let reply = server.reply.lock().unwrap().clone();
            match reply {
                Reply::Fixed { status, headers, body } => {
                    let mut out = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                    for h in headers {
                        out.push_str(&h);
                        out.push_str("\r\n");
                    }
                    out.push_str("\r\n");
                    out.push_str(&body);
                    if stream.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
                Reply::Endless { status, prefix } => {
                    let head = format!("HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n\r\n");
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut chunk = prefix.into_bytes();
                    loop {
                        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                        framed.extend_from_slice(&chunk);
                        framed.extend_from_slice(b"\r\n");
                        if stream.write_all(&framed).await.is_err() {
                            return; // the client hung up: what a capped reader does
                        }
                        chunk = vec![b'x'; 16 * 1024];
                    }
                }
            }
        }
    }
}

#[cfg(all(test, feature = "_http-client"))]
mod tests {
    use super::test_server::{Reply, TestServer};
    use super::*;

    /// A plain client; with the `tls` feature reqwest needs the process-wide provider first.
    fn test_client() -> reqwest::Client {
        #[cfg(feature = "tls")]
        crate::tls::install_crypto_provider();
        reqwest::Client::new()
    }

    #[tokio::test]
    async fn error_bodies_are_read_only_up_to_the_cap() {
        let server = TestServer::start(Reply::Endless { status: 500, prefix: "ünïcødé error: ".to_owned() }).await;
        let response = test_client().post(&server.url).body("x").send().await.unwrap();
        assert_eq!(response.status().as_u16(), 500);
        // Reading the whole body would never finish.
        let text = tokio::time::timeout(Duration::from_secs(10), read_body_capped(response, MAX_ERROR_BODY))
            .await
            .expect("a capped read returns although the body never ends");
        assert!(text.starts_with("ünïcødé error: xxx"), "{text}");
        assert!(text.len() <= MAX_ERROR_BODY && text.len() > MAX_ERROR_BODY - 4, "{}", text.len());
        assert!(!text.contains('\u{FFFD}'));
    }

    #[tokio::test]
    async fn short_bodies_and_retry_after_are_read_whole() {
        let server = TestServer::start(Reply::with(429, &["Retry-After: 7"], "slow down")).await;
        let response = test_client().get(&server.url).send().await.unwrap();
        assert_eq!(retry_after(&response), Some(Duration::from_secs(7)));
        assert_eq!(read_body_capped(response, MAX_ERROR_BODY).await, "slow down");
        // A cut inside a multi-byte character leaves the character out.
        server.set(Reply::with(500, &[], "aé"));
        let response = test_client().get(&server.url).send().await.unwrap();
        assert_eq!(read_body_capped(response, 2).await, "a");
    }

    #[test]
    fn error_chain_appends_distinct_causes() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E("request failed", Some(Box::new(E("request failed", Some(Box::new(E("refused", None)))))));
        assert_eq!(error_chain(&e), "request failed: refused");
    }
}

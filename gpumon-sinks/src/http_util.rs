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

/// `error: source: source…` — reqwest's own `Display` hides the cause (e.g. "connection refused").
#[cfg(any(feature = "_http-client", feature = "otlp"))]
pub(crate) use gpumon_core::error_chain;

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

/// The unit tests' HTTP server: [`gpumon_mock::test_env::HttpStub`] (the one loopback stub of
/// the workspace) behind the small interface the sink tests were written against, plus a TLS
/// variant with the test certificate.
#[cfg(all(test, feature = "_http-client"))]
// Each client sink's tests use part of it; a build with one sink leaves the rest unused.
#[allow(dead_code)]
pub(crate) mod test_server {
    pub(crate) use gpumon_mock::test_env::HttpReply as Reply;
    use gpumon_mock::test_env::HttpStub;

    /// One request: its head (lower-cased) and body.
    pub(crate) type Received = (String, Vec<u8>);

    /// The running server.
    #[derive(Clone, Debug)]
    pub(crate) struct TestServer {
        pub(crate) url: String,
        stub: HttpStub,
    }

    impl TestServer {
        /// Starts answering every request with `reply` (change it with [`TestServer::set`]).
        /// `async` only so that callers read like the clients they drive.
        #[allow(clippy::unused_async)]
        pub(crate) async fn start(reply: Reply) -> Self {
            let stub = HttpStub::start(move |_| reply.clone());
            TestServer { url: stub.url(), stub }
        }

        /// The same over TLS (`https://localhost:port`) with the test certificate in
        /// `src/testdata/tls` (signed by `ca.pem`, for `localhost` and `127.0.0.1`). Requests
        /// counted are those that arrived through a completed handshake.
        #[cfg(feature = "tls")]
        #[allow(clippy::unused_async)]
        pub(crate) async fn start_tls(reply: Reply) -> Self {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            use std::sync::Arc;
            let certs = CertificateDer::pem_slice_iter(include_bytes!("testdata/tls/localhost.pem").as_slice())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(include_bytes!("testdata/tls/localhost.key")).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = Arc::new(
                rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_single_cert(certs, key)
                    .unwrap(),
            );
            // The handshake runs on the connection's thread when the stub first reads; a
            // failed one is a read error, so the request is never counted.
            let stub = HttpStub::start_tls_with(
                move |_| reply.clone(),
                move |tcp| Some(rustls::StreamOwned::new(rustls::ServerConnection::new(config.clone()).ok()?, tcp)),
            );
            TestServer { url: format!("https://localhost:{}", stub.addr().port()), stub }
        }

        pub(crate) fn set(&self, reply: Reply) {
            self.stub.set_reply(reply);
        }

        pub(crate) fn requests(&self) -> usize {
            self.stub.count()
        }

        /// Every request so far: its head (request line and headers, lower-cased) and body.
        pub(crate) fn received(&self) -> Vec<Received> {
            self.stub
                .requests()
                .into_iter()
                .map(|r| {
                    let mut head = format!("{} {} http/1.1\r\n", r.method, r.path);
                    for (k, v) in &r.headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    (head.to_lowercase(), r.body)
                })
                .collect()
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

//! The unit tests' HTTP server: [`gpumon_mock::test_env::HttpStub`] (the one loopback stub of
//! the workspace) behind the small interface the sink tests were written against, plus a TLS
//! variant with the test certificate.
// Each client sink's tests use part of it; a build with one sink leaves the rest unused.
#![allow(dead_code)]

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
        let certs = CertificateDer::pem_slice_iter(include_bytes!("../testdata/tls/localhost.pem").as_slice())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(include_bytes!("../testdata/tls/localhost.key")).unwrap();
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

    /// Waits until `n` requests have arrived; fails with `why` if they have not within `within`.
    pub(crate) async fn wait_for_requests(&self, n: usize, within: std::time::Duration, why: &str) {
        let deadline = std::time::Instant::now() + within;
        while self.requests() < n {
            assert!(std::time::Instant::now() < deadline, "{why}: {} of {n} requests in {within:?}", self.requests());
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
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

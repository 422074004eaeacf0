//! [`HttpClient`]: one reqwest client per sink, built the same way for every sink (timeouts,
//! `User-Agent`, TLS, auth, fixed headers), and one send-and-classify ([`HttpClient::send`]):
//! a 2xx is `Ok`; anything else is an [`HttpError`] holding what the sink needs to word its
//! error and decide what to do ([`HttpError::into_failure`], the table in [`super::retry`]).

use std::time::Duration;

use gpumon_core::{error_chain, BuildError};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, RETRY_AFTER};
use reqwest::{RequestBuilder, StatusCode};

use super::retry::{classify, parse_retry_after, Failure};
use crate::tls::{certificate_hint, TlsConfig};
use crate::Secret;

/// Most bytes of an error response body that are read (the rest is never received): enough for
/// any real server message, and a misbehaving server cannot make the sink buffer megabytes.
const MAX_ERROR_BODY: usize = 4096;

/// Most characters of the server's message kept in an error.
const MAX_SERVER_MESSAGE: usize = 500;

/// How a sink proves who it is.
#[derive(Clone, Debug, Default)]
pub(crate) enum Auth {
    /// No credentials.
    #[default]
    None,
    /// HTTP Basic (`username`/`password`: InfluxDB v1, remote write, Pushgateway).
    Basic { user: String, password: Option<Secret> },
    /// `Authorization: Bearer <token>` (remote write).
    Bearer(Secret),
    /// `Authorization: Token <token>` (InfluxDB v2).
    Token(Secret),
}

impl Auth {
    /// HTTP Basic when `user` is set.
    pub(crate) fn basic(user: Option<&String>, password: Option<&Secret>) -> Self {
        user.map_or(Auth::None, |user| Auth::Basic { user: user.clone(), password: password.cloned() })
    }
}

/// How a sink's client is built.
#[derive(Debug)]
pub(crate) struct ClientConfig<'a> {
    /// The sink's table in the config (`influxdb`): names the keys in build errors and
    /// certificate hints (`influxdb.tls.ca_file`).
    pub(crate) key: &'static str,
    /// The settings of its `tls` table.
    pub(crate) tls: &'a TlsConfig,
    /// The URL the client talks to (its scheme decides whether TLS is set up).
    pub(crate) url: &'a reqwest::Url,
    /// Bound on each whole request; `None` when every request sets its own
    /// ([`RequestBuilder::timeout`]).
    pub(crate) timeout: Option<Duration>,
    /// Bound on connecting.
    pub(crate) connect_timeout: Duration,
    /// Credentials sent with every request but [`HttpClient::probe`].
    pub(crate) auth: Auth,
    /// Headers sent with every request but [`HttpClient::probe`] (content type, extra headers).
    pub(crate) headers: HeaderMap,
}

/// A sink's HTTP client: the reqwest client with its credentials and fixed headers.
pub(crate) struct HttpClient {
    client: reqwest::Client,
    /// HTTP Basic credentials (encoded by reqwest per request).
    basic: Option<(String, Option<Secret>)>,
    /// The fixed headers, with `Authorization` for a bearer or InfluxDB token.
    headers: HeaderMap,
    /// `influxdb.tls`, for certificate hints.
    tls_key: String,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("basic_auth", &self.basic.as_ref().map(|(user, _)| user))
            .field("headers", &self.headers) // a token is marked sensitive: shown as such
            .field("tls_key", &self.tls_key)
            .finish_non_exhaustive()
    }
}

/// Why a request got no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NetworkKind {
    Timeout,
    Connect,
    /// The server's certificate was not trusted ([`crate::tls::certificate_refused`]).
    Certificate,
    Request,
}

/// A request that did not end in a 2xx.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HttpError {
    /// No answer: refused, reset, timed out, a TLS handshake that failed.
    Network {
        kind: NetworkKind,
        /// reqwest's error with its causes, and a hint when a certificate was refused.
        detail: String,
    },
    /// A non-2xx answer.
    Status {
        status: StatusCode,
        /// The server's `Retry-After`, in seconds.
        retry_after: Option<Duration>,
        /// The start of the body ([`MAX_ERROR_BODY`] bytes at most).
        body: String,
    },
}

impl HttpError {
    /// Whether the request ran out of time.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, HttpError::Network { kind: NetworkKind::Timeout, .. })
    }

    /// The kind of failure, to log a run of the same failure once: `timeout`, `connect`,
    /// `request`, or `HTTP 503`.
    pub(crate) fn kind(&self) -> String {
        match self {
            HttpError::Network { kind: NetworkKind::Timeout, .. } => "timeout".to_owned(),
            HttpError::Network { kind: NetworkKind::Connect, .. } => "connect".to_owned(),
            HttpError::Network { kind: NetworkKind::Certificate, .. } => "certificate".to_owned(),
            HttpError::Network { kind: NetworkKind::Request, .. } => "request".to_owned(),
            HttpError::Status { status, .. } => format!("HTTP {}", status.as_u16()),
        }
    }

    /// The error as every sink words it: `{target}: {detail}`, or
    /// `{target}: HTTP 503 Service Unavailable: {the server's message}` ([`server_message`]).
    pub(crate) fn message(&self, target: &str) -> String {
        match self {
            HttpError::Network { detail, .. } => format!("{target}: {detail}"),
            HttpError::Status { status, body, .. } => {
                let server = server_message(body);
                format!("{target}: HTTP {status}{}{server}", if server.is_empty() { "" } else { ": " })
            }
        }
    }

    /// What to do about it, by the one retry table ([`classify`]): no answer is retried, except
    /// a server certificate this client refused, which is held like a 401 (the next try would be
    /// refused the same way until someone fixes the CA file); an answer as its status says.
    pub(crate) fn into_failure(self, target: &str) -> Failure {
        let message = self.message(target);
        match self {
            HttpError::Network { kind: NetworkKind::Certificate, .. } => Failure::Hold { message },
            HttpError::Network { .. } => Failure::Retry { message, retry_after: None },
            HttpError::Status { status, retry_after, .. } => classify(status.as_u16(), message, retry_after),
        }
    }
}

impl HttpClient {
    /// Builds the client: `User-Agent: gpumon/<version>`, idle connections closed after 50 s
    /// (before the common 60 s server keep-alive closes them under a request), the timeouts and
    /// the TLS settings of `config`.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] naming the TLS key for unusable TLS settings, or
    /// [`BuildError::Io`] when reqwest cannot build the client.
    pub(crate) fn new(config: ClientConfig<'_>) -> Result<Self, BuildError> {
        let ClientConfig { key, tls, url, timeout, connect_timeout, auth, mut headers } = config;
        let tls_key = format!("{key}.tls");
        let mut builder = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(50))
            .user_agent(concat!("gpumon/", env!("CARGO_PKG_VERSION")));
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        let client = crate::tls::reqwest_tls(builder, tls, &tls_key, url)?.build().map_err(|e| BuildError::Io {
            what: format!("{key}: building the HTTP client for {url}"),
            source: Box::new(e),
        })?;
        let token = match auth {
            Auth::None => None,
            Auth::Basic { user, password } => {
                return Ok(Self { client, basic: Some((user, password)), headers, tls_key });
            }
            Auth::Bearer(token) => Some(("bearer_token", format!("Bearer {}", token.expose()))),
            Auth::Token(token) => Some(("token", format!("Token {}", token.expose()))),
        };
        if let Some((field, value)) = token {
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| BuildError::invalid(format!("{key}.{field}"), "not usable in an HTTP header"))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        Ok(Self { client, basic: None, headers, tls_key })
    }

    /// A request to `url` with the credentials and the fixed headers.
    pub(crate) fn request(&self, method: reqwest::Method, url: reqwest::Url) -> RequestBuilder {
        let request = self.client.request(method, url).headers(self.headers.clone());
        match &self.basic {
            Some((user, password)) => request.basic_auth(user, password.as_ref().map(Secret::expose)),
            None => request,
        }
    }

    /// Sends `request`. A 2xx is `Ok` (its body is read, at most [`MAX_ERROR_BODY`] bytes, so that
    /// the connection can be reused); anything else an [`HttpError`] with the status,
    /// `Retry-After` and the start of the body, or with the cause of a request that got no
    /// answer.
    pub(crate) async fn send(&self, request: RequestBuilder) -> Result<(), HttpError> {
        let response = request.send().await.map_err(|e| self.network_error(&e))?;
        let status = response.status();
        if status.is_success() {
            drain(response).await;
            return Ok(());
        }
        let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
        let body = read_body_capped(response, MAX_ERROR_BODY).await;
        Err(HttpError::Status { status, retry_after, body })
    }

    /// Sends `request` and returns the body of a 2xx, at most `cap` bytes (invalid UTF-8
    /// replaced): for the one client that reads answers, the PromQL query client. Anything else
    /// is an [`HttpError`], as [`HttpClient::send`] gives it.
    #[cfg(feature = "prometheus-query")]
    pub(crate) async fn fetch(&self, request: RequestBuilder, cap: usize) -> Result<String, HttpError> {
        let response = request.send().await.map_err(|e| self.network_error(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(read_body_capped(response, cap).await);
        }
        let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
        let body = read_body_capped(response, MAX_ERROR_BODY).await;
        Err(HttpError::Status { status, retry_after, body })
    }

    /// `GET url` without credentials or fixed headers: a readiness probe (`/ping`, `/-/ready`),
    /// bounded by `timeout` when given.
    pub(crate) async fn probe(&self, url: reqwest::Url, timeout: Option<Duration>) -> Result<(), HttpError> {
        let mut request = self.client.get(url);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        self.send(request).await
    }

    fn network_error(&self, e: &reqwest::Error) -> HttpError {
        let detail = error_chain(e);
        let kind = if e.is_timeout() {
            NetworkKind::Timeout
        } else if crate::tls::certificate_refused(&detail) {
            NetworkKind::Certificate
        } else if e.is_connect() {
            NetworkKind::Connect
        } else {
            NetworkKind::Request
        };
        let hint = certificate_hint(&detail, &self.tls_key);
        HttpError::Network { kind, detail: format!("{detail}{hint}") }
    }
}

/// The endpoint URL a push sink's config sets at `key` (`influxdb.url`, …), parsed. An empty
/// one is [`BuildError::InvalidConfig`] suggesting `example`; one that does not parse is
/// [`BuildError::InvalidEndpoint`] naming the key. What else the URL must be (scheme, host, no
/// credentials) is the sink's own check.
pub(crate) fn parse_endpoint(key: &str, url: &str, example: &str) -> Result<reqwest::Url, BuildError> {
    if url.trim().is_empty() {
        return Err(BuildError::invalid(key, format!("missing: e.g. `{example}`")));
    }
    reqwest::Url::parse(url)
        .map_err(|e| BuildError::InvalidEndpoint { endpoint: url.to_owned(), reason: format!("{key}: {e}") })
}

/// The server's error text: InfluxDB answers `{"error":"…"}`; Prometheus, Mimir,
/// VictoriaMetrics, the Pushgateway and OTLP collectors plain text. At most 500 characters, on
/// one line: control characters are escaped (`\n`, `\u{1b}`), because the text goes into the
/// agent's log, where a server could otherwise forge lines or send terminal escapes.
pub(crate) fn server_message(body: &str) -> String {
    let body = body.trim();
    let inner = body
        .strip_prefix("{\"error\":\"")
        .and_then(|s| s.strip_suffix("\"}"))
        .map(|s| s.replace("\\\"", "\"").replace("\\\\", "\\"))
        .unwrap_or_else(|| body.to_owned());
    let mut s = String::new();
    for c in inner.chars().take(MAX_SERVER_MESSAGE) {
        if c.is_control() {
            s.extend(c.escape_debug());
        } else {
            s.push(c);
        }
    }
    if inner.chars().count() > MAX_SERVER_MESSAGE {
        s.push('…');
    }
    s
}

/// Reads a success's body (an OTLP response, usually none) up to [`MAX_ERROR_BODY`] bytes and
/// drops it, so that the connection goes back to the pool.
async fn drain(mut response: reqwest::Response) {
    let mut read = 0;
    while read < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => break,
        }
    }
}

/// The start of a response body, at most `cap` bytes, read chunk by chunk: once `cap` bytes are
/// in, the rest is not read (the connection is dropped, not reused). Invalid UTF-8 is replaced; a
/// character cut by the cap is left out. A body that fails midway yields what arrived.
async fn read_body_capped(mut response: reqwest::Response, cap: usize) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::test_server::{Reply, TestServer};
    use super::*;

    #[test]
    fn an_endpoint_is_missing_unparseable_or_a_url_and_the_error_names_its_key() {
        match parse_endpoint("sink.url", " ", "http://127.0.0.1:1") {
            Err(BuildError::InvalidConfig { name, reason }) => {
                assert_eq!((name.as_str(), reason.as_str()), ("sink.url", "missing: e.g. `http://127.0.0.1:1`"));
            }
            other => panic!("{other:?}"),
        }
        match parse_endpoint("sink.url", "127.0.0.1:1", "http://127.0.0.1:1") {
            Err(BuildError::InvalidEndpoint { endpoint, reason }) => {
                assert_eq!(endpoint, "127.0.0.1:1");
                assert!(reason.starts_with("sink.url: "), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let url = parse_endpoint("sink.url", "https://db.example:8086/x", "http://127.0.0.1:1").unwrap();
        assert_eq!((url.scheme(), url.host_str(), url.port()), ("https", Some("db.example"), Some(8086)));
    }

    fn client(url: &str, auth: Auth, headers: HeaderMap) -> HttpClient {
        let url = reqwest::Url::parse(url).unwrap();
        let config = ClientConfig {
            key: "test",
            tls: &TlsConfig::default(),
            url: &url,
            timeout: Some(Duration::from_secs(5)),
            connect_timeout: Duration::from_secs(5),
            auth,
            headers,
        };
        HttpClient::new(config).unwrap()
    }

    /// POSTs `x` to `server` and returns what the one retry table makes of the answer.
    async fn post(http: &HttpClient, server: &TestServer) -> Result<(), HttpError> {
        let url = reqwest::Url::parse(&server.url).unwrap();
        http.send(http.request(reqwest::Method::POST, url).body("x")).await
    }

    #[tokio::test]
    async fn answers_are_classified_by_the_one_retry_table() {
        let server = TestServer::start(Reply::status(204)).await;
        let http = client(&server.url, Auth::None, HeaderMap::new());
        post(&http, &server).await.unwrap();

        server.set(Reply::with(503, &["Retry-After: 7"], "ingester unavailable\n"));
        let e = post(&http, &server).await.unwrap_err();
        assert_eq!(e.kind(), "HTTP 503");
        let f = e.into_failure("POST /w");
        assert_eq!(
            f,
            Failure::Retry {
                message: "POST /w: HTTP 503 Service Unavailable: ingester unavailable".into(),
                retry_after: Some(Duration::from_secs(7)),
            }
        );

        server.set(Reply::with(401, &[], r#"{"error":"authorization failed"}"#));
        let f = post(&http, &server).await.unwrap_err().into_failure("POST /w");
        assert_eq!(f, Failure::Hold { message: "POST /w: HTTP 401 Unauthorized: authorization failed".into() });

        server.set(Reply::status(400));
        let f = post(&http, &server).await.unwrap_err().into_failure("POST /w");
        assert_eq!(f, Failure::Reject { message: "POST /w: HTTP 400 Bad Request".into() });
        assert_eq!(server.requests(), 4);
    }

    #[tokio::test]
    async fn no_answer_is_retried_and_names_its_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/w");
        let http = client(&url, Auth::None, HeaderMap::new());
        let e = http.send(http.request(reqwest::Method::POST, reqwest::Url::parse(&url).unwrap())).await.unwrap_err();
        assert_eq!(e.kind(), "connect");
        assert!(!e.is_timeout());
        match e.into_failure(&format!("POST {url}")) {
            Failure::Retry { message, retry_after: None } => {
                assert!(message.starts_with(&format!("POST {url}: ")) && message.contains("refused"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn a_refused_server_certificate_is_held_not_retried() {
        let server = TestServer::start_tls(Reply::status(204)).await;
        let url = reqwest::Url::parse(&server.url).unwrap();
        let not_a_ca = TlsConfig::with_ca_file(concat!(env!("CARGO_MANIFEST_DIR"), "/src/testdata/tls/localhost.pem"));
        let config = ClientConfig {
            key: "test",
            tls: &not_a_ca,
            url: &url,
            timeout: Some(Duration::from_secs(5)),
            connect_timeout: Duration::from_secs(5),
            auth: Auth::None,
            headers: HeaderMap::new(),
        };
        let http = HttpClient::new(config).unwrap();
        let e = http.send(http.request(reqwest::Method::POST, url)).await.unwrap_err();
        assert_eq!(e.kind(), "certificate", "{e:?}");
        match e.into_failure("POST /w") {
            Failure::Hold { message } => assert!(message.contains("test.tls.ca_file"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        // Accepts connections (the kernel's backlog does) but never answers.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", hole.local_addr().unwrap());
        let http = client(&url, Auth::None, HeaderMap::new());
        let request = http.request(reqwest::Method::GET, reqwest::Url::parse(&url).unwrap());
        let e = http.send(request.timeout(Duration::from_millis(200))).await.unwrap_err();
        assert!(e.is_timeout() && e.kind() == "timeout", "{e:?}");
        assert!(e.into_failure("GET /").is_retryable());
    }

    #[tokio::test]
    async fn credentials_and_fixed_headers_go_with_every_request_but_probes() {
        let server = TestServer::start(Reply::status(204)).await;
        let mut headers = HeaderMap::new();
        headers.insert("x-scope-orgid", HeaderValue::from_static("tenant-1"));
        let auths = [
            (Auth::Bearer("s3cret".into()), "authorization: bearer s3cret"),
            (Auth::Token("t0k".into()), "authorization: token t0k"),
            (Auth::basic(Some(&"u".to_owned()), Some(&"p".into())), "authorization: basic dtpw"),
        ];
        for (auth, expected) in auths {
            let http = client(&server.url, auth, headers.clone());
            assert!(!format!("{http:?}").contains("s3cret") && !format!("{http:?}").contains("t0k"));
            post(&http, &server).await.unwrap();
            http.probe(reqwest::Url::parse(&server.url).unwrap(), Some(Duration::from_secs(1))).await.unwrap();
            let received = server.received();
            let (sent, probe) = (&received[received.len() - 2].0, &received[received.len() - 1].0);
            assert!(sent.contains(expected) && sent.contains("x-scope-orgid: tenant-1"), "{sent}");
            assert!(sent.contains("user-agent: gpumon/"), "{sent}");
            assert!(!probe.contains("authorization") && !probe.contains("x-scope-orgid"), "{probe}");
        }
        let url = reqwest::Url::parse(&server.url).unwrap();
        let config = ClientConfig {
            key: "remote_write",
            tls: &TlsConfig::default(),
            url: &url,
            timeout: None,
            connect_timeout: Duration::from_secs(1),
            auth: Auth::Bearer("a\nb".into()),
            headers: HeaderMap::new(),
        };
        let e = HttpClient::new(config).unwrap_err().to_string();
        assert!(e.contains("remote_write.bearer_token"), "{e}");
    }

    #[tokio::test]
    async fn error_bodies_are_read_only_up_to_the_cap() {
        let server = TestServer::start(Reply::Endless { status: 500, prefix: "ünïcødé error: ".to_owned() }).await;
        let http = client(&server.url, Auth::None, HeaderMap::new());
        // Reading the whole body would never finish.
        let e = tokio::time::timeout(Duration::from_secs(10), post(&http, &server))
            .await
            .expect("a capped read returns although the body never ends")
            .unwrap_err();
        let HttpError::Status { body, .. } = &e else { panic!("{e:?}") };
        assert!(body.starts_with("ünïcødé error: xxx"), "{body}");
        assert!(body.len() <= MAX_ERROR_BODY && body.len() > MAX_ERROR_BODY - 4, "{}", body.len());
        assert!(!body.contains('\u{FFFD}'));
        let message = e.message("POST /");
        assert!(message.ends_with("xxx…") && message.chars().count() < 600, "{message}");
    }

    #[tokio::test]
    async fn a_cut_inside_a_character_leaves_the_character_out() {
        let server = TestServer::start(Reply::with(500, &[], "aé")).await;
        let http = client(&server.url, Auth::None, HeaderMap::new());
        let response = http.client.get(&server.url).send().await.unwrap();
        assert_eq!(read_body_capped(response, 2).await, "a");
    }

    #[test]
    fn server_messages_are_unwrapped() {
        assert_eq!(server_message("{\"error\":\"authorization failed\"}\n"), "authorization failed");
        assert_eq!(server_message("plain text"), "plain text");
        assert!(server_message(&"x".repeat(2000)).ends_with('…'));
        // A server cannot write lines of its own into the log, nor terminal escapes.
        let forged = "bad\n2026-12-05T00:00:00Z  INFO FAKE\u{1b}[31mRED\r";
        assert_eq!(server_message(forged), "bad\\n2026-12-05T00:00:00Z  INFO FAKE\\u{1b}[31mRED");
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

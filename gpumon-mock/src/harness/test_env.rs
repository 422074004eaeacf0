//! The one gate rule for tests that need a real server or tool started by `scripts/test.sh`.
//!
//! Such a test is marked `#[ignore = "needs scripts/test.sh (<what>)"]`, so a plain
//! `cargo test` reports it as *ignored*, never as passed. `scripts/test.sh` starts the
//! backends, exports the `GPUMON_TEST_*` variables and runs the ignored tests too
//! (`-- --include-ignored`). A test that runs is therefore one that was asked for: a missing
//! variable is a failure with a message saying how to run it, never a silent early return.

/// The value of the environment variable `name`, set by `scripts/test.sh`.
///
/// # Panics
///
/// When `name` is unset or empty: the test was run by hand (`--ignored`) without the
/// backends; the message names the variable and says to run it through `scripts/test.sh`.
#[must_use]
pub fn require_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "{name} is not set: this test needs the real backends; run it through scripts/test.sh \
             (or start them with scripts/backends/start-*.sh and export {name}, see scripts/backends/README.md)"
        ),
    }
}

/// Polls `cond` every 20 ms until it holds, for tests that wait on something happening in the
/// background (a sink writing, a server coming back) instead of sleeping a fixed time and hoping.
///
/// # Panics
///
/// When `cond` still does not hold after `timeout`; the message says `what` was awaited.
pub async fn wait_for(timeout: std::time::Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// One request as an [`HttpStub`] read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpRequest {
    /// `POST`, `GET`, …
    pub method: String,
    /// The request target as sent (`/v1/metrics`, `/write?db=x`).
    pub path: String,
    /// Header lines in the order sent, names as sent (compare with [`HttpRequest::header`]).
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes; the stub reads no chunked bodies).
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The value of the first header called `name` (ASCII case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// What an [`HttpStub`] answers one request with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpReply {
    /// `status`, extra header lines (`"Retry-After: 30"`), a body.
    Fixed {
        /// The status code.
        status: u16,
        /// Extra header lines, each `Name: value`.
        headers: Vec<String>,
        /// The body (sent with its `content-length`).
        body: String,
    },
    /// `status`, then a chunked body that begins with `prefix` and never ends (until the client
    /// hangs up): what a client that caps how much of an error body it reads must survive.
    Endless {
        /// The status code.
        status: u16,
        /// The first chunk.
        prefix: String,
    },
}

impl HttpReply {
    /// `status` with no body.
    #[must_use]
    pub fn status(status: u16) -> Self {
        HttpReply::Fixed { status, headers: Vec::new(), body: String::new() }
    }

    /// `status` with extra header lines and a body.
    #[must_use]
    pub fn with(status: u16, headers: &[&str], body: &str) -> Self {
        HttpReply::Fixed { status, headers: headers.iter().map(|h| (*h).to_owned()).collect(), body: body.to_owned() }
    }
}

type Responder = std::sync::Arc<dyn Fn(&HttpRequest) -> HttpReply + Send + Sync>;

/// What the connection threads share with the [`HttpStub`] handle.
struct StubState {
    /// `None`: answer every request with an empty 200 and record nothing (the benches' mode:
    /// no allocation per request beyond the first, so allocation counts stay honest).
    responder: std::sync::Mutex<Option<Responder>>,
    requests: std::sync::Mutex<Vec<HttpRequest>>,
    count: std::sync::atomic::AtomicUsize,
}

/// The one loopback HTTP/1.1 server for tests and benches: binds `127.0.0.1:0`, serves each
/// connection on its own thread (keep-alive: many requests per connection), reads each request's
/// head and `Content-Length` body, counts it, records it (unless started with
/// [`HttpStub::ok_unrecorded`]) and answers with what the responder returns. The threads live
/// as long as the process; a test that needs the port closed drops nothing and uses another
/// stub.
#[derive(Clone)]
pub struct HttpStub {
    addr: std::net::SocketAddr,
    state: std::sync::Arc<StubState>,
}

impl std::fmt::Debug for HttpStub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpStub").field("addr", &self.addr).field("requests", &self.count()).finish()
    }
}

impl HttpStub {
    /// A stub answering every request with `responder(&request)`; requests are recorded.
    ///
    /// # Panics
    /// When no port on 127.0.0.1 can be bound.
    pub fn start(responder: impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static) -> Self {
        Self::start_wrapped(Some(std::sync::Arc::new(responder)), Some)
    }

    /// A stub answering every request with an empty 200 and recording each one.
    pub fn recording() -> Self {
        Self::start(|_| HttpReply::status(200))
    }

    /// A stub answering every request with an empty 200 (`content-type:
    /// application/x-protobuf`, which OTLP clients accept) and only counting requests, with no
    /// allocation per request once a connection's buffers have grown: for benches.
    pub fn ok_unrecorded() -> Self {
        Self::start_wrapped(None, Some)
    }

    /// Like [`HttpStub::start`], with every accepted connection first passed through `wrap`
    /// on its own thread (a TLS handshake, say); `None` drops the connection.
    ///
    /// # Panics
    /// When no port on 127.0.0.1 can be bound.
    pub fn start_tls_with<S>(
        responder: impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static,
        wrap: impl Fn(std::net::TcpStream) -> Option<S> + Send + Sync + 'static,
    ) -> Self
    where
        S: std::io::Read + std::io::Write + Send + 'static,
    {
        Self::start_wrapped(Some(std::sync::Arc::new(responder)), wrap)
    }

    fn start_wrapped<S>(
        responder: Option<Responder>,
        wrap: impl Fn(std::net::TcpStream) -> Option<S> + Send + Sync + 'static,
    ) -> Self
    where
        S: std::io::Read + std::io::Write + Send + 'static,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let state = std::sync::Arc::new(StubState {
            responder: std::sync::Mutex::new(responder),
            requests: std::sync::Mutex::new(Vec::new()),
            count: std::sync::atomic::AtomicUsize::new(0),
        });
        let wrap = std::sync::Arc::new(wrap);
        let shared = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (state, wrap) = (shared.clone(), wrap.clone());
                std::thread::spawn(move || {
                    if let Some(stream) = wrap(conn) {
                        serve_connection(stream, &state);
                    }
                });
            }
        });
        HttpStub { addr, state }
    }

    /// The bound address (`127.0.0.1:port`).
    #[must_use]
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests answered so far (recorded or not).
    #[must_use]
    pub fn count(&self) -> usize {
        self.state.count.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The requests recorded so far, oldest first.
    ///
    /// # Panics
    /// When a connection thread panicked while holding the record (it does not).
    #[must_use]
    pub fn requests(&self) -> Vec<HttpRequest> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Answers the next requests with `responder` instead.
    ///
    /// # Panics
    /// As [`HttpStub::requests`].
    pub fn set_responder(&self, responder: impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static) {
        *self.state.responder.lock().unwrap() = Some(std::sync::Arc::new(responder));
    }

    /// Answers every next request with `reply`.
    ///
    /// # Panics
    /// As [`HttpStub::requests`].
    pub fn set_reply(&self, reply: HttpReply) {
        self.set_responder(move |_| reply.clone());
    }
}

/// Serves requests on one connection until the client hangs up or sends something that is not
/// HTTP/1.1 the stub understands.
fn serve_connection<S: std::io::Read + std::io::Write>(stream: S, state: &StubState) {
    use std::io::{BufRead, Read};
    let mut reader = std::io::BufReader::new(stream);
    let mut line = String::new();
    let mut body = Vec::new();
    loop {
        // Whether to parse the head; the responder itself is read once the request is in, so
        // that `set_reply` applies to the next request on a kept-alive connection too.
        let record = state.responder.lock().unwrap().is_some();
        let mut request = HttpRequest::default();
        let mut len = 0usize;
        let mut first = true;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            let text = line.trim_end_matches(['\r', '\n']);
            if first {
                first = false;
                if record {
                    let mut parts = text.split(' ');
                    request.method = parts.next().unwrap_or_default().to_owned();
                    request.path = parts.next().unwrap_or_default().to_owned();
                }
                continue;
            }
            if let Some((name, value)) = text.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    len = value.trim().parse().unwrap_or(0);
                }
                if record {
                    request.headers.push((name.to_owned(), value.trim().to_owned()));
                }
            }
        }
        body.resize(len, 0);
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let writer = reader.get_mut();
        let responder = state.responder.lock().unwrap().clone();
        let Some(responder) = responder else {
            state.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
            if writer.write_all(reply.as_bytes()).and_then(|()| writer.flush()).is_err() {
                return;
            }
            continue;
        };
        request.body = body.clone();
        let reply = responder(&request);
        state.requests.lock().unwrap().push(request);
        state.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match reply {
            HttpReply::Fixed { status, headers, body } => {
                let mut out = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                for h in headers {
                    out.push_str(&h);
                    out.push_str("\r\n");
                }
                out.push_str("\r\n");
                out.push_str(&body);
                if writer.write_all(out.as_bytes()).and_then(|()| writer.flush()).is_err() {
                    return;
                }
            }
            HttpReply::Endless { status, prefix } => {
                let head = format!("HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n\r\n");
                if writer.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut chunk = prefix.into_bytes();
                loop {
                    let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                    framed.extend_from_slice(&chunk);
                    framed.extend_from_slice(b"\r\n");
                    if writer.write_all(&framed).and_then(|()| writer.flush()).is_err() {
                        return; // the client hung up: what a capped reader does
                    }
                    chunk = vec![b'x'; 16 * 1024];
                }
            }
        }
    }
}

//! The HTTP server of the scrape endpoint and the web view: hyper HTTP/1.1 (optionally over
//! rustls) with the limits of a [`ListenerConfig`] — connection admission (the oldest idle
//! connection makes room), header and connection timeouts, the TLS handshake — and the access
//! check's answers. It is generic over a [`Handler`]: the Prometheus endpoint
//! (`prometheus/serve.rs`) and the web view (`web/serve.rs`) hold only their routes.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use gpumon_core::BuildError;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, ACCEPT_ENCODING, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};

use super::access::Access;
use super::listener::ListenerConfig;

/// How long a connection over the limit waits for a slot before it is closed.
const ADMISSION_WAIT: Duration = Duration::from_secs(1);

/// The limits, credentials and TLS of one listener.
pub(crate) struct Settings {
    /// What the listener serves, for logs ("prometheus scrape endpoint").
    pub(crate) what: &'static str,
    pub(crate) max_connections: usize,
    pub(crate) header_read_timeout: Duration,
    /// Longest a connection may stay open; a connection carrying a live stream is exempt.
    pub(crate) connection_timeout: Duration,
    pub(crate) max_header_bytes: usize,
    pub(crate) max_headers: usize,
    /// Who may read what: the admin credential, the tenants' (or nobody's: open).
    pub(crate) access: Access,
    /// `SO_SNDBUF` of accepted sockets (`None`: the kernel's autotuning). Caps what a client that
    /// stops reading a live stream can hold in kernel memory, and makes it fall behind sooner.
    #[cfg(feature = "web")]
    pub(crate) send_buffer: Option<usize>,
    #[cfg(feature = "prometheus-tls")]
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Settings {
    /// Settings for the listener configured under `section` (named in error messages); `what`
    /// names it in logs. The limits are checked by [`ListenerConfig::validate`], which the
    /// section's config runs before.
    pub(crate) fn new(
        section: &'static str,
        what: &'static str,
        listener: &ListenerConfig,
        access: Access,
    ) -> Result<Self, BuildError> {
        #[cfg(not(feature = "prometheus-tls"))]
        if listener.tls.is_some() {
            return Err(BuildError::invalid(
                format!("{section}.tls"),
                "TLS needs the `prometheus-tls` cargo feature of gpumon-sinks",
            ));
        }
        #[cfg(not(feature = "prometheus-tls"))]
        let _ = section;
        Ok(Self {
            what,
            max_connections: listener.max_connections,
            header_read_timeout: listener.header_read_timeout,
            connection_timeout: listener.connection_timeout,
            max_header_bytes: listener.max_header_bytes,
            max_headers: listener.max_headers,
            access,
            #[cfg(feature = "web")]
            send_buffer: None,
            #[cfg(feature = "prometheus-tls")]
            tls: match &listener.tls {
                Some(tls) => Some(tls::acceptor(tls, section)?),
                None => None,
            },
        })
    }
}

/// Answers the requests of one listener.
pub(crate) trait Handler: Send + Sync + 'static {
    /// The response to `req`; `settings` carries the listener's auth.
    fn respond(&self, req: &Request<Incoming>, settings: &Settings) -> Response<Body>;
}

/// A response body: bytes at once, or a live stream of chunks (Server-Sent Events).
pub(crate) struct Body {
    kind: BodyKind,
}

enum BodyKind {
    Once(Option<Bytes>),
    /// Server-Sent Events: the web view's only (without the `web` feature, never built).
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    Stream {
        rx: mpsc::Receiver<Bytes>,
        /// Notified to close the connection at once (a client too slow to keep up).
        close: Arc<Notify>,
        /// Marks the connection as carrying a stream while the body lives (set by the server).
        guard: Option<StreamGuard>,
    },
}

impl Body {
    /// A complete body.
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        Self { kind: BodyKind::Once(Some(bytes.into())) }
    }

    /// No body.
    pub(crate) fn empty() -> Self {
        Self { kind: BodyKind::Once(None) }
    }

    /// A body that sends whatever arrives on `rx` and ends when every sender is gone.
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    /// `close.notify_one()` closes the whole connection at once, whatever is still queued (or
    /// stuck in the socket's buffers).
    pub(crate) fn stream(rx: mpsc::Receiver<Bytes>, close: Arc<Notify>) -> Self {
        Self { kind: BodyKind::Stream { rx, close, guard: None } }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.kind {
            BodyKind::Once(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::Stream { rx, .. } => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(&self.kind, BodyKind::Once(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Once(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            BodyKind::Stream { .. } => SizeHint::default(),
        }
    }
}

/// Counts a live stream on its connection, so the connection is neither evicted as idle nor
/// closed by `connection_timeout` while the stream runs; and closes the connection when the
/// stream's owner asks (`close`).
struct StreamGuard {
    conn: Arc<Conn>,
    watcher: tokio::task::JoinHandle<()>,
}

impl StreamGuard {
    fn new(conn: Arc<Conn>, close: Arc<Notify>) -> Self {
        conn.streams.fetch_add(1, Ordering::AcqRel);
        let evict = conn.clone();
        let watcher = tokio::spawn(async move {
            close.notified().await;
            evict.evict.notify_one();
        });
        Self { conn, watcher }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.watcher.abort();
        self.conn.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection, as the admission logic sees it.
#[derive(Default)]
struct Conn {
    /// A request is being answered.
    busy: AtomicBool,
    /// At least one request was answered (a kept-alive scraper rather than a silent client).
    served: AtomicBool,
    /// Live streams in progress on this connection (never evicted while one runs).
    streams: AtomicUsize,
    /// Closes the connection (it was idle and its slot is needed).
    evict: Notify,
    /// The connection's slot. Taken over by the connection that evicts this one, so the slot
    /// passes directly to the newcomer and cannot be grabbed by anyone else in between.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

struct State {
    handler: Arc<dyn Handler>,
    settings: Settings,
    permits: Arc<Semaphore>,
    /// Open connections by age (id order).
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// Connections waiting for a slot (all others busy).
    waiting: AtomicUsize,
    stop: watch::Receiver<bool>,
}

impl State {
    fn conns(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection holding `permit`.
    fn register(&self, permit: OwnedSemaphorePermit) -> (u64, Arc<Conn>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn { permit: Mutex::new(Some(permit)), ..Conn::default() });
        self.conns().insert(id, conn.clone());
        (id, conn)
    }

    /// Closes the oldest connection that has no request in progress and hands its slot over.
    ///
    /// Connections that never completed a request (silent or slow-loris clients) go first; a
    /// kept-alive connection that has been served (a scraper between scrapes) only when every
    /// idle connection is one. `None` when every connection is busy answering a request.
    fn evict_oldest_idle(&self) -> Option<OwnedSemaphorePermit> {
        let mut conns = self.conns();
        let idle = |c: &Conn| !c.busy.load(Ordering::Acquire) && c.streams.load(Ordering::Acquire) == 0;
        let victim = conns
            .iter()
            .find(|(_, c)| idle(c) && !c.served.load(Ordering::Acquire))
            .or_else(|| conns.iter().find(|(_, c)| idle(c)))
            .map(|(id, _)| *id)?;
        let conn = conns.remove(&victim)?;
        drop(conns);
        conn.evict.notify_one();
        let permit = conn.permit.lock().unwrap_or_else(PoisonError::into_inner).take();
        permit
    }
}

/// The listener: bound at build time, served once a tokio runtime is available.
pub(crate) struct Server {
    local_addr: SocketAddr,
    pending: Mutex<Option<(std::net::TcpListener, Arc<State>)>>,
    stop: watch::Sender<bool>,
}

impl Server {
    /// A listener on `addr` answering with `handler`.
    pub(crate) fn bind(addr: SocketAddr, settings: Settings, handler: Arc<dyn Handler>) -> Result<Self, BuildError> {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| BuildError::Io { what: format!("cannot listen on {addr}"), source: e.into() })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| BuildError::Io { what: format!("cannot listen on {addr}"), source: e.into() })?;
        let local_addr = listener.local_addr().unwrap_or(addr);
        let (stop, stop_rx) = watch::channel(false);
        let state = Arc::new(State {
            handler,
            permits: Arc::new(Semaphore::new(settings.max_connections)),
            settings,
            conns: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            stop: stop_rx,
        });
        let server = Self { local_addr, pending: Mutex::new(Some((listener, state))), stop };
        server.ensure_started();
        Ok(server)
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Spawns the accept loop on the current runtime, once; a no-op outside a runtime.
    pub(crate) fn ensure_started(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let Some((std_listener, state)) = pending.take() else { return };
        let _guard = runtime.enter();
        match TcpListener::from_std(std_listener) {
            Ok(listener) => {
                tracing::info!(addr = %self.local_addr, "{} listening", state.settings.what);
                runtime.spawn(accept_loop(listener, state));
            }
            Err(e) => tracing::error!(addr = %self.local_addr, error = %e, "{} failed to start", state.settings.what),
        }
    }

    pub(crate) fn stop(&self) {
        let _ = self.stop.send(true);
        // Not started yet: dropping the std listener closes the socket.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut stop = state.stop.clone();
    let mut accept_error_logged = false;
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                accept_error_logged = false;
                stream
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; log once per run of errors.
                if !accept_error_logged {
                    tracing::warn!(error = %e, "{}: accept failed", state.settings.what);
                    accept_error_logged = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        #[cfg(feature = "web")]
        if let Some(n) = state.settings.send_buffer {
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(n);
        }
        let permit = state.permits.clone().try_acquire_owned().ok().or_else(|| state.evict_oldest_idle());
        if let Some(permit) = permit {
            let (id, conn) = state.register(permit);
            tokio::spawn(serve(state.clone(), stream, id, conn));
            continue;
        }
        // Every slot is answering a request right now (they finish in well under a
        // millisecond): wait briefly. The number of waiters is bounded too, so a flood
        // cannot pile up.
        if state.waiting.fetch_add(1, Ordering::AcqRel) >= state.settings.max_connections {
            state.waiting.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let state = state.clone();
        tokio::spawn(async move {
            let permit = tokio::time::timeout(ADMISSION_WAIT, state.permits.clone().acquire_owned()).await;
            state.waiting.fetch_sub(1, Ordering::AcqRel);
            if let Ok(Ok(permit)) = permit {
                let (id, conn) = state.register(permit);
                serve(state, stream, id, conn).await;
            }
        });
    }
}

/// Removes a connection from the table when its task ends.
struct Registered<'a> {
    state: &'a State,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.state.conns().remove(&self.id);
    }
}

async fn serve(state: Arc<State>, stream: tokio::net::TcpStream, id: u64, conn: Arc<Conn>) {
    let _registered = Registered { state: &state, id };
    let deadline = tokio::time::Instant::now() + state.settings.connection_timeout;

    #[cfg(feature = "prometheus-tls")]
    if let Some(acceptor) = &state.settings.tls {
        let handshake = tokio::select! {
            r = tokio::time::timeout(state.settings.header_read_timeout, acceptor.accept(stream)) => r,
            _ = conn.evict.notified() => return,
        };
        if let Ok(Ok(tls)) = handshake {
            drive(&state, TokioIo::new(tls), &conn, deadline).await;
        }
        return;
    }
    drive(&state, TokioIo::new(stream), &conn, deadline).await;
}

async fn drive<I>(state: &Arc<State>, io: I, conn: &Arc<Conn>, deadline: tokio::time::Instant)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc_state = state.clone();
    let svc_conn = conn.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = svc_state.clone();
        let conn = svc_conn.clone();
        async move {
            conn.busy.store(true, Ordering::Release);
            let mut response = state.handler.respond(&req, &state.settings);
            if let BodyKind::Stream { guard, close, .. } = &mut response.body_mut().kind {
                *guard = Some(StreamGuard::new(conn.clone(), close.clone()));
            }
            conn.served.store(true, Ordering::Release);
            conn.busy.store(false, Ordering::Release);
            Ok::<_, Infallible>(response)
        }
    });
    let s = &state.settings;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(s.header_read_timeout)
        .max_buf_size(s.max_header_bytes)
        .max_headers(s.max_headers)
        .keep_alive(true);
    let connection = builder.serve_connection(io, svc);
    tokio::pin!(connection);
    let mut stop = state.stop.clone();
    let mut deadline = deadline;
    loop {
        tokio::select! {
            _ = &mut connection => break,
            _ = conn.evict.notified() => break,
            _ = tokio::time::sleep_until(deadline) => {
                // A live stream outlives the connection timeout (it is bounded by the number of
                // live clients instead); look again a timeout later.
                if conn.streams.load(Ordering::Acquire) == 0 {
                    break;
                }
                deadline += s.connection_timeout.max(Duration::from_secs(1));
            }
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

pub(crate) fn text_response(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// Whether the client takes a gzip-coded answer: `Accept-Encoding` names `gzip` (or `*`) with
/// a quality above zero (`gzip;q=0` refuses it).
pub(crate) fn accepts_gzip(req: &Request<Incoming>) -> bool {
    req.headers().get_all(ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                let p = p.trim();
                p.strip_prefix("q=")
                    .or_else(|| p.strip_prefix("Q="))
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        },
    )
}

/// `body` gzip-compressed at the fastest level: a scrape is compressed once per request, and
/// level 1 already takes a Prometheus exposition to about a tenth of its size.
pub(crate) fn gzip_fast(body: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder =
        flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 8 + 64), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

/// The `405` answer unless the method is GET or HEAD.
pub(crate) fn reject_method(req: &Request<Incoming>) -> Option<Response<Body>> {
    if req.method() == Method::GET || req.method() == Method::HEAD {
        return None;
    }
    let mut r = text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    Some(r)
}

#[cfg(feature = "prometheus-tls")]
mod tls {
    use std::sync::Arc;

    use gpumon_core::BuildError;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use crate::http::listener::TlsConfig;

    fn io(what: String, e: impl Into<gpumon_core::BoxError>) -> BuildError {
        BuildError::Io { what, source: e.into() }
    }

    /// A TLS acceptor for the PEM files in `config` (ring provider, TLS 1.2 and 1.3, ALPN
    /// `http/1.1`).
    pub(super) fn acceptor(config: &TlsConfig, section: &str) -> Result<tokio_rustls::TlsAcceptor, BuildError> {
        let cert_pem = std::fs::read(&config.cert)
            .map_err(|e| io(format!("cannot read TLS certificate {}", config.cert.display()), e))?;
        let key_pem =
            std::fs::read(&config.key).map_err(|e| io(format!("cannot read TLS key {}", config.key.display()), e))?;
        // PEM through rustls' own `pki-types` (`rustls-pemfile` is unmaintained).
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io(format!("bad PEM in {}", config.cert.display()), e))?;
        if certs.is_empty() {
            return Err(BuildError::invalid(
                format!("{section}.tls.cert"),
                format!("no certificate found in {}", config.cert.display()),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
            pem::Error::NoItemsFound => BuildError::invalid(
                format!("{section}.tls.key"),
                format!("no private key found in {}", config.key.display()),
            ),
            e => io(format!("bad PEM in {}", config.key.display()), e),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| io("TLS setup".to_owned(), e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                BuildError::invalid(
                    format!("{section}.tls"),
                    format!("certificate and key do not make a usable pair: {e}"),
                )
            })?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
    }
}

//! The scrape endpoint: hyper HTTP/1.1 (optionally over rustls) with request limits.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use gpumon_core::BuildError;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use super::{Auth, PrometheusConfig, PrometheusHandle};

/// How long a connection over the limit waits for a slot before it is closed.
const ADMISSION_WAIT: Duration = Duration::from_secs(1);

struct Settings {
    max_connections: usize,
    header_read_timeout: Duration,
    connection_timeout: Duration,
    max_header_bytes: usize,
    max_headers: usize,
    auth: Option<Auth>,
    #[cfg(feature = "prometheus-tls")]
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// One accepted connection, as the admission logic sees it.
#[derive(Default)]
struct Conn {
    /// A request is being answered.
    busy: AtomicBool,
    /// At least one request was answered (a kept-alive scraper rather than a silent client).
    served: AtomicBool,
    /// Closes the connection (it was idle and its slot is needed).
    evict: Notify,
    /// The connection's slot. Taken over by the connection that evicts this one, so the slot
    /// passes directly to the newcomer and cannot be grabbed by anyone else in between.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

struct State {
    handle: PrometheusHandle,
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
        let idle = |c: &Conn| !c.busy.load(Ordering::Acquire);
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
    pub(crate) fn bind(
        addr: SocketAddr,
        config: &PrometheusConfig,
        handle: PrometheusHandle,
    ) -> Result<Self, BuildError> {
        let settings = Settings {
            max_connections: config.max_connections,
            header_read_timeout: config.header_read_timeout,
            connection_timeout: config.connection_timeout,
            max_header_bytes: config.max_header_bytes,
            max_headers: config.max_headers,
            auth: config.auth.clone(),
            #[cfg(feature = "prometheus-tls")]
            tls: match &config.tls {
                Some(tls) => Some(tls::acceptor(tls)?),
                None => None,
            },
        };
        #[cfg(not(feature = "prometheus-tls"))]
        if config.tls.is_some() {
            return Err(BuildError::invalid(
                "prometheus.tls",
                "TLS needs the `prometheus-tls` cargo feature of gpumon-sinks",
            ));
        }
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| BuildError::Io { what: format!("cannot listen on {addr}"), source: e.into() })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| BuildError::Io { what: format!("cannot listen on {addr}"), source: e.into() })?;
        let local_addr = listener.local_addr().unwrap_or(addr);
        let (stop, stop_rx) = watch::channel(false);
        let state = Arc::new(State {
            handle,
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
                tracing::info!(addr = %self.local_addr, "prometheus scrape endpoint listening");
                runtime.spawn(accept_loop(listener, state));
            }
            Err(e) => tracing::error!(addr = %self.local_addr, error = %e, "prometheus listener failed to start"),
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
                    tracing::warn!(error = %e, "prometheus endpoint: accept failed");
                    accept_error_logged = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
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
            let response = respond(&state, &req);
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
    let mut stop = state.stop.clone();
    tokio::select! {
        _ = connection => {}
        _ = conn.evict.notified() => {}
        _ = tokio::time::sleep_until(deadline) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

fn text_response(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn respond(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path != "/metrics" && path != "/health" && path != "/live" {
        return text_response(StatusCode::NOT_FOUND, "not found: try /metrics, /health or /live\n");
    }
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let handle = &state.handle;
    let mut response = if path == "/live" {
        // Liveness: the process serves. Unlike `/health` (readiness), it stays 200 while the
        // backend fails, so an orchestrator does not restart an agent that waits for a driver.
        text_response(StatusCode::OK, "live\n")
    } else if path == "/health" {
        match handle.health() {
            Ok(()) => text_response(StatusCode::OK, "ok\n"),
            Err(reason) => {
                let mut r = Response::new(Full::new(Bytes::from(format!("unhealthy: {reason}\n"))));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                r
            }
        }
    } else {
        if let Some(auth) = &state.settings.auth {
            let given = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok());
            if !authorized(auth, given) {
                let mut r = text_response(StatusCode::UNAUTHORIZED, "unauthorized\n");
                let challenge = match auth {
                    Auth::Bearer { .. } => "Bearer realm=\"gpumon\"",
                    Auth::Basic { .. } => "Basic realm=\"gpumon\", charset=\"UTF-8\"",
                };
                r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
                return r;
            }
        }
        let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
        let format = handle.negotiate(accept);
        let body = handle.render(format);
        let mut r = Response::new(Full::new(Bytes::from(body)));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
        r
    };
    if head {
        // hyper sends no body for HEAD; keep the headers.
        *response.body_mut() = Full::new(Bytes::new());
    }
    response
}

/// Byte-wise comparison whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `Authorization` header value satisfies `auth`.
pub(crate) fn authorized(auth: &Auth, header: Option<&str>) -> bool {
    let Some(header) = header else { return false };
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header, ""));
    let rest = rest.trim();
    match auth {
        Auth::Bearer { token } => {
            scheme.eq_ignore_ascii_case("bearer") && constant_time_eq(rest.as_bytes(), token.as_bytes())
        }
        Auth::Basic { username, password } => {
            if !scheme.eq_ignore_ascii_case("basic") {
                return false;
            }
            use base64::Engine as _;
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) else { return false };
            let Some(colon) = decoded.iter().position(|&b| b == b':') else { return false };
            let (user, pass) = (&decoded[..colon], &decoded[colon + 1..]);
            // Evaluate both so the time does not tell which one was wrong.
            let user_ok = constant_time_eq(user, username.as_bytes());
            let pass_ok = constant_time_eq(pass, password.as_bytes());
            user_ok & pass_ok
        }
    }
}

#[cfg(feature = "prometheus-tls")]
mod tls {
    use std::sync::Arc;

    use gpumon_core::BuildError;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use crate::prometheus::TlsConfig;

    fn io(what: String, e: impl Into<gpumon_core::BoxError>) -> BuildError {
        BuildError::Io { what, source: e.into() }
    }

    /// A TLS acceptor for the PEM files in `config` (ring provider, TLS 1.2 and 1.3, ALPN
    /// `http/1.1`).
    pub(super) fn acceptor(config: &TlsConfig) -> Result<tokio_rustls::TlsAcceptor, BuildError> {
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
                "prometheus.tls.cert",
                format!("no certificate found in {}", config.cert.display()),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
            pem::Error::NoItemsFound => {
                BuildError::invalid("prometheus.tls.key", format!("no private key found in {}", config.key.display()))
            }
            e => io(format!("bad PEM in {}", config.key.display()), e),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| io("TLS setup".to_owned(), e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                BuildError::invalid("prometheus.tls", format!("certificate and key do not make a usable pair: {e}"))
            })?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_auth() {
        let auth = Auth::bearer("t0ken");
        assert!(authorized(&auth, Some("Bearer t0ken")));
        assert!(authorized(&auth, Some("bearer t0ken")));
        assert!(!authorized(&auth, Some("Bearer t0ke")));
        assert!(!authorized(&auth, Some("Bearer t0kenX")));
        assert!(!authorized(&auth, Some("Basic t0ken")));
        assert!(!authorized(&auth, Some("t0ken")));
        assert!(!authorized(&auth, None));
    }

    #[test]
    fn basic_auth() {
        use base64::Engine as _;
        let auth = Auth::basic("prom", "pa:ss");
        let enc = |s: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s));
        assert!(authorized(&auth, Some(&enc("prom:pa:ss"))));
        assert!(!authorized(&auth, Some(&enc("prom:pa:sX"))));
        assert!(!authorized(&auth, Some(&enc("prox:pa:ss"))));
        assert!(!authorized(&auth, Some(&enc("prompa:ss"))));
        assert!(!authorized(&auth, Some("Basic !!!not-base64")));
        assert!(!authorized(&auth, Some(&enc("prom:pa:ss").replace("Basic", "Bearer"))));
    }
}

//! The web view's routes.

use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER, VARY};
use hyper::{Request, Response, StatusCode};

use super::assets;
use super::hub::Hub;
use crate::http::access::Scope;
use crate::http::server::{accepts_gzip, gzip_fast, reject_method, text_response, Body, Handler, Settings};

/// The web view's Content-Security-Policy: no inline script or style, nothing from elsewhere (the
/// page's own files and its own API only).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(crate) struct Web(pub(crate) Arc<Hub>);

impl Handler for Web {
    fn respond(&self, req: &Request<Incoming>, settings: &Settings) -> Response<Body> {
        let mut r = route(&self.0, req, settings);
        let h = r.headers_mut();
        h.insert(HeaderName::from_static("content-security-policy"), HeaderValue::from_static(CSP));
        h.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
        h.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
        h.insert(HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY"));
        r
    }
}

/// `Retry-After` of every 503: seconds (the page's first wait after a 503, `app.js`).
const RETRY_AFTER_SECONDS: &str = "5";

fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// [`json`], gzip-compressed when the client accepts it (a snapshot or a history compresses
/// about tenfold).
fn json_negotiated(
    req: &Request<Incoming>,
    status: StatusCode,
    body: impl Into<Bytes> + AsRef<[u8]>,
) -> Response<Body> {
    if !accepts_gzip(req) {
        let mut r = json(status, body);
        r.headers_mut().insert(VARY, HeaderValue::from_static("accept-encoding"));
        return r;
    }
    let mut r = json(status, gzip_fast(body.as_ref()));
    r.headers_mut().insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    r.headers_mut().insert(VARY, HeaderValue::from_static("accept-encoding"));
    r
}

fn route(hub: &Arc<Hub>, req: &Request<Incoming>, settings: &Settings) -> Response<Body> {
    if let Some(r) = reject_method(req) {
        return r;
    }
    let head = req.method() == hyper::Method::HEAD;
    // Every path, the page's files included, needs a credential when any is configured; the
    // data routes answer with the caller's view (a tenant's is scoped per request or, for live
    // streams, per tick and tenant — never one reader's rendering for another).
    let scope = match settings.access.authenticate(req) {
        Some(Scope::All) => None,
        Some(Scope::Tenant { index, .. }) => Some(index),
        None => return settings.access.unauthorized(),
    };
    let mut r = match req.uri().path() {
        "/api/snapshot" => match hub.latest_for(scope) {
            // No GPU data this tick (a sampling-failed snapshot): the page's live stream shows
            // why; an API client gets what it would before the first sample, and the reason.
            Some(s) => match s.sampling_failure() {
                Some(reason) => {
                    let body = serde_json::json!({ "error": format!("last sample failed: {reason}") }).to_string();
                    json(StatusCode::SERVICE_UNAVAILABLE, body)
                }
                None => match serde_json::to_vec(&*s) {
                    Ok(body) => json_negotiated(req, StatusCode::OK, body),
                    Err(_) => text_response(StatusCode::INTERNAL_SERVER_ERROR, "cannot serialise the snapshot\n"),
                },
            },
            None => json(StatusCode::SERVICE_UNAVAILABLE, "{\"error\":\"no snapshot yet\"}"),
        },
        "/api/history" => match seconds(req.uri().query()) {
            Ok(s) => json_negotiated(req, StatusCode::OK, hub.history_json_for(s, scope)),
            Err(msg) => {
                let body = serde_json::json!({ "error": msg }).to_string();
                json(StatusCode::BAD_REQUEST, body)
            }
        },
        // Browsers ask for it on their own; an empty answer keeps their consoles clean.
        "/favicon.ico" => {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        "/api/stream" if head => {
            let mut r = Response::new(Body::empty());
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            r
        }
        "/api/stream" => match hub.subscribe_with(scope, accepts_gzip(req)) {
            Ok(client) => {
                let gzip = client.gzip;
                let mut r = Response::new(Body::stream(client.rx, client.close));
                let h = r.headers_mut();
                h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
                h.insert(VARY, HeaderValue::from_static("accept-encoding"));
                // One gzip stream, flushed after every event (see web/page.rs).
                if gzip {
                    h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                }
                r
            }
            Err(refused) => text_response(StatusCode::SERVICE_UNAVAILABLE, format!("{refused}\n")),
        },
        path => match assets::find(path) {
            Some(asset) => {
                let gzip = accepts_gzip(req);
                let mut r = Response::new(if gzip { Body::full(asset.gzip()) } else { Body::full(asset.bytes) });
                let h = r.headers_mut();
                h.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
                h.insert(VARY, HeaderValue::from_static("accept-encoding"));
                h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                if gzip {
                    h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                }
                r
            }
            None => {
                text_response(StatusCode::NOT_FOUND, "not found: try /, /api/snapshot, /api/history or /api/stream\n")
            }
        },
    };
    // Every 503 (no snapshot yet, the last sample failed, the server full) is temporary: say
    // when to come back, as the page's own backoff after a 503 starts (5 s).
    if r.status() == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
    }
    if head {
        // hyper sends no body for HEAD; keep the headers.
        *r.body_mut() = Body::empty();
    }
    r
}

/// `seconds=N` from the query: a positive number (default 300).
pub(crate) fn seconds(query: Option<&str>) -> Result<f64, String> {
    let Some(query) = query else { return Ok(300.0) };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "seconds" {
            return match v.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => Ok(s),
                _ => Err(format!("seconds: expected a positive number of seconds, got `{v}`")),
            };
        }
    }
    Ok(300.0)
}

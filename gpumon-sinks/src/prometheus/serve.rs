//! The scrape endpoint's routes (`/metrics`, `/health`, `/live`) on the shared HTTP server
//! ([`crate::http::server`]), which holds the listener, its limits, TLS and access control.

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Method, Request, Response, StatusCode};

use super::PrometheusHandle;
use crate::http::access::Scope;
use crate::http::server::{accepts_gzip, gzip_fast, reject_method, text_response, Body, Handler, Settings};

/// The Prometheus endpoint's requests.
pub(super) struct Scrape(pub(super) PrometheusHandle);

impl Handler for Scrape {
    fn respond(&self, req: &Request<Incoming>, settings: &Settings) -> Response<Body> {
        respond(&self.0, settings, req)
    }
}

fn respond(handle: &PrometheusHandle, settings: &Settings, req: &Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path != "/metrics" && path != "/health" && path != "/live" {
        return text_response(StatusCode::NOT_FOUND, "not found: try /metrics, /health or /live\n");
    }
    if let Some(r) = reject_method(req) {
        return r;
    }
    let head = req.method() == Method::HEAD;
    let mut response = if path == "/live" {
        // Liveness: the process serves. Unlike `/health` (readiness), it stays 200 while the
        // backend fails, so an orchestrator does not restart an agent that waits for a driver.
        text_response(StatusCode::OK, "live\n")
    } else if path == "/health" {
        match handle.health() {
            Ok(()) => text_response(StatusCode::OK, "ok\n"),
            Err(reason) => {
                let mut r = Response::new(Body::full(format!("unhealthy: {reason}\n")));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                r
            }
        }
    } else {
        let Some(scope) = settings.access.authenticate(req) else {
            return settings.access.unauthorized();
        };
        let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
        let format = handle.negotiate(accept);
        // A tenant's view is scoped per request, from the same snapshot; nothing rendered for
        // one reader is kept for another.
        let body = match scope {
            Scope::All => handle.render(format),
            Scope::Tenant { tenant, .. } => handle.render_for(format, &tenant.selector),
        };
        // Compressed when the scraper takes it, as Prometheus's own client libraries do: the
        // exposition of 8 GPUs shrinks about tenfold on the wire.
        let gzip = accepts_gzip(req);
        let mut r = Response::new(if gzip { Body::full(gzip_fast(body.as_bytes())) } else { Body::full(body) });
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
        h.insert(VARY, HeaderValue::from_static("accept-encoding"));
        if gzip {
            h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        r
    };
    if head {
        // hyper sends no body for HEAD; keep the headers.
        *response.body_mut() = Body::empty();
    }
    response
}

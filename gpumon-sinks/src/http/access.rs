//! Access control of a listener, beside the [server](super::server): the credential a listener
//! is configured with ([`Auth`]; the tenants' are in [`tenants`](super::tenants)) and who a
//! request is — the admin (the listener's `auth`, sees everything), a tenant (sees its own
//! view), or nobody (`401`). Shared by the scrape endpoint and the web view. [`Auth`] is
//! configuration (the `prometheus` feature has it without a server); the checks need the server
//! (`_http-server`).

use gpumon_core::BuildError;
#[cfg(feature = "_http-server")]
use hyper::body::Incoming;
#[cfg(feature = "_http-server")]
use hyper::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
#[cfg(feature = "_http-server")]
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;

use crate::Secret;

#[cfg(feature = "_http-server")]
use super::server::{text_response, Body};
#[cfg(feature = "_http-server")]
use super::tenants::Tenant;

/// Credentials a request must present (`auth` of `[prometheus]` or `[web]`: the admin credential,
/// which reads everything).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Auth {
    /// `Authorization: Bearer <token>`. TOML: `auth = { bearer = { token = "…" } }`.
    Bearer {
        /// The token.
        token: Secret,
    },
    /// HTTP Basic. TOML: `auth = { basic = { username = "…", password = "…" } }`.
    Basic {
        /// User name (must not contain `:`).
        username: String,
        /// Password.
        password: Secret,
    },
}

impl Auth {
    /// Bearer-token auth.
    pub fn bearer(token: impl Into<Secret>) -> Self {
        Auth::Bearer { token: token.into() }
    }

    /// Basic auth.
    pub fn basic(username: impl Into<String>, password: impl Into<Secret>) -> Self {
        Auth::Basic { username: username.into(), password: password.into() }
    }

    /// Checks the credential configured as `section.auth`; errors name the key
    /// (`web.auth.bearer.token`).
    pub(crate) fn validate(&self, section: &str) -> Result<(), BuildError> {
        match self.problem() {
            Some(problem) if matches!(self, Auth::Bearer { .. }) => {
                Err(BuildError::invalid(format!("{section}.auth.bearer.token"), problem))
            }
            Some(problem) => Err(BuildError::invalid(format!("{section}.auth.basic.username"), problem)),
            None => Ok(()),
        }
    }

    /// What is wrong with the credential, if anything: the bearer token's problem, or a Basic
    /// user name that is empty or holds the `:` that ends it. The one check of the listener's
    /// credential and every tenant's, which word their keys differently.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        match self {
            Auth::Bearer { token } => token.token_problem(),
            Auth::Basic { username, .. } if username.is_empty() || username.contains(':') => {
                Some("must be non-empty and must not contain `:`")
            }
            Auth::Basic { .. } => None,
        }
    }
}

#[cfg(feature = "_http-server")]
/// The credentials a listener accepts.
#[derive(Debug, Default)]
pub(crate) struct Access {
    admin: Option<Auth>,
    tenants: Vec<Tenant>,
}

#[cfg(feature = "_http-server")]
/// What a request may read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scope<'a> {
    /// Everything: the admin credential, or a listener without any credential configured.
    All,
    /// The view of tenant `index` (its position in the configuration).
    Tenant {
        /// Position in the configured tenants (the same order everywhere). Read by the web
        /// view only.
        #[cfg_attr(not(feature = "web"), allow(dead_code))]
        index: usize,
        /// The tenant.
        tenant: &'a Tenant,
    },
}

#[cfg(feature = "_http-server")]
impl Access {
    /// `admin` sees everything; each of `tenants` (checked by `tenants::resolve`) its own view.
    pub(crate) fn new(admin: Option<Auth>, tenants: Vec<Tenant>) -> Self {
        Self { admin, tenants }
    }

    /// The scope of `req`; `None` when it may read nothing (answer with
    /// [`unauthorized`](Self::unauthorized)).
    ///
    /// Without any credential configured every request reads everything (as before tenants
    /// existed). Otherwise the `Authorization` header must match the admin's or a tenant's
    /// credential; it is compared with every one of them in constant time, so the answer's
    /// timing says neither which credential nearly matched nor how far.
    pub(crate) fn authenticate(&self, req: &Request<Incoming>) -> Option<Scope<'_>> {
        if self.admin.is_none() && self.tenants.is_empty() {
            return Some(Scope::All);
        }
        let header = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok());
        let presented = Presented::parse(header);
        let mut admin = false;
        let mut found = None;
        if let (Some(p), Some(auth)) = (&presented, &self.admin) {
            admin = p.satisfies(auth);
        }
        for (index, tenant) in self.tenants.iter().enumerate() {
            // Every credential is compared, whatever matched before.
            let hit = presented.as_ref().is_some_and(|p| p.satisfies(&tenant.auth));
            if hit {
                found = Some(index);
            }
        }
        match (admin, found) {
            (true, _) => Some(Scope::All),
            (false, Some(index)) => Some(Scope::Tenant { index, tenant: &self.tenants[index] }),
            (false, None) => None,
        }
    }

    /// `401` with one challenge per scheme in use (Basic first: a browser takes the first scheme
    /// it knows).
    pub(crate) fn unauthorized(&self) -> Response<Body> {
        let mut r = text_response(StatusCode::UNAUTHORIZED, "unauthorized\n");
        let auths = || self.admin.iter().chain(self.tenants.iter().map(|t| &t.auth));
        if auths().any(|a| matches!(a, Auth::Basic { .. })) {
            r.headers_mut()
                .append(WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"gpumon\", charset=\"UTF-8\""));
        }
        if auths().any(|a| matches!(a, Auth::Bearer { .. })) {
            r.headers_mut().append(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"gpumon\""));
        }
        r
    }
}

#[cfg(feature = "_http-server")]
/// The credential an `Authorization` header carries.
enum Presented {
    Bearer(String),
    Basic { user: Vec<u8>, pass: Vec<u8> },
}

#[cfg(feature = "_http-server")]
impl Presented {
    fn parse(header: Option<&str>) -> Option<Self> {
        let header = header?.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(Presented::Bearer(rest.to_owned()));
        }
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        use base64::Engine as _;
        let mut decoded = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
        let colon = decoded.iter().position(|&b| b == b':')?;
        let pass = decoded.split_off(colon + 1);
        decoded.truncate(colon);
        Some(Presented::Basic { user: decoded, pass })
    }

    fn satisfies(&self, auth: &Auth) -> bool {
        match (self, auth) {
            (Presented::Bearer(given), Auth::Bearer { token }) => {
                constant_time_eq(given.as_bytes(), token.expose().as_bytes())
            }
            (Presented::Basic { user, pass }, Auth::Basic { username, password }) => {
                // Evaluate both so the time does not tell which one was wrong.
                let user_ok = constant_time_eq(user, username.as_bytes());
                let pass_ok = constant_time_eq(pass, password.expose().as_bytes());
                user_ok & pass_ok
            }
            _ => false,
        }
    }
}

#[cfg(feature = "_http-server")]
/// Byte-wise comparison whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `Authorization` header value satisfies `auth`.
#[cfg(all(test, feature = "_http-server"))]
pub(crate) fn authorized(auth: &Auth, header: Option<&str>) -> bool {
    Presented::parse(header).is_some_and(|p| p.satisfies(auth))
}

// The checks need the server; the credential's `Debug` is tested with every other credential
// setting in `tests/credentials.rs`.
#[cfg(all(test, feature = "_http-server"))]
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

//! Tenants of the scrape endpoint and the web view: a credential mapped to a
//! [`TenantSelector`]. A request with a tenant's credential gets only that tenant's view of the
//! latest snapshot ([`Snapshot::scoped_to`](gpumon_core::Snapshot::scoped_to)); see
//! `docs/tenancy.md`. Part of the listener's access control ([`access`](super::access)).
// The configuration (`[[prometheus.tenants]]`) is parsed with the section's config (without a
// server, too: feature `prometheus`); only the HTTP server resolves a credential to a tenant.
#![cfg_attr(not(feature = "_http-server"), allow(dead_code))]

use std::path::PathBuf;

use gpumon_core::attribution::TenantSelector;
use gpumon_core::BuildError;
use serde::Deserialize;

use super::access::Auth;
use crate::Secret;

/// One tenant (`[[prometheus.tenants]]` / `[[web.tenants]]` in the agent's config file): its
/// name, its selector, and exactly one credential — `bearer`, `token_file` or `basic`.
///
/// ```toml
/// [[prometheus.tenants]]
/// name = "team-a"
/// selector = { namespace = "team-a" }
/// token_file = "/run/secrets/gpumon-team-a"   # or: bearer = "…", or: basic = { username = "…", password = "…" }
/// ```
///
/// The struct is `#[non_exhaustive]`: build one with [`TenantConfig::bearer`],
/// [`TenantConfig::basic`] or [`TenantConfig::token_file`].
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TenantConfig {
    /// The tenant's name, for logs and error messages (unique among the tenants).
    pub name: String,
    /// Whose GPUs the tenant sees (Kubernetes namespace, container, Unix user or group of the
    /// GPU processes).
    pub selector: TenantSelector,
    /// `Authorization: Bearer <token>`.
    #[serde(default)]
    pub bearer: Option<Secret>,
    /// A file holding the bearer token (read once, when the sink is built; surrounding
    /// whitespace, such as the final newline, is ignored).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// HTTP Basic credentials (what a browser asks for, so the web page works for the tenant).
    #[serde(default)]
    pub basic: Option<BasicCredentials>,
}

/// A user name and password for HTTP Basic auth.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BasicCredentials {
    /// User name (must not contain `:`).
    pub username: String,
    /// Password.
    pub password: Secret,
}

impl TenantConfig {
    /// A tenant that presents `Authorization: Bearer <token>`.
    pub fn bearer(name: impl Into<String>, token: impl Into<Secret>, selector: TenantSelector) -> Self {
        Self { name: name.into(), selector, bearer: Some(token.into()), token_file: None, basic: None }
    }

    /// A tenant that presents HTTP Basic credentials.
    pub fn basic(
        name: impl Into<String>,
        username: impl Into<String>,
        password: impl Into<Secret>,
        selector: TenantSelector,
    ) -> Self {
        let basic = BasicCredentials { username: username.into(), password: password.into() };
        Self { name: name.into(), selector, bearer: None, token_file: None, basic: Some(basic) }
    }

    /// A tenant whose bearer token is in the file at `path`.
    pub fn token_file(name: impl Into<String>, path: impl Into<PathBuf>, selector: TenantSelector) -> Self {
        Self { name: name.into(), selector, bearer: None, token_file: Some(path.into()), basic: None }
    }
}

/// A tenant ready to serve: its credential resolved (token file read) and checked.
#[derive(Clone, Debug)]
pub(crate) struct Tenant {
    pub(crate) name: String,
    pub(crate) auth: Auth,
    pub(crate) selector: TenantSelector,
}

/// Checks the tenants of the listener configured under `section` (`prometheus`, `web`) and
/// reads their token files. Every error names the key: `prometheus.tenants[1].bearer`.
///
/// # Errors
/// [`BuildError::InvalidConfig`] for a missing, empty, doubled or ambiguous credential or name;
/// [`BuildError::Io`] for a token file that cannot be read.
pub(crate) fn resolve(
    section: &str,
    admin: Option<&Auth>,
    tenants: &[TenantConfig],
) -> Result<Vec<Tenant>, BuildError> {
    let mut resolved: Vec<Tenant> = Vec::with_capacity(tenants.len());
    for (i, t) in tenants.iter().enumerate() {
        let key = format!("{section}.tenants[{i}]");
        if t.name.trim().is_empty() {
            return Err(BuildError::invalid(format!("{key}.name"), "must not be empty"));
        }
        if let Some(j) = resolved.iter().position(|r| r.name == t.name) {
            return Err(BuildError::invalid(
                format!("{key}.name"),
                format!("`{}` is also the name of {section}.tenants[{j}]", t.name),
            ));
        }
        let (auth, credential_key) = match (&t.bearer, &t.token_file, &t.basic) {
            (Some(token), None, None) => (Auth::bearer(token.clone()), format!("{key}.bearer")),
            (None, Some(path), None) => {
                let text = std::fs::read_to_string(path).map_err(|e| BuildError::Io {
                    what: format!("cannot read {key}.token_file {}", path.display()),
                    source: e.into(),
                })?;
                (Auth::bearer(text.trim()), format!("{key}.token_file"))
            }
            (None, None, Some(b)) => (Auth::basic(b.username.clone(), b.password.clone()), format!("{key}.basic")),
            _ => {
                return Err(BuildError::invalid(
                    key,
                    format!("tenant `{}` needs exactly one credential: bearer, token_file or basic", t.name),
                ))
            }
        };
        check_credential(&auth, &credential_key)?;
        let clash = |other: &Auth| match (&auth, other) {
            (Auth::Bearer { token: a }, Auth::Bearer { token: b }) => a == b,
            // One user name, one tenant: otherwise the password alone would pick the view.
            (Auth::Basic { username: a, .. }, Auth::Basic { username: b, .. }) => a == b,
            _ => false,
        };
        if admin.is_some_and(clash) {
            return Err(BuildError::invalid(credential_key, format!("is the same credential as {section}.auth")));
        }
        if let Some(j) = resolved.iter().position(|r| clash(&r.auth)) {
            return Err(BuildError::invalid(
                credential_key,
                format!("is the same credential as {section}.tenants[{j}] (`{}`)", resolved[j].name),
            ));
        }
        resolved.push(Tenant { name: t.name.clone(), auth, selector: t.selector.clone() });
    }
    Ok(resolved)
}

fn check_credential(auth: &Auth, key: &str) -> Result<(), BuildError> {
    match auth.problem() {
        Some(problem) if matches!(auth, Auth::Bearer { .. }) => {
            Err(BuildError::invalid(key, format!("the token {problem}")))
        }
        Some(problem) => Err(BuildError::invalid(format!("{key}.username"), problem)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> TenantSelector {
        s.parse().unwrap()
    }

    fn err(admin: Option<&Auth>, tenants: &[TenantConfig]) -> String {
        resolve("prometheus", admin, tenants).unwrap_err().to_string()
    }

    #[test]
    fn config_parses_every_credential_form_and_redacts_secrets() {
        #[derive(Debug, Deserialize)]
        struct File {
            tenants: Vec<TenantConfig>,
        }
        let f: File = toml::from_str(
            r#"
            [[tenants]]
            name = "a"
            selector = { namespace = "team-a" }
            bearer = "tok-a"
            [[tenants]]
            name = "b"
            selector = "user=1000"
            basic = { username = "b", password = "pw-b" }
            [[tenants]]
            name = "c"
            selector = { group = 100 }
            token_file = "/run/secrets/c"
            "#,
        )
        .unwrap();
        assert_eq!(f.tenants[0], TenantConfig::bearer("a", "tok-a", sel("namespace=team-a")));
        assert_eq!(f.tenants[1], TenantConfig::basic("b", "b", "pw-b", sel("user=1000")));
        assert_eq!(f.tenants[2], TenantConfig::token_file("c", "/run/secrets/c", sel("group=100")));
        let debug = format!("{:?}", f.tenants);
        assert!(!debug.contains("tok-a") && !debug.contains("pw-b"), "{debug}");

        let bad = |toml: &str| toml::from_str::<File>(toml).unwrap_err().to_string();
        let e = bad("[[tenants]]\nname = \"a\"\nselector = { group = \"gpu\" }\nbearer = \"t\"");
        assert!(e.contains("numeric gid") && e.contains("selector"), "{e}");
        let e = bad("[[tenants]]\nname = \"a\"\nselector = {}\nbearer = \"t\"");
        assert!(e.contains("at least one of"), "{e}");
        let e = bad("[[tenants]]\nname = \"a\"\nselector = { namespace = \"a\" }\ntoken = \"t\"");
        assert!(e.contains("unknown field `token`"), "{e}");
    }

    #[test]
    fn resolve_names_the_key_of_every_mistake() {
        let a = || TenantConfig::bearer("a", "tok-a", sel("namespace=a"));
        let mut none = a();
        none.bearer = None;
        assert!(err(None, &[none]).contains("prometheus.tenants[0]"));
        let mut two = a();
        two.basic = Some(BasicCredentials { username: "u".into(), password: "p".into() });
        assert!(err(None, &[two]).contains("exactly one credential"));
        let e = err(None, &[a(), TenantConfig::bearer("b", "tok-a", sel("namespace=b"))]);
        assert!(e.contains("prometheus.tenants[1].bearer") && e.contains("tenants[0]"), "{e}");
        let e = err(Some(&Auth::bearer("tok-a")), &[a()]);
        assert!(e.contains("prometheus.tenants[0].bearer") && e.contains("prometheus.auth"), "{e}");
        let e = err(None, &[a(), TenantConfig::bearer("a", "tok-b", sel("namespace=b"))]);
        assert!(e.contains("prometheus.tenants[1].name"), "{e}");
        let e = err(None, &[TenantConfig::bearer("a", "tok en", sel("namespace=a"))]);
        assert!(e.contains("whitespace"), "{e}");
        let e = err(None, &[TenantConfig::basic("a", "u:x", "p", sel("namespace=a"))]);
        assert!(e.contains("prometheus.tenants[0].basic.username"), "{e}");
        let e = err(
            Some(&Auth::basic("admin", "x")),
            &[TenantConfig::basic("a", "admin", "other-password", sel("namespace=a"))],
        );
        assert!(e.contains("same credential"), "{e}");
        let e = err(None, &[TenantConfig::token_file("a", "/nonexistent/gpumon-token", sel("namespace=a"))]);
        assert!(e.contains("prometheus.tenants[0].token_file") && e.contains("/nonexistent/gpumon-token"), "{e}");
        let e = err(None, &[TenantConfig::bearer(" ", "t", sel("namespace=a"))]);
        assert!(e.contains("prometheus.tenants[0].name"), "{e}");
    }

    #[test]
    fn token_file_is_read_and_trimmed() {
        let path = std::env::temp_dir().join(format!("gpumon-tenant-token-{}", std::process::id()));
        std::fs::write(&path, "s3cret-from-file\n").unwrap();
        let r = resolve("web", None, &[TenantConfig::token_file("a", &path, sel("namespace=a"))]);
        std::fs::write(&path, "\n").unwrap();
        let empty = resolve("web", None, &[TenantConfig::token_file("a", &path, sel("namespace=a"))]);
        let _ = std::fs::remove_file(&path);
        assert_eq!(r.unwrap()[0].auth, Auth::bearer("s3cret-from-file"));
        let e = empty.unwrap_err().to_string();
        assert!(e.contains("web.tenants[0].token_file") && e.contains("empty"), "{e}");
    }
}

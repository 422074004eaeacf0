//! Configuration of the remote-write sink (`[remote_write]`).

use std::collections::BTreeMap;
use std::time::Duration;

use gpumon_core::BuildError;

use crate::http::client::parse_endpoint;
use crate::prometheus::Naming;
use crate::tls::TlsConfig;
use crate::Secret;

/// Settings of [`RemoteWriteSink`](super::RemoteWriteSink), as read from a config file
/// (`[remote_write]` table) or built in code. Every key except `url` has a default.
///
/// Durations are a number of seconds or a string in the grammar of
/// [`parse_duration`](crate::duration::parse_duration).
///
/// ```toml
/// [remote_write]
/// url = "https://mimir.example:8080/api/v1/push"
/// naming = "native"                      # or "dcgm"
/// external_labels = { cluster = "eu-1" }
/// username = "tenant-1"; password = "…"  # or bearer_token = "…"
/// headers = { "X-Scope-OrgID" = "tenant-1" }
///
/// [remote_write.tls]                     # only with an https:// URL
/// ca_file = "/etc/gpumon/ca.pem"
/// ```
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RemoteWriteConfig {
    /// The receiver's full write URL: Prometheus `http://host:9090/api/v1/write` (with
    /// `--web.enable-remote-write-receiver`), Mimir `…/api/v1/push`, VictoriaMetrics
    /// `…/api/v1/write`, Thanos Receive `…/api/v1/receive`.
    pub url: String,
    /// Metric and label names: the scrape endpoint's `native` (default) or `dcgm`.
    pub naming: Naming,
    /// dcgm naming: the host label is `hostname` instead of `Hostname`.
    pub dcgm_lowercase_hostname: bool,
    /// Labels added to every series that does not carry the label already (Prometheus'
    /// `external_labels`), e.g. `{ cluster = "eu-1" }`.
    pub external_labels: BTreeMap<String, String>,
    /// HTTP Basic auth user (Mimir/Cortex tenant, a reverse proxy).
    pub username: Option<String>,
    /// HTTP Basic auth password.
    pub password: Option<Secret>,
    /// `Authorization: Bearer <token>`; not together with `username`.
    pub bearer_token: Option<Secret>,
    /// Extra request headers, e.g. `{ "X-Scope-OrgID" = "tenant-1" }` for a multi-tenant Mimir.
    /// Their values are kept as [`Secret`]s (a proxy may take a credential in one).
    pub headers: BTreeMap<String, Secret>,
    /// A batch (one request) is sent once it holds this many samples. Default 2000 (Prometheus'
    /// `max_samples_per_send`).
    pub batch_samples: usize,
    /// …or once its first sample is this old, whichever comes first. Default 1 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub batch_interval: Duration,
    /// Deadline of one HTTP request (connect + send + response). Default 5 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub timeout: Duration,
    /// Most samples held while the receiver is unreachable; beyond it the oldest batches are
    /// dropped and counted. Default 1 000 000 (about 25 min of an 8-GPU node at 1 s).
    pub buffer_max_samples: usize,
    /// Most bytes held (uncompressed protobuf; same policy). Default 128 MiB.
    pub buffer_max_bytes: usize,
    /// First retry delay (doubled per attempt, full jitter). Default 200 ms.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub retry_initial: Duration,
    /// Longest retry delay; also the pause after 401/403/404. Default 30 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub retry_max: Duration,
    /// TLS for an `https://` URL (`[remote_write.tls]`). See [`TlsConfig`].
    pub tls: TlsConfig,
}

impl Default for RemoteWriteConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            naming: Naming::Native,
            dcgm_lowercase_hostname: false,
            external_labels: BTreeMap::new(),
            username: None,
            password: None,
            bearer_token: None,
            headers: BTreeMap::new(),
            batch_samples: 2000,
            batch_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            buffer_max_samples: 1_000_000,
            buffer_max_bytes: 128 << 20,
            retry_initial: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
            tls: TlsConfig::default(),
        }
    }
}

/// A valid Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`, not reserved (`__…`).
fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

impl RemoteWriteConfig {
    /// A configuration writing to `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), ..Self::default() }
    }

    /// Checks every key.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] naming the key (`remote_write.<key>`), or
    /// [`BuildError::InvalidEndpoint`] for a URL that does not parse.
    pub fn validate(&self) -> Result<(), BuildError> {
        let parsed = parse_endpoint("remote_write.url", &self.url, "http://127.0.0.1:9090/api/v1/write")?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
            return Err(BuildError::InvalidEndpoint {
                endpoint: self.url.clone(),
                reason: "remote_write.url: needs http:// or https:// and a host".into(),
            });
        }
        self.tls.check("remote_write.tls", "remote_write.url", &parsed)?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(BuildError::invalid(
                "remote_write.url",
                "credentials in the URL are not used; set `username`/`password` or `bearer_token`",
            ));
        }
        if self.bearer_token.is_some() && (self.username.is_some() || self.password.is_some()) {
            return Err(BuildError::invalid(
                "remote_write.bearer_token",
                "set either `bearer_token` or `username`/`password`",
            ));
        }
        if let Some(problem) = self.bearer_token.as_ref().and_then(Secret::token_problem) {
            return Err(BuildError::invalid("remote_write.bearer_token", problem));
        }
        if self.password.is_some() && self.username.is_none() {
            return Err(BuildError::invalid("remote_write.username", "required when `password` is set"));
        }
        for (k, v) in &self.external_labels {
            if !valid_label_name(k) {
                return Err(BuildError::invalid(
                    "remote_write.external_labels",
                    format!("`{k}` is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with `__`)"),
                ));
            }
            if v.is_empty() {
                return Err(BuildError::invalid("remote_write.external_labels", format!("`{k}` has an empty value")));
            }
        }
        for (k, v) in &self.headers {
            let reserved = ["content-type", "content-encoding", "x-prometheus-remote-write-version", "user-agent"];
            if reserved.contains(&k.to_ascii_lowercase().as_str()) {
                return Err(BuildError::invalid("remote_write.headers", format!("`{k}` is set by the sink itself")));
            }
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(v.expose()).is_err()
            {
                return Err(BuildError::invalid("remote_write.headers", format!("`{k}` is not a valid HTTP header")));
            }
        }
        crate::delivery::check_batching(
            "remote_write",
            "samples",
            self.batch_samples,
            self.batch_interval,
            self.timeout,
            self.buffer_max_samples,
            self.buffer_max_bytes,
        )?;
        crate::delivery::check_retry("remote_write", self.retry_initial, self.retry_max)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(c: &RemoteWriteConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn bad_settings_name_their_key() {
        assert!(key_of(&RemoteWriteConfig::default()).contains("remote_write.url"));
        let ok = RemoteWriteConfig::new("http://127.0.0.1:9090/api/v1/write");
        ok.validate().unwrap();
        let mut c = ok.clone();
        c.bearer_token = Some("t".into());
        c.username = Some("u".into());
        assert!(key_of(&c).contains("remote_write.bearer_token"));
        let mut c = ok.clone();
        c.external_labels.insert("__name__".into(), "x".into());
        assert!(key_of(&c).contains("remote_write.external_labels"));
        let mut c = ok.clone();
        c.headers.insert("Content-Encoding".into(), "gzip".into());
        assert!(key_of(&c).contains("remote_write.headers"));
        // A token with a space was sent as `Bearer a b`; one with a newline was refused later.
        for token in ["a b", "a\nb", ""] {
            let c = RemoteWriteConfig { bearer_token: Some(token.into()), ..ok.clone() };
            assert!(key_of(&c).contains("remote_write.bearer_token"), "{token:?}");
        }
        let mut c = ok.clone();
        c.buffer_max_samples = 10;
        assert!(key_of(&c).contains("remote_write.buffer_max_samples"));
        let c = RemoteWriteConfig::new("ftp://h/x");
        assert!(key_of(&c).contains("remote_write.url"));
    }

    #[test]
    fn parses_from_toml_with_durations() {
        let c: RemoteWriteConfig = toml::from_str(
            r#"url = "http://h/api/v1/write"
               naming = "dcgm"
               batch_interval = "250ms"
               external_labels = { cluster = "eu-1" }"#,
        )
        .unwrap();
        assert_eq!((c.naming, c.batch_interval), (Naming::Dcgm, Duration::from_millis(250)));
        assert_eq!(c.external_labels["cluster"], "eu-1");
        c.validate().unwrap();
        assert!(toml::from_str::<RemoteWriteConfig>("bogus = 1").unwrap_err().to_string().contains("bogus"));
    }
}

//! Configuration of the InfluxDB writer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gpumon_core::BuildError;

use super::encode::DEFAULT_MEASUREMENT;
use crate::http::client::parse_endpoint;
use crate::tls::TlsConfig;
use crate::Secret;

/// Which write API to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ApiVersion {
    /// `POST /write?db=&rp=&precision=ns`, HTTP Basic auth from `username`/`password`.
    /// InfluxDB 1.x, and VictoriaMetrics.
    V1,
    /// `POST /api/v2/write?org=&bucket=&precision=ns`, `Authorization: Token <token>`.
    /// InfluxDB 2.x/3.x, InfluxDB 1.8+ (with `bucket = "db/rp"`), VictoriaMetrics.
    V2,
}

/// Settings of [`InfluxSink`](super::InfluxSink), as read from a config file (`[influxdb]` table)
/// or built in code. Every key except `url` (and the database/bucket) has a default.
///
/// Durations are a number of seconds (`5`, `0.5`) or a string in the shared grammar of
/// [`parse_duration`](crate::duration::parse_duration): `"250ms"`, `"5s"`, `"1m 30s"`.
///
/// ```toml
/// [influxdb]
/// url = "http://127.0.0.1:8086"   # or https://, see `tls`
/// db = "gpumon"            # v1 (implies api = "v1")
/// # org = "acme"; bucket = "gpumon"; token = "…"   # v2 (implies api = "v2")
/// gzip = true
/// batch_points = 5000
/// batch_interval = "1s"
/// spill_dir = "/var/lib/gpumon/influx-spill"
///
/// [influxdb.tls]             # only with an https:// URL
/// ca_file = "/etc/gpumon/influx-ca.pem"
/// ```
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct InfluxConfig {
    /// Base URL of the server, `http://host:port` or `https://host:port` (a path prefix is kept:
    /// `http://proxy/influx`).
    pub url: String,
    /// The write API; inferred when absent: `db` ⇒ v1, `org`/`bucket`/`token` ⇒ v2.
    pub api: Option<ApiVersion>,
    /// v1: database (required for v1).
    pub db: Option<String>,
    /// v1: retention policy (default: the database's default policy).
    pub rp: Option<String>,
    /// v1: user for HTTP Basic auth.
    pub username: Option<String>,
    /// v1: password for HTTP Basic auth.
    pub password: Option<Secret>,
    /// v2: organisation (required by InfluxDB 2.x; ignored by VictoriaMetrics).
    pub org: Option<String>,
    /// v2: bucket (required for v2).
    pub bucket: Option<String>,
    /// v2: API token, sent as `Authorization: Token <token>`.
    pub token: Option<Secret>,
    /// Compress request bodies with gzip (`Content-Encoding: gzip`). Default true: InfluxDB 1.x
    /// and 2.x and VictoriaMetrics all take it, and line protocol shrinks about tenfold.
    pub gzip: bool,
    /// A batch is sent once it holds this many lines (points). Default 5000.
    pub batch_points: usize,
    /// …or once its first line is this old, whichever comes first. Default 1 s. An export that
    /// comes about this long or longer after the previous one is sealed at once (it would be sent
    /// alone anyway).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub batch_interval: Duration,
    /// Timeout of one HTTP request (connect + send + response). Default 5 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub timeout: Duration,
    /// Most lines held while the server is unreachable; beyond it the oldest batches are dropped
    /// and counted. Default 1 000 000.
    pub buffer_max_points: usize,
    /// Most bytes of line protocol held (same policy). Default 128 MiB.
    pub buffer_max_bytes: usize,
    /// Directory where unsent batches are kept as files, so that a restart of the agent during an
    /// outage loses nothing. One agent per directory. Default: none (memory only).
    pub spill_dir: Option<PathBuf>,
    /// Main measurement; labelled families go to `<measurement>_<family>`. Default `gpu`.
    pub measurement: String,
    /// Extra tags on every line, e.g. `{ cluster = "eu-1" }`. Must not reuse a built-in tag key.
    pub tags: BTreeMap<String, String>,
    /// First retry delay (doubled per attempt, full jitter). Default 200 ms.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub retry_initial: Duration,
    /// Longest retry delay; also the pause after an authentication/authorization or
    /// "database not found" error. Default 30 s.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub retry_max: Duration,
    /// TLS for an `https://` URL (`[influxdb.tls]`): CA file, client certificate,
    /// `insecure_skip_verify`. See [`TlsConfig`].
    pub tls: TlsConfig,
}

impl Default for InfluxConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            api: None,
            db: None,
            rp: None,
            username: None,
            password: None,
            org: None,
            bucket: None,
            token: None,
            gzip: true,
            batch_points: 5000,
            batch_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            buffer_max_points: 1_000_000,
            buffer_max_bytes: 128 << 20,
            spill_dir: None,
            measurement: DEFAULT_MEASUREMENT.to_owned(),
            tags: BTreeMap::new(),
            retry_initial: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
            tls: TlsConfig::default(),
        }
    }
}

/// Tag keys the encoder writes itself.
pub(crate) const BUILT_IN_TAGS: [&str; 11] =
    ["gpu", "host", "mig", "mig_ci", "mig_gi", "mig_profile", "name", "uuid", "xid", "pid", "reason"];

impl InfluxConfig {
    /// A v1 configuration: `url` and database `db`, everything else default.
    pub fn v1(url: impl Into<String>, db: impl Into<String>) -> Self {
        Self { url: url.into(), api: Some(ApiVersion::V1), db: Some(db.into()), ..Self::default() }
    }

    /// A v2 configuration: `url`, `org`, `bucket` and `token`.
    pub fn v2(
        url: impl Into<String>,
        org: impl Into<String>,
        bucket: impl Into<String>,
        token: impl Into<Secret>,
    ) -> Self {
        Self {
            url: url.into(),
            api: Some(ApiVersion::V2),
            org: Some(org.into()),
            bucket: Some(bucket.into()),
            token: Some(token.into()),
            ..Self::default()
        }
    }

    /// The API version in effect: `api`, or inferred from the keys present.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] naming `api` when neither `db` nor a v2 key is given, or
    /// both are.
    pub fn effective_api(&self) -> Result<ApiVersion, BuildError> {
        if let Some(api) = self.api {
            return Ok(api);
        }
        let v1 = self.db.is_some();
        let v2 = self.org.is_some() || self.bucket.is_some() || self.token.is_some();
        match (v1, v2) {
            (true, false) => Ok(ApiVersion::V1),
            (false, true) => Ok(ApiVersion::V2),
            (true, true) => Err(BuildError::invalid(
                "influxdb.api",
                "both `db` (v1) and `org`/`bucket`/`token` (v2) are set; set `api = \"v1\"` or `\"v2\"`",
            )),
            (false, false) => Err(BuildError::invalid(
                "influxdb.db",
                "missing: set `db` for the v1 API, or `bucket` (and `org`, `token`) for the v2 API",
            )),
        }
    }

    /// Checks every setting; returns the API version in effect.
    ///
    /// # Errors
    /// The first problem found, naming its key.
    pub fn validate(&self) -> Result<ApiVersion, BuildError> {
        let parsed = parse_endpoint("influxdb.url", &self.url, "http://127.0.0.1:8086")?;
        self.tls.check("influxdb.tls", "influxdb.url", &parsed)?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(BuildError::InvalidEndpoint {
                endpoint: self.url.clone(),
                reason: "influxdb.url: no host".into(),
            });
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(BuildError::invalid(
                "influxdb.url",
                "credentials in the URL are not used; set `username`/`password` (v1) or `token` (v2)",
            ));
        }
        if parsed.query().is_some() {
            return Err(BuildError::invalid(
                "influxdb.url",
                "must not have a query string; use `db`, `rp`, `org`, `bucket`",
            ));
        }
        let api = self.effective_api()?;
        let nonempty = |key: &str, v: &Option<String>| -> Result<(), BuildError> {
            match v {
                Some(s) if s.is_empty() => Err(BuildError::invalid(format!("influxdb.{key}"), "must not be empty")),
                _ => Ok(()),
            }
        };
        for (key, v) in [("db", &self.db), ("rp", &self.rp), ("org", &self.org), ("bucket", &self.bucket)] {
            nonempty(key, v)?;
        }
        if let Some(problem) = self.token.as_ref().and_then(Secret::token_problem) {
            return Err(BuildError::invalid("influxdb.token", problem));
        }
        match api {
            ApiVersion::V1 => {
                if self.db.is_none() {
                    return Err(BuildError::invalid("influxdb.db", "required for the v1 API"));
                }
                for (key, set) in
                    [("org", self.org.is_some()), ("bucket", self.bucket.is_some()), ("token", self.token.is_some())]
                {
                    if set {
                        return Err(BuildError::invalid(format!("influxdb.{key}"), "is a v2 setting but `api` is v1"));
                    }
                }
                if self.password.is_some() && self.username.is_none() {
                    return Err(BuildError::invalid("influxdb.username", "required when `password` is set"));
                }
            }
            ApiVersion::V2 => {
                if self.bucket.is_none() {
                    return Err(BuildError::invalid("influxdb.bucket", "required for the v2 API"));
                }
                for (key, set) in [
                    ("db", self.db.is_some()),
                    ("rp", self.rp.is_some()),
                    ("username", self.username.is_some()),
                    ("password", self.password.is_some()),
                ] {
                    if set {
                        return Err(BuildError::invalid(format!("influxdb.{key}"), "is a v1 setting but `api` is v2"));
                    }
                }
            }
        }
        crate::delivery::check_batching(
            "influxdb",
            "points",
            self.batch_points,
            self.batch_interval,
            self.timeout,
            self.buffer_max_points,
            self.buffer_max_bytes,
        )?;
        if self.measurement.is_empty() || self.measurement.starts_with('#') {
            return Err(BuildError::invalid("influxdb.measurement", "must be non-empty and not start with `#`"));
        }
        for (k, v) in &self.tags {
            if k.is_empty() || v.is_empty() {
                return Err(BuildError::invalid("influxdb.tags", "tag keys and values must not be empty"));
            }
            if BUILT_IN_TAGS.contains(&k.as_str()) || k == "time" {
                return Err(BuildError::invalid("influxdb.tags", format!("`{k}` is a tag the sink writes itself")));
            }
        }
        crate::delivery::check_retry("influxdb", self.retry_initial, self.retry_max)?;
        Ok(api)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_the_shared_grammar() {
        let c: InfluxConfig =
            toml::from_str("url = \"http://h\"\ndb = \"d\"\nbatch_interval = \"1m 30s\"\ntimeout = 2.5\n").unwrap();
        assert_eq!((c.batch_interval, c.timeout), (Duration::from_secs(90), Duration::from_millis(2500)));
        let e = toml::from_str::<InfluxConfig>("url = \"http://h\"\nretry_max = \"soon\"\n").unwrap_err().to_string();
        assert!(e.contains("retry_max") && e.contains("`soon`"), "{e}");
    }

    #[test]
    fn api_is_inferred() {
        assert_eq!(InfluxConfig::v1("http://h:8086", "d").validate().unwrap(), ApiVersion::V1);
        let mut c = InfluxConfig { url: "http://h:8086".into(), bucket: Some("b".into()), ..InfluxConfig::default() };
        assert_eq!(c.validate().unwrap(), ApiVersion::V2);
        c.db = Some("d".into());
        assert!(c.validate().unwrap_err().to_string().contains("influxdb.api"));
    }

    #[test]
    fn errors_name_the_key() {
        let err = |c: InfluxConfig| c.validate().unwrap_err().to_string();
        assert!(err(InfluxConfig::default()).contains("influxdb.url"));
        assert!(err(InfluxConfig::v1("ftp://h", "d")).contains("scheme `ftp`"));
        #[cfg(feature = "tls")]
        assert_eq!(InfluxConfig::v1("https://h", "d").validate().unwrap(), ApiVersion::V1);
        #[cfg(not(feature = "tls"))]
        assert!(err(InfluxConfig::v1("https://h", "d")).contains("`tls` cargo feature"));
        let mut c = InfluxConfig::v1("http://h", "d");
        c.tls = TlsConfig::with_ca_file("/x").client_cert("/c", "/k");
        assert!(err(c).contains("influxdb.tls"));
        let mut c = InfluxConfig::v1("https://h", "d");
        c.tls.client_cert_file = Some("/c".into());
        assert!(err(c).contains("influxdb.tls.client_key_file"));
        assert!(err(InfluxConfig { url: "http://h".into(), ..InfluxConfig::default() }).contains("influxdb.db"));
        let mut c = InfluxConfig::v1("http://h", "d");
        c.batch_points = 10;
        c.buffer_max_points = 5;
        assert!(err(c).contains("influxdb.buffer_max_points"));
        let mut c = InfluxConfig::v1("http://h", "d");
        c.tags.insert("host".into(), "x".into());
        assert!(err(c).contains("influxdb.tags"));
        let mut c = InfluxConfig::v1("http://h", "d");
        c.token = Some("t".into());
        assert!(err(c).contains("influxdb.token"));
        for token in ["a b", "a\tb", ""] {
            let e = err(InfluxConfig::v2("http://h", "o", "b", token));
            assert!(e.contains("influxdb.token") && e.contains("must not"), "{token:?}: {e}");
        }
    }
}

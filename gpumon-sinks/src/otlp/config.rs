//! [`OtlpConfig`]: what a config file or flags say, and how it combines with the standard
//! `OTEL_*` environment variables (explicit settings win).

use std::collections::BTreeMap;
use std::time::Duration;

use gpumon_core::BuildError;

use crate::tls::TlsConfig;
use crate::Secret;

/// Default timeout of one export (the OTel default, `OTEL_EXPORTER_OTLP_TIMEOUT`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `service.name`.
pub const DEFAULT_SERVICE_NAME: &str = "gpumon";

const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
const DEFAULT_HTTP_ENDPOINT: &str = "http://localhost:4318/v1/metrics";
const HTTP_METRICS_PATH: &str = "v1/metrics";

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[non_exhaustive]
pub enum Protocol {
    /// OTLP/gRPC (needs the `otlp-grpc` cargo feature). Default port 4317.
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`). Default port 4318. The default.
    #[serde(rename = "http", alias = "http/protobuf")]
    HttpProtobuf,
}

impl Protocol {
    /// Parses `grpc`, `http` or `http/protobuf` (the values of `OTEL_EXPORTER_OTLP_PROTOCOL`).
    ///
    /// # Errors
    /// A message naming the value and the accepted ones (`http/json` is not supported).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http" | "http/protobuf" => Ok(Protocol::HttpProtobuf),
            other => Err(format!("unsupported OTLP protocol `{other}` (expected `grpc` or `http/protobuf`)")),
        }
    }

    /// `grpc` or `http/protobuf`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Protocol::parse(s)
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Request compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Compression {
    /// No compression (the default).
    None,
    /// gzip.
    Gzip,
}

impl Compression {
    fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "gzip" => Ok(Compression::Gzip),
            "none" | "" => Ok(Compression::None),
            other => Err(format!("unsupported compression `{other}` (expected `gzip` or `none`)")),
        }
    }
}

/// How the sink turns snapshots into OTLP requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Pipeline {
    /// The default: the sink builds the `ExportMetricsServiceRequest` itself from each snapshot
    /// (the generated `opentelemetry-proto` types), stamps every data point with the sample's
    /// time, and sends it with its own HTTP (reqwest) or gRPC (tonic) client. A fraction of the
    /// SDK pipeline's CPU time and allocations.
    #[default]
    Direct,
    /// Observable instruments on an OpenTelemetry SDK `SdkMeterProvider` with the
    /// `opentelemetry-otlp` exporter (data points stamped at collection time).
    Sdk,
}

impl Pipeline {
    /// `direct` or `sdk`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Pipeline::Direct => "direct",
            Pipeline::Sdk => "sdk",
        }
    }
}

/// Settings of the OTLP sink, as they appear under `[otlp]` in the agent's config file.
///
/// Every field is optional; unset fields fall back to the standard environment variables, then
/// to the OpenTelemetry defaults:
///
/// | field | environment (first set wins) | default |
/// |---|---|---|
/// | `endpoint` | `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used as is), `OTEL_EXPORTER_OTLP_ENDPOINT` (base URL; HTTP appends `/v1/metrics`) | `http://localhost:4318/v1/metrics` (HTTP), `http://localhost:4317` (gRPC) |
/// | `protocol` | `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL` | `http/protobuf` |
/// | `headers` | `OTEL_EXPORTER_OTLP_METRICS_HEADERS`, `OTEL_EXPORTER_OTLP_HEADERS` (`k=v,k2=v2`, values percent-decoded) | none |
/// | `timeout` | `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT`, `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds) | 10 s |
/// | `compression` | `OTEL_EXPORTER_OTLP_METRICS_COMPRESSION`, `OTEL_EXPORTER_OTLP_COMPRESSION` | none |
/// | `service_name` | `OTEL_SERVICE_NAME`, `service.name` in `OTEL_RESOURCE_ATTRIBUTES` | `gpumon` |
/// | `resource_attributes` | `OTEL_RESOURCE_ATTRIBUTES` (merged key by key; config wins) | `host.name` = this host |
/// | `pipeline` | — | `direct` |
///
/// An explicit HTTP `endpoint` whose path is empty or `/` gets `/v1/metrics` appended
/// (`http://collector:4318` works); any other path is used as is.
///
/// Durations are a number of seconds or a string in the shared grammar of
/// [`parse_duration`](crate::duration::parse_duration): `"500ms"`, `"10s"`, `"1m 30s"`.
///
/// ```
/// let cfg: gpumon_sinks::otlp::OtlpConfig = serde_json::from_str(
///     r#"{ "endpoint": "http://127.0.0.1:4318", "protocol": "http", "timeout": "5s",
///          "headers": { "authorization": "Bearer abc" } }"#,
/// ).unwrap();
/// assert_eq!(cfg.timeout, Some(std::time::Duration::from_secs(5)));
/// ```
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct OtlpConfig {
    /// Collector URL (`http://host:port`; gRPC takes no path).
    pub endpoint: Option<String>,
    /// `grpc` or `http` (= `http/protobuf`).
    pub protocol: Option<Protocol>,
    /// Extra request headers (gRPC metadata), e.g. `authorization`. Their values are kept as
    /// [`Secret`]s, as the OpenTelemetry Collector keeps them.
    pub headers: BTreeMap<String, Secret>,
    /// Longest one export may take.
    #[serde(with = "crate::duration::opt")]
    pub timeout: Option<Duration>,
    /// `gzip` or `none`.
    pub compression: Option<Compression>,
    /// Export at most every this long instead of once per snapshot (SDK pipeline: on the SDK's
    /// own schedule, from the latest snapshot; direct pipeline: a snapshot arriving within the
    /// interval is held and the latest held one goes out with the next export, `flush` or
    /// `shutdown`). Unset (the default): every snapshot is exported as soon as it is taken, so
    /// the export interval is the sampling interval.
    #[serde(with = "crate::duration::opt")]
    pub export_interval: Option<Duration>,
    /// `service.name` of the resource.
    pub service_name: Option<String>,
    /// Extra resource attributes (win over `OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: BTreeMap<String, String>,
    /// `direct` (the default) or `sdk`: see [`Pipeline`].
    pub pipeline: Option<Pipeline>,
    /// TLS for an `https://` endpoint (`[otlp.tls]`), both transports and both pipelines. Unset
    /// files fall back to `OTEL_EXPORTER_OTLP_[METRICS_]CERTIFICATE`, `…_CLIENT_CERTIFICATE` and
    /// `…_CLIENT_KEY`. See [`TlsConfig`].
    pub tls: TlsConfig,
}

impl OtlpConfig {
    /// A config that sends to `endpoint` over `protocol`; everything else default.
    pub fn new(endpoint: impl Into<String>, protocol: Protocol) -> Self {
        Self { endpoint: Some(endpoint.into()), protocol: Some(protocol), ..Self::default() }
    }
}

/// The settings after environment variables and defaults are applied.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Resolved {
    pub(crate) endpoint: String,
    pub(crate) protocol: Protocol,
    pub(crate) headers: BTreeMap<String, Secret>,
    pub(crate) timeout: Duration,
    pub(crate) compression: Compression,
    pub(crate) export_interval: Option<Duration>,
    /// Resource attributes in the order they are applied (later wins), service.name included.
    pub(crate) resource: BTreeMap<String, String>,
    pub(crate) pipeline: Pipeline,
    pub(crate) tls: TlsConfig,
}

/// Reads an environment variable; empty counts as unset (as the OTel spec says).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn first(env: Env<'_>, names: &[&str]) -> Option<(String, String)> {
    names.iter().find_map(|n| env(n).filter(|v| !v.trim().is_empty()).map(|v| ((*n).to_owned(), v)))
}

pub(crate) fn resolve(cfg: &OtlpConfig, env: Env<'_>) -> Result<Resolved, BuildError> {
    let protocol = resolve_protocol(cfg, env)?;
    let endpoint = resolve_endpoint(cfg, env, protocol)?;
    let headers = resolve_headers(cfg, env, protocol)?;
    let timeout = resolve_timeout(cfg, env)?;
    let compression = resolve_compression(cfg, env)?;
    if let Some(i) = cfg.export_interval {
        if i < Duration::from_millis(100) {
            return Err(BuildError::invalid("otlp.export_interval", format!("{i:?} is below the minimum of 100ms")));
        }
    }
    let resource = resolve_resource(cfg, env)?;
    let (endpoint, tls) = resolve_tls(cfg, env, endpoint)?;
    Ok(Resolved {
        endpoint,
        protocol,
        headers,
        timeout,
        compression,
        export_interval: cfg.export_interval,
        resource,
        pipeline: cfg.pipeline.unwrap_or_default(),
        tls,
    })
}

/// `otlp.protocol`, else the OTel variables, else http/protobuf.
fn resolve_protocol(cfg: &OtlpConfig, env: Env<'_>) -> Result<Protocol, BuildError> {
    Ok(match cfg.protocol {
        Some(p) => p,
        None => match first(env, &["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]) {
            Some((name, v)) => Protocol::parse(&v).map_err(|reason| BuildError::invalid(name, reason))?,
            None => Protocol::HttpProtobuf,
        },
    })
}

/// `otlp.endpoint` (a bare HTTP base gets `/v1/metrics`), else the signal's variable as it is,
/// else the general variable (with `/v1/metrics` for HTTP), else the protocol's default.
fn resolve_endpoint(cfg: &OtlpConfig, env: Env<'_>, protocol: Protocol) -> Result<String, BuildError> {
    Ok(if let Some(e) = cfg.endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
        let url = validate_endpoint("otlp.endpoint", e.trim(), protocol)?;
        match protocol {
            Protocol::HttpProtobuf if url.path().is_empty() || url.path() == "/" => join_path(e.trim()),
            _ => e.trim().to_owned(),
        }
    } else if let Some((name, e)) = first(env, &["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]) {
        validate_endpoint(&name, e.trim(), protocol)?;
        e.trim().to_owned()
    } else if let Some((name, e)) = first(env, &["OTEL_EXPORTER_OTLP_ENDPOINT"]) {
        validate_endpoint(&name, e.trim(), protocol)?;
        match protocol {
            Protocol::HttpProtobuf => join_path(e.trim()),
            Protocol::Grpc => e.trim().to_owned(),
        }
    } else {
        match protocol {
            Protocol::HttpProtobuf => DEFAULT_HTTP_ENDPOINT.to_owned(),
            Protocol::Grpc => DEFAULT_GRPC_ENDPOINT.to_owned(),
        }
    })
}

/// The headers of the variables, overridden by `otlp.headers`; each checked, an error naming
/// where it came from.
fn resolve_headers(cfg: &OtlpConfig, env: Env<'_>, protocol: Protocol) -> Result<BTreeMap<String, Secret>, BuildError> {
    // Each header remembers where it came from, so an error names the key the user wrote.
    let mut headers = BTreeMap::new();
    let mut source: BTreeMap<String, String> = BTreeMap::new();
    if let Some((name, raw)) = first(env, &["OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"]) {
        let parsed = parse_key_values(&raw).map_err(|reason| BuildError::invalid(name.clone(), reason))?;
        for (k, v) in parsed {
            source.insert(k.to_ascii_lowercase(), name.clone());
            headers.insert(k.to_ascii_lowercase(), Secret::from(v));
        }
    }
    for (k, v) in &cfg.headers {
        source.insert(k.to_ascii_lowercase(), "otlp.headers".to_owned());
        headers.insert(k.to_ascii_lowercase(), v.clone());
    }
    for (k, v) in &headers {
        let from = source.get(k).map_or("otlp.headers", String::as_str);
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(BuildError::invalid(from, format!("`{k}` is not a valid header name")));
        }
        if v.expose().bytes().any(|b| b < 0x20 && b != b'\t') {
            return Err(BuildError::invalid(from, format!("the value of `{k}` contains control characters")));
        }
        // gRPC treats a `-bin` key as base64-encoded binary metadata; tonic panics on such a key
        // given as ASCII metadata, and OTLP defines no binary header. Refused for both pipelines.
        if protocol == Protocol::Grpc && k.ends_with("-bin") {
            return Err(BuildError::invalid(
                from,
                format!(
                    "`{k}`: gRPC metadata keys ending in `-bin` are binary (base64) metadata, which the OTLP \
                     sink does not send; rename the header"
                ),
            ));
        }
    }
    Ok(headers)
}

/// `otlp.timeout`, else the variables' milliseconds, else the default; never zero.
fn resolve_timeout(cfg: &OtlpConfig, env: Env<'_>) -> Result<Duration, BuildError> {
    let timeout = match cfg.timeout {
        Some(t) => t,
        None => match first(env, &["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]) {
            Some((name, v)) => v
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| BuildError::invalid(name, format!("`{v}` is not a number of milliseconds")))?,
            None => DEFAULT_TIMEOUT,
        },
    };
    if timeout.is_zero() {
        return Err(BuildError::invalid("otlp.timeout", "must be greater than zero"));
    }
    Ok(timeout)
}

/// `otlp.compression`, else the variables, else none.
fn resolve_compression(cfg: &OtlpConfig, env: Env<'_>) -> Result<Compression, BuildError> {
    Ok(match cfg.compression {
        Some(c) => c,
        None => match first(env, &["OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"]) {
            Some((name, v)) => Compression::parse(&v).map_err(|reason| BuildError::invalid(name, reason))?,
            None => Compression::None,
        },
    })
}

/// The resource: defaults < OTEL_RESOURCE_ATTRIBUTES < OTEL_SERVICE_NAME < config.
fn resolve_resource(cfg: &OtlpConfig, env: Env<'_>) -> Result<BTreeMap<String, String>, BuildError> {
    // Resource: defaults < OTEL_RESOURCE_ATTRIBUTES < OTEL_SERVICE_NAME < config.
    let mut resource = BTreeMap::new();
    resource.insert("service.name".to_owned(), DEFAULT_SERVICE_NAME.to_owned());
    resource.insert("host.name".to_owned(), gpumon_core::hostname());
    if let Some(raw) = env("OTEL_RESOURCE_ATTRIBUTES").filter(|v| !v.trim().is_empty()) {
        let attrs = parse_key_values(&raw).map_err(|reason| BuildError::invalid("OTEL_RESOURCE_ATTRIBUTES", reason))?;
        resource.extend(attrs);
    }
    if let Some(name) = env("OTEL_SERVICE_NAME").filter(|v| !v.trim().is_empty()) {
        resource.insert("service.name".to_owned(), name);
    }
    resource.extend(cfg.resource_attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(name) = cfg.service_name.as_deref().filter(|s| !s.is_empty()) {
        resource.insert("service.name".to_owned(), name.to_owned());
    }
    Ok(resource)
}

/// The TLS settings, the variables filling what `otlp.tls` leaves unset, checked against the
/// endpoint (returned as it came).
fn resolve_tls(cfg: &OtlpConfig, env: Env<'_>, endpoint: String) -> Result<(String, TlsConfig), BuildError> {
    let mut tls = cfg.tls.clone();
    for (field, names) in [
        (&mut tls.ca_file, ["OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"]),
        (
            &mut tls.client_cert_file,
            ["OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"],
        ),
        (&mut tls.client_key_file, ["OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"]),
    ] {
        if field.is_none() {
            *field = first(env, &names).map(|(_, v)| v.trim().into());
        }
    }
    let url = reqwest::Url::parse(&endpoint)
        .map_err(|e| BuildError::InvalidEndpoint { endpoint: endpoint.clone(), reason: e.to_string() })?;
    tls.check("otlp.tls", "otlp.endpoint", &url)?;
    Ok((endpoint, tls))
}

/// `base` + `/v1/metrics`, with exactly one slash between them.
fn join_path(base: &str) -> String {
    format!("{}/{HTTP_METRICS_PATH}", base.trim_end_matches('/'))
}

pub(crate) fn validate_endpoint(setting: &str, endpoint: &str, protocol: Protocol) -> Result<reqwest::Url, BuildError> {
    let invalid = |reason: String| BuildError::InvalidEndpoint { endpoint: endpoint.to_owned(), reason };
    let url = reqwest::Url::parse(endpoint)
        .map_err(|e| invalid(format!("{setting}: not a URL ({e}); expected e.g. http://127.0.0.1:4318")))?;
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "tls") => {}
        "https" => {
            return Err(invalid(format!(
                "{setting}: https needs the `tls` cargo feature of gpumon-sinks (on by default in gpumon); rebuild \
                 with it or use http://"
            )))
        }
        other => {
            return Err(invalid(format!("{setting}: scheme `{other}` is not supported (expected http:// or https://)")))
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(format!("{setting}: no host")));
    }
    if protocol == Protocol::Grpc && !(url.path().is_empty() || url.path() == "/") {
        return Err(invalid(format!("{setting}: an OTLP/gRPC endpoint takes no path (got `{}`)", url.path())));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(format!("{setting}: query strings and fragments are not allowed")));
    }
    Ok(url)
}

/// Parses the W3C-baggage-like `k=v,k2=v2` lists of `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES`: keys and values trimmed, values percent-decoded.
pub(crate) fn parse_key_values(raw: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in raw.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("`{item}` is not of the form key=value"));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("`{item}` has an empty key"));
        }
        out.insert(k.to_owned(), percent_decode(v.trim())?);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let b = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in `{s}`"))?;
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn defaults_without_env() {
        let r = resolve(&OtlpConfig::default(), &env_of(&[])).unwrap();
        assert_eq!(r.protocol, Protocol::HttpProtobuf);
        assert_eq!(r.endpoint, "http://localhost:4318/v1/metrics");
        assert_eq!(r.timeout, DEFAULT_TIMEOUT);
        assert_eq!(r.compression, Compression::None);
        assert_eq!(r.resource["service.name"], "gpumon");
        assert_eq!(r.resource["host.name"], gpumon_core::hostname());
        let g = OtlpConfig { protocol: Some(Protocol::Grpc), ..OtlpConfig::default() };
        assert_eq!(resolve(&g, &env_of(&[])).unwrap().endpoint, "http://localhost:4317");
    }

    #[test]
    fn env_vars_apply_and_explicit_settings_win() {
        static ENV: &[(&str, &str)] = &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20abc, x-tenant = t1"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "9000"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,host.name=from-env,service.name=svc-attr"),
            ("OTEL_SERVICE_NAME", "svc-env"),
        ];
        let r = resolve(&OtlpConfig::default(), &env_of(ENV)).unwrap();
        assert_eq!(r.endpoint, "http://collector:4318/v1/metrics");
        assert_eq!(r.headers.get("authorization").map(Secret::expose), Some("Bearer abc"));
        assert_eq!(r.headers.get("x-tenant").map(Secret::expose), Some("t1"));
        // Header values from the environment are secrets too: the resolved settings are logged.
        assert!(!format!("{r:?}").contains("Bearer abc"), "{r:?}");
        assert_eq!(r.timeout, Duration::from_millis(2500));
        assert_eq!(r.compression, Compression::Gzip);
        assert_eq!(r.resource["service.name"], "svc-env");
        assert_eq!(r.resource["host.name"], "from-env");
        assert_eq!(r.resource["deployment.environment"], "prod");

        let explicit = OtlpConfig {
            endpoint: Some("http://10.0.0.1:4317".into()),
            protocol: Some(Protocol::Grpc),
            headers: [("x-tenant".to_owned(), "t2".into())].into(),
            timeout: Some(Duration::from_secs(1)),
            compression: Some(Compression::None),
            service_name: Some("mine".into()),
            resource_attributes: [("host.name".to_owned(), "cfg-host".to_owned())].into(),
            ..OtlpConfig::default()
        };
        let r = resolve(&explicit, &env_of(ENV)).unwrap();
        assert_eq!(r.endpoint, "http://10.0.0.1:4317");
        assert_eq!(r.protocol, Protocol::Grpc);
        assert_eq!(r.headers["x-tenant"].expose(), "t2");
        assert_eq!(r.timeout, Duration::from_secs(1));
        assert_eq!(r.compression, Compression::None);
        assert_eq!(r.resource["service.name"], "mine");
        assert_eq!(r.resource["host.name"], "cfg-host");
    }

    #[test]
    fn signal_specific_endpoint_is_used_as_is() {
        static ENV: &[(&str, &str)] = &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://c:9999/custom/path"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
        ];
        assert_eq!(resolve(&OtlpConfig::default(), &env_of(ENV)).unwrap().endpoint, "http://c:9999/custom/path");
        // An explicit endpoint with a path is also used as is; a bare one gets /v1/metrics.
        let cfg = OtlpConfig::new("http://c:4318/otlp/v1/metrics", Protocol::HttpProtobuf);
        assert_eq!(resolve(&cfg, &env_of(&[])).unwrap().endpoint, "http://c:4318/otlp/v1/metrics");
        let cfg = OtlpConfig::new("http://c:4318", Protocol::HttpProtobuf);
        assert_eq!(resolve(&cfg, &env_of(&[])).unwrap().endpoint, "http://c:4318/v1/metrics");
    }

    #[test]
    fn bad_values_are_named() {
        for (endpoint, protocol, needle) in [
            ("not a url", Protocol::HttpProtobuf, "not a URL"),
            ("ftp://x:1", Protocol::HttpProtobuf, "scheme `ftp`"),
            #[cfg(not(feature = "tls"))]
            ("https://x:4318", Protocol::HttpProtobuf, "`tls` cargo feature"),
            ("http://x:4317/v1/metrics", Protocol::Grpc, "no path"),
        ] {
            let e = resolve(&OtlpConfig::new(endpoint, protocol), &env_of(&[])).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains(endpoint), "{e}");
        }
        let e = resolve(&OtlpConfig::default(), &env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("http/json"), "{e}");
        let e =
            resolve(&OtlpConfig::default(), &env_of(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")])).unwrap_err().to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_TIMEOUT"), "{e}");
        let cfg = OtlpConfig { headers: [("bad header".to_owned(), "v".into())].into(), ..OtlpConfig::default() };
        assert!(resolve(&cfg, &env_of(&[])).unwrap_err().to_string().contains("bad header"));
        // A CA for an http:// endpoint would do nothing: refused, naming the table.
        let cfg = OtlpConfig::new("http://x:4318", Protocol::HttpProtobuf);
        let e = resolve(&cfg, &env_of(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")])).unwrap_err().to_string();
        assert!(e.contains("otlp.tls") && e.contains("http://"), "{e}");
    }

    #[test]
    fn tls_files_fall_back_to_the_otel_variables() {
        static ENV: &[(&str, &str)] = &[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/env/ca.pem"),
            ("OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE", "/env/client.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/ignored.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/env/client.key"),
        ];
        let mut cfg = OtlpConfig::new("https://x:4318", Protocol::HttpProtobuf);
        cfg.tls.ca_file = Some("/config/ca.pem".into());
        let tls = resolve(&cfg, &env_of(ENV)).map(|r| r.tls);
        #[cfg(feature = "tls")]
        {
            let tls = tls.unwrap();
            assert_eq!(tls.ca_file, Some("/config/ca.pem".into()), "the config wins");
            assert_eq!(tls.client_cert_file, Some("/env/client.pem".into()), "the signal-specific variable wins");
            assert_eq!(tls.client_key_file, Some("/env/client.key".into()));
        }
        #[cfg(not(feature = "tls"))]
        assert!(tls.unwrap_err().to_string().contains("`tls` cargo feature"));
    }

    #[test]
    fn grpc_binary_header_from_the_environment_names_the_variable() {
        let cfg = OtlpConfig { protocol: Some(Protocol::Grpc), ..OtlpConfig::default() };
        let env = env_of(&[("OTEL_EXPORTER_OTLP_HEADERS", "a=1,trace-ctx-bin=AAEC")]);
        let e = resolve(&cfg, &env).unwrap_err().to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_HEADERS") && e.contains("`trace-ctx-bin`"), "{e}");
        // Over HTTP the same header is an ordinary one.
        let cfg = OtlpConfig { protocol: Some(Protocol::HttpProtobuf), ..OtlpConfig::default() };
        let r = resolve(&cfg, &env).unwrap();
        assert_eq!(r.headers["trace-ctx-bin"].expose(), "AAEC");
    }

    #[test]
    fn config_deserializes_and_rejects_unknown_keys() {
        let cfg: OtlpConfig = serde_json::from_str(
            r#"{"endpoint":"http://h:4317","protocol":"grpc","timeout":"1.5s","export_interval":2,
                "compression":"gzip","service_name":"s","headers":{"a":"b"}}"#,
        )
        .unwrap();
        assert_eq!(cfg.protocol, Some(Protocol::Grpc));
        assert_eq!(cfg.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(cfg.export_interval, Some(Duration::from_secs(2)));
        assert_eq!(cfg.compression, Some(Compression::Gzip));
        let cfg: OtlpConfig = serde_json::from_str(r#"{"protocol":"http/protobuf"}"#).unwrap();
        assert_eq!(cfg.protocol, Some(Protocol::HttpProtobuf));
        let e = serde_json::from_str::<OtlpConfig>(r#"{"endpiont":"x"}"#).unwrap_err().to_string();
        assert!(e.contains("endpiont"), "{e}");
        assert_eq!(serde_json::from_str::<OtlpConfig>("{}").unwrap(), OtlpConfig::default());
    }

    #[test]
    fn durations_and_key_values() {
        let cfg: OtlpConfig = toml::from_str("timeout = \"1m 30s\"\nexport_interval = \"500ms\"\n").unwrap();
        assert_eq!(
            (cfg.timeout, cfg.export_interval),
            (Some(Duration::from_secs(90)), Some(Duration::from_millis(500)))
        );
        let e = toml::from_str::<OtlpConfig>("export_interval = \"soon\"\n").unwrap_err().to_string();
        assert!(e.contains("export_interval") && e.contains("`soon`"), "{e}");
        let kv = parse_key_values("a=1, b = x%2Cy ,,").unwrap();
        assert_eq!(kv["a"], "1");
        assert_eq!(kv["b"], "x,y");
        assert!(parse_key_values("novalue").is_err());
        assert!(parse_key_values("a=%zz").is_err());
    }
}

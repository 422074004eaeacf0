//! A PromQL instant-query client for any Prometheus-compatible HTTP API (Prometheus,
//! VictoriaMetrics, Thanos Query, Mimir, Cortex): what `gpumon-agent fleet` reads the accounts
//! with. It is the push sinks' HTTP client (`src/http/client.rs`) — the same TLS settings
//! (`[…tls]`: a private CA, a client certificate), Basic or bearer auth, extra headers
//! (`X-Scope-OrgID` for a multi-tenant Mimir) and timeouts — pointed the other way.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpumon_sinks::prometheus_query::{QueryClient, QueryConfig};
//!
//! let client = QueryClient::new(&QueryConfig::new("http://127.0.0.1:9090"))?;
//! for sample in client.instant("sum(gpumon_up)", None).await? {
//!     println!("{:?} {}", sample.labels, sample.value);
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::BuildError;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::http::client::{parse_endpoint, server_message, Auth, ClientConfig, HttpClient, HttpError};
use crate::tls::TlsConfig;
use crate::Secret;

/// Most bytes of a query's answer read: a fleet's grouped accounts are a few hundred kilobytes;
/// an answer beyond this is refused rather than cut (a cut JSON document would not parse).
const MAX_ANSWER: usize = 64 << 20;

/// Where and how to query.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct QueryConfig {
    /// The API's base URL: `http://prometheus:9090`, `http://victoria:8428`,
    /// `http://mimir/prometheus`. `/api/v1/query` is appended (a URL that already ends with it,
    /// or with `/api/v1`, is taken as meant).
    pub url: String,
    /// HTTP Basic user.
    pub username: Option<String>,
    /// HTTP Basic password.
    pub password: Option<Secret>,
    /// `Authorization: Bearer <token>`; not together with `username`.
    pub bearer_token: Option<Secret>,
    /// Extra request headers, e.g. `X-Scope-OrgID` for a multi-tenant Mimir.
    pub headers: BTreeMap<String, Secret>,
    /// Deadline of one query. Default 60 s (a week of a fleet's counters takes a while).
    pub timeout: Duration,
    /// TLS for an `https://` URL.
    pub tls: TlsConfig,
}

impl QueryConfig {
    /// The API at `url`, with no credentials and the default timeout.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            username: None,
            password: None,
            bearer_token: None,
            headers: BTreeMap::new(),
            timeout: Duration::from_secs(60),
            tls: TlsConfig::default(),
        }
    }
}

/// One series of an instant query's answer.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Sample {
    /// Its labels (`__name__` among them when the query keeps it).
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Why a query gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// No answer, or an HTTP error that is not the API's own (a proxy's 502, a 401).
    #[error("{0}")]
    Http(String),
    /// An answer, but not a Prometheus query API's: the URL points elsewhere.
    #[error("{url} is not a Prometheus query API ({reason}); give the API's base URL, e.g. http://prometheus:9090, http://victoria-metrics:8428 or http://mimir/prometheus")]
    NotPrometheus {
        /// The URL asked.
        url: String,
        /// What the answer was.
        reason: String,
    },
    /// The API refused the query (`"status": "error"`).
    #[error("the query was refused: {message} (query: {query})")]
    Refused {
        /// The query.
        query: String,
        /// The API's `errorType: error`.
        message: String,
    },
}

/// The client: build it once, query as often as needed.
#[derive(Debug)]
pub struct QueryClient {
    http: HttpClient,
    /// `…/api/v1/query`.
    endpoint: reqwest::Url,
}

impl QueryClient {
    /// Builds the client.
    ///
    /// # Errors
    /// [`BuildError::InvalidEndpoint`] for a URL that does not parse or is not http(s),
    /// [`BuildError::InvalidConfig`] for conflicting credentials, a bad header or unusable TLS
    /// settings.
    pub fn new(config: &QueryConfig) -> Result<Self, BuildError> {
        let parsed = parse_endpoint("prometheus", &config.url, "http://127.0.0.1:9090")?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
            return Err(BuildError::InvalidEndpoint {
                endpoint: config.url.clone(),
                reason: "needs http:// or https:// and a host".into(),
            });
        }
        config.tls.check("prometheus.tls", "prometheus", &parsed)?;
        if config.bearer_token.is_some() && config.username.is_some() {
            return Err(BuildError::invalid("prometheus.bearer_token", "set either a bearer token or a user"));
        }
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| BuildError::invalid("prometheus.headers", format!("`{k}` is not a header name")))?;
            let mut value = HeaderValue::from_str(v.expose())
                .map_err(|_| BuildError::invalid("prometheus.headers", format!("the value of `{k}` is not usable")))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let http = HttpClient::new(ClientConfig {
            key: "prometheus",
            tls: &config.tls,
            url: &parsed,
            timeout: Some(config.timeout),
            connect_timeout: config.timeout.min(Duration::from_secs(10)),
            auth: match &config.bearer_token {
                Some(token) => Auth::Bearer(token.clone()),
                None => Auth::basic(config.username.as_ref(), config.password.as_ref()),
            },
            headers,
        })?;
        Ok(Self { http, endpoint: query_endpoint(parsed) })
    }

    /// The URL queries go to.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// One instant query, evaluated at `at` (default: the server's now). Only vector and
    /// scalar answers are read; a scalar is one sample without labels.
    ///
    /// # Errors
    /// [`QueryError`]: no answer, not a Prometheus API, or the query refused.
    pub async fn instant(&self, query: &str, at: Option<SystemTime>) -> Result<Vec<Sample>, QueryError> {
        // A form body (POST: a long query fits), encoded by the URL parser's form serializer.
        let mut form = reqwest::Url::parse("http://form.invalid/").expect("a constant URL");
        form.query_pairs_mut().append_pair("query", query);
        if let Some(at) = at {
            let secs = at.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            form.query_pairs_mut().append_pair("time", &format!("{secs:.3}"));
        }
        let request = self
            .http
            .request(reqwest::Method::POST, self.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form.query().unwrap_or_default().to_owned());
        let body = match self.http.fetch(request, MAX_ANSWER).await {
            Ok(body) => body,
            // The API answers a bad query with 400/422 and its JSON error.
            Err(HttpError::Status { body, status, .. }) => match parse_answer(&body) {
                Ok(Answer::Error(message)) => return Err(QueryError::Refused { query: query.to_owned(), message }),
                _ if status.as_u16() == 404 => return Err(self.not_prometheus(format!("HTTP {status}"))),
                _ => {
                    let server = server_message(&body);
                    return Err(QueryError::Http(format!("{}: HTTP {status}: {server}", self.endpoint)));
                }
            },
            Err(e) => return Err(QueryError::Http(e.message(self.endpoint.as_str()))),
        };
        match parse_answer(&body) {
            Ok(Answer::Samples(samples)) => Ok(samples),
            Ok(Answer::Error(message)) => Err(QueryError::Refused { query: query.to_owned(), message }),
            Err(reason) => Err(self.not_prometheus(reason)),
        }
    }

    fn not_prometheus(&self, reason: String) -> QueryError {
        QueryError::NotPrometheus { url: self.endpoint.to_string(), reason }
    }
}

/// `base` + `/api/v1/query`, unless it ends with it (or with `/api/v1`) already.
fn query_endpoint(mut base: reqwest::Url) -> reqwest::Url {
    let path = base.path().trim_end_matches('/').to_owned();
    let path = if path.ends_with("/api/v1/query") {
        path
    } else if path.ends_with("/api/v1") {
        format!("{path}/query")
    } else {
        format!("{path}/api/v1/query")
    };
    base.set_path(&path);
    base.set_query(None);
    base
}

enum Answer {
    Samples(Vec<Sample>),
    Error(String),
}

/// Reads the API's envelope: `{"status":"success","data":{"resultType":…,"result":…}}` or
/// `{"status":"error","error":…}`. `Err` says why this is no such answer.
fn parse_answer(body: &str) -> Result<Answer, String> {
    let describe = |body: &str| {
        let start: String = body.trim().chars().take(60).collect();
        if start.is_empty() {
            "an empty answer".to_owned()
        } else {
            format!("the answer starts `{}`", server_message(&start))
        }
    };
    let value: serde_json::Value = serde_json::from_str(body).map_err(|_| describe(body))?;
    match value.get("status").and_then(serde_json::Value::as_str) {
        Some("success") => {}
        Some("error") => {
            let message = value.get("error").and_then(serde_json::Value::as_str).unwrap_or("no message");
            return Ok(Answer::Error(server_message(message)));
        }
        _ => return Err(format!("JSON without a query API's `status`: {}", describe(body))),
    }
    let data = value.get("data").ok_or("no `data` in the answer")?;
    let result = data.get("result").ok_or("no `data.result` in the answer")?;
    match data.get("resultType").and_then(serde_json::Value::as_str) {
        Some("vector") => {
            let series = result.as_array().ok_or("`data.result` is not a list")?;
            series.iter().map(sample_of).collect::<Result<_, _>>().map(Answer::Samples)
        }
        Some("scalar") => Ok(Answer::Samples(vec![Sample { labels: BTreeMap::new(), value: value_of(result)? }])),
        other => Err(format!("a `{}` answer where an instant vector was asked", other.unwrap_or("?"))),
    }
}

fn sample_of(series: &serde_json::Value) -> Result<Sample, String> {
    let labels = series
        .get("metric")
        .and_then(serde_json::Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
        .unwrap_or_default();
    Ok(Sample { labels, value: value_of(series.get("value").ok_or("a series without `value`")?)? })
}

/// `[<time>, "<value>"]`: the value, with Prometheus' `NaN`, `+Inf`, `-Inf`.
fn value_of(pair: &serde_json::Value) -> Result<f64, String> {
    let text = pair.get(1).and_then(serde_json::Value::as_str).ok_or("a value that is not `[time, \"value\"]`")?;
    text.parse::<f64>().map_err(|_| format!("`{text}` is not a number"))
}

#[cfg(test)]
mod tests {
    use super::super::http::test_server::{Reply, TestServer};
    use super::*;

    #[test]
    fn the_query_path_is_appended_once() {
        let url = |s: &str| query_endpoint(reqwest::Url::parse(s).unwrap()).to_string();
        assert_eq!(url("http://p:9090"), "http://p:9090/api/v1/query");
        assert_eq!(url("http://m/prometheus/"), "http://m/prometheus/api/v1/query");
        assert_eq!(url("http://p:9090/api/v1"), "http://p:9090/api/v1/query");
        assert_eq!(url("http://p:9090/api/v1/query?x=1"), "http://p:9090/api/v1/query");
    }

    #[test]
    fn answers_are_read_or_said_to_be_no_query_api() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"namespace":"a"},"value":[1,"2.5"]},{"metric":{},"value":[1,"NaN"]}]}}"#;
        let Ok(Answer::Samples(s)) = parse_answer(ok) else { panic!() };
        assert_eq!(s[0].labels["namespace"], "a");
        assert_eq!(s[0].value, 2.5);
        assert!(s[1].value.is_nan());
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1,"3"]}}"#;
        let Ok(Answer::Samples(s)) = parse_answer(scalar) else { panic!() };
        assert_eq!((s.len(), s[0].value), (1, 3.0));
        let refused = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        assert!(matches!(parse_answer(refused), Ok(Answer::Error(m)) if m == "parse error at char 3"));
        assert_eq!(parse_answer("<html>Grafana</html>").err().unwrap(), "the answer starts `<html>Grafana</html>`");
        assert!(parse_answer(r#"{"results":[]}"#).err().unwrap().contains("without a query API's `status`"));
        assert!(parse_answer(r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#).is_err());
    }

    #[tokio::test]
    async fn a_web_page_a_404_and_a_refusal_are_told_apart() {
        let server = TestServer::start(Reply::with(200, &["Content-Type: text/html"], "<!doctype html><p>hi")).await;
        let client = QueryClient::new(&QueryConfig::new(&server.url)).unwrap();
        let e = client.instant("up", None).await.unwrap_err();
        assert!(matches!(e, QueryError::NotPrometheus { .. }), "{e}");
        assert!(e.to_string().contains("is not a Prometheus query API"), "{e}");

        server.set(Reply::with(404, &[], "404 page not found"));
        assert!(matches!(client.instant("up", None).await, Err(QueryError::NotPrometheus { .. })));

        server.set(Reply::with(400, &[], r#"{"status":"error","errorType":"bad_data","error":"unknown function"}"#));
        let e = client.instant("nope(up)", None).await.unwrap_err();
        assert_eq!(e.to_string(), "the query was refused: unknown function (query: nope(up))");

        server.set(Reply::with(502, &[], "bad gateway"));
        assert!(matches!(client.instant("up", None).await, Err(QueryError::Http(m)) if m.contains("502")));
    }

    #[tokio::test]
    async fn credentials_and_headers_go_with_the_query() {
        let server = TestServer::start(Reply::with(
            200,
            &[],
            r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
        ))
        .await;
        let mut config = QueryConfig::new(&server.url);
        config.bearer_token = Some("s3cret".into());
        config.headers.insert("X-Scope-OrgID".into(), "team-a".into());
        let client = QueryClient::new(&config).unwrap();
        assert!(client.instant("up", None).await.unwrap().is_empty());
        let (head, body) = server.received().pop().unwrap();
        assert!(head.contains("authorization: bearer s3cret") && head.contains("x-scope-orgid: team-a"), "{head}");
        assert!(head.starts_with("post /api/v1/query"), "{head}");
        assert_eq!(String::from_utf8_lossy(&body), "query=up");
        config.username = Some("u".into());
        assert!(QueryClient::new(&config).is_err(), "a user and a bearer token at once");
    }
}

//! Pushgateway pusher: `PUT` the 0.0.4 rendering of every snapshot, replacing the group.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use gpumon_core::{BuildError, Sink, SinkError, Snapshot, Telemetry};
use serde::Deserialize;

use super::render::RenderOptions;
use super::{Format, Naming, PrometheusHandle};
use crate::http::client::{Auth, ClientConfig, HttpClient, HttpError};
use crate::http::retry::{Backoff, Failure, Next, Retrier};
use crate::tls::TlsConfig;
use crate::Secret;

/// Settings of the Pushgateway sink (`[pushgateway]` in the agent's config file).
///
/// `#[non_exhaustive]`: outside this crate, start from `PushgatewayConfig::default()` (or
/// [`PushgatewaySink::builder`]) and assign the fields you need.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PushgatewayConfig {
    /// Base URL of the Pushgateway, e.g. `http://127.0.0.1:9091` (a path prefix is kept).
    pub url: String,
    /// The `job` grouping label. Default `"gpumon"`.
    pub job: String,
    /// Further grouping labels, in the URL path. `instance` defaults to this host's name.
    pub grouping: BTreeMap<String, String>,
    /// HTTP basic-auth user.
    pub username: Option<String>,
    /// HTTP basic-auth password (needs `username`).
    pub password: Option<Secret>,
    /// Metric and label names, as for the scrape endpoint.
    pub naming: Naming,
    /// Time budget of one export, retries included (default 8 s, below the agent's default
    /// export timeout of 10 s so the sink reports its own error rather than being cut off).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub timeout: Duration,
    /// Put the host name on every series (default false: the group's `instance` label already
    /// says which host pushed).
    pub host_label: bool,
    /// `DELETE` the group when the sink shuts down, so a stopped agent leaves no frozen values
    /// behind (default false).
    pub delete_on_shutdown: bool,
    /// TLS for an `https://` URL (`[pushgateway.tls]`): CA file, client certificate,
    /// `insecure_skip_verify`. See [`TlsConfig`].
    pub tls: TlsConfig,
}

impl Default for PushgatewayConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            job: "gpumon".to_owned(),
            grouping: BTreeMap::new(),
            username: None,
            password: None,
            naming: Naming::Native,
            timeout: Duration::from_secs(8),
            host_label: false,
            delete_on_shutdown: false,
            tls: TlsConfig::default(),
        }
    }
}

/// Builds a [`PushgatewaySink`].
#[derive(Debug)]
#[must_use]
pub struct PushgatewaySinkBuilder {
    config: PushgatewayConfig,
    backoff: Backoff,
}

impl PushgatewaySinkBuilder {
    /// The job label.
    pub fn job(mut self, job: impl Into<String>) -> Self {
        self.config.job = job.into();
        self
    }

    /// Adds a grouping label.
    pub fn grouping(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.grouping.insert(name.into(), value.into());
        self
    }

    /// HTTP basic auth.
    pub fn basic_auth(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.config.username = Some(username.into());
        self.config.password = Some(password.into());
        self
    }

    /// Metric and label naming.
    pub fn naming(mut self, naming: Naming) -> Self {
        self.config.naming = naming;
        self
    }

    /// Time budget of one export, retries included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// TLS settings for an `https://` URL (see [`TlsConfig`]).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.config.tls = tls;
        self
    }

    /// See [`PushgatewayConfig::delete_on_shutdown`].
    pub fn delete_on_shutdown(mut self, on: bool) -> Self {
        self.config.delete_on_shutdown = on;
        self
    }

    /// Validates the settings and returns the sink.
    ///
    /// # Errors
    /// [`BuildError::InvalidEndpoint`] for a URL that is not `http://` or `https://` (https needs
    /// the `tls` feature); [`BuildError::InvalidConfig`] for an empty job, a bad grouping label
    /// name, a password without user, a zero timeout, or unusable TLS settings (naming the key).
    pub fn build(self) -> Result<PushgatewaySink, BuildError> {
        let c = self.config;
        let invalid_url = |reason: String| BuildError::InvalidEndpoint { endpoint: c.url.clone(), reason };
        let url = reqwest::Url::parse(c.url.trim())
            .map_err(|e| invalid_url(format!("not a URL ({e}); expected e.g. http://127.0.0.1:9091")))?;
        c.tls.check("pushgateway.tls", "pushgateway.url", &url)?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(invalid_url("the URL has no host".to_owned()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid_url("the URL must not have a query or fragment".to_owned()));
        }
        if c.job.is_empty() {
            return Err(BuildError::invalid("pushgateway.job", "must not be empty"));
        }
        for name in c.grouping.keys() {
            if !is_label_name(name) || name == "job" {
                return Err(BuildError::invalid(
                    "pushgateway.grouping",
                    format!("`{name}` is not a usable label name ([a-zA-Z_][a-zA-Z0-9_]*, not `job`)"),
                ));
            }
        }
        if c.password.is_some() && c.username.is_none() {
            return Err(BuildError::invalid("pushgateway.password", "needs `username` too"));
        }
        if c.timeout.is_zero() {
            return Err(BuildError::invalid("pushgateway.timeout", "must be greater than zero"));
        }
        let mut grouping = c.grouping.clone();
        grouping.entry("instance".to_owned()).or_insert_with(gpumon_core::hostname);
        let group_url = group_url(url.as_str(), &c.job, &grouping);
        let push_url = reqwest::Url::parse(&group_url).map_err(|e| invalid_url(format!("{group_url}: {e}")))?;
        // The gateway's readiness endpoint, next to /metrics.
        let base = group_url.split("/metrics/job/").next().unwrap_or(&group_url);
        let ready_url = reqwest::Url::parse(&format!("{base}/-/ready")).map_err(|e| invalid_url(e.to_string()))?;
        let client = HttpClient::new(ClientConfig {
            key: "pushgateway",
            tls: &c.tls,
            url: &url,
            timeout: None, // each request is bounded by what is left of the export's budget
            connect_timeout: Duration::from_secs(2).min(c.timeout),
            auth: Auth::basic(c.username.as_ref(), c.password.as_ref()),
            headers: reqwest::header::HeaderMap::new(),
        })?;
        // Each push renders the snapshot it was just given: nothing to hide as stale (the group
        // is replaced every push, and `delete_on_shutdown` removes it when the agent stops).
        let handle = PrometheusHandle::new(
            RenderOptions { naming: c.naming, host_label: c.host_label, ..RenderOptions::default() },
            super::Staleness::Never,
        );
        Ok(PushgatewaySink {
            client,
            target: format!("error pushing to {group_url}"),
            group_url,
            push_url,
            ready_url,
            timeout: c.timeout,
            delete_on_shutdown: c.delete_on_shutdown,
            retrier: Retrier::new(self.backoff),
            handle,
            shut_down: false,
        })
    }
}

fn is_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// One path segment pair `/<name>/<value>`, using the `@base64` form (URL-safe base64) for
/// values that are empty or contain anything but unreserved characters — `/` in particular,
/// which the Pushgateway could not tell from a separator.
fn push_segment(url: &mut String, name: &str, value: &str) {
    url.push('/');
    url.push_str(name);
    let plain =
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
    if plain {
        url.push('/');
        url.push_str(value);
    } else {
        url.push_str("@base64/");
        if value.is_empty() {
            url.push('=');
        } else {
            url.push_str(&base64::engine::general_purpose::URL_SAFE.encode(value));
        }
    }
}

/// `<base>/metrics/job/<job>[/<label>/<value>]…`.
pub(crate) fn group_url(base: &str, job: &str, grouping: &BTreeMap<String, String>) -> String {
    let mut url = base.trim_end_matches('/').to_owned();
    url.push_str("/metrics");
    push_segment(&mut url, "job", job);
    for (k, v) in grouping {
        push_segment(&mut url, k, v);
    }
    url
}

/// Pushes every snapshot to a Prometheus Pushgateway. See the [module docs](super).
pub struct PushgatewaySink {
    client: HttpClient,
    group_url: String,
    /// `group_url`, parsed.
    push_url: reqwest::Url,
    /// `<base>/-/ready`.
    ready_url: reqwest::Url,
    /// `error pushing to <group_url>`, the start of every push error.
    target: String,
    timeout: Duration,
    delete_on_shutdown: bool,
    /// The tries' backoff and the outage in progress (the failure last logged).
    retrier: Retrier,
    handle: PrometheusHandle,
    shut_down: bool,
}

impl std::fmt::Debug for PushgatewaySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushgatewaySink")
            .field("group_url", &self.group_url)
            .field("timeout", &self.timeout)
            .field("shut_down", &self.shut_down)
            .finish_non_exhaustive()
    }
}

impl PushgatewaySink {
    /// A builder for a Pushgateway at `url`.
    pub fn builder(url: impl Into<String>) -> PushgatewaySinkBuilder {
        PushgatewaySinkBuilder {
            config: PushgatewayConfig { url: url.into(), ..PushgatewayConfig::default() },
            backoff: Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(2) },
        }
    }

    /// The sink described by `config`.
    ///
    /// # Errors
    /// As [`PushgatewaySinkBuilder::build`].
    pub fn from_config(config: &PushgatewayConfig) -> Result<PushgatewaySink, BuildError> {
        PushgatewaySinkBuilder { config: config.clone(), ..Self::builder("") }.build()
    }

    /// The URL pushes go to (`…/metrics/job/<job>/instance/<host>…`).
    pub fn group_url(&self) -> &str {
        &self.group_url
    }

    /// A handle rendering what was pushed last (e.g. to check what the gateway should hold).
    pub fn handle(&self) -> PrometheusHandle {
        self.handle.clone()
    }

    /// One `PUT` of the rendering, bounded by `timeout`.
    /// The export's error after its last try: `failure` (with `kind`, logged once until it
    /// changes or recovers), how many tries it took, and whether the last one ran out of the
    /// export's budget (`cut_short`: `failure` is then an earlier try's).
    fn give_up(&mut self, failure: Failure, kind: &str, tries: u32, cut_short: bool) -> SinkError {
        if self.retrier.log_once(kind) {
            tracing::warn!(url = %self.group_url, error = %failure.message(), "pushgateway push failed (logged once until it changes or recovers)");
        }
        let message = match (tries, cut_short) {
            (1, _) => failure.message().to_owned(),
            (_, false) => format!("{} (after {tries} attempts)", failure.message()),
            (_, true) => format!(
                "{} (after {tries} attempts, the last cut short by the export's {:?} budget)",
                failure.message(),
                self.timeout
            ),
        };
        failure.sink_error(message)
    }

    async fn attempt(&self, body: Bytes, timeout: Duration) -> Result<(), HttpError> {
        let request = self.client.request(reqwest::Method::PUT, self.push_url.clone());
        let request = request.timeout(timeout).header(reqwest::header::CONTENT_TYPE, Format::Text.content_type());
        self.client.send(request.body(body)).await
    }
}

#[async_trait::async_trait]
impl Sink for PushgatewaySink {
    fn name(&self) -> &str {
        "pushgateway"
    }

    fn attach_telemetry(&mut self, telemetry: Telemetry) {
        self.handle.set_telemetry(telemetry);
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.handle.store(snapshot);
        let body = Bytes::from(self.handle.render(Format::Text));
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.retrier.new_round();
        let mut tries = 0u32;
        // The last failure that was not a timeout, and its kind: a try started late in the
        // budget runs out of time whatever the server's trouble is, and "timed out" would hide
        // what the earlier tries were told (CI once saw a wrong CA reported so, after seven).
        let mut telling: Option<(Failure, String)> = None;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            if remaining.is_zero() {
                return Err(match telling.take() {
                    Some((failure, kind)) => self.give_up(failure, &kind, tries, true),
                    None => SinkError::Timeout(self.timeout),
                });
            }
            let Err(e) = self.attempt(body.clone(), remaining).await else {
                if let Some(outage) = self.retrier.succeeded() {
                    tracing::info!(url = %self.group_url, after = ?outage.lasted, "pushgateway push recovered");
                }
                return Ok(());
            };
            let (kind, timed_out) = (e.kind(), e.is_timeout());
            let failure = e.into_failure(&self.target);
            tries += 1;
            match self.retrier.failed(&failure) {
                Next::Retry { delay, .. } if tokio::time::Instant::now() + delay < deadline => {
                    if !timed_out {
                        telling = Some((failure, kind));
                    }
                    tokio::time::sleep(delay).await;
                }
                // Held or refused (no buffer to keep the data in), or out of budget.
                _ => {
                    return Err(match telling.take() {
                        Some((earlier, earlier_kind)) if timed_out => self.give_up(earlier, &earlier_kind, tries, true),
                        _ => self.give_up(failure, &kind, tries, false),
                    });
                }
            }
        }
    }

    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        let probed = self.client.probe(self.ready_url.clone(), Some(self.timeout)).await;
        probed.map_err(|e| SinkError::transient(e.message(&format!("GET {}", self.ready_url))))
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        if std::mem::replace(&mut self.shut_down, true) || !self.delete_on_shutdown {
            return Ok(());
        }
        let request = self.client.request(reqwest::Method::DELETE, self.push_url.clone()).timeout(self.timeout);
        let deleted = self.client.send(request).await;
        deleted.map_err(|e| SinkError::transient(e.message(&format!("DELETE {}", self.group_url))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_path_uses_base64_for_slashes_and_empty_values() {
        let mut g = BTreeMap::new();
        g.insert("instance".to_owned(), "node-1".to_owned());
        g.insert("path".to_owned(), "/var/tmp".to_owned());
        g.insert("empty".to_owned(), String::new());
        let url = group_url("http://gw:9091/", "gpu mon", &g);
        assert_eq!(
            url,
            "http://gw:9091/metrics/job@base64/Z3B1IG1vbg==/empty@base64/=/instance/node-1/path@base64/L3Zhci90bXA="
        );
    }

    #[test]
    fn url_validation_is_clear() {
        let err = |url: &str| PushgatewaySink::builder(url).build().unwrap_err().to_string();
        assert!(err("ftp://gw:9091").contains("scheme `ftp`"), "{}", err("ftp://gw:9091"));
        assert!(err("gw:9091").contains("scheme"), "{}", err("gw:9091"));
        assert!(err("not a url").contains("not a URL"));
        #[cfg(not(feature = "tls"))]
        assert!(err("https://gw:9091").contains("`tls` cargo feature"), "{}", err("https://gw:9091"));
        #[cfg(feature = "tls")]
        {
            let insecure = TlsConfig { insecure_skip_verify: true, ..TlsConfig::default() };
            PushgatewaySink::builder("https://gw:9091").tls(insecure).build().unwrap();
            let e = PushgatewaySink::builder("https://gw:9091")
                .tls(TlsConfig::with_ca_file("/nonexistent/ca.pem"))
                .build()
                .unwrap_err()
                .to_string();
            assert!(e.contains("pushgateway.tls.ca_file") && e.contains("/nonexistent/ca.pem"), "{e}");
        }
        // TLS settings on an http:// URL would do nothing: refused, naming the table.
        let e = PushgatewaySink::builder("http://gw:9091")
            .tls(TlsConfig::with_ca_file("/x"))
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains("pushgateway.tls") && e.contains("http://"), "{e}");
        assert!(err("http://gw:9091/?x=1").contains("query"));
        let e = PushgatewaySink::builder("http://gw:9091").grouping("job", "x").build().unwrap_err().to_string();
        assert!(e.contains("not `job`"), "{e}");
        let e = PushgatewaySink::builder("http://gw:9091").job("").build().unwrap_err().to_string();
        assert!(e.contains("job"), "{e}");
        let ok = PushgatewaySink::builder("http://gw:9091/prefix").grouping("instance", "h1").build().unwrap();
        assert_eq!(ok.group_url(), "http://gw:9091/prefix/metrics/job/gpumon/instance/h1");
    }

    #[test]
    fn config_deserializes_with_defaults_and_rejects_unknown_keys() {
        let c: PushgatewayConfig =
            serde_json::from_str(r#"{"url":"http://127.0.0.1:9091","grouping":{"rack":"r1"},"timeout":"3s"}"#).unwrap();
        assert_eq!(c.job, "gpumon");
        assert_eq!(c.timeout, Duration::from_secs(3));
        let sink = PushgatewaySink::from_config(&c).unwrap();
        assert!(sink.group_url().contains("/instance/") || sink.group_url().contains("/instance@base64/"));
        assert!(sink.group_url().contains("/rack/r1"));
        assert!(serde_json::from_str::<PushgatewayConfig>(r#"{"url":"x","jbo":"typo"}"#).is_err());
        assert!(!format!("{:?}", PushgatewayConfig { password: Some("s3cret".into()), ..c }).contains("s3cret"));
    }

    #[tokio::test]
    async fn an_endless_error_body_is_cut_short() {
        use crate::http::test_server::{Reply, TestServer};
        let server = TestServer::start(Reply::Endless { status: 400, prefix: "bad metric name".to_owned() }).await;
        let mut sink = PushgatewaySink::builder(&server.url).timeout(Duration::from_secs(20)).build().unwrap();
        let snapshot = Snapshot::new(Arc::new(gpumon_core::SystemInfo::new("h", "t")), Vec::new());
        let started = std::time::Instant::now();
        let err = sink.export(Arc::new(snapshot)).await.unwrap_err().to_string();
        // Reading the whole body would take until the 20 s timeout and lose the server's text.
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert!(err.contains("HTTP 400") && err.contains("bad metric namexxx"), "{err}");
        assert!(err.starts_with("permanent"), "{err}");
        assert_eq!(server.requests(), 1);
    }

    /// A stub answering 503 (with `headers`) `failures` times, then 200; every request recorded.
    fn flaky(failures: usize, headers: &'static [&'static str]) -> gpumon_mock::test_env::HttpStub {
        use gpumon_mock::test_env::{HttpReply, HttpStub};
        let seen = std::sync::atomic::AtomicUsize::new(0);
        HttpStub::start(move |_| {
            if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < failures {
                HttpReply::with(503, headers, "busy")
            } else {
                HttpReply::status(200)
            }
        })
    }

    fn empty_snapshot() -> Arc<Snapshot> {
        Arc::new(Snapshot::new(Arc::new(gpumon_core::SystemInfo::new("h", "t")), Vec::new()))
    }

    #[tokio::test]
    async fn transient_failures_are_retried_within_the_budget() {
        let server = flaky(2, &[]);
        let mut sink = PushgatewaySink::builder(server.url()).timeout(Duration::from_secs(10)).build().unwrap();
        sink.export(empty_snapshot()).await.unwrap();
        assert_eq!(server.count(), 3, "two 503s, then the push that succeeded");

        // Always busy: the budget runs out, and the error says how often it tried.
        let server = flaky(usize::MAX, &[]);
        let mut sink = PushgatewaySink::builder(server.url()).timeout(Duration::from_millis(600)).build().unwrap();
        let err = sink.export(empty_snapshot()).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let text = err.to_string();
        assert!(text.contains("error pushing to") && text.contains("HTTP 503") && text.contains("busy"), "{text}");
        assert!(server.count() >= 2 && text.contains(&format!("(after {} attempts)", server.count())), "{text}");
    }

    #[tokio::test]
    async fn a_last_try_cut_short_by_the_budget_reports_what_the_earlier_ones_were_told() {
        use gpumon_mock::test_env::{HttpReply, HttpStub};
        // 503 at once, then a server too slow for what is left of the 1.5 s budget.
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let server = HttpStub::start(move |_| {
            if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                HttpReply::with(503, &[], "busy")
            } else {
                std::thread::sleep(Duration::from_secs(3));
                HttpReply::status(200)
            }
        });
        let mut sink = PushgatewaySink::builder(server.url()).timeout(Duration::from_millis(1500)).build().unwrap();
        let err = sink.export(empty_snapshot()).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let text = err.to_string();
        assert!(text.contains("HTTP 503") && text.contains("busy"), "{text}");
        assert!(text.contains("(after 2 attempts, the last cut short by the export's 1.5s budget)"), "{text}");
    }

    #[tokio::test]
    async fn a_retry_after_beyond_the_budget_ends_the_export_at_once() {
        let server = flaky(usize::MAX, &["Retry-After: 60"]);
        let mut sink = PushgatewaySink::builder(server.url()).timeout(Duration::from_secs(5)).build().unwrap();
        let started = std::time::Instant::now();
        let err = sink.export(empty_snapshot()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(err.is_retryable() && err.to_string().contains("HTTP 503"), "{err}");
        assert_eq!(server.count(), 1);
    }

    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn a_server_certificate_not_trusted_is_reported_at_once_naming_the_ca_file() {
        use crate::http::test_server::{Reply, TestServer};
        let server = TestServer::start_tls(Reply::status(200)).await;
        // The server's own leaf is no CA: the client refuses the certificate it presents.
        let not_a_ca = concat!(env!("CARGO_MANIFEST_DIR"), "/src/testdata/tls/localhost.pem");
        let mut sink = PushgatewaySink::builder(&server.url)
            .tls(TlsConfig::with_ca_file(not_a_ca))
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let err = sink.export(empty_snapshot()).await.unwrap_err();
        // Retrying cannot help until someone fixes the setting, so one try and no more: a
        // retried one had spent the budget and could end on a timeout that named neither.
        assert!(!err.is_retryable() && started.elapsed() < Duration::from_secs(10), "{err} {:?}", started.elapsed());
        let text = err.to_string();
        assert!(text.contains(&server.url) && text.contains("pushgateway.tls.ca_file"), "{text}");
        assert!(!text.contains("attempts"), "{text}");
        assert_eq!(server.requests(), 0);
    }

    #[tokio::test]
    async fn auth_failures_are_not_retried() {
        use crate::http::test_server::{Reply, TestServer};
        let server = TestServer::start(Reply::with(401, &[], "Unauthorized")).await;
        let mut sink = PushgatewaySink::builder(&server.url).basic_auth("u", "p").build().unwrap();
        let err = sink.export(empty_snapshot()).await.unwrap_err().to_string();
        assert!(err.starts_with("permanent") && err.contains("HTTP 401"), "{err}");
        assert_eq!(server.requests(), 1);
    }

    #[tokio::test]
    async fn pushes_with_auth_probes_without_and_deletes_on_shutdown() {
        use crate::http::test_server::{Reply, TestServer};
        let server = TestServer::start(Reply::status(200)).await;
        let mut sink = PushgatewaySink::builder(&server.url)
            .basic_auth("u", "p")
            .grouping("instance", "h1")
            .delete_on_shutdown(true)
            .build()
            .unwrap();
        sink.healthcheck().await.unwrap();
        sink.export(empty_snapshot()).await.unwrap();
        sink.shutdown().await.unwrap();
        let heads: Vec<String> = server.received().into_iter().map(|(head, _)| head).collect();
        assert_eq!(heads.len(), 3, "{heads:?}");
        assert!(heads[0].starts_with("get /-/ready ") && !heads[0].contains("authorization"), "{}", heads[0]);
        let put = &heads[1];
        assert!(put.starts_with("put /metrics/job/gpumon/instance/h1 "), "{put}");
        assert!(put.contains("authorization: basic dtpw") && put.contains("content-type: text/plain"), "{put}");
        assert!(heads[2].starts_with("delete /metrics/job/gpumon/instance/h1 "), "{}", heads[2]);
        assert!(heads[2].contains("authorization: basic dtpw"), "{}", heads[2]);

        server.set(Reply::status(503));
        let err = sink.healthcheck().await.unwrap_err().to_string();
        assert!(err.contains("/-/ready: HTTP 503"), "{err}");
    }
}

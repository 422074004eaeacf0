//! Prometheus: a scrape endpoint, a render handle, and a Pushgateway pusher.
//!
//! ## Scrape endpoint ([`PrometheusSink`])
//! A *pull* sink that is fed by push, like every gpumon sink: [`Sink::export`] only stores the
//! latest [`Snapshot`] (an [`ArcSwap`](arc_swap::ArcSwapOption) swap, no lock, no render). Each
//! scrape of `/metrics` renders that snapshot plus the agent's self-metrics, in the format the
//! scraper's `Accept` header asks for: Prometheus text 0.0.4 or OpenMetrics 1.0.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpumon_sinks::prometheus::{PrometheusConfig, PrometheusSink};
//! let sink = PrometheusSink::from_config(&PrometheusConfig::default())?; // 127.0.0.1:9400
//! println!("scrape me at http://{}/metrics", sink.local_addr().unwrap());
//! # Ok(()) }
//! ```
//!
//! **When the listener starts.** The socket is bound synchronously in `build()` /
//! `from_config()` — so a taken port is a [`BuildError`] at start-up and
//! [`PrometheusSink::local_addr`] is known at once (bind port 0 in tests). The accept loop is
//! spawned on the current tokio runtime right away when `build()` runs inside one, otherwise on
//! the first `healthcheck`/`export` (which the agent always runs inside its runtime). It stops
//! when the sink is shut down or dropped.
//!
//! **Tenants.** [`PrometheusConfig::tenants`] maps credentials to tenant selectors: a scrape
//! with a tenant's credential gets only the series of the GPUs that tenant holds, and nothing
//! that names another tenant ([`PrometheusHandle::render_for`]; `docs/tenancy.md`). The
//! [`auth`](PrometheusConfig::auth) credential still reads everything; with tenants and no
//! `auth`, a scrape without credentials gets `401`.
//!
//! Endpoints: `GET /metrics` (auth applies), `GET /health` (readiness: `200 ok` while the last
//! sample succeeded, `503` with the reason otherwise), `GET /live` (liveness: `200` while the
//! process serves, also while sampling fails); the probes never need auth. `404` for any other
//! path, `405` for methods other than GET/HEAD.
//!
//! Limits a hostile client cannot get around: request heads larger than
//! [`PrometheusConfig::max_header_bytes`] get `431`; a head must arrive within
//! [`PrometheusConfig::header_read_timeout`] (this also bounds keep-alive idling and the TLS
//! handshake); no connection lives longer than [`PrometheusConfig::connection_timeout`]; at most
//! [`PrometheusConfig::max_connections`] are served at once, and when they are all taken the
//! *oldest idle* one (no request in progress) is closed to make room, so a crowd of idle or
//! slow-loris connections cannot lock scrapers out.
//!
//! ## Render handle ([`PrometheusHandle`])
//! For embedders with their own HTTP server: `sink.handle()` before handing the sink to the
//! agent, then `handle.render(handle.negotiate(accept_header))` in your route, with
//! [`Format::content_type`] as the `Content-Type`. `PrometheusSink::builder().build()` without
//! [`PrometheusSinkBuilder::with_http_listener`] starts no listener at all.
//!
//! ## Names
//! Native names follow Prometheus conventions and come from the metric catalogue
//! ([`Descriptor::prometheus_name`](gpumon_core::Descriptor::prometheus_name)): base units,
//! `_bytes`, `_celsius`, `_watts`, `_hertz`, `_ratio` for 0..1, counters end in `_total`. Every
//! series carries `gpu` (index), `uuid`, `host` and, for MIG instances, `gpu_instance_id` and
//! `mig_profile`; labelled families add `xid`, `pid` or `reason`. Everything else about a GPU
//! is in one `gpumon_gpu_info{…} 1` series per device (name, PCI bus id, serial, driver and CUDA
//! versions, …). With [`Naming::Dcgm`] the sink speaks dcgm-exporter's names, units and labels
//! (see `docs/prometheus.md` for the generated mapping table).
//!
//! In OpenMetrics, dcgm-exporter's counters (no `_total` suffix, which OpenMetrics requires of
//! counter samples) are typed `unknown` so their names stay exactly the ones dashboards query.
//!
//! **Stale data.** Only devices in the latest snapshot are rendered, so a device that
//! disappears stops being exported at once; a lost device renders only `gpumon_up 0`. A tick
//! whose sample failed (NVML unavailable, say: a sampling-failed snapshot,
//! [`gpumon_core::SamplingState`]) renders no device series and one `gpumon_up` = 0 with only
//! the host label, in the GPUs' `gpumon_up` family, so one alert on `gpumon_up == 0` covers both.
//! And no frozen values: when the latest snapshot is older than three sampling intervals of the
//! agent (at least 5 s; see [`default_stale_after`], or set [`PrometheusConfig::stale_after`]) —
//! sampling hangs — no device series is
//! rendered and `/health` answers `503` saying how old the data is; the self-metrics
//! (`gpumon_last_sample_success`, `gpumon_last_sample_timestamp_seconds`, sample and sink
//! counters) are still served, so alerts on them fire.
//!
//! ## Why not prometheus-client
//! gpumon's data is an immutable snapshot of values the driver already aggregated; there is
//! nothing to register or update, only something to print. `prometheus-client` (0.26) only
//! encodes OpenMetrics (no 0.0.4 text, which promtool, the Pushgateway and many scrapers
//! expect), always appends `_total` to counters (which would rename dcgm-exporter's counters
//! and break the dashboards [`Naming::Dcgm`] exists for) and needs `'static` collectors in a
//! registry. The renderer here is ~400 lines, escapes label values with the same rules
//! (`\\`, `\"`, `\n`; property-tested), and renders 8 fully populated GPUs in a few tens of
//! microseconds (`cargo bench -p gpumon-sinks --bench prometheus_render --features prometheus`).
//!
//! ## Pushgateway ([`PushgatewaySink`], feature `pushgateway`)
//! A push sink: every export `PUT`s the 0.0.4 rendering to
//! `<url>/metrics/job/<job>/<label>/<value>…`, replacing the group. Network errors, 408, 429 and
//! 5xx are retried within [`PushgatewayConfig::timeout`], after the gateway's `Retry-After` or
//! with jittered exponential backoff (the retry policy every HTTP sink shares); any other answer
//! ends the export with a permanent error.
//!
//! [`Sink::export`]: gpumon_core::Sink::export
//! [`Snapshot`]: gpumon_core::Snapshot
//! [`BuildError`]: gpumon_core::BuildError

mod config;
mod render;
pub(crate) mod series;

#[cfg(feature = "prometheus-http")]
mod serve;

#[cfg(feature = "pushgateway")]
mod pushgateway;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use gpumon_core::attribution::TenantSelector;
use gpumon_core::{BuildError, Snapshot, Telemetry};

use crate::http;

pub use config::{Naming, PrometheusConfig, DEFAULT_LISTEN};
pub use render::{escape_label_value, Format, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
// The listener's types are the HTTP layer's (shared with the web view); re-exported at the paths
// they had before, which stay the place to import them from.
pub use crate::http::access::Auth;
pub use crate::http::listener::TlsConfig;
pub use crate::http::tenants::{BasicCredentials, TenantConfig};

#[cfg(feature = "pushgateway")]
#[cfg_attr(docsrs, doc(cfg(feature = "pushgateway")))]
pub use pushgateway::{PushgatewayConfig, PushgatewaySink, PushgatewaySinkBuilder};

pub(crate) use render::RenderOptions;

/// The `stale_after` used when [`PrometheusConfig::stale_after`] is not set and the sink is
/// attached to an agent sampling every `interval`: three intervals (two missed ticks and one late
/// one are tolerated), but at least 5 s, so that short intervals do not flap on a slow sample or
/// a busy host. 1 s → 5 s, 2 s → 6 s, 10 s → 30 s.
pub fn default_stale_after(interval: Duration) -> Duration {
    interval.saturating_mul(3).max(Duration::from_secs(5))
}

/// When device series count as stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staleness {
    /// Never (the Pushgateway sink renders each snapshot as it arrives).
    #[cfg_attr(not(feature = "pushgateway"), allow(dead_code))]
    Never,
    /// An explicit [`PrometheusConfig::stale_after`].
    After(Duration),
    /// [`default_stale_after`] of the attached agent's interval; never without an agent.
    FromAgent,
}

struct Shared {
    snapshot: ArcSwapOption<Snapshot>,
    telemetry: ArcSwapOption<Telemetry>,
    /// Render options; `opts.stale_after` is `staleness` when that is fixed.
    opts: RenderOptions,
    staleness: Staleness,
    /// Length of the last rendering, to size the next buffer in one allocation.
    size_hint: AtomicUsize,
}

/// Renders the latest snapshot on demand. Cheap to clone; see the [module docs](self).
#[derive(Clone)]
pub struct PrometheusHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PrometheusHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusHandle")
            .field("naming", &self.shared.opts.naming)
            .field("seq", &self.shared.snapshot.load().as_ref().map(|s| s.seq))
            .finish()
    }
}

impl PrometheusHandle {
    fn new(mut opts: RenderOptions, staleness: Staleness) -> Self {
        opts.stale_after = match staleness {
            Staleness::After(max) => Some(max),
            Staleness::Never | Staleness::FromAgent => None,
        };
        Self {
            shared: Arc::new(Shared {
                snapshot: ArcSwapOption::empty(),
                telemetry: ArcSwapOption::empty(),
                opts,
                staleness,
                size_hint: AtomicUsize::new(4096),
            }),
        }
    }

    /// The age beyond which device series are hidden, and how that limit came about (for
    /// `/health`).
    fn stale_after(&self, telemetry: Option<&Telemetry>) -> Option<(Duration, String)> {
        match self.shared.staleness {
            Staleness::Never => None,
            Staleness::After(max) => Some((max, format!("stale_after {max:?}"))),
            Staleness::FromAgent => telemetry.and_then(Telemetry::interval).map(|interval| {
                let max = default_stale_after(interval);
                (max, format!("stale after {max:?}: 3 × the {interval:?} sampling interval, at least 5s"))
            }),
        }
    }

    /// The exposition of the latest snapshot (and self-metrics) in `format`.
    pub fn render(&self, format: Format) -> String {
        let mut out = String::with_capacity(self.shared.size_hint.load(Ordering::Relaxed) + 256);
        self.render_to(&mut out, format);
        out
    }

    /// Appends the exposition to `out` (reuse one buffer across scrapes to avoid allocating).
    pub fn render_to(&self, out: &mut String, format: Format) {
        let start = out.len();
        let snapshot = self.shared.snapshot.load();
        self.render_snapshot(out, snapshot.as_deref(), format);
        self.shared.size_hint.store(out.len() - start, Ordering::Relaxed);
    }

    /// The exposition that the tenant `tenant` may read: the latest snapshot
    /// [scoped](Snapshot::scoped_to) to it — only the GPUs it holds, only its own processes and
    /// owner labels — plus the agent's self-metrics (which name no tenant). What the scrape
    /// endpoint answers a tenant's credential with; see `docs/tenancy.md`.
    pub fn render_for(&self, format: Format, tenant: &TenantSelector) -> String {
        let snapshot = self.shared.snapshot.load_full().map(|s| s.scoped_to(tenant));
        let mut out = String::with_capacity(self.shared.size_hint.load(Ordering::Relaxed) + 256);
        self.render_snapshot(&mut out, snapshot.as_ref(), format);
        out
    }

    fn render_snapshot(&self, out: &mut String, snapshot: Option<&Snapshot>, format: Format) {
        let telemetry = self.shared.telemetry.load();
        let opts = &self.shared.opts;
        if self.shared.staleness == Staleness::FromAgent {
            let stale_after = self.stale_after(telemetry.as_deref()).map(|(max, _)| max);
            let opts = RenderOptions { stale_after, ..opts.clone() };
            render::render(out, snapshot, telemetry.as_deref(), &opts, format);
        } else {
            render::render(out, snapshot, telemetry.as_deref(), opts, format);
        }
    }

    /// The format to answer a request with this `Accept` header (honours
    /// [`PrometheusConfig::openmetrics`]).
    pub fn negotiate(&self, accept: Option<&str>) -> Format {
        if self.shared.opts.openmetrics {
            Format::from_accept(accept)
        } else {
            Format::Text
        }
    }

    /// Replaces the snapshot that is rendered (what [`Sink::export`](gpumon_core::Sink::export)
    /// does). For embedders that sample without an agent.
    pub fn store(&self, snapshot: Arc<Snapshot>) {
        self.shared.snapshot.store(Some(snapshot));
    }

    /// The snapshot that is rendered now.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.shared.snapshot.load_full()
    }

    /// Sets the telemetry rendered as self-metrics (the agent does this through
    /// [`Sink::attach_telemetry`](gpumon_core::Sink::attach_telemetry)).
    pub fn set_telemetry(&self, telemetry: Telemetry) {
        self.shared.telemetry.store(Some(Arc::new(telemetry)));
    }

    /// What `/health` answers: `Ok` while the last sample succeeded and the latest snapshot is
    /// not stale (see [`PrometheusConfig::stale_after`]), otherwise why not.
    ///
    /// # Errors
    /// The reason the endpoint is unhealthy, as text.
    pub fn health(&self) -> Result<(), String> {
        let telemetry = self.shared.telemetry.load();
        if let Some(t) = telemetry.as_deref() {
            let stats = t.stats();
            if !stats.last_sample_ok {
                return Err(match stats.last_sample_error {
                    Some(e) => format!("last sample failed: {e}"),
                    None => "no sample taken yet".to_owned(),
                });
            }
        }
        let Some(snapshot) = self.shared.snapshot.load_full() else {
            return Err("no snapshot yet".to_owned());
        };
        if let Some(reason) = snapshot.sampling_failure() {
            return Err(format!("last sample failed: {reason}"));
        }
        if let Some((max, why)) = self.stale_after(telemetry.as_deref()) {
            let age = SystemTime::now().duration_since(snapshot.taken_at).unwrap_or(Duration::ZERO);
            if age > max {
                return Err(format!(
                    "latest snapshot is {:.1}s old ({why}): sampling has stalled; device series are not exported",
                    age.as_secs_f64()
                ));
            }
        }
        Ok(())
    }
}

/// Builds a [`PrometheusSink`]. Setters are consuming; see [`PrometheusConfig`] for what each
/// setting means and its default.
#[derive(Debug, Default)]
#[must_use]
pub struct PrometheusSinkBuilder {
    config: PrometheusConfig,
    listen: Option<SocketAddr>,
}

impl PrometheusSinkBuilder {
    /// Serves `/metrics`, `/health` and `/live` on `addr` (port 0 picks a free one).
    #[cfg(feature = "prometheus-http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus-http")))]
    pub fn with_http_listener(mut self, addr: impl Into<SocketAddr>) -> Self {
        self.listen = Some(addr.into());
        self
    }

    /// Metric and label naming.
    pub fn naming(mut self, naming: Naming) -> Self {
        self.config.naming = naming;
        self
    }

    /// Requires credentials on `/metrics`.
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.config.auth = Some(auth);
        self
    }

    /// Adds a tenant: its credential on `/metrics` reads only its own view (see
    /// [`PrometheusConfig::tenants`]).
    pub fn with_tenant(mut self, tenant: TenantConfig) -> Self {
        self.config.tenants.push(tenant);
        self
    }

    /// Serves HTTPS with these PEM files (feature `prometheus-tls`).
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// See [`PrometheusConfig::max_connections`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.config.max_connections = n;
        self
    }

    /// See [`PrometheusConfig::header_read_timeout`].
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.config.header_read_timeout = timeout;
        self
    }

    /// See [`PrometheusConfig::connection_timeout`].
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.config.connection_timeout = timeout;
        self
    }

    /// See [`PrometheusConfig::max_header_bytes`].
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.config.max_header_bytes = bytes;
        self
    }

    /// See [`PrometheusConfig::host_label`].
    pub fn host_label(mut self, on: bool) -> Self {
        self.config.host_label = on;
        self
    }

    /// See [`PrometheusConfig::openmetrics`].
    pub fn openmetrics(mut self, on: bool) -> Self {
        self.config.openmetrics = on;
        self
    }

    /// See [`PrometheusConfig::stale_after`] (this overrides the default derived from the
    /// agent's interval).
    pub fn stale_after(mut self, max_age: Duration) -> Self {
        self.config.stale_after = Some(max_age);
        self
    }

    /// Validates the settings, binds the listener (if any) and returns the sink.
    ///
    /// # Errors
    /// [`BuildError::InvalidConfig`] for a setting that cannot work (naming the cargo feature
    /// when one is missing, e.g. TLS without `prometheus-tls`); [`BuildError::Io`] when the
    /// address cannot be bound or the TLS files cannot be read.
    pub fn build(self) -> Result<PrometheusSink, BuildError> {
        let c = &self.config;
        if let Some(auth) = &c.auth {
            auth.validate("prometheus")?;
        }
        let listener = c.listener();
        listener.validate("prometheus")?;
        if c.stale_after.is_some_and(|d| d.is_zero()) {
            return Err(BuildError::invalid("prometheus.stale_after", "must be greater than zero"));
        }
        if self.listen.is_none() && (c.auth.is_some() || c.tls.is_some() || !c.tenants.is_empty()) {
            return Err(BuildError::invalid(
                "prometheus.auth/prometheus.tls/prometheus.tenants",
                "only apply to the HTTP listener; add one with `with_http_listener` (feature `prometheus-http`)",
            ));
        }
        let opts = RenderOptions {
            naming: c.naming,
            host_label: c.host_label,
            dcgm_lowercase_hostname: c.dcgm_lowercase_hostname,
            stale_after: None,
            openmetrics: c.openmetrics,
        };
        let staleness = c.stale_after.map_or(Staleness::FromAgent, Staleness::After);
        let handle = PrometheusHandle::new(opts, staleness);

        #[cfg(feature = "prometheus-http")]
        let server = match self.listen {
            Some(addr) => {
                let tenants = http::tenants::resolve("prometheus", c.auth.as_ref(), &c.tenants)?;
                let access = http::access::Access::new(c.auth.clone(), tenants);
                let settings =
                    http::server::Settings::new("prometheus", "prometheus scrape endpoint", &listener, access)?;
                Some(http::server::Server::bind(addr, settings, Arc::new(serve::Scrape(handle.clone())))?)
            }
            None => None,
        };
        #[cfg(feature = "prometheus-http")]
        let serving = http::serving::Serving::new(server);
        #[cfg(not(feature = "prometheus-http"))]
        let serving = http::serving::Serving::default();
        Ok(PrometheusSink { handle, serving })
    }
}

/// The Prometheus scrape sink. See the [module docs](self).
pub struct PrometheusSink {
    handle: PrometheusHandle,
    serving: http::serving::Serving,
}

impl std::fmt::Debug for PrometheusSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusSink")
            .field("local_addr", &self.local_addr())
            .field("handle", &self.handle)
            .field("shut_down", &self.serving.is_shut_down())
            .finish()
    }
}

impl PrometheusSink {
    /// A builder: no listener, native names, defaults of [`PrometheusConfig`].
    pub fn builder() -> PrometheusSinkBuilder {
        PrometheusSinkBuilder::default()
    }

    /// The sink described by `config`, with its listener on `config.listen` (default
    /// [`DEFAULT_LISTEN`]).
    ///
    /// # Errors
    /// As [`PrometheusSinkBuilder::build`]; without the `prometheus-http` feature,
    /// [`BuildError::InvalidConfig`] naming it.
    pub fn from_config(config: &PrometheusConfig) -> Result<PrometheusSink, BuildError> {
        #[cfg(feature = "prometheus-http")]
        {
            let builder = PrometheusSinkBuilder { config: config.clone(), listen: None };
            builder.with_http_listener(config.listen.unwrap_or(DEFAULT_LISTEN)).build()
        }
        #[cfg(not(feature = "prometheus-http"))]
        {
            let _ = config;
            Err(BuildError::invalid(
                "prometheus",
                "the scrape endpoint needs the `prometheus-http` cargo feature of gpumon-sinks \
                 (without it, use PrometheusSink::builder().build() and serve PrometheusHandle::render yourself)",
            ))
        }
    }

    /// A handle that renders what this sink holds; stays valid after the sink moves into an
    /// agent.
    pub fn handle(&self) -> PrometheusHandle {
        self.handle.clone()
    }

    /// The address the listener is bound to (`None` without a listener).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.serving.local_addr()
    }
}

impl http::serving::Published for PrometheusHandle {
    fn sink_name(&self) -> &str {
        "prometheus"
    }

    fn keep_telemetry(&self, telemetry: Telemetry) {
        self.set_telemetry(telemetry);
    }

    fn take_snapshot(&self, snapshot: Arc<Snapshot>) {
        self.store(snapshot);
    }
}

http::serving::served_sink!(PrometheusSink, handle);

#[cfg(test)]
pub(crate) mod tests;

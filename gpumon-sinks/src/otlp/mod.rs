//! OTLP sink: GPU metrics into any OpenTelemetry pipeline, named by the OpenTelemetry hardware
//! semantic conventions.
//!
//! OTLP/HTTP with protobuf bodies is always available with the `otlp` feature; OTLP/gRPC needs
//! `otlp-grpc`.
//!
//! # Pipelines
//! - **Direct** ([`Pipeline::Direct`], the default of [`OtlpSink::from_config`]): the sink builds
//!   the `ExportMetricsServiceRequest` from each snapshot with the generated types of
//!   `opentelemetry-proto`, encodes it with prost into a reused buffer and sends it with its own
//!   async client (reqwest for HTTP, tonic's `MetricsServiceClient` for gRPC). Data points carry
//!   the snapshot's time; cumulative Sums carry the sink's creation time as start time.
//! - **SDK** ([`Pipeline::Sdk`], and every sink built from an embedder's provider or meter):
//!   observable instruments on an `opentelemetry_sdk` 0.33 `SdkMeterProvider` exported by
//!   `opentelemetry-otlp`.
//!
//! Both produce the same names, units, descriptions, kinds and attributes: they share the
//! catalogue plan and the attribute logic.
//!
//! # Names
//! Every metric's OpenTelemetry name, unit, kind and extra attribute come from the metric
//! catalogue ([`gpumon_core::MetricId::descriptor`], field `otel`); the complete table is in
//! `docs/otlp.md` and [`mapping_markdown`] generates it. Semantic-convention names where the
//! conventions have one (`hw.gpu.utilization{hw.gpu.task}`, `hw.gpu.memory.usage` /
//! `hw.gpu.memory.limit` (UpDownCounter), `hw.gpu.memory.utilization`, `hw.power`, `hw.energy`
//! (Counter), `hw.temperature{hw.sensor_location}`, `hw.errors{error.type}`,
//! `hw.status{hw.state}`), everything else under the `gpumon.` extension namespace.
//!
//! Every data point about a GPU names it: `hw.id` (the UUID), `hw.name` (`nvidia0`,
//! `nvidia0/mig1`), `hw.type=gpu`. The rest of the GPU attribute set — `hw.vendor=nvidia`,
//! `hw.model`, `hw.driver_version`, `hw.serial_number`, `hw.parent` (a MIG instance's parent
//! UUID) when known, and `gpumon.gpu.index` — comes once per GPU, on its `hw.status` points
//! (docs/otlp.md says why not on the resource). Per-point labels become `gpumon.xid`, `process.pid`, `gpumon.reason`.
//! The resource has `service.name` (default `gpumon`), `host.name` and whatever
//! `OTEL_RESOURCE_ATTRIBUTES` and [`OtlpConfig::resource_attributes`] add.
//!
//! # Instruments and timing (SDK pipeline)
//! Every metric is an *observable* instrument whose callback reads the latest snapshot, so a
//! series that disappears (a process exits, a GPU is lost) stops being reported. Counters
//! (energy, ECC, XID, PCIe replays) are observable Counters reporting NVML's absolute values:
//! monotonic Sums with cumulative temporality.
//!
//! By default the sink drives the exports itself: each snapshot is recorded and then
//! exported at once (`SdkMeterProvider::force_flush`, on the blocking pool), so the export
//! interval is the sampling interval. The SDK's `PeriodicReader` is kept with a very long
//! interval only as the export thread. With [`OtlpConfig::export_interval`] the SDK exports on
//! its own schedule instead, from the latest snapshot.
//!
//! **Timestamps.** (The direct pipeline stamps every point with the snapshot's `taken_at`.) The
//! OpenTelemetry metrics API has no way to attach an explicit timestamp to
//! a measurement: the SDK stamps each data point with the time of collection. Because the
//! collection runs right after the snapshot arrives, a gauge's `time_unix_nano` is the sample's
//! time plus the sampling duration and a few hundred microseconds (measured in the integration
//! tests); with `export_interval` it can be up to one interval later.
//!
//! # Failures
//! An unreachable collector makes `export` return [`SinkError::Transient`] with the exporter's
//! message, which the agent shows in the sink's status; nothing else is affected, and the next
//! snapshot is exported as soon as the collector answers again (no restart). At most one export
//! is in flight: while one hangs, later snapshots only update the values. `shutdown` gives the
//! SDK [`OtlpSink::shutdown_timeout`] (default 5 s) and then abandons it.
//!
//! # Embedding
//! A service that already has OpenTelemetry passes its own provider or meter, and GPU metrics
//! join its telemetry: [`OtlpSink::with_meter_provider`] (the sink flushes that provider after
//! every snapshot unless [`OtlpSink::flush_on_export`] is turned off, and never shuts it down)
//! or [`OtlpSink::from_meter`] (the provider's own reader decides when to export).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpumon_sinks::otlp::{OtlpConfig, OtlpSink, Protocol};
//!
//! let sink = OtlpSink::from_config(&OtlpConfig::new("http://127.0.0.1:4318", Protocol::HttpProtobuf))?;
//! # let _ = sink; Ok(()) }
//! ```

mod config;
mod direct;
mod encode;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use gpumon_core::{BuildError, Sink, SinkError, Snapshot};
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::Resource;
use tokio::task::JoinHandle;

pub use config::{Compression, OtlpConfig, Pipeline, Protocol, DEFAULT_SERVICE_NAME, DEFAULT_TIMEOUT};
pub use encode::mapping_markdown;

use encode::{AttributeCache, Encoded, Plan, Registered, Shared};

/// Interval of the SDK's own reader when the sink drives exports: long enough never to fire.
const DRIVEN_READER_INTERVAL: Duration = Duration::from_secs(365 * 24 * 3600);
/// Default for [`OtlpSink::shutdown_timeout`].
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Instrumentation scope name of every gpumon instrument.
pub const SCOPE_NAME: &str = "gpumon";

/// Sends snapshots to an OpenTelemetry pipeline. See the [module docs](self).
pub struct OtlpSink {
    name: String,
    plan: Plan,
    shared: Shared,
    cache: AttributeCache,
    _instruments: Vec<Registered>,
    /// The SDK pipeline's meter, for the instruments of series learnt later (a stage's own).
    meter: Option<Meter>,
    provider: Option<SdkMeterProvider>,
    /// Whether `shutdown` shuts the provider down (only a provider the sink built).
    owns_provider: bool,
    flush_on_export: bool,
    export_status: Option<Arc<ExportStatus>>,
    in_flight: Option<JoinHandle<OTelSdkResult>>,
    /// Longest one driven export may take before `export` returns `Timeout`.
    export_timeout: Duration,
    shutdown_timeout: Duration,
    endpoint: Option<(String, Protocol)>,
    shut_down: bool,
    /// The direct pipeline (no SDK provider): set by `from_config` unless `pipeline = "sdk"`.
    direct: Option<Box<direct::Direct>>,
    /// With the direct pipeline and [`OtlpConfig::export_interval`]: export at most this often.
    direct_interval: Option<Duration>,
    last_direct: Option<tokio::time::Instant>,
    /// The latest snapshot not exported yet (direct pipeline with an export interval).
    pending: Option<Arc<Snapshot>>,
}

impl std::fmt::Debug for OtlpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpSink")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("instruments", &self.plan.instruments.len())
            .field("owns_provider", &self.owns_provider)
            .field("flush_on_export", &self.flush_on_export)
            .field("pipeline", &self.pipeline())
            .field("shut_down", &self.shut_down)
            .finish_non_exhaustive()
    }
}

impl OtlpSink {
    /// Builds a sink with its own `SdkMeterProvider` and OTLP exporter from `config`, applying
    /// the standard `OTEL_*` environment variables to the settings `config` leaves unset.
    ///
    /// OTLP/gRPC must be built inside a tokio runtime (the gRPC channel lives on it).
    ///
    /// # Errors
    /// [`BuildError::InvalidEndpoint`] for an endpoint that is not an `http://` URL (or has a path,
    /// for gRPC); [`BuildError::InvalidConfig`] for other bad values, for `grpc` in a build without
    /// the `otlp-grpc` feature, or for gRPC outside a tokio runtime; [`BuildError::Io`] when the
    /// exporter cannot be created.
    pub fn from_config(config: &OtlpConfig) -> Result<OtlpSink, BuildError> {
        let resolved = config::resolve(config, &config::process_env)?;
        let mut sink = match resolved.pipeline {
            Pipeline::Sdk => OtlpSink::sdk_from_resolved(&resolved)?,
            Pipeline::Direct => {
                let plan = Plan::new();
                let direct = direct::Direct::new(&plan, &resolved)?;
                let mut sink = OtlpSink::with_plan(plan, Vec::new());
                sink.direct = Some(Box::new(direct));
                sink.direct_interval = resolved.export_interval;
                sink
            }
        };
        // One export: the exporter's own timeout plus time to collect and hand over.
        sink.export_timeout = resolved.timeout + Duration::from_secs(1);
        sink.endpoint = Some((resolved.endpoint, resolved.protocol));
        Ok(sink)
    }

    fn sdk_from_resolved(resolved: &config::Resolved) -> Result<OtlpSink, BuildError> {
        let status = Arc::new(ExportStatus::default());
        let exporter = build_exporter(resolved)?;
        let interval = resolved.export_interval.unwrap_or(DRIVEN_READER_INTERVAL);
        let reader = PeriodicReader::builder(Recording { inner: exporter, status: status.clone() })
            .with_interval(interval)
            .build();
        let resource = Resource::builder_empty()
            .with_attributes(resolved.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())))
            .build();
        let provider = SdkMeterProvider::builder().with_reader(reader).with_resource(resource).build();
        let mut sink = OtlpSink::with_meter_provider(provider);
        sink.owns_provider = true;
        sink.flush_on_export = resolved.export_interval.is_none();
        sink.export_status = Some(status);
        Ok(sink)
    }

    /// Uses an embedder's provider: the instruments are created on a meter of it (scope
    /// `gpumon`), and the sink flushes it after every snapshot (see [`OtlpSink::flush_on_export`]).
    /// `shutdown` does not shut the provider down: its owner does.
    pub fn with_meter_provider(provider: SdkMeterProvider) -> OtlpSink {
        let meter = provider.meter_with_scope(scope());
        let mut sink = OtlpSink::from_meter(meter);
        sink.provider = Some(provider);
        sink.flush_on_export = true;
        sink
    }

    /// Creates the instruments on `meter` and only records: the meter's provider exports on its
    /// own schedule, from the latest snapshot. `flush` and `shutdown` export nothing.
    pub fn from_meter(meter: Meter) -> OtlpSink {
        let plan = Plan::new();
        let shared: Shared = Arc::new(ArcSwap::from_pointee(Encoded::default()));
        let instruments = plan.register(0, &meter, &shared);
        let mut sink = OtlpSink::with_plan(plan, instruments);
        sink.shared = shared;
        sink.meter = Some(meter);
        sink
    }

    fn with_plan(plan: Plan, instruments: Vec<Registered>) -> OtlpSink {
        OtlpSink {
            name: "otlp".to_owned(),
            plan,
            shared: Arc::new(ArcSwap::from_pointee(Encoded::default())),
            cache: AttributeCache::default(),
            _instruments: instruments,
            meter: None,
            provider: None,
            owns_provider: false,
            flush_on_export: false,
            export_status: None,
            in_flight: None,
            export_timeout: DEFAULT_TIMEOUT + Duration::from_secs(1),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            endpoint: None,
            shut_down: false,
            direct: None,
            direct_interval: None,
            last_direct: None,
            pending: None,
        }
    }

    /// The pipeline this sink exports through: [`Pipeline::Direct`] for a sink built by
    /// [`OtlpSink::from_config`] (unless the config says `sdk`), [`Pipeline::Sdk`] otherwise.
    pub fn pipeline(&self) -> Pipeline {
        if self.direct.is_some() {
            Pipeline::Direct
        } else {
            Pipeline::Sdk
        }
    }

    /// Whether each snapshot is exported at once (`force_flush` after recording). On by default
    /// when the sink has a provider, unless [`OtlpConfig::export_interval`] is set.
    #[must_use]
    pub fn flush_on_export(mut self, on: bool) -> Self {
        self.flush_on_export = on && self.provider.is_some();
        self
    }

    /// Longest `shutdown` waits for the SDK (final export, exporter shutdown) before abandoning
    /// it. Default 5 s.
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Longest one driven export may take before `export` reports a timeout (the export goes on
    /// in the background; the next snapshot does not start another until it ends). Default: the
    /// exporter timeout plus 1 s.
    #[must_use]
    pub fn export_timeout(mut self, timeout: Duration) -> Self {
        self.export_timeout = timeout;
        self
    }

    /// A different sink name (default `"otlp"`), to run two OTLP sinks in one agent.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The provider the sink exports through, if it has one.
    pub fn meter_provider(&self) -> Option<&SdkMeterProvider> {
        self.provider.as_ref()
    }

    /// The resolved endpoint and protocol, for a sink built by [`OtlpSink::from_config`].
    pub fn endpoint(&self) -> Option<(&str, Protocol)> {
        self.endpoint.as_ref().map(|(e, p)| (e.as_str(), *p))
    }

    /// Data points the latest snapshot produced.
    pub fn points(&self) -> usize {
        match &self.direct {
            Some(d) => d.points(),
            None => self.shared.load().points,
        }
    }

    /// The protobuf `ExportMetricsServiceRequest` the direct pipeline sends for `snapshot`,
    /// built and encoded without sending it (benchmarks, debugging); `None` for an SDK sink.
    /// The series state is updated as by an export.
    #[doc(hidden)]
    pub fn encode_request(&mut self, snapshot: &Snapshot) -> Option<&[u8]> {
        self.learn(snapshot);
        let OtlpSink { direct, plan, cache, .. } = self;
        direct.as_mut().map(|d| d.encode(plan, cache, snapshot))
    }

    /// Sets up an instrument for every series of `snapshot` outside the catalogue not seen
    /// before (a stage of the embedder's), in whichever pipeline the sink runs.
    fn learn(&mut self, snapshot: &Snapshot) {
        let before = self.plan.learn(snapshot);
        if before == self.plan.instruments.len() {
            return;
        }
        if let Some(direct) = &mut self.direct {
            direct.learn(&self.plan);
        }
        if let Some(meter) = &self.meter {
            let more = self.plan.register(before, meter, &self.shared);
            self._instruments.extend(more);
        }
    }

    /// One export through the direct pipeline, under `limit`.
    async fn export_direct(&mut self, snapshot: &Snapshot, limit: Duration) -> Result<(), SinkError> {
        let OtlpSink { direct, plan, cache, endpoint, last_direct, .. } = self;
        let Some(direct) = direct else { return Ok(()) };
        *last_direct = Some(tokio::time::Instant::now());
        let endpoint: &Option<(String, Protocol)> = endpoint;
        let what = || match endpoint {
            Some((e, p)) => format!("OTLP {p} export to {e}"),
            None => "OTLP export".to_owned(),
        };
        match tokio::time::timeout(limit, direct.export(plan, cache, snapshot, &what)).await {
            Ok(result) => result,
            Err(_) => Err(SinkError::Timeout(limit)),
        }
    }

    fn describe_endpoint(&self) -> String {
        match &self.endpoint {
            Some((e, p)) => format!("OTLP {p} export to {e}"),
            None => "OTLP export".to_owned(),
        }
    }

    /// `force_flush` on the blocking pool, at most one at a time, under `export_timeout`.
    async fn drive_export(&mut self) -> Result<(), SinkError> {
        let Some(provider) = self.provider.clone() else { return Ok(()) };
        if let Some(previous) = &self.in_flight {
            if !previous.is_finished() {
                return Err(SinkError::transient(format!(
                    "{} still in progress (started {:?}+ ago); values updated, export skipped",
                    self.describe_endpoint(),
                    self.export_timeout
                )));
            }
            self.in_flight = None;
        }
        let mut task = tokio::task::spawn_blocking(move || provider.force_flush());
        match tokio::time::timeout(self.export_timeout, &mut task).await {
            Err(_) => {
                self.in_flight = Some(task);
                Err(SinkError::Timeout(self.export_timeout))
            }
            Ok(Err(join)) => Err(SinkError::Panicked(join.to_string())),
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(self.export_error(&e.to_string())),
        }
    }

    fn export_error(&self, fallback: &str) -> SinkError {
        let detail = self.export_status.as_ref().and_then(|s| s.last_error()).unwrap_or_else(|| fallback.to_owned());
        SinkError::transient(format!("{} failed: {detail}", self.describe_endpoint()))
    }

    async fn wait_in_flight(&mut self, limit: Duration) {
        if let Some(mut task) = self.in_flight.take() {
            let _ = tokio::time::timeout(limit, &mut task).await;
        }
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE_NAME).with_version(env!("CARGO_PKG_VERSION")).build()
}

#[async_trait::async_trait]
impl Sink for OtlpSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        self.learn(&snapshot);
        if self.direct.is_some() {
            if let (Some(interval), Some(last)) = (self.direct_interval, self.last_direct) {
                if last.elapsed() < interval {
                    self.pending = Some(snapshot);
                    return Ok(());
                }
            }
            self.pending = None;
            return self.export_direct(&snapshot, self.export_timeout).await;
        }
        let encoded = self.plan.encode(&snapshot, &mut self.cache);
        self.shared.store(Arc::new(encoded));
        if self.flush_on_export {
            self.drive_export().await
        } else if let Some(error) = self.export_status.as_ref().and_then(|s| s.last_error()) {
            // The SDK exports on its own schedule: report how its latest export went.
            Err(SinkError::transient(format!("{} failed: {error}", self.describe_endpoint())))
        } else {
            Ok(())
        }
    }

    async fn healthcheck(&mut self) -> Result<(), SinkError> {
        let Some((endpoint, _)) = &self.endpoint else { return Ok(()) };
        let url = reqwest::Url::parse(endpoint).map_err(|e| SinkError::permanent(e.to_string()))?;
        let host = url.host_str().unwrap_or("localhost").trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = url.port_or_known_default().unwrap_or(4318);
        let limit = self.export_timeout.min(Duration::from_secs(5));
        match tokio::time::timeout(limit, tokio::net::TcpStream::connect((host.as_str(), port))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(SinkError::transient(format!("cannot connect to OTLP endpoint {endpoint}: {e}"))),
            Err(_) => Err(SinkError::Timeout(limit)),
        }
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Err(SinkError::AlreadyShutdown);
        }
        if self.direct.is_some() {
            // Every snapshot was exported when it arrived, unless an export interval held it.
            return match self.pending.take() {
                Some(snapshot) => self.export_direct(&snapshot, self.export_timeout).await,
                None => Ok(()),
            };
        }
        if self.flush_on_export {
            // Every snapshot was exported when it arrived; wait for a straggler.
            let limit = self.export_timeout;
            self.wait_in_flight(limit).await;
            return Ok(());
        }
        // The SDK exports on its own schedule: export the latest values now.
        self.drive_export().await
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        if self.direct.is_some() {
            // Nothing runs in the background; only a held snapshot is left to send.
            return match self.pending.take() {
                Some(snapshot) => self.export_direct(&snapshot, self.shutdown_timeout).await,
                None => Ok(()),
            };
        }
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        self.wait_in_flight(self.shutdown_timeout).await;
        let driven = self.flush_on_export;
        if driven {
            // Everything was exported already: let the SDK's final collection find nothing
            // rather than send the last snapshot twice.
            self.shared.store(Arc::new(Encoded::default()));
        }
        let result = match (&self.provider, self.owns_provider) {
            (Some(provider), true) => {
                let provider = provider.clone();
                let timeout = self.shutdown_timeout;
                let mut task = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout));
                match tokio::time::timeout_at(deadline, &mut task).await {
                    Err(_) => Err(SinkError::Timeout(self.shutdown_timeout)),
                    Ok(Err(join)) => Err(SinkError::Panicked(join.to_string())),
                    Ok(Ok(Ok(()))) => Ok(()),
                    Ok(Ok(Err(e))) => Err(self.export_error(&e.to_string())),
                }
            }
            _ => Ok(()),
        };
        // An embedder's provider lives on: its callbacks must not report stale GPUs.
        self.shared.store(Arc::new(Encoded::default()));
        result
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        // Dropping the last handle of an SDK provider shuts it down, which blocks (up to 5 s with
        // an unreachable collector). Never do that on an async worker thread.
        if self.owns_provider && !self.shut_down {
            if let Some(provider) = self.provider.take() {
                let _ = std::thread::Builder::new().name("gpumon-otlp-drop".into()).spawn(move || drop(provider));
            }
        }
    }
}

/// The outcome of the latest export, as the exporter saw it (the SDK's `force_flush` only says
/// "Failed to flush").
#[derive(Debug, Default)]
struct ExportStatus {
    last_error: Mutex<Option<String>>,
}

impl ExportStatus {
    fn record(&self, result: &OTelSdkResult) {
        let mut last = self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = result.as_ref().err().map(ToString::to_string);
    }

    fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Wraps the OTLP exporter to keep its error messages.
#[derive(Debug)]
struct Recording<E> {
    inner: E,
    status: Arc<ExportStatus>,
}

impl<E: PushMetricExporter> PushMetricExporter for Recording<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        self.status.record(&result);
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

fn build_exporter(r: &config::Resolved) -> Result<opentelemetry_otlp::MetricExporter, BuildError> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};

    let compression = match r.compression {
        Compression::Gzip => Some(opentelemetry_otlp::Compression::Gzip),
        Compression::None => None,
    };
    let io = |source: opentelemetry_otlp::ExporterBuildError| BuildError::Io {
        what: format!("building the OTLP {} exporter for {}", r.protocol, r.endpoint),
        source: Box::new(source),
    };
    // The exporter's own reqwest client needs the process-wide rustls provider.
    #[cfg(feature = "tls")]
    crate::tls::install_crypto_provider();
    match r.protocol {
        config::Protocol::HttpProtobuf => {
            let mut b = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(r.endpoint.clone())
                .with_timeout(r.timeout)
                .with_headers(r.headers.iter().map(|(k, v)| (k.clone(), v.expose().to_owned())).collect());
            if let Some(c) = compression {
                b = b.with_compression(c);
            }
            #[cfg(feature = "tls")]
            if r.endpoint.starts_with("https://") {
                b = b.with_http_client(sdk_https_client(r)?);
            }
            b.with_temporality(Temporality::Cumulative).build().map_err(io)
        }
        config::Protocol::Grpc => build_grpc(r, compression, io),
    }
}

/// The SDK pipeline's HTTP client for an https endpoint: the exporter calls it from its own
/// thread, so it is a blocking client, built (like the exporter's default one) on a thread of
/// its own because a blocking client must not be created or dropped inside the async runtime.
#[cfg(feature = "tls")]
fn sdk_https_client(r: &config::Resolved) -> Result<reqwest::blocking::Client, BuildError> {
    let tls = crate::tls::client_config(&r.tls, "otlp.tls", &r.endpoint, &[b"http/1.1"])?;
    let timeout = r.timeout;
    let what = || format!("building the OTLP HTTP client for {}", r.endpoint);
    std::thread::spawn(move || reqwest::blocking::Client::builder().timeout(timeout).use_preconfigured_tls(tls).build())
        .join()
        .map_err(|_| BuildError::Io { what: what(), source: "the thread building it panicked".into() })?
        .map_err(|e| BuildError::Io { what: what(), source: Box::new(e) })
}

#[cfg(feature = "otlp-grpc")]
fn build_grpc(
    r: &config::Resolved,
    compression: Option<opentelemetry_otlp::Compression>,
    io: impl Fn(opentelemetry_otlp::ExporterBuildError) -> BuildError,
) -> Result<opentelemetry_otlp::MetricExporter, BuildError> {
    use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};

    if tokio::runtime::Handle::try_current().is_err() {
        return Err(BuildError::invalid(
            "otlp.protocol",
            "an OTLP/gRPC sink must be built inside a tokio runtime (its channel runs on it)",
        ));
    }
    // The same tonic (0.14) as opentelemetry-otlp's, so its `MetadataMap` is the one the
    // exporter takes; built fallibly, as for the direct pipeline (never `insert(&str, ..)`, which
    // panics on a `-bin` key).
    let metadata = grpc_metadata(&r.headers)?;
    let mut b = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_protocol(opentelemetry_otlp::Protocol::Grpc)
        .with_endpoint(r.endpoint.clone())
        .with_timeout(r.timeout)
        .with_metadata(metadata);
    // https: our channel (TLS by our connector, the same rustls settings as every client).
    if r.endpoint.starts_with("https://") {
        b = b.with_channel(crate::tls::grpc_channel(&r.tls, "otlp.tls", &r.endpoint, r.timeout)?);
    }
    if let Some(c) = compression {
        b = b.with_compression(c);
    }
    b.with_temporality(Temporality::Cumulative).build().map_err(io)
}

/// The configured headers as gRPC metadata, for both pipelines: an error naming the header for
/// a key or value gRPC cannot carry as ASCII metadata (`config::resolve` already refuses `-bin`).
#[cfg(feature = "otlp-grpc")]
pub(crate) fn grpc_metadata(
    headers: &std::collections::BTreeMap<String, crate::Secret>,
) -> Result<tonic::metadata::MetadataMap, BuildError> {
    use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
    let mut metadata = MetadataMap::new();
    for (k, v) in headers {
        let key = MetadataKey::from_bytes(k.as_bytes())
            .map_err(|e| BuildError::invalid("otlp.headers", format!("`{k}`: {e}")))?;
        let value = MetadataValue::try_from(v.expose())
            .map_err(|e| BuildError::invalid("otlp.headers", format!("value of `{k}`: {e}")))?;
        metadata.insert(key, value);
    }
    Ok(metadata)
}

#[cfg(not(feature = "otlp-grpc"))]
fn build_grpc(
    r: &config::Resolved,
    _compression: Option<opentelemetry_otlp::Compression>,
    _io: impl Fn(opentelemetry_otlp::ExporterBuildError) -> BuildError,
) -> Result<opentelemetry_otlp::MetricExporter, BuildError> {
    Err(grpc_missing(r))
}

/// gRPC asked for in a build without it (either pipeline).
#[cfg(not(feature = "otlp-grpc"))]
pub(crate) fn grpc_missing(r: &config::Resolved) -> BuildError {
    BuildError::invalid(
        "otlp.protocol",
        format!(
            "OTLP/gRPC ({}) needs the `otlp-grpc` cargo feature of gpumon-sinks, and this build has only `otlp` \
             (OTLP/HTTP); rebuild with `--features otlp-grpc` or set protocol = \"http\"",
            r.endpoint
        ),
    )
}

#[cfg(test)]
mod tests;

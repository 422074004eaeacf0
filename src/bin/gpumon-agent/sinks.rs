//! Builds the configured sinks from the config file and flags (flags win).

use gpumon::core::trace::RecordSink;
use gpumon::core::Sink;
use gpumon::sinks::stdout::StdoutSink;

use crate::app::{Cli, ConfigError};
use gpumon::assembly::config::AgentConfig;

/// The stdout sink's name: the one sink whose data stays on this machine's terminal.
pub const STDOUT: &str = "stdout";
/// The record sink's name: its data stays in a local file, a trace that says which backend
/// produced it (a mock fallback's trace says `mock`).
pub const RECORD: &str = "record";

/// What the sinks must say about the data beyond each snapshot: most sinks read both from the
/// snapshot itself; OTLP puts them on its resource and the Pushgateway the host in its group's
/// `instance`, both fixed when the sink is built.
#[derive(Clone, Copy, Debug)]
pub struct Marks<'a> {
    /// `backend=<mark>` on data not read from a GPU just now: `mock` (`--backend mock`,
    /// simulated) or `replay` (`--backend replay`, a recorded trace).
    pub backend: Option<&'static str>,
    /// The host name override (`--host`).
    pub host: Option<&'a str>,
}

#[allow(unused_macros)]
macro_rules! feature_missing {
    ($what:literal, $feature:literal) => {
        return Err(ConfigError(format!(
            "{} is configured, but this agent was built without the `{}` feature (cargo run --example agent --features {})",
            $what, $feature, $feature
        )))
    };
}

/// Every sink the configuration asks for; stdout when nothing else is.
pub async fn build(cli: &Cli, file: &AgentConfig, marks: Marks<'_>) -> Result<Vec<Box<dyn Sink>>, ConfigError> {
    #[cfg(not(any(feature = "otlp", feature = "pushgateway")))]
    let _ = marks; // only the OTLP resource and the Pushgateway group need them
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();

    // --- Prometheus scrape endpoint ------------------------------------------------------------
    let wants_prometheus = cli.prometheus_listen.is_some() || file.prometheus.is_some();
    if wants_prometheus {
        #[cfg(feature = "prometheus")]
        {
            use gpumon::sinks::prometheus::{Naming, PrometheusConfig, PrometheusSink};
            let mut cfg: PrometheusConfig = file.prometheus.clone().unwrap_or_default();
            if let Some(addr) = &cli.prometheus_listen {
                cfg.listen = Some(addr.parse().map_err(|e| {
                    ConfigError(format!("--prometheus-listen: `{addr}` is not an address like 127.0.0.1:9400 ({e})"))
                })?);
            }
            if let Some(n) = &cli.prometheus_naming {
                cfg.naming = n.parse::<Naming>().map_err(|e| ConfigError(format!("--prometheus-naming: {e}")))?;
            }
            let sink = PrometheusSink::from_config(&cfg).map_err(|e| ConfigError(format!("prometheus: {e}")))?;
            sinks.push(Box::new(sink));
        }
        #[cfg(not(feature = "prometheus"))]
        feature_missing!("a Prometheus endpoint", "prometheus");
    }

    // --- Pushgateway ---------------------------------------------------------------------------
    if cli.pushgateway_url.is_some() || file.pushgateway.is_some() {
        #[cfg(feature = "pushgateway")]
        {
            use gpumon::sinks::prometheus::{PushgatewayConfig, PushgatewaySink};
            let mut cfg: PushgatewayConfig = file.pushgateway.clone().unwrap_or_default();
            if let Some(url) = &cli.pushgateway_url {
                cfg.url = url.clone();
            }
            if let Some(job) = &cli.pushgateway_job {
                cfg.job = job.clone();
            }
            if let Some(ca) = &cli.pushgateway_ca_file {
                cfg.tls.ca_file = Some(ca.clone());
            }
            // The group's `instance` (this host's name unless configured) is the host label of
            // everything pushed: `--host` sets it like every other sink's.
            if let Some(host) = marks.host {
                cfg.grouping.entry("instance".to_owned()).or_insert_with(|| host.to_owned());
            }
            let sink = PushgatewaySink::from_config(&cfg).map_err(|e| ConfigError(format!("pushgateway: {e}")))?;
            sinks.push(Box::new(sink));
        }
        #[cfg(not(feature = "pushgateway"))]
        feature_missing!("a Pushgateway", "pushgateway");
    }

    // --- InfluxDB ------------------------------------------------------------------------------
    if cli.influx_url.is_some() || file.influxdb.is_some() {
        #[cfg(feature = "influxdb")]
        {
            use gpumon::sinks::influxdb::{InfluxConfig, InfluxSink};
            let mut cfg: InfluxConfig = file.influxdb.clone().unwrap_or_default();
            macro_rules! set {
                ($flag:expr, $field:ident) => {
                    if let Some(v) = &$flag {
                        cfg.$field = Some(v.clone());
                    }
                };
            }
            if let Some(url) = &cli.influx_url {
                cfg.url = url.clone();
            }
            set!(cli.influx_db, db);
            set!(cli.influx_user, username);
            set!(cli.influx_password, password);
            set!(cli.influx_org, org);
            set!(cli.influx_bucket, bucket);
            set!(cli.influx_token, token);
            if let Some(ca) = &cli.influx_ca_file {
                cfg.tls.ca_file = Some(ca.clone());
            }
            let sink = InfluxSink::from_config(&cfg).map_err(|e| ConfigError(format!("influxdb: {e}")))?;
            sinks.push(Box::new(sink));
        }
        #[cfg(not(feature = "influxdb"))]
        feature_missing!("InfluxDB", "influxdb");
    }

    // --- Prometheus remote write ---------------------------------------------------------------
    if cli.remote_write_url.is_some() || file.remote_write.is_some() {
        #[cfg(feature = "remote-write")]
        {
            use gpumon::sinks::prometheus::Naming;
            use gpumon::sinks::remote_write::{RemoteWriteConfig, RemoteWriteSink};
            let mut cfg: RemoteWriteConfig = file.remote_write.clone().unwrap_or_default();
            if let Some(url) = &cli.remote_write_url {
                cfg.url = url.clone();
            }
            if let Some(n) = &cli.remote_write_naming {
                cfg.naming = n.parse::<Naming>().map_err(|e| ConfigError(format!("--remote-write-naming: {e}")))?;
            }
            if let Some(token) = &cli.remote_write_token {
                cfg.bearer_token = Some(token.clone());
            }
            if let Some(ca) = &cli.remote_write_ca_file {
                cfg.tls.ca_file = Some(ca.clone());
            }
            let sink = RemoteWriteSink::from_config(&cfg).map_err(|e| ConfigError(format!("remote_write: {e}")))?;
            sinks.push(Box::new(sink));
        }
        #[cfg(not(feature = "remote-write"))]
        feature_missing!("Prometheus remote write", "remote-write");
    }

    // --- OTLP ----------------------------------------------------------------------------------
    if cli.otlp_endpoint.is_some() || cli.otlp_protocol.is_some() || file.otlp.is_some() {
        #[cfg(feature = "otlp")]
        {
            use gpumon::sinks::otlp::{OtlpConfig, OtlpSink, Protocol};
            let mut cfg: OtlpConfig = file.otlp.clone().unwrap_or_default();
            if let Some(e) = &cli.otlp_endpoint {
                cfg.endpoint = Some(e.clone());
            }
            if let Some(p) = &cli.otlp_protocol {
                cfg.protocol = Some(p.parse::<Protocol>().map_err(|e| ConfigError(format!("--otlp-protocol: {e}")))?);
            }
            // Both pipelines take the resource from the config (an explicit key there wins).
            if let Some(mark) = marks.backend {
                cfg.resource_attributes.entry("gpumon.backend".to_owned()).or_insert_with(|| mark.to_owned());
            }
            if let Some(host) = marks.host {
                cfg.resource_attributes.entry("host.name".to_owned()).or_insert_with(|| host.to_owned());
            }
            if let Some(ca) = &cli.otlp_ca_file {
                cfg.tls.ca_file = Some(ca.clone());
            }
            let sink = OtlpSink::from_config(&cfg).map_err(|e| ConfigError(format!("otlp: {e}")))?;
            sinks.push(Box::new(sink));
        }
        #[cfg(not(feature = "otlp"))]
        feature_missing!("OTLP export", "otlp");
    }

    // --- record: a trace of every snapshot (gpumon_core::trace, docs/replay.md) -----------------
    if let Some(path) = cli.record.as_ref().or(file.record.file.as_ref()) {
        let sink = RecordSink::create(path).map_err(|e| {
            ConfigError(format!("--record / record.file: cannot create the trace {}: {e}", path.display()))
        })?;
        sinks.push(Box::new(sink));
    }

    // --- live web view (web.rs) ---------------------------------------------------------------
    sinks.extend(crate::web::build(cli, file)?);

    // --- stdout --------------------------------------------------------------------------------
    let format = cli.stdout_format.unwrap_or_else(|| file.stdout_format());
    // The run report is output of its own: with --report alone, no per-tick lines.
    let stdout_default = sinks.is_empty() && !cli.diagnose.report_requested();
    let stdout_wanted = cli.stdout || cli.stdout_format.is_some() || file.stdout.enabled.unwrap_or(stdout_default);
    if stdout_wanted {
        sinks.push(Box::new(StdoutSink::new(format)));
    }
    Ok(sinks)
}

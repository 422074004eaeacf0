//! `gpumon-agent fleet --prometheus URL [--since 7d] [--by namespace|job|owner|host] [--json]
//! [--compare-with previous|DURATION]`: where a fleet's GPU-hours went, read from the TSDB the
//! agents remote-write or are scraped into (Prometheus, VictoriaMetrics, Thanos, Mimir: any
//! Prometheus query API), from the accounts counters (`gpumon_account_*`, docs/fleet.md).
//!
//! It prints the fleet's GPU-hours observed, allocated, idle while allocated and lost per cause
//! over the period, then the groups that held GPUs idle longest, each with its main cause.
//! `--compare-with previous` adds the period before (or the same length ending DURATION
//! earlier). The HTTP client, TLS and auth are the sinks' ([`crate::sinks::prometheus_query`]).
//!
//! Exit codes: 0 reported, 1 the API could not be queried or holds no gpumon accounts (one line
//! saying which), 2 bad flags.

mod error;
mod figures;
mod render;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::Parser;

use crate::sinks::prometheus_query::{QueryClient, QueryConfig};
use crate::sinks::tls::TlsConfig;
use crate::sinks::Secret;
pub use error::FleetError;
use figures::GroupBy;

/// `gpumon-agent fleet`.
#[derive(Debug, Parser)]
#[command(
    name = "gpumon-agent fleet",
    about = "Where the fleet's GPU-hours went: observed, allocated, idle while allocated, lost per cause, and the groups that held GPUs idle, from a Prometheus-compatible TSDB",
    long_about = None
)]
pub struct FleetCli {
    /// The query API's base URL: Prometheus http://host:9090, VictoriaMetrics http://host:8428,
    /// Mimir http://host/prometheus, Thanos Query http://host:10902.
    #[arg(long, value_name = "URL")]
    pub prometheus: String,
    /// The period, ending now (e.g. 7d, 24h, 90m).
    #[arg(long, default_value = "7d", value_parser = crate::sinks::duration::parse_duration, value_name = "DURATION")]
    pub since: Duration,
    /// Group by: namespace, job (the training run), owner (namespace, pod, container, user) or
    /// host.
    #[arg(long, value_enum, default_value = "namespace")]
    pub by: GroupBy,
    /// How many groups to list, those that held GPUs idle longest first.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Also report an earlier period of the same length: `previous` (the one just before) or a
    /// DURATION (the one ending that long before now, e.g. 28d).
    #[arg(long, num_args = 0..=1, default_missing_value = "previous", value_name = "previous|DURATION")]
    pub compare_with: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// HTTP Basic user.
    #[arg(long, value_name = "USER")]
    pub prometheus_user: Option<String>,
    /// HTTP Basic password (or GPUMON_PROMETHEUS_PASSWORD).
    #[arg(long, env = "GPUMON_PROMETHEUS_PASSWORD", hide_env_values = true, value_name = "PASSWORD")]
    pub prometheus_password: Option<String>,
    /// Bearer token (or GPUMON_PROMETHEUS_TOKEN).
    #[arg(long, env = "GPUMON_PROMETHEUS_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub prometheus_token: Option<String>,
    /// Extra request header, NAME=VALUE (repeatable), e.g. X-Scope-OrgID=team-a for Mimir.
    #[arg(long = "prometheus-header", value_name = "NAME=VALUE")]
    pub prometheus_headers: Vec<String>,
    /// PEM CA certificate(s) to trust for an https:// URL (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with --prometheus-client-key.
    #[arg(long, value_name = "FILE", requires = "prometheus_client_key")]
    pub prometheus_client_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, value_name = "FILE", requires = "prometheus_client_cert")]
    pub prometheus_client_key: Option<PathBuf>,
    /// Deadline of one query.
    #[arg(long, default_value = "60s", value_parser = crate::sinks::duration::parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

impl FleetCli {
    fn query_config(&self) -> Result<QueryConfig, FleetError> {
        let mut config = QueryConfig::new(self.prometheus.clone());
        config.username.clone_from(&self.prometheus_user);
        config.password = self.prometheus_password.as_deref().map(Secret::from);
        config.bearer_token = self.prometheus_token.as_deref().map(Secret::from);
        for header in &self.prometheus_headers {
            let Some((name, value)) = header.split_once('=') else {
                return Err(FleetError::Flags(format!("--prometheus-header {header}: not NAME=VALUE")));
            };
            config.headers.insert(name.trim().to_owned(), Secret::from(value));
        }
        let mut tls = TlsConfig::default();
        tls.ca_file.clone_from(&self.prometheus_ca_file);
        tls.client_cert_file.clone_from(&self.prometheus_client_cert);
        tls.client_key_file.clone_from(&self.prometheus_client_key);
        config.tls = tls;
        config.timeout = self.timeout;
        Ok(config)
    }

    /// How much earlier the compared period ends.
    fn compare_offset(&self) -> Result<Option<Duration>, FleetError> {
        match self.compare_with.as_deref() {
            None => Ok(None),
            Some("previous") => Ok(Some(self.since)),
            Some(d) => crate::sinks::duration::parse_duration(d)
                .map(Some)
                .map_err(|e| FleetError::Flags(format!("--compare-with {d}: neither `previous` nor a duration ({e})"))),
        }
    }
}

/// Parses `gpumon-agent fleet …` (`args` without the program name and `fleet`) and runs it.
pub fn main(args: Vec<OsString>) -> u8 {
    let cli = match crate::cli::common::parse::<FleetCli>(
        std::iter::once(OsString::from("gpumon-agent fleet")).chain(args),
    ) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let (config, offset) = match cli.query_config().and_then(|c| Ok((c, cli.compare_offset()?))) {
        Ok(ok) => ok,
        Err(e) => {
            eprintln!("gpumon: fleet: {e}");
            return 2;
        }
    };
    let client = match QueryClient::new(&config) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("gpumon: fleet: --prometheus: {e}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("gpumon: fleet: cannot start the runtime: {e}");
            return 1;
        }
    };
    let now = SystemTime::now();
    let report = runtime.block_on(figures::fleet_report(&client, cli.by, cli.since, cli.top, now, offset));
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("gpumon: fleet: {e}");
            return 1;
        }
    };
    let text = if cli.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => json + "\n",
            Err(e) => {
                eprintln!("gpumon: fleet: cannot encode the report: {e}");
                return 1;
            }
        }
    } else {
        report.to_string()
    };
    let _ = crate::cli::common::print_stdout(&text);
    0
}

//! The sinks' flags, set onto their config sections (flags win over the file); the library builds
//! the sinks from the sections (`crate::assembly`). A flag that names a sink's destination
//! (`--prometheus-listen`, `--pushgateway-url`, `--influx-url`, `--remote-write-url`,
//! `--otlp-endpoint`/`--otlp-protocol`, `--web-listen`) configures that sink; the others refine a
//! configured one. In a build without a sink's feature, its flag configures an empty section, so
//! that the library refuses it clearly ("built without the `x` feature").

use crate::assembly::config::AgentConfig;

use std::path::PathBuf;

use crate::cli::common::ConfigError;

/// The sinks' flags (flattened into the agent's command line; the web view's are in `web.rs`).
#[derive(Debug, clap::Args)]
pub struct SinkArgs {
    /// Stdout format.
    #[arg(long, value_name = "human|json")]
    pub stdout_format: Option<crate::sinks::stdout::StdoutFormat>,
    /// Also print to stdout when other sinks are configured.
    #[arg(long)]
    pub stdout: bool,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR")]
    pub prometheus_listen: Option<String>,
    /// Prometheus metric names: native (gpumon_*) or dcgm (dcgm-exporter's DCGM_FI_*).
    #[arg(long, value_name = "native|dcgm")]
    pub prometheus_naming: Option<String>,
    /// Push to this Prometheus Pushgateway URL every interval.
    #[arg(long, value_name = "URL")]
    pub pushgateway_url: Option<String>,
    /// Pushgateway job label.
    #[arg(long, value_name = "JOB")]
    pub pushgateway_job: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// Pushgateway (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub pushgateway_ca_file: Option<PathBuf>,
    /// Write to InfluxDB at this URL (v1 with --influx-db, v2 with --influx-org/--influx-bucket).
    #[arg(long, value_name = "URL")]
    pub influx_url: Option<String>,
    /// InfluxDB 1.x database.
    #[arg(long, value_name = "DB")]
    pub influx_db: Option<String>,
    /// InfluxDB 1.x user.
    #[arg(long, value_name = "USER")]
    pub influx_user: Option<String>,
    /// InfluxDB 1.x password (or GPUMON_INFLUX_PASSWORD).
    #[arg(long, env = "GPUMON_INFLUX_PASSWORD", hide_env_values = true, value_name = "PASSWORD")]
    pub influx_password: Option<String>,
    /// InfluxDB 2.x organisation.
    #[arg(long, value_name = "ORG")]
    pub influx_org: Option<String>,
    /// InfluxDB 2.x bucket.
    #[arg(long, value_name = "BUCKET")]
    pub influx_bucket: Option<String>,
    /// InfluxDB 2.x token (or GPUMON_INFLUX_TOKEN).
    #[arg(long, env = "GPUMON_INFLUX_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub influx_token: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// InfluxDB (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub influx_ca_file: Option<PathBuf>,
    /// Prometheus remote write to this URL (e.g. http://127.0.0.1:9090/api/v1/write; Mimir
    /// …/api/v1/push, VictoriaMetrics …/api/v1/write).
    #[arg(long, value_name = "URL")]
    pub remote_write_url: Option<String>,
    /// Remote-write metric and label names (default native).
    #[arg(long, value_name = "native|dcgm")]
    pub remote_write_naming: Option<String>,
    /// Remote-write bearer token (or GPUMON_REMOTE_WRITE_TOKEN).
    #[arg(long, env = "GPUMON_REMOTE_WRITE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub remote_write_token: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// remote-write URL (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub remote_write_ca_file: Option<PathBuf>,
    /// Export OTLP to this endpoint (e.g. http://127.0.0.1:4318).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport.
    #[arg(long, value_name = "grpc|http")]
    pub otlp_protocol: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// OTLP endpoint (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub otlp_ca_file: Option<PathBuf>,
}

impl SinkArgs {
    /// Sets every sink flag onto `file`.
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse (an address, a naming, a protocol), or one that
    /// refines a sink nothing configures.
    pub fn onto_config(&self, file: &mut AgentConfig) -> Result<(), ConfigError> {
        let cli = self;
        refinements_have_their_sink(cli, file)?;
        prometheus(cli, file)?;
        pushgateway(cli, file);
        influxdb(cli, file);
        remote_write(cli, file)?;
        otlp(cli, file)?;
        if cli.stdout_format.is_some() {
            file.stdout.format.clone_from(&cli.stdout_format);
        }
        // --stdout, or a format asked for: stdout whatever else is configured.
        if cli.stdout || cli.stdout_format.is_some() {
            file.stdout.enabled = Some(true);
        }
        Ok(())
    }
}

/// The credential flags that may be set from the environment (their `env` in `Cli`): the sink's
/// section, the variable, the flag.
pub const FROM_ENV: [(&str, &str, &str); 3] = [
    ("influxdb", "GPUMON_INFLUX_PASSWORD", "--influx-password"),
    ("influxdb", "GPUMON_INFLUX_TOKEN", "--influx-token"),
    ("remote_write", "GPUMON_REMOTE_WRITE_TOKEN", "--remote-write-token"),
];

/// Whether the variable behind credential flag `flag` ([`FROM_ENV`]) is set.
fn set_in_env(flag: &str) -> bool {
    FROM_ENV.iter().any(|(_, var, f)| *f == flag && std::env::var_os(var).is_some())
}

/// Refuses a flag that refines a sink which neither a flag nor the config file configures
/// (`--influx-db` without `--influx-url` or `[influxdb]`): it would be silently ignored.
/// A credential whose environment variable is set is not held against the user: a secret may be
/// in every container's environment, whether that agent writes to the sink or not.
fn refinements_have_their_sink(cli: &SinkArgs, file: &AgentConfig) -> Result<(), ConfigError> {
    // Per sink: what configures it, whether something does, and its refining flags (set or not).
    type Refined<'a> = (&'a str, bool, Vec<(&'a str, bool)>);
    let sinks: [Refined<'_>; 5] = [
        (
            "--prometheus-listen or a [prometheus]",
            cli.prometheus_listen.is_some() || file.prometheus.is_some(),
            vec![("--prometheus-naming", cli.prometheus_naming.is_some())],
        ),
        (
            "--pushgateway-url or a [pushgateway]",
            cli.pushgateway_url.is_some() || file.pushgateway.is_some(),
            vec![
                ("--pushgateway-job", cli.pushgateway_job.is_some()),
                ("--pushgateway-ca-file", cli.pushgateway_ca_file.is_some()),
            ],
        ),
        (
            "--influx-url or an [influxdb]",
            cli.influx_url.is_some() || file.influxdb.is_some(),
            vec![
                ("--influx-db", cli.influx_db.is_some()),
                ("--influx-user", cli.influx_user.is_some()),
                ("--influx-password", cli.influx_password.is_some() && !set_in_env("--influx-password")),
                ("--influx-org", cli.influx_org.is_some()),
                ("--influx-bucket", cli.influx_bucket.is_some()),
                ("--influx-token", cli.influx_token.is_some() && !set_in_env("--influx-token")),
                ("--influx-ca-file", cli.influx_ca_file.is_some()),
            ],
        ),
        (
            "--remote-write-url or a [remote_write]",
            cli.remote_write_url.is_some() || file.remote_write.is_some(),
            vec![
                ("--remote-write-naming", cli.remote_write_naming.is_some()),
                ("--remote-write-token", cli.remote_write_token.is_some() && !set_in_env("--remote-write-token")),
                ("--remote-write-ca-file", cli.remote_write_ca_file.is_some()),
            ],
        ),
        (
            "--otlp-endpoint, --otlp-protocol or an [otlp]",
            cli.otlp_endpoint.is_some() || cli.otlp_protocol.is_some() || file.otlp.is_some(),
            vec![("--otlp-ca-file", cli.otlp_ca_file.is_some())],
        ),
    ];
    for (configured_by, configured, flags) in sinks {
        if let Some((flag, _)) = flags.iter().find(|(_, set)| *set).filter(|_| !configured) {
            return Err(ConfigError(format!(
                "{flag} refines a sink that is not configured: add {configured_by} section to the config file"
            )));
        }
    }
    Ok(())
}

/// The section to refine: created (defaults) when a flag names the sink's destination, the
/// file's otherwise, `None` when neither configures the sink.
#[allow(dead_code)]
fn section<T: Default>(section: &mut Option<T>, by_flag: bool) -> Option<&mut T> {
    if by_flag {
        section.get_or_insert_default();
    }
    section.as_mut()
}

#[cfg(feature = "prometheus")]
fn prometheus(cli: &SinkArgs, file: &mut AgentConfig) -> Result<(), ConfigError> {
    use crate::sinks::prometheus::Naming;
    if let Some(addr) = &cli.prometheus_listen {
        let listen = addr.parse::<std::net::SocketAddr>().map_err(|e| {
            ConfigError(format!("--prometheus-listen: `{addr}` is not an address like 127.0.0.1:9400 ({e})"))
        })?;
        file.prometheus.get_or_insert_default().listen = Some(listen);
    }
    if let (Some(cfg), Some(naming)) = (file.prometheus.as_mut(), &cli.prometheus_naming) {
        cfg.naming = naming.parse::<Naming>().map_err(|e| ConfigError(format!("--prometheus-naming: {e}")))?;
    }
    Ok(())
}

#[cfg(not(feature = "prometheus"))]
fn prometheus(cli: &SinkArgs, file: &mut AgentConfig) -> Result<(), ConfigError> {
    crate::cli::common::configured(&mut file.prometheus, cli.prometheus_listen.is_some());
    Ok(())
}

#[cfg(feature = "pushgateway")]
fn pushgateway(cli: &SinkArgs, file: &mut AgentConfig) {
    let Some(cfg) = section(&mut file.pushgateway, cli.pushgateway_url.is_some()) else { return };
    if let Some(url) = &cli.pushgateway_url {
        cfg.url.clone_from(url);
    }
    if let Some(job) = &cli.pushgateway_job {
        cfg.job.clone_from(job);
    }
    if let Some(ca) = &cli.pushgateway_ca_file {
        cfg.tls.ca_file = Some(ca.clone());
    }
}

#[cfg(not(feature = "pushgateway"))]
fn pushgateway(cli: &SinkArgs, file: &mut AgentConfig) {
    crate::cli::common::configured(&mut file.pushgateway, cli.pushgateway_url.is_some());
}

#[cfg(feature = "influxdb")]
fn influxdb(cli: &SinkArgs, file: &mut AgentConfig) {
    let Some(cfg) = section(&mut file.influxdb, cli.influx_url.is_some()) else { return };
    if let Some(url) = &cli.influx_url {
        cfg.url.clone_from(url);
    }
    for (flag, key) in [
        (&cli.influx_db, &mut cfg.db),
        (&cli.influx_user, &mut cfg.username),
        (&cli.influx_org, &mut cfg.org),
        (&cli.influx_bucket, &mut cfg.bucket),
    ] {
        if flag.is_some() {
            key.clone_from(flag);
        }
    }
    for (flag, key) in [(&cli.influx_password, &mut cfg.password), (&cli.influx_token, &mut cfg.token)] {
        if let Some(secret) = flag {
            *key = Some(secret.into());
        }
    }
    if let Some(ca) = &cli.influx_ca_file {
        cfg.tls.ca_file = Some(ca.clone());
    }
}

#[cfg(not(feature = "influxdb"))]
fn influxdb(cli: &SinkArgs, file: &mut AgentConfig) {
    crate::cli::common::configured(&mut file.influxdb, cli.influx_url.is_some());
}

#[cfg(feature = "remote-write")]
fn remote_write(cli: &SinkArgs, file: &mut AgentConfig) -> Result<(), ConfigError> {
    use crate::sinks::prometheus::Naming;
    let Some(cfg) = section(&mut file.remote_write, cli.remote_write_url.is_some()) else { return Ok(()) };
    if let Some(url) = &cli.remote_write_url {
        cfg.url.clone_from(url);
    }
    if let Some(naming) = &cli.remote_write_naming {
        cfg.naming = naming.parse::<Naming>().map_err(|e| ConfigError(format!("--remote-write-naming: {e}")))?;
    }
    if let Some(token) = &cli.remote_write_token {
        cfg.bearer_token = Some(token.into());
    }
    if let Some(ca) = &cli.remote_write_ca_file {
        cfg.tls.ca_file = Some(ca.clone());
    }
    Ok(())
}

#[cfg(not(feature = "remote-write"))]
fn remote_write(cli: &SinkArgs, file: &mut AgentConfig) -> Result<(), ConfigError> {
    crate::cli::common::configured(&mut file.remote_write, cli.remote_write_url.is_some());
    Ok(())
}

#[cfg(feature = "otlp")]
fn otlp(cli: &SinkArgs, file: &mut AgentConfig) -> Result<(), ConfigError> {
    use crate::sinks::otlp::Protocol;
    let by_flag = cli.otlp_endpoint.is_some() || cli.otlp_protocol.is_some();
    let Some(cfg) = section(&mut file.otlp, by_flag) else { return Ok(()) };
    if let Some(endpoint) = &cli.otlp_endpoint {
        cfg.endpoint = Some(endpoint.clone());
    }
    if let Some(p) = &cli.otlp_protocol {
        cfg.protocol = Some(p.parse::<Protocol>().map_err(|e| ConfigError(format!("--otlp-protocol: {e}")))?);
    }
    if let Some(ca) = &cli.otlp_ca_file {
        cfg.tls.ca_file = Some(ca.clone());
    }
    Ok(())
}

#[cfg(not(feature = "otlp"))]
fn otlp(cli: &SinkArgs, file: &mut AgentConfig) -> Result<(), ConfigError> {
    crate::cli::common::configured(&mut file.otlp, cli.otlp_endpoint.is_some() || cli.otlp_protocol.is_some());
    Ok(())
}

//! The sinks' flags, set onto their config sections (flags win over the file); the library builds
//! the sinks from the sections (`crate::assembly`). A flag that names a sink's destination
//! (`--prometheus-listen`, `--pushgateway-url`, `--influx-url`, `--remote-write-url`,
//! `--otlp-endpoint`/`--otlp-protocol`, `--web-listen`) configures that sink; the others refine a
//! configured one. In a build without a sink's feature, its flag configures an empty section, so
//! that the library refuses it clearly ("built without the `x` feature").

use crate::assembly::config::AgentConfig;

use crate::cli::app::{Cli, ConfigError};

/// Sets every sink flag onto `file`.
///
/// ## Errors
///
/// A flag whose value does not parse (an address, a naming, a protocol).
pub fn onto_config(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
    refinements_have_their_sink(cli, file)?;
    prometheus(cli, file)?;
    pushgateway(cli, file);
    influxdb(cli, file);
    remote_write(cli, file)?;
    otlp(cli, file)?;
    crate::cli::web::onto_config(cli, file)?;
    // --stdout, or a format asked for: stdout whatever else is configured.
    if cli.stdout || cli.stdout_format.is_some() {
        file.stdout.enabled = Some(true);
    }
    Ok(())
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
fn refinements_have_their_sink(cli: &Cli, file: &AgentConfig) -> Result<(), ConfigError> {
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

/// A section configured by a flag in a build without its sink: present, so that the library
/// names the missing feature.
#[allow(dead_code)]
pub fn configured(section: &mut Option<toml::Value>, by_flag: bool) {
    if by_flag && section.is_none() {
        *section = Some(toml::Value::Table(toml::Table::new()));
    }
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
fn prometheus(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
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
fn prometheus(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
    configured(&mut file.prometheus, cli.prometheus_listen.is_some());
    Ok(())
}

#[cfg(feature = "pushgateway")]
fn pushgateway(cli: &Cli, file: &mut AgentConfig) {
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
fn pushgateway(cli: &Cli, file: &mut AgentConfig) {
    configured(&mut file.pushgateway, cli.pushgateway_url.is_some());
}

#[cfg(feature = "influxdb")]
fn influxdb(cli: &Cli, file: &mut AgentConfig) {
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
fn influxdb(cli: &Cli, file: &mut AgentConfig) {
    configured(&mut file.influxdb, cli.influx_url.is_some());
}

#[cfg(feature = "remote-write")]
fn remote_write(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
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
fn remote_write(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
    configured(&mut file.remote_write, cli.remote_write_url.is_some());
    Ok(())
}

#[cfg(feature = "otlp")]
fn otlp(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
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
fn otlp(cli: &Cli, file: &mut AgentConfig) -> Result<(), ConfigError> {
    configured(&mut file.otlp, cli.otlp_endpoint.is_some() || cli.otlp_protocol.is_some());
    Ok(())
}

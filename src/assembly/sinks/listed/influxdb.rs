//! `[influxdb]`: an InfluxDB v1/v2 writer (`gpumon_sinks::influxdb`), as the agent knows it — its section's type, how it
//! is built, its flags, the environment variables they read, and its config keys. Named in the
//! list of `super` (`for_each_sink!`, written from the files in `listed/`), which everything else iterates.

#[cfg(feature = "agent")]
use std::path::PathBuf;

use gpumon_core::Sink;

use super::{BuildFailure, Descriptor, SinkContext};

/// What the rest of the agent knows of this sink.
pub(crate) const SINK: Descriptor = Descriptor {
    key: "influxdb",
    what: "InfluxDB",
    feature: "influxdb",
    configured_by: "--influx-url or an [influxdb]",
    env: &[("GPUMON_INFLUX_PASSWORD", "--influx-password"), ("GPUMON_INFLUX_TOKEN", "--influx-token")],
    keys: &[
        ("influxdb", "retry_max"),
        ("influxdb", "retry_initial"),
        ("influxdb", "tags"),
        ("influxdb", "measurement"),
        ("influxdb", "spill_dir"),
        ("influxdb", "buffer_max_bytes"),
        ("influxdb", "buffer_max_points"),
        ("influxdb", "timeout"),
        ("influxdb", "batch_interval"),
        ("influxdb", "batch_points"),
        ("influxdb", "gzip"),
        ("influxdb", "token"),
        ("influxdb", "bucket"),
        ("influxdb", "org"),
        ("influxdb", "password"),
        ("influxdb", "username"),
        ("influxdb", "rp"),
        ("influxdb", "db"),
        ("influxdb", "api"),
        ("influxdb", "url"),
        ("influxdb.tls", "insecure_skip_verify"),
        ("influxdb.tls", "client_key_file"),
        ("influxdb.tls", "client_cert_file"),
        ("influxdb.tls", "ca_file"),
    ],
};

/// `[influxdb]`.
#[cfg(feature = "influxdb")]
pub type Section = gpumon_sinks::influxdb::InfluxConfig;
/// `[influxdb]` (not in this build: refused by [`build`], naming the feature).
#[cfg(not(feature = "influxdb"))]
pub type Section = toml::Value;

/// The sink `section` configures.
#[cfg(feature = "influxdb")]
pub(crate) fn build(section: &Section, _cx: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    let sink = gpumon_sinks::influxdb::InfluxSink::from_config(section).map_err(|e| BuildFailure::Sink(e.into()))?;
    Ok(Box::new(sink))
}

/// Not in this build.
#[cfg(not(feature = "influxdb"))]
pub(crate) fn build(_: &Section, _: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    Err(BuildFailure::FeatureMissing)
}

/// The sink's flags (flattened into the agent's command line by `crate::cli::sinks`). Present in
/// every build: in one without the sink, a flag that configures it is refused naming the feature.
#[cfg(feature = "agent")]
#[derive(Debug, clap::Args)]
#[group(id = "influxdb_flags", multiple = true)]
pub struct Flags {
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
}

#[cfg(feature = "agent")]
impl Flags {
    /// Whether a flag names the sink's destination, and so configures it.
    pub(crate) fn configures(&self) -> bool {
        self.influx_url.is_some()
    }

    /// The flags that refine a configured sink, and whether each is given.
    pub(crate) fn refinements(&self) -> Vec<(&'static str, bool)> {
        vec![
            ("--influx-db", self.influx_db.is_some()),
            ("--influx-user", self.influx_user.is_some()),
            ("--influx-password", self.influx_password.is_some()),
            ("--influx-org", self.influx_org.is_some()),
            ("--influx-bucket", self.influx_bucket.is_some()),
            ("--influx-token", self.influx_token.is_some()),
            ("--influx-ca-file", self.influx_ca_file.is_some()),
        ]
    }

    /// Sets the flags onto the section (flags win over the file).
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse, named.
    #[cfg(feature = "influxdb")]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        let Some(cfg) = super::section(section, self.configures()) else { return Ok(()) };
        if let Some(url) = &self.influx_url {
            cfg.url.clone_from(url);
        }
        for (flag, key) in [
            (&self.influx_db, &mut cfg.db),
            (&self.influx_user, &mut cfg.username),
            (&self.influx_org, &mut cfg.org),
            (&self.influx_bucket, &mut cfg.bucket),
        ] {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        for (flag, key) in [(&self.influx_password, &mut cfg.password), (&self.influx_token, &mut cfg.token)] {
            if let Some(secret) = flag {
                *key = Some(secret.into());
            }
        }
        if let Some(ca) = &self.influx_ca_file {
            cfg.tls.ca_file = Some(ca.clone());
        }
        Ok(())
    }

    /// Not in this build: a flag that configures the sink leaves a section for the build to
    /// refuse.
    #[cfg(not(feature = "influxdb"))]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        super::configured(section, self.configures());
        Ok(())
    }
}

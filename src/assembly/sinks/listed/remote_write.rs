//! `[remote_write]`: Prometheus remote write (`gpumon_sinks::remote_write`), as the agent knows it — its section's type, how it
//! is built, its flags, the environment variables they read, and its config keys. Named in the
//! list of `super` (`for_each_sink!`, written from the files in `listed/`), which everything else iterates.

#[cfg(feature = "agent")]
use std::path::PathBuf;

use gpumon_core::Sink;

use super::{BuildFailure, Descriptor, SinkContext};

/// What the rest of the agent knows of this sink.
pub(crate) const SINK: Descriptor = Descriptor {
    key: "remote_write",
    what: "Prometheus remote write",
    feature: "remote-write",
    configured_by: "--remote-write-url or a [remote_write]",
    env: &[("GPUMON_REMOTE_WRITE_TOKEN", "--remote-write-token")],
    keys: &[
        ("remote_write", "retry_max"),
        ("remote_write", "retry_initial"),
        ("remote_write", "buffer_max_bytes"),
        ("remote_write", "buffer_max_samples"),
        ("remote_write", "timeout"),
        ("remote_write", "batch_interval"),
        ("remote_write", "batch_samples"),
        ("remote_write", "headers"),
        ("remote_write", "bearer_token"),
        ("remote_write", "password"),
        ("remote_write", "username"),
        ("remote_write", "external_labels"),
        ("remote_write", "dcgm_lowercase_hostname"),
        ("remote_write", "naming"),
        ("remote_write", "url"),
        ("remote_write.tls", "insecure_skip_verify"),
        ("remote_write.tls", "client_key_file"),
        ("remote_write.tls", "client_cert_file"),
        ("remote_write.tls", "ca_file"),
    ],
};

/// `[remote_write]`.
#[cfg(feature = "remote-write")]
pub type Section = gpumon_sinks::remote_write::RemoteWriteConfig;
/// `[remote_write]` (not in this build: refused by [`build`], naming the feature).
#[cfg(not(feature = "remote-write"))]
pub type Section = toml::Value;

/// The sink `section` configures.
#[cfg(feature = "remote-write")]
pub(crate) fn build(section: &Section, _cx: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    let sink =
        gpumon_sinks::remote_write::RemoteWriteSink::from_config(section).map_err(|e| BuildFailure::Sink(e.into()))?;
    Ok(Box::new(sink))
}

/// Not in this build.
#[cfg(not(feature = "remote-write"))]
pub(crate) fn build(_: &Section, _: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    Err(BuildFailure::FeatureMissing)
}

/// The sink's flags (flattened into the agent's command line by `crate::cli::sinks`). Present in
/// every build: in one without the sink, a flag that configures it is refused naming the feature.
#[cfg(feature = "agent")]
#[derive(Debug, clap::Args)]
#[group(id = "remote_write_flags", multiple = true)]
pub struct Flags {
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
}

#[cfg(feature = "agent")]
impl Flags {
    /// Whether a flag names the sink's destination, and so configures it.
    pub(crate) fn configures(&self) -> bool {
        self.remote_write_url.is_some()
    }

    /// The flags that refine a configured sink, and whether each is given.
    pub(crate) fn refinements(&self) -> Vec<(&'static str, bool)> {
        vec![
            ("--remote-write-naming", self.remote_write_naming.is_some()),
            ("--remote-write-token", self.remote_write_token.is_some()),
            ("--remote-write-ca-file", self.remote_write_ca_file.is_some()),
        ]
    }

    /// Sets the flags onto the section (flags win over the file).
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse, named.
    #[cfg(feature = "remote-write")]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        use gpumon_sinks::prometheus::Naming;
        let Some(cfg) = super::section(section, self.configures()) else { return Ok(()) };
        if let Some(url) = &self.remote_write_url {
            cfg.url.clone_from(url);
        }
        if let Some(naming) = &self.remote_write_naming {
            cfg.naming = naming.parse::<Naming>().map_err(|e| format!("--remote-write-naming: {e}"))?;
        }
        if let Some(token) = &self.remote_write_token {
            cfg.bearer_token = Some(token.into());
        }
        if let Some(ca) = &self.remote_write_ca_file {
            cfg.tls.ca_file = Some(ca.clone());
        }
        Ok(())
    }

    /// Not in this build: a flag that configures the sink leaves a section for the build to
    /// refuse.
    #[cfg(not(feature = "remote-write"))]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        super::configured(section, self.configures());
        Ok(())
    }
}

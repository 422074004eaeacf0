//! `[pushgateway]`: a Prometheus Pushgateway (`gpumon_sinks::prometheus`), as the agent knows it — its section's type, how it
//! is built, its flags, the environment variables they read, and its config keys. Named in the
//! list of `super` (`for_each_sink!`, written from the files in `listed/`), which everything else iterates.

#[cfg(feature = "agent")]
use std::path::PathBuf;

use gpumon_core::Sink;

use super::{BuildFailure, Descriptor, SinkContext};

/// What the rest of the agent knows of this sink.
pub(crate) const SINK: Descriptor = Descriptor {
    key: "pushgateway",
    what: "a Pushgateway",
    feature: "pushgateway",
    configured_by: "--pushgateway-url or a [pushgateway]",
    env: &[],
    keys: &[
        ("pushgateway", "delete_on_shutdown"),
        ("pushgateway", "host_label"),
        ("pushgateway", "timeout"),
        ("pushgateway", "naming"),
        ("pushgateway", "password"),
        ("pushgateway", "username"),
        ("pushgateway", "grouping"),
        ("pushgateway", "job"),
        ("pushgateway", "url"),
        ("pushgateway.tls", "insecure_skip_verify"),
        ("pushgateway.tls", "client_key_file"),
        ("pushgateway.tls", "client_cert_file"),
        ("pushgateway.tls", "ca_file"),
    ],
};

/// `[pushgateway]`.
#[cfg(feature = "pushgateway")]
pub type Section = gpumon_sinks::prometheus::PushgatewayConfig;
/// `[pushgateway]` (not in this build: refused by [`build`], naming the feature).
#[cfg(not(feature = "pushgateway"))]
pub type Section = toml::Value;

/// The sink `section` configures.
#[cfg(feature = "pushgateway")]
pub(crate) fn build(section: &Section, cx: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    let mut cfg = section.clone();
    // The group's `instance` (this host's name unless configured) is the host label of
    // everything pushed: the host override sets it like every other sink's.
    if let Some(host) = cx.host {
        cfg.grouping.entry("instance".to_owned()).or_insert_with(|| host.to_owned());
    }
    let sink =
        gpumon_sinks::prometheus::PushgatewaySink::from_config(&cfg).map_err(|e| BuildFailure::Sink(e.into()))?;
    Ok(Box::new(sink))
}

/// Not in this build.
#[cfg(not(feature = "pushgateway"))]
pub(crate) fn build(_: &Section, _: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    Err(BuildFailure::FeatureMissing)
}

/// The sink's flags (flattened into the agent's command line by `crate::cli::sinks`). Present in
/// every build: in one without the sink, a flag that configures it is refused naming the feature.
#[cfg(feature = "agent")]
#[derive(Debug, clap::Args)]
#[group(id = "pushgateway_flags", multiple = true)]
pub struct Flags {
    /// Push to this Prometheus Pushgateway URL every interval.
    #[arg(long, value_name = "URL")]
    pub pushgateway_url: Option<String>,
    /// Pushgateway job label.
    #[arg(long, value_name = "JOB")]
    pub pushgateway_job: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// Pushgateway (instead of the system's).
    #[arg(long, value_name = "FILE")]
    pub pushgateway_ca_file: Option<PathBuf>,
}

#[cfg(feature = "agent")]
impl Flags {
    /// Whether a flag names the sink's destination, and so configures it.
    pub(crate) fn configures(&self) -> bool {
        self.pushgateway_url.is_some()
    }

    /// The flags that refine a configured sink, and whether each is given.
    pub(crate) fn refinements(&self) -> Vec<(&'static str, bool)> {
        vec![
            ("--pushgateway-job", self.pushgateway_job.is_some()),
            ("--pushgateway-ca-file", self.pushgateway_ca_file.is_some()),
        ]
    }

    /// Sets the flags onto the section (flags win over the file).
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse, named.
    #[cfg(feature = "pushgateway")]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        let Some(cfg) = super::section(section, self.configures()) else { return Ok(()) };
        if let Some(url) = &self.pushgateway_url {
            cfg.url.clone_from(url);
        }
        if let Some(job) = &self.pushgateway_job {
            cfg.job.clone_from(job);
        }
        if let Some(ca) = &self.pushgateway_ca_file {
            cfg.tls.ca_file = Some(ca.clone());
        }
        Ok(())
    }

    /// Not in this build: a flag that configures the sink leaves a section for the build to
    /// refuse.
    #[cfg(not(feature = "pushgateway"))]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        super::configured(section, self.configures());
        Ok(())
    }
}

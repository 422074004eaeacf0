//! `[otlp]`: an OpenTelemetry collector (OTLP) (`gpumon_sinks::otlp`), as the agent knows it — its section's type, how it
//! is built, its flags, the environment variables they read, and its config keys. Named in the
//! list of `super` (`for_each_sink!`, written from the files in `listed/`), which everything else iterates.

#[cfg(feature = "agent")]
use std::path::PathBuf;

use gpumon_core::Sink;

use super::{BuildFailure, Descriptor, SinkContext};

/// What the rest of the agent knows of this sink.
pub(crate) const SINK: Descriptor = Descriptor {
    key: "otlp",
    what: "OTLP export",
    feature: "otlp",
    configured_by: "--otlp-endpoint, --otlp-protocol or an [otlp]",
    env: &[],
    keys: &[
        ("otlp", "pipeline"),
        ("otlp", "resource_attributes"),
        ("otlp", "service_name"),
        ("otlp", "export_interval"),
        ("otlp", "compression"),
        ("otlp", "timeout"),
        ("otlp", "headers"),
        ("otlp", "protocol"),
        ("otlp", "endpoint"),
        ("otlp.tls", "insecure_skip_verify"),
        ("otlp.tls", "client_key_file"),
        ("otlp.tls", "client_cert_file"),
        ("otlp.tls", "ca_file"),
    ],
};

/// `[otlp]`.
#[cfg(feature = "otlp")]
pub type Section = gpumon_sinks::otlp::OtlpConfig;
/// `[otlp]` (not in this build: refused by [`build`], naming the feature).
#[cfg(not(feature = "otlp"))]
pub type Section = toml::Value;

/// The sink `section` configures.
#[cfg(feature = "otlp")]
pub(crate) fn build(section: &Section, cx: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    let mut cfg = section.clone();
    // Both pipelines take the resource from the config (an explicit key there wins).
    if let Some(mark) = cx.backend {
        cfg.resource_attributes.entry("gpumon.backend".to_owned()).or_insert_with(|| mark.to_owned());
    }
    if let Some(recorded) = cx.recorded_backend {
        cfg.resource_attributes.entry("gpumon.recorded_backend".to_owned()).or_insert_with(|| recorded.to_owned());
    }
    if let Some(host) = cx.host {
        cfg.resource_attributes.entry("host.name".to_owned()).or_insert_with(|| host.to_owned());
    }
    let sink = gpumon_sinks::otlp::OtlpSink::from_config(&cfg).map_err(|e| BuildFailure::Sink(e.into()))?;
    Ok(Box::new(sink))
}

/// Not in this build.
#[cfg(not(feature = "otlp"))]
pub(crate) fn build(_: &Section, _: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    Err(BuildFailure::FeatureMissing)
}

/// The sink's flags (flattened into the agent's command line by `crate::cli::sinks`). Present in
/// every build: in one without the sink, a flag that configures it is refused naming the feature.
#[cfg(feature = "agent")]
#[derive(Debug, clap::Args)]
#[group(id = "otlp_flags", multiple = true)]
pub struct Flags {
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

#[cfg(feature = "agent")]
impl Flags {
    /// Whether a flag names the sink's destination, and so configures it.
    pub(crate) fn configures(&self) -> bool {
        self.otlp_endpoint.is_some() || self.otlp_protocol.is_some()
    }

    /// The flags that refine a configured sink, and whether each is given.
    pub(crate) fn refinements(&self) -> Vec<(&'static str, bool)> {
        vec![("--otlp-ca-file", self.otlp_ca_file.is_some())]
    }

    /// Sets the flags onto the section (flags win over the file).
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse, named.
    #[cfg(feature = "otlp")]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        use gpumon_sinks::otlp::Protocol;
        let Some(cfg) = super::section(section, self.configures()) else { return Ok(()) };
        if let Some(endpoint) = &self.otlp_endpoint {
            cfg.endpoint = Some(endpoint.clone());
        }
        if let Some(p) = &self.otlp_protocol {
            cfg.protocol = Some(p.parse::<Protocol>().map_err(|e| format!("--otlp-protocol: {e}"))?);
        }
        if let Some(ca) = &self.otlp_ca_file {
            cfg.tls.ca_file = Some(ca.clone());
        }
        Ok(())
    }

    /// Not in this build: a flag that configures the sink leaves a section for the build to
    /// refuse.
    #[cfg(not(feature = "otlp"))]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        super::configured(section, self.configures());
        Ok(())
    }
}

//! `[prometheus]`: the Prometheus scrape endpoint (`gpumon_sinks::prometheus`), as the agent knows it — its section's type, how it
//! is built, its flags, the environment variables they read, and its config keys. Named in the
//! list of `super` (`for_each_sink!`, written from the files in `listed/`), which everything else iterates.

use gpumon_core::Sink;

use super::{BuildFailure, Descriptor, SinkContext};

/// What the rest of the agent knows of this sink.
pub(crate) const SINK: Descriptor = Descriptor {
    key: "prometheus",
    what: "a Prometheus endpoint",
    feature: "prometheus",
    configured_by: "--prometheus-listen or a [prometheus]",
    env: &[],
    keys: &[
        ("prometheus", "max_headers"),
        ("prometheus", "max_header_bytes"),
        ("prometheus", "connection_timeout"),
        ("prometheus", "header_read_timeout"),
        ("prometheus", "max_connections"),
        ("prometheus", "listen"),
        ("prometheus", "stale_after"),
        ("prometheus", "openmetrics"),
        ("prometheus", "dcgm_lowercase_hostname"),
        ("prometheus", "host_label"),
        ("prometheus", "tenants"),
        ("prometheus", "auth"),
        ("prometheus", "naming"),
        ("prometheus.tls", "key"),
        ("prometheus.tls", "cert"),
    ],
};

/// `[prometheus]`.
#[cfg(feature = "prometheus")]
pub type Section = gpumon_sinks::prometheus::PrometheusConfig;
/// `[prometheus]` (not in this build: refused by [`build`], naming the feature).
#[cfg(not(feature = "prometheus"))]
pub type Section = toml::Value;

/// The sink `section` configures.
#[cfg(feature = "prometheus")]
pub(crate) fn build(section: &Section, cx: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    let sink =
        gpumon_sinks::prometheus::PrometheusSink::from_config(section).map_err(|e| BuildFailure::Sink(e.into()))?;
    cx.listeners.prometheus = sink.local_addr().map(|addr| super::Listener { addr, tls: section.tls.is_some() });
    Ok(Box::new(sink))
}

/// Not in this build.
#[cfg(not(feature = "prometheus"))]
pub(crate) fn build(_: &Section, _: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    Err(BuildFailure::FeatureMissing)
}

/// The sink's flags (flattened into the agent's command line by `crate::cli::sinks`). Present in
/// every build: in one without the sink, a flag that configures it is refused naming the feature.
#[cfg(feature = "agent")]
#[derive(Debug, clap::Args)]
#[group(id = "prometheus_flags", multiple = true)]
pub struct Flags {
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR")]
    pub prometheus_listen: Option<String>,
    /// Prometheus metric names: native (gpumon_*) or dcgm (dcgm-exporter's DCGM_FI_*).
    #[arg(long, value_name = "native|dcgm")]
    pub prometheus_naming: Option<String>,
}

#[cfg(feature = "agent")]
impl Flags {
    /// Whether a flag names the sink's destination, and so configures it.
    pub(crate) fn configures(&self) -> bool {
        self.prometheus_listen.is_some()
    }

    /// The flags that refine a configured sink, and whether each is given.
    pub(crate) fn refinements(&self) -> Vec<(&'static str, bool)> {
        vec![("--prometheus-naming", self.prometheus_naming.is_some())]
    }

    /// Sets the flags onto the section (flags win over the file).
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse, named.
    #[cfg(feature = "prometheus")]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        use gpumon_sinks::prometheus::Naming;
        if let Some(addr) = &self.prometheus_listen {
            let listen = addr
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("--prometheus-listen: `{addr}` is not an address like 127.0.0.1:9400 ({e})"))?;
            section.get_or_insert_default().listen = Some(listen);
        }
        if let (Some(cfg), Some(naming)) = (section.as_mut(), &self.prometheus_naming) {
            cfg.naming = naming.parse::<Naming>().map_err(|e| format!("--prometheus-naming: {e}"))?;
        }
        Ok(())
    }

    /// Not in this build: a flag that configures the sink leaves a section for the build to
    /// refuse.
    #[cfg(not(feature = "prometheus"))]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        super::configured(section, self.configures());
        Ok(())
    }
}

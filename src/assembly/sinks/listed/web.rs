//! `[web]`: the live web view (`gpumon_sinks::web`), as the agent knows it — its section's type, how it
//! is built, its flags, the environment variables they read, and its config keys. Named in the
//! list of `super` (`for_each_sink!`, written from the files in `listed/`), which everything else iterates.

use gpumon_core::Sink;

use super::{BuildFailure, Descriptor, SinkContext};

/// What the rest of the agent knows of this sink.
pub(crate) const SINK: Descriptor = Descriptor {
    key: "web",
    what: "the web view",
    feature: "web",
    configured_by: "--web-listen or a [web]",
    env: &[],
    keys: &[
        ("web", "max_headers"),
        ("web", "max_header_bytes"),
        ("web", "connection_timeout"),
        ("web", "header_read_timeout"),
        ("web", "max_connections"),
        ("web", "listen"),
        ("web", "history"),
        ("web", "client_buffer"),
        ("web", "max_clients"),
        ("web", "tenants"),
        ("web", "auth"),
        ("web.tls", "key"),
        ("web.tls", "cert"),
    ],
};

/// `[web]`.
#[cfg(feature = "web")]
pub type Section = gpumon_sinks::web::WebConfig;
/// `[web]` (not in this build: refused by [`build`], naming the feature).
#[cfg(not(feature = "web"))]
pub type Section = toml::Value;

/// The sink `section` configures.
#[cfg(feature = "web")]
pub(crate) fn build(section: &Section, cx: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    // An exporting sink (its name is not `stdout`): with it, `auto` never falls back to
    // simulated GPUs; the page shows its "simulated data" banner only when the snapshots say
    // `mock`.
    let sink = gpumon_sinks::web::WebSink::from_config(section).map_err(|e| BuildFailure::Sink(e.into()))?;
    cx.listeners.web = sink.local_addr().map(|addr| super::Listener { addr, tls: section.tls.is_some() });
    Ok(Box::new(sink))
}

/// Not in this build.
#[cfg(not(feature = "web"))]
pub(crate) fn build(_: &Section, _: &mut SinkContext<'_>) -> Result<Box<dyn Sink>, BuildFailure> {
    Err(BuildFailure::FeatureMissing)
}

/// The sink's flags (flattened into the agent's command line by `crate::cli::sinks`). Present in
/// every build: in one without the sink, a flag that configures it is refused naming the feature.
#[cfg(feature = "agent")]
#[derive(Debug, clap::Args)]
#[group(id = "web_flags", multiple = true)]
pub struct Flags {
    /// Serve the live web view on this address (e.g. 127.0.0.1:9401): open http://ADDR/.
    #[arg(long, value_name = "ADDR")]
    pub web_listen: Option<String>,
}

#[cfg(feature = "agent")]
impl Flags {
    /// Whether a flag names the sink's destination, and so configures it.
    pub(crate) fn configures(&self) -> bool {
        self.web_listen.is_some()
    }

    /// The flags that refine a configured sink, and whether each is given.
    pub(crate) fn refinements(&self) -> Vec<(&'static str, bool)> {
        Vec::new()
    }

    /// Sets the flags onto the section (flags win over the file).
    ///
    /// ## Errors
    ///
    /// A flag whose value does not parse, named.
    #[cfg(feature = "web")]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        if let Some(addr) = &self.web_listen {
            let listen = addr
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("--web-listen: `{addr}` is not an address like 127.0.0.1:9401 ({e})"))?;
            section.get_or_insert_default().listen = Some(listen);
        }
        Ok(())
    }

    /// Not in this build: a flag that configures the sink leaves a section for the build to
    /// refuse.
    #[cfg(not(feature = "web"))]
    pub(crate) fn onto(&self, section: &mut Option<Section>) -> Result<(), String> {
        super::configured(section, self.configures());
        Ok(())
    }
}

//! The sinks: one descriptor per sink, one file each in `listed/` (`listed/prometheus.rs`,
//! `listed/influxdb.rs`, …), and the list that names them ([`for_each_sink!`]), which the crate's
//! build script writes from that folder's files. A descriptor holds what the agent knows of
//! its sink beyond the sink's own folder in `gpumon-sinks` (its config type, its engine): its
//! section's type in this build, how it is built from the section ([`SinkContext`]), its flags,
//! the environment variables those read, and its config keys. Everything else iterates the
//! list:
//! - the config's sections (`AgentConfig`'s fields, `crate::assembly::config`);
//! - the build loop ([`build::build`]) and the feature errors (`BuildFailure`, keyed by the build loop);
//! - the command line's sink flags and their checks (`crate::cli::sinks`);
//! - the environment variables named in errors (`crate::cli::backend`);
//! - the config key reference (`config_props.rs`, tested against the schema).
//!
//! Adding a sink: docs/sinks.md.

pub(crate) mod build;

use std::net::SocketAddr;

// One module per file in `listed/` (`pub mod influxdb;` …), and `for_each_sink!`, which calls a
// macro with every sink's name in the order of their file names: written by the crate's
// build script (`build.rs`), so that a sink is listed by adding its file.
include!(concat!(env!("OUT_DIR"), "/listed_sinks.rs"));
pub(crate) use for_each_sink;

/// What the rest of the agent knows of a sink, beside its section's type and its build.
#[derive(Debug)]
pub(crate) struct Descriptor {
    /// Its section in the config and its name (`influxdb`).
    pub(crate) key: &'static str,
    /// What it is, in words, for errors ("InfluxDB").
    pub(crate) what: &'static str,
    /// The facade's cargo feature that brings it.
    pub(crate) feature: &'static str,
    /// What configures it, for the error of a flag that refines it alone.
    #[cfg_attr(not(feature = "agent"), allow(dead_code))]
    pub(crate) configured_by: &'static str,
    /// The environment variables its flags read: `(variable, flag)`.
    #[cfg_attr(not(feature = "agent"), allow(dead_code))]
    pub(crate) env: &'static [(&'static str, &'static str)],
    /// Its config keys, `(table, key)`, nested tables included: its part of the key reference.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) keys: &'static [(&'static str, &'static str)],
}

impl Descriptor {
    /// Whether the variable behind `flag` is set in the environment.
    #[cfg(feature = "agent")]
    pub(crate) fn set_in_env(&self, flag: &str) -> bool {
        self.env.iter().any(|(var, f)| *f == flag && std::env::var_os(var).is_some())
    }
}

macro_rules! all_descriptors {
    ($($sink:ident),*) => {
        /// Every sink's descriptor, in the list's order (read by the command line and the key
        /// reference's tests).
        #[cfg_attr(not(any(feature = "agent", test)), allow(dead_code))]
        pub(crate) const ALL: &[&Descriptor] = &[$(&$sink::SINK),*];
    };
}
for_each_sink!(all_descriptors);

/// A listener the assembled agent serves (the Prometheus endpoint, the web view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listener {
    /// The address it is bound to (the port chosen when the config said `:0`).
    pub addr: SocketAddr,
    /// Whether it serves https.
    pub tls: bool,
}

impl Listener {
    /// `http://ADDR/` or `https://ADDR/`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/", self.addr)
    }
}

/// The listeners of the assembled agent's sinks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listeners {
    /// The Prometheus scrape endpoint (`[prometheus] listen`).
    pub prometheus: Option<Listener>,
    /// The live web view (`[web] listen`).
    pub web: Option<Listener>,
}

/// Why a listed sink could not be built; the build loop says it as an `AssemblyError` keyed by
/// the sink's section (`build.rs`), so that a descriptor needs nothing of the assembly's errors.
#[derive(Debug)]
pub(crate) enum BuildFailure {
    /// The sink refused its section.
    #[allow(dead_code)]
    Sink(Box<dyn std::error::Error + Send + Sync>),
    /// The sink's feature is not in this build.
    #[allow(dead_code)]
    FeatureMissing,
}

/// What a sink's build needs beyond its section: what the sinks must say about the data beyond
/// each snapshot (most read both from the snapshot itself; OTLP puts them on its resource and
/// the Pushgateway the host in its group's `instance`, both fixed when the sink is built), and
/// where a serving sink puts its listener.
#[derive(Debug)]
pub(crate) struct SinkContext<'a> {
    /// `backend=<mark>` on data not read from a GPU just now: `mock` (simulated) or `replay` (a
    /// recorded trace).
    #[allow(dead_code)]
    pub(crate) backend: Option<&'static str>,
    /// Of a replay, the backend that recorded its trace (`mock`: simulated when recorded).
    #[allow(dead_code)]
    pub(crate) recorded_backend: Option<&'a str>,
    /// The host name override.
    #[allow(dead_code)]
    pub(crate) host: Option<&'a str>,
    /// The listeners of the sinks built so far.
    pub(crate) listeners: Listeners,
}

/// The section a flag refines: created (defaults) when a flag names the sink's destination, the
/// file's otherwise, `None` when neither configures the sink.
#[cfg(feature = "agent")]
#[allow(dead_code)]
fn section<T: Default>(section: &mut Option<T>, by_flag: bool) -> Option<&mut T> {
    if by_flag {
        section.get_or_insert_default();
    }
    section.as_mut()
}

/// A section configured by a flag in a build without its sink: present, so that the build
/// names the missing feature.
#[cfg(feature = "agent")]
#[allow(dead_code)]
fn configured(section: &mut Option<toml::Value>, by_flag: bool) {
    if by_flag && section.is_none() {
        *section = Some(toml::Value::Table(toml::Table::new()));
    }
}

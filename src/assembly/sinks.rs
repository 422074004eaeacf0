//! The sinks, built from their sections in one order: the Prometheus endpoint, the Pushgateway,
//! InfluxDB, remote write, OTLP, the trace (`[record]`), the web view, and stdout — on when asked
//! for, or when nothing else (and no run report) is configured.
//!
//! A section of a sink compiled out of this build is [`AssemblyError::FeatureMissing`]. Building
//! binds the listeners (Prometheus, the web view), so it runs inside a tokio runtime.

use std::net::SocketAddr;

use gpumon_core::trace::RecordSink;
use gpumon_core::Sink;
use gpumon_sinks::stdout::StdoutSink;

use super::config::AgentConfig;
use super::error::AssemblyError;

/// The stdout sink's name: the one sink whose data stays on this machine's terminal.
pub(super) const STDOUT: &str = "stdout";
/// The record sink's name: its data stays in a local file, a trace that says which backend
/// produced it (a mock fallback's trace says `mock`).
pub(super) const RECORD: &str = "record";

/// What the sinks must say about the data beyond each snapshot: most sinks read both from the
/// snapshot itself; OTLP puts them on its resource and the Pushgateway the host in its group's
/// `instance`, both fixed when the sink is built.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(any(feature = "otlp", feature = "pushgateway")), allow(dead_code))]
pub(super) struct Marks<'a> {
    /// `backend=<mark>` on data not read from a GPU just now: `mock` (simulated) or `replay` (a
    /// recorded trace).
    pub(super) backend: Option<&'static str>,
    /// Of a replay, the backend that recorded its trace (`mock`: simulated when recorded).
    pub(super) recorded_backend: Option<&'a str>,
    /// The host name override.
    pub(super) host: Option<&'a str>,
    /// What the agent samples, for a trace's header (`--record`): the metric families, and
    /// whether a step tracker reads training-step marks (a replay's: what its trace recorded).
    pub(super) sampling: (gpumon_core::MetricSet, bool),
}

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

/// The sinks, in order, and their listeners.
pub(super) struct Built {
    pub(super) sinks: Vec<Box<dyn Sink>>,
    pub(super) listeners: Listeners,
}

impl Built {
    /// Whether any sink sends the data out of this process, where simulated values could be
    /// taken for real ones: any but stdout and the trace (a local file whose header names the
    /// backend).
    pub(super) fn exporting(&self) -> bool {
        self.sinks.iter().any(|s| s.name() != STDOUT && s.name() != RECORD)
    }
}

#[allow(unused_macros)]
macro_rules! feature_missing {
    ($key:literal, $what:literal, $feature:literal) => {
        return Err(AssemblyError::FeatureMissing { key: $key, what: $what, feature: $feature })
    };
}

/// A sink's section: when `$section` is set, the sink `$build` makes from it (`|s|`), pushed onto
/// `$sinks` where `$feature` is compiled in (a serving sink's [`Listener`] put in `$listener`);
/// else [`AssemblyError::FeatureMissing`]. A sink's error is [`AssemblyError::Sink`] under `$key`.
macro_rules! section_sink {
    ($sinks:ident, $section:expr, $key:literal, $what:literal, $feature:literal, |$s:ident| $build:expr) => {
        section_sink!($sinks, $section, $key, $what, $feature, |$s| $build, |_sink| ())
    };
    ($sinks:ident, $section:expr, $key:literal, $what:literal, $feature:literal, |$s:ident| $build:expr,
     listener: $listener:expr) => {
        section_sink!($sinks, $section, $key, $what, $feature, |$s| $build, |sink| {
            $listener = sink.local_addr().map(|addr| Listener { addr, tls: $s.tls.is_some() })
        })
    };
    ($sinks:ident, $section:expr, $key:literal, $what:literal, $feature:literal, |$s:ident| $build:expr,
     |$sink:ident| $then:expr) => {
        if let Some(_section) = $section {
            #[cfg(feature = $feature)]
            {
                let $s = _section;
                let $sink = $build.map_err(|e| AssemblyError::sink($key, e))?;
                $then;
                $sinks.push(Box::new($sink));
            }
            #[cfg(not(feature = $feature))]
            feature_missing!($key, $what, $feature);
        }
    };
}

/// Every sink `config` asks for; stdout when nothing else is and `report` is false (the run
/// report is output of its own: with it alone, no per-tick lines).
pub(super) fn build(config: &AgentConfig, marks: Marks<'_>, report: bool) -> Result<Built, AssemblyError> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    #[cfg_attr(not(any(feature = "prometheus", feature = "web")), allow(unused_mut))]
    let mut listeners = Listeners::default();

    // --- Prometheus scrape endpoint ---------------------------------------------------------------
    section_sink!(sinks, &config.prometheus, "prometheus", "a Prometheus endpoint", "prometheus",
        |s| gpumon_sinks::prometheus::PrometheusSink::from_config(s), listener: listeners.prometheus);

    // --- Pushgateway ------------------------------------------------------------------------------
    section_sink!(sinks, &config.pushgateway, "pushgateway", "a Pushgateway", "pushgateway", |s| {
        let mut cfg = s.clone();
        // The group's `instance` (this host's name unless configured) is the host label of
        // everything pushed: the host override sets it like every other sink's.
        if let Some(host) = marks.host {
            cfg.grouping.entry("instance".to_owned()).or_insert_with(|| host.to_owned());
        }
        gpumon_sinks::prometheus::PushgatewaySink::from_config(&cfg)
    });

    // --- InfluxDB ---------------------------------------------------------------------------------
    section_sink!(sinks, &config.influxdb, "influxdb", "InfluxDB", "influxdb", |s| {
        gpumon_sinks::influxdb::InfluxSink::from_config(s)
    });

    // --- Prometheus remote write ------------------------------------------------------------------
    section_sink!(sinks, &config.remote_write, "remote_write", "Prometheus remote write", "remote-write", |s| {
        gpumon_sinks::remote_write::RemoteWriteSink::from_config(s)
    });

    // --- OTLP -------------------------------------------------------------------------------------
    section_sink!(sinks, &config.otlp, "otlp", "OTLP export", "otlp", |s| {
        let mut cfg = s.clone();
        // Both pipelines take the resource from the config (an explicit key there wins).
        if let Some(mark) = marks.backend {
            cfg.resource_attributes.entry("gpumon.backend".to_owned()).or_insert_with(|| mark.to_owned());
        }
        if let Some(recorded) = marks.recorded_backend {
            cfg.resource_attributes.entry("gpumon.recorded_backend".to_owned()).or_insert_with(|| recorded.to_owned());
        }
        if let Some(host) = marks.host {
            cfg.resource_attributes.entry("host.name".to_owned()).or_insert_with(|| host.to_owned());
        }
        gpumon_sinks::otlp::OtlpSink::from_config(&cfg)
    });

    // --- record: a trace of every snapshot (gpumon_core::trace, docs/replay.md) --------------------
    if let Some(path) = &config.record.file {
        let sink = RecordSink::create(path).map_err(|source| AssemblyError::Record { path: path.clone(), source })?;
        let (metrics, step_marks) = marks.sampling;
        sinks.push(Box::new(sink.with_sampling(metrics, step_marks)));
    }

    // --- live web view ----------------------------------------------------------------------------
    // An exporting sink (its name is not `stdout`): with it, `auto` never falls back to simulated
    // GPUs; the page shows its "simulated data" banner only when the snapshots say `mock`.
    section_sink!(sinks, &config.web, "web", "the web view", "web",
        |s| gpumon_sinks::web::WebSink::from_config(s), listener: listeners.web);

    // --- stdout -----------------------------------------------------------------------------------
    if config.stdout.enabled.unwrap_or(sinks.is_empty() && !report) {
        sinks.push(Box::new(StdoutSink::new(config.stdout_format())));
    }
    Ok(Built { sinks, listeners })
}

/// Whether the Prometheus endpoint or the web view has tenants (who see only their own GPUs,
/// which takes attribution).
pub(super) fn has_tenants(config: &AgentConfig) -> bool {
    // A build with neither listener has no tenants to read from the config.
    #[cfg(not(any(feature = "prometheus", feature = "web")))]
    let _ = config;
    #[cfg(feature = "prometheus")]
    let prometheus = config.prometheus.as_ref().is_some_and(|p| !p.tenants.is_empty());
    #[cfg(not(feature = "prometheus"))]
    let prometheus = false;
    #[cfg(feature = "web")]
    let web = config.web.as_ref().is_some_and(|w| !w.tenants.is_empty());
    #[cfg(not(feature = "web"))]
    let web = false;
    prometheus || web
}

#[cfg(all(test, feature = "prometheus", feature = "web"))]
mod tenant_tests {
    use super::*;

    #[test]
    fn tenants_of_either_listener_count() {
        let tenant = "[[tenants]]\nname = \"a\"\nselector = { namespace = \"a\" }\nbearer = \"t\"\n";
        let parse = |text: &str| toml::from_str::<AgentConfig>(text).unwrap();
        assert!(!has_tenants(&parse("[prometheus]\n[web]\n")));
        assert!(has_tenants(&parse(&format!(
            "[prometheus]\n{}",
            tenant.replace("[[tenants]]", "[[prometheus.tenants]]")
        ))));
        assert!(has_tenants(&parse(&format!("[web]\n{}", tenant.replace("[[tenants]]", "[[web.tenants]]")))));
    }
}

//! The sinks, built from their sections in one order: the listed sinks ([`super::for_each_sink!`],
//! in the order of their files in `listed/`: InfluxDB, OTLP, the Prometheus endpoint, the
//! Pushgateway, remote write, the web view), the trace (`[record]`), and stdout — on when asked for, or when nothing else (and no run report)
//! is configured.
//!
//! A section of a sink compiled out of this build is [`AssemblyError::FeatureMissing`]. Building
//! binds the listeners (Prometheus, the web view), so it runs inside a tokio runtime.

use gpumon_core::trace::RecordSink;
use gpumon_core::Sink;
use gpumon_sinks::stdout::StdoutSink;

use super::{BuildFailure, Descriptor, Listeners, SinkContext};
use crate::assembly::config::AgentConfig;
use crate::assembly::error::AssemblyError;

/// The stdout sink's name: the one sink whose data stays on this machine's terminal.
pub(crate) const STDOUT: &str = "stdout";
/// The record sink's name: its data stays in a local file, a trace that says which backend
/// produced it (a mock fallback's trace says `mock`).
pub(crate) const RECORD: &str = "record";

/// What the sinks must say about the data beyond each snapshot: most sinks read both from the
/// snapshot itself; OTLP puts them on its resource and the Pushgateway the host in its group's
/// `instance`, both fixed when the sink is built.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Marks<'a> {
    /// `backend=<mark>` on data not read from a GPU just now: `mock` (simulated) or `replay` (a
    /// recorded trace).
    pub(crate) backend: Option<&'static str>,
    /// Of a replay, the backend that recorded its trace (`mock`: simulated when recorded).
    pub(crate) recorded_backend: Option<&'a str>,
    /// The host name override.
    pub(crate) host: Option<&'a str>,
    /// What the agent samples, for a trace's header (`--record`): the metric families, and
    /// whether a step tracker reads training-step marks (a replay's: what its trace recorded).
    pub(crate) sampling: (gpumon_core::MetricSet, bool),
}

/// The sinks, in order, and their listeners.
pub(crate) struct Built {
    pub(crate) sinks: Vec<Box<dyn Sink>>,
    pub(crate) listeners: Listeners,
}

impl Built {
    /// Whether any sink sends the data out of this process, where simulated values could be
    /// taken for real ones: any but stdout and the trace (a local file whose header names the
    /// backend).
    pub(crate) fn exporting(&self) -> bool {
        self.sinks.iter().any(|s| s.name() != STDOUT && s.name() != RECORD)
    }
}

macro_rules! build_each {
    ($($sink:ident),*) => {
        /// Each sink whose section is set, built in the list's order ([`super::for_each_sink!`]).
        fn build_listed(config: &AgentConfig, cx: &mut SinkContext<'_>) -> Result<Vec<Box<dyn Sink>>, AssemblyError> {
            let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
            $(
                if let Some(section) = &config.$sink {
                    let sink = super::$sink::build(section, cx).map_err(|e| assembly_error(&super::$sink::SINK, e))?;
                    sinks.push(sink);
                }
            )*
            Ok(sinks)
        }
    };
}
super::for_each_sink!(build_each);

/// A listed sink's failure as the assembly says it, keyed by the sink's section.
fn assembly_error(sink: &Descriptor, failure: BuildFailure) -> AssemblyError {
    match failure {
        BuildFailure::Sink(source) => AssemblyError::Sink { key: sink.key, source },
        BuildFailure::FeatureMissing => {
            AssemblyError::FeatureMissing { key: sink.key, what: sink.what, feature: sink.feature }
        }
    }
}

/// Every sink `config` asks for, the listed ones first, then the trace (`[record]`), then
/// stdout when nothing else is and `report` is false (the run report is output of its own:
/// with it alone, no per-tick lines).
pub(crate) fn build(config: &AgentConfig, marks: Marks<'_>, report: bool) -> Result<Built, AssemblyError> {
    let mut cx = SinkContext {
        backend: marks.backend,
        recorded_backend: marks.recorded_backend,
        host: marks.host,
        listeners: Listeners::default(),
    };
    let mut sinks = build_listed(config, &mut cx)?;

    // --- record: a trace of every snapshot (gpumon_core::trace, docs/replay.md) --------------------
    if let Some(path) = &config.record.file {
        let sink = RecordSink::create(path).map_err(|source| AssemblyError::Record { path: path.clone(), source })?;
        let (metrics, step_marks) = marks.sampling;
        sinks.push(Box::new(sink.with_sampling(metrics, step_marks)));
    }

    // --- stdout -----------------------------------------------------------------------------------
    if config.stdout.enabled.unwrap_or(sinks.is_empty() && !report) {
        sinks.push(Box::new(StdoutSink::new(config.stdout_format())));
    }
    Ok(Built { sinks, listeners: cx.listeners })
}

/// Whether the Prometheus endpoint or the web view has tenants (who see only their own GPUs,
/// which takes attribution).
pub(crate) fn has_tenants(config: &AgentConfig) -> bool {
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

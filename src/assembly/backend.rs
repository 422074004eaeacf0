//! The backend rule, written once: which sampler an agent runs.
//!
//! - `nvml`: NVML, or an error.
//! - `mock`: simulated GPUs (marked `backend="mock"` in every export).
//! - `auto`: NVML when it loads. Otherwise simulated data only where it cannot be mistaken for
//!   real data — when nothing leaves the process (`exporting` false: stdout, a local trace, or
//!   no sink at all) — and the face says so on the terminal; with any exporting sink, a lazy
//!   NVML sampler that exports no GPU data (`gpumon_up 0`) and retries the driver with backoff.
//!   Exporting sinks never get simulated data unless `mock` was asked for.
//! - `replay`: a recorded trace, which the face opens and plays itself (it never gets here).
//!
//! [`select`] decides and builds; it returns what it chose ([`Source`]) so that each face says
//! it in its own words (the agent on stderr, gpumon-py through Python's `logging`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpumon_core::Sampler;
use serde::Deserialize;

use super::config::AgentConfig;
use super::defaults;

/// Which backend samples the GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "agent", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// NVML when it loads. Otherwise: the mock (saying so) when stdout is the only sink; with any
    /// exporting sink, no GPU data (`gpumon_up 0`) while NVML is retried with backoff.
    #[default]
    Auto,
    /// NVML only: fail if it cannot load.
    Nvml,
    /// The scripted mock backend.
    Mock,
    /// A recorded trace played back (`--replay FILE`; docs/replay.md).
    Replay,
}

/// How NVML is opened (`[nvml]`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NvmlOptions {
    /// Explicit path of libnvidia-ml.so.1 (default: the loader's search).
    pub library: Option<PathBuf>,
    /// Where sysfs is mounted, for the runtime-PM check (default /sys).
    pub sysfs_root: Option<PathBuf>,
    /// Read runtime-suspended GPUs anyway, waking them (default false).
    pub wake_suspended: bool,
    /// Start NVML's XID watcher (a thread, an event set, a registration per GPU): only worth it
    /// when the `xid` family is sampled (default true, as the default metric set has it).
    pub xid_events: bool,
}

impl Default for NvmlOptions {
    fn default() -> Self {
        Self { library: None, sysfs_root: None, wake_suspended: false, xid_events: true }
    }
}

impl NvmlOptions {
    /// The `[nvml]` section, the XID watcher on when `watch_xid`.
    pub fn from_config(config: &AgentConfig, watch_xid: bool) -> Self {
        Self {
            library: config.nvml.library.clone(),
            sysfs_root: config.nvml.sysfs_root.clone(),
            wake_suspended: config.nvml.wake_suspended.unwrap_or(false),
            xid_events: watch_xid,
        }
    }

    #[cfg(feature = "nvml")]
    fn builder(&self) -> gpumon_core::nvml::NvmlSamplerBuilder {
        let mut builder = gpumon_core::nvml::NvmlSampler::builder().xid_events(self.xid_events);
        if let Some(path) = self.library.clone() {
            builder = builder.library_path(path);
        }
        if let Some(root) = self.sysfs_root.clone() {
            builder = builder.sysfs_root(root);
        }
        builder.wake_suspended(self.wake_suspended)
    }
}

/// The simulated fleet (`[mock]`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MockOptions {
    /// A built-in fleet name or a TOML file (default [`defaults::MOCK_PROFILE`]).
    pub profile: String,
    /// A built-in workload scenario or a TOML file (default: the mock's own).
    pub scenario: Option<String>,
    /// Seed for the deterministic values.
    pub seed: Option<u64>,
    /// The sampling interval: one tick of the mock is one interval of simulated time, so each
    /// tick's high-resolution window holds the driver samples a real driver would have taken
    /// in it (a scenario's own `tick_period_ms` wins).
    pub interval: Duration,
}

impl Default for MockOptions {
    fn default() -> Self {
        Self {
            profile: defaults::MOCK_PROFILE.to_owned(),
            scenario: None,
            seed: None,
            interval: gpumon_core::DEFAULT_INTERVAL,
        }
    }
}

impl MockOptions {
    /// The `[mock]` section, defaults filled in, at the resolved `interval`
    /// ([`super::Plan::mock`]).
    pub(super) fn resolved(config: &AgentConfig, interval: Duration) -> Self {
        Self {
            profile: config.mock.profile.clone().unwrap_or_else(|| defaults::MOCK_PROFILE.to_owned()),
            scenario: config.mock.scenario.clone(),
            seed: config.mock.seed,
            interval,
        }
    }
}

/// Why the mock could not be built: a bad setting.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MockError {
    /// The profile does not load.
    Profile {
        /// The profile asked for.
        name: String,
        /// Why it does not load.
        reason: String,
    },
    /// The scenario does not load.
    Scenario {
        /// The scenario asked for.
        name: String,
        /// Why it does not load.
        reason: String,
    },
    /// The profile and scenario load but do not make a fleet.
    Build(String),
}

impl std::fmt::Display for MockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MockError::Profile { name, reason } => write!(f, "mock.profile `{name}`: {reason}"),
            MockError::Scenario { name, reason } => write!(f, "mock.scenario `{name}`: {reason}"),
            MockError::Build(reason) => write!(f, "mock backend: {reason}"),
        }
    }
}

impl std::error::Error for MockError {}

/// Builds the mock sampler. [`MOCK`] is this crate's (feature `mock`); a build without the
/// feature (the example agent, which has gpumon-mock as a dev-dependency) can supply its own.
pub type MockFactory = fn(&MockOptions) -> Result<Arc<dyn Sampler>, MockError>;

/// This build's mock backend, if it has one (feature `mock`).
#[cfg(feature = "mock")]
pub const MOCK: Option<MockFactory> = Some(mock_sampler);
/// This build's mock backend, if it has one (feature `mock`).
#[cfg(not(feature = "mock"))]
pub const MOCK: Option<MockFactory> = None;

/// The mock fleet `options` ask for.
///
/// ## Errors
///
/// [`MockError`] naming the setting that does not load.
#[cfg(feature = "mock")]
pub fn mock_sampler(options: &MockOptions) -> Result<Arc<dyn Sampler>, MockError> {
    (crate::__mock_sampler!())(options)
}

/// The one construction of the mock sampler from [`MockOptions`], as a closure that needs only
/// a crate named `gpumon_mock` where it is expanded: this crate with its feature `mock`
/// ([`mock_sampler`]), and the example agent, which has gpumon-mock as a dev-dependency and
/// this crate without the feature.
#[doc(hidden)]
#[macro_export]
macro_rules! __mock_sampler {
    () => {
        |options: &$crate::assembly::backend::MockOptions| -> ::std::result::Result<
                    ::std::sync::Arc<dyn $crate::core::Sampler>,
                    $crate::assembly::backend::MockError,
                > {
                    use $crate::assembly::backend::MockError;
                    use ::gpumon_mock::{FleetProfile, MockSampler, Scenario};
                    let profile = FleetProfile::load(&options.profile)
                        .map_err(|e| MockError::Profile { name: options.profile.clone(), reason: e.to_string() })?;
                    let scenario = match &options.scenario {
                        Some(name) => Scenario::load(name)
                            .map_err(|e| MockError::Scenario { name: name.clone(), reason: e.to_string() })?,
                        None => Scenario::default(),
                    };
                    // Paced: the sample at exit or a flush is not a whole interval of simulated time.
                    let mut builder = MockSampler::builder()
                        .profile(profile)
                        .scenario(scenario.following_interval(options.interval))
                        .paced(options.interval);
                    if let Some(seed) = options.seed {
                        builder = builder.seed(seed);
                    }
                    let sampler = builder.build().map_err(|e| MockError::Build(e.to_string()))?;
                    Ok(::std::sync::Arc::new(sampler))
                }
    };
}

/// What [`select`] chose.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// NVML, loaded.
    Nvml,
    /// `auto` with exporting sinks and no NVML: a lazy NVML sampler (no GPU data until the
    /// driver loads; retried with backoff). Say so as a warning.
    LazyNvml {
        /// Why NVML did not load.
        reason: String,
    },
    /// The mock, asked for (`backend = "mock"`).
    Mock,
    /// `auto` with nothing exported and no NVML: the mock. Say so, plainly: the values are
    /// simulated.
    MockFallback {
        /// Why NVML did not load.
        reason: String,
    },
}

impl Source {
    /// Whether the data is simulated.
    pub fn is_mock(&self) -> bool {
        matches!(self, Source::Mock | Source::MockFallback { .. })
    }

    /// Whether the sampler can sample now (not a lazy NVML sampler waiting for the driver).
    pub fn is_live(&self) -> bool {
        !matches!(self, Source::LazyNvml { .. })
    }
}

/// The sampler [`select`] built, and what it is.
#[non_exhaustive]
pub struct Selected {
    /// The sampler.
    pub sampler: Arc<dyn Sampler>,
    /// What it is.
    pub source: Source,
}

impl std::fmt::Debug for Selected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selected").field("source", &self.source).finish_non_exhaustive()
    }
}

/// Why no sampler was built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// The mock's settings are bad (a configuration error).
    Mock(MockError),
    /// `nvml` was asked for (or `auto` exports) and NVML cannot run: why.
    Nvml(String),
    /// `mock` was asked for, and this build has no mock.
    NoMock,
    /// `auto` without NVML, nothing exported, and this build has no mock to fall back to.
    NoMockFallback {
        /// Why NVML did not load.
        reason: String,
    },
    /// `replay` without a trace.
    NoTrace,
}

impl BackendError {
    /// Whether this is a bad setting (rather than a backend that cannot run here).
    pub fn is_config(&self) -> bool {
        matches!(self, BackendError::Mock(_))
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Mock(e) => e.fmt(f),
            BackendError::Nvml(reason) => write!(f, "NVML unavailable ({reason})"),
            BackendError::NoMock => f.write_str("the mock backend is not in this build"),
            BackendError::NoMockFallback { reason } => {
                write!(f, "NVML unavailable ({reason}), and the mock fallback is not in this build")
            }
            BackendError::NoTrace => f.write_str("the replay backend needs a trace"),
        }
    }
}

impl std::error::Error for BackendError {}

/// Applies the backend rule (see the module docs) and builds the sampler. `exporting`: a sink
/// sends the data out of this process (anything but stdout or a local trace), where simulated
/// values could be taken for real ones. `mock`: the mock backend, [`MOCK`] unless the caller
/// brings its own.
///
/// ## Errors
///
/// [`BackendError`]: the mock's settings are bad, or the backend asked for cannot run here.
pub fn select(
    backend: Backend,
    exporting: bool,
    nvml: &NvmlOptions,
    mock: &MockOptions,
    mock_factory: Option<MockFactory>,
) -> Result<Selected, BackendError> {
    let simulated = |source| {
        let factory = mock_factory.ok_or(BackendError::NoMock)?;
        Ok(Selected { sampler: factory(mock).map_err(BackendError::Mock)?, source })
    };
    match backend {
        Backend::Mock => simulated(Source::Mock),
        Backend::Replay => Err(BackendError::NoTrace),
        Backend::Nvml => Ok(Selected { sampler: open_nvml(nvml).map_err(BackendError::Nvml)?, source: Source::Nvml }),
        Backend::Auto => match open_nvml(nvml) {
            Ok(sampler) => Ok(Selected { sampler, source: Source::Nvml }),
            Err(reason) if exporting => lazy_nvml(nvml, reason),
            Err(reason) if mock_factory.is_some() => simulated(Source::MockFallback { reason }),
            Err(reason) => Err(BackendError::NoMockFallback { reason }),
        },
    }
}

#[cfg(feature = "nvml")]
fn open_nvml(options: &NvmlOptions) -> Result<Arc<dyn Sampler>, String> {
    options.builder().build().map(|s| Arc::new(s) as Arc<dyn Sampler>).map_err(|e| e.to_string())
}

/// NVML did not load, but sinks export: no simulated data. The lazy sampler retries NVML with
/// backoff (a driver can load after the agent starts); until then every sample fails, so the
/// sinks get no device data, the Prometheus endpoint serves `gpumon_up 0`, `/health` answers
/// 503 and `/live` 200.
#[cfg(feature = "nvml")]
fn lazy_nvml(options: &NvmlOptions, reason: String) -> Result<Selected, BackendError> {
    Ok(Selected { sampler: Arc::new(options.builder().build_lazy()), source: Source::LazyNvml { reason } })
}

#[cfg(not(feature = "nvml"))]
fn open_nvml(_: &NvmlOptions) -> Result<Arc<dyn Sampler>, String> {
    Err("this agent was built without the `nvml` feature".to_owned())
}

#[cfg(not(feature = "nvml"))]
fn lazy_nvml(_: &NvmlOptions, reason: String) -> Result<Selected, BackendError> {
    Err(BackendError::Nvml(reason))
}

#[cfg(all(test, feature = "mock"))]
mod tests {
    use super::*;

    /// A library path that cannot load: NVML is unavailable whatever the machine.
    fn no_nvml() -> NvmlOptions {
        NvmlOptions { library: Some("/nonexistent/libnvidia-ml.so.1".into()), ..NvmlOptions::default() }
    }

    #[test]
    fn auto_falls_back_to_the_mock_only_when_nothing_is_exported() {
        let mock = MockOptions::default();
        let local = select(Backend::Auto, false, &no_nvml(), &mock, MOCK).unwrap();
        assert!(matches!(local.source, Source::MockFallback { .. }), "{local:?}");
        assert!(local.source.is_mock() && local.source.is_live());
        let exported = select(Backend::Auto, true, &no_nvml(), &mock, MOCK);
        #[cfg(feature = "nvml")]
        {
            let exported = exported.unwrap();
            assert!(matches!(exported.source, Source::LazyNvml { .. }) && !exported.source.is_live());
        }
        #[cfg(not(feature = "nvml"))]
        assert!(matches!(exported, Err(BackendError::Nvml(_))));
        let none = select(Backend::Auto, false, &no_nvml(), &mock, None).unwrap_err();
        assert!(matches!(none, BackendError::NoMockFallback { .. }), "{none}");
    }

    #[test]
    fn mock_and_nvml_are_what_they_say() {
        let mock = MockOptions::default();
        assert_eq!(select(Backend::Mock, true, &no_nvml(), &mock, MOCK).unwrap().source, Source::Mock);
        assert_eq!(select(Backend::Mock, false, &no_nvml(), &mock, None).unwrap_err(), BackendError::NoMock);
        assert!(matches!(select(Backend::Nvml, false, &no_nvml(), &mock, MOCK), Err(BackendError::Nvml(_))));
        let bad = MockOptions { profile: "no-such-fleet".into(), ..MockOptions::default() };
        let e = select(Backend::Mock, false, &no_nvml(), &bad, MOCK).unwrap_err();
        assert!(e.is_config() && e.to_string().contains("no-such-fleet"), "{e}");
    }

    #[test]
    fn defaults_come_from_the_config() {
        let config: AgentConfig = "[agent]\ninterval = \"2s\"\n[mock]\nseed = 7\n".parse().unwrap();
        let plan = crate::assembly::Assembly::plan(&config, &crate::assembly::AssemblyOptions::default()).unwrap();
        let mock = plan.mock;
        assert_eq!(mock.profile, defaults::MOCK_PROFILE);
        assert_eq!((mock.seed, mock.interval), (Some(7), Duration::from_secs(2)));
        assert_eq!(NvmlOptions::from_config(&AgentConfig::default(), true), NvmlOptions::default());
    }
}

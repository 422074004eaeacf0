//! # gpumon-core
//!
//! The heart of gpumon: the data model every backend produces and every sink consumes, the two
//! seams ([`Sampler`] for backends, [`Sink`] for outputs), and — behind the default `runtime`
//! feature — the [`Agent`] that samples on a schedule and fans snapshots out to sinks without
//! letting any one of them slow the others down.
//!
//! ## Data model
//! One sampling tick produces one immutable [`Snapshot`], shared as `Arc<Snapshot>`. It holds a
//! [`DeviceSample`] per visible GPU (MIG instances included) with typed, optional values in base
//! units. A value the GPU does not support is `None`; a per-metric failure is `None` plus an
//! entry in [`DeviceSample::errors`]; a lost device is [`DeviceState::Lost`] and the others still
//! ship.
//!
//! ## Naming
//! [`MetricId::descriptor`] is the single source of metric names, units, kinds and help text —
//! native, dcgm-exporter and OpenTelemetry alike. Sinks encode from
//! [`DeviceSample::visit_points`] and never spell a metric name themselves.
//!
//! ## Layout
//! - the model ([`Snapshot`], [`DeviceSample`], … and what stages attach to a snapshot,
//!   [`StageOutput`]): `model/`;
//! - the metric catalogue ([`MetricId::descriptor`]) and the visitor that turns a sample into
//!   [`Point`]s: `metric/`;
//! - the seams: [`Sampler`] (`sampler.rs`), [`Sink`] (`sink.rs`), [`Telemetry`];
//! - the stages ([`Processor`]s: [`attribution`], [`steps`], [`diagnose`], [`report`]):
//!   `stages/`, one folder each — gpumon's own stages ship in this crate, beside the seams
//!   they plug into (docs/stages.md, "Which crate holds what", says which file holds what);
//! - the NVML backend, the only code that names `nvml-wrapper`: `nvml/` (feature `nvml`);
//! - the runtime ([`Agent`]): `runtime/`; record and replay: `trace/`.
//!
//! No file imports across two of these in a circle: `python3 scripts/import-graph.py
//! gpumon-core/src` checks it.
//!
//! ## Features
//! - `runtime` (default): [`Agent`], [`AgentHandle`] (tokio).
//! - `serde` (default): `Serialize`/`Deserialize` for the data model.
//! - `trace`: record and replay ([`trace`]): the trace format, `RecordSink`, `ReplaySampler`.
//! - `nvml`: the NVML backend (`NvmlSampler`), loading `libnvidia-ml.so.1` at run time.
//! - `kubelet`: GPU → pod attribution from the kubelet's pod-resources API
//!   ([`attribution::kubelet`]; tonic, prost).
//! - `kubelet-server`: the server half of that API, which gpumon-mock's test kubelet (its
//!   feature `test-kubelet`) implements.
//!
//! ## Example
//! ```
//! use std::sync::Arc;
//! use gpumon_core::{DeviceInfo, DeviceSample, MetricId, Snapshot, SystemInfo};
//!
//! let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1234", "NVIDIA H100 80GB HBM3")));
//! gpu.utilization.gpu = Some(0.42);
//! let snapshot = Snapshot::new(Arc::new(SystemInfo::new("node-1", "example")), vec![gpu]);
//!
//! for device in &snapshot.devices {
//!     device.visit_points(|p| {
//!         let d = p.id.descriptor();
//!         println!("{} {} = {}", d.prometheus_name(), device.info.uuid, p.value.as_f64());
//!     });
//! }
//! assert_eq!(snapshot.devices[0].points()[1].id, MetricId::GpuUtilization);
//! ```
#![deny(missing_docs)]
#![warn(missing_debug_implementations, unreachable_pub, rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod filter;
mod metric;
mod model;
mod names;
mod sampler;
mod sink;
pub mod stages;
mod telemetry;
#[cfg(feature = "trace")]
#[cfg_attr(docsrs, doc(cfg(feature = "trace")))]
pub mod trace;

#[cfg(feature = "runtime")]
mod runtime;

#[cfg(feature = "nvml")]
pub mod nvml;

// The stages live in `stages/`; their first paths, at the crate root, stay.
pub use stages::{accounts, attribution, diagnose, report, steps};

pub use filter::{DeviceFilter, DeviceOrderError, DeviceSelector, FilterParseError};
pub use metric::{
    DcgmName, DerivedPoint, Descriptor, Family, LabelValue, MetricId, MetricKind, MetricSet, OtelName, PerDescriptor,
    Point, Scope, Unit, Value, MAX_DERIVED_LABELS,
};
pub use model::{
    ClockEventReasons, Clocks, DeviceInfo, DeviceSample, DeviceState, Ecc, FailureReason, Gpm, Memory, MetricFailure,
    MigInfo, Nvlink, NvlinkLink, NvlinkRemote, NvlinkState, Pcie, Power, ProcessSample, SamplingState, Snapshot,
    SystemInfo, Temperature, Utilization, WindowStats, Windows, XidCount, REPLAY_BACKEND,
};
// What `named_enum!` expands to in other crates.
#[doc(hidden)]
pub use names::unknown_name as __unknown_name;
pub use sampler::{BoxError, SampleError, SampleRequest, Sampler, UnavailableSampler};
pub use sink::{BuildError, InlineExport, Sink, SinkError};
pub use stages::diagnose::finding::{
    Busy, BusyGpu, Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, Severity, Transition,
};
pub use stages::{Processor, ProcessorContext, StageOutput, StageOutputs};
pub use telemetry::{AgentStats, SinkState, SinkStatus, Telemetry};

#[cfg(feature = "runtime")]
pub use runtime::{
    Agent, AgentBuilder, AgentError, AgentHandle, Clock, Interval, IntervalError, ManualClock, SinkFailure,
    SinkOptions, DEFAULT_INTERVAL, MAX_INTERVAL, MAX_SINK_QUEUE, MIN_INTERVAL,
};

/// `error: cause: cause…` — an error and its sources, each cause added unless the text so far
/// already says it. Many errors (reqwest's, tonic's "transport error") display nothing of the
/// cause that a person needs, such as "connection refused".
///
/// ```
/// #[derive(Debug)]
/// struct Send(std::io::Error);
/// impl std::fmt::Display for Send {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("error sending request")
///     }
/// }
/// impl std::error::Error for Send {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let e = Send(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
/// assert_eq!(gpumon_core::error_chain(&e), "error sending request: connection refused");
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

/// Locks `mutex`, ignoring poisoning: every lock in this crate guards state that a panic
/// elsewhere cannot leave inconsistent in a way that matters (counters, queues, caches), and a
/// monitor must go on reporting rather than turn one panic into many.
#[cfg_attr(not(feature = "runtime"), allow(dead_code))]
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This host's name: `/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `"localhost"`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

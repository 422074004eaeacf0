//! Stages: what runs between the sampler and the sinks, and what it leaves for them.
//!
//! ```text
//! sampler ──▶ stage 1 ──▶ stage 2 ──▶ … ──▶ Arc<Snapshot> ──▶ sinks, subscribers
//! ```
//!
//! A stage is one unit, plugged in both ways:
//! - **in**: a [`Processor`] sees every tick's snapshot on the sampling side, in the order the
//!   stages were added, and attaches its [`StageOutput`] to [`Snapshot::outputs`];
//! - **out**: that output describes its own derived series (each with a
//!   [`Descriptor`](crate::Descriptor), like every catalogue metric) and events, which every
//!   sink exports through [`Snapshot::visit_derived`] and [`Snapshot::visit_events`] — no sink
//!   names a stage;
//! - a stage with work of its own in the background (a socket, a cache refresher) runs it as a
//!   [`Service`], started once the agent runs and stopped before its last sample.
//!
//! The shape is vector's transforms, the OpenTelemetry Collector's processors and tracing's
//! `Layer` (`shared/STYLE.md`, "tracing": "`pub trait Layer<S: Subscriber>` … has *only default
//! methods* … so an implementer overrides just the hooks it needs", as [`Processor::attach`] and
//! every [`StageOutput`] method but `key` do).
//!
//! # Layout
//! Every stage lives in this folder, one module each, and each depends only on the model, the
//! catalogue and this framework — never on the runtime, a backend or a sink:
//! - [`attribution`] (`stages/attribution/`): who holds each GPU and process, tenant views;
//! - [`steps`] (`stages/steps/`): training steps;
//! - [`diagnose`] (`stages/diagnose/`): findings, with their output type [`Diagnosis`]
//!   (`stages/diagnose/finding.rs`);
//! - [`report`] (`stages/report/`): the run report;
//! - [`accounts`] (`stages/accounts/`): the report's GPU-time figures as counters per GPU and
//!   owner, for a fleet's TSDB.
//!
//! They are also at the crate root (`gpumon_core::diagnose`, …), where they were first.
//! The framework is this file ([`Processor`]), `service.rs` ([`Service`]) and `text.rs`; what a
//! stage leaves on a snapshot ([`StageOutput`], [`StageOutputs`], [`Event`]) is part of the
//! data model (it lives in `model/`, see [`StageOutputs`]) and is re-exported here.
//! `builtin.rs` reads the built-in stages' outputs back from JSON: the one file that names
//! them all.
//!
//! [`Diagnosis`]: crate::Diagnosis

pub mod accounts;
pub mod attribution;
#[cfg(feature = "serde")]
mod builtin;
pub mod diagnose;
pub mod report;
mod service;
pub mod steps;
pub(crate) mod text;

pub use crate::model::{no_rows, AnyOutput, Event, EventField, EventRow, EventValue, Rows, StageOutput, StageOutputs};
pub use service::{Service, ServiceError, Services};

/// The crate behind [`StageOutput::as_serialize`], so that a stage of your own needs no
/// dependency of its own to be written in JSON.
#[cfg(feature = "serde")]
pub use erased_serde;

use std::time::Duration;

use crate::model::Snapshot;

/// What a processor learns about the agent it is added to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessorContext {
    /// The agent's sampling interval: one tick of the processor's clock.
    pub interval: Duration,
}

impl ProcessorContext {
    /// A context for an agent sampling every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self { interval }
    }
}

/// A stage between sampler and sinks.
///
/// # Contract
/// - `process` is **synchronous and cheap**: it runs on the sampling path once per tick (a
///   budget of microseconds, not milliseconds). Slow enrichment — a kubelet call, say —
///   refreshes a cache on its own schedule; `process` only reads the cache.
/// - Processors see every scheduled tick and every [`flush`](crate::AgentHandle::flush) sample,
///   in order, with [`Snapshot::seq`] increasing. Ad-hoc samples from
///   [`snapshot_now`](crate::AgentHandle::snapshot_now) are not processed (they would distort a
///   processor's notion of time).
/// - A processor that panics loses that tick's derived data, not the tick: the runtime catches
///   the panic, logs it, counts it in [`AgentStats::processor_panics`](crate::AgentStats), and
///   ships the snapshot.
///
/// Object-safe, so an agent holds `Vec<Box<dyn Processor>>`.
///
/// ```
/// use gpumon_core::{Processor, Snapshot};
///
/// /// Drops MIG instances from every snapshot.
/// #[derive(Debug)]
/// struct NoMig;
///
/// impl Processor for NoMig {
///     fn name(&self) -> &str { "no-mig" }
///     fn process(&mut self, snapshot: &mut Snapshot) {
///         snapshot.devices.retain(|d| d.info.mig.is_none());
///     }
/// }
/// ```
pub trait Processor: Send + 'static {
    /// A short, unique name for logs, e.g. `"diagnose"`.
    fn name(&self) -> &str;

    /// Called once when the processor is added to an agent, before the first tick.
    fn attach(&mut self, context: &ProcessorContext) {
        let _ = context;
    }

    /// Looks at one snapshot and adds derived data to it.
    fn process(&mut self, snapshot: &mut Snapshot);
}

impl<P: Processor + ?Sized> Processor for Box<P> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn attach(&mut self, context: &ProcessorContext) {
        (**self).attach(context);
    }
    fn process(&mut self, snapshot: &mut Snapshot) {
        (**self).process(snapshot);
    }
}

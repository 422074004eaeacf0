//! The metric catalogue: every metric gpumon exports, described once.
//!
//! [`MetricId::descriptor`] is the single place metric naming comes from. Each [`Descriptor`]
//! carries the canonical name (used, with a prefix and unit suffix, by the native Prometheus
//! names and as InfluxDB field keys), the unit, the kind (gauge or counter), the help text, the
//! extra label a family needs (`xid`, `pid`, `reason`, `family`), the dcgm-exporter equivalent
//! and the OpenTelemetry name. Sinks walk
//! [`DeviceSample::visit_points`](crate::DeviceSample::visit_points) and look names up here;
//! they never spell a metric name themselves.
//!
//! What to sample is chosen per [`Family`] — the unit a backend pays for with one or a few driver
//! calls — through a [`MetricSet`]. Expensive or high-cardinality families are opt-in, and so
//! are the families beyond dcgm-exporter's default counters ([`Family::OPT_IN`]); the built-in
//! stages still read some of them ([`Family::READ_BY_STAGES`]), sampled for the stages only.
//!
//! # Files
//! - `catalogue.rs`: [`Family`], [`MetricSet`], [`Unit`], [`MetricKind`], [`Scope`],
//!   [`Descriptor`] and the table of [`MetricId`]s — names only, no model types;
//! - `point.rs`: [`Point`], [`DerivedPoint`], [`Value`], [`LabelValue`] — what sinks receive;
//! - `visit.rs`: [`DeviceSample::visit_points`](crate::DeviceSample::visit_points) — the
//!   model's fields as points;
//! - `select.rs`: [`DeviceSample::clear_family`](crate::DeviceSample::clear_family) and
//!   [`Snapshot::retain_exported`](crate::Snapshot::retain_exported) — a family's fields
//!   emptied, a snapshot narrowed to what the agent exports.
//!
//! The catalogue depends on nothing else in the crate; the model names [`MetricId`] and
//! [`Family`] (in [`MetricFailure`](crate::MetricFailure)); the visitor reads the model. So the
//! model and the catalogue form no circle.

mod catalogue;
mod point;
mod select;
mod visit;

pub use catalogue::{
    DcgmName, Descriptor, Family, MetricId, MetricKind, MetricSet, OtelName, PerDescriptor, Scope, Unit,
    MAX_DERIVED_LABELS,
};
pub use point::{DerivedPoint, LabelValue, Point, Value};

//! What a sink receives: a [`Point`] of a catalogue metric about one device, a [`DerivedPoint`]
//! of a derived series (a stage's, described by its own [`Descriptor`]), their [`Value`]s and
//! [`LabelValue`]s. Plain values: they borrow from the snapshot and name no model type.

use super::catalogue::{Descriptor, MetricId, MAX_DERIVED_LABELS};

/// A value in its canonical unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// An integer (bytes, counts, flags, P-state).
    Int(u64),
    /// A real number (ratios, watts, hertz, …).
    Float(f64),
}

impl Value {
    /// The value as `f64` (integers above 2⁵³ lose precision).
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
        }
    }
}

/// The extra label value of a point whose descriptor names a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelValue<'a> {
    /// A number (xid code, pid).
    Int(u64),
    /// A string (throttle reason).
    Str(&'a str),
}

impl std::fmt::Display for LabelValue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LabelValue::Int(v) => write!(f, "{v}"),
            LabelValue::Str(s) => f.write_str(s),
        }
    }
}

/// One value of one metric of one device, as sinks see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point<'a> {
    /// Which metric.
    pub id: MetricId,
    /// Its value.
    pub value: Value,
    /// The extra label, when [`Descriptor::label`] names one.
    pub label: Option<LabelValue<'a>>,
}

/// One value of one derived series (a finding, a training step, an embedder's own), as sinks
/// see it.
///
/// Where a [`Point`] belongs to the device whose
/// [`DeviceSample::visit_points`](crate::DeviceSample::visit_points) produced it, a derived
/// point says itself what it describes: `device` (an index into
/// [`Snapshot::devices`](crate::Snapshot::devices)) for a device-scoped series, `None` for a
/// host- or job-level one. Its extra labels are named by [`Descriptor::labels`] and their values
/// are in [`DerivedPoint::labels`], in the same order. A sink therefore exports derived data
/// from its descriptor exactly as it exports utilisation: device labels (or the host label),
/// then `descriptor.labels` zipped with `labels`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DerivedPoint<'a> {
    /// The series: a catalogue metric's ([`MetricId::descriptor`]) or a stage's own
    /// ([`Descriptor::derived`]).
    pub descriptor: &'static Descriptor,
    /// Its value.
    pub value: Value,
    /// The device it describes, as an index into [`Snapshot::devices`](crate::Snapshot::devices);
    /// `None` for the host.
    pub device: Option<usize>,
    /// Values of the labels [`Descriptor::labels`] names; only the first
    /// `descriptor.labels.len()` are meaningful.
    pub labels: [&'a str; MAX_DERIVED_LABELS],
}

impl<'a> DerivedPoint<'a> {
    /// A point of `descriptor` about `device` (`None`: the host) with the values of its
    /// [`labels`](Descriptor::labels), in order (values past the descriptor's labels are
    /// ignored).
    pub fn new(descriptor: &'static Descriptor, value: Value, device: Option<usize>, labels: &[&'a str]) -> Self {
        let mut all = [""; MAX_DERIVED_LABELS];
        for (slot, value) in all.iter_mut().zip(labels) {
            *slot = value;
        }
        Self { descriptor, value, device, labels: all }
    }

    /// The catalogue metric, or `None` for a stage's own series.
    pub fn id(&self) -> Option<MetricId> {
        self.descriptor.id
    }

    /// The `(name, value)` pairs of this point's extra labels.
    pub fn label_pairs(&self) -> impl Iterator<Item = (&'static str, &'a str)> + '_ {
        self.descriptor.labels.iter().copied().zip(self.labels.iter().copied())
    }
}

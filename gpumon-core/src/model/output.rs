//! What a stage leaves on a snapshot, and how every sink reads it without knowing the stage.
//!
//! A stage ([`Processor`](crate::Processor)) attaches one [`StageOutput`] per tick to
//! [`Snapshot::outputs`]. The output says itself which derived series it carries
//! ([`StageOutput::visit_series`], points described by a [`Descriptor`] like any catalogue
//! metric), which events happened ([`StageOutput::visit_events`]), what a tenant may see of it
//! ([`StageOutput::scoped`]) and how it is written in JSON. Sinks walk
//! [`Snapshot::visit_derived`] and [`Snapshot::visit_events`]: no sink names a stage, so a stage
//! added by an embedder is exported by every sink without a line changed there — the way
//! tracing's `Layer`s and vector's transforms add data that the outputs after them carry
//! unchanged (`shared/STYLE.md`, "tracing" and "vector").
//!
//! Typed access stays for code that knows the stage: `snapshot.output::<Diagnosis>()`.
//!
//! # Why this is in the model
//! A [`Snapshot`] holds its [`StageOutputs`], and a [`StageOutput`] reads the snapshot it is
//! attached to: the two types name each other, so they belong to one concern. They are the
//! model's — what a snapshot carries and how a sink reads it — not a stage's: the stages
//! ([`crate::stages`]) produce outputs and depend on the model, never the other way round. This
//! is the split `shared/STYLE.md` describes for tracing ("Small core": `Subscriber`
//! implementations "should depend on `tracing-core`", where the event types and the trait
//! live; "Everything heavy lives elsewhere"). The public paths stay
//! `gpumon_core::stages::{StageOutput, StageOutputs, AnyOutput}`.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use super::event::Event;
use super::Snapshot;
use crate::metric::{DerivedPoint, Descriptor, MetricId, Value, MAX_DERIVED_LABELS};

/// Comparison and downcasting for `dyn StageOutput`; implemented for every `'static` type with
/// `PartialEq`, so an output only derives `PartialEq`.
pub trait AnyOutput: Any {
    /// `self` as `Any`, for [`Snapshot::output`].
    fn as_any(&self) -> &dyn Any;
    /// Whether `other` is an equal value of the same type.
    fn eq_output(&self, other: &dyn Any) -> bool;
}

impl<T: Any + PartialEq> AnyOutput for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn eq_output(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>().is_some_and(|o| o == self)
    }
}

/// What one stage attached to one snapshot: its derived series, its events, its tenant view,
/// its JSON.
///
/// ```
/// use std::sync::Arc;
/// use gpumon_core::stages::{Event, StageOutput};
/// use gpumon_core::{DerivedPoint, Descriptor, DeviceInfo, DeviceSample, Family, MetricKind, Scope, Snapshot, SystemInfo, Unit, Value};
///
/// /// Degrees above 80 °C per GPU, a series of the embedder's own.
/// static HEADROOM: Descriptor = Descriptor::derived(
///     "thermal_excess", Family::Derived, Unit::Celsius, MetricKind::Gauge,
///     "Degrees above 80 °C.", Scope::Device, &[], "acme.gpu.thermal_excess",
/// );
///
/// #[derive(Debug, PartialEq)]
/// struct Excess(Vec<(usize, f64)>);
///
/// impl StageOutput for Excess {
///     fn key(&self) -> &'static str { "thermal_excess" }
///     fn visit_series<'a>(&'a self, _: &'a Snapshot, f: &mut dyn FnMut(DerivedPoint<'a>)) {
///         for &(device, excess) in &self.0 {
///             f(DerivedPoint::new(&HEADROOM, Value::Float(excess), Some(device), &[]));
///         }
///     }
/// }
///
/// let gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "NVIDIA H100")));
/// let mut snapshot = Snapshot::new(Arc::new(SystemInfo::new("node-1", "example")), vec![gpu]);
/// snapshot.attach(Excess(vec![(0, 3.5)]));
/// let mut names = Vec::new();
/// snapshot.visit_derived(|p| names.push(p.descriptor.name));
/// assert_eq!(names, ["thermal_excess"]);
/// assert_eq!(snapshot.output::<Excess>().unwrap().0[0].1, 3.5);
/// ```
pub trait StageOutput: AnyOutput + Debug + Send + Sync {
    /// The output's key: its name in the snapshot's JSON (`"diagnosis"`, `"steps"`) and what
    /// [`StageOutputs::insert`] replaces by. One key per stage.
    fn key(&self) -> &'static str;

    /// Calls `f` once per derived value this output carries. A point's `device` is an index
    /// into `snapshot.devices` (the snapshot this output is attached to); `None` for the host.
    fn visit_series<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(DerivedPoint<'a>)) {
        let _ = (snapshot, f);
    }

    /// Calls `f` once per event that happened at this tick (a finding raised, a step reported).
    fn visit_events<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(&Event<'_>)) {
        let _ = (snapshot, f);
    }

    /// What a tenant may read of this output in `view` (the tenant's view of the snapshot,
    /// already holding only the tenant's devices). `None`, the default, keeps the output out of
    /// every tenant view: a stage decides explicitly what is tenant-neutral.
    fn scoped(&self, view: &Snapshot) -> Option<Arc<dyn StageOutput>> {
        let _ = view;
        None
    }

    /// The output as JSON sees it (the snapshot's `key` field); `None`, the default, leaves it
    /// out of JSON.
    #[cfg(feature = "serde")]
    fn as_serialize(&self) -> Option<&dyn erased_serde::Serialize> {
        None
    }
}

/// Most outputs held without allocating: the built-in stages (attribution, steps, diagnosis)
/// and one more.
const INLINE: usize = 4;

/// The stage outputs of one snapshot, in the order the stages attached them (one per key).
///
/// Cloning shares the outputs (reference counts); attaching up to four needs no allocation.
#[derive(Clone, Default)]
pub struct StageOutputs {
    inline: [Option<Arc<dyn StageOutput>>; INLINE],
    more: Vec<Arc<dyn StageOutput>>,
}

impl StageOutputs {
    /// Attaches `output`, replacing the one with the same [`key`](StageOutput::key) in place.
    pub fn insert(&mut self, output: Arc<dyn StageOutput>) {
        let key = output.key();
        if let Some(slot) = self.slots_mut().find(|o| o.key() == key) {
            *slot = output;
            return;
        }
        match self.inline.iter_mut().find(|s| s.is_none()) {
            Some(free) => *free = Some(output),
            None => self.more.push(output),
        }
    }

    /// Detaches the output with `key`; whether there was one. The others keep their order.
    pub fn remove(&mut self, key: &str) -> bool {
        if let Some(i) = self.inline.iter().position(|s| s.as_ref().is_some_and(|o| o.key() == key)) {
            self.inline[i..].rotate_left(1);
            self.inline[INLINE - 1] = if self.more.is_empty() { None } else { Some(self.more.remove(0)) };
            return true;
        }
        let before = self.more.len();
        self.more.retain(|o| o.key() != key);
        before != self.more.len()
    }

    /// The output with `key`.
    pub fn get(&self, key: &str) -> Option<&Arc<dyn StageOutput>> {
        self.iter().find(|o| o.key() == key)
    }

    /// The first output of type `T`.
    pub fn of<T: StageOutput>(&self) -> Option<&T> {
        self.iter().find_map(|o| o.as_any().downcast_ref::<T>())
    }

    /// Every output, in attachment order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn StageOutput>> {
        self.inline.iter().map_while(Option::as_ref).chain(&self.more)
    }

    /// Whether no stage attached anything.
    pub fn is_empty(&self) -> bool {
        self.inline[0].is_none()
    }

    fn slots_mut(&mut self) -> impl Iterator<Item = &mut Arc<dyn StageOutput>> {
        self.inline.iter_mut().map_while(Option::as_mut).chain(&mut self.more)
    }
}

impl Debug for StageOutputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter().map(|o| (o.key(), o))).finish()
    }
}

impl PartialEq for StageOutputs {
    fn eq(&self, other: &Self) -> bool {
        self.iter().count() == other.iter().count()
            && self.iter().zip(other.iter()).all(|(a, b)| a.key() == b.key() && a.eq_output(b.as_any()))
    }
}

impl Snapshot {
    /// Attaches `output` ([`StageOutputs::insert`]): what a stage does at each tick, and what a
    /// test does to give a snapshot a stage's data.
    pub fn attach<T: StageOutput>(&mut self, output: T) {
        self.outputs.insert(Arc::new(output));
    }

    /// The output of stage type `T` attached to this snapshot, e.g.
    /// `snapshot.output::<Diagnosis>()`.
    pub fn output<T: StageOutput>(&self) -> Option<&T> {
        self.outputs.of::<T>()
    }

    /// Calls `f` once for every derived value this snapshot carries: for a sampling-failed
    /// snapshot ([`Snapshot::sampling_failed`]) one [`MetricId::DeviceUp`] = 0 about the host
    /// (`device: None`), then every stage output's series in attachment order (findings,
    /// training steps, attribution failures, an embedder's own). Nothing when no stage attached
    /// data and sampling succeeded.
    ///
    /// A point about a device index the snapshot does not have is skipped. Allocates nothing.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::{Snapshot, SystemInfo};
    ///
    /// let snapshot = Snapshot::new(Arc::new(SystemInfo::new("node-1", "example")), Vec::new());
    /// let mut n = 0;
    /// snapshot.visit_derived(|p| {
    ///     for (key, value) in p.label_pairs() {
    ///         println!("{} {key}={value}", p.descriptor.prometheus_name());
    ///     }
    ///     n += 1;
    /// });
    /// assert_eq!(n, 0); // no stage attached anything
    /// ```
    pub fn visit_derived<'a>(&'a self, mut f: impl FnMut(DerivedPoint<'a>)) {
        if !self.sampling.is_ok() {
            // The backend could not be read: `up = 0` about the host (no device labels), in the
            // same series family as each GPU's `up`, so one alert on `up == 0` covers a lost GPU
            // and a node whose GPUs cannot be read at all.
            f(DerivedPoint {
                descriptor: MetricId::DeviceUp.descriptor(),
                value: Value::Int(0),
                device: None,
                labels: [""; MAX_DERIVED_LABELS],
            });
        }
        let devices = self.devices.len();
        for output in self.outputs.iter() {
            output.visit_series(self, &mut |p| {
                if p.device.is_none_or(|i| i < devices) {
                    f(p);
                }
            });
        }
    }

    /// Calls `f` once for every event of this tick, stage by stage in attachment order. Events
    /// about a device index the snapshot does not have are skipped.
    pub fn visit_events(&self, mut f: impl FnMut(&Event<'_>)) {
        let devices = self.devices.len();
        for output in self.outputs.iter() {
            output.visit_events(self, &mut |e| {
                if e.device.is_none_or(|i| i < devices) {
                    f(e);
                }
            });
        }
    }

    /// Every descriptor of a derived series this snapshot carries, each once, in first-seen
    /// order, into `out` (cleared first). Sinks that keep per-series state (instruments,
    /// measurement names) use it to learn an embedder's series before encoding.
    pub fn derived_descriptors(&self, out: &mut Vec<&'static Descriptor>) {
        out.clear();
        // One series per name, as every sink's per-series cache tells them apart.
        self.visit_derived(|p| {
            if !out.iter().any(|d| std::ptr::eq(*d, p.descriptor) || d.name == p.descriptor.name) {
                out.push(p.descriptor);
            }
        });
    }
}

#[cfg(feature = "serde")]
mod json {
    //! The outputs as fields of the snapshot's JSON object (`"diagnosis": {…}`). Reading them
    //! back needs the built-in stages' types, so it lives with them (`stages/builtin.rs`).
    use super::*;
    use serde::ser::{Serialize, SerializeMap, Serializer};

    impl Serialize for StageOutputs {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut map = serializer.serialize_map(None)?;
            for output in self.iter() {
                if let Some(value) = output.as_serialize() {
                    map.serialize_entry(output.key(), value)?;
                }
            }
            map.end()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SystemInfo;

    #[test]
    fn a_sampling_failed_snapshot_derives_one_host_level_up_0() {
        let system = Arc::new(SystemInfo::new("h", "nvml"));
        let mut points = Vec::new();
        let failed = Snapshot::sampling_failed(system.clone(), "no driver");
        failed.visit_derived(|p| points.push(p));
        assert_eq!(points, [DerivedPoint::new(MetricId::DeviceUp.descriptor(), Value::Int(0), None, &[])]);
        let mut n = 0;
        Snapshot::new(system, Vec::new()).visit_derived(|_| n += 1);
        assert_eq!(n, 0, "sampled data carries no such point");
    }
}

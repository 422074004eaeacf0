//! From the metric catalogue to OpenTelemetry instruments, and from a snapshot to observations.
//!
//! Every name, unit and extra attribute comes from [`MetricId::descriptor`]'s `otel` mapping.
//! Metrics that share an OTel name (the engines of `hw.gpu.utilization`, the sensors of
//! `hw.temperature`, …) become one instrument whose series differ by the mapping's attribute.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use arc_swap::ArcSwap;
use gpumon_core::attribution::{OwnerLabels, SharedOwner};
use gpumon_core::{
    Descriptor, DeviceInfo, DeviceSample, LabelValue, MetricId, MetricKind, ProcessSample, Snapshot, SystemInfo, Unit,
    Value, MAX_DERIVED_LABELS,
};
use opentelemetry::metrics::Meter;
use opentelemetry::{KeyValue, StringValue};

/// `hw.type` of every data point.
pub(crate) const HW_TYPE: &str = "gpu";
/// `hw.vendor` of every data point.
pub(crate) const HW_VENDOR: &str = "nvidia";
/// The `hw.state` value of the complement series added next to `hw.status{hw.state=ok}`.
const FAILED_STATE: &str = "failed";

/// The instrument kind and value type an OTel metric is exported with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Observable Gauge, double.
    GaugeF64,
    /// Observable Gauge, int.
    GaugeI64,
    /// Observable (monotonic, cumulative) Counter, double.
    CounterF64,
    /// Observable (monotonic, cumulative) Counter, int.
    CounterU64,
    /// Observable UpDownCounter (non-monotonic cumulative Sum), int.
    UpDownI64,
}

impl Shape {
    pub(crate) fn of(id: MetricId) -> Shape {
        Shape::of_descriptor(id.descriptor())
    }

    /// The shape of series `d`.
    pub(crate) fn of_descriptor(d: &Descriptor) -> Shape {
        // Counts and bytes are integers; ratios, watts, joules, hertz, °C, seconds are doubles.
        let integral = matches!(d.unit, Unit::Count | Unit::Bytes);
        match (d.otel.up_down, d.kind, integral) {
            (true, _, _) => Shape::UpDownI64,
            (false, MetricKind::Counter, true) => Shape::CounterU64,
            (false, MetricKind::Counter, false) => Shape::CounterF64,
            (false, _, true) => Shape::GaugeI64,
            (false, _, false) => Shape::GaugeF64,
        }
    }

    /// The OTLP data type and properties, as the mapping table shows them.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Shape::GaugeF64 => "Gauge (double)",
            Shape::GaugeI64 => "Gauge (int)",
            Shape::CounterF64 => "Counter: Sum, monotonic, cumulative (double)",
            Shape::CounterU64 => "Counter: Sum, monotonic, cumulative (int)",
            Shape::UpDownI64 => "UpDownCounter: Sum, non-monotonic, cumulative (int)",
        }
    }
}

/// One OpenTelemetry instrument and the catalogue metrics that feed it.
#[derive(Clone, Debug)]
pub(crate) struct InstrumentSpec {
    pub(crate) name: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) shape: Shape,
    pub(crate) description: String,
    pub(crate) members: Vec<MetricId>,
}

/// The catalogue grouped into instruments, and the instruments of the stages' own series
/// learnt since ([`Plan::learn`]).
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) instruments: Vec<InstrumentSpec>,
    /// `MetricId as usize` → index into `instruments`.
    slot: Vec<usize>,
    /// A stage's own series (by name) → index into `instruments`.
    learnt: Vec<(&'static str, usize)>,
    /// Scratch of [`Plan::learn`].
    seen: Vec<&'static Descriptor>,
}

impl Plan {
    pub(crate) fn new() -> Plan {
        let mut instruments: Vec<InstrumentSpec> = Vec::new();
        let mut slot = vec![usize::MAX; MetricId::ALL.len()];
        for &id in MetricId::ALL {
            let d = id.descriptor();
            let index = match instruments.iter().position(|i| i.name == d.otel.name) {
                Some(i) => i,
                None => {
                    instruments.push(InstrumentSpec {
                        name: d.otel.name,
                        unit: d.otel_unit(),
                        shape: Shape::of(id),
                        description: String::new(),
                        members: Vec::new(),
                    });
                    instruments.len() - 1
                }
            };
            instruments[index].members.push(id);
            slot[id as usize] = index;
        }
        for spec in &mut instruments {
            spec.description = describe_members(&spec.members);
        }
        Plan { instruments, slot, learnt: Vec::new(), seen: Vec::new() }
    }

    fn slot(&self, id: MetricId) -> usize {
        self.slot[id as usize]
    }

    /// The instrument of series `d`; `None` for a stage's own series not learnt yet.
    fn slot_of(&self, d: &Descriptor) -> Option<usize> {
        match d.id {
            Some(id) => Some(self.slot(id)),
            None => self.learnt.iter().find(|(name, _)| *name == d.name).map(|(_, i)| *i),
        }
    }

    /// Adds an instrument for every series of `snapshot` outside the catalogue (a stage of the
    /// embedder's) not seen before; returns the number of instruments before, so that the
    /// caller sets up the new ones (`instruments[before..]`). Nothing is allocated once every
    /// series is known.
    pub(crate) fn learn(&mut self, snapshot: &Snapshot) -> usize {
        let before = self.instruments.len();
        let mut seen = std::mem::take(&mut self.seen);
        snapshot.derived_descriptors(&mut seen);
        for d in seen.iter().filter(|d| d.id.is_none()) {
            if self.slot_of(d).is_some() {
                continue;
            }
            let index = match self.instruments.iter().position(|i| i.name == d.otel.name) {
                Some(i) => i,
                None => {
                    self.instruments.push(InstrumentSpec {
                        name: d.otel.name,
                        unit: d.otel_unit(),
                        shape: Shape::of_descriptor(d),
                        description: d.help.to_owned(),
                        members: Vec::new(),
                    });
                    self.instruments.len() - 1
                }
            };
            self.learnt.push((d.name, index));
        }
        self.seen = seen;
        before
    }
}

/// One help text when the members share an instrument through an attribute:
/// `"hw.gpu.task=general: Fraction …; hw.gpu.task=encoder: …"`.
fn describe_members(members: &[MetricId]) -> String {
    let first = members[0].descriptor();
    if members.len() == 1 || members.iter().all(|m| m.descriptor().help == first.help) {
        return first.help.to_owned();
    }
    let mut s = String::new();
    for m in members {
        let d = m.descriptor();
        if !s.is_empty() {
            s.push(' ');
        }
        match d.otel.attribute {
            Some((k, v)) => {
                let _ = write!(s, "{k}={v}: {}", d.help);
            }
            None => s.push_str(d.help),
        }
    }
    s
}

/// The OTel attribute key of a catalogue label (`pid` → `process.pid`, `xid` → `gpumon.xid`).
pub(crate) fn label_key(label: &'static str) -> Cow<'static, str> {
    match label {
        "pid" => Cow::Borrowed("process.pid"),
        "xid" => Cow::Borrowed("gpumon.xid"),
        "reason" => Cow::Borrowed("gpumon.reason"),
        // Derived series' labels (findings): spelled out only so no point allocates its key.
        "kind" => Cow::Borrowed("gpumon.kind"),
        "severity" => Cow::Borrowed("gpumon.severity"),
        "family" => Cow::Borrowed("gpumon.family"),
        "source" => Cow::Borrowed("gpumon.source"),
        // A label added to the catalogue later lands in the extension namespace as well; the
        // generated docs table lists it, so the mapping stays visible.
        other => Cow::Owned(format!("gpumon.{other}")),
    }
}

/// One observation: a value and its complete attribute set.
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub(crate) value: Value,
    pub(crate) attributes: Vec<KeyValue>,
}

/// What each instrument reports at the next collection: `by_instrument[i]` for instrument `i`.
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    pub(crate) by_instrument: Vec<Vec<Observation>>,
    /// Data points in total.
    pub(crate) points: usize,
}

/// The latest snapshot's observations, read by every instrument's callback.
pub(crate) type Shared = Arc<ArcSwap<Encoded>>;

/// Per-device attribute sets, rebuilt only when the device's identity or its owners change, and
/// per-process ones (the device's identity plus the process's owner), forgotten once the process
/// is gone.
#[derive(Debug, Default)]
pub(crate) struct AttributeCache {
    devices: HashMap<String, CachedDevice>,
    /// The (empty) device attribute set of points about the host: one `Arc`, so its address is
    /// stable like a device's.
    host: Arc<[KeyValue]>,
    /// Walks so far; a process entry not touched by the latest walk is dropped.
    walk: u64,
    /// Every point gets the device's whole identity, as before it went once per device: for the
    /// test that measures the difference.
    #[cfg(test)]
    pub(crate) identity_on_every_point: bool,
}

/// A device's identity, the driver version, its owners and the attributes built from them.
#[derive(Debug)]
struct CachedDevice {
    info: Arc<DeviceInfo>,
    driver: Option<String>,
    owners: Vec<SharedOwner>,
    /// The attributes that name the device on every point ([`point_attributes`]), without
    /// owners (the base of the process sets).
    key: Vec<KeyValue>,
    /// The key plus the merged owner attributes: what every device point carries.
    attrs: Arc<[KeyValue]>,
    /// The whole identity ([`device_attributes`]) plus the owners: what the device's `hw.status`
    /// points carry, once per device.
    identity: Arc<[KeyValue]>,
    processes: HashMap<u32, CachedProcess>,
}

/// pid → (its owner, identity plus that owner's attributes, the walk that last used it).
type CachedProcess = (Option<SharedOwner>, Arc<[KeyValue]>, u64);

fn same_owners(a: &[SharedOwner], b: &[SharedOwner]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b) || **a == **b)
}

fn same_owner(a: Option<&SharedOwner>, b: Option<&SharedOwner>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || **a == **b,
        _ => false,
    }
}

impl AttributeCache {
    /// The attribute set of `device`'s points: the attributes that name it, and merged owners.
    pub(crate) fn device(&mut self, system: &SystemInfo, device: &DeviceSample) -> Arc<[KeyValue]> {
        #[cfg(test)]
        if self.identity_on_every_point {
            return self.identity(system, device);
        }
        match self.entry(system, device) {
            Some(entry) => entry.attrs.clone(),
            None => with_owners(point_attributes(&device.info), device.owner_labels()).into(),
        }
    }

    /// The attribute set of `device`'s `hw.status` points: its whole identity, and merged owners.
    pub(crate) fn identity(&mut self, system: &SystemInfo, device: &DeviceSample) -> Arc<[KeyValue]> {
        match self.entry(system, device) {
            Some(entry) => entry.identity.clone(),
            None => with_owners(device_attributes(system, &device.info), device.owner_labels()).into(),
        }
    }

    /// The attribute set of a per-process point of `device`: identity and the process's owner.
    pub(crate) fn process(
        &mut self,
        system: &SystemInfo,
        device: &DeviceSample,
        process: &ProcessSample,
    ) -> Arc<[KeyValue]> {
        let walk = self.walk;
        let Some(entry) = self.entry(system, device) else {
            return with_owners(point_attributes(&device.info), process.owner_labels()).into();
        };
        let owner = process.owner.as_ref();
        if let Some((cached, attrs, used)) = entry.processes.get_mut(&process.pid) {
            if same_owner(cached.as_ref(), owner) {
                *used = walk;
                return attrs.clone();
            }
        }
        let attrs: Arc<[KeyValue]> = with_owners(entry.key.clone(), process.owner_labels()).into();
        entry.processes.insert(process.pid, (owner.cloned(), attrs.clone(), walk));
        attrs
    }

    /// The device's entry, rebuilt when its identity changed and its owner attributes when its
    /// owners did. (`None` cannot happen: the entry is inserted first if missing.)
    fn entry(&mut self, system: &SystemInfo, device: &DeviceSample) -> Option<&mut CachedDevice> {
        let info = &device.info;
        let fresh = self
            .devices
            .get(&info.uuid)
            .is_some_and(|c| (Arc::ptr_eq(&c.info, info) || *c.info == **info) && c.driver == system.driver_version);
        if !fresh {
            let key = point_attributes(info);
            let cached = CachedDevice {
                info: info.clone(),
                driver: system.driver_version.clone(),
                owners: device.owners.clone(),
                attrs: with_owners(key.clone(), device.owner_labels()).into(),
                identity: with_owners(device_attributes(system, info), device.owner_labels()).into(),
                key,
                processes: HashMap::new(),
            };
            self.devices.insert(info.uuid.clone(), cached);
        }
        let entry = self.devices.get_mut(&info.uuid)?;
        if !same_owners(&entry.owners, &device.owners) {
            entry.attrs = with_owners(entry.key.clone(), device.owner_labels()).into();
            entry.identity = with_owners(device_attributes(system, info), device.owner_labels()).into();
            entry.owners = device.owners.clone();
        }
        Some(entry)
    }

    /// Starts a walk over a snapshot.
    fn begin(&mut self) {
        self.walk += 1;
    }

    /// Ends a walk: forgets the processes it did not see.
    fn end(&mut self) {
        let walk = self.walk;
        for device in self.devices.values_mut() {
            device.processes.retain(|_, (_, _, used)| *used == walk);
        }
    }
}

/// `attrs` followed by the owner attributes of `labels`.
fn with_owners(mut attrs: Vec<KeyValue>, labels: OwnerLabels<'_>) -> Vec<KeyValue> {
    owner_attributes(&mut attrs, labels);
    attrs
}

/// The owner attributes ([`gpumon_core::attribution`]): `k8s.namespace.name`, `k8s.pod.name`,
/// `k8s.container.name` (`container.id` for a container outside Kubernetes, whose label is its
/// short id) and `user.name`, those that are known.
pub(crate) fn owner_attributes(attrs: &mut Vec<KeyValue>, labels: OwnerLabels<'_>) {
    let kubernetes = labels.namespace.is_some() || labels.pod.is_some();
    for (label, value) in labels.pairs() {
        let key = match label {
            "namespace" => "k8s.namespace.name",
            "pod" => "k8s.pod.name",
            "container" if kubernetes => "k8s.container.name",
            "container" => "container.id",
            "user" => "user.name",
            // A label added to OwnerLabels later: under the extension namespace until mapped.
            _ => continue,
        };
        attrs.push(KeyValue::new(key, s(value)));
    }
}

fn s(v: &str) -> opentelemetry::Value {
    opentelemetry::Value::String(StringValue::from(Arc::<str>::from(v)))
}

/// What names a device on every one of its points: `hw.id` (required by the conventions on every
/// `hw.*` metric, unique within the host), `hw.name` and `hw.type` (required by `hw.power`,
/// `hw.energy`, `hw.errors`, `hw.status`). The rest of its identity, the same on every point
/// and every tick, goes on its `hw.status` points only ([`device_attributes`]): one place per
/// device in each request instead of ≈ 190, joinable on `hw.id` (docs/otlp.md, "Attributes").
pub(crate) fn point_attributes(info: &DeviceInfo) -> Vec<KeyValue> {
    let mut attrs = Vec::with_capacity(3);
    attrs.push(KeyValue::new("hw.id", s(&info.uuid)));
    let name = match &info.mig {
        Some(mig) => format!("{}/mig{}", info.device_node(), mig.mig_index),
        None => info.device_node(),
    };
    attrs.push(KeyValue::new("hw.name", s(&name)));
    attrs.push(KeyValue::new("hw.type", HW_TYPE));
    attrs
}

/// The semantic-convention GPU attribute set (`metric_attributes.hw.gpu`) plus `hw.type`, and
/// the device index under the extension namespace: what a device's `hw.status` points carry.
pub(crate) fn device_attributes(system: &SystemInfo, info: &DeviceInfo) -> Vec<KeyValue> {
    let mut attrs = point_attributes(info);
    attrs.reserve(7);
    attrs.push(KeyValue::new("hw.vendor", HW_VENDOR));
    if !info.name.is_empty() {
        attrs.push(KeyValue::new("hw.model", s(&info.name)));
    }
    if let Some(v) = &system.driver_version {
        attrs.push(KeyValue::new("hw.driver_version", s(v)));
    }
    if let Some(serial) = info.serial.as_deref().filter(|s| !s.is_empty()) {
        attrs.push(KeyValue::new("hw.serial_number", s(serial)));
    }
    if let Some(mig) = &info.mig {
        attrs.push(KeyValue::new("hw.parent", s(&mig.parent_uuid)));
    }
    attrs.push(KeyValue::new("gpumon.gpu.index", i64::from(info.index)));
    attrs
}

/// One data point of a snapshot, as the catalogue mapping places it: which instrument, which
/// device (and its cached attribute set), the mapping's attribute, the label, and the value.
/// Both pipelines build their data points from these (`Plan::walk`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Series<'a> {
    /// Index into [`Plan::instruments`].
    pub(crate) instrument: usize,
    /// Position of the device in the snapshot.
    pub(crate) device: usize,
    /// The device's attribute set (from [`AttributeCache`]: the same `Arc` while the device's
    /// identity is unchanged).
    pub(crate) base: &'a Arc<[KeyValue]>,
    /// The catalogue metric; `None` for a stage's own series.
    pub(crate) id: Option<MetricId>,
    /// The mapping's extra attribute (`hw.gpu.task=general`, `hw.state=failed`, …).
    pub(crate) attribute: Option<(&'static str, &'static str)>,
    /// The catalogue label and its value (the key is the catalogue's, see [`label_key`]).
    pub(crate) label: Option<(&'static str, LabelValue<'a>)>,
    /// A derived point's labels: the keys are [`Descriptor::labels`](gpumon_core::Descriptor::labels)
    /// (through [`label_key`]), the values the first `keys.len()` of `values`.
    pub(crate) derived: DerivedLabels<'a>,
    pub(crate) value: Value,
}

/// The labels of a derived point (none for a sampled one).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DerivedLabels<'a> {
    pub(crate) keys: &'static [&'static str],
    pub(crate) values: [&'a str; MAX_DERIVED_LABELS],
}

impl<'a> DerivedLabels<'a> {
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&'static str, &'a str)> + '_ {
        self.keys.iter().copied().zip(self.values.iter().copied())
    }
}

/// `hw.status` has one series per state, 1 for the current one: before a `hw.state=ok` series,
/// the `hw.state=failed` one with the opposite value.
fn status_complement<'a>(series: &Series<'a>, f: &mut impl FnMut(Series<'a>)) {
    if series.id == Some(MetricId::DeviceUp) {
        if let Some((key, _)) = series.attribute {
            let up = series.value.as_f64() > 0.0;
            f(Series { attribute: Some((key, FAILED_STATE)), value: Value::Int(u64::from(!up)), ..*series });
        }
    }
}

impl Plan {
    /// Visits every data point `snapshot` produces, in order, `hw.status`'s `failed`
    /// complement included (right before the `ok` series).
    pub(crate) fn walk(&self, snapshot: &Snapshot, cache: &mut AttributeCache, mut f: impl FnMut(Series<'_>)) {
        cache.begin();
        for (index, device) in snapshot.devices.iter().enumerate() {
            let base = cache.device(&snapshot.system, device);
            let identity = cache.identity(&snapshot.system, device);
            // A process's points carry its own owner (consecutive points share one lookup).
            let mut process_base: Option<(u32, Arc<[KeyValue]>)> = None;
            device.visit_points(|p| {
                let d = p.id.descriptor();
                let process = device.process_of(p.id, p.label).flatten();
                if let Some(proc) = process {
                    if process_base.as_ref().is_none_or(|(cached, _)| *cached != proc.pid) {
                        process_base = Some((proc.pid, cache.process(&snapshot.system, device, proc)));
                    }
                }
                let base = match (process, &process_base) {
                    (Some(proc), Some((cached, attrs))) if *cached == proc.pid => attrs,
                    // The device's whole identity, once: on its `hw.status` points.
                    _ if p.id == MetricId::DeviceUp => &identity,
                    _ => &base,
                };
                let series = Series {
                    instrument: self.slot(p.id),
                    device: index,
                    base,
                    id: Some(p.id),
                    attribute: d.otel.attribute,
                    label: match (d.label, p.label) {
                        (Some(label), Some(value)) => Some((label, value)),
                        _ => None,
                    },
                    derived: DerivedLabels::default(),
                    value: p.value,
                };
                status_complement(&series, &mut f);
                f(series);
            });
        }
        // Derived series (findings, …), from the catalogue like the rest: a device-scoped point
        // gets its device's attributes, a point about the host none (the resource names the
        // host), then the descriptor's labels. Host points use the slot after the last device.
        let host_base = cache.host.clone();
        snapshot.visit_derived(|p| {
            let d = p.descriptor;
            // A stage's own series not learnt yet (`Plan::learn` runs before every encode).
            let Some(instrument) = self.slot_of(d) else { return };
            let (device, base) = match p.device.filter(|&i| i < snapshot.devices.len()) {
                Some(i) => (i, cache.device(&snapshot.system, &snapshot.devices[i])),
                None => (snapshot.devices.len(), host_base.clone()),
            };
            let series = Series {
                instrument,
                device,
                base: &base,
                id: p.id(),
                attribute: d.otel.attribute,
                label: None,
                derived: DerivedLabels { keys: d.labels, values: p.labels },
                value: p.value,
            };
            // A sampling-failed snapshot's host-level `hw.status{hw.state=ok} 0` gets its
            // `failed` complement too.
            status_complement(&series, &mut f);
            f(series);
        });
        cache.end();
    }

    /// Turns a snapshot into per-instrument observations (the SDK pipeline).
    pub(crate) fn encode(&self, snapshot: &Snapshot, cache: &mut AttributeCache) -> Encoded {
        let mut by_instrument: Vec<Vec<Observation>> = self.instruments.iter().map(|_| Vec::new()).collect();
        let mut points = 0;
        // The SDK's resource is fixed when its provider is built, before any snapshot says where
        // its data comes from: simulated or replayed data is marked on every point instead (the
        // direct pipeline marks its resource), so that it cannot pass for a GPU's whoever built
        // the provider.
        let mark: Vec<KeyValue> = snapshot
            .system
            .marked_backend()
            .map(|m| KeyValue::new(super::direct::BACKEND_ATTRIBUTE, m.to_owned()))
            .into_iter()
            .chain(
                snapshot
                    .system
                    .marked_recorded_backend()
                    .map(|r| KeyValue::new(super::direct::RECORDED_BACKEND_ATTRIBUTE, r.to_owned())),
            )
            .collect();
        self.walk(snapshot, cache, |series| {
            let mut attributes = Vec::with_capacity(series.base.len() + 4);
            attributes.extend(series.base.iter().cloned());
            attributes.extend(mark.iter().cloned());
            if let Some((k, v)) = series.attribute {
                attributes.push(KeyValue::new(k, v));
            }
            if let Some((label, value)) = series.label {
                let key = label_key(label);
                attributes.push(match value {
                    LabelValue::Int(v) => KeyValue::new(key, i64::try_from(v).unwrap_or(i64::MAX)),
                    LabelValue::Str(v) => KeyValue::new(key, s(v)),
                });
            }
            // An empty value means "no such label" (a run without a rank): no attribute.
            for (label, value) in series.derived.pairs().filter(|(_, v)| !v.is_empty()) {
                attributes.push(KeyValue::new(label_key(label), s(value)));
            }
            by_instrument[series.instrument].push(Observation { value: series.value, attributes });
            points += 1;
        });
        Encoded { by_instrument, points }
    }
}

impl Plan {
    /// Registers one observable instrument per spec from `from` on on `meter`, each reading
    /// `shared`.
    pub(crate) fn register(&self, from: usize, meter: &Meter, shared: &Shared) -> Vec<Registered> {
        self.instruments
            .iter()
            .enumerate()
            .skip(from)
            .map(|(index, spec)| {
                let name = spec.name;
                let unit = spec.unit;
                let description = spec.description.clone();
                macro_rules! observable {
                    ($builder:ident, $variant:ident, $conv:expr) => {{
                        let shared = shared.clone();
                        let conv = $conv;
                        Registered::$variant(
                            meter
                                .$builder(name)
                                .with_unit(unit)
                                .with_description(description)
                                .with_callback(move |observer| {
                                    let encoded = shared.load();
                                    if let Some(list) = encoded.by_instrument.get(index) {
                                        for o in list {
                                            observer.observe(conv(o.value), &o.attributes);
                                        }
                                    }
                                })
                                .build(),
                        )
                    }};
                }
                match spec.shape {
                    Shape::GaugeF64 => observable!(f64_observable_gauge, GaugeF64, Value::as_f64),
                    Shape::GaugeI64 => observable!(i64_observable_gauge, GaugeI64, to_i64),
                    Shape::CounterF64 => observable!(f64_observable_counter, CounterF64, Value::as_f64),
                    Shape::CounterU64 => observable!(u64_observable_counter, CounterU64, to_u64),
                    Shape::UpDownI64 => observable!(i64_observable_up_down_counter, UpDownI64, to_i64),
                }
            })
            .collect()
    }
}

pub(crate) fn to_i64(v: Value) -> i64 {
    match v {
        Value::Int(i) => i64::try_from(i).unwrap_or(i64::MAX),
        // Saturating float-to-int cast; NaN becomes 0.
        Value::Float(f) => f.round() as i64,
    }
}

pub(crate) fn to_u64(v: Value) -> u64 {
    match v {
        Value::Int(i) => i,
        Value::Float(f) => f.round() as u64,
    }
}

/// Keeps an observable instrument (and its callback) alive for as long as the sink lives.
#[allow(dead_code)] // held only for its lifetime
#[derive(Debug)]
pub(crate) enum Registered {
    GaugeF64(opentelemetry::metrics::ObservableGauge<f64>),
    GaugeI64(opentelemetry::metrics::ObservableGauge<i64>),
    CounterF64(opentelemetry::metrics::ObservableCounter<f64>),
    CounterU64(opentelemetry::metrics::ObservableCounter<u64>),
    UpDownI64(opentelemetry::metrics::ObservableUpDownCounter<i64>),
}

/// The complete OTel mapping as a Markdown table (the body of `docs/otlp.md`'s mapping section).
pub fn mapping_markdown() -> String {
    let plan = Plan::new();
    let mut out = String::new();
    out.push_str("| OTel metric | instrument | unit | attributes (besides the GPU set) | gpumon metric | family | description |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for spec in &plan.instruments {
        for &id in &spec.members {
            let d = id.descriptor();
            let mut attrs = Vec::new();
            if let Some((k, v)) = d.otel.attribute {
                attrs.push(format!("`{k}={v}`"));
                if id == MetricId::DeviceUp {
                    attrs.push(format!("(and `{k}={FAILED_STATE}` = 1 − value)"));
                }
            }
            for label in d.label.iter().chain(d.labels) {
                attrs.push(format!("`{}`", label_key(label)));
            }
            let _ = writeln!(
                out,
                "| `{}` | {} | `{}` | {} | `{}` | `{}` | {} |",
                spec.name,
                spec.shape.describe(),
                spec.unit,
                if attrs.is_empty() { "—".to_owned() } else { attrs.join(" ") },
                d.name,
                d.family.name(),
                d.help,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumon_core::{DeviceSample, MigInfo, XidCount};

    #[test]
    fn members_of_one_instrument_agree_on_unit_and_shape() {
        let plan = Plan::new();
        for spec in &plan.instruments {
            for &m in &spec.members {
                assert_eq!(m.descriptor().otel_unit(), spec.unit, "{} / {:?}", spec.name, m);
                assert_eq!(Shape::of(m), spec.shape, "{} / {:?}", spec.name, m);
            }
            if spec.members.len() > 1 {
                // Members must be told apart by the mapping's attribute or by a label.
                let mut keys = std::collections::HashSet::new();
                for &m in &spec.members {
                    let d = m.descriptor();
                    assert!(d.otel.attribute.is_some() || d.label.is_some(), "{} / {:?}", spec.name, m);
                    assert!(keys.insert((d.otel.attribute, d.label)), "{} / {:?} is ambiguous", spec.name, m);
                }
            }
        }
    }

    #[test]
    fn semantic_convention_instruments_have_the_convention_kinds() {
        let plan = Plan::new();
        let shape = |name: &str| plan.instruments.iter().find(|i| i.name == name).map(|i| (i.shape, i.unit));
        assert_eq!(shape("hw.gpu.utilization"), Some((Shape::GaugeF64, "1")));
        assert_eq!(shape("hw.gpu.memory.usage"), Some((Shape::UpDownI64, "By")));
        assert_eq!(shape("hw.gpu.memory.limit"), Some((Shape::UpDownI64, "By")));
        assert_eq!(shape("hw.gpu.memory.utilization"), Some((Shape::GaugeF64, "1")));
        assert_eq!(shape("hw.power"), Some((Shape::GaugeF64, "W")));
        assert_eq!(shape("hw.energy"), Some((Shape::CounterF64, "J")));
        assert_eq!(shape("hw.temperature"), Some((Shape::GaugeF64, "Cel")));
        assert_eq!(shape("hw.errors"), Some((Shape::CounterU64, "{error}")));
        assert_eq!(shape("hw.status"), Some((Shape::UpDownI64, "1")));
    }

    #[test]
    fn encode_attaches_gpu_attributes_labels_and_status_complement() {
        let plan = Plan::new();
        let mut info = DeviceInfo::new(2, "MIG-abc", "NVIDIA A100-SXM4-40GB");
        info.serial = Some("1234".into());
        info.mig = Some(MigInfo::new("GPU-parent", 1, 3, 0));
        let mut gpu = DeviceSample::new(Arc::new(info));
        gpu.utilization.gpu = Some(0.5);
        gpu.utilization.encoder = Some(0.25);
        gpu.xid_errors.push(XidCount::new(79, 3, std::time::UNIX_EPOCH));
        let mut system = SystemInfo::new("h", "mock");
        system.driver_version = Some("570.1".into());
        let snap = Snapshot::new(Arc::new(system), vec![gpu]);
        let enc = plan.encode(&snap, &mut AttributeCache::default());

        let find = |name: &str| &enc.by_instrument[plan.instruments.iter().position(|i| i.name == name).unwrap()];
        let attr = |o: &Observation, k: &str| {
            o.attributes.iter().find(|kv| kv.key.as_str() == k).map(|kv| kv.value.to_string())
        };

        let util = find("hw.gpu.utilization");
        assert_eq!(util.len(), 2);
        assert_eq!(attr(&util[0], "hw.gpu.task").as_deref(), Some("general"));
        assert_eq!(attr(&util[1], "hw.gpu.task").as_deref(), Some("encoder"));
        // Every point names its device (hw.id, hw.name, hw.type) and nothing more of it.
        let o = &util[0];
        assert_eq!(attr(o, "hw.id").as_deref(), Some("MIG-abc"));
        assert_eq!(attr(o, "hw.type").as_deref(), Some("gpu"));
        assert_eq!(attr(o, "hw.name").as_deref(), Some("nvidia2/mig1"));
        for once in ["hw.parent", "hw.model", "hw.serial_number", "hw.driver_version", "hw.vendor", "gpumon.gpu.index"]
        {
            assert_eq!(attr(o, once), None, "{once} on a utilisation point");
        }
        // The whole identity is on the device's hw.status points, once per device.
        for o in find("hw.status") {
            assert_eq!(attr(o, "hw.id").as_deref(), Some("MIG-abc"));
            assert_eq!(attr(o, "hw.parent").as_deref(), Some("GPU-parent"));
            assert_eq!(attr(o, "hw.model").as_deref(), Some("NVIDIA A100-SXM4-40GB"));
            assert_eq!(attr(o, "hw.serial_number").as_deref(), Some("1234"));
            assert_eq!(attr(o, "hw.driver_version").as_deref(), Some("570.1"));
            assert_eq!(attr(o, "hw.vendor").as_deref(), Some("nvidia"));
            assert_eq!(attr(o, "hw.type").as_deref(), Some("gpu"));
            assert_eq!(attr(o, "hw.name").as_deref(), Some("nvidia2/mig1"));
            assert_eq!(attr(o, "gpumon.gpu.index").as_deref(), Some("2"));
        }
        let with_model = enc.by_instrument.iter().flatten().filter(|o| attr(o, "hw.model").is_some()).count();
        assert_eq!(with_model, 2, "the model once per device and state");
        // Simulated data is marked on every point of the SDK pipeline.
        assert!(enc.by_instrument.iter().flatten().all(|o| attr(o, "gpumon.backend").as_deref() == Some("mock")));

        let status = find("hw.status");
        assert_eq!(status.len(), 2);
        let by_state: HashMap<_, _> = status.iter().map(|o| (attr(o, "hw.state").unwrap(), o.value)).collect();
        assert_eq!(by_state["ok"], Value::Int(1));
        assert_eq!(by_state["failed"], Value::Int(0));

        let xid = &find("gpumon.gpu.xid.errors")[0];
        assert_eq!(attr(xid, "gpumon.xid").as_deref(), Some("79"));
        assert_eq!(xid.value, Value::Int(3));
        assert_eq!(enc.points, enc.by_instrument.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn a_failed_sample_reports_the_host_failed_and_no_device() {
        let plan = Plan::new();
        let snap = Snapshot::sampling_failed(Arc::new(SystemInfo::new("h", "nvml")), "NVML unavailable");
        let enc = plan.encode(&snap, &mut AttributeCache::default());
        assert_eq!(enc.points, 2, "{:?}", enc.by_instrument);
        let status = &enc.by_instrument[plan.slot(MetricId::DeviceUp)];
        let by_state: HashMap<String, Value> = status
            .iter()
            .map(|o| {
                // About the host (the resource names it): no device attribute at all.
                assert_eq!(o.attributes.len(), 1, "{:?}", o.attributes);
                (o.attributes[0].value.to_string(), o.value)
            })
            .collect();
        assert_eq!(by_state["ok"], Value::Int(0));
        assert_eq!(by_state["failed"], Value::Int(1));
    }

    #[test]
    fn a_family_that_cannot_be_read_is_one_metric_failure_point() {
        use gpumon_core::{FailureReason, Family};
        let plan = Plan::new();
        let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(1, "GPU-y", "Y")));
        gpu.record_failure(Family::Xid, FailureReason::Other("XID events not monitored".into()));
        gpu.record_failure(Family::Xid, FailureReason::Timeout);
        let snap = Snapshot::new(Arc::new(SystemInfo::default()), vec![gpu]);
        let enc = plan.encode(&snap, &mut AttributeCache::default());
        let index = plan.instruments.iter().position(|i| i.name == "gpumon.gpu.metric_failure").unwrap();
        let failures = &enc.by_instrument[index];
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].value, Value::Int(1));
        let attr =
            |k: &str| failures[0].attributes.iter().find(|kv| kv.key.as_str() == k).map(|kv| kv.value.to_string());
        assert_eq!(attr("gpumon.family").as_deref(), Some("xid"));
        assert_eq!(attr("hw.id").as_deref(), Some("GPU-y"));
    }

    #[test]
    fn lost_device_reports_failed_state_only() {
        let plan = Plan::new();
        let snap = Snapshot::new(
            Arc::new(SystemInfo::default()),
            vec![DeviceSample::lost(Arc::new(DeviceInfo::new(0, "GPU-x", "X")))],
        );
        let enc = plan.encode(&snap, &mut AttributeCache::default());
        assert_eq!(enc.points, 2);
        let status = &enc.by_instrument[plan.slot(MetricId::DeviceUp)];
        let failed = status.iter().find(|o| o.attributes.iter().any(|kv| kv.value.as_str() == "failed")).unwrap();
        assert_eq!(failed.value, Value::Int(1));
    }
}

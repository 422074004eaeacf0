//! The series layer of the Prometheus family: one walk over a [`Snapshot`] (and the agent's
//! [`Telemetry`]) that yields every series as *(name, labels, value)*, in exposition order.
//!
//! Everything that decides **what** is exported lives here, once: metric names in either
//! [`Naming`] (and dcgm's scale), the label sets (device identity, MIG, host, owners, the
//! `backend="mock"` mark), the `gpumon_gpu_info` series, derived series (findings, training
//! steps, attribution failures), the backend-down `gpumon_up 0`, staleness, and the agent's
//! self-metrics. Its consumers only decide **how**:
//!
//! - the exposition renderer ([`render`](super::render)) adds `HELP`/`TYPE`/`UNIT` lines at each
//!   [`Family`] and writes the series as text 0.0.4 or OpenMetrics (the scrape endpoint and the
//!   Pushgateway body);
//! - remote write's encoder (`remote_write::encode`, feature `remote-write`) writes each series
//!   straight into a protobuf `TimeSeries`, without text in between.
//!
//! So what is pushed cannot drift from what a scrape sees, and remote write no longer renders
//! text and parses it back (about 10× the cost of the render itself).
//!
//! The shape comes from metrics-rs (shared/STYLE.md: anchor 1, and "What the second release
//! left", "Series are produced twice"): metrics-exporter-prometheus builds one format-agnostic
//! snapshot of families of (labels, value) that both its text and its protobuf renderers consume
//! (`metrics-rs/metrics:metrics-exporter-prometheus/src/render.rs`, `MetricFamily` / `Metric` /
//! `LabelPair`, read at 198e91b7; `src/protobuf.rs`, `render_protobuf`, consuming the same
//! `common::Snapshot`, read at 00634e4c). Where gpumon differs, and why: that
//! snapshot is materialised (a `String` per label, a `Vec` per series), which a scrape of 64 GPUs
//! would pay in thousands of allocations; here the series are *visited* ([`Visitor`]) with
//! borrowed labels, so a scrape allocates what it did before (a fixed few buffers, none per
//! series or per device; `tests/alloc_steady.rs`), and a device's label set is shared by all
//! its series ([`Scope::Device`]) so the text renderer escapes it once per scrape.

use std::time::{SystemTime, UNIX_EPOCH};

use gpumon_core::attribution::OwnerLabels;
use gpumon_core::{
    AgentStats, Descriptor, DeviceSample, LabelValue, MetricId, PerDescriptor, ProcessSample, Snapshot, Telemetry,
    Value, MAX_DERIVED_LABELS,
};

use super::render::RenderOptions;
use super::Naming;

/// The name of the one info series per answering device.
pub(crate) const INFO: &str = "gpumon_gpu_info";

/// A self-metric: it describes the agent, not a device, so it is not in the device catalogue;
/// [`SELF_METRICS`] is the one place these are named.
pub(crate) struct SelfMetric {
    /// Sample name.
    pub(crate) name: &'static str,
    /// Family name in OpenMetrics (without `_total` for counters).
    pub(crate) family: &'static str,
    /// `gauge` or `counter`.
    pub(crate) kind: &'static str,
    /// OpenMetrics unit.
    pub(crate) unit: Option<&'static str>,
    /// `HELP` text.
    pub(crate) help: &'static str,
}

const fn agent_metric(
    name: &'static str,
    family: &'static str,
    kind: &'static str,
    unit: Option<&'static str>,
    help: &'static str,
) -> SelfMetric {
    SelfMetric { name, family, kind, unit, help }
}

// Indices into SELF_METRICS, named so the walk reads as what it exports.
const LAST_SUCCESS: usize = 0;
const LAST_DURATION: usize = 1;
const LAST_TIMESTAMP: usize = 2;
const SAMPLES: usize = 3;
const SAMPLE_FAILURES: usize = 4;
const SKIPPED_TICKS: usize = 5;
const SINK_EXPORTED: usize = 6;
const SINK_DROPPED: usize = 7;
const SINK_FAILURES: usize = 8;
const SINK_CONSECUTIVE: usize = 9;
const METRIC_FAILURES: usize = 10;

/// The agent's self-metrics, in the order the exposition declares them.
pub(crate) const SELF_METRICS: [SelfMetric; 11] = [
    agent_metric(
        "gpumon_last_sample_success",
        "gpumon_last_sample_success",
        "gauge",
        None,
        "Whether the agent's last sample succeeded (1) or failed (0).",
    ),
    agent_metric(
        "gpumon_last_sample_duration_seconds",
        "gpumon_last_sample_duration_seconds",
        "gauge",
        Some("seconds"),
        "How long the last sample took.",
    ),
    agent_metric(
        "gpumon_last_sample_timestamp_seconds",
        "gpumon_last_sample_timestamp_seconds",
        "gauge",
        Some("seconds"),
        "Unix time of the last successful sample.",
    ),
    agent_metric("gpumon_samples_total", "gpumon_samples", "counter", None, "Samples that produced a snapshot."),
    agent_metric(
        "gpumon_sample_failures_total",
        "gpumon_sample_failures",
        "counter",
        None,
        "Samples that failed (backend error, timeout, panic).",
    ),
    agent_metric(
        "gpumon_skipped_ticks_total",
        "gpumon_skipped_ticks",
        "counter",
        None,
        "Ticks skipped because the previous sample was still running.",
    ),
    agent_metric("gpumon_sink_exported_total", "gpumon_sink_exported", "counter", None, "Snapshots a sink exported."),
    agent_metric(
        "gpumon_sink_dropped_total",
        "gpumon_sink_dropped",
        "counter",
        None,
        "Snapshots a sink lost because its queue was full.",
    ),
    agent_metric(
        "gpumon_sink_failures_total",
        "gpumon_sink_failures",
        "counter",
        None,
        "Sink calls that failed or timed out.",
    ),
    agent_metric(
        "gpumon_sink_consecutive_failures",
        "gpumon_sink_consecutive_failures",
        "gauge",
        None,
        "Sink failures since its last success.",
    ),
    agent_metric(
        "gpumon_last_sample_metric_failures",
        "gpumon_last_sample_metric_failures",
        "gauge",
        None,
        "Metric families that could not be read at the last successful sample, one per GPU and family (gpumon_metric_failure says which).",
    ),
];

/// The sample name of series `d` in `naming`, and the factor its values are
/// multiplied by (dcgm-exporter's units differ from the catalogue's base units for a few).
pub(crate) fn metric_name(d: &'static Descriptor, naming: Naming) -> (&'static str, f64) {
    // Native names, computed once per series (`prometheus_name` builds a `String`).
    static NATIVE: PerDescriptor<String> = PerDescriptor::new(Descriptor::prometheus_name);
    match (naming, d.dcgm) {
        (Naming::Dcgm, Some(dcgm)) => (dcgm.name, dcgm.scale),
        _ => (NATIVE.get(d).as_str(), 1.0),
    }
}

/// A label value as the walk yields it. Numbers stay numbers, so that neither consumer has to
/// allocate to print a GPU index or a pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Text<'a> {
    /// Text as is (unescaped).
    Str(&'a str),
    /// A number, written in decimal.
    Int(u64),
    /// A fixed prefix and a number in decimal: dcgm's `device="nvidia0"`.
    Prefixed(&'static str, u64),
}

impl<'a> From<LabelValue<'a>> for Text<'a> {
    fn from(v: LabelValue<'a>) -> Self {
        match v {
            LabelValue::Int(i) => Text::Int(i),
            LabelValue::Str(s) => Text::Str(s),
        }
    }
}

#[cfg_attr(not(feature = "remote-write"), allow(dead_code))]
impl Text<'_> {
    /// Whether the value is empty (which Prometheus reads as "no such label").
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Text::Str(s) if s.is_empty())
    }

    /// The value as two pieces of text that are written one after the other; `digits` holds
    /// the decimal form of a number.
    pub(crate) fn parts<'b>(&'b self, digits: &'b mut itoa::Buffer) -> (&'b str, &'b str) {
        match *self {
            Text::Str(s) => (s, ""),
            Text::Int(i) => ("", digits.format(i)),
            Text::Prefixed(p, i) => (p, digits.format(i)),
        }
    }
}

/// One label: its name and its value.
pub(crate) type Label<'a> = (&'a str, Text<'a>);

/// Whose owner labels follow a device's identity labels.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Owners<'a> {
    /// The device's own (its owners merged): every series about the device.
    Device,
    /// A process's (none when the device does not list the pid): a per-process series.
    Process(OwnerLabels<'a>),
}

/// Where a series' leading labels come from. Kept symbolic, rather than expanded into a list,
/// so that consumers can share the work per device: the text renderer escapes each device's
/// labels once per scrape, not once per series.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scope<'a> {
    /// Device `index` of the snapshot: its identity labels, then `owners`.
    Device {
        /// Index into [`Snapshot::devices`].
        index: usize,
        /// Whose owner labels follow.
        owners: Owners<'a>,
    },
    /// About the host or the agent: the host label (when [`RenderOptions::host_label`]) and the
    /// mock mark, from the latest snapshot; nothing before the first snapshot.
    Host,
}

/// A series family starts: every series until the next call belongs to it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Family {
    /// A metric: a catalogue metric's or a stage's own series.
    Metric(&'static Descriptor),
    /// [`INFO`].
    Info,
    /// A self-metric: an index into [`SELF_METRICS`].
    Agent(usize),
}

impl PartialEq for Family {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Family::Metric(a), Family::Metric(b)) => same(a, b),
            (Family::Info, Family::Info) => true,
            (Family::Agent(a), Family::Agent(b)) => a == b,
            _ => false,
        }
    }
}

/// One series: `name{scope labels, extra labels} value`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Series<'a> {
    /// The sample name.
    pub(crate) name: &'static str,
    /// The leading labels (see [`Walk::labels`] for the whole set).
    pub(crate) scope: Scope<'a>,
    /// The labels after the scope's, in order.
    pub(crate) extra: &'a [Label<'a>],
    /// The value, scaled. An `Int` is exact (written without a fraction in text); self-metrics
    /// are `Float`, as the exposition has always written them.
    pub(crate) value: Value,
}

/// What the walk calls, in exposition order.
pub(crate) trait Visitor {
    /// A family starts.
    fn family(&mut self, family: Family);
    /// One series of the current family. `walk` expands its labels ([`Walk::labels`]).
    fn series(&mut self, walk: &Walk<'_>, series: &Series<'_>);
}

/// The context of one walk: what a [`Scope`] refers to.
#[derive(Debug)]
pub(crate) struct Walk<'a> {
    snapshot: Option<&'a Snapshot>,
    opts: &'a RenderOptions,
}

impl<'a> Walk<'a> {
    /// How many devices a [`Scope::Device`] may refer to.
    pub(crate) fn device_count(&self) -> usize {
        self.snapshot.map_or(0, |s| s.devices.len())
    }

    /// Whether any device has owners (attribution is on): their labels make a device's label
    /// set about twice as long.
    pub(crate) fn has_owners(&self) -> bool {
        self.snapshot.is_some_and(|s| s.devices.iter().any(|d| !d.owners.is_empty()))
    }

    /// The merged owner labels of device `index` ([`Owners::Device`]).
    pub(crate) fn device_owners(&self, index: usize) -> OwnerLabels<'a> {
        self.snapshot.map(|s| s.devices[index].owner_labels()).unwrap_or_default()
    }

    /// Every label of `series`, in exposition order.
    pub(crate) fn labels<'s>(&'s self, series: &Series<'s>, mut f: impl FnMut(Label<'s>)) {
        match series.scope {
            Scope::Device { index, owners } => {
                self.device_labels(index, &mut f);
                let owners = match owners {
                    Owners::Device => self.device_owners(index),
                    Owners::Process(labels) => labels,
                };
                self.owner_labels(owners, &mut f);
            }
            Scope::Host => self.host_labels(&mut f),
        }
        series.extra.iter().for_each(|l| f(*l));
    }

    /// The identity labels every series of device `index` starts with.
    pub(crate) fn device_labels<'s>(&'s self, index: usize, mut f: impl FnMut(Label<'s>)) {
        let Some(snapshot) = self.snapshot else { return };
        let system = &*snapshot.system;
        let info = &*snapshot.devices[index].info;
        let host = self.opts.host_label.then_some((self.host_key(), Text::Str(&system.hostname)));
        match self.opts.naming {
            Naming::Native => {
                f(("gpu", Text::Int(u64::from(info.index))));
                f(("uuid", Text::Str(&info.uuid)));
                if let Some(mig) = &info.mig {
                    f(("gpu_instance_id", Text::Int(u64::from(mig.gpu_instance_id))));
                    if let Some(profile) = &mig.profile {
                        f(("mig_profile", Text::Str(profile)));
                    }
                }
                if let Some(host) = host {
                    f(host);
                }
            }
            Naming::Dcgm => {
                // dcgm-exporter's label set and order (rendermetrics/render_metrics.go). For a
                // MIG instance `UUID` is the parent GPU's, told apart by GPU_I_ID.
                f(("gpu", Text::Int(u64::from(info.index))));
                let uuid = info.mig.as_ref().map_or(info.uuid.as_str(), |m| m.parent_uuid.as_str());
                f(("UUID", Text::Str(uuid)));
                if let Some(bus) = &info.pci_bus_id {
                    f(("pci_bus_id", Text::Str(bus)));
                }
                // `DeviceInfo::device_node`, without its String.
                f(("device", Text::Prefixed("nvidia", u64::from(info.index))));
                f(("modelName", Text::Str(&info.name)));
                if let Some(mig) = &info.mig {
                    if let Some(profile) = &mig.profile {
                        f(("GPU_I_PROFILE", Text::Str(profile)));
                    }
                    f(("GPU_I_ID", Text::Int(u64::from(mig.gpu_instance_id))));
                }
                if let Some(host) = host {
                    f(host);
                }
                if let Some(driver) = &system.driver_version {
                    f(("DCGM_FI_DRIVER_VERSION", Text::Str(driver)));
                }
            }
        }
        self.mock_label(&mut f);
    }

    /// The owner labels ([`gpumon_core::attribution`]) after a device's identity: `namespace`,
    /// `pod`, `container`, `user` in native naming; in dcgm naming dcgm-exporter's pod labels
    /// `namespace`, `pod`, `container` only (dcgm-exporter has no user label). Absent labels are
    /// not written.
    pub(crate) fn owner_labels<'o>(&self, labels: OwnerLabels<'o>, mut f: impl FnMut(Label<'o>)) {
        for (key, value) in labels.pairs() {
            if self.opts.naming == Naming::Dcgm && key == "user" {
                continue;
            }
            f((key, Text::Str(value)));
        }
    }

    /// The labels of a series about the host or the agent.
    fn host_labels<'s>(&'s self, mut f: impl FnMut(Label<'s>)) {
        let Some(snapshot) = self.snapshot else { return };
        if self.opts.host_label {
            f((self.host_key(), Text::Str(&snapshot.system.hostname)));
        }
        self.mock_label(f);
    }

    /// `backend="mock"` on every series of simulated data and `backend="replay"` on every series
    /// of a replayed trace (`SystemInfo::marked_backend`), so that neither can pass for a live
    /// GPU's in a query or on a dashboard; live (NVML) series carry no such label. A replay
    /// also says what recorded it (`recorded_backend="mock"`: simulated when recorded).
    fn mock_label<'s>(&'s self, mut f: impl FnMut(Label<'s>)) {
        if let Some(mark) = self.snapshot.and_then(|s| s.system.marked_backend()) {
            f(("backend", Text::Str(mark)));
        }
        if let Some(recorded) = self.snapshot.and_then(|s| s.system.marked_recorded_backend()) {
            f(("recorded_backend", Text::Str(recorded)));
        }
    }

    fn host_key(&self) -> &'static str {
        match (self.opts.naming, self.opts.dcgm_lowercase_hostname) {
            (Naming::Native, _) => "host",
            (Naming::Dcgm, false) => "Hostname",
            (Naming::Dcgm, true) => "hostname",
        }
    }

    /// The backend-down `gpumon_up 0`: about the host, no device labels.
    fn down(&self) -> Series<'static> {
        Series {
            name: metric_name(MetricId::DeviceUp.descriptor(), self.opts.naming).0,
            scope: Scope::Host,
            extra: &[],
            value: Value::Int(0),
        }
    }
}

/// Visits every series the scrape endpoint shows for `snapshot` and `telemetry` under `opts`,
/// in exposition order (see the [module docs](self)).
pub(crate) fn walk(
    snapshot: Option<&Snapshot>,
    telemetry: Option<&Telemetry>,
    opts: &RenderOptions,
    visitor: &mut impl Visitor,
) {
    let w = Walk { snapshot, opts };
    let fresh = snapshot.filter(|s| match opts.stale_after {
        Some(max) => SystemTime::now().duration_since(s.taken_at).map_or(true, |age| age <= max),
        None => true,
    });
    let stats = telemetry.map(Telemetry::stats);
    // The backend itself is down (NVML not loaded, sampling failing): a `gpumon_up 0` without
    // device labels, in the same family as the devices' `gpumon_up`, so that one alert on
    // `gpumon_up == 0` covers a lost GPU and a node whose GPUs cannot be read at all.
    let backend_down = stats.as_ref().is_some_and(|st| !st.last_sample_ok && st.sample_failures > 0)
        || fresh.is_some_and(|s| !s.sampling.is_ok());
    match fresh {
        Some(snap) if !snap.devices.is_empty() => devices(&w, snap, backend_down, visitor),
        _ if backend_down => {
            visitor.family(Family::Metric(MetricId::DeviceUp.descriptor()));
            visitor.series(&w, &w.down());
        }
        _ => {}
    }
    agent(&w, stats.as_ref(), visitor);
}

#[derive(Clone, Copy)]
struct Entry<'a> {
    id: MetricId,
    device: u32,
    value: Value,
    label: Option<LabelValue<'a>>,
}

/// `value` times `scale`, kept an exact integer when there is nothing to scale.
fn scaled(value: Value, scale: f64) -> Value {
    match value {
        Value::Int(v) if scale == 1.0 => Value::Int(v),
        v => Value::Float(v.as_f64() * scale),
    }
}

/// The info series, then every device family; the backend-down line (when `down`) joins the
/// `gpumon_up` family, which every device has; then the derived families.
fn devices(w: &Walk<'_>, snap: &Snapshot, down: bool, v: &mut impl Visitor) {
    info(w, snap, v);

    // All points, then a counting sort by metric so every family is contiguous (both formats
    // require it); the order within a family (device, then label) is kept.
    let mut entries: Vec<Entry<'_>> = Vec::with_capacity(snap.devices.len() * 64);
    let mut counts = vec![0u32; MetricId::ALL.len()];
    for (i, dev) in snap.devices.iter().enumerate() {
        let device = i as u32;
        dev.visit_points(|p| {
            counts[p.id as usize] += 1;
            entries.push(Entry { id: p.id, device, value: p.value, label: p.label });
        });
    }
    let mut next = Vec::with_capacity(counts.len());
    let mut acc = 0;
    for c in &counts {
        next.push(acc);
        acc += c;
    }
    let mut order = vec![0u32; entries.len()];
    for (i, e) in entries.iter().enumerate() {
        let slot = &mut next[e.id as usize];
        order[*slot as usize] = i as u32;
        *slot += 1;
    }

    let mut k = 0;
    while k < order.len() {
        let id = entries[order[k] as usize].id;
        let n = counts[id as usize] as usize;
        let (name, scale) = metric_name(id.descriptor(), w.opts.naming);
        v.family(Family::Metric(id.descriptor()));
        let label_key = id.descriptor().label;
        for &idx in &order[k..k + n] {
            let e = &entries[idx as usize];
            let index = e.device as usize;
            // A process's series: the device's identity, then its process's own owner.
            let owners = match snap.devices[index].process_of(e.id, e.label) {
                Some(process) => Owners::Process(process.map(ProcessSample::owner_labels).unwrap_or_default()),
                None => Owners::Device,
            };
            let own: [Label<'_>; 1];
            let extra: &[Label<'_>] = match (label_key, e.label) {
                (Some(key), Some(value)) => {
                    own = [(key, value.into())];
                    &own
                }
                _ => &[],
            };
            let series = Series { name, scope: Scope::Device { index, owners }, extra, value: scaled(e.value, scale) };
            v.series(w, &series);
        }
        if id == MetricId::DeviceUp && down {
            v.series(w, &w.down());
        }
        k += n;
    }

    derived(w, snap, v);
}

/// Derived series (findings, training steps, attribution failures), after the device families,
/// exported from the catalogue like every other metric: a device-scoped point gets its device's
/// label set, a point about the host (host scope, or a host-level finding) only the host's; then
/// the descriptor's own labels. Nothing here knows which metric it yields.
///
/// Points are not collected: one pass lists the series present, then one pass per series yields
/// that family contiguously. With no stage's data attached nothing is allocated.
fn derived(w: &Walk<'_>, snap: &Snapshot, v: &mut impl Visitor) {
    // The series present, in first-seen order (a stage's own series included): empty, and so
    // never allocated, while no stage attached data.
    let mut present: Vec<&'static Descriptor> = Vec::new();
    snap.derived_descriptors(&mut present);
    // A sampling-failed snapshot's `up 0` is the walk's backend-down series, which joins the
    // devices' `gpumon_up` family; a second family of that name would be invalid.
    present.retain(|d| d.id != Some(MetricId::DeviceUp));
    for descriptor in present {
        let (name, scale) = metric_name(descriptor, w.opts.naming);
        v.family(Family::Metric(descriptor));
        snap.visit_derived(|p| {
            if !same(p.descriptor, descriptor) {
                return;
            }
            let scope = match p.device {
                Some(index) => Scope::Device { index, owners: Owners::Device },
                None => Scope::Host,
            };
            let mut extra = [("", Text::Str("")); MAX_DERIVED_LABELS];
            let mut n = 0;
            // An empty value means "no such label" (a run without a rank); Prometheus treats an
            // empty label as an absent one anyway, so leave it out.
            for (key, value) in p.label_pairs().filter(|(_, v)| !v.is_empty()) {
                extra[n] = (key, Text::Str(value));
                n += 1;
            }
            v.series(w, &Series { name, scope, extra: &extra[..n], value: scaled(p.value, scale) });
        });
    }
}

/// Whether two descriptors are the same series (one `static`, or two of one name).
pub(crate) fn same(a: &Descriptor, b: &Descriptor) -> bool {
    std::ptr::eq(a, b) || a.name == b.name
}

fn text(s: Option<&str>) -> Option<Text<'_>> {
    s.map(Text::Str)
}

/// `gpumon_gpu_info{…} 1`: one series per answering device, with the facts that do not belong
/// on every series.
fn info(w: &Walk<'_>, snap: &Snapshot, v: &mut impl Visitor) {
    if !snap.devices.iter().any(DeviceSample::is_up) {
        return;
    }
    v.family(Family::Info);
    let system = &*snap.system;
    let cuda = system.cuda_version();
    for (index, dev) in snap.devices.iter().enumerate() {
        if !dev.is_up() {
            continue;
        }
        let info = &*dev.info;
        let mut extra: [Label<'_>; 12] = [("", Text::Str("")); 12];
        let mut n = 0;
        let mut opt = |key, value| {
            if let Some(value) = value {
                extra[n] = (key, value);
                n += 1;
            }
        };
        match w.opts.naming {
            Naming::Native => {
                opt("name", Some(Text::Str(&info.name)));
                opt("pci_bus_id", text(info.pci_bus_id.as_deref()));
                opt("driver_version", text(system.driver_version.as_deref()));
            }
            Naming::Dcgm => opt("uuid", Some(Text::Str(&info.uuid))),
        }
        opt("serial", text(info.serial.as_deref()));
        opt("architecture", text(info.architecture.as_deref()));
        opt("cuda_version", text(cuda.as_deref()));
        opt("nvml_version", text(system.nvml_version.as_deref()));
        // Simulated and replayed data already carry `backend` on every series (the mark).
        if system.marked_backend().is_none() && !system.backend.is_empty() {
            opt("backend", Some(Text::Str(&system.backend)));
        }
        if let Some(mig) = &info.mig {
            opt("parent_uuid", Some(Text::Str(&mig.parent_uuid)));
            opt("compute_instance_id", Some(Text::Int(u64::from(mig.compute_instance_id))));
        }
        if !w.opts.host_label {
            opt("host", Some(Text::Str(&system.hostname)));
        }
        let series = Series {
            name: INFO,
            scope: Scope::Device { index, owners: Owners::Device },
            extra: &extra[..n],
            value: Value::Int(1),
        };
        v.series(w, &series);
    }
}

/// The agent's self-metrics: from its telemetry when attached; without an agent (an embedder
/// feeding snapshots itself) what the snapshot says (a sampling-failed one took no sample to
/// time).
fn agent<V: Visitor>(w: &Walk<'_>, stats: Option<&AgentStats>, v: &mut V) {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    fn series<'a>(i: usize, extra: &'a [Label<'a>], value: f64) -> Series<'a> {
        Series { name: SELF_METRICS[i].name, scope: Scope::Host, extra, value: Value::Float(value) }
    }
    let one = |v: &mut V, i: usize, value: f64| {
        v.family(Family::Agent(i));
        v.series(w, &series(i, &[], value));
    };
    match stats {
        Some(st) => {
            one(v, LAST_SUCCESS, if st.last_sample_ok { 1.0 } else { 0.0 });
            one(v, LAST_DURATION, st.last_sample_duration.as_secs_f64());
            if let Some(t) = st.last_sample_time {
                one(v, LAST_TIMESTAMP, secs(t));
            }
            for (i, n) in [
                (SAMPLES, st.samples_taken),
                (SAMPLE_FAILURES, st.sample_failures),
                (SKIPPED_TICKS, st.skipped_ticks),
                (METRIC_FAILURES, st.metric_failures),
            ] {
                one(v, i, n as f64);
            }
            if !st.sinks.is_empty() {
                type Get = fn(&gpumon_core::SinkStatus) -> u64;
                let per_sink: [(usize, Get); 4] = [
                    (SINK_EXPORTED, |s| s.exported),
                    (SINK_DROPPED, |s| s.dropped),
                    (SINK_FAILURES, |s| s.failures),
                    (SINK_CONSECUTIVE, |s| s.consecutive_failures),
                ];
                for (i, get) in per_sink {
                    v.family(Family::Agent(i));
                    for s in &st.sinks {
                        v.series(w, &series(i, &[("sink", Text::Str(&s.name))], get(s) as f64));
                    }
                }
            }
        }
        None => {
            if let Some(s) = w.snapshot.filter(|s| s.sampling.is_ok()) {
                one(v, LAST_DURATION, s.duration.as_secs_f64());
                one(v, LAST_TIMESTAMP, secs(s.taken_at));
            }
        }
    }
}

//! Snapshot → line protocol (see the schema in the module docs of [`crate::influxdb`]).

use std::fmt::Write as _;
use std::sync::OnceLock;

use gpumon_core::attribution::OwnerLabels;
use gpumon_core::stages::{EventField, EventValue};
use gpumon_core::{Descriptor, DeviceInfo, DeviceSample, Family, LabelValue, MetricId, Scope, Snapshot, Value};

use super::escape::{write_field_key, write_measurement, write_string_field, write_tag};

/// The default base measurement.
pub const DEFAULT_MEASUREMENT: &str = "gpu";

/// How much one call wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Encoded {
    /// Lines, i.e. InfluxDB points (one per measurement, tag set and timestamp).
    pub lines: usize,
    /// Field values over all lines.
    pub fields: usize,
}

impl std::ops::AddAssign for Encoded {
    fn add_assign(&mut self, rhs: Self) {
        self.lines += rhs.lines;
        self.fields += rhs.fields;
    }
}

/// Encodes snapshots as InfluxDB line protocol with nanosecond timestamps.
///
/// Names are computed (and escaped) once, when the encoder is built: the base measurement, one
/// measurement per labelled family (`<base>_<family>`, e.g. `gpu_xid`), and one field key per
/// metric (the catalogue's [`Descriptor::name`](gpumon_core::Descriptor::name)). Encoding then
/// allocates nothing beyond growing the output string.
#[derive(Clone, Debug)]
pub struct LineProtocolEncoder {
    base: String,
    /// Escaped `<base>` (index 0 unused) or `<base>_<family>` per [`MetricId`], by id.
    measurements: Vec<String>,
    /// Escaped field key per [`MetricId`], by id.
    field_keys: Vec<String>,
    /// Escaped tag key of the labelled metrics, by id (empty when unlabelled).
    label_keys: Vec<String>,
    /// Pre-escaped `,key=value` pairs added to every line.
    extra_tags: String,
}

impl Default for LineProtocolEncoder {
    fn default() -> Self {
        Self::new(DEFAULT_MEASUREMENT)
    }
}

impl LineProtocolEncoder {
    /// An encoder writing the main measurement `measurement` (labelled families go to
    /// `<measurement>_<family>`). The name is escaped, never rejected; the sink's configuration
    /// checks it is not empty and does not start with `#`.
    pub fn new(measurement: &str) -> Self {
        let mut measurements = Vec::with_capacity(MetricId::ALL.len());
        let mut field_keys = Vec::with_capacity(MetricId::ALL.len());
        let mut label_keys = Vec::with_capacity(MetricId::ALL.len());
        for id in MetricId::ALL {
            let d = id.descriptor();
            let mut m = String::new();
            let mut l = String::new();
            // Labelled and derived metrics (several labels, or not one line per device) get
            // their family's measurement, like the labelled sampled families.
            let derived = !d.labels.is_empty() || d.scope != Scope::Device;
            match d.label {
                Some(label) => {
                    write_measurement(&mut m, &Self::family_measurement_name(measurement, d.family));
                    write_tag(&mut l, label);
                }
                None if derived => write_measurement(&mut m, &Self::family_measurement_name(measurement, d.family)),
                None => write_measurement(&mut m, measurement),
            }
            measurements.push(m);
            label_keys.push(l);
            let mut k = String::new();
            write_field_key(&mut k, d.name);
            field_keys.push(k);
        }
        Self { base: measurement.to_owned(), measurements, field_keys, label_keys, extra_tags: String::new() }
    }

    /// The measurement events named `event` are written to: `<base>_<event>` (`gpu_finding`,
    /// `gpu_step`; see [`Snapshot::visit_events`]).
    pub fn event_measurement_name(base: &str, event: &str) -> String {
        format!("{base}_{event}")
    }

    /// Adds a tag to every line (e.g. `cluster=eu-1`). Empty values are ignored (line protocol has
    /// no empty tag values).
    #[must_use]
    pub fn with_tag(mut self, key: &str, value: &str) -> Self {
        if !key.is_empty() && !value.is_empty() {
            self.extra_tags.push(',');
            write_tag(&mut self.extra_tags, key);
            self.extra_tags.push('=');
            write_tag(&mut self.extra_tags, value);
        }
        self
    }

    /// The main measurement's name (unescaped).
    pub fn measurement(&self) -> &str {
        &self.base
    }

    /// The measurement a labelled family is written to: `<base>_<family name>`. Each clocks-event
    /// reason's series (`clock_events_by_reason`, split from `clock_events` when it became opt-in)
    /// keep their measurement, `<base>_clock_events`.
    pub fn family_measurement_name(base: &str, family: Family) -> String {
        let family = match family {
            Family::ClockEventsByReason => Family::ClockEvents,
            other => other,
        };
        format!("{base}_{}", family.name())
    }

    /// Appends every device of `snapshot`, then its derived series and finding events; returns
    /// how many lines and fields were written.
    pub fn encode_snapshot(&self, snapshot: &Snapshot, out: &mut String) -> Encoded {
        let ts = snapshot.timestamp_nanos();
        let mut total = Encoded::default();
        // Simulated and replayed data carry `backend=mock` / `backend=replay` on every point so
        // that they cannot pass for a live GPU's; live data has no such tag (series stay as
        // they were).
        let mark = Mark::of(&snapshot.system);
        for device in &snapshot.devices {
            total += self.encode_device_inner(&snapshot.system.hostname, mark, ts, device, out);
        }
        total += self.encode_derived(snapshot, out);
        total += self.encode_events(snapshot, out);
        total
    }

    /// Appends one line per derived point ([`Snapshot::visit_derived`]), from its descriptor:
    /// the family's measurement (`<base>_diagnosis`; `<base>_derived` for a stage's own
    /// series), the device's tags (or, for a point about the host, only `host`), the
    /// descriptor's labels as tags, and one field named after the series.
    pub fn encode_derived(&self, snapshot: &Snapshot, out: &mut String) -> Encoded {
        let ts = i64::try_from(snapshot.timestamp_nanos()).unwrap_or(i64::MAX);
        let host = snapshot.system.hostname.as_str();
        let mark = Mark::of(&snapshot.system);
        let mut encoded = Encoded::default();
        snapshot.visit_derived(|p| {
            let start = out.len();
            let d = p.descriptor;
            match p.id() {
                Some(id) => out.push_str(&self.measurements[id as usize]),
                // A stage's own series: its family's measurement, escaped piece by piece
                // (escaping is per character) so that nothing is allocated.
                None => {
                    write_measurement(out, &self.base);
                    out.push('_');
                    write_measurement(out, d.family.name());
                }
            }
            self.write_about(out, snapshot, host, mark, p.device);
            for (key, value) in p.label_pairs() {
                if !value.is_empty() {
                    out.push(',');
                    write_tag(out, key);
                    out.push('=');
                    write_tag(out, value);
                }
            }
            out.push(' ');
            let fields = usize::from(self.write_field(out, d, p.value, true));
            finish_line(out, start, fields, ts, &mut encoded);
        });
        encoded
    }

    /// Appends one point per event of this snapshot ([`Snapshot::visit_events`]) to
    /// `<base>_<event>` (`gpu_finding`, `gpu_step`): the device's tags (or the host's), the
    /// event's tags, its fields (strings kept to one line); an event with per-device rows gets
    /// one point per row instead, with the row's device tags and fields added.
    pub fn encode_events(&self, snapshot: &Snapshot, out: &mut String) -> Encoded {
        let host = snapshot.system.hostname.as_str();
        let mark = Mark::of(&snapshot.system);
        let mut encoded = Encoded::default();
        snapshot.visit_events(|event| {
            let ts = event
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
            let mut line = |out: &mut String, device: Option<usize>, more: &[EventField<'_>]| {
                let start = out.len();
                write_measurement(out, &self.base);
                out.push('_');
                write_measurement(out, event.name);
                self.write_about(out, snapshot, host, mark, device);
                for (key, value) in event.tags.iter().filter(|(_, v)| !v.is_empty()) {
                    out.push(',');
                    write_tag(out, key);
                    out.push('=');
                    write_tag(out, value);
                }
                out.push(' ');
                let mut fields = 0;
                for (key, value) in event.fields.iter().chain(more) {
                    fields += usize::from(write_event_field(out, key, *value, fields == 0));
                }
                finish_line(out, start, fields, ts, &mut encoded);
            };
            let mut rows = 0;
            (event.rows)(&mut |row| {
                rows += 1;
                if row.device < snapshot.devices.len() {
                    line(out, Some(row.device), row.fields);
                }
            });
            if rows == 0 {
                line(out, event.device, &[]);
            }
        });
        encoded
    }

    /// The tags of a point about `device` of `snapshot` (its identity and owners), or about the
    /// host when `None`; each followed by the extra tags.
    fn write_about(&self, out: &mut String, snapshot: &Snapshot, host: &str, mark: Mark<'_>, device: Option<usize>) {
        match device.and_then(|i| snapshot.devices.get(i)) {
            Some(device) => self.write_device_tags(out, host, mark, &device.info, device.owner_labels()),
            None => self.write_host_tags(out, host, mark),
        }
    }

    /// Appends one device's lines at `timestamp_nanos`, tagged with `host`. Unlike
    /// [`LineProtocolEncoder::encode_snapshot`] it knows nothing of the backend, so it never
    /// writes the `backend=mock` (or `replay`) tag.
    pub fn encode_device(&self, host: &str, timestamp_nanos: u64, device: &DeviceSample, out: &mut String) -> Encoded {
        self.encode_device_inner(host, Mark::NONE, timestamp_nanos, device, out)
    }

    fn encode_device_inner(
        &self,
        host: &str,
        mark: Mark<'_>,
        timestamp_nanos: u64,
        device: &DeviceSample,
        out: &mut String,
    ) -> Encoded {
        let mut encoded = Encoded::default();
        let ts = i64::try_from(timestamp_nanos).unwrap_or(i64::MAX);

        // Pass 1: every unlabelled value on one wide line.
        let owners = device.owner_labels();
        let start = out.len();
        out.push_str(&self.measurements[MetricId::DeviceUp as usize]);
        let tags_start = out.len();
        self.write_device_tags(out, host, mark, &device.info, owners);
        let tags_end = out.len();
        out.push(' ');
        let mut fields = 0;
        device.visit_points(|p| {
            if p.label.is_none() && self.write_field(out, p.id.descriptor(), p.value, fields == 0) {
                fields += 1;
            }
        });
        finish_line(out, start, fields, ts, &mut encoded);
        // Every labelled line but a process's carries the same tags: escaped once, above, and
        // copied from that line (an H100 has 18 NVLink lines, each with the GPU's name and UUID)
        // — while the line is there: a line without fields is taken back out.
        let device_tags = (fields > 0).then_some(tags_start..tags_end);

        // Pass 2: labelled values, one line per (family, label value). `visit_points` yields the
        // values of one label consecutively.
        let mut current: Option<(Family, LabelValue<'_>)> = None;
        let mut line_start = out.len();
        let mut fields = 0;
        device.visit_points(|p| {
            let Some(label) = p.label else { return };
            let key = (p.id.family(), label);
            if current != Some(key) {
                if current.is_some() {
                    finish_line(out, line_start, fields, ts, &mut encoded);
                }
                current = Some(key);
                fields = 0;
                line_start = out.len();
                out.push_str(&self.measurements[p.id as usize]);
                // A process's line carries its own owner; every other line the device's.
                match &device_tags {
                    Some(tags) if key.0 != Family::Processes => out.extend_from_within(tags.clone()),
                    _ => {
                        let owners = if key.0 == Family::Processes { device.point_owner_labels(&p) } else { owners };
                        self.write_device_tags(out, host, mark, &device.info, owners);
                    }
                }
                out.push(',');
                out.push_str(&self.label_keys[p.id as usize]);
                out.push('=');
                match label {
                    LabelValue::Int(v) => {
                        let _ = write!(out, "{v}");
                    }
                    LabelValue::Str("") => out.push('-'),
                    LabelValue::Str(s) => write_tag(out, s),
                }
                out.push(' ');
            }
            if self.write_field(out, p.id.descriptor(), p.value, fields == 0) {
                fields += 1;
            }
        });
        if current.is_some() {
            finish_line(out, line_start, fields, ts, &mut encoded);
        }
        encoded
    }

    /// `,backend=mock,container=…,gpu=…,host=…,mig=…,mig_ci=…,mig_gi=…,mig_profile=…,name=…,
    /// namespace=…,pod=…,recorded_backend=…,user=…,uuid=…` (keys in sorted order, which InfluxDB indexes fastest;
    /// `backend` only for simulated or replayed data (`SystemInfo::marked_backend`); the owner tags `container`, `namespace`, `pod`, `user`
    /// only with attribution on), then the extra tags. Empty values are left out.
    fn write_device_tags(
        &self,
        out: &mut String,
        host: &str,
        mark: Mark<'_>,
        info: &DeviceInfo,
        owners: OwnerLabels<'_>,
    ) {
        let tag = |out: &mut String, key: &str, value: Option<&str>| {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                out.push(',');
                out.push_str(key);
                out.push('=');
                write_tag(out, v);
            }
        };
        write_mark(out, mark);
        tag(out, "container", owners.container);
        let _ = write!(out, ",gpu={}", info.index);
        if !host.is_empty() {
            out.push_str(",host=");
            write_tag(out, host);
        }
        if let Some(mig) = &info.mig {
            let _ =
                write!(out, ",mig={},mig_ci={},mig_gi={}", mig.mig_index, mig.compute_instance_id, mig.gpu_instance_id);
            if let Some(profile) = mig.profile.as_deref().filter(|p| !p.is_empty()) {
                out.push_str(",mig_profile=");
                write_tag(out, profile);
            }
        }
        if !info.name.is_empty() {
            out.push_str(",name=");
            write_tag(out, &info.name);
        }
        tag(out, "namespace", owners.namespace);
        tag(out, "pod", owners.pod);
        write_recorded_mark(out, mark);
        tag(out, "user", owners.user);
        if !info.uuid.is_empty() {
            out.push_str(",uuid=");
            write_tag(out, &info.uuid);
        }
        out.push_str(&self.extra_tags);
    }

    /// `,host=…` (unless empty) and the extra tags: the tag set of a point about the host.
    fn write_host_tags(&self, out: &mut String, host: &str, mark: Mark<'_>) {
        write_mark(out, mark);
        if !host.is_empty() {
            out.push_str(",host=");
            write_tag(out, host);
        }
        write_recorded_mark(out, mark);
        out.push_str(&self.extra_tags);
    }

    /// Writes `key=value`; returns false (writing nothing) for NaN and infinities, which
    /// InfluxDB rejects.
    fn write_field(&self, out: &mut String, d: &Descriptor, value: Value, first: bool) -> bool {
        if let Value::Float(v) = value {
            if !v.is_finite() {
                return false;
            }
        }
        if !first {
            out.push(',');
        }
        match d.id {
            Some(id) => out.push_str(&self.field_keys[id as usize]),
            None => write_field_key(out, d.name),
        }
        out.push('=');
        match value {
            // InfluxDB 1.x has no unsigned type; the few values above i64::MAX saturate.
            Value::Int(v) => {
                let _ = write!(out, "{}i", i64::try_from(v).unwrap_or(i64::MAX));
            }
            Value::Float(v) => {
                let _ = write!(out, "{v}");
            }
        }
        true
    }
}

/// `key=value` of an event (`,` first unless `first`); false, writing nothing, for a non-finite
/// number, which InfluxDB rejects.
fn write_event_field(out: &mut String, key: &str, value: EventValue<'_>, first: bool) -> bool {
    if matches!(value, EventValue::Float(v) if !v.is_finite()) {
        return false;
    }
    if !first {
        out.push(',');
    }
    write_field_key(out, key);
    out.push('=');
    match value {
        EventValue::Int(v) => {
            let _ = write!(out, "{v}i");
        }
        EventValue::Float(v) => {
            let _ = write!(out, "{v}");
        }
        EventValue::Bool(v) => out.push_str(if v { "true" } else { "false" }),
        EventValue::Str(v) => write_one_line_string(out, v),
    }
    true
}

/// A string field with line breaks turned into spaces. Parsers accept a newline inside quotes,
/// but the batch buffer and spill files count points by newlines, so every point stays on one
/// line (evidence is one sentence; nothing is lost).
fn write_one_line_string(out: &mut String, s: &str) {
    if s.contains(['\n', '\r']) {
        write_string_field(out, &s.replace(['\n', '\r'], " "));
    } else {
        write_string_field(out, s);
    }
}

fn finish_line(out: &mut String, start: usize, fields: usize, ts: i64, encoded: &mut Encoded) {
    if fields == 0 {
        out.truncate(start);
        return;
    }
    let _ = writeln!(out, " {ts}");
    encoded.lines += 1;
    encoded.fields += fields;
}

/// Appends `snapshot` as line protocol with the default schema (measurement `gpu`); returns how
/// many lines and fields were written. Usable without any HTTP dependency.
pub fn encode_snapshot(snapshot: &Snapshot, out: &mut String) -> Encoded {
    static DEFAULT: OnceLock<LineProtocolEncoder> = OnceLock::new();
    DEFAULT.get_or_init(LineProtocolEncoder::default).encode_snapshot(snapshot, out)
}

/// The tags of data not read from a GPU just now: `backend` (`mock`, `replay`;
/// `SystemInfo::marked_backend`) and, for a replay, `recorded_backend` (what recorded it:
/// `mock` when it was simulated). Both `None` for live data.
#[derive(Clone, Copy)]
struct Mark<'a> {
    backend: Option<&'a str>,
    recorded_backend: Option<&'a str>,
}

impl<'a> Mark<'a> {
    /// Live data's: no tag.
    const NONE: Mark<'static> = Mark { backend: None, recorded_backend: None };

    fn of(system: &'a gpumon_core::SystemInfo) -> Self {
        Self { backend: system.marked_backend(), recorded_backend: system.marked_recorded_backend() }
    }
}

/// `,backend=mock` or `,backend=replay`: the first tag of data not read from a GPU just now
/// ([`Mark`]); nothing for live data.
fn write_mark(out: &mut String, mark: Mark<'_>) {
    if let Some(backend) = mark.backend {
        out.push_str(",backend=");
        write_tag(out, backend);
    }
}

/// `,recorded_backend=mock`: what recorded a replay ([`Mark`]), written where its key sorts
/// (after `pod` and `host`, before `user` and `uuid`).
fn write_recorded_mark(out: &mut String, mark: Mark<'_>) {
    if let Some(recorded) = mark.recorded_backend {
        out.push_str(",recorded_backend=");
        write_tag(out, recorded);
    }
}

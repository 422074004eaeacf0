//! Snapshot → line protocol (see the schema in the module docs of [`crate::influxdb`]).

use std::fmt::Write as _;
use std::sync::OnceLock;

use gpumon_core::{DeviceInfo, DeviceSample, Family, LabelValue, MetricId, Snapshot, Value};

use super::escape::{write_field_key, write_measurement, write_tag};

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
            match d.label {
                Some(label) => {
                    write_measurement(&mut m, &Self::family_measurement_name(measurement, d.family));
                    write_tag(&mut l, label);
                }
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

    /// The measurement a labelled family is written to: `<base>_<family name>`.
    pub fn family_measurement_name(base: &str, family: Family) -> String {
        format!("{base}_{}", family.name())
    }

    /// Appends every device of `snapshot`; returns how many lines and fields were written.
    pub fn encode_snapshot(&self, snapshot: &Snapshot, out: &mut String) -> Encoded {
        let ts = snapshot.timestamp_nanos();
        let mut total = Encoded::default();
        // Simulated data carries `backend=mock` on every point so that it cannot pass for a
        // GPU's; real data has no such tag (series stay as they were).
        let mock = snapshot.system.is_mock();
        for device in &snapshot.devices {
            total += self.encode_device_inner(&snapshot.system.hostname, mock, ts, device, out);
        }
        total
    }

    /// Appends one device's lines at `timestamp_nanos`, tagged with `host`. Unlike
    /// [`LineProtocolEncoder::encode_snapshot`] it knows nothing of the backend, so it never
    /// writes the `backend=mock` tag.
    pub fn encode_device(&self, host: &str, timestamp_nanos: u64, device: &DeviceSample, out: &mut String) -> Encoded {
        self.encode_device_inner(host, false, timestamp_nanos, device, out)
    }

    fn encode_device_inner(
        &self,
        host: &str,
        mock: bool,
        timestamp_nanos: u64,
        device: &DeviceSample,
        out: &mut String,
    ) -> Encoded {
        let mut encoded = Encoded::default();
        let ts = i64::try_from(timestamp_nanos).unwrap_or(i64::MAX);

        // Pass 1: every unlabelled value on one wide line.
        let start = out.len();
        out.push_str(&self.measurements[MetricId::DeviceUp as usize]);
        self.write_device_tags(out, host, mock, &device.info);
        out.push(' ');
        let mut fields = 0;
        device.visit_points(|p| {
            if p.label.is_none() && self.write_field(out, p.id, p.value, fields == 0) {
                fields += 1;
            }
        });
        finish_line(out, start, fields, ts, &mut encoded);

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
                self.write_device_tags(out, host, mock, &device.info);
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
            if self.write_field(out, p.id, p.value, fields == 0) {
                fields += 1;
            }
        });
        if current.is_some() {
            finish_line(out, line_start, fields, ts, &mut encoded);
        }
        encoded
    }

    /// `,backend=mock,gpu=…,host=…,mig=…,mig_ci=…,mig_gi=…,mig_profile=…,name=…,uuid=…` (keys in
    /// sorted order, which InfluxDB indexes fastest; `backend` only for simulated data), then the
    /// extra tags. Empty values are left out.
    fn write_device_tags(&self, out: &mut String, host: &str, mock: bool, info: &DeviceInfo) {
        if mock {
            out.push_str(",backend=mock");
        }
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
        if !info.uuid.is_empty() {
            out.push_str(",uuid=");
            write_tag(out, &info.uuid);
        }
        out.push_str(&self.extra_tags);
    }

    /// Writes `key=value`; returns false (writing nothing) for NaN and infinities, which
    /// InfluxDB rejects.
    fn write_field(&self, out: &mut String, id: MetricId, value: Value, first: bool) -> bool {
        if let Value::Float(v) = value {
            if !v.is_finite() {
                return false;
            }
        }
        if !first {
            out.push(',');
        }
        out.push_str(&self.field_keys[id as usize]);
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

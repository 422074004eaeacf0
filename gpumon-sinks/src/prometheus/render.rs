//! Exposition rendering: one [`Snapshot`] (+ the agent's [`Telemetry`]) to Prometheus text 0.0.4
//! or OpenMetrics 1.0 text.
//!
//! Hand-rendered rather than through `prometheus-client`'s registry; see the module docs of
//! [`crate::prometheus`] ("Why not prometheus-client") for the reasons and the measurements.
//!
//! *What* is exported — every series' name, labels and value, in exposition order, `up 0` and
//! the self-metrics included — is the series layer's ([`super::series`]), which remote write
//! encodes from too. This module is a [`Visitor`] of that walk that only decides *how*: it
//! writes each family's `HELP`/`TYPE` (and `UNIT` in OpenMetrics) once, from the catalogue
//! ([`MetricId::descriptor`], computed once per process), then its series as text, escaping
//! each device's label set once per scrape.

use std::fmt::Write as _;
use std::time::Duration;

use gpumon_core::{Descriptor, MetricKind, PerDescriptor, Snapshot, Telemetry, Value};

use super::series::{metric_name, walk, Family, Label, Owners, Scope, Series, Text, Visitor, Walk, INFO, SELF_METRICS};
use super::Naming;

/// Content type of the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of OpenMetrics 1.0 text.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// An exposition format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// Prometheus text format 0.0.4 (`text/plain; version=0.0.4`).
    #[default]
    Text,
    /// OpenMetrics 1.0 text (`application/openmetrics-text; version=1.0.0`), ends in `# EOF`.
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` header value for a response in this format.
    pub const fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }

    /// Chooses the format from a scrape's `Accept` header, the way Prometheus negotiates it:
    /// OpenMetrics when the client lists `application/openmetrics-text` (version 1.0.0, 0.0.1 or
    /// none) with a quality at least as high as `text/plain`'s; the 0.0.4 text format otherwise
    /// (also when the header is absent or unparsable).
    pub fn from_accept(accept: Option<&str>) -> Format {
        let Some(accept) = accept else { return Format::Text };
        let (mut om_q, mut text_q) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let mut q = 1.0f32;
            let mut version_ok = true;
            for param in parts {
                let Some((k, v)) = param.split_once('=') else { continue };
                let (k, v) = (k.trim(), v.trim().trim_matches('"'));
                if k.eq_ignore_ascii_case("q") {
                    q = v.parse().unwrap_or(0.0);
                } else if k.eq_ignore_ascii_case("version") {
                    version_ok = matches!(v, "1.0.0" | "0.0.1" | "0.0.4");
                }
            }
            if media.eq_ignore_ascii_case("application/openmetrics-text") && version_ok {
                om_q = om_q.max(q);
            } else if media.eq_ignore_ascii_case("text/plain") || media == "*/*" || media.eq_ignore_ascii_case("text/*")
            {
                text_q = text_q.max(q);
            }
        }
        if om_q > 0.0 && om_q >= text_q {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }
}

/// Everything that changes what is rendered, fixed when the sink is built.
#[derive(Clone, Debug)]
pub(crate) struct RenderOptions {
    pub(crate) naming: Naming,
    /// Put the host label on every series (native: `host`; dcgm: `Hostname`/`hostname`).
    pub(crate) host_label: bool,
    /// dcgm naming: use `hostname` (dcgm-exporter ≥ #655) instead of `Hostname`.
    pub(crate) dcgm_lowercase_hostname: bool,
    /// Snapshots older than this render no device series (only self-metrics).
    pub(crate) stale_after: Option<Duration>,
    /// Whether OpenMetrics may be negotiated at all.
    pub(crate) openmetrics: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            naming: Naming::Native,
            host_label: true,
            dcgm_lowercase_hostname: false,
            stale_after: None,
            openmetrics: true,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Escaping and number formatting

/// Appends `value` escaped for use between the quotes of a label value (both formats): `\` →
/// `\\`, `"` → `\"`, newline → `\n`. Everything else (any Unicode) is written as is.
pub fn escape_label_value(out: &mut String, value: &str) {
    let bytes = value.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let rep = match b {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            b'\n' => "\\n",
            _ => continue,
        };
        out.push_str(&value[start..i]);
        out.push_str(rep);
        start = i + 1;
    }
    out.push_str(&value[start..]);
}

/// HELP text escaping: 0.0.4 escapes `\` and newline; OpenMetrics also `"`.
fn escape_help(value: &str, format: Format) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if format == Format::OpenMetrics => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// Appends `v` in decimal, without allocating.
fn push_u64(out: &mut String, v: u64) {
    out.push_str(itoa::Buffer::new().format(v));
}

/// Appends a sample value: integers without a fraction, `NaN`, `+Inf`, `-Inf`, and exponent
/// notation for very large or very small magnitudes (valid in both formats).
pub(crate) fn push_f64(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        if v < 0.0 {
            out.push('-');
        }
        push_u64(out, v.abs() as u64);
    } else if v.abs() >= 1e15 || v.abs() < 1e-4 {
        let _ = write!(out, "{v:e}");
    } else {
        let _ = write!(out, "{v}");
    }
}

// ---------------------------------------------------------------------------------------------
// Family headers, computed once from the catalogue.

struct Names {
    /// Native OpenMetrics family name (without `_total` for counters).
    native_family: String,
    /// OpenMetrics unit, when the family name ends in `_<unit>`.
    unit: Option<&'static str>,
    help_text: String,
    help_om: String,
    /// The help in dcgm naming, where the value is scaled to dcgm-exporter's unit ("Fraction of
    /// time …" would misread a value of 97): the native help with the unit said.
    dcgm_help_text: String,
    dcgm_help_om: String,
}

/// dcgm-exporter's unit for a value the catalogue scales by `scale` into it.
fn dcgm_unit(scale: f64) -> Option<&'static str> {
    [(100.0, "percent"), (1.0 / 1_048_576.0, "MiB"), (1e-6, "MHz"), (1000.0, "mJ")]
        .into_iter()
        .find(|(s, _)| (s - scale).abs() <= s.abs() * 1e-12)
        .map(|(_, unit)| unit)
}

/// The family names and help lines of series `d`, computed once per series.
fn names(d: &'static Descriptor) -> &'static Names {
    static NAMES: PerDescriptor<Names> = PerDescriptor::new(|d| {
        let native = metric_name(d, Naming::Native).0;
        let native_family = match d.kind {
            MetricKind::Counter => native.strip_suffix("_total").unwrap_or(native),
            _ => native,
        };
        let unit = d.unit.prometheus_suffix().filter(|u| native_family.ends_with(&format!("_{u}")));
        let dcgm_help = match d.dcgm.and_then(|x| dcgm_unit(x.scale)) {
            Some(unit) => format!("{} Here in {unit} (dcgm-exporter's unit).", d.help),
            None => d.help.to_owned(),
        };
        Names {
            native_family: native_family.to_owned(),
            unit,
            help_text: escape_help(d.help, Format::Text),
            help_om: escape_help(d.help, Format::OpenMetrics),
            dcgm_help_text: escape_help(&dcgm_help, Format::Text),
            dcgm_help_om: escape_help(&dcgm_help, Format::OpenMetrics),
        }
    });
    NAMES.get(d)
}

/// How one metric family is declared in one format and naming (its samples' name is the
/// series layer's).
struct FamilyHeader<'a> {
    /// Name on `# HELP`/`# TYPE`/`# UNIT` lines.
    family: &'a str,
    kind: &'static str,
    unit: Option<&'a str>,
    help: &'a str,
}

fn write_header(out: &mut String, h: &FamilyHeader<'_>) {
    out.push_str("# HELP ");
    out.push_str(h.family);
    out.push(' ');
    out.push_str(h.help);
    out.push_str("\n# TYPE ");
    out.push_str(h.family);
    out.push(' ');
    out.push_str(h.kind);
    out.push('\n');
    if let Some(unit) = h.unit {
        out.push_str("# UNIT ");
        out.push_str(h.family);
        out.push(' ');
        out.push_str(unit);
        out.push('\n');
    }
}

/// The header of a catalogue metric in `format`/`naming`.
fn metric_header(d: &'static Descriptor, format: Format, naming: Naming) -> FamilyHeader<'static> {
    let n = names(d);
    let help = match format {
        Format::Text => n.help_text.as_str(),
        Format::OpenMetrics => n.help_om.as_str(),
    };
    if let (Naming::Dcgm, Some(dcgm)) = (naming, d.dcgm) {
        let help = match format {
            Format::Text => n.dcgm_help_text.as_str(),
            Format::OpenMetrics => n.dcgm_help_om.as_str(),
        };
        // dcgm-exporter's names carry no unit suffix and its counters no `_total`. OpenMetrics
        // requires counter samples to end in `_total`, so to keep the names dashboards look for,
        // such counters are typed `unknown` in OpenMetrics (they stay `counter` in 0.0.4).
        let kind = match (d.kind, format) {
            (MetricKind::Counter, Format::Text) => "counter",
            (MetricKind::Counter, Format::OpenMetrics) if dcgm.name.ends_with("_total") => "counter",
            (MetricKind::Counter, Format::OpenMetrics) => "unknown",
            _ => "gauge",
        };
        let family = match (kind, format) {
            ("counter", Format::OpenMetrics) => dcgm.name.strip_suffix("_total").unwrap_or(dcgm.name),
            _ => dcgm.name,
        };
        return FamilyHeader { family, kind, unit: None, help };
    }
    let kind = match d.kind {
        MetricKind::Counter => "counter",
        _ => "gauge",
    };
    let (family, unit) = match format {
        Format::Text => (metric_name(d, Naming::Native).0, None),
        Format::OpenMetrics => (n.native_family.as_str(), n.unit),
    };
    FamilyHeader { family, kind, unit, help }
}

const INFO_HELP: &str = "GPU identity and static facts; always 1.";

/// The header of any family the series layer starts.
fn family_header(family: Family, format: Format, naming: Naming) -> FamilyHeader<'static> {
    match (family, format) {
        (Family::Metric(id), _) => metric_header(id, format, naming),
        (Family::Info, Format::Text) => FamilyHeader { family: INFO, kind: "gauge", unit: None, help: INFO_HELP },
        (Family::Info, Format::OpenMetrics) => FamilyHeader {
            family: INFO.strip_suffix("_info").unwrap_or(INFO),
            kind: "info",
            unit: None,
            help: INFO_HELP,
        },
        (Family::Agent(i), Format::Text) => {
            let m = &SELF_METRICS[i];
            FamilyHeader { family: m.name, kind: m.kind, unit: None, help: m.help }
        }
        (Family::Agent(i), Format::OpenMetrics) => {
            let m = &SELF_METRICS[i];
            FamilyHeader { family: m.family, kind: m.kind, unit: m.unit, help: m.help }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Label sets

fn push_label(out: &mut String, first: &mut bool, (key, value): Label<'_>) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(key);
    out.push_str("=\"");
    match value {
        Text::Str(s) => escape_label_value(out, s),
        Text::Int(i) => push_u64(out, i),
        Text::Prefixed(prefix, i) => {
            out.push_str(prefix);
            push_u64(out, i);
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// The renderer

/// Renders `snapshot` (and the self-metrics from `telemetry`) into `out`, which is appended to.
/// The series are the series layer's ([`series::walk`](super::series::walk)); this adds the
/// family headers and the text.
pub(crate) fn render(
    out: &mut String,
    snapshot: Option<&Snapshot>,
    telemetry: Option<&Telemetry>,
    opts: &RenderOptions,
    format: Format,
) {
    let mut writer = TextWriter { out, format, naming: opts.naming, labels: String::new(), spans: Vec::new() };
    walk(snapshot, telemetry, opts, &mut writer);
    if format == Format::OpenMetrics {
        writer.out.push_str("# EOF\n");
    }
}

/// Where one device's labels sit in [`TextWriter::labels`]: its identity labels from `start`
/// to `identity`, then its owner labels to `end`.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    identity: usize,
    end: usize,
}

impl Span {
    /// Identity and owners: the labels of every series of the device.
    fn all(self) -> std::ops::Range<usize> {
        self.start..self.end
    }

    /// Identity only: the prefix of a process series, which adds its own process's owner.
    fn identity(self) -> std::ops::Range<usize> {
        self.start..self.identity
    }
}

/// The text exposition as a [`Visitor`] of the series layer.
struct TextWriter<'o> {
    out: &'o mut String,
    format: Format,
    naming: Naming,
    /// Every device's labels, escaped, in one buffer (built at the first device series): each
    /// device's are escaped once per scrape and copied into each of its series.
    labels: String,
    spans: Vec<Span>,
}

impl TextWriter<'_> {
    /// Fills [`Self::labels`] once per walk.
    fn device_labels(&mut self, walk: &Walk<'_>) {
        let n = walk.device_count();
        if !self.spans.is_empty() || n == 0 {
            return;
        }
        // Room for the identity (~96 bytes), and the owner labels when attribution is on, so
        // that the buffer is allocated once per scrape.
        let per_device = if walk.has_owners() { 224 } else { 96 };
        self.labels = String::with_capacity(n * per_device);
        self.spans = Vec::with_capacity(n);
        let labels = &mut self.labels;
        for index in 0..n {
            let start = labels.len();
            let mut first = true;
            walk.device_labels(index, |l| push_label(labels, &mut first, l));
            let identity = labels.len();
            walk.owner_labels(walk.device_owners(index), |l| push_label(labels, &mut first, l));
            self.spans.push(Span { start, identity, end: labels.len() });
        }
    }
}

impl Visitor for TextWriter<'_> {
    fn family(&mut self, family: Family) {
        write_header(self.out, &family_header(family, self.format, self.naming));
    }

    fn series(&mut self, walk: &Walk<'_>, s: &Series<'_>) {
        if let Scope::Device { .. } = s.scope {
            self.device_labels(walk);
        }
        let out = &mut *self.out;
        out.push_str(s.name);
        out.push('{');
        let mut first = true;
        match s.scope {
            Scope::Device { index, owners } => {
                let span = self.spans[index];
                let prefix = match owners {
                    Owners::Device => span.all(),
                    Owners::Process(_) => span.identity(),
                };
                first = prefix.is_empty();
                out.push_str(&self.labels[prefix]);
                if let Owners::Process(labels) = owners {
                    walk.owner_labels(labels, |l| push_label(out, &mut first, l));
                }
                for l in s.extra {
                    push_label(out, &mut first, *l);
                }
            }
            Scope::Host => walk.labels(s, |l| push_label(out, &mut first, l)),
        }
        if first {
            // No label at all: `name{}` is valid but unusual; write the bare name.
            out.pop();
        } else {
            out.push('}');
        }
        out.push(' ');
        match s.value {
            Value::Int(v) => push_u64(out, v),
            v => push_f64(out, v.as_f64()),
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod number_tests {
    use std::sync::Arc;

    use gpumon_core::{DeviceInfo, DeviceSample, MigInfo, Snapshot, SystemInfo};

    use crate::prometheus::{Format, PrometheusSink};

    #[test]
    fn mig_info_series_has_the_compute_instance_id() {
        let mut info = DeviceInfo::new(1, "MIG-b", "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
        info.mig = Some(MigInfo::new("GPU-b", 2, 7, 13));
        let snap = Snapshot::new(Arc::new(SystemInfo::new("h", "mock")), vec![DeviceSample::new(Arc::new(info))]);
        let sink = PrometheusSink::builder().build().unwrap();
        let h = sink.handle();
        h.store(Arc::new(snap));
        let text = h.render(Format::Text);
        let line = text.lines().find(|l| l.contains("parent_uuid=\"GPU-b\"")).expect("MIG info series");
        assert!(line.contains(",compute_instance_id=\"13\""), "{line}");
    }
}

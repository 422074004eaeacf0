//! Exposition rendering: one [`Snapshot`] (+ the agent's [`Telemetry`]) to Prometheus text 0.0.4
//! or OpenMetrics 1.0 text.
//!
//! Hand-rendered rather than through `prometheus-client`'s registry; see the module docs of
//! [`crate::prometheus`] ("Why not prometheus-client") for the reasons and the measurements.
//!
//! The renderer makes one pass over every device's [`DeviceSample::visit_points`], buckets the
//! points by metric (a counting sort: families must be contiguous in both formats) and writes
//! each family's `HELP`/`TYPE` (and `UNIT` in OpenMetrics) once, followed by its series. Names,
//! help texts and types come from the catalogue ([`MetricId::descriptor`]) and are computed once
//! per process.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::attribution::OwnerLabels;
use gpumon_core::{AgentStats, DeviceSample, LabelValue, MetricId, MetricKind, Snapshot, SystemInfo, Telemetry, Value};

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

fn push_value(out: &mut String, value: Value, scale: f64) {
    match value {
        Value::Int(v) if scale == 1.0 => push_u64(out, v),
        v => push_f64(out, v.as_f64() * scale),
    }
}

// ---------------------------------------------------------------------------------------------
// Name table, computed once from the catalogue.

struct Names {
    /// Native sample name (`gpumon_energy_joules_total`).
    native: String,
    /// Native OpenMetrics family name (without `_total` for counters).
    native_family: String,
    /// OpenMetrics unit, when the family name ends in `_<unit>`.
    unit: Option<&'static str>,
    help_text: String,
    help_om: String,
}

fn names() -> &'static [Names] {
    static NAMES: OnceLock<Vec<Names>> = OnceLock::new();
    NAMES.get_or_init(|| {
        MetricId::ALL
            .iter()
            .map(|id| {
                let d = id.descriptor();
                let native = d.prometheus_name();
                let native_family = match d.kind {
                    MetricKind::Counter => native.strip_suffix("_total").unwrap_or(&native).to_owned(),
                    _ => native.clone(),
                };
                let unit = d.unit.prometheus_suffix().filter(|u| native_family.ends_with(&format!("_{u}")));
                Names {
                    native,
                    native_family,
                    unit,
                    help_text: escape_help(d.help, Format::Text),
                    help_om: escape_help(d.help, Format::OpenMetrics),
                }
            })
            .collect()
    })
}

/// How one metric family is written in one format and naming.
struct FamilyHeader<'a> {
    /// Name on `# HELP`/`# TYPE`/`# UNIT` lines.
    family: &'a str,
    /// Name on sample lines.
    sample: &'a str,
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

/// The header of a catalogue metric in `format`/`naming`, plus the dcgm scale.
fn metric_header(id: MetricId, format: Format, naming: Naming) -> (FamilyHeader<'static>, f64) {
    let d = id.descriptor();
    let n = &names()[id as usize];
    let help = match format {
        Format::Text => n.help_text.as_str(),
        Format::OpenMetrics => n.help_om.as_str(),
    };
    if let (Naming::Dcgm, Some(dcgm)) = (naming, d.dcgm) {
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
        return (FamilyHeader { family, sample: dcgm.name, kind, unit: None, help }, dcgm.scale);
    }
    let kind = match d.kind {
        MetricKind::Counter => "counter",
        _ => "gauge",
    };
    let (family, unit) = match format {
        Format::Text => (n.native.as_str(), None),
        Format::OpenMetrics => (n.native_family.as_str(), n.unit),
    };
    (FamilyHeader { family, sample: n.native.as_str(), kind, unit, help }, 1.0)
}

// ---------------------------------------------------------------------------------------------
// Label sets

fn push_label(out: &mut String, first: &mut bool, key: &str, value: &str) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(key);
    out.push_str("=\"");
    escape_label_value(out, value);
    out.push('"');
}

fn push_label_u64(out: &mut String, first: &mut bool, key: &str, value: u64) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(key);
    out.push_str("=\"");
    push_u64(out, value);
    out.push('"');
}

fn host_key(opts: &RenderOptions) -> &'static str {
    match (opts.naming, opts.dcgm_lowercase_hostname) {
        (Naming::Native, _) => "host",
        (Naming::Dcgm, false) => "Hostname",
        (Naming::Dcgm, true) => "hostname",
    }
}

/// The labels every series of `dev` carries (without braces), escaped.
fn device_labels(out: &mut String, dev: &DeviceSample, system: &SystemInfo, opts: &RenderOptions) {
    let info = &*dev.info;
    let mut first = true;
    match opts.naming {
        Naming::Native => {
            push_label_u64(out, &mut first, "gpu", u64::from(info.index));
            push_label(out, &mut first, "uuid", &info.uuid);
            if let Some(mig) = &info.mig {
                push_label_u64(out, &mut first, "gpu_instance_id", u64::from(mig.gpu_instance_id));
                if let Some(profile) = &mig.profile {
                    push_label(out, &mut first, "mig_profile", profile);
                }
            }
            if opts.host_label {
                push_label(out, &mut first, "host", &system.hostname);
            }
            mock_label(out, &mut first, system);
        }
        Naming::Dcgm => {
            // dcgm-exporter's label set and order (rendermetrics/render_metrics.go). For a MIG
            // instance `UUID` is the parent GPU's, told apart by GPU_I_ID.
            push_label_u64(out, &mut first, "gpu", u64::from(info.index));
            let uuid = info.mig.as_ref().map_or(info.uuid.as_str(), |m| m.parent_uuid.as_str());
            push_label(out, &mut first, "UUID", uuid);
            if let Some(bus) = &info.pci_bus_id {
                push_label(out, &mut first, "pci_bus_id", bus);
            }
            push_label(out, &mut first, "device", &info.device_node());
            push_label(out, &mut first, "modelName", &info.name);
            if let Some(mig) = &info.mig {
                if let Some(profile) = &mig.profile {
                    push_label(out, &mut first, "GPU_I_PROFILE", profile);
                }
                push_label_u64(out, &mut first, "GPU_I_ID", u64::from(mig.gpu_instance_id));
            }
            if opts.host_label {
                push_label(out, &mut first, host_key(opts), &system.hostname);
            }
            if let Some(driver) = &system.driver_version {
                push_label(out, &mut first, "DCGM_FI_DRIVER_VERSION", driver);
            }
            mock_label(out, &mut first, system);
        }
    }
}

/// The owner labels ([`gpumon_core::attribution`]) of a device's or a process's series, after
/// the device labels: `namespace`, `pod`, `container`, `user` in native naming; in dcgm naming
/// dcgm-exporter's pod labels `namespace`, `pod`, `container` only (dcgm-exporter has no user
/// label). Absent labels are not written.
fn owner_labels(out: &mut String, first: &mut bool, labels: OwnerLabels<'_>, naming: Naming) {
    for (key, value) in labels.pairs() {
        if naming == Naming::Dcgm && key == "user" {
            continue;
        }
        push_label(out, first, key, value);
    }
}

/// `backend="mock"` on every series of simulated data and `backend="replay"` on every series of
/// a replayed trace ([`SystemInfo::marked_backend`]), so that neither can pass for a live GPU's
/// in a query or on a dashboard; live (NVML) series carry no such label.
fn mock_label(out: &mut String, first: &mut bool, system: &SystemInfo) {
    if let Some(mark) = system.marked_backend() {
        push_label(out, first, "backend", mark);
    }
}

// ---------------------------------------------------------------------------------------------
// The renderer

#[derive(Clone, Copy)]
struct Entry<'a> {
    id: MetricId,
    device: u32,
    value: Value,
    label: Option<LabelValue<'a>>,
}

/// Renders `snapshot` (and the self-metrics from `telemetry`) into `out`, which is appended to.
pub(crate) fn render(
    out: &mut String,
    snapshot: Option<&Snapshot>,
    telemetry: Option<&Telemetry>,
    opts: &RenderOptions,
    format: Format,
) {
    let now = SystemTime::now();
    let fresh = snapshot.filter(|s| match opts.stale_after {
        Some(max) => now.duration_since(s.taken_at).map_or(true, |age| age <= max),
        None => true,
    });
    let stats = telemetry.map(Telemetry::stats);
    // The backend itself is down (NVML not loaded, sampling failing): a `gpumon_up 0` without
    // device labels, in the same family as the devices' `gpumon_up`, so that one alert on
    // `gpumon_up == 0` covers a lost GPU and a node whose GPUs cannot be read at all.
    let backend_down = stats.as_ref().is_some_and(|st| !st.last_sample_ok && st.sample_failures > 0)
        || fresh.is_some_and(|s| !s.sampling.is_ok());
    let down_line = backend_down.then(|| {
        let mut line = String::from(metric_header(MetricId::DeviceUp, format, opts.naming).0.sample);
        let common = common_labels(snapshot, opts);
        if !common.is_empty() {
            line.push('{');
            line.push_str(&common);
            line.push('}');
        }
        line.push_str(" 0\n");
        line
    });
    let devices_rendered = match fresh {
        Some(snap) if !snap.devices.is_empty() => {
            render_devices(out, snap, opts, format, down_line.as_deref());
            true
        }
        _ => false,
    };
    if let (Some(line), false) = (&down_line, devices_rendered) {
        write_header(out, &metric_header(MetricId::DeviceUp, format, opts.naming).0);
        out.push_str(line);
    }
    render_self(out, snapshot, stats.as_ref(), opts, format);
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
}

/// Where one device's labels sit in the shared label buffer: its identity labels from `start`
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

/// Renders every device family; `down_line` (the backend-down `gpumon_up 0`) goes into the
/// `gpumon_up` family, which every device has.
fn render_devices(out: &mut String, snap: &Snapshot, opts: &RenderOptions, format: Format, down_line: Option<&str>) {
    let system = &*snap.system;

    // Label prefixes, one per device, in one buffer: the device's identity, then its owners.
    // A process series takes the identity part only and adds its own process's owner.
    // Room for the identity (~96 bytes), and the owner labels when attribution is on, so that
    // the buffer is allocated once per scrape.
    let per_device = if snap.devices.iter().any(|d| !d.owners.is_empty()) { 224 } else { 96 };
    let mut labels = String::with_capacity(snap.devices.len() * per_device);
    let mut spans = Vec::with_capacity(snap.devices.len());
    for dev in &snap.devices {
        let start = labels.len();
        device_labels(&mut labels, dev, system, opts);
        let identity = labels.len();
        let mut first = identity == start;
        owner_labels(&mut labels, &mut first, dev.owner_labels(), opts.naming);
        spans.push(Span { start, identity, end: labels.len() });
    }

    // All points, then a counting sort by metric so every family is contiguous; the order
    // within a family (device, then label) is kept.
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
    {
        for (i, e) in entries.iter().enumerate() {
            let slot = &mut next[e.id as usize];
            order[*slot as usize] = i as u32;
            *slot += 1;
        }
    }

    // The info series first.
    render_info(out, snap, &labels, &spans, opts, format);

    let mut k = 0;
    while k < order.len() {
        let id = entries[order[k] as usize].id;
        let n = counts[id as usize] as usize;
        let (header, scale) = metric_header(id, format, opts.naming);
        write_header(out, &header);
        let label_key = id.descriptor().label;
        for &idx in &order[k..k + n] {
            let e = &entries[idx as usize];
            out.push_str(header.sample);
            out.push('{');
            let span = spans[e.device as usize];
            // A process's series: the device's identity, then its process's own owner.
            match snap.devices[e.device as usize].process_of(e.id, e.label) {
                Some(process) => {
                    let identity = span.identity();
                    let mut first = identity.is_empty();
                    out.push_str(&labels[identity]);
                    if let Some(process) = process {
                        owner_labels(out, &mut first, process.owner_labels(), opts.naming);
                    }
                }
                None => out.push_str(&labels[span.all()]),
            }
            if let (Some(key), Some(v)) = (label_key, e.label) {
                out.push(',');
                out.push_str(key);
                out.push_str("=\"");
                match v {
                    LabelValue::Int(i) => push_u64(out, i),
                    LabelValue::Str(s) => escape_label_value(out, s),
                }
                out.push('"');
            }
            out.push_str("} ");
            push_value(out, e.value, scale);
            out.push('\n');
        }
        if id == MetricId::DeviceUp {
            out.push_str(down_line.unwrap_or(""));
        }
        k += n;
    }

    render_derived(out, snap, &labels, &spans, &mut counts, opts, format);
}

/// Derived series (findings; later training steps), after the device families, exported from
/// the catalogue like every other metric: a device-scoped point gets its device's label set, a
/// point about the host (host scope, or a host-level finding) only the host label; then the
/// descriptor's own labels. Nothing here knows which metric it writes.
///
/// Points are not collected: one pass counts them per metric (reusing `counts`), then one pass
/// per metric that has any writes that family contiguously. With no diagnosis attached both are
/// a single `None` check; in either case a scrape allocates nothing more than before.
fn render_derived(
    out: &mut String,
    snap: &Snapshot,
    labels: &str,
    spans: &[Span],
    counts: &mut [u32],
    opts: &RenderOptions,
    format: Format,
) {
    counts.fill(0);
    let mut any = false;
    snap.visit_derived(|p| {
        // A sampling-failed snapshot's `up 0` is `render`'s backend-down line, which joins the
        // devices' `gpumon_up` family; a second family of that name would be invalid.
        if p.id != MetricId::DeviceUp {
            counts[p.id as usize] += 1;
            any = true;
        }
    });
    if !any {
        return;
    }
    let host = host_key(opts);
    for id in MetricId::ALL {
        if counts[*id as usize] == 0 {
            continue;
        }
        let (header, scale) = metric_header(*id, format, opts.naming);
        write_header(out, &header);
        snap.visit_derived(|p| {
            if p.id != *id {
                return;
            }
            out.push_str(header.sample);
            out.push('{');
            let mut first = true;
            match p.device.and_then(|i| spans.get(i)) {
                Some(span) => {
                    out.push_str(&labels[span.all()]);
                    first = span.all().is_empty();
                }
                None => {
                    if opts.host_label {
                        push_label(out, &mut first, host, &snap.system.hostname);
                    }
                    mock_label(out, &mut first, &snap.system);
                }
            }
            // An empty value means "no such label" (a run without a rank); Prometheus treats an
            // empty label as an absent one anyway, so leave it out.
            for (key, value) in p.label_pairs().filter(|(_, v)| !v.is_empty()) {
                push_label(out, &mut first, key, value);
            }
            if first {
                // No label at all: `name{}` is valid but unusual; write the bare name.
                out.pop();
            } else {
                out.push('}');
            }
            out.push(' ');
            push_value(out, p.value, scale);
            out.push('\n');
        });
    }
}

/// `gpumon_gpu_info{…} 1`: one series per answering device, with the facts that do not belong on
/// every series.
fn render_info(out: &mut String, snap: &Snapshot, labels: &str, spans: &[Span], opts: &RenderOptions, format: Format) {
    if !snap.devices.iter().any(DeviceSample::is_up) {
        return;
    }
    let header = match format {
        Format::Text => FamilyHeader { family: INFO, sample: INFO, kind: "gauge", unit: None, help: INFO_HELP },
        Format::OpenMetrics => FamilyHeader {
            family: INFO.strip_suffix("_info").unwrap_or(INFO),
            sample: INFO,
            kind: "info",
            unit: None,
            help: INFO_HELP,
        },
    };
    write_header(out, &header);
    let system = &*snap.system;
    let cuda = system.cuda_version();
    for (dev, span) in snap.devices.iter().zip(spans) {
        if !dev.is_up() {
            continue;
        }
        let info = &*dev.info;
        out.push_str(INFO);
        out.push('{');
        out.push_str(&labels[span.all()]);
        let mut first = span.all().is_empty();
        let mut opt = |out: &mut String, key: &str, v: Option<&str>| {
            if let Some(v) = v {
                push_label(out, &mut first, key, v);
            }
        };
        match opts.naming {
            Naming::Native => {
                opt(out, "name", Some(&info.name));
                opt(out, "pci_bus_id", info.pci_bus_id.as_deref());
                opt(out, "driver_version", system.driver_version.as_deref());
            }
            Naming::Dcgm => {
                opt(out, "uuid", Some(&info.uuid));
            }
        }
        opt(out, "serial", info.serial.as_deref());
        opt(out, "architecture", info.architecture.as_deref());
        opt(out, "cuda_version", cuda.as_deref());
        opt(out, "nvml_version", system.nvml_version.as_deref());
        // Simulated and replayed data already carry `backend` on every series (`mock_label`).
        if system.marked_backend().is_none() {
            opt(out, "backend", Some(system.backend.as_str()).filter(|b| !b.is_empty()));
        }
        if let Some(mig) = &info.mig {
            opt(out, "parent_uuid", Some(&mig.parent_uuid));
            let mut digits = itoa::Buffer::new();
            opt(out, "compute_instance_id", Some(digits.format(mig.compute_instance_id)));
        }
        if !opts.host_label {
            opt(out, "host", Some(&system.hostname));
        }
        out.push_str("} 1\n");
    }
}

/// Self-metric names. They describe the agent, not a device, so they are not in the device
/// catalogue; this table is their one place.
pub(crate) const INFO: &str = "gpumon_gpu_info";
const INFO_HELP: &str = "GPU identity and static facts; always 1.";
const SELF_METRICS: &[(&str, &str, &str, Option<&str>, &str)] = &[
    // (sample name, family name in OpenMetrics, type, unit, help)
    (
        "gpumon_last_sample_success",
        "gpumon_last_sample_success",
        "gauge",
        None,
        "Whether the agent's last sample succeeded (1) or failed (0).",
    ),
    (
        "gpumon_last_sample_duration_seconds",
        "gpumon_last_sample_duration_seconds",
        "gauge",
        Some("seconds"),
        "How long the last sample took.",
    ),
    (
        "gpumon_last_sample_timestamp_seconds",
        "gpumon_last_sample_timestamp_seconds",
        "gauge",
        Some("seconds"),
        "Unix time of the last successful sample.",
    ),
    ("gpumon_samples_total", "gpumon_samples", "counter", None, "Samples that produced a snapshot."),
    (
        "gpumon_sample_failures_total",
        "gpumon_sample_failures",
        "counter",
        None,
        "Samples that failed (backend error, timeout, panic).",
    ),
    (
        "gpumon_skipped_ticks_total",
        "gpumon_skipped_ticks",
        "counter",
        None,
        "Ticks skipped because the previous sample was still running.",
    ),
    ("gpumon_sink_exported_total", "gpumon_sink_exported", "counter", None, "Snapshots a sink exported."),
    (
        "gpumon_sink_dropped_total",
        "gpumon_sink_dropped",
        "counter",
        None,
        "Snapshots a sink lost because its queue was full.",
    ),
    ("gpumon_sink_failures_total", "gpumon_sink_failures", "counter", None, "Sink calls that failed or timed out."),
    (
        "gpumon_sink_consecutive_failures",
        "gpumon_sink_consecutive_failures",
        "gauge",
        None,
        "Sink failures since its last success.",
    ),
    (
        "gpumon_last_sample_metric_failures",
        "gpumon_last_sample_metric_failures",
        "gauge",
        None,
        "Metric families that could not be read at the last successful sample, one per GPU and family (gpumon_metric_failure says which).",
    ),
];

fn self_header(i: usize, format: Format) -> FamilyHeader<'static> {
    let (sample, family, kind, unit, help) = SELF_METRICS[i];
    match format {
        Format::Text => FamilyHeader { family: sample, sample, kind, unit: None, help },
        Format::OpenMetrics => FamilyHeader { family, sample, kind, unit, help },
    }
}

/// Labels on every series that describes the agent rather than a device: the host, and
/// `backend="mock"` for simulated data (both from the latest snapshot, if any).
fn common_labels(snapshot: Option<&Snapshot>, opts: &RenderOptions) -> String {
    let mut common = String::new();
    if let Some(s) = snapshot {
        let mut first = true;
        if opts.host_label {
            push_label(&mut common, &mut first, host_key(opts), &s.system.hostname);
        }
        mock_label(&mut common, &mut first, &s.system);
    }
    common
}

fn render_self(
    out: &mut String,
    snapshot: Option<&Snapshot>,
    stats: Option<&AgentStats>,
    opts: &RenderOptions,
    format: Format,
) {
    let common = common_labels(snapshot, opts);
    let line = |out: &mut String, i: usize, extra: Option<(&str, &str)>, v: f64| {
        out.push_str(SELF_METRICS[i].0);
        if !common.is_empty() || extra.is_some() {
            out.push('{');
            out.push_str(&common);
            let mut first = common.is_empty();
            if let Some((k, val)) = extra {
                push_label(out, &mut first, k, val);
            }
            out.push('}');
        }
        out.push(' ');
        push_f64(out, v);
        out.push('\n');
    };
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());

    match stats {
        Some(st) => {
            write_header(out, &self_header(0, format));
            line(out, 0, None, if st.last_sample_ok { 1.0 } else { 0.0 });
            write_header(out, &self_header(1, format));
            line(out, 1, None, st.last_sample_duration.as_secs_f64());
            if let Some(t) = st.last_sample_time {
                write_header(out, &self_header(2, format));
                line(out, 2, None, secs(t));
            }
            for (i, v) in
                [(3, st.samples_taken), (4, st.sample_failures), (5, st.skipped_ticks), (10, st.metric_failures)]
            {
                write_header(out, &self_header(i, format));
                line(out, i, None, v as f64);
            }
            if !st.sinks.is_empty() {
                type Get = fn(&gpumon_core::SinkStatus) -> u64;
                let per_sink: [(usize, Get); 4] =
                    [(6, |s| s.exported), (7, |s| s.dropped), (8, |s| s.failures), (9, |s| s.consecutive_failures)];
                for (i, get) in per_sink {
                    write_header(out, &self_header(i, format));
                    for s in &st.sinks {
                        line(out, i, Some(("sink", &s.name)), get(s) as f64);
                    }
                }
            }
        }
        None => {
            // No agent attached (an embedder feeding snapshots itself): what the snapshot says
            // (a sampling-failed one took no sample to time).
            if let Some(s) = snapshot.filter(|s| s.sampling.is_ok()) {
                write_header(out, &self_header(1, format));
                line(out, 1, None, s.duration.as_secs_f64());
                write_header(out, &self_header(2, format));
                line(out, 2, None, secs(s.taken_at));
            }
        }
    }
}

#[cfg(test)]
pub(crate) fn unescape_label_value(s: &str) -> Option<String> {
    // The Prometheus text parser's rules: `\\`, `\"`, `\n` are escapes; a raw `"` or newline
    // cannot appear; any other backslash sequence is kept as is.
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push('\\'),
                Some('"') => out.push('"'),
                Some('n') => out.push('\n'),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => return None,
            },
            '"' | '\n' => return None,
            c => out.push(c),
        }
    }
    Some(out)
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

//! The scrape endpoint's series as data — `(metric name, labels, value)` — for push protocols
//! that carry Prometheus series (remote write).
//!
//! The series are the exposition renderer's own output, read back: every name, label set,
//! dcgm scale, derived series (findings) and the `backend="mock"` mark come from
//! [`render`](super::render::render), so what is pushed can never drift from what a scrape sees,
//! in either naming. Reading back costs about as much as rendering (see BENCHMARKS.md); a
//! snapshot is pushed once per interval, so that is a few tens of microseconds per second.

use std::borrow::Cow;

use gpumon_core::{Snapshot, Telemetry};

use super::render::{render, Format, RenderOptions};

/// One series of a rendered snapshot. Label values are unescaped; names are as rendered.
#[derive(Debug)]
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) labels: &'a [(&'a str, Cow<'a, str>)],
    pub(crate) value: f64,
}

/// Renders `snapshot` (plus the self-metrics of `telemetry`, as the scrape endpoint does) into
/// `text` (cleared first, its capacity kept) and calls `f` once per series, in exposition order.
pub(crate) fn visit_series(
    text: &mut String,
    snapshot: &Snapshot,
    telemetry: Option<&Telemetry>,
    opts: &RenderOptions,
    mut f: impl FnMut(&Series<'_>),
) {
    text.clear();
    render(text, Some(snapshot), telemetry, opts, Format::Text);
    let mut labels: Vec<(&str, Cow<'_, str>)> = Vec::with_capacity(16);
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        labels.clear();
        let Some((name, value)) = parse_line(line, &mut labels) else {
            // The renderer writes nothing this parser cannot read (tested below); skipping keeps
            // a future renderer change from taking the sink down.
            tracing::debug!(line, "unparsable exposition line skipped");
            continue;
        };
        f(&Series { name, labels: &labels, value });
    }
}

/// `name{k="v",…} value` or `name value` (the renderer writes no timestamps).
fn parse_line<'a>(line: &'a str, labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Option<(&'a str, f64)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        rest = body;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find("=\"")?;
            let key = &rest[..eq];
            rest = &rest[eq + 2..];
            // The value ends at the first `"` not escaped by a backslash.
            let bytes = rest.as_bytes();
            let (mut i, mut escaped) = (0, false);
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => {
                        escaped = true;
                        i += 2;
                        continue;
                    }
                    b'"' => break,
                    _ => i += 1,
                }
            }
            if i >= bytes.len() {
                return None;
            }
            let raw = &rest[..i];
            labels.push((key, if escaped { Cow::Owned(unescape(raw)) } else { Cow::Borrowed(raw) }));
            rest = &rest[i + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value = rest.trim_start().split(' ').next()?;
    Some((name, parse_value(value)?))
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// The exposition format's three escapes: `\\`, `\"`, `\n`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpumon_core::{DeviceInfo, DeviceSample, SystemInfo};

    use super::*;
    use crate::prometheus::Naming;

    #[test]
    fn lines_parse_with_escapes_and_special_values() {
        let mut labels = Vec::new();
        let (name, v) = parse_line(r#"m{a="x\"y",b="p\\q\nr",c=""} -Inf"#, &mut labels).unwrap();
        assert_eq!((name, v), ("m", f64::NEG_INFINITY));
        let got: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_ref())).collect();
        assert_eq!(got, [("a", "x\"y"), ("b", "p\\q\nr"), ("c", "")]);
        labels.clear();
        assert_eq!(parse_line("bare 1.5e-7", &mut labels), Some(("bare", 1.5e-7)));
        assert!(labels.is_empty());
        assert!(parse_line(r#"m{a="unterminated} 1"#, &mut labels).is_none());
    }

    /// Every sample line the renderer writes, for a snapshot with awkward label values and a
    /// mock fleet with findings, is read back: the series count equals the sample-line count.
    #[test]
    fn every_rendered_sample_line_is_read_back() {
        let mut info = DeviceInfo::new(0, "GPU-a", "A \"quoted\" \\ name\nwith newline");
        info.serial = Some("s\\n".into());
        let odd = Snapshot::new(Arc::new(SystemInfo::new("h\"", "mock")), vec![DeviceSample::new(Arc::new(info))]);
        let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
        let fleet = gpumon_core::Sampler::sample(&sampler, &gpumon_core::SampleRequest::default()).unwrap();
        for snap in [&odd, &fleet] {
            for naming in [Naming::Native, Naming::Dcgm] {
                let opts = RenderOptions { naming, ..RenderOptions::default() };
                let mut text = String::new();
                let mut n = 0;
                let mut names = Vec::new();
                visit_series(&mut text, snap, None, &opts, |s| {
                    n += 1;
                    assert!(s.labels.iter().any(|(k, v)| *k == "backend" && v == "mock"), "{s:?}");
                    names.push(s.name.to_owned());
                });
                let lines = text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).count();
                assert_eq!(n, lines, "{naming:?}");
                assert!(n > 0);
            }
        }
        let opts = RenderOptions::default();
        let mut text = String::new();
        let mut name = None;
        visit_series(&mut text, &odd, None, &opts, |s| {
            if s.name == "gpumon_gpu_info" {
                name = s.labels.iter().find(|(k, _)| *k == "name").map(|(_, v)| v.to_string());
            }
        });
        assert_eq!(name.as_deref(), Some("A \"quoted\" \\ name\nwith newline"));
    }
}

//! The 0.0.4 exposition parser remote write used in production before the series layer (render,
//! then parse back; `remote_write/encode.rs` at def79bc). It is kept once, for two users
//! (`#[path]`-included): the unit tests of `prometheus/`, where it is the oracle the series walk
//! is checked against, and the `remote_write_encode` bench, where it is the old path measured
//! against the series layer.

use std::borrow::Cow;

/// One sample line, `name{k="v",…} value` or `name value` (the renderer writes no timestamps, so
/// a line with one is refused): its name and value; its labels are pushed onto `labels` in the
/// order written, unescaped (borrowed from `line` where the value holds no escape), empty values
/// kept. `None` for a line that does not parse.
pub fn parse_sample_line<'a>(line: &'a str, labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Option<(&'a str, f64)> {
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
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    escaped = true;
                    i += 2;
                } else {
                    i += 1;
                }
            }
            if i >= bytes.len() {
                return None;
            }
            let raw = &rest[..i];
            labels.push((key, if escaped { Cow::Owned(unescape_label_value(raw)?) } else { Cow::Borrowed(raw) }));
            rest = &rest[i + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value = match rest.strip_prefix(' ')? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    Some((name, value))
}

/// A label value as written between the quotes, unescaped by the Prometheus text parser's rules:
/// `\\`, `\"`, `\n` are escapes; a raw `"` or newline cannot appear (`None`); any other backslash
/// sequence is kept as is.
pub fn unescape_label_value(s: &str) -> Option<String> {
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

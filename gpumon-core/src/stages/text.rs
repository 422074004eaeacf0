//! Text helpers shared by the stages' human lines (findings, steps, the run report).

use std::fmt::Write as _;
use std::time::Duration;

/// `text` without its closing full stop (the line adds its own punctuation).
pub(crate) fn sentence(text: &str) -> &str {
    text.trim_end_matches(|c: char| c == '.' || c.is_whitespace())
}

/// Appends `text` with line breaks turned into spaces: one event, one line.
pub(crate) fn push_one_line(out: &mut String, text: &str) {
    for (i, part) in text.split(['\n', '\r']).enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(part);
    }
}

/// `45s`, `2m 10s`, `1h 0m 5s` (whole seconds; under a second: `0s`).
pub(crate) fn push_duration(out: &mut String, d: Duration) {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let _ = match (h, m) {
        (0, 0) => write!(out, "{s}s"),
        (0, _) => write!(out, "{m}m {s}s"),
        _ => write!(out, "{h}h {m}m {s}s"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        for (secs, want) in [(0, "0s"), (45, "45s"), (130, "2m 10s"), (3605, "1h 0m 5s"), (90_061, "25h 1m 1s")] {
            let mut s = String::new();
            push_duration(&mut s, Duration::from_secs(secs));
            assert_eq!(s, want);
        }
    }
}

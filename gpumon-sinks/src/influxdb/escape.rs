//! Line-protocol escaping that every InfluxDB-compatible parser reads the same way.
//!
//! Three parser families are in use and they disagree on backslashes in identifiers
//! (measurement, tag keys and values, field keys):
//!
//! - InfluxDB 1.x (and 2.x's Go parser) treat a backslash as an escape only before `,`, ` `, `=`
//!   (and look only at the *previous* byte to decide whether a separator is escaped), so
//!   `a\\b` stays two backslashes and a value ending in `\` swallows the separator after it.
//! - VictoriaMetrics and the IOx/InfluxDB 3 parser also treat `\\` as one backslash.
//!
//! The writer here never produces a construct on which they differ:
//!
//! - `,` and ` ` are escaped everywhere; `=` is escaped in tag keys, tag values and field keys
//!   (InfluxDB 1.x keeps a `\=` in a measurement name literally, so it is left raw there).
//! - A backslash followed by an ordinary character is written as is: every parser keeps it.
//! - A backslash that would stand before another backslash, before a separator (`,`, ` `, `=`),
//!   or at the end of the text has no common spelling; it is replaced by `/`.
//! - Control characters (newline, carriage return, tab, NUL, …) cannot appear in an identifier
//!   (a newline ends the line, IOx splits on tabs); each is replaced by a space, which is then
//!   escaped.
//! - Double quotes need no escaping in identifiers and are written raw.
//!
//! [`stored_identifier`] returns exactly the text a server stores for an identifier, so callers
//! (and tests) can predict tag values. String field values have proper escapes (`\\`, `\"`) in
//! every dialect, so [`write_string_field`] is lossless.

use std::borrow::Cow;

fn is_separator(c: char) -> bool {
    matches!(c, ',' | ' ' | '=')
}

fn normalize(c: char) -> char {
    if c.is_control() {
        ' '
    } else {
        c
    }
}

/// Whether `s` can be copied verbatim (the common case: no byte needs attention).
fn is_plain(s: &str) -> bool {
    s.bytes().all(|b| b > b' ' && b != b',' && b != b'=' && b != b'\\' && b != 0x7f && b < 0x80)
}

/// The identifier characters a server stores for `s`, one per input char (see the module docs).
fn stored_chars(s: &str) -> impl Iterator<Item = char> + '_ {
    let mut chars = s.chars().map(normalize).peekable();
    std::iter::from_fn(move || {
        let c = chars.next()?;
        if c == '\\' {
            match chars.peek() {
                None => return Some('/'),
                Some(&n) if n == '\\' || is_separator(n) => return Some('/'),
                Some(_) => {}
            }
        }
        Some(c)
    })
}

/// The text an InfluxDB-compatible server stores for `s` written as a measurement, tag key, tag
/// value or field key by this module: control characters become spaces, and backslashes that
/// cannot be spelled alike for every parser become `/`. Borrowed when nothing changes.
pub fn stored_identifier(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| b != b'\\' && b >= b' ' && b != 0x7f) && !s.chars().any(char::is_control) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(stored_chars(s).collect())
    }
}

fn write_identifier(out: &mut String, s: &str, escape_equals: bool) {
    if is_plain(s) {
        out.push_str(s);
        return;
    }
    for c in stored_chars(s) {
        if c == ',' || c == ' ' || (escape_equals && c == '=') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Appends `s` escaped as a measurement name (`,` and space escaped).
pub fn write_measurement(out: &mut String, s: &str) {
    write_identifier(out, s, false);
}

/// Appends `s` escaped as a tag key or tag value (`,`, `=` and space escaped). An empty tag
/// value is not valid line protocol: callers leave such tags out.
pub fn write_tag(out: &mut String, s: &str) {
    write_identifier(out, s, true);
}

/// Appends `s` escaped as a field key (same rules as tags).
pub fn write_field_key(out: &mut String, s: &str) {
    write_identifier(out, s, true);
}

/// Appends `s` as a quoted string field value: `"` and `\` are backslash-escaped; everything else,
/// newlines included, is written as is (all parsers accept newlines inside quotes).
pub fn write_string_field(out: &mut String, s: &str) {
    out.push('"');
    if !s.contains(['"', '\\']) {
        out.push_str(s);
    } else {
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(s: &str) -> String {
        let mut out = String::new();
        write_tag(&mut out, s);
        out
    }

    #[test]
    fn separators_are_escaped() {
        assert_eq!(tag("a b,c=d"), r"a\ b\,c\=d");
        let mut m = String::new();
        write_measurement(&mut m, "a b,c=d");
        assert_eq!(m, r"a\ b\,c=d");
    }

    #[test]
    fn backslashes_are_kept_only_where_unambiguous() {
        assert_eq!(tag(r"a\b"), r"a\b");
        assert_eq!(tag(r"a\\b"), r"a/\b");
        assert_eq!(tag(r"a\"), "a/");
        assert_eq!(tag(r"a\,b"), r"a/\,b");
        assert_eq!(stored_identifier(r"a\,b"), "a/,b");
        assert_eq!(stored_identifier(r"a\b"), r"a\b");
    }

    #[test]
    fn control_characters_become_spaces() {
        assert_eq!(tag("a\nb\tc"), r"a\ b\ c");
        assert_eq!(stored_identifier("a\nb\r"), "a b ");
        // A backslash before a newline is a backslash before a space.
        assert_eq!(stored_identifier("a\\\nb"), "a/ b");
    }

    #[test]
    fn string_fields_escape_quotes_and_backslashes() {
        let mut out = String::new();
        write_string_field(&mut out, "say \"hi\" \\ bye\n");
        assert_eq!(out, "\"say \\\"hi\\\" \\\\ bye\n\"");
    }

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(stored_identifier("NVIDIA H100 80GB HBM3"), Cow::Borrowed(_)));
        assert_eq!(tag("üñï"), "üñï");
    }
}

//! The one duration grammar of gpumon's config files and flags.
//!
//! A duration is written either as a number of seconds (`5`, `0.25`; in a config file also as a
//! TOML/JSON number) or in [humantime](https://docs.rs/humantime)'s grammar: a sequence of
//! number–unit pairs, `500ms`, `2s`, `1m 30s`, `1.5h`, `2min`, `1h30m` (units `ns`, `us`, `ms`,
//! `s`/`sec`, `m`/`min`, `h`/`hr`, `d`, `w`, …). Every config section and every flag takes the
//! same grammar; config errors carry the file position and key from the TOML parser.

use std::time::Duration;

/// Examples shown in every error, so a user sees a form that works.
const EXAMPLES: &str = "examples: 500ms, 2s, 1m 30s";

/// Why a duration could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Text that is neither a number of seconds nor a humantime duration.
    #[error("invalid duration `{input}`: {reason} ({EXAMPLES})")]
    Syntax {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A number of seconds that is negative, not finite, or too large.
    #[error(
        "invalid duration {input}: must be a finite number of seconds, from 0 to about 584 billion years ({EXAMPLES})"
    )]
    OutOfRange {
        /// The number given, as written.
        input: String,
    },
}

/// Parses a duration: a number of seconds (`"2"`, `"0.5"`) or a humantime duration (`"500ms"`,
/// `"1m 30s"`). Surrounding whitespace is ignored.
///
/// ```
/// use std::time::Duration;
/// use gpumon_sinks::duration::parse_duration;
/// assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
/// assert!(parse_duration("soon").unwrap_err().to_string().contains("soon"));
/// ```
///
/// # Errors
/// [`DurationError`] naming the text.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DurationError::Syntax { input: s.to_owned(), reason: "empty".to_owned() });
    }
    // A bare number is seconds, read as an exact decimal (no float rounding: "0.1" is 100ms).
    // Only plain decimal forms: `inf`, `NaN` and `1e3` are not durations anyone means to write.
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return decimal_seconds(t).ok_or_else(|| DurationError::Syntax {
            input: s.to_owned(),
            reason: "not a number of seconds (digits, at most one `.`, at most 9 decimals)".to_owned(),
        })?;
    }
    humantime::parse_duration(t).map_err(|e| DurationError::Syntax { input: s.to_owned(), reason: e.to_string() })
}

/// `"12"`, `"0.5"`, `".5"`, `"3."` as seconds; `None` for anything else. An integer part too
/// large for a `Duration` is an `OutOfRange` error.
fn decimal_seconds(t: &str) -> Option<Result<Duration, DurationError>> {
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') || frac.len() > 9 {
        return None;
    }
    let Ok(secs) = (if int.is_empty() { Ok(0) } else { int.parse::<u64>() }) else {
        return Some(Err(DurationError::OutOfRange { input: t.to_owned() }));
    };
    let nanos: u32 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().ok()? };
    Some(Ok(Duration::new(secs, nanos)))
}

/// Formats a duration so that [`parse_duration`] reads it back exactly (`1m 30s`, `500ms`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

// Every feature that deserializes a config enables `_serde`.
#[cfg(feature = "_serde")]
pub use serde_impl::{deserialize, opt, opt_with_unit};

#[cfg(feature = "_serde")]
mod serde_impl {
    use std::fmt;
    use std::time::Duration;

    /// Reads a number of seconds or a string in the grammar of [`super::parse_duration`].
    struct Visitor;

    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration: seconds as a number, or a string like \"500ms\", \"2s\", \"1m 30s\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::custom(super::DurationError::OutOfRange { input: v.to_string() }))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
            Duration::try_from_secs_f64(v)
                .map_err(|_| E::custom(super::DurationError::OutOfRange { input: v.to_string() }))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
            super::parse_duration(v).map_err(E::custom)
        }
    }

    /// For `#[serde(deserialize_with = "gpumon_sinks::duration::deserialize")]` on a `Duration`:
    /// a number of seconds or a string in the grammar of [`parse_duration`](super::parse_duration).
    ///
    /// # Errors
    /// The deserializer's error carrying [`DurationError`](super::DurationError)'s text.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(Visitor)
    }

    /// Reads only a string in the grammar of [`super::parse_duration`]: a bare TOML/JSON number
    /// is refused, since whether `5` meant seconds or milliseconds is a guess.
    struct WithUnit;

    impl serde::de::Visitor<'_> for WithUnit {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration as a string with its unit, like \"500ms\", \"2s\", \"1m 30s\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
            Err(E::custom(format_args!(
                "a bare number ({v}) is not a duration here: write it with its unit, \"{v}s\" or \"{v}ms\""
            )))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
            Err(E::custom(format_args!(
                "a bare number ({v}) is not a duration here: write it with its unit, \"{v}s\" or \"{v}ms\""
            )))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
            Err(E::custom(format_args!(
                "a bare number ({v}) is not a duration here: write it with its unit, like \"2s\""
            )))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
            super::parse_duration(v).map_err(E::custom)
        }
    }

    /// For `#[serde(default, with = "gpumon_sinks::duration::opt_with_unit")]` on an
    /// `Option<Duration>` where a bare number is ambiguous (the sampling interval): only a string.
    pub mod opt_with_unit {
        use std::time::Duration;

        /// A string in the grammar of [`parse_duration`](crate::duration::parse_duration), wrapped
        /// in `Some`; a number is an error that says to write the unit.
        ///
        /// # Errors
        /// The deserializer's error for a number or text that is not a duration.
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            d.deserialize_any(super::WithUnit).map(Some)
        }
    }

    /// For `#[serde(default, with = "gpumon_sinks::duration::opt")]` on an `Option<Duration>`
    /// (absent: `None`).
    pub mod opt {
        use std::time::Duration;

        /// As [`deserialize`](super::deserialize), wrapped in `Some`.
        ///
        /// # Errors
        /// As [`deserialize`](super::deserialize).
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            d.deserialize_any(super::Visitor).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_forms_every_section_and_flag_accept() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("2s", Duration::from_secs(2)),
            ("1m 30s", Duration::from_secs(90)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("10", Duration::from_secs(10)),
            ("0.25", Duration::from_millis(250)),
            (" 3s ", Duration::from_secs(3)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn errors_name_the_input_and_show_examples() {
        for bad in ["", "soon", "5 parsecs", "-1s", "1e3", "inf", "NaN", "1.2.3", "s"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")) && e.contains("1m 30s"), "{bad}: {e}");
        }
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn config_values_use_the_same_grammar() {
        #[derive(serde::Deserialize, Debug)]
        struct C {
            #[serde(deserialize_with = "deserialize")]
            d: Duration,
            #[serde(default, with = "opt")]
            o: Option<Duration>,
        }
        let c: C = serde_json::from_str(r#"{"d": "1m 30s", "o": 0.5}"#).unwrap();
        assert_eq!((c.d, c.o), (Duration::from_secs(90), Some(Duration::from_millis(500))));
        let c: C = serde_json::from_str(r#"{"d": 7}"#).unwrap();
        assert_eq!((c.d, c.o), (Duration::from_secs(7), None));
        for bad in [r#"{"d": -1}"#, r#"{"d": -0.5}"#, r#"{"d": "soon"}"#, r#"{"d": true}"#] {
            assert!(serde_json::from_str::<C>(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Whatever gpumon prints as a duration, it reads back exactly.
        #[test]
        fn format_then_parse_round_trips(secs in 0u64..10_000_000_000, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        /// A bare number is seconds, to the millisecond.
        #[test]
        fn bare_numbers_are_seconds(ms in 0u64..1_000_000_000) {
            let text = format!("{}.{:03}", ms / 1000, ms % 1000);
            prop_assert_eq!(parse_duration(&text), Ok(Duration::from_millis(ms)));
        }

        /// Unit sequences add up.
        #[test]
        fn unit_sequences_add_up(h in 0u64..1000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h {m}m {s}s {ms}ms");
            prop_assert_eq!(parse_duration(&text), Ok(Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms)));
        }

        /// No input panics; any error names it.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,24}") {
            if let Err(e) = parse_duration(&text) {
                prop_assert!(e.to_string().contains(&text));
            }
        }
    }
}

//! [`Secret`]: a credential (password, token, a header's value) that `Debug` prints as
//! `<redacted>`.
//!
//! Every setting that holds a credential has this type, so that a config, a sink or an error
//! that is logged with `{:?}` never shows one. This is the one place that decides it: the
//! configs derive `Debug` instead of each writing its own with the secret fields left out (a
//! field added later, or a struct that forgot, printed the credential: the OTLP headers did).
//! The OpenTelemetry Collector treats header values the same way (`configopaque`).
//!
//! Not the `secrecy` crate: the configs compare equal (`PartialEq`, which `secrecy` refuses on
//! purpose) and the value is copied into request headers anyway, so its zeroizing would promise
//! more than the process keeps.

use std::fmt;

/// A credential: compared, cloned and deserialized as the string it holds (a TOML or JSON
/// string), shown by `Debug` as `<redacted>`. [`expose`](Secret::expose) reads it.
///
/// ```
/// use gpumon_sinks::Secret;
/// let token = Secret::from("s3cret");
/// assert_eq!(format!("{token:?}"), "<redacted>");
/// assert_eq!(token.expose(), "s3cret");
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "_serde", derive(serde::Deserialize), serde(transparent))]
pub struct Secret(String);

impl Secret {
    /// The credential itself, for the request that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is the empty string (refused where a credential is required).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What is wrong with it as a token sent or taken as `Authorization: <scheme> <token>`
    /// (bearer, InfluxDB): empty, or holding whitespace or control characters, which a server
    /// splits on or refuses. The one check of every token setting, inbound and outbound.
    // The listener's auth (feature `prometheus`) always checks its token; a build with only
    // sinks that take none (stdout, OTLP) has nothing to check.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn token_problem(&self) -> Option<&'static str> {
        if self.0.is_empty() {
            Some("must not be empty")
        } else if self.0.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            Some("must not contain whitespace or control characters")
        } else {
            None
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<&String> for Secret {
    fn from(s: &String) -> Self {
        Self(s.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    /// The credential (`tests/credentials.rs` checks every setting that holds one).
    const TOKEN: &str = "tok-7f3a9c";

    #[test]
    fn debug_never_prints_the_value() {
        let s = Secret::from(TOKEN);
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(<redacted>)");
        assert_eq!(s.expose(), TOKEN);
    }
}

//! Configuration errors of the mock: every one names the key or value at fault and why.

use std::path::PathBuf;

/// Why a fleet profile, scenario or mock sampler could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Neither a built-in name nor a readable file.
    #[error("unknown {what} `{name}`: not a built-in (known: {known}) and not a file")]
    UnknownName {
        /// `"profile"` or `"scenario"`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// A file could not be read.
    #[error("cannot read {what} file {path}: {source}")]
    Io {
        /// `"profile"` or `"scenario"`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has an unknown or mistyped key.
    #[error("invalid {what} `{origin}`{}: {message}", key.as_ref().map(|k| format!(" at key `{k}`")).unwrap_or_default())]
    Toml {
        /// `"profile"` or `"scenario"`.
        what: &'static str,
        /// File path or built-in name.
        origin: String,
        /// The key at fault, when it can be told.
        key: Option<String>,
        /// The parser's message, with the line.
        message: String,
    },
    /// A key has a value that cannot work.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// The key, with its place, e.g. `devices[2].model`.
        key: String,
        /// Why.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid { key: key.into(), reason: reason.into() }
    }

    /// The key at fault, when the error is about one key.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Invalid { key, .. } => Some(key),
            Self::Toml { key, .. } => key.as_deref(),
            _ => None,
        }
    }

    /// A TOML error, with the key it is about found from the error's span.
    pub(crate) fn toml(what: &'static str, origin: &str, src: &str, e: &toml::de::Error) -> Self {
        Self::Toml {
            what,
            origin: origin.to_owned(),
            key: toml_key(src, e),
            message: e.to_string().trim_end().to_owned(),
        }
    }
}

/// The key a TOML error is about: the unknown field it names, else the key left of the `=`
/// nearest before the error's position on its line.
fn toml_key(src: &str, e: &toml::de::Error) -> Option<String> {
    if let Some(rest) = e.message().split("unknown field `").nth(1) {
        return rest.split('`').next().map(str::to_owned);
    }
    let start = e.span()?.start.min(src.len());
    let before = src.get(..start)?;
    let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    let lhs = line[..line.rfind('=')?].trim_end();
    let key_start = lhs.rfind(|c: char| !(c.is_alphanumeric() || "_-.\"".contains(c))).map_or(0, |i| i + 1);
    let key = lhs[key_start..].trim_matches('"');
    (!key.is_empty()).then(|| key.to_owned())
}

/// Reads the TOML file of a `what` ("profile", "scenario") and parses it with `parse(src, origin)`,
/// the path as the origin: `from_file` of profiles and scenarios alike.
pub(crate) fn parse_file<T>(
    what: &'static str,
    path: &std::path::Path,
    parse: impl FnOnce(&str, &str) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let src =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Io { what, path: path.to_owned(), source })?;
    parse(&src, &path.display().to_string())
}

/// The rule profiles and scenarios share: `name_or_path` is a built-in name, else the path of a
/// TOML file; when it is neither, the built-in lookup's error (which lists the known names) wins.
pub(crate) fn load_builtin_or_file<T>(
    name_or_path: &str,
    builtin: impl FnOnce(&str) -> Result<T, ConfigError>,
    from_file: impl FnOnce(&std::path::Path) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    builtin(name_or_path).or_else(|unknown| {
        let path = std::path::Path::new(name_or_path);
        if path.is_file() {
            from_file(path)
        } else {
            Err(unknown)
        }
    })
}

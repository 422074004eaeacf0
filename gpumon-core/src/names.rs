//! [`named_enum!`](crate::named_enum): one way to give a fieldless enum its stable names.
//!
//! Several enums across the workspace are named in config files, flags, labels and events
//! (finding kinds, severities, workloads, Prometheus naming, stdout format, …). Each used to
//! write the same match twice (variant → name, name → variant) plus `Display`, and the ones parsed
//! from flags wrote their own "unknown …" message. The macro writes them from one list, so a
//! variant cannot get a name without the parser knowing it, and every parse error reads alike.

/// Declares a fieldless enum whose variants each have a stable name, with:
/// - `ALL`: every variant, in declaration order (an array);
/// - `name(self) -> &'static str` (a `const fn`) and `from_name(&str) -> Option<Self>`, its
///   inverse (exact match);
/// - `Display`, writing the name;
/// - `FromStr` with `Err = String`: ``unknown <what> `<value>` (expected `a`, `b` or `c`)``,
///   where `<what>` is the literal after `as`.
///
/// Attributes (doc comments, derives, `#[non_exhaustive]`, serde's, `#[default]` on a variant)
/// are kept where they are written.
///
/// ```
/// gpumon_core::named_enum! {
///     /// How loud.
///     #[derive(Clone, Copy, Debug, PartialEq, Eq)]
///     pub enum Volume as "volume" {
///         /// Barely.
///         Quiet = "quiet",
///         /// Very.
///         Loud = "loud",
///     }
/// }
///
/// assert_eq!(Volume::ALL, [Volume::Quiet, Volume::Loud]);
/// assert_eq!(Volume::Loud.name(), "loud");
/// assert_eq!(Volume::from_name("quiet"), Some(Volume::Quiet));
/// assert_eq!(Volume::Quiet.to_string(), "quiet");
/// assert_eq!("loud".parse::<Volume>(), Ok(Volume::Loud));
/// assert_eq!("Loud".parse::<Volume>().unwrap_err(), "unknown volume `Loud` (expected `quiet` or `loud`)");
/// ```
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $enum:ident as $what:literal {
            $( $(#[$variant_meta:meta])* $variant:ident = $name:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $enum { $( $(#[$variant_meta])* $variant, )+ }

        impl $enum {
            /// Every variant, in declaration order.
            pub const ALL: [$enum; [$($name),+].len()] = [ $( $enum::$variant, )+ ];

            /// The stable name.
            pub const fn name(self) -> &'static str {
                match self { $( $enum::$variant => $name, )+ }
            }

            /// The variant named `name`, as [`Self::name`] spells it.
            pub fn from_name(name: &str) -> ::core::option::Option<Self> {
                match name {
                    $( $name => ::core::option::Option::Some($enum::$variant), )+
                    _ => ::core::option::Option::None,
                }
            }
        }

        impl ::core::fmt::Display for $enum {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::core::str::FromStr for $enum {
            type Err = ::std::string::String;
            fn from_str(s: &str) -> ::core::result::Result<Self, Self::Err> {
                Self::from_name(s).ok_or_else(|| $crate::__unknown_name($what, s, &Self::ALL.map(Self::name)))
            }
        }
    };
}

/// The parse error of a [`named_enum!`](crate::named_enum): ``unknown <what> `<value>` (expected
/// `a`, `b` or `c`)``.
#[doc(hidden)]
pub fn unknown_name(what: &str, value: &str, names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    let expected = match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    format!("unknown {what} `{value}` (expected {expected})")
}

#[cfg(test)]
mod tests {
    use super::unknown_name;

    #[test]
    fn the_expected_names_are_listed_with_or_before_the_last() {
        assert_eq!(unknown_name("format", "x", &["a"]), "unknown format `x` (expected `a`)");
        assert_eq!(unknown_name("format", "x", &["a", "b"]), "unknown format `x` (expected `a` or `b`)");
        assert_eq!(unknown_name("format", "x", &["a", "b", "c"]), "unknown format `x` (expected `a`, `b` or `c`)");
    }
}

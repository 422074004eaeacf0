//! The sinks' flags: `--stdout` and `--stdout-format`, and each listed sink's own flag group
//! (`crate::assembly::sinks::<sink>::Flags`, flattened here from the one list), set onto their
//! config sections (flags win over the file); the library builds the sinks from the sections
//! (`crate::assembly`). A flag that names a sink's destination (`--prometheus-listen`,
//! `--pushgateway-url`, `--influx-url`, `--remote-write-url`, `--otlp-endpoint`/`--otlp-protocol`,
//! `--web-listen`) configures that sink; the others refine a configured one. In a build without
//! a sink's feature, its flag configures an empty section, so that the library refuses it
//! clearly ("built without the `x` feature").

use crate::assembly::config::AgentConfig;
use crate::assembly::sinks::{self, Descriptor};

use crate::cli::common::ConfigError;

macro_rules! sink_args {
    ($($sink:ident),*) => {
        /// The sinks' flags (flattened into the agent's command line).
        #[derive(Debug, clap::Args)]
        pub struct SinkArgs {
            /// Stdout format.
            #[arg(long, value_name = "human|json")]
            pub stdout_format: Option<crate::sinks::stdout::StdoutFormat>,
            /// Also print to stdout when other sinks are configured.
            #[arg(long)]
            pub stdout: bool,
            $(
                #[allow(missing_docs)]
                #[command(flatten)]
                pub $sink: sinks::$sink::Flags,
            )*
        }

        impl SinkArgs {
            /// Sets every sink flag onto `file`.
            ///
            /// ## Errors
            ///
            /// A flag whose value does not parse (an address, a naming, a protocol), or one that
            /// refines a sink nothing configures.
            pub fn onto_config(&self, file: &mut AgentConfig) -> Result<(), ConfigError> {
                $(
                    refinements_have_their_sink(
                        &sinks::$sink::SINK,
                        self.$sink.configures() || file.$sink.is_some(),
                        &self.$sink.refinements(),
                    )?;
                )*
                $( self.$sink.onto(&mut file.$sink).map_err(ConfigError)?; )*
                if self.stdout_format.is_some() {
                    file.stdout.format.clone_from(&self.stdout_format);
                }
                // --stdout, or a format asked for: stdout whatever else is configured.
                if self.stdout || self.stdout_format.is_some() {
                    file.stdout.enabled = Some(true);
                }
                Ok(())
            }
        }
    };
}
sinks::for_each_sink!(sink_args);

/// Refuses a flag that refines a sink which neither a flag nor the config file configures
/// (`--influx-db` without `--influx-url` or `[influxdb]`): it would be silently ignored.
/// A credential whose environment variable is set is not held against the user: a secret may be
/// in every container's environment, whether that agent writes to the sink or not.
fn refinements_have_their_sink(
    sink: &Descriptor,
    configured: bool,
    refinements: &[(&'static str, bool)],
) -> Result<(), ConfigError> {
    if configured {
        return Ok(());
    }
    match refinements.iter().find(|(flag, set)| *set && !sink.set_in_env(flag)) {
        Some((flag, _)) => Err(ConfigError(format!(
            "{flag} refines a sink that is not configured: add {} section to the config file",
            sink.configured_by
        ))),
        None => Ok(()),
    }
}

/// The credential flags that may be set from the environment, every sink's: the sink's
/// section, the variable, the flag.
pub fn from_env() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    sinks::ALL.iter().flat_map(|d| d.env.iter().map(move |(var, flag)| (d.key, *var, *flag)))
}

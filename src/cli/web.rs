//! The live web view: `--web-listen <ADDR>` / `[web]` (gpumon_sinks::web::WebConfig), built by the
//! library (`crate::assembly`).
//!
//! The web view is an exporting sink (its name is not `stdout`): with it, `--backend auto` never
//! falls back to simulated GPUs; the page shows its "simulated data" banner only when the
//! snapshots say `backend = "mock"`, i.e. with `--backend mock`.

use crate::assembly::config::AgentConfig;

use crate::cli::common::ConfigError;

/// The web view's flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WebArgs {
    /// Serve the live web view on this address (e.g. 127.0.0.1:9401): open http://ADDR/.
    #[arg(long, value_name = "ADDR")]
    pub web_listen: Option<String>,
}

impl WebArgs {
    /// `--web-listen`, set onto `[web]` (the flag wins over the file, and configures the web view).
    ///
    /// ## Errors
    ///
    /// The address does not parse.
    pub fn onto_config(&self, file: &mut AgentConfig) -> Result<(), ConfigError> {
        let Some(addr) = &self.web_listen else { return Ok(()) };
        #[cfg(feature = "web")]
        {
            let listen = addr.parse::<std::net::SocketAddr>().map_err(|e| {
                ConfigError(format!("--web-listen: `{addr}` is not an address like 127.0.0.1:9401 ({e})"))
            })?;
            file.web.get_or_insert_default().listen = Some(listen);
        }
        #[cfg(not(feature = "web"))]
        {
            let _ = addr;
            crate::cli::common::configured(&mut file.web, true);
        }
        Ok(())
    }
}

//! The live web view: `--web-listen <ADDR>` / `[web]` (gpumon_sinks::web::WebConfig).
//!
//! The web view is an exporting sink (its name is not `stdout`): with it, `--backend auto` never
//! falls back to simulated GPUs; the page shows its "simulated data" banner only when the
//! snapshots say `backend = "mock"`, i.e. with `--backend mock`.

use gpumon::core::Sink;

use crate::app::{Cli, ConfigError};
use gpumon::assembly::config::AgentConfig;

/// The web view's flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WebArgs {
    /// Serve the live web view on this address (e.g. 127.0.0.1:9401): open http://ADDR/.
    #[arg(long, value_name = "ADDR")]
    pub web_listen: Option<String>,
}

/// The web sink, when `--web-listen` or `[web]` asks for it.
pub fn build(cli: &Cli, file: &AgentConfig) -> Result<Option<Box<dyn Sink>>, ConfigError> {
    if cli.web.web_listen.is_none() && file.web.is_none() {
        return Ok(None);
    }
    #[cfg(feature = "web")]
    {
        use gpumon::sinks::web::{WebConfig, WebSink};
        let mut cfg: WebConfig = file.web.clone().unwrap_or_default();
        if let Some(addr) = &cli.web.web_listen {
            cfg.listen = Some(addr.parse().map_err(|e| {
                ConfigError(format!("--web-listen: `{addr}` is not an address like 127.0.0.1:9401 ({e})"))
            })?);
        }
        let sink = WebSink::from_config(&cfg).map_err(|e| ConfigError(format!("web: {e}")))?;
        if let Some(addr) = sink.local_addr() {
            let scheme = if cfg.tls.is_some() { "https" } else { "http" };
            tracing::info!("web view on {scheme}://{addr}/");
        }
        Ok(Some(Box::new(sink)))
    }
    #[cfg(not(feature = "web"))]
    Err(ConfigError(
        "the web view is configured, but this agent was built without the `web` feature (cargo run --example agent --features web)"
            .to_owned(),
    ))
}

//! Diagnosis, run length and the run report: the flags `--no-diagnose`, `--diagnose-window`,
//! `--duration`, `--report`, `--report-format`, and the `[diagnose]` config section.
//!
//! ```toml
//! [diagnose]
//! enabled = true            # default; --no-diagnose turns it off
//! window = "30s"            # --diagnose-window; at least the sampling interval
//! idle_grace = "60s"        # idle_allocated waits this long for a job that has not run yet
//! disable = ["imbalance"]   # rules switched off (stable kind names)
//!
//! [diagnose.thresholds]     # gpumon_core::diagnose::Thresholds, every value a ratio 0–1
//! starvation_dip = 0.10
//! ```
//! Diagnosis is on by default: it costs microseconds per tick. The report
//! ([`crate::core::report::RunReport`]) is printed to stdout at exit — after `--duration`,
//! Ctrl-C/SIGTERM or `--once` — and does not switch the stdout sink on by itself.
//!
//! The library resolves `[diagnose]` and adds the stages (`crate::assembly`); the flags that set
//! a key are set onto it here, and the run's own (`--duration`, how the report is printed) are
//! used here.

use std::future::Future;
use std::time::Duration;

use crate::assembly::config::DiagnoseSection;
use crate::core::report::compare::RunRecord;
use crate::core::report::ReportHandle;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct DiagnoseArgs {
    /// Turn diagnosis off (it is on by default: findings such as dataloader_starvation or
    /// imbalance are exported to every sink; see docs/diagnosis.md).
    #[arg(long)]
    pub no_diagnose: bool,
    /// How long a condition must hold to raise a finding, and stop holding to clear it
    /// (default 30s, or five intervals when longer; at least one interval, at most 36 000).
    #[arg(
        long,
        value_parser = crate::sinks::duration::parse_duration,
        value_name = "DURATION",
        conflicts_with = "no_diagnose"
    )]
    pub diagnose_window: Option<Duration>,
    /// Run this long, then shut down gracefully (as on SIGTERM).
    #[arg(long, value_parser = crate::sinks::duration::parse_duration, value_name = "DURATION", conflicts_with = "once", allow_hyphen_values = true)]
    pub duration: Option<Duration>,
    /// At exit, print a run report to stdout: an overview (GPUs, idle GPU-time while
    /// allocated, the main cause and the time lost per cause, the settings under which rules
    /// cannot work), then per GPU utilisation mean/p5/p95, peak memory, mean power, energy,
    /// idle time while allocated, and every finding with how long it held and what it cost.
    /// Does not switch the stdout sink on.
    #[arg(long)]
    pub report: bool,
    /// Format of the report (implies --report).
    #[arg(long, value_enum, value_name = "human|json")]
    pub report_format: Option<ReportFormat>,
    /// The human report in full: each diagnosis limitation with its whole reason and remedy
    /// (one line each otherwise; the JSON always has them whole). Implies --report.
    #[arg(long)]
    pub verbose: bool,
}

impl DiagnoseArgs {
    /// Whether a report was asked for (`--report`, `--report-format` or `--verbose`).
    pub fn report_requested(&self) -> bool {
        self.report || self.report_format.is_some() || self.verbose
    }

    /// The human report: one line per limitation, or in full under `--verbose`.
    pub fn human_report(&self, report: &crate::core::report::Report) -> String {
        if self.verbose {
            report.verbose().to_string()
        } else {
            report.to_string()
        }
    }
}

/// How the report is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// A few lines per GPU.
    #[default]
    Human,
    /// One JSON document (gpumon_core::report::Report).
    Json,
}

impl DiagnoseArgs {
    /// `--no-diagnose` and `--diagnose-window`, set onto `[diagnose]` (flags win over the file).
    pub fn onto_config(&self, file: &mut DiagnoseSection) {
        if self.no_diagnose {
            file.enabled = Some(false);
        }
        if self.diagnose_window.is_some() {
            file.window = self.diagnose_window;
        }
    }
}

/// Waits for `signal`, or for `--duration` to pass.
pub async fn run_until(duration: Option<Duration>, signal: impl Future<Output = ()>) {
    match duration {
        Some(d) => {
            tokio::select! {
                _ = signal => {}
                _ = tokio::time::sleep(d) => tracing::info!(duration = ?d, "--duration reached"),
            }
        }
        None => signal.await,
    }
}

/// Prints the report to stdout, when one was asked for. `recorded_backend`: of a replay, the
/// backend that recorded the trace, which the JSON form names (`compare` tells a replay of
/// simulated GPUs from one of real GPUs by it).
pub fn print_report(args: &DiagnoseArgs, handle: Option<&ReportHandle>, recorded_backend: Option<&str>) {
    let Some(handle) = handle else { return };
    let report = handle.report();
    match args.report_format.unwrap_or_default() {
        ReportFormat::Human => {
            let _ = crate::cli::common::print_stdout(&args.human_report(&report));
        }
        ReportFormat::Json => match serde_json::to_string(&match recorded_backend {
            Some(b) => RunRecord::new(report).with_recorded_backend(b),
            None => RunRecord::new(report),
        }) {
            Ok(json) => {
                let _ = crate::cli::common::print_stdout(&(json + "\n"));
            }
            Err(e) => eprintln!("gpumon: cannot encode the report: {e}"),
        },
    }
}

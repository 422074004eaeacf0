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
//! ([`gpumon::core::report::RunReport`]) is printed to stdout at exit — after `--duration`,
//! Ctrl-C/SIGTERM or `--once` — and does not switch the stdout sink on by itself.

use std::future::Future;
use std::time::Duration;

use gpumon::assembly::config::DiagnoseSection;
use gpumon::assembly::defaults;
use gpumon::core::diagnose::{
    limitations, DiagnoseConfig, DiagnoseConfigError, Diagnoser, Limitation, Sampling, Thresholds, DEFAULT_WINDOW,
};
use gpumon::core::report::{ReportHandle, RunReport};
use gpumon::core::{AgentBuilder, Severity};
use serde::Deserialize;

use crate::app::ConfigError;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct DiagnoseArgs {
    /// Turn diagnosis off (it is on by default: findings such as dataloader_starvation or
    /// imbalance are exported to every sink; see docs/diagnosis.md).
    #[arg(long)]
    pub no_diagnose: bool,
    /// How long a condition must hold to raise a finding, and stop holding to clear it
    /// (default 30s; at least the sampling interval).
    #[arg(long, value_parser = gpumon::sinks::duration::parse_duration, value_name = "DURATION")]
    pub diagnose_window: Option<Duration>,
    /// Run this long, then shut down gracefully (as on SIGTERM).
    #[arg(long, value_parser = gpumon::sinks::duration::parse_duration, value_name = "DURATION", conflicts_with = "once")]
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
}

impl DiagnoseArgs {
    /// Whether a report was asked for (`--report` or `--report-format`).
    pub fn report_requested(&self) -> bool {
        self.report || self.report_format.is_some()
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

/// Diagnosis and report settings resolved from the file and the flags.
#[derive(Debug)]
pub struct Plan {
    diagnoser: Option<Diagnoser>,
    /// The diagnosis settings, when diagnosis is on (for the limitations of the run).
    config: Option<DiagnoseConfig>,
    thresholds: Thresholds,
    /// `--duration`.
    pub duration: Option<Duration>,
    report: Option<ReportFormat>,
    handle: Option<ReportHandle>,
}

/// Resolves `[diagnose]` and the flags; every error names the key.
pub fn resolve(args: &DiagnoseArgs, file: &DiagnoseSection, interval: Duration) -> Result<Plan, ConfigError> {
    let mut cfg = DiagnoseConfig::default().with_window(args.diagnose_window.or(file.window).unwrap_or(DEFAULT_WINDOW));
    cfg = cfg.disable_by_name(file.disable.iter().map(String::as_str)).map_err(|e| ConfigError(e.to_string()))?;
    if let Some(table) = &file.thresholds {
        cfg = cfg.with_thresholds(thresholds(table)?);
    }
    if let Some(grace) = file.idle_grace {
        cfg = cfg.with_idle_grace(grace);
    }
    let enabled = !args.no_diagnose && file.enabled.unwrap_or(defaults::DIAGNOSE);
    // Checked even when diagnosis is off, except against the interval: a typo is a typo.
    cfg.validate(enabled.then_some(interval)).map_err(|e| window_error(e, args.diagnose_window.is_some()))?;
    if args.duration.is_some_and(|d| d.is_zero()) {
        return Err(ConfigError("--duration: must be greater than zero".into()));
    }
    let thresholds = cfg.thresholds;
    let config = enabled.then(|| cfg.clone());
    let diagnoser = if enabled { Some(Diagnoser::new(cfg).map_err(|e| ConfigError(e.to_string()))?) } else { None };
    Ok(Plan {
        diagnoser,
        config,
        thresholds,
        duration: args.duration,
        report: args.report_requested().then(|| args.report_format.unwrap_or_default()),
        handle: None,
    })
}

/// `diagnose.window: …`, naming the flag too when the window came from it.
fn window_error(e: DiagnoseConfigError, from_flag: bool) -> ConfigError {
    match &e {
        DiagnoseConfigError::Invalid { key, reason } if key == "window" && from_flag => {
            ConfigError(format!("--diagnose-window / diagnose.window: {reason}"))
        }
        _ => ConfigError(e.to_string()),
    }
}

/// `[diagnose.thresholds]` → [`Thresholds`], naming `diagnose.thresholds.<key>` on any error.
fn thresholds(table: &toml::Table) -> Result<Thresholds, ConfigError> {
    let mut values = toml::Table::new();
    for (key, value) in table {
        let name = format!("diagnose.thresholds.{key}");
        if !Thresholds::NAMES.contains(&key.as_str()) {
            return Err(ConfigError(format!("{name}: unknown threshold (known: {})", Thresholds::NAMES.join(", "))));
        }
        let number = match value {
            toml::Value::Float(f) => *f,
            toml::Value::Integer(i) => *i as f64,
            other => return Err(ConfigError(format!("{name}: expected a number (a ratio 0–1), got {other}"))),
        };
        values.insert(key.clone(), toml::Value::Float(number));
    }
    // All keys are known and numeric, so only the range and ordering checks remain, done by
    // `validate` (which names the key).
    let t = Thresholds::deserialize(toml::Value::Table(values))
        .map_err(|e| ConfigError(format!("diagnose.thresholds: {e}")))?;
    t.validate().map_err(|e| ConfigError(e.to_string()))?;
    Ok(t)
}

impl Plan {
    /// Adds the diagnosis stage and, when a report was asked for, the report after it
    /// (processors run in order: the report reads each tick's diagnosis events). The report
    /// lists the limitations of diagnosing under `sampling` in its overview.
    pub fn install(&mut self, mut builder: AgentBuilder, sampling: Sampling) -> AgentBuilder {
        if let Some(d) = self.diagnoser.take() {
            builder = builder.processor(d);
        }
        if self.report.is_some() {
            let (report, handle) = RunReport::new();
            let report = match &self.config {
                Some(config) => report.with_diagnosis(config, sampling),
                None => report.with_thresholds(&self.thresholds),
            };
            builder = builder.processor(report);
            self.handle = Some(handle);
        }
        builder
    }

    /// The settings under which diagnosis rules cannot work (none when diagnosis is off).
    pub fn limitations(&self, sampling: &Sampling) -> Vec<Limitation> {
        self.config.as_ref().map(|c| limitations(c, sampling)).unwrap_or_default()
    }

    /// Says at start-up what [`Plan::limitations`] finds: a warning for each rule that cannot
    /// raise anything under these settings, an info line for each case no setting reveals.
    pub fn say_limitations(&self, sampling: &Sampling) {
        for l in self.limitations(sampling) {
            match l.severity {
                Severity::Info => tracing::info!("diagnosis limitation: {l}"),
                _ => tracing::warn!("diagnosis limitation: {l}"),
            }
        }
    }

    /// Waits for `signal`, or for `--duration` to pass.
    pub async fn run_until(&self, signal: impl Future<Output = ()>) {
        match self.duration {
            Some(d) => {
                tokio::select! {
                    _ = signal => {}
                    _ = tokio::time::sleep(d) => tracing::info!(duration = ?d, "--duration reached"),
                }
            }
            None => signal.await,
        }
    }

    /// Prints the report to stdout, when one was asked for.
    pub fn print_report(&self) {
        let (Some(format), Some(handle)) = (self.report, &self.handle) else { return };
        let report = handle.report();
        match format {
            ReportFormat::Human => print!("{report}"),
            ReportFormat::Json => match serde_json::to_string(&report) {
                Ok(json) => println!("{json}"),
                Err(e) => eprintln!("gpumon: cannot encode the report: {e}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> DiagnoseSection {
        toml::from_str(text).unwrap()
    }

    fn args() -> DiagnoseArgs {
        DiagnoseArgs { no_diagnose: false, diagnose_window: None, duration: None, report: false, report_format: None }
    }

    #[test]
    fn thresholds_from_the_table() {
        let s = section("[thresholds]\nstarvation_dip = 0.2\nstarvation_peak = 0.7\nidle_level = 0\n");
        let plan = resolve(&args(), &s, Duration::from_secs(1)).unwrap();
        let want = Thresholds::default();
        assert_eq!(plan.thresholds.starvation_dip, 0.2);
        assert_eq!(plan.thresholds.starvation_peak, 0.7);
        assert_eq!(plan.thresholds.idle_level, 0.0);
        assert_eq!(plan.thresholds.imbalance_busy, want.imbalance_busy);
    }

    #[test]
    fn the_example_file_lists_every_threshold_with_its_default() {
        let text = include_str!("../../../examples/agent/gpumon.example.toml");
        let start = text.find("# [diagnose.thresholds]").expect("a [diagnose.thresholds] block");
        // Uncomment the block: it must parse, name every threshold, and show the defaults.
        let block: String = text[start..]
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches('#').trim()))
            .collect();
        let file: toml::Table = toml::from_str(&block).unwrap();
        let table = file["diagnose"]["thresholds"].as_table().unwrap();
        assert_eq!(table.len(), Thresholds::NAMES.len());
        assert_eq!(thresholds(table).unwrap(), Thresholds::default());
    }

    #[test]
    fn bad_settings_name_their_key() {
        let interval = Duration::from_secs(1);
        let cases = [
            ("[thresholds]\nstarvation_dipp = 0.1\n", "diagnose.thresholds.starvation_dipp"),
            ("[thresholds]\nidle_level = 1.5\n", "diagnose.thresholds.idle_level"),
            ("[thresholds]\nidle_level = \"low\"\n", "diagnose.thresholds.idle_level"),
            ("[thresholds]\nnear_oom_clear = 0.99\n", "diagnose.thresholds.near_oom_clear"),
            ("disable = [\"imbalanse\"]\n", "imbalanse"),
            ("window = \"500ms\"\n", "diagnose.window"),
        ];
        for (text, needle) in cases {
            let e = resolve(&args(), &section(text), interval).unwrap_err().0;
            assert!(e.contains(needle), "`{needle}` not in `{e}`");
        }
        let mut a = args();
        a.diagnose_window = Some(Duration::from_millis(200));
        let e = resolve(&a, &DiagnoseSection::default(), interval).unwrap_err().0;
        assert!(e.contains("--diagnose-window"), "{e}");
    }

    #[test]
    fn off_by_flag_or_file_and_the_flag_wins_for_the_window() {
        let mut a = args();
        a.no_diagnose = true;
        assert!(resolve(&a, &DiagnoseSection::default(), Duration::from_secs(1)).unwrap().diagnoser.is_none());
        let off = section("enabled = false\n");
        assert!(resolve(&args(), &off, Duration::from_secs(1)).unwrap().diagnoser.is_none());
        let mut a = args();
        a.diagnose_window = Some(Duration::from_secs(5));
        let plan = resolve(&a, &section("window = \"60s\"\n"), Duration::from_secs(1)).unwrap();
        assert_eq!(plan.diagnoser.unwrap().config().window, Duration::from_secs(5));
    }
}

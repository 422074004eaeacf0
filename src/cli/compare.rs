//! `gpumon-agent compare BEFORE.json AFTER.json [--json]`: what changed between two runs' JSON
//! reports (`gpumon-agent run --report-file`, or `--report-format json`) — step time, utilisation,
//! GPU-time idle while allocated, energy per step, findings raised and gone
//! ([`crate::core::report::compare`]).
//!
//! Exit codes: 0 compared, 2 a file that cannot be read, is not a run report, or is a report of
//! another format version (one line saying which).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::core::report::compare::{compare_runs, RunRecord};
use crate::core::report::REPORT_FORMAT;
use clap::Parser;

/// `gpumon-agent compare`.
#[derive(Debug, Parser)]
#[command(
    name = "gpumon-agent compare",
    about = "What changed between two runs: step time, utilisation, idle GPU-time, energy per step, findings",
    long_about = None
)]
pub struct CompareCli {
    /// The run before (a JSON run report).
    pub before: PathBuf,
    /// The run after.
    pub after: PathBuf,
    /// Print the comparison as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Why a file is not a report this build can compare.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file cannot be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not JSON, or JSON that is not a run report.
    #[error("{path}: not a gpumon run report ({reason})")]
    NotAReport {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A report of another format version.
    #[error("{path}: a run report of format {found}; this gpumon reads format {REPORT_FORMAT} (compare reports written by the same gpumon version)")]
    Format {
        /// The file.
        path: PathBuf,
        /// Its format.
        found: u64,
    },
}

/// Reads a JSON run report, checking that it is one and of this build's format, with what
/// `run` adds beside the report when it is there ([`RunRecord`]).
///
/// ## Errors
///
/// [`ReadError`] naming the file.
pub fn read_report(path: &Path) -> Result<RunRecord, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io { path: path.to_owned(), source })?;
    let not = |reason: String| ReadError::NotAReport { path: path.to_owned(), reason };
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| not(format!("not JSON: {e}")))?;
    let Some(object) = value.as_object() else { return Err(not("not a JSON object".into())) };
    if !(object.contains_key("gpus") && object.contains_key("overview") && object.contains_key("ticks")) {
        return Err(not("no `gpus`, `overview` and `ticks`".into()));
    }
    let found = match object.get("format") {
        None => 0,
        Some(v) => v.as_u64().ok_or_else(|| not(format!("`format` is {v}, not a version number")))?,
    };
    if found != u64::from(REPORT_FORMAT) {
        return Err(ReadError::Format { path: path.to_owned(), found });
    }
    serde_json::from_value(value).map_err(|e| not(e.to_string()))
}

/// Parses `gpumon-agent compare …` (`args` without the program name and `compare`) and runs it.
pub fn main(args: Vec<OsString>) -> u8 {
    let cli = match crate::cli::common::parse::<CompareCli>(
        std::iter::once(OsString::from("gpumon-agent compare")).chain(args),
    ) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let reports = read_report(&cli.before).and_then(|b| Ok((b, read_report(&cli.after)?)));
    let (before, after) = match reports {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("gpumon: compare: {e}");
            return 2;
        }
    };
    let comparison = compare_runs(&before, &after);
    let text = if cli.json {
        match serde_json::to_string(&comparison) {
            Ok(json) => json + "\n",
            Err(e) => {
                eprintln!("gpumon: compare: cannot encode the comparison: {e}");
                return 1;
            }
        }
    } else {
        comparison.to_string()
    };
    // A reader that went away (`| head -1`) ends the printing: not a failure of the comparison.
    let _ = crate::cli::common::print_stdout(&text);
    0
}

//! Record and replay: a trace of every snapshot an agent took, played back later through the
//! same stages and sinks (feature `trace`).
//!
//! - [`RecordSink`] is a [`Sink`](crate::Sink) that writes every snapshot it receives to a trace
//!   file; [`TraceWriter`] is the same writer over any `Write`.
//! - [`ReplaySampler`] is a [`Sampler`](crate::Sampler) that hands out a trace's snapshots in
//!   order, with their recorded times ([`Sampler::keeps_taken_at`](crate::Sampler::keeps_taken_at))
//!   and identities, marked [`REPLAY_BACKEND`](crate::REPLAY_BACKEND) so that no sink exports them
//!   as live data. Run it under an [`Agent`](crate::Agent) with the diagnosis stage and the
//!   findings are those of the live run that recorded the trace.
//! - [`TraceReader`] reads a trace as an iterator of snapshots.
//!
//! # The format (version 1)
//! A gzip-compressed file of JSON lines (an uncompressed file of the same lines is read too):
//!
//! 1. **Line 1, the header** ([`TraceHeader`]): `format` = `"gpumon-trace"`, `version` (the
//!    format version, [`FORMAT_VERSION`]), `gpumon_version` (the writer's), `interval` (the
//!    agent's sampling interval, `{"secs":1,"nanos":0}`), `recorded_at` (Unix nanoseconds),
//!    `backend` (the backend that read the GPUs: `nvml`, `mock`), and the fleet's static
//!    identity: `system` ([`SystemInfo`]) and `devices` (every [`DeviceInfo`], in the first
//!    snapshot's order); optionally (added later in format version 1, absent from older traces)
//!    `metrics` (the families the agent sampled, by name, those it read only for its stages
//!    included: [`RecordSink`] records them) and `step_marks` (whether it read
//!    training-step marks).
//! 2. **Every further line, one snapshot**: the [`Snapshot`](crate::Snapshot)'s JSON (the data model's serde
//!    form: `seq`, `taken_at` in Unix nanoseconds, `duration`, `devices` with every buffered
//!    window, process, NVLink and error, `steps`, `attribution`, `sampling`), except that
//!    - `diagnosis` is never stored: a replay recomputes it, with the diagnosis settings of the
//!      replay;
//!    - `system` is left out while it equals the identity in force (the header's, or the last
//!      one a line carried);
//!    - each device's `info` is its UUID, a string, while its identity equals the one in force
//!      for that UUID; a device that is new or whose static facts changed (a GPU plugged in, a
//!      MIG layout changed) carries its whole `info` object, which is then in force.
//!
//! Sampling failures are recorded too (`"sampling": {"failed": {"reason": …}}`, no devices),
//! so a replay's sinks see the host go down where the live sinks did.
//!
//! **Version rule.** Additive changes — a new optional field, in the header or a snapshot —
//! keep the format version: readers ignore fields they do not know and default the ones a
//! trace lacks. Any change that older readers would misread (a field renamed, removed or
//! redefined) bumps [`FORMAT_VERSION`]. A reader reads the versions it knows (today: 1) whatever
//! gpumon version wrote them, and refuses any other with [`TraceError::Version`], naming both
//! format versions and both gpumon versions.
//!
//! **Errors.** A trace that is empty, not a trace, of another format version, truncated
//! (a writer killed before it closed the file) or corrupt gives a [`TraceError`] naming the
//! line, never a panic; the snapshots before a bad line are still read.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, UNIX_EPOCH};
//! use gpumon_core::trace::{TraceReader, TraceWriter};
//! use gpumon_core::{DeviceInfo, DeviceSample, Snapshot, SystemInfo};
//!
//! let system = Arc::new(SystemInfo::new("node-1", "nvml"));
//! let gpu = Arc::new(DeviceInfo::new(0, "GPU-1234", "NVIDIA H100 80GB HBM3"));
//! let mut writer = TraceWriter::new(Vec::new(), Some(Duration::from_secs(1)));
//! for tick in 1..=3u64 {
//!     let mut sample = DeviceSample::new(gpu.clone());
//!     sample.utilization.gpu = Some(0.25 * tick as f64);
//!     let snapshot = Snapshot::new(system.clone(), vec![sample])
//!         .with_seq(tick)
//!         .with_taken_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000 + tick));
//!     writer.write(&snapshot)?;
//! }
//! let bytes = writer.finish()?;
//!
//! let reader = TraceReader::new(std::io::Cursor::new(bytes))?;
//! assert_eq!(reader.header().devices[0].uuid, "GPU-1234");
//! let snapshots = reader.collect::<Result<Vec<_>, _>>()?;
//! assert_eq!(snapshots.len(), 3);
//! assert_eq!(snapshots[2].devices[0].utilization.gpu, Some(0.75));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod read;
mod replay;
mod write;

use std::time::{Duration, SystemTime};

use crate::metric::{Family, MetricSet};
use crate::model::{DeviceInfo, SystemInfo};

pub use read::TraceReader;
pub use replay::{ReplayProgress, ReplaySampler, ReplaySpeed};
pub use write::{RecordSink, TraceWriter};

/// The `format` of every trace's header.
pub const FORMAT: &str = "gpumon-trace";

/// The trace format version this gpumon writes and reads (see the module docs' version rule).
pub const FORMAT_VERSION: u32 = 1;

/// The gpumon version that writes a trace (the `gpumon_version` of its header).
pub const GPUMON_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A trace's first line: what wrote it, the sampling interval, and the fleet's static identity.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct TraceHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version ([`FORMAT_VERSION`] when this gpumon wrote it).
    pub version: u32,
    /// The version of gpumon that wrote the trace (informative: the format version decides).
    pub gpumon_version: String,
    /// The recording agent's sampling interval; `None` when the writer did not know it (a
    /// [`TraceWriter`] used outside an agent).
    #[serde(default)]
    pub interval: Option<Duration>,
    /// When the header was written.
    #[serde(with = "crate::model::unix_nanos")]
    pub recorded_at: SystemTime,
    /// The backend that read the GPUs (`nvml`, `mock`); replayed snapshots say `replay`.
    #[serde(default)]
    pub backend: String,
    /// The host's facts as the first snapshot gave them.
    #[serde(default)]
    pub system: SystemInfo,
    /// Every device's static identity as the first snapshot gave it, in its order.
    #[serde(default)]
    pub devices: Vec<DeviceInfo>,
    /// The metric families the recording agent sampled, by name ([`Family::name`]); `None` when
    /// the writer was not told ([`TraceWriter::set_sampling`]) or wrote an older trace. A
    /// replay's diagnosis limitations are those of what was recorded
    /// ([`TraceHeader::metric_set`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Vec<String>>,
    /// Whether the recording agent read training-step marks (a step tracker ran, whether or
    /// not a step came); `None` when not known. The snapshots carry the steps themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_marks: Option<bool>,
}

impl TraceHeader {
    /// The families the recording agent sampled ([`TraceHeader::metrics`]); names this gpumon
    /// does not know (a newer writer's) are left out. `None` when the header does not say.
    pub fn metric_set(&self) -> Option<MetricSet> {
        let names = self.metrics.as_ref()?;
        Some(names.iter().filter_map(|n| Family::from_name(n)).fold(MetricSet::nothing(), MetricSet::with))
    }
}

/// Why a trace cannot be read. Every error about the content names the line (the header is
/// line 1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file cannot be opened.
    #[error("cannot open the trace {path}: {source}")]
    Open {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The trace has no header: an empty file (or an empty compressed stream).
    #[error("the trace is empty: no header line (a recording that never received a snapshot?)")]
    Empty,
    /// Line 1 is not a gpumon trace header.
    #[error("line 1: not a gpumon trace: {reason}")]
    NotATrace {
        /// What is wrong with it.
        reason: String,
    },
    /// The trace is of a format version this gpumon does not read.
    #[error(
        "line 1: trace format version {found} (written by gpumon {written_by}) cannot be read by gpumon {reader}, \
         which reads format version {supported}; replay it with a gpumon that reads version {found}"
    )]
    Version {
        /// The trace's format version.
        found: u32,
        /// The gpumon version that wrote it.
        written_by: String,
        /// The format version this gpumon reads.
        supported: u32,
        /// This gpumon's version.
        reader: &'static str,
    },
    /// The data stops before its end: a compressed stream that ends early, or a last line that
    /// stops without its newline and does not parse (a plain trace cut off). The writer was
    /// stopped before it closed the file (killed, out of disk); the lines before are intact. (A
    /// bad line that ends with its newline is [`TraceError::Corrupt`].)
    #[error("line {line}: the trace is truncated (its writer did not finish it): {source}")]
    Truncated {
        /// The line being read.
        line: u64,
        /// What the decompressor said, or where the cut line stops.
        #[source]
        source: std::io::Error,
    },
    /// The line could not be read: corrupt compressed data, invalid UTF-8, an I/O failure.
    #[error("line {line}: cannot read the trace: {source}")]
    Read {
        /// The line being read.
        line: u64,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The line is not a valid snapshot record (or header).
    #[error("line {line}: corrupt record: {reason}")]
    Corrupt {
        /// The line.
        line: u64,
        /// What is wrong, with the column where JSON parsing stopped.
        reason: String,
    },
}

impl TraceError {
    /// The line the error is about, when it is about the content.
    pub fn line(&self) -> Option<u64> {
        match self {
            Self::NotATrace { .. } | Self::Version { .. } => Some(1),
            Self::Truncated { line, .. } | Self::Read { line, .. } | Self::Corrupt { line, .. } => Some(*line),
            Self::Open { .. } | Self::Empty => None,
        }
    }
}

/// `reason` of a serde_json error about one line: the message and the column, without serde's
/// "at line 1" (every record is one line; the trace's line number is in the error itself).
fn json_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let message = text.rsplit_once(" at line ").map_or(text.as_str(), |(m, _)| m);
    if e.column() > 0 {
        format!("{message} (column {})", e.column())
    } else {
        message.to_owned()
    }
}

#[cfg(test)]
mod tests;

//! Reading traces: [`TraceReader`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use flate2::bufread::MultiGzDecoder;
use serde_json::Value;

use super::{json_reason, TraceError, TraceHeader, FORMAT, FORMAT_VERSION, GPUMON_VERSION};
use crate::model::{DeviceInfo, Snapshot, SystemInfo};

/// Longest line read (a snapshot of 64 GPUs with their processes is well under 1 MiB): a
/// corrupt or hostile trace with no newline for gigabytes is refused instead of read into memory.
pub(crate) const MAX_LINE_BYTES: u64 = 16 << 20;

/// The two bytes every gzip stream starts with.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads a trace: the header at once, then the snapshots as an iterator, each with its
/// recorded `seq`, `taken_at`, steps and attribution, and no diagnosis.
///
/// Snapshots are read one line at a time (a trace of hours is never in memory as a whole). An
/// error ends the iteration: the `Err` names the line, and every snapshot before it has been
/// yielded.
pub struct TraceReader {
    input: Box<dyn BufRead + Send>,
    header: TraceHeader,
    /// The line last read (the header is line 1).
    line: u64,
    system: Arc<SystemInfo>,
    devices: HashMap<String, Arc<DeviceInfo>>,
    buf: String,
    done: bool,
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader").field("header", &self.header).field("line", &self.line).finish_non_exhaustive()
    }
}

impl TraceReader {
    /// Opens the trace at `path` (gzip-compressed or not) and reads its header.
    ///
    /// # Errors
    /// [`TraceError::Open`], or as [`TraceReader::new`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| TraceError::Open { path: path.to_owned(), source })?;
        Self::new(file)
    }

    /// Reads a trace from `input` (gzip-compressed or not) and its header.
    ///
    /// # Errors
    /// [`TraceError::Empty`], [`TraceError::NotATrace`], [`TraceError::Version`], or an error
    /// reading line 1.
    pub fn new(input: impl Read + Send + 'static) -> Result<Self, TraceError> {
        let mut raw = BufReader::new(input);
        let compressed =
            raw.fill_buf().map_err(|source| TraceError::Read { line: 1, source })?.starts_with(&GZIP_MAGIC);
        let input: Box<dyn BufRead + Send> =
            if compressed { Box::new(BufReader::new(MultiGzDecoder::new(raw))) } else { Box::new(raw) };
        let mut reader = Self {
            input,
            header: placeholder_header(),
            line: 0,
            system: Arc::default(),
            devices: HashMap::new(),
            buf: String::new(),
            done: false,
        };
        if !reader.next_line()? {
            return Err(TraceError::Empty);
        }
        reader.header = parse_header(&reader.buf)?;
        reader.system = Arc::new(reader.header.system.clone());
        for info in &reader.header.devices {
            reader.devices.insert(info.uuid.clone(), Arc::new(info.clone()));
        }
        Ok(reader)
    }

    /// The trace's header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The line last read (1: the header).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// Reads the next non-blank line into `buf`; `false` at the end.
    fn next_line(&mut self) -> Result<bool, TraceError> {
        loop {
            self.buf.clear();
            let line = self.line + 1;
            match (&mut self.input).take(MAX_LINE_BYTES + 1).read_line(&mut self.buf) {
                Ok(0) => return Ok(false),
                Ok(n) if n as u64 > MAX_LINE_BYTES => {
                    return Err(TraceError::Corrupt {
                        line,
                        reason: format!("longer than {} MiB", MAX_LINE_BYTES >> 20),
                    })
                }
                Ok(_) => {
                    self.line = line;
                    if !self.buf.trim().is_empty() {
                        return Ok(true);
                    }
                }
                Err(source) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(TraceError::Truncated { line, source })
                }
                Err(source) => return Err(TraceError::Read { line, source }),
            }
        }
    }

    /// Parses the line in `buf` as a snapshot, filling in the identity it leaves out.
    fn record(&mut self) -> Result<Snapshot, TraceError> {
        let line = self.line;
        let corrupt = |reason: String| TraceError::Corrupt { line, reason };
        let mut value: Value = serde_json::from_str(self.buf.trim_end()).map_err(|e| {
            // Only the end of the input leaves a line without its newline: a last line that
            // stops mid-record is where its writer stopped (killed before the file was
            // finished), as a gzip stream that ends early is. A bad line with more after it
            // (it ends with its newline) is corrupt.
            if self.buf.ends_with('\n') {
                corrupt(json_reason(&e))
            } else {
                TraceError::Truncated { line, source: unfinished_line(&e) }
            }
        })?;
        let Value::Object(record) = &mut value else {
            return Err(corrupt("not a JSON object".to_owned()));
        };
        // The identity left out is filled in after parsing, from the shared `Arc`s (an empty
        // object stands in for it: every field of both has a default).
        let inline_system = record.contains_key("system");
        if !inline_system {
            record.insert("system".to_owned(), Value::Object(Default::default()));
        }
        let mut shared: Vec<Option<Arc<DeviceInfo>>> = Vec::new();
        if let Some(Value::Array(devices)) = record.get_mut("devices") {
            for device in devices.iter_mut() {
                let Some(Value::String(uuid)) = device.get("info") else {
                    shared.push(None);
                    continue;
                };
                let Some(info) = self.devices.get(uuid) else {
                    return Err(corrupt(format!(
                        "device `{uuid}` has no identity: neither the header nor an earlier line gave its info"
                    )));
                };
                shared.push(Some(info.clone()));
                device["info"] = Value::Object(Default::default());
            }
        }
        let mut snapshot: Snapshot = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        if inline_system {
            self.system = snapshot.system.clone();
        } else {
            snapshot.system = self.system.clone();
        }
        for (device, info) in snapshot.devices.iter_mut().zip(shared) {
            match info {
                Some(info) => device.info = info,
                None => {
                    self.devices.insert(device.info.uuid.clone(), device.info.clone());
                }
            }
        }
        // Diagnosis is never stored; a hand-edited line that has one does not pass it on.
        snapshot.outputs.remove(crate::stages::diagnose::finding::DIAGNOSIS_KEY);
        Ok(snapshot)
    }
}

impl Iterator for TraceReader {
    type Item = Result<Snapshot, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let result = match self.next_line() {
            Ok(false) => {
                self.done = true;
                return None;
            }
            Ok(true) => self.record(),
            Err(e) => Err(e),
        };
        self.done = result.is_err();
        Some(result)
    }
}

/// What a truncated plain trace says: its last line stops without its newline and does not
/// parse (`json` says where).
fn unfinished_line(json: &serde_json::Error) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("its last line stops mid-record, without its newline ({})", json_reason(json)),
    )
}

fn placeholder_header() -> TraceHeader {
    TraceHeader {
        format: FORMAT.to_owned(),
        version: FORMAT_VERSION,
        gpumon_version: GPUMON_VERSION.to_owned(),
        interval: None,
        recorded_at: std::time::UNIX_EPOCH,
        backend: String::new(),
        system: SystemInfo::default(),
        devices: Vec::new(),
        metrics: None,
        step_marks: None,
    }
}

/// Line 1: a gpumon trace of a format version this gpumon reads, or why not.
fn parse_header(line: &str) -> Result<TraceHeader, TraceError> {
    let not_a_trace = |reason: String| TraceError::NotATrace { reason };
    let value: Value = serde_json::from_str(line.trim_end()).map_err(|e| not_a_trace(json_reason(&e)))?;
    match value.get("format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        Some(other) => return Err(not_a_trace(format!("its format is `{other}`, not `{FORMAT}`"))),
        None => return Err(not_a_trace(format!("line 1 has no `format` (a gpumon trace says `{FORMAT}`)"))),
    }
    // The version first, before the rest of the header is parsed: another version's header
    // may not parse as this one's, and the version is what the user needs to hear about.
    let Some(found) = value.get("version").and_then(Value::as_u64) else {
        return Err(not_a_trace("the header has no format `version`".to_owned()));
    };
    if found != u64::from(FORMAT_VERSION) {
        let written_by = value.get("gpumon_version").and_then(Value::as_str).unwrap_or("unknown").to_owned();
        return Err(TraceError::Version {
            found: u32::try_from(found).unwrap_or(u32::MAX),
            written_by,
            supported: FORMAT_VERSION,
            reader: GPUMON_VERSION,
        });
    }
    serde_json::from_value(value).map_err(|e| TraceError::Corrupt { line: 1, reason: format!("bad header: {e}") })
}

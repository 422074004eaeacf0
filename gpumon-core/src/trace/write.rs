//! Writing traces: [`TraceWriter`] over any `Write`, [`RecordSink`] to a file from an agent.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::Value;

use super::{TraceHeader, FORMAT, FORMAT_VERSION, GPUMON_VERSION};
use crate::metric::MetricSet;
use crate::model::{DeviceInfo, Snapshot, SystemInfo};
use crate::sink::{Sink, SinkError};
use crate::telemetry::Telemetry;

/// Writes a trace (see [the format](super)): the header with the first snapshot, then one line
/// per snapshot, gzip-compressed.
///
/// Each snapshot is written as it comes; call [`TraceWriter::flush`] now and then so that a
/// writer killed without [`TraceWriter::finish`] leaves a trace readable up to its last flush.
pub struct TraceWriter<W: Write> {
    out: GzEncoder<W>,
    interval: Option<Duration>,
    /// What the header says was sampled: the families and whether steps were marked.
    sampling: Option<(MetricSet, bool)>,
    header_written: bool,
    /// The identity in force: what a line may leave out.
    system: Option<Arc<SystemInfo>>,
    devices: HashMap<String, Arc<DeviceInfo>>,
    records: u64,
}

impl<W: Write> std::fmt::Debug for TraceWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("interval", &self.interval)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl TraceWriter<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes a trace into it.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: impl AsRef<Path>, interval: Option<Duration>) -> std::io::Result<Self> {
        Ok(Self::new(BufWriter::new(File::create(path)?), interval))
    }
}

impl<W: Write> TraceWriter<W> {
    /// A trace written to `out`; `interval` is the sampling interval the header records.
    pub fn new(out: W, interval: Option<Duration>) -> Self {
        // Level 6 (the default): level 9 saves a few per cent for twice the CPU, on a path that
        // runs every tick.
        Self {
            out: GzEncoder::new(out, Compression::default()),
            interval,
            sampling: None,
            header_written: false,
            system: None,
            devices: HashMap::new(),
            records: 0,
        }
    }

    /// Sets the interval the header records, if it is not written yet.
    pub fn set_interval(&mut self, interval: Option<Duration>) {
        self.interval = interval;
    }

    /// Sets what the header says the recording agent sampled — the metric families, and
    /// whether it read training-step marks — if the header is not written yet: a replay's
    /// diagnosis limitations are those of what was recorded.
    pub fn set_sampling(&mut self, metrics: MetricSet, step_marks: bool) {
        self.sampling = Some((metrics, step_marks));
    }

    /// The underlying writer (what it holds is compressed, up to the last
    /// [`flush`](Self::flush)).
    pub fn get_ref(&self) -> &W {
        self.out.get_ref()
    }

    /// Snapshots written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends `snapshot` (the header first, from it, if this is the first). Its `diagnosis` is
    /// not stored.
    ///
    /// # Errors
    /// The underlying writer failed.
    pub fn write(&mut self, snapshot: &Snapshot) -> std::io::Result<()> {
        if !self.header_written {
            self.write_header(Some(snapshot))?;
        }
        let mut value = serde_json::to_value(snapshot).map_err(std::io::Error::other)?;
        let Value::Object(record) = &mut value else {
            return Err(std::io::Error::other("a snapshot did not serialize to a JSON object"));
        };
        record.remove("diagnosis");
        match &self.system {
            Some(system) if Arc::ptr_eq(system, &snapshot.system) || **system == *snapshot.system => {
                record.remove("system");
            }
            _ => self.system = Some(snapshot.system.clone()),
        }
        if let Some(Value::Array(devices)) = record.get_mut("devices") {
            for (device, sample) in devices.iter_mut().zip(&snapshot.devices) {
                let info = &sample.info;
                let known = self.devices.get(&info.uuid).is_some_and(|k| Arc::ptr_eq(k, info) || **k == **info);
                if known {
                    if let Value::Object(device) = device {
                        device.insert("info".to_owned(), Value::String(info.uuid.clone()));
                    }
                } else {
                    self.devices.insert(info.uuid.clone(), info.clone());
                }
            }
        }
        serde_json::to_writer(&mut self.out, &value).map_err(std::io::Error::other)?;
        self.out.write_all(b"\n")?;
        self.records += 1;
        Ok(())
    }

    fn write_header(&mut self, first: Option<&Snapshot>) -> std::io::Result<()> {
        let system = first.map(|s| SystemInfo::clone(&s.system)).unwrap_or_default();
        let devices: Vec<DeviceInfo> =
            first.map(|s| s.devices.iter().map(|d| DeviceInfo::clone(&d.info)).collect()).unwrap_or_default();
        if let Some(s) = first {
            self.system = Some(s.system.clone());
            for d in &s.devices {
                self.devices.insert(d.info.uuid.clone(), d.info.clone());
            }
        }
        let header = TraceHeader {
            format: FORMAT.to_owned(),
            version: FORMAT_VERSION,
            gpumon_version: GPUMON_VERSION.to_owned(),
            interval: self.interval,
            recorded_at: SystemTime::now(),
            backend: system.backend.clone(),
            system,
            devices,
            metrics: self.sampling.map(|(m, _)| m.iter().map(|f| f.name().to_owned()).collect()),
            step_marks: self.sampling.map(|(_, steps)| steps),
        };
        serde_json::to_writer(&mut self.out, &header).map_err(std::io::Error::other)?;
        self.out.write_all(b"\n")?;
        self.header_written = true;
        Ok(())
    }

    /// Makes everything written so far readable from the file (a gzip sync flush), without
    /// ending the trace.
    ///
    /// # Errors
    /// The underlying writer failed.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Ends the trace (the header alone if no snapshot came) and returns the underlying writer,
    /// flushed.
    ///
    /// # Errors
    /// The underlying writer failed.
    pub fn finish(mut self) -> std::io::Result<W> {
        if !self.header_written {
            self.write_header(None)?;
        }
        let mut out = self.out.finish()?;
        out.flush()?;
        Ok(out)
    }
}

/// How many snapshots the [`RecordSink`] writes between flushes: a recording killed without a
/// shutdown (SIGKILL, power loss) loses at most this many, and a sync flush per snapshot would
/// cost compression (about a fifth of the size at 1 s).
const FLUSH_EVERY: u64 = 60;

/// A [`Sink`] that records every snapshot it receives to a trace file ([`TraceWriter`]): what
/// `gpumon-agent --record FILE` adds. Add it like any sink; the header takes the agent's
/// interval. Snapshots are written as they come (a few kilobytes each, compressed), flushed
/// every 60 and at every [`Sink::flush`], and the file is finished at shutdown.
///
/// ```no_run
/// # async fn demo(sampler: impl gpumon_core::Sampler) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use gpumon_core::trace::RecordSink;
/// use gpumon_core::Agent;
///
/// let handle = Agent::builder(sampler).sink(RecordSink::create("run.gpumon-trace.gz")?).spawn()?;
/// tokio::time::sleep(Duration::from_secs(60)).await;
/// handle.shutdown(Duration::from_secs(5)).await?; // finishes the file
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RecordSink {
    path: PathBuf,
    writer: Option<TraceWriter<BufWriter<File>>>,
    unflushed: u64,
}

impl RecordSink {
    /// Creates (or truncates) the trace file now, so that a path that cannot be written fails
    /// when the agent is set up, not at the first tick.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let writer = TraceWriter::create(&path, None)?;
        Ok(Self { path, writer: Some(writer), unflushed: 0 })
    }

    /// Says in the header what the agent samples — the metric families, and whether it reads
    /// training-step marks — so that a replay's diagnosis limitations are those of what was
    /// recorded ([`TraceWriter::set_sampling`]).
    #[must_use]
    pub fn with_sampling(mut self, metrics: MetricSet, step_marks: bool) -> Self {
        if let Some(w) = &mut self.writer {
            w.set_sampling(metrics, step_marks);
        }
        self
    }

    /// The trace file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn failed(&self, e: &std::io::Error) -> SinkError {
        SinkError::permanent(format!("cannot write the trace {}: {e}", self.path.display()))
    }
}

#[async_trait::async_trait]
impl Sink for RecordSink {
    fn name(&self) -> &str {
        "record"
    }

    fn attach_telemetry(&mut self, telemetry: Telemetry) {
        if let Some(w) = &mut self.writer {
            w.set_interval(telemetry.interval());
        }
    }

    // A trace is replayed through the same stages: it holds what they read live, the families
    // sampled only for them included (`AgentBuilder::sample_for_processors`).
    fn records_stage_inputs(&self) -> bool {
        true
    }

    // Writes are small and go to a local file (the page cache): done inline rather than on the
    // blocking pool, which would cost a thread hand-off per tick.
    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        let Some(w) = &mut self.writer else { return Err(SinkError::AlreadyShutdown) };
        let mut result = w.write(&snapshot);
        self.unflushed += 1;
        if result.is_ok() && self.unflushed >= FLUSH_EVERY {
            self.unflushed = 0;
            result = w.flush();
        }
        result.map_err(|e| self.failed(&e))
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        let Some(w) = &mut self.writer else { return Ok(()) };
        self.unflushed = 0;
        w.flush().map_err(|e| self.failed(&e))
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        let Some(w) = self.writer.take() else { return Ok(()) };
        w.finish().map(drop).map_err(|e| self.failed(&e))
    }
}

//! The outage buffer shared by the push sinks (InfluxDB, remote write): sealed batches in order,
//! bounded by items (lines, samples) and bytes, oldest dropped first, optionally spilled to a
//! directory (InfluxDB line protocol only: spill files are checked line by line on replay).
//!
//! A batch is opaque bytes plus an item count; the sink encodes into [`Buffer::open`] and the
//! transport decides how the bytes go on the wire (gzip, snappy). The field and method names say
//! "lines" for the unit of counting, whatever a sink counts.
//!
//! Nothing here does file I/O while the sink's lock is held, except at start-up
//! ([`Buffer::load_spill`]) and in the sink's `Drop`: the writer and `shutdown` collect the work
//! under the lock ([`Buffer::spill_io`]), run it with `spawn_blocking` ([`SpillIo::run`]) and
//! record the outcome under the lock again ([`Buffer::apply`]).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;

/// One request's worth of line protocol.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) seq: u64,
    /// Shared, so that a spill or a send (the HTTP body itself) can use it outside the lock
    /// without copying.
    pub(crate) body: Bytes,
    pub(crate) lines: usize,
    /// The spill file holding this batch, once written.
    pub(crate) file: Option<PathBuf>,
}

/// Everything not yet acknowledged by the server.
#[derive(Debug)]
pub(crate) struct Buffer {
    /// The owning sink's name, for log lines.
    pub(crate) sink: &'static str,
    /// The batch being filled by `export`.
    pub(crate) open: Vec<u8>,
    pub(crate) open_lines: usize,
    pub(crate) open_since: Option<Instant>,
    /// Sealed batches, oldest first.
    pub(crate) queue: VecDeque<Batch>,
    /// The batch being sent (out of `queue`, never dropped).
    pub(crate) inflight: Option<Batch>,
    pub(crate) next_seq: u64,
    pub(crate) max_lines: usize,
    pub(crate) max_bytes: usize,
    pub(crate) spill_dir: Option<PathBuf>,
    /// Lines dropped because the buffer was full.
    pub(crate) dropped_lines: u64,
    /// Spill I/O problems (reported, not fatal).
    pub(crate) spill_errors: u64,
    pub(crate) last_spill_error: Option<String>,
    /// Spill files written.
    pub(crate) batches_spilled: u64,
    /// Unreadable or corrupt spill files found at start-up and renamed to `*.bad`.
    pub(crate) quarantined: u64,
    /// Spill files of batches that left the buffer (written, refused or dropped), to be deleted
    /// off the async runtime.
    pub(crate) obsolete: Vec<PathBuf>,
    /// The most bytes held since the buffer last drained after holding
    /// [`RELEASE_AFTER_BYTES`] or more (see [`Buffer::drained_after_backlog`]).
    pub(crate) high_water_bytes: usize,
}

/// A drain after the buffer held this much hands the freed memory back to the system
/// ([`crate::delivery::release_freed_memory`]): about 10 s of an 8-GPU node's line protocol at
/// 10 Hz. Shorter hiccups (a batch or two) leave it to the allocator, which reuses it at once.
pub(crate) const RELEASE_AFTER_BYTES: usize = 1 << 20;

/// File work collected under the lock, to run without it (see [`SpillIo::run`]).
#[derive(Debug, Default)]
pub(crate) struct SpillIo {
    dir: Option<PathBuf>,
    write: Vec<(u64, usize, Bytes)>,
    delete: Vec<PathBuf>,
}

/// What [`SpillIo::run`] did.
#[derive(Debug, Default)]
pub(crate) struct SpillDone {
    written: Vec<(u64, PathBuf)>,
    errors: Vec<String>,
}

impl SpillDone {
    /// The I/O could not run at all (its blocking task failed).
    pub(crate) fn failed(message: String) -> Self {
        SpillDone { written: Vec::new(), errors: vec![message] }
    }
}

impl SpillIo {
    /// Writes and deletes the files (blocking).
    pub(crate) fn run(self) -> SpillDone {
        let mut done = SpillDone::default();
        for path in self.delete {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    done.errors.push(format!("cannot remove {}: {e}", path.display()));
                }
            }
        }
        if let Some(dir) = &self.dir {
            for (seq, lines, body) in self.write {
                match write_spill(dir, seq, lines, &body) {
                    Ok(path) => done.written.push((seq, path)),
                    Err(e) => done.errors.push(format!("cannot write spill file in {}: {e}", dir.display())),
                }
            }
        }
        done
    }
}

impl Buffer {
    pub(crate) fn new(max_lines: usize, max_bytes: usize, spill_dir: Option<PathBuf>) -> Self {
        Self {
            sink: "influxdb",
            open: Vec::new(),
            open_lines: 0,
            open_since: None,
            queue: VecDeque::new(),
            inflight: None,
            next_seq: 0,
            max_lines,
            max_bytes,
            spill_dir,
            dropped_lines: 0,
            spill_errors: 0,
            last_spill_error: None,
            batches_spilled: 0,
            quarantined: 0,
            obsolete: Vec::new(),
            high_water_bytes: 0,
        }
    }

    /// Whether the buffer has just drained (nothing queued, nothing in flight) after holding
    /// [`RELEASE_AFTER_BYTES`] or more; resets the high-water mark and gives back the queue's
    /// own capacity, so that the caller can return the freed memory to the system once per
    /// backlog.
    pub(crate) fn drained_after_backlog(&mut self) -> bool {
        if !self.queue.is_empty() || self.inflight.is_some() || self.high_water_bytes < RELEASE_AFTER_BYTES {
            return false;
        }
        self.high_water_bytes = 0;
        self.queue.shrink_to_fit();
        self.open.shrink_to(self.open.len().max(64 << 10));
        true
    }

    /// Lines held: open + queued + in flight.
    pub(crate) fn lines(&self) -> usize {
        self.open_lines
            + self.queue.iter().map(|b| b.lines).sum::<usize>()
            + self.inflight.as_ref().map_or(0, |b| b.lines)
    }

    /// Bytes held: open + queued + in flight.
    pub(crate) fn bytes(&self) -> usize {
        self.open.len()
            + self.queue.iter().map(|b| b.body.len()).sum::<usize>()
            + self.inflight.as_ref().map_or(0, |b| b.body.len())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.open_lines == 0 && self.queue.is_empty() && self.inflight.is_none()
    }

    /// Moves the open batch to the queue: its buffer becomes the batch's body, without a copy
    /// (trimmed to its length, so that what the bounds count is what is held), and the next
    /// open batch starts with room for as much.
    pub(crate) fn seal(&mut self) {
        if self.open_lines == 0 {
            self.open.clear();
            self.open_since = None;
            return;
        }
        let len = self.open.len();
        let mut body = std::mem::replace(&mut self.open, Vec::with_capacity(len));
        body.shrink_to_fit();
        let body = Bytes::from(body);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back(Batch { seq, body, lines: self.open_lines, file: None });
        self.open_lines = 0;
        self.open_since = None;
    }

    /// Drops the oldest data until the bounds hold again; returns the lines dropped.
    pub(crate) fn enforce_bounds(&mut self) -> usize {
        let mut dropped = 0;
        let (mut lines, mut bytes) = (self.lines(), self.bytes());
        while lines > self.max_lines || bytes > self.max_bytes {
            if let Some(batch) = self.queue.pop_front() {
                lines -= batch.lines;
                bytes -= batch.body.len();
                dropped += batch.lines;
                self.done_with(batch);
            } else if self.open_lines > 0 {
                lines -= self.open_lines;
                bytes -= self.open.len();
                dropped += self.open_lines;
                self.open.clear();
                self.open_lines = 0;
                self.open_since = None;
            } else {
                break; // only the batch in flight is left
            }
        }
        self.dropped_lines += dropped as u64;
        self.high_water_bytes = self.high_water_bytes.max(bytes);
        dropped
    }

    /// A batch left the buffer for good: its spill file, if any, is to be deleted.
    pub(crate) fn done_with(&mut self, batch: Batch) {
        if let Some(path) = batch.file {
            self.obsolete.push(path);
        }
    }

    /// The file work due now: deleting obsolete spill files and, with `spill` (and a spill
    /// directory), writing every queued batch — and with `include_inflight` the one being sent —
    /// that has no spill file yet. `None` when there is nothing to do.
    pub(crate) fn spill_io(&mut self, spill: bool, include_inflight: bool) -> Option<SpillIo> {
        let mut io = SpillIo { delete: std::mem::take(&mut self.obsolete), ..SpillIo::default() };
        if let (true, Some(dir)) = (spill, &self.spill_dir) {
            io.dir = Some(dir.clone());
            let inflight = self.inflight.iter().filter(|_| include_inflight);
            for b in self.queue.iter().chain(inflight).filter(|b| b.file.is_none()) {
                io.write.push((b.seq, b.lines, b.body.clone()));
            }
        }
        (!io.write.is_empty() || !io.delete.is_empty()).then_some(io)
    }

    /// Records what [`SpillIo::run`] did. A file written for a batch that has left the buffer
    /// meanwhile (sent, or dropped) becomes obsolete; returns whether any file is obsolete now.
    pub(crate) fn apply(&mut self, done: SpillDone) -> bool {
        for (seq, path) in done.written {
            self.batches_spilled += 1;
            let batch = self.queue.iter_mut().chain(self.inflight.as_mut()).find(|b| b.seq == seq);
            match batch {
                Some(b) => b.file = Some(path),
                None => self.obsolete.push(path),
            }
        }
        for e in done.errors {
            self.spill_error(e);
        }
        !self.obsolete.is_empty()
    }

    fn spill_error(&mut self, message: String) {
        self.spill_errors += 1;
        if self.last_spill_error.as_deref() != Some(message.as_str()) {
            tracing::warn!(sink = self.sink, error = %message, "spill directory problem; data is kept in memory only");
        }
        self.last_spill_error = Some(message);
    }

    /// Loads the batches a previous run left in the spill directory, oldest first. A file that
    /// cannot be read or does not hold what its name says (a different number of lines, not
    /// UTF-8) is renamed to `<name>.bad`, counted in `quarantined`, logged, and skipped.
    ///
    /// # Errors
    /// Only when the directory itself cannot be created or listed.
    pub(crate) fn load_spill(&mut self) -> std::io::Result<usize> {
        let Some(dir) = self.spill_dir.clone() else { return Ok(0) };
        std::fs::create_dir_all(&dir)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(e) => {
                    self.spill_error(format!("cannot list {}: {e}", dir.display()));
                    continue;
                }
            };
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if let Some((seq, lines)) = parse_spill_name(name) {
                found.push((seq, lines, path));
            }
        }
        found.sort_by_key(|(seq, _, _)| *seq);
        let mut loaded = 0;
        for (seq, lines, path) in found {
            // New batches sort after every file found (even one set aside).
            self.next_seq = self.next_seq.max(seq + 1);
            match read_spill(&path, lines) {
                Ok(body) => {
                    loaded += lines;
                    self.queue.push_back(Batch { seq, body: Bytes::from(body), lines, file: Some(path) });
                }
                Err(why) => self.quarantine(&path, &why),
            }
        }
        self.enforce_bounds();
        Ok(loaded)
    }

    fn quarantine(&mut self, path: &Path, why: &str) {
        self.quarantined += 1;
        let mut bad = path.as_os_str().to_owned();
        bad.push(".bad");
        let bad = PathBuf::from(bad);
        match std::fs::rename(path, &bad) {
            Ok(()) => tracing::warn!(
                sink = self.sink, file = %path.display(), moved_to = %bad.display(), reason = why,
                "corrupt spill file set aside; its data is not replayed"
            ),
            Err(e) => tracing::warn!(
                sink = self.sink, file = %path.display(), reason = why, error = %e,
                "corrupt spill file skipped (and could not be renamed to *.bad)"
            ),
        }
    }
}

fn spill_name(seq: u64, lines: usize) -> String {
    format!("{seq:020}-{lines}.lp")
}

fn parse_spill_name(name: &str) -> Option<(u64, usize)> {
    let stem = name.strip_suffix(".lp")?;
    let (seq, lines) = stem.split_once('-')?;
    Some((seq.parse().ok()?, lines.parse().ok()?))
}

/// A spill file's body, checked against the line count in its name.
fn read_spill(path: &Path, lines: usize) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let body = String::from_utf8(bytes).map_err(|e| format!("not line protocol (invalid UTF-8: {e})"))?.into_bytes();
    let found = body.iter().filter(|&&b| b == b'\n').count();
    if found != lines || lines == 0 || !body.ends_with(b"\n") {
        return Err(format!("holds {found} complete lines where its name says {lines}"));
    }
    Ok(body)
}

/// Writes a batch to `<dir>/<seq>-<lines>.lp` through a temporary file and a rename, so a crash
/// never leaves a half-written batch under a name that would be replayed.
fn write_spill(dir: &Path, seq: u64, lines: usize, body: &[u8]) -> std::io::Result<PathBuf> {
    let name = spill_name(seq, lines);
    let path = dir.join(&name);
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(b: &mut Buffer, lines: usize) {
        for _ in 0..lines {
            b.open.extend_from_slice(b"m f=1 1\n");
        }
        b.open_lines += lines;
    }

    #[test]
    fn drops_oldest_batches_and_counts_lines() {
        let mut b = Buffer::new(10, 1 << 20, None);
        for _ in 0..4 {
            add(&mut b, 3);
            b.seal();
        }
        assert_eq!(b.lines(), 12);
        assert_eq!(b.enforce_bounds(), 3);
        assert_eq!(b.queue.front().unwrap().seq, 1);
        assert_eq!(b.lines(), 9);
        assert_eq!(b.dropped_lines, 3);
    }

    #[test]
    fn byte_bound_and_inflight_is_never_dropped() {
        let mut b = Buffer::new(100, 40, None);
        add(&mut b, 4); // 32 bytes
        b.seal();
        let batch = b.queue.pop_front().unwrap();
        b.inflight = Some(batch);
        add(&mut b, 2);
        assert_eq!(b.enforce_bounds(), 2);
        assert_eq!(b.lines(), 4);
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpumon-spill-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Persists what `spill_io` asks for, as the writer does.
    fn persist(b: &mut Buffer) {
        if let Some(io) = b.spill_io(true, true) {
            b.apply(io.run());
        }
    }

    #[test]
    fn spill_round_trip() {
        let dir = temp_dir("round-trip");
        let mut b = Buffer::new(100, 1 << 20, Some(dir.clone()));
        b.load_spill().unwrap();
        add(&mut b, 2);
        b.seal();
        add(&mut b, 3);
        b.seal();
        assert!(b.spill_io(false, true).is_none(), "no file work unless asked to spill");
        persist(&mut b);
        assert_eq!(b.batches_spilled, 2);
        let mut again = Buffer::new(100, 1 << 20, Some(dir.clone()));
        assert_eq!(again.load_spill().unwrap(), 5);
        assert_eq!(again.queue.len(), 2);
        assert_eq!(again.queue[0].lines, 2);
        assert_eq!(again.next_seq, 2);
        let first = again.queue.pop_front().unwrap();
        again.done_with(first);
        let io = again.spill_io(false, false).expect("the written batch's file is deleted");
        assert!(!again.apply(io.run()));
        assert_eq!(Buffer::new(100, 1 << 20, Some(dir.clone())).load_spill().unwrap(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_written_for_a_batch_that_left_meanwhile_is_deleted() {
        let dir = temp_dir("orphan");
        let mut b = Buffer::new(100, 1 << 20, Some(dir.clone()));
        b.load_spill().unwrap();
        add(&mut b, 2);
        b.seal();
        let io = b.spill_io(true, false).unwrap();
        let batch = b.queue.pop_front().unwrap(); // sent (or dropped) while the file was written
        b.done_with(batch);
        assert!(b.apply(io.run()), "the new file is obsolete");
        persist(&mut b);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_spill_files_are_quarantined_not_fatal() {
        let dir = temp_dir("corrupt");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(spill_name(1, 2)), "m f=1 1\nm f=2 2\n").unwrap();
        std::fs::write(dir.join(spill_name(2, 2)), b"m f=1 1\n\xff\xfe\n").unwrap(); // not UTF-8
        std::fs::write(dir.join(spill_name(3, 5)), "m f=1 1\nm f=").unwrap(); // truncated
        std::fs::create_dir(dir.join(spill_name(4, 1))).unwrap(); // unreadable
        let mut b = Buffer::new(100, 1 << 20, Some(dir.clone()));
        assert_eq!(b.load_spill().unwrap(), 2);
        assert_eq!(b.quarantined, 3);
        assert_eq!(b.queue.len(), 1);
        assert_eq!(b.next_seq, 5);
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                spill_name(1, 2),
                format!("{}.bad", spill_name(2, 2)),
                format!("{}.bad", spill_name(3, 5)),
                format!("{}.bad", spill_name(4, 1)),
            ]
        );
        // The next start finds only the good file.
        let mut again = Buffer::new(100, 1 << 20, Some(dir.clone()));
        assert_eq!((again.load_spill().unwrap(), again.quarantined), (2, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

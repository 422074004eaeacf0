//! The outage buffer: sealed batches in order, bounded by lines and bytes, oldest dropped first,
//! optionally mirrored to a spill directory.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One request's worth of line protocol.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) seq: u64,
    pub(crate) body: String,
    pub(crate) lines: usize,
    /// The spill file holding this batch, once written.
    pub(crate) file: Option<PathBuf>,
}

/// Everything not yet acknowledged by the server.
#[derive(Debug)]
pub(crate) struct Buffer {
    /// The batch being filled by `export`.
    pub(crate) open: String,
    pub(crate) open_lines: usize,
    pub(crate) open_since: Option<Instant>,
    /// Sealed batches, oldest first.
    pub(crate) queue: VecDeque<Batch>,
    /// The batch being sent (out of `queue`, never dropped).
    pub(crate) inflight: Option<(usize, usize)>,
    pub(crate) next_seq: u64,
    pub(crate) max_lines: usize,
    pub(crate) max_bytes: usize,
    pub(crate) spill_dir: Option<PathBuf>,
    /// Lines dropped because the buffer was full.
    pub(crate) dropped_lines: u64,
    /// Spill I/O problems (reported, not fatal).
    pub(crate) spill_errors: u64,
    pub(crate) last_spill_error: Option<String>,
}

impl Buffer {
    pub(crate) fn new(max_lines: usize, max_bytes: usize, spill_dir: Option<PathBuf>) -> Self {
        Self {
            open: String::new(),
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
        }
    }

    /// Lines held: open + queued + in flight.
    pub(crate) fn lines(&self) -> usize {
        self.open_lines + self.queue.iter().map(|b| b.lines).sum::<usize>() + self.inflight.map_or(0, |(l, _)| l)
    }

    /// Bytes held: open + queued + in flight.
    pub(crate) fn bytes(&self) -> usize {
        self.open.len() + self.queue.iter().map(|b| b.body.len()).sum::<usize>() + self.inflight.map_or(0, |(_, b)| b)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.open_lines == 0 && self.queue.is_empty() && self.inflight.is_none()
    }

    /// Moves the open batch to the queue.
    pub(crate) fn seal(&mut self) {
        if self.open_lines == 0 {
            self.open.clear();
            self.open_since = None;
            return;
        }
        let capacity = self.open.capacity();
        let body = std::mem::replace(&mut self.open, String::with_capacity(capacity));
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
                self.remove_file(&batch);
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
        dropped
    }

    /// Writes every queued batch that has no spill file yet (no-op without a spill directory).
    pub(crate) fn persist(&mut self) {
        let Some(dir) = self.spill_dir.clone() else { return };
        let mut error = None;
        for batch in self.queue.iter_mut().filter(|b| b.file.is_none()) {
            match write_spill(&dir, batch) {
                Ok(path) => batch.file = Some(path),
                Err(e) => error = Some(e),
            }
        }
        if let Some(e) = error {
            self.spill_error(format!("cannot write spill file in {}: {e}", dir.display()));
        }
    }

    pub(crate) fn remove_file(&mut self, batch: &Batch) {
        if let Some(path) = &batch.file {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    self.spill_error(format!("cannot remove {}: {e}", path.display()));
                }
            }
        }
    }

    fn spill_error(&mut self, message: String) {
        self.spill_errors += 1;
        if self.last_spill_error.as_deref() != Some(message.as_str()) {
            tracing::warn!(sink = "influxdb", error = %message, "spill directory problem; data is kept in memory only");
        }
        self.last_spill_error = Some(message);
    }

    /// Loads the batches a previous run left in the spill directory, oldest first.
    pub(crate) fn load_spill(&mut self) -> std::io::Result<usize> {
        let Some(dir) = self.spill_dir.clone() else { return Ok(0) };
        std::fs::create_dir_all(&dir)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
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
            let body = std::fs::read_to_string(&path)?;
            loaded += lines;
            self.next_seq = self.next_seq.max(seq + 1);
            self.queue.push_back(Batch { seq, body, lines, file: Some(path) });
        }
        // New batches must sort after the replayed ones.
        if let Some(last) = self.queue.back() {
            self.next_seq = self.next_seq.max(last.seq + 1);
        }
        self.enforce_bounds();
        Ok(loaded)
    }
}

fn spill_name(batch: &Batch) -> String {
    format!("{:020}-{}.lp", batch.seq, batch.lines)
}

fn parse_spill_name(name: &str) -> Option<(u64, usize)> {
    let stem = name.strip_suffix(".lp")?;
    let (seq, lines) = stem.split_once('-')?;
    Some((seq.parse().ok()?, lines.parse().ok()?))
}

/// Writes `batch` to `<dir>/<seq>-<lines>.lp` through a temporary file and a rename, so a crash
/// never leaves a half-written batch under a name that would be replayed.
fn write_spill(dir: &Path, batch: &Batch) -> std::io::Result<PathBuf> {
    let path = dir.join(spill_name(batch));
    let tmp = dir.join(format!("{}.tmp", spill_name(batch)));
    std::fs::write(&tmp, batch.body.as_bytes())?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(b: &mut Buffer, lines: usize) {
        for _ in 0..lines {
            b.open.push_str("m f=1 1\n");
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
        b.inflight = Some((batch.lines, batch.body.len()));
        add(&mut b, 2);
        assert_eq!(b.enforce_bounds(), 2);
        assert_eq!(b.lines(), 4);
    }

    #[test]
    fn spill_round_trip() {
        let dir = std::env::temp_dir().join(format!("gpumon-spill-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut b = Buffer::new(100, 1 << 20, Some(dir.clone()));
        b.load_spill().unwrap();
        add(&mut b, 2);
        b.seal();
        add(&mut b, 3);
        b.seal();
        b.persist();
        let mut again = Buffer::new(100, 1 << 20, Some(dir.clone()));
        assert_eq!(again.load_spill().unwrap(), 5);
        assert_eq!(again.queue.len(), 2);
        assert_eq!(again.queue[0].lines, 2);
        assert_eq!(again.next_seq, 2);
        let first = again.queue.pop_front().unwrap();
        again.remove_file(&first);
        assert_eq!(Buffer::new(100, 1 << 20, Some(dir.clone())).load_spill().unwrap(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The owner of a process, read from a proc file system: its cgroup (container, pod, systemd
//! unit) and its real user and group, named from a passwd file.
//!
//! # Where it reads
//! - `<proc root>/<pid>/stat` — field 22, the process's start time (clock ticks since boot),
//!   which tells a reused pid from the process that had it before; and field 4, its parent's
//!   pid (read at every tick, from the same read: a launcher that dies leaves its children to
//!   another parent);
//! - `<proc root>/<pid>/cgroup` — parsed by [`cgroup::parse`];
//! - `<proc root>/<pid>/status` — the real ids on its `Uid:` and `Gid:` lines;
//! - the passwd file (`name:x:uid:…`) — the user name of the uid.
//!
//! The proc root is `/proc` by default. An agent running in a container mounts the host's
//! `/proc` (say at `/host/proc`, read-only) and points [`ProcOwners`] at it, and the host's
//! `/etc/passwd` (say at `/host/etc/passwd`) for user names: the container's own passwd knows
//! none of the host's users. NVML reports pids in the host's PID namespace, so the proc root must
//! be the host's (a container started with the host PID namespace can use its own `/proc`).
//!
//! # Processes, not pids
//! Owners are remembered by pid *and* start time: a pid the kernel gave to a new process (the
//! old one exited, possibly between two ticks, while NVML kept listing the pid) has another
//! start time, and is read again as the new process it is — never shown under the old process's
//! owner. A `stat` that cannot be read says nothing about which process holds the pid (the
//! process exited after NVML listed it, or `hidepid`): the owner known for the pid is kept.
//!
//! # Cost
//! Each tick, one small read per listed pid: its `stat`, for the start time (an open, a read
//! and a close, into reused buffers: no allocation). The rest — `cgroup`, `status` — is read once per process, when
//! it first appears. A pid missing for a tick or two and back is checked the same way; a pid
//! gone for longer is forgotten. The passwd file is read once and again only when a uid is not
//! in it and the file's modification time has changed.
//!
//! # Failures
//! A process that exits between NVML listing it and the read, an unreadable file (a proc
//! mounted with `hidepid`), or a file that cannot be parsed: the owner is what could be read
//! (possibly nothing), [`AttributionStats::proc_read_failures`] counts the failure, and it is
//! logged once per pid. Such a partly read owner is read again, whole, on the next tick, then
//! after 2, 4, 8 … ticks, at most every [`PARTIAL_REREAD_TICKS`], while the pid stays listed: a
//! failure may pass (a process caught mid-start or mid-exit, too many open files, a proc root
//! mounted late). A re-read that fails again is not counted again, and keeps what was known of
//! the process; an owner once complete is never read again while its process lives. Nothing
//! here ever fails a tick.

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::{cgroup, AttributionStats, Owner, SharedOwner};

/// The default proc root.
pub const DEFAULT_PROC_ROOT: &str = "/proc";
/// The default passwd file.
pub const DEFAULT_PASSWD_FILE: &str = "/etc/passwd";

/// Ticks a pid may be missing from the process list before it is forgotten; when it comes back
/// within them, its start time is checked instead of reading it again.
const GRACE_TICKS: u64 = 2;
/// The longest wait, in ticks, before an owner that could only partly be read (a file missing,
/// unreadable or unparsable) is read again, whole: a minute at 1 s, six seconds at 100 ms. The
/// first re-read comes on the next tick, then the waits double up to this.
pub const PARTIAL_REREAD_TICKS: u64 = 60;
/// Most pids remembered as already logged (the set is cleared when full).
const MAX_LOGGED: usize = 4096;

/// Owners of processes by pid, read from a proc root and cached (see the [module docs](self)).
///
/// Call [`begin_tick`](Self::begin_tick), then [`owner`](Self::owner) for every pid of the
/// tick, then [`end_tick`](Self::end_tick), which forgets pids no longer seen. Equal owners are
/// shared: every process of one container and user gets the same `Arc`.
///
/// ```
/// use std::sync::Arc;
/// use gpumon_core::attribution::procfs::ProcOwners;
/// use gpumon_core::attribution::AttributionStats;
///
/// let stats = Arc::new(AttributionStats::default());
/// let mut procs = ProcOwners::new("/proc", "/etc/passwd", stats);
/// procs.begin_tick();
/// let me = procs.owner(std::process::id());
/// procs.end_tick();
/// # #[cfg(target_os = "linux")]
/// assert!(me.is_some_and(|o| o.uid.is_some()));
/// ```
#[derive(Debug)]
pub struct ProcOwners {
    proc_root: PathBuf,
    passwd: Passwd,
    entries: HashMap<u32, Entry>,
    /// One `Arc` per distinct owner; pruned when pids are forgotten.
    interned: HashSet<SharedOwner>,
    tick: u64,
    stats: Arc<AttributionStats>,
    logged: HashSet<u32>,
    buf: Vec<u8>,
    /// Reused for the path of every read (no allocation per tick).
    path: PathBuf,
}

#[derive(Debug)]
struct Entry {
    /// Start time from `stat` (`None` when it could not be read).
    start_time: Option<u64>,
    owner: Option<SharedOwner>,
    /// Its parent's pid, from this tick's `stat` (or the last one that could be read).
    parent_pid: Option<u32>,
    last_seen: u64,
    /// The tick of the read, when a file failed; `None` once everything was read.
    partial_since: Option<u64>,
    /// Re-reads that were still partial, for the doubling wait before the next.
    partial_rereads: u32,
}

impl Entry {
    /// A partly read owner whose time to be read again has come: 1, 2, 4 … ticks after the last
    /// read, at most [`PARTIAL_REREAD_TICKS`].
    fn reread_due(&self, tick: u64) -> bool {
        let wait = 1u64.checked_shl(self.partial_rereads).unwrap_or(u64::MAX).min(PARTIAL_REREAD_TICKS);
        self.partial_since.is_some_and(|read| tick >= read.saturating_add(wait))
    }
}

impl ProcOwners {
    /// Reads processes under `proc_root` and user names from `passwd_file`, counting failures in
    /// `stats`. Nothing is read until the first [`owner`](Self::owner) call.
    pub fn new(proc_root: impl Into<PathBuf>, passwd_file: impl Into<PathBuf>, stats: Arc<AttributionStats>) -> Self {
        Self {
            proc_root: proc_root.into(),
            passwd: Passwd::new(passwd_file.into()),
            entries: HashMap::new(),
            interned: HashSet::new(),
            tick: 0,
            stats,
            logged: HashSet::new(),
            buf: Vec::with_capacity(4096),
            path: PathBuf::new(),
        }
    }

    /// The proc root processes are read under.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Starts a tick: the pids asked for until [`end_tick`](Self::end_tick) are this tick's.
    pub fn begin_tick(&mut self) {
        self.tick += 1;
    }

    /// Ends a tick: forgets pids missing for more than a couple of ticks.
    pub fn end_tick(&mut self) {
        let tick = self.tick;
        let before = self.entries.len();
        self.entries.retain(|_, e| e.last_seen + GRACE_TICKS >= tick);
        if self.entries.len() != before {
            // Owners only the interner still holds belong to no remembered pid.
            self.interned.retain(|o| Arc::strong_count(o) > 1);
        }
    }

    /// How many pids are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no pid is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The parent pid of the process that holds `pid`, as read by this tick's
    /// [`owner`](Self::owner) call for it (the last one that could be read, when this tick's
    /// could not); `None` when it was never read.
    pub fn parent_pid(&self, pid: u32) -> Option<u32> {
        self.entries.get(&pid).and_then(|e| e.parent_pid)
    }

    /// The owner of the process that holds `pid` now (`None` when nothing about it could be read
    /// or nothing is known). Reads the pid's `stat` to tell its process from an earlier holder of
    /// the pid, and the rest only for a process not seen before (or a partly read one, when its
    /// re-read is due).
    pub fn owner(&mut self, pid: u32) -> Option<SharedOwner> {
        let tick = self.tick;
        // `stat` is read once here, whether it confirms a remembered process or starts a fresh read.
        let (start, parent_pid) = match self.read_stat(pid) {
            Ok((start, parent)) => (Ok(start), parent),
            Err(e) => (Err(e), None),
        };
        let rereading = match self.entries.get_mut(&pid) {
            None => false,
            Some(e) => {
                if parent_pid.is_some() {
                    e.parent_pid = parent_pid;
                }
                let another_process = matches!((&start, e.start_time), (Ok(Some(now)), Some(then)) if *now != then);
                if another_process {
                    // The pid was reused: the new process is read, counted and logged as new.
                    self.logged.remove(&pid);
                    false
                } else if e.reread_due(tick) || (e.start_time.is_none() && matches!(start, Ok(Some(_)))) {
                    true
                } else {
                    e.last_seen = tick;
                    return e.owner.clone();
                }
            }
        };
        // A re-read's failures were counted (and logged) at the first read: the counter counts
        // processes whose files failed, not attempts.
        let mut entry = self.read(pid, start, !rereading);
        entry.parent_pid = parent_pid;
        if let (true, Some(old)) = (rereading, self.entries.get(&pid)) {
            entry.parent_pid = entry.parent_pid.or(old.parent_pid);
            if entry.partial_since.is_some() {
                entry.partial_rereads = old.partial_rereads.saturating_add(1);
                // Still not whole: keep what was known of the same process (a `stat` that fails
                // now says nothing about which process it was).
                if entry.start_time.is_none() || entry.start_time == old.start_time {
                    entry.owner = old.owner.clone();
                    entry.start_time = old.start_time;
                }
            }
        }
        let owner = entry.owner.clone();
        self.entries.insert(pid, entry);
        owner
    }

    /// Reads everything about `pid` afresh, given what its `stat` said; failures are counted in
    /// the stats when `count` (always logged once per pid).
    fn read(&mut self, pid: u32, start: std::io::Result<Option<u64>>, count: bool) -> Entry {
        let tick = self.tick;
        let start_time = match start {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                self.fail(pid, "stat", Failure::Garbage("no start time"), count);
                None
            }
            Err(e) => {
                self.fail(pid, "stat", Failure::Io(e), count);
                // Gone or unreadable: the other files will not do better.
                return Entry {
                    start_time: None,
                    owner: None,
                    parent_pid: None,
                    last_seen: tick,
                    partial_since: Some(tick),
                    partial_rereads: 0,
                };
            }
        };
        let mut partial = start_time.is_none();
        let mut owner = match self.read_file(pid, "cgroup") {
            Ok(()) => cgroup::parse(&String::from_utf8_lossy(&self.buf)),
            Err(e) => {
                self.fail(pid, "cgroup", Failure::Io(e), count);
                partial = true;
                Owner::default()
            }
        };
        match self.read_file(pid, "status") {
            Ok(()) => {
                let (uid, gid) = real_ids(&String::from_utf8_lossy(&self.buf));
                if uid.is_none() {
                    self.fail(pid, "status", Failure::Garbage("no Uid line"), count);
                    partial = true;
                }
                owner.uid = uid;
                owner.gid = gid;
                owner.user = uid.and_then(|uid| self.passwd.name(uid));
            }
            Err(e) => {
                self.fail(pid, "status", Failure::Io(e), count);
                partial = true;
            }
        }
        let owner = (!owner.is_unknown()).then(|| self.intern(owner));
        Entry {
            start_time,
            owner,
            parent_pid: None,
            last_seen: tick,
            partial_since: partial.then_some(tick),
            partial_rereads: 0,
        }
    }

    fn intern(&mut self, owner: Owner) -> SharedOwner {
        if let Some(o) = self.interned.get(&owner) {
            return o.clone();
        }
        let o = Arc::new(owner);
        self.interned.insert(o.clone());
        o
    }

    /// The start time (field 22) and the parent pid (field 4) of `<root>/<pid>/stat`, from one
    /// read and one pass over it; `None` for a field the file does not hold as a number.
    fn read_stat(&mut self, pid: u32) -> std::io::Result<(Option<u64>, Option<u32>)> {
        self.read_file(pid, "stat")?;
        let [parent, start] = stat_fields(&self.buf, [4, 22]);
        Ok((start, parent.and_then(|p| u32::try_from(p).ok())))
    }

    fn read_file(&mut self, pid: u32, name: &str) -> std::io::Result<()> {
        // `<root>/<pid>/<name>` in the reused buffer: `stat` is read every tick for every pid.
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        let mut n = pid;
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let pid_text = std::str::from_utf8(&digits[at..]).unwrap_or("0");
        self.path.as_mut_os_string().clear();
        self.path.push(&self.proc_root);
        self.path.push(pid_text);
        self.path.push(name);
        self.buf.clear();
        std::fs::File::open(&self.path)?.read_to_end(&mut self.buf)?;
        Ok(())
    }

    fn fail(&mut self, pid: u32, file: &str, failure: Failure, count: bool) {
        let message = format!("cannot read {}/{pid}/{file}: {failure}", self.proc_root.display());
        if self.logged.len() >= MAX_LOGGED {
            self.logged.clear();
        }
        if self.logged.insert(pid) {
            // A process that exited after NVML listed it is routine; anything else (no
            // permission, garbage) means attribution is not working as deployed.
            let routine = matches!(&failure, Failure::Io(e) if e.kind() == ErrorKind::NotFound);
            log_failure(&message, !routine);
        }
        if count {
            self.stats.record_failure(&self.stats.proc_read_failures, message);
        }
    }
}

/// Why a proc file gave nothing.
enum Failure {
    Io(std::io::Error),
    Garbage(&'static str),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Io(e) => e.fmt(f),
            Failure::Garbage(what) => f.write_str(what),
        }
    }
}

/// Field 22 (`starttime`) of a `stat` file.
#[cfg(test)]
fn start_time(stat: &[u8]) -> Option<u64> {
    stat_field(stat, 22)
}

/// Field `n` (numbered from 1 as proc(5) does: 4 is the parent pid, 22 the start time) of a
/// `/proc/<pid>/stat` file, as a number: after the command name in parentheses (field 2, which
/// may itself hold spaces and parentheses, hence the last `)`), field 3 onward. `None` for
/// fields 1 and 2, and when the file is cut short or the field is not a number. The one
/// `stat` parser of the crate and of `gpumon-agent run` (which walks the job's process tree).
pub fn stat_field(stat: &[u8], n: usize) -> Option<u64> {
    let [field] = stat_fields(stat, [n]);
    field
}

/// Fields `ns` (ascending, numbered as [`stat_field`] numbers them) of a `stat` file, in one pass.
pub fn stat_fields<const N: usize>(stat: &[u8], ns: [usize; N]) -> [Option<u64>; N] {
    let mut out = [None; N];
    let Some(close) = stat.iter().rposition(|&b| b == b')') else { return out };
    let Ok(rest) = std::str::from_utf8(&stat[close + 1..]) else { return out };
    let mut fields = rest.split_ascii_whitespace().enumerate();
    for (slot, n) in out.iter_mut().zip(ns) {
        let Some(index) = n.checked_sub(3) else { continue };
        *slot = fields.by_ref().find(|(i, _)| *i == index).and_then(|(_, f)| f.parse().ok());
    }
    out
}

/// The real uid and gid from a `status` file's `Uid:` and `Gid:` lines.
fn real_ids(status: &str) -> (Option<u32>, Option<u32>) {
    let first = |line: &str| line.split_ascii_whitespace().next().and_then(|v| v.parse().ok());
    let (mut uid, mut gid) = (None, None);
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("Uid:") {
            uid = first(v);
        } else if let Some(v) = line.strip_prefix("Gid:") {
            gid = first(v);
        }
    }
    (uid, gid)
}

/// User names from a passwd file, read lazily and re-read when a uid is missing and the file
/// has changed since.
#[derive(Debug)]
struct Passwd {
    path: PathBuf,
    names: HashMap<u32, String>,
    /// Modification time of the file when read; `None` before the first read.
    read_at: Option<Option<SystemTime>>,
    warned: bool,
}

impl Passwd {
    fn new(path: PathBuf) -> Self {
        Self { path, names: HashMap::new(), read_at: None, warned: false }
    }

    fn name(&mut self, uid: u32) -> Option<String> {
        if let Some(n) = self.names.get(&uid) {
            return Some(n.clone());
        }
        let modified = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if self.read_at != Some(modified) {
            self.reload(modified);
        }
        self.names.get(&uid).cloned()
    }

    fn reload(&mut self, modified: Option<SystemTime>) {
        self.read_at = Some(modified);
        match std::fs::read(&self.path) {
            Ok(bytes) => self.names = parse_passwd(&String::from_utf8_lossy(&bytes)),
            Err(e) => {
                self.names.clear();
                if !self.warned {
                    self.warned = true;
                    let message = format!("cannot read {} ({e}); processes get no user names", self.path.display());
                    log_failure(&message, true);
                }
            }
        }
    }
}

/// `name:password:uid:gid:…` lines; malformed lines are skipped, the first name of a uid wins.
fn parse_passwd(text: &str) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(uid)) = (fields.next(), fields.next(), fields.next()) else { continue };
        if name.is_empty() || name.starts_with('#') || name.starts_with('+') || name.starts_with('-') {
            continue;
        }
        if let Ok(uid) = uid.trim().parse::<u32>() {
            names.entry(uid).or_insert_with(|| name.to_owned());
        }
    }
    names
}

#[cfg(feature = "runtime")]
fn log_failure(message: &str, warn: bool) {
    if warn {
        tracing::warn!("attribution: {message}");
    } else {
        tracing::debug!("attribution: {message}");
    }
}

#[cfg(not(feature = "runtime"))]
fn log_failure(_: &str, _: bool) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_numbered_as_proc_5_numbers_them() {
        let stat = b"4242 (a) b) S 17 4242 4242 0 -1";
        assert_eq!(stat_field(stat, 4), Some(17), "the parent pid");
        assert_eq!(stat_field(stat, 5), Some(4242));
        assert_eq!(stat_field(stat, 3), None, "the state is no number");
        assert_eq!(stat_field(stat, 2), None);
        assert_eq!(stat_field(stat, 1), None);
        assert_eq!(stat_field(stat, 9), None, "cut short");
        assert_eq!(stat_fields(stat, [4, 5]), [Some(17), Some(4242)], "in one pass");
    }

    #[test]
    fn the_start_time_is_field_22_even_with_parentheses_in_the_name() {
        let stat = b"4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(start_time(stat), Some(987_654));
        assert_eq!(start_time(b"4242 (truncated"), None);
        assert_eq!(start_time(b"4242 (x) S 1 2"), None);
    }

    #[test]
    fn real_ids_are_the_first_columns() {
        let status = "Name:\tpython\nUid:\t1000\t0\t0\t0\nGid:\t100\t100\t100\t100\n";
        assert_eq!(real_ids(status), (Some(1000), Some(100)));
        assert_eq!(real_ids("Name: x\n"), (None, None));
    }

    #[test]
    fn passwd_lines_map_uids_to_the_first_name() {
        let names = parse_passwd("root:x:0:0:root:/root:/bin/bash\n# comment\nbad line\nalice:x:1000:1000::/home/alice:/bin/sh\ntoor:x:0:0::/:/bin/sh\n+::::::\n");
        assert_eq!(names.get(&0).map(String::as_str), Some("root"));
        assert_eq!(names.get(&1000).map(String::as_str), Some("alice"));
        assert_eq!(names.len(), 2);
    }
}

//! The steps socket: step marks from other processes, one JSON line each.
//!
//! A training process on a node where the agent already runs does not start a second sampler:
//! it writes its marks to the agent's Unix socket ([`StepSocket`]), which records them in the
//! agent's [`StepRegistry`] exactly as [`TrainingRun::step`](super::TrainingRun::step) would.
//!
//! # Protocol
//! - A Unix **stream** socket. The agent creates it with mode `0660` (owner and group may
//!   connect; see [`SocketConfig::mode`]) — put the training user in the agent's group, or set
//!   the mode.
//! - Each line is one UTF-8 JSON object ending in `\n`, at most [`MAX_LINE`] bytes without the
//!   newline: `{"job":"train","rank":0,"step":42}`. `rank` may be `null` or absent; other keys
//!   are ignored (room for later additions). Blank lines are ignored.
//! - `gpu` (optional): the physical GPUs the run drives, as an index (`5`) or a
//!   `CUDA_VISIBLE_DEVICES`-style string (`"5"`, `"GPU-8f1e…"`, `"MIG-…"`, `"0:1"`, `"4,5"`):
//!   `{"job":"train","rank":1,"step":42,"gpu":"5"}`. The run's step figures and diagnosis are
//!   then those GPUs' ([`StepRegistry::record_from_gpus`]). Without it, rank `r` is taken to
//!   drive GPU `r` — wrong under `CUDA_VISIBLE_DEVICES=4,5`, where rank 1 drives GPU 5: a client
//!   sends `gpu` whenever `CUDA_VISIBLE_DEVICES` is set (the Python `StepClient` does). Indices
//!   are NVML's (PCI bus order); `"all"` names no GPU in particular; a value that is not that
//!   syntax makes the line `malformed`.
//! - Nothing is written back. A client may keep one connection for many steps, and several
//!   clients may connect at once (at most [`SocketConfig::max_connections`], and at most
//!   [`SocketConfig::max_connections_per_uid`] of one Unix user; a connection past either is
//!   closed at once and counted as `connections`).
//! - A line that is not such an object (`malformed`), one longer than the limit (`oversized`),
//!   a mark the registry refuses — a step not above the last one, a bad job name, too many
//!   runs in all or for the user — (`refused`) and a mark for another user's run (`not_owner`)
//!   are dropped and counted in `gpumon_steps_rejected_total{reason}`; the connection stays
//!   open.
//! - **Run segments.** Each connection is a client. A client whose first mark of a job and
//!   rank numbers below the run's last step (a second `fit()` in a new process, numbering from
//!   1 again) marks in the run's next segment, job `<job>#2` (then `#3`, …): none of its marks
//!   is refused, and its first mark starts the segment, so the time between the runs is no
//!   step. A client that goes back on a run it marked itself (numbering restarted each epoch)
//!   and a mark equal to the last one (a retry) are refused.
//!
//! # Who owns a run
//! The agent reads each connection's credentials from the kernel (`SO_PEERCRED`: uid, gid, pid;
//! a client cannot forge them). A run belongs to the uid whose mark registered it (a run the
//! agent's process registered itself, to the agent's uid): another uid's marks for it are refused as `not_owner` (and logged, once per connection), so a user
//! who can reach the socket cannot move another user's steps. One uid holds at most
//! [`SocketConfig::max_runs_per_uid`] runs and [`SocketConfig::max_connections_per_uid`]
//! connections, so that one user cannot fill the table ([`MAX_RUNS`](super::MAX_RUNS)) or the
//! connections and shut the others out. A run with no mark for
//! [`SocketConfig::idle_timeout`] is evicted (checked every tenth of it, at most every 30 s,
//! and whenever a new run would not fit); its next mark registers it again.
//!
//! # Lifecycle
//! [`StepSocket::bind`] replaces a *stale* socket file (one nobody listens on, left by an agent
//! that was killed), refuses to start when another process listens on the path, and never
//! deletes a file that is not a socket. [`StepSocket::serve`] removes the socket file when it
//! returns.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use gpumon_core::steps::socket::{SocketConfig, StepSocket};
//! use gpumon_core::steps::{StepConfig, StepTracker};
//!
//! let (tracker, steps) = StepTracker::new(StepConfig::default())?;
//! // Agent::builder(sampler).processor(tracker) … .spawn()?;
//! # drop(tracker);
//! let socket = StepSocket::bind(SocketConfig::new("/run/gpumon/steps.sock"), steps)?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(socket.serve(async move {
//!     let _ = stopped.await;
//! }));
//! // … at shutdown: the socket file is removed when `serve` returns.
//! let _ = stop.send(());
//! server.await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};

use super::{Peer, Rejection, StepError, StepRegistry};
use crate::{DeviceFilter, DeviceSelector, FilterParseError};

/// Longest line accepted, in bytes, without its newline.
pub const MAX_LINE: usize = 1024;

/// Default bound on concurrent connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// Default bound on one Unix user's concurrent connections: a quarter of
/// [`DEFAULT_MAX_CONNECTIONS`] — one per rank of a 16-GPU node, and four users at their limit
/// before a fifth finds the socket full.
pub const DEFAULT_MAX_CONNECTIONS_PER_UID: usize = 16;

/// Default bound on the runs one Unix user holds: a quarter of [`MAX_RUNS`](super::MAX_RUNS).
pub const DEFAULT_MAX_RUNS_PER_UID: usize = 64;

/// Default time without a mark after which a run registered over the socket is evicted: one
/// hour, longer than an evaluation pass or a checkpoint between two steps.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Where and how the steps socket listens.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketConfig {
    /// The socket's path.
    pub path: PathBuf,
    /// Permission bits of the socket file; default `0o660`.
    pub mode: u32,
    /// Most connections served at once; default [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Most connections of one Unix user served at once; default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_UID`].
    pub max_connections_per_uid: usize,
    /// Most runs one Unix user holds; default [`DEFAULT_MAX_RUNS_PER_UID`].
    pub max_runs_per_uid: usize,
    /// A run registered over the socket with no mark for this long is evicted; default
    /// [`DEFAULT_IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
}

impl SocketConfig {
    /// The default configuration for a socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            mode: 0o660,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_uid: DEFAULT_MAX_CONNECTIONS_PER_UID,
            max_runs_per_uid: DEFAULT_MAX_RUNS_PER_UID,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// Why the steps socket could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another process listens on the path.
    #[error("steps socket {0}: another process is listening on it")]
    InUse(PathBuf),
    /// The path cannot be a socket's ([`check_path`]): too long, or a file that is not a socket
    /// (gpumon does not delete it).
    #[error("steps socket {0}")]
    Path(#[from] PathProblem),
    /// Binding, or setting the permissions, failed.
    #[error("steps socket {path}: {source}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A configuration value out of range.
    #[error("steps socket: {0}")]
    InvalidConfig(String),
}

/// The longest path a Unix socket can be bound at, in bytes: `sockaddr_un.sun_path` (108 bytes
/// on Linux, 104 on the BSDs and macOS) holds the path and its terminating NUL.
pub const MAX_PATH_LEN: usize = if cfg!(target_os = "linux") { 107 } else { 103 };

/// What is wrong with a socket's path, known before binding it ([`check_path`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathProblem {
    /// Longer than [`MAX_PATH_LEN`].
    #[error(
        "{}: {len} bytes, longer than a Unix socket's path may be (at most {MAX_PATH_LEN} bytes: \
         `sun_path` holds {} with the terminating NUL); choose a shorter path",
        path.display(),
        MAX_PATH_LEN + 1
    )]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The path exists and is not a socket (gpumon does not delete it).
    #[error("{}: the path exists and is not a socket (gpumon does not delete it)", .0.display())]
    NotASocket(PathBuf),
}

/// What can be known of a socket's path before binding it: a path longer than a Unix socket's,
/// or one that exists and is not a socket. The one check of both [`StepSocket::bind`] and the
/// agent's configuration (which reports it as an error of `steps.socket` before anything runs).
///
/// # Errors
/// [`PathProblem`].
pub fn check_path(path: &Path) -> Result<(), PathProblem> {
    use std::os::unix::ffi::OsStrExt;
    let len = path.as_os_str().as_bytes().len();
    if len > MAX_PATH_LEN {
        return Err(PathProblem::TooLong { path: path.to_owned(), len });
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => Err(PathProblem::NotASocket(path.to_owned())),
        _ => Ok(()),
    }
}

/// A bound steps socket; [`StepSocket::serve`] runs it.
#[derive(Debug)]
pub struct StepSocket {
    listener: UnixListener,
    config: SocketConfig,
    registry: StepRegistry,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SocketError + '_ {
    move |source| SocketError::Io { path: path.to_owned(), source }
}

impl StepSocket {
    /// Binds the socket at `config.path` (must be called inside a tokio runtime), handling a
    /// stale socket file, and sets its mode. From now on the registry exports
    /// `gpumon_steps_rejected_total`.
    ///
    /// # Errors
    /// [`SocketError::InUse`], [`SocketError::Path`], [`SocketError::Io`],
    /// [`SocketError::InvalidConfig`] for a limit of 0 (`max_connections`,
    /// `max_connections_per_uid`, `max_runs_per_uid`, `idle_timeout`) or a mode above `0o777`.
    pub fn bind(config: SocketConfig, registry: StepRegistry) -> Result<StepSocket, SocketError> {
        for (name, value) in [
            ("max_connections", config.max_connections),
            ("max_connections_per_uid", config.max_connections_per_uid),
            ("max_runs_per_uid", config.max_runs_per_uid),
        ] {
            if value == 0 {
                return Err(SocketError::InvalidConfig(format!("{name} must be at least 1")));
            }
        }
        if config.idle_timeout.is_zero() {
            return Err(SocketError::InvalidConfig("idle_timeout must be above 0".into()));
        }
        if config.mode > 0o777 {
            return Err(SocketError::InvalidConfig(format!("mode {:o} is not a permission mode", config.mode)));
        }
        let path = config.path.as_path();
        check_path(path)?;
        match std::fs::symlink_metadata(path) {
            // A socket (`check_path`): someone listening? Then it is not ours to take.
            // Otherwise it is stale.
            Ok(_) => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(SocketError::InUse(path.to_owned()));
                }
                std::fs::remove_file(path).map_err(io_err(path))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(path)(e)),
        }
        let listener = UnixListener::bind(path).map_err(io_err(path))?;
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(config.mode)) {
            let _ = std::fs::remove_file(path);
            return Err(io_err(path)(e));
        }
        registry.set_peer_limits(config.max_runs_per_uid, config.idle_timeout);
        registry.shared.socket.store(true, Ordering::Release);
        Ok(StepSocket { listener, config, registry })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// Accepts connections and records their marks until `shutdown` completes, then closes the
    /// listener, ends the connections and removes the socket file. Evicts idle runs meanwhile.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let StepSocket { listener, config, registry } = self;
        let slots = Slots::new(config.max_connections, config.max_connections_per_uid);
        let mut tasks = tokio::task::JoinSet::new();
        // Evicting late by a tenth of the timeout is fine; a full table evicts at once anyway.
        let sweep_every = (config.idle_timeout / 10).clamp(Duration::from_millis(10), Duration::from_secs(30));
        let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + sweep_every, sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = sweep.tick() => {
                    registry.evict_idle();
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let peer = match stream.peer_cred() {
                            // pid 0: a process in a pid namespace the agent cannot see into.
                            Ok(c) => Peer::new(
                                c.uid(),
                                c.gid(),
                                c.pid().and_then(|p| u32::try_from(p).ok()).filter(|&p| p != 0),
                            ),
                            Err(e) => {
                                // Nothing to own runs by: not served.
                                tracing::warn!(error = %e, "steps socket: cannot read a client's credentials; closed");
                                registry.reject(Rejection::Connections);
                                continue;
                            }
                        };
                        let Some(slot) = slots.take(peer.uid) else {
                            let n = registry.rejections().map_or(0, |r| r.connections) + 1;
                            registry.reject(Rejection::Connections);
                            if n.is_power_of_two() {
                                tracing::warn!(
                                    uid = peer.uid,
                                    pid = ?peer.pid,
                                    refused_so_far = n,
                                    "steps socket: connection over the limit (all: {}, per uid: {}); closed",
                                    config.max_connections,
                                    config.max_connections_per_uid
                                );
                            }
                            continue;
                        };
                        let registry = registry.clone();
                        let open = registry.connection_guard();
                        tasks.spawn(async move {
                            serve_connection(stream, &registry, &peer).await;
                            drop(slot);
                            drop(open);
                        });
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "steps socket: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        tasks.abort_all();
        drop(listener);
        let _ = std::fs::remove_file(&config.path);
    }
}

/// The connections open, in all and per uid, against their limits.
#[derive(Clone, Debug)]
struct Slots {
    inner: Arc<Mutex<SlotsInner>>,
}

#[derive(Debug)]
struct SlotsInner {
    max: usize,
    max_per_uid: usize,
    open: usize,
    per_uid: HashMap<u32, usize>,
}

/// One connection's place; given back when dropped (also when the connection's task is
/// aborted).
#[derive(Debug)]
struct Slot {
    slots: Slots,
    uid: u32,
}

impl Slots {
    fn new(max: usize, max_per_uid: usize) -> Self {
        Self { inner: Arc::new(Mutex::new(SlotsInner { max, max_per_uid, open: 0, per_uid: HashMap::new() })) }
    }

    /// A place for a connection of `uid`, or `None` when all are taken or `uid` holds its share.
    fn take(&self, uid: u32) -> Option<Slot> {
        let mut s = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = s.per_uid.get(&uid).copied().unwrap_or(0);
        if s.open >= s.max || mine >= s.max_per_uid {
            return None;
        }
        s.open += 1;
        s.per_uid.insert(uid, mine + 1);
        Some(Slot { slots: self.clone(), uid })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.open = s.open.saturating_sub(1);
        if let Some(n) = s.per_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                s.per_uid.remove(&self.uid);
            }
        }
    }
}

/// Reads lines of at most [`MAX_LINE`] bytes without ever buffering more: an oversized line is
/// skipped up to its newline.
async fn serve_connection(mut stream: UnixStream, registry: &StepRegistry, peer: &Peer) {
    // One client per connection: a client's first mark may open a run segment.
    let client = registry.new_client();
    let mut logged = false;
    let mut line: Vec<u8> = Vec::with_capacity(128);
    let mut oversized = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            let (part, rest, complete) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &chunk[chunk.len()..], false),
            };
            chunk = rest;
            if !oversized {
                if line.len() + part.len() > MAX_LINE {
                    oversized = true;
                    line.clear();
                } else {
                    line.extend_from_slice(part);
                }
            }
            if complete {
                if oversized {
                    registry.reject(Rejection::Oversized);
                } else {
                    handle_line(&line, registry, peer, client, &mut logged);
                }
                line.clear();
                oversized = false;
            }
        }
    }
    // A last line without its newline: the client closed mid-line, so it is incomplete.
    if oversized {
        registry.reject(Rejection::Oversized);
    } else if !line.iter().all(u8::is_ascii_whitespace) {
        registry.reject(Rejection::Malformed);
    }
}

#[derive(serde::Deserialize)]
struct Mark<'a> {
    #[serde(borrow)]
    job: std::borrow::Cow<'a, str>,
    #[serde(default)]
    rank: Option<u32>,
    step: u64,
    #[serde(default, borrow)]
    gpu: Option<GpuKey<'a>>,
}

/// The `gpu` key: the GPUs the run drives, an index or a `CUDA_VISIBLE_DEVICES`-style list.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum GpuKey<'a> {
    Index(u32),
    List(#[serde(borrow)] std::borrow::Cow<'a, str>),
}

impl GpuKey<'_> {
    /// The GPUs named; `None` for `"all"` (no GPU in particular), `Err` for a list that is not
    /// `CUDA_VISIBLE_DEVICES` syntax.
    fn filter(&self) -> Result<Option<DeviceFilter>, FilterParseError> {
        let filter = match self {
            GpuKey::Index(i) => DeviceFilter::only([DeviceSelector::Index(*i)]),
            GpuKey::List(list) => DeviceFilter::parse(list)?,
        };
        Ok((!filter.is_all()).then_some(filter))
    }
}

/// One line from `peer` on connection `client` ([`StepRegistry::new_client`]): parse and
/// record, or count why not. The first refusal of a
/// connection is logged (`logged` remembers it): enough to find a misconfigured client, and
/// a flood of bad marks cannot flood the log.
pub(crate) fn handle_line(line: &[u8], registry: &StepRegistry, peer: &Peer, client: u64, logged: &mut bool) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let Ok(mark) = serde_json::from_slice::<Mark<'_>>(line) else {
        registry.reject(Rejection::Malformed);
        return;
    };
    let Ok(gpus) = mark.gpu.as_ref().map(GpuKey::filter).transpose().map(Option::flatten) else {
        registry.reject(Rejection::Malformed);
        return;
    };
    let recorded = registry.record_client(peer, client, &mark.job, mark.rank, gpus.as_ref(), mark.step);
    let Err(e) = recorded else { return };
    let reason = match e {
        StepError::NotOwner { .. } => Rejection::NotOwner,
        _ => Rejection::Refused,
    };
    registry.reject(reason);
    if !std::mem::replace(logged, true) {
        tracing::warn!(
            uid = peer.uid,
            pid = ?peer.pid,
            job = %mark.job.escape_debug(),
            rank = ?mark.rank,
            step = mark.step,
            reason = reason.name(),
            "steps socket: mark refused: {e} (further refusals on this connection are only counted)"
        );
    }
}

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
//! - Nothing is written back. A client may keep one connection for many steps, and several
//!   clients may connect at once (at most [`SocketConfig::max_connections`]; a connection past
//!   that is closed at once and counted).
//! - A line that is not such an object (`malformed`), one longer than the limit (`oversized`),
//!   and a mark the registry refuses — a step not above the last one, a bad job name, too many
//!   runs — (`refused`) are dropped and counted in `gpumon_steps_rejected_total{reason}`; the
//!   connection stays open.
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

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};

use super::{Rejection, StepRegistry};

/// Longest line accepted, in bytes, without its newline.
pub const MAX_LINE: usize = 1024;

/// Default bound on concurrent connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

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
}

impl SocketConfig {
    /// The default configuration for a socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), mode: 0o660, max_connections: DEFAULT_MAX_CONNECTIONS }
    }
}

/// Why the steps socket could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another process listens on the path.
    #[error("steps socket {0}: another process is listening on it")]
    InUse(PathBuf),
    /// The path exists and is not a socket (gpumon does not delete it).
    #[error("steps socket {0}: the path exists and is not a socket")]
    NotASocket(PathBuf),
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
    /// [`SocketError::InUse`], [`SocketError::NotASocket`], [`SocketError::Io`],
    /// [`SocketError::InvalidConfig`] for `max_connections` 0 or a mode above `0o777`.
    pub fn bind(config: SocketConfig, registry: StepRegistry) -> Result<StepSocket, SocketError> {
        if config.max_connections == 0 {
            return Err(SocketError::InvalidConfig("max_connections must be at least 1".into()));
        }
        if config.mode > 0o777 {
            return Err(SocketError::InvalidConfig(format!("mode {:o} is not a permission mode", config.mode)));
        }
        let path = config.path.as_path();
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                // Someone listening? Then it is not ours to take. Otherwise it is stale.
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(SocketError::InUse(path.to_owned()));
                }
                std::fs::remove_file(path).map_err(io_err(path))?;
            }
            Ok(_) => return Err(SocketError::NotASocket(path.to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(path)(e)),
        }
        let listener = UnixListener::bind(path).map_err(io_err(path))?;
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(config.mode)) {
            let _ = std::fs::remove_file(path);
            return Err(io_err(path)(e));
        }
        registry.shared.socket.store(true, Ordering::Release);
        Ok(StepSocket { listener, config, registry })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// Accepts connections and records their marks until `shutdown` completes, then closes the
    /// listener, ends the connections and removes the socket file.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let StepSocket { listener, config, registry } = self;
        let open = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        if open.load(Ordering::Acquire) >= config.max_connections {
                            registry.reject(Rejection::Connections);
                            drop(stream);
                            continue;
                        }
                        open.fetch_add(1, Ordering::AcqRel);
                        let (registry, open) = (registry.clone(), Arc::clone(&open));
                        tasks.spawn(async move {
                            serve_connection(stream, &registry).await;
                            open.fetch_sub(1, Ordering::AcqRel);
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

/// Reads lines of at most [`MAX_LINE`] bytes without ever buffering more: an oversized line is
/// skipped up to its newline.
async fn serve_connection(mut stream: UnixStream, registry: &StepRegistry) {
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
                    handle_line(&line, registry);
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
}

/// One line: parse and record, or count why not.
pub(crate) fn handle_line(line: &[u8], registry: &StepRegistry) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let Ok(mark) = serde_json::from_slice::<Mark<'_>>(line) else {
        registry.reject(Rejection::Malformed);
        return;
    };
    if registry.record(&mark.job, mark.rank, mark.step).is_err() {
        registry.reject(Rejection::Refused);
    }
}

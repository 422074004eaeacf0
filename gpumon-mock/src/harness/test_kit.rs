//! The harness of every test that starts an agent process (feature `test-kit`).
//!
//! An integration test that runs the agent as a user does needs the same few things: start the
//! binary with some flags, kill it when the test ends (also on a failed assertion), wait until
//! its listener answers, read what it wrote, scrape an endpoint until a condition holds, with or
//! without a credential, and a free loopback port for a fixed `--…-listen` address. This module
//! has each of them once:
//!
//! - [`AgentProcess`] (built by [`AgentBuilder`]): a spawned process, killed and reaped on drop;
//!   [`AgentBuilder::spawn`] waits for what [`Ready`] says (the `listening addr=` log line, a
//!   port that accepts, an HTTP path that answers 2xx, or a line on stderr) and fails with the
//!   process's log when it exits first or the wait times out. Its stderr is always collected
//!   ([`AgentProcess::log`]); its stdout is discarded or piped ([`AgentBuilder::stdout_piped`]).
//! - [`Scrape`]: `GET` over a fresh loopback connection with an optional [`Credential`], once
//!   ([`Scrape::get`]) or polled until a condition holds ([`Scrape::until`]), whose panic shows
//!   the last answer.
//! - [`free_port`], [`http_get`] and [`listening_addr`] for the simpler cases.
//! - [`DiscardExporter`] (feature `test-kit-otel`): an OpenTelemetry push exporter that drops
//!   every batch, for benches and tests that need a meter provider but no collector.
//!
//! Everything binds and connects on 127.0.0.1 only. The backend gate and the in-process HTTP
//! stub stay in [`crate::test_env`].
//!
//! ```no_run
//! use gpumon_mock::test_kit::{AgentProcess, Ready, Scrape};
//!
//! let agent = AgentProcess::builder("target/debug/examples/agent")
//!     .args(["--backend", "mock", "--prometheus-listen", "127.0.0.1:0", "--interval", "100ms"])
//!     .env("GPUMON_LOG", "info")
//!     .ready(Ready::ListeningLog)
//!     .spawn();
//! let body = Scrape::new(agent.addr())
//!     .until("a device series", |r| r.status == 200 && r.body().contains("gpumon_gpu_info{"))
//!     .body()
//!     .to_owned();
//! assert!(body.contains("backend=\"mock\""));
//! // Dropping `agent` kills the process.
//! ```

use std::ffi::OsStr;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long [`AgentBuilder::spawn`] waits for the process to be ready unless told otherwise.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A port on 127.0.0.1 that was free a moment ago (bound to port 0, then let go): for a
/// `--…-listen` address that must be known before the process starts.
///
/// # Panics
///
/// When no port on 127.0.0.1 can be bound.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().expect("local address").port()
}

/// `target/<profile>/examples/<name>`, found from the running test binary
/// (`target/<profile>/deps/<test>-<hash>`). It is not built here: `cargo test` builds the
/// examples of the package under test.
///
/// # Panics
///
/// When the test binary's path has no such ancestor.
#[must_use]
pub fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.ancestors().nth(2).expect("target/<profile>/deps/<test>");
    profile_dir.join("examples").join(name)
}

/// The lines a process wrote to stderr so far (shared with the thread that reads them).
pub type AgentLog = Arc<Mutex<Vec<String>>>;

fn lines_of(log: &AgentLog) -> Vec<String> {
    log.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The address in a `listening addr=127.0.0.1:port` log line.
fn listening_in(line: &str) -> Option<SocketAddr> {
    line.split("listening addr=").nth(1)?.split_whitespace().next()?.parse().ok()
}

/// Reads a spawned agent's stderr (which must be piped) until it logs the address its HTTP
/// listener bound (`listening addr=…`, as with `--prometheus-listen 127.0.0.1:0`), for at most
/// 20 s; keeps collecting the rest of its log in the returned [`AgentLog`].
///
/// [`AgentBuilder`] with [`Ready::ListeningLog`] does the same and also kills the process on
/// drop; this is for a test that manages its own [`Child`].
///
/// # Panics
///
/// When no address is logged in time (the child is killed; the message carries its log).
pub fn listening_addr(child: &mut Child) -> (SocketAddr, AgentLog) {
    let stderr = child.stderr.take().expect("the agent's stderr must be piped");
    let log = AgentLog::default();
    let (tx, rx) = mpsc::channel();
    collect_lines(stderr, log.clone(), tx);
    let found = recv_matching(&rx, Instant::now() + DEFAULT_READY_TIMEOUT, listening_in);
    match found {
        Some(addr) => (addr, log),
        None => {
            let _ = child.kill();
            panic!("no `listening addr=` in the agent's log: {:?}", lines_of(&log));
        }
    }
}

/// Reads `from` line by line on a thread of its own into `log`, sending each line to `tx` too.
fn collect_lines(from: impl Read + Send + 'static, log: AgentLog, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            log.lock().unwrap_or_else(PoisonError::into_inner).push(line);
        }
    });
}

/// The first `pick(line)` that is `Some` among the lines received before `deadline`; `None` when
/// the deadline passes or the sender hangs up (the process closed its stderr) first.
fn recv_matching<T>(rx: &mpsc::Receiver<String>, deadline: Instant, pick: impl Fn(&str) -> Option<T>) -> Option<T> {
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let line = rx.recv_timeout(left).ok()?;
        if let Some(found) = pick(&line) {
            return Some(found);
        }
    }
}

/// `GET path` over a fresh loopback connection: (status code, body).
///
/// # Panics
///
/// When the server cannot be reached or does not answer HTTP.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let r = Scrape::new(addr).path(path).get().unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"));
    let body = r.body().to_owned();
    (r.status, body)
}

/// A credential sent in the `Authorization` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `Authorization: Basic base64(<username>:<password>)`.
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: String,
    },
}

impl Credential {
    /// A bearer token.
    #[must_use]
    pub fn bearer(token: &str) -> Self {
        Credential::Bearer(token.to_owned())
    }

    /// A user name and password (HTTP basic authentication).
    #[must_use]
    pub fn basic(username: &str, password: &str) -> Self {
        Credential::Basic { username: username.to_owned(), password: password.to_owned() }
    }

    /// The `Authorization` header's value: `Bearer …` or `Basic …`.
    #[must_use]
    pub fn header_value(&self) -> String {
        match self {
            Credential::Bearer(token) => format!("Bearer {token}"),
            Credential::Basic { username, password } => format!("Basic {}", base64(format!("{username}:{password}"))),
        }
    }

    /// The whole header line, `Authorization: …` (without the line end).
    #[must_use]
    pub fn header(&self) -> String {
        format!("Authorization: {}", self.header_value())
    }
}

/// Standard base64 with padding (RFC 4648 §4).
fn base64(text: String) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.into_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One answer to a [`Scrape`]: the status code and the whole text as read (status line,
/// headers, blank line, body; a chunked body de-chunked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code (`200`, `401`, …).
    pub status: u16,
    /// Everything the server sent, as text.
    pub raw: String,
}

impl Response {
    /// What follows the blank line after the headers.
    #[must_use]
    pub fn body(&self) -> &str {
        self.raw.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    /// The value of the first header called `name` (ASCII case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        let head = self.raw.split_once("\r\n\r\n").map_or(self.raw.as_str(), |(h, _)| h);
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// `GET` of one path on a loopback server, with an optional [`Credential`]: once
/// ([`Scrape::get`]) or until a condition holds ([`Scrape::until`]). Each request is made on a
/// fresh connection (`Connection: close`), so a server that restarts is simply reached again.
///
/// Defaults: path `/metrics`, no credential, 10 s deadline, a try every 50 ms.
#[derive(Clone, Debug)]
pub struct Scrape {
    addr: SocketAddr,
    path: String,
    credential: Option<Credential>,
    timeout: Duration,
    every: Duration,
}

impl Scrape {
    /// `GET /metrics` from `addr`.
    #[must_use]
    pub fn new(addr: SocketAddr) -> Self {
        Scrape {
            addr,
            path: "/metrics".to_owned(),
            credential: None,
            timeout: Duration::from_secs(10),
            every: Duration::from_millis(50),
        }
    }

    /// `GET /metrics` from `127.0.0.1:port`.
    #[must_use]
    pub fn port(port: u16) -> Self {
        Self::new(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// The request target (`/api/snapshot`, `/metrics?x=y`).
    #[must_use]
    pub fn path(mut self, path: &str) -> Self {
        path.clone_into(&mut self.path);
        self
    }

    /// Sends `credential`, or none.
    #[must_use]
    pub fn credential(mut self, credential: Option<Credential>) -> Self {
        self.credential = credential;
        self
    }

    /// Sends `Authorization: Bearer <token>`.
    #[must_use]
    pub fn bearer(self, token: &str) -> Self {
        self.credential(Some(Credential::bearer(token)))
    }

    /// Sends `Authorization: Basic …` for `username:password`.
    #[must_use]
    pub fn basic(self, username: &str, password: &str) -> Self {
        self.credential(Some(Credential::basic(username, password)))
    }

    /// How long [`Scrape::until`] polls before it fails (also the read timeout of one request).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long [`Scrape::until`] sleeps between two tries.
    #[must_use]
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// One request.
    ///
    /// # Errors
    ///
    /// When nothing accepts on the address, the connection fails or times out, or the answer
    /// has no HTTP status line.
    pub fn get(&self) -> std::io::Result<Response> {
        let mut s = TcpStream::connect_timeout(&self.addr, self.timeout)?;
        s.set_read_timeout(Some(self.timeout))?;
        let auth = self.credential.as_ref().map(|c| format!("{}\r\n", c.header())).unwrap_or_default();
        write!(s, "GET {} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n", self.path)?;
        // The head, then a `Content-Length` or chunked body, or everything to the end of the
        // connection.
        let mut reader = std::io::BufReader::new(s);
        let mut raw = String::new();
        let (mut len, mut chunked) = (None, false);
        loop {
            let start = raw.len();
            if reader.read_line(&mut raw)? == 0 {
                break;
            }
            let line = raw[start..].trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                let body = match (chunked, len) {
                    (true, _) => read_chunked(&mut reader)?,
                    (false, Some(n)) => {
                        let mut body = vec![0; n];
                        reader.read_exact(&mut body)?;
                        body
                    }
                    (false, None) => {
                        let mut body = Vec::new();
                        reader.read_to_end(&mut body)?;
                        body
                    }
                };
                raw.push_str(&String::from_utf8_lossy(&body));
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.trim().eq_ignore_ascii_case("content-length") {
                    len = value.trim().parse().ok();
                }
                if name.trim().eq_ignore_ascii_case("transfer-encoding") {
                    chunked = value.to_ascii_lowercase().contains("chunked");
                }
            }
        }
        let status = raw.get(9..12).and_then(|c| c.parse().ok()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an HTTP answer: {raw:?}"))
        })?;
        Ok(Response { status, raw })
    }

    /// One request, which must succeed.
    ///
    /// # Panics
    ///
    /// As [`Scrape::get`]'s errors, with the address and path.
    #[must_use]
    pub fn fetch(&self) -> Response {
        self.get().unwrap_or_else(|e| panic!("GET {} from {}: {e}", self.path, self.addr))
    }

    /// Requests until `done` holds for an answer, and returns that answer. A request that fails
    /// (nothing listening yet, a reset) is tried again like an answer that does not satisfy
    /// `done`.
    ///
    /// # Panics
    ///
    /// When the deadline passes first; the message names `what` and shows the last answer (or
    /// the last error).
    pub fn until(&self, what: &str, mut done: impl FnMut(&Response) -> bool) -> Response {
        let started = Instant::now();
        loop {
            let last = match self.get() {
                Ok(r) if done(&r) => return r,
                Ok(r) => r.raw,
                Err(e) => format!("(no answer: {e})"),
            };
            assert!(
                started.elapsed() < self.timeout,
                "timed out after {:?} waiting for {what} on GET {} from {}; the last answer:\n{last}",
                self.timeout,
                self.path,
                self.addr
            );
            std::thread::sleep(self.every);
        }
    }
}

/// A chunked body, de-chunked (trailers are read and dropped).
fn read_chunked(reader: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("chunk size {line:?}: {e}")))?;
        if size == 0 {
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        line.clear();
        reader.read_line(&mut line)?; // the CRLF after the chunk
    }
}

/// What [`AgentBuilder::spawn`] waits for before it returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ready {
    /// Nothing: return as soon as the process is started.
    Started,
    /// A `listening addr=127.0.0.1:port` line on stderr (the agent logs it at `info` for each
    /// listener; `--…-listen 127.0.0.1:0` binds a free port). [`AgentProcess::addr`] is that
    /// address.
    ListeningLog,
    /// A TCP connection to this address succeeds. [`AgentProcess::addr`] is the address.
    Port(SocketAddr),
    /// `GET path` on this address answers with a 2xx status. [`AgentProcess::addr`] is the
    /// address.
    Http(SocketAddr, String),
    /// A line on stderr contains this text.
    StderrLine(String),
}

/// Starts an [`AgentProcess`]: the command line, the environment, where its stdout goes, and
/// what to wait for.
#[derive(Debug)]
pub struct AgentBuilder {
    command: Command,
    stdout_piped: bool,
    ready: Ready,
    timeout: Duration,
}

impl AgentBuilder {
    /// Runs `command` as configured so far (its stdio is set by the builder).
    #[must_use]
    pub fn from_command(command: Command) -> Self {
        AgentBuilder { command, stdout_piped: false, ready: Ready::Started, timeout: DEFAULT_READY_TIMEOUT }
    }

    /// Adds one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    /// Adds arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    /// Sets an environment variable.
    #[must_use]
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    /// Removes an environment variable.
    #[must_use]
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.command.env_remove(key);
        self
    }

    /// The command, for what the builder has no setter for (`uid`, `current_dir`, …).
    pub fn command_mut(&mut self) -> &mut Command {
        &mut self.command
    }

    /// Pipes stdout, for [`AgentProcess::take_stdout`] (default: discarded).
    #[must_use]
    pub fn stdout_piped(mut self) -> Self {
        self.stdout_piped = true;
        self
    }

    /// What [`AgentBuilder::spawn`] waits for (default: [`Ready::Started`]).
    #[must_use]
    pub fn ready(mut self, ready: Ready) -> Self {
        self.ready = ready;
        self
    }

    /// How long [`AgentBuilder::spawn`] waits (default: [`DEFAULT_READY_TIMEOUT`]).
    #[must_use]
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts the process and waits until it is ready.
    ///
    /// # Panics
    ///
    /// When the process cannot be started; when it exits, or the wait times out, before it is
    /// ready (the process is killed; the message carries its stderr).
    pub fn spawn(mut self) -> AgentProcess {
        let program = self.command.get_program().to_string_lossy().into_owned();
        let stdout = if self.stdout_piped { Stdio::piped() } else { Stdio::null() };
        let mut child = self
            .command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let log = AgentLog::default();
        let (tx, rx) = mpsc::channel();
        collect_lines(child.stderr.take().expect("stderr is piped"), log.clone(), tx);
        let mut process = AgentProcess { child, addr: None, log, program };
        let deadline = Instant::now() + self.timeout;
        let ready = match &self.ready {
            Ready::Started => true,
            Ready::ListeningLog => {
                process.addr = recv_matching(&rx, deadline, listening_in);
                process.addr.is_some()
            }
            Ready::StderrLine(needle) => {
                recv_matching(&rx, deadline, |l| l.contains(needle.as_str()).then_some(())).is_some()
            }
            Ready::Port(addr) => {
                process.addr = Some(*addr);
                process.poll_ready(deadline, || TcpStream::connect(addr).is_ok())
            }
            Ready::Http(addr, path) => {
                process.addr = Some(*addr);
                let get = Scrape::new(*addr).path(path).timeout(Duration::from_secs(5));
                process.poll_ready(deadline, || get.get().is_ok_and(|r| (200..300).contains(&r.status)))
            }
        };
        if !ready {
            // The reader thread may still be taking in the last lines, and a process that closed
            // its stderr may still be exiting.
            std::thread::sleep(Duration::from_millis(50));
            let exited = process.child.try_wait().ok().flatten();
            let _ = process.child.kill();
            let _ = process.child.wait();
            let why =
                exited.map_or_else(|| format!("not ready within {:?}", self.timeout), |s| format!("exited ({s})"));
            panic!("{} {why} while waiting for {:?}; its stderr:\n{}", process.program, self.ready, process.log());
        }
        process
    }
}

/// A spawned process (an agent, or a server a test starts), killed (SIGKILL) and reaped when
/// dropped, so that a failing test leaves nothing behind. Its stderr is collected line by line
/// ([`AgentProcess::log`]).
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    addr: Option<SocketAddr>,
    log: AgentLog,
    program: String,
}

impl AgentProcess {
    /// A builder for `program` (a path or a name on `PATH`).
    #[must_use]
    pub fn builder(program: impl AsRef<OsStr>) -> AgentBuilder {
        AgentBuilder::from_command(Command::new(program))
    }

    /// Polls `ready` every 20 ms until it holds (true), the process exits or `deadline` passes
    /// (false).
    fn poll_ready(&mut self, deadline: Instant, mut ready: impl FnMut() -> bool) -> bool {
        loop {
            if ready() {
                return true;
            }
            if Instant::now() >= deadline || matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address it was made ready on ([`Ready::ListeningLog`], [`Ready::Port`],
    /// [`Ready::Http`]).
    ///
    /// # Panics
    ///
    /// When it was started with another [`Ready`].
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr.unwrap_or_else(|| panic!("{} was not started with a listener to wait for", self.program))
    }

    /// `http://` and [`AgentProcess::addr`].
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// A [`Scrape`] of `/metrics` at [`AgentProcess::addr`].
    #[must_use]
    pub fn scrape(&self) -> Scrape {
        Scrape::new(self.addr())
    }

    /// The process id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far, one string, lines joined with `\n`.
    #[must_use]
    pub fn log(&self) -> String {
        lines_of(&self.log).join("\n")
    }

    /// Its stderr lines so far.
    #[must_use]
    pub fn log_lines(&self) -> Vec<String> {
        lines_of(&self.log)
    }

    /// Its stdout, to read (once).
    ///
    /// # Panics
    ///
    /// When stdout was not piped ([`AgentBuilder::stdout_piped`]) or was taken before.
    pub fn take_stdout(&mut self) -> ChildStdout {
        self.child.stdout.take().expect("stdout is piped (AgentBuilder::stdout_piped) and not yet taken")
    }

    /// Its stdout's lines, read as they come.
    ///
    /// # Panics
    ///
    /// As [`AgentProcess::take_stdout`].
    pub fn stdout_lines(&mut self) -> std::io::Lines<std::io::BufReader<ChildStdout>> {
        std::io::BufReader::new(self.take_stdout()).lines()
    }

    /// Sends SIGTERM (as `kill -TERM`), the way a service manager stops the agent.
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run or fails.
    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
        assert!(status.success(), "kill -TERM {pid}: {status}");
    }

    /// Sends SIGTERM and waits for the exit, for at most `timeout`.
    ///
    /// # Panics
    ///
    /// As [`AgentProcess::sigterm`] and [`AgentProcess::wait_timeout`].
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.sigterm();
        self.wait_timeout(timeout)
    }

    /// Waits for the exit, for at most `timeout`.
    ///
    /// # Panics
    ///
    /// When it has not exited by then (the message carries its stderr; the process is killed
    /// on drop).
    pub fn wait_timeout(&mut self, timeout: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            assert!(
                started.elapsed() < timeout,
                "{} did not exit within {timeout:?}; its stderr:\n{}",
                self.program,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its exit status, if it has exited.
    ///
    /// # Panics
    ///
    /// When the status cannot be read.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("read the exit status")
    }

    /// Kills it now (SIGKILL) and waits for it; the log stays readable.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process started by the caller that is killed (SIGKILL) and reaped when dropped, for
/// processes that need no more than that (a `sleep` holding a pid, a backend server).
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// The process id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh temporary directory `gpumon-<tag>-<pid>-<n>`, removed with everything in it when
/// dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates the directory.
    ///
    /// # Panics
    ///
    /// When it cannot be created.
    #[must_use]
    pub fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("gpumon-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TempDir(dir)
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` in the directory, written with `text`.
    ///
    /// # Panics
    ///
    /// When it cannot be written.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An OpenTelemetry push exporter that drops every batch after touching it (counting its
/// scopes, through [`std::hint::black_box`], so that nothing upstream is optimised away): a
/// meter provider's reader for benches and tests that measure the sink, not a collector.
///
/// ```
/// use gpumon_mock::test_kit::DiscardExporter;
/// use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
///
/// let provider = SdkMeterProvider::builder().with_reader(PeriodicReader::builder(DiscardExporter).build()).build();
/// # drop(provider);
/// ```
#[cfg(feature = "test-kit-otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-kit-otel")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardExporter;

#[cfg(feature = "test-kit-otel")]
impl opentelemetry_sdk::metrics::exporter::PushMetricExporter for DiscardExporter {
    async fn export(
        &self,
        metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        std::hint::black_box(metrics.scope_metrics().count());
        Ok(())
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> opentelemetry_sdk::metrics::Temporality {
        opentelemetry_sdk::metrics::Temporality::Cumulative
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_as_rfc_4648() {
        for (text, want) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("ops:pw-ops", "b3BzOnB3LW9wcw==")]
        {
            assert_eq!(base64(text.to_owned()), want, "{text}");
        }
        assert_eq!(Credential::basic("a", "b").header(), "Authorization: Basic YTpi");
        assert_eq!(Credential::bearer("t").header_value(), "Bearer t");
    }

    #[test]
    fn response_splits_head_and_body() {
        let r = Response { status: 401, raw: "HTTP/1.1 401 X\r\nWWW-Authenticate: Bearer\r\n\r\nno".to_owned() };
        assert_eq!(r.body(), "no");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert_eq!(r.header("content-length"), None);
    }

    #[test]
    fn listening_lines_parse() {
        let line = "2024 INFO gpumon: listening addr=127.0.0.1:9400";
        assert_eq!(listening_in(line), Some(SocketAddr::from(([127, 0, 0, 1], 9400))));
        assert_eq!(listening_in("listening addr=nope"), None);
    }

    #[test]
    fn scrape_until_returns_the_first_answer_that_satisfies() {
        let stub = crate::test_env::HttpStub::start(|req| {
            let auth = req.header("authorization").unwrap_or_default().to_owned();
            crate::test_env::HttpReply::with(200, &[], &auth)
        });
        let mut tries = 0;
        let r = Scrape::new(stub.addr()).bearer("tok").until("the third try", |_| {
            tries += 1;
            tries == 3
        });
        assert_eq!((r.status, r.body()), (200, "Bearer tok"));
        assert_eq!(stub.count(), 3);
    }

    #[test]
    fn a_chunked_body_is_dechunked() {
        let mut raw = std::io::Cursor::new(b"4\r\nWiki\r\n6;x=y\r\npedia \r\n0\r\nT: v\r\n\r\n".to_vec());
        assert_eq!(read_chunked(&mut raw).unwrap(), b"Wikipedia ");
    }

    #[test]
    #[should_panic(expected = "waiting for never")]
    fn scrape_until_fails_with_the_last_answer() {
        let _ = Scrape::port(free_port()).timeout(Duration::from_millis(200)).until("never", |_| true);
    }

    #[test]
    fn a_process_is_ready_on_a_stderr_line_and_killed_on_drop() {
        let mut p = AgentProcess::builder("sh")
            .args(["-c", "echo starting >&2; echo up >&2; echo out; sleep 60"])
            .stdout_piped()
            .ready(Ready::StderrLine("up".to_owned()))
            .spawn();
        assert_eq!(p.stdout_lines().next().unwrap().unwrap(), "out");
        let pid = p.id();
        drop(p);
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || !is_running(pid));
    }

    fn is_running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    }

    #[test]
    #[should_panic(expected = "exited")]
    fn a_process_that_exits_before_it_is_ready_fails_with_its_log() {
        let _ =
            AgentProcess::builder("sh").args(["-c", "echo bad flag >&2; exit 2"]).ready(Ready::ListeningLog).spawn();
    }

    #[test]
    fn terminate_returns_the_exit_status() {
        let mut p = AgentProcess::builder("sleep").arg("60").spawn();
        let status = p.terminate(Duration::from_secs(5));
        assert!(!status.success());
    }
}

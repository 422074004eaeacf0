//! `gpumon-agent run [agent flags] -- CMD ARGS…`: watch one job from start to exit.
//!
//! It runs the agent the flags describe (sinks export as usual), starts CMD, and when CMD exits
//! — or fails, or is killed — prints the run report (`--report-format json` for JSON) and exits
//! with CMD's exit code (128 + the signal's number when a signal killed it, as a shell does).
//! `--report-file FILE` also writes the report as JSON: opened before CMD starts (a file that
//! cannot be written is a configuration error, exit 2, and CMD does not run), written before
//! stdout is printed. The JSON adds to the report how CMD ended (`command`), which GPUs the
//! report is about (`watched`) and the diagnosis window ([`RunRecord`]). The run's figures end
//! when CMD exits, also while the agent waits for a steps connection a leftover process holds.
//!
//! - **Steps.** CMD gets the steps socket in its environment, `GPUMON_STEPS_SOCKET` (a private
//!   socket in a temporary directory of mode 0700 when `--steps-socket` / `steps.socket` sets
//!   none), so the Python `StepClient`, `Monitor` and trainer callbacks connect by themselves.
//!   Marks written before CMD exits are read before the last sample, which reports them.
//! - **GPUs.** The GPUs the agent samples are `--devices`, else `CUDA_VISIBLE_DEVICES` — which
//!   CMD inherits, so it is also the job's hint. The report is about the GPUs on which the
//!   job's processes (CMD and its descendants: torchrun's ranks are one job) were seen, by pid,
//!   through the `processes` family (turned on); when none was seen — NVML lists no processes,
//!   or lists them by the host's pids from inside a container — it is about every GPU sampled,
//!   and says so.
//! - **Signals.** CMD runs in a process group of its own; SIGINT and SIGTERM sent to the agent
//!   (Ctrl-C in a terminal, a scheduler's stop) are forwarded to that group once, so each
//!   process of the job gets them once, as from a terminal. (In a group of its own, CMD cannot
//!   read the terminal.)
//! - **Cannot start.** No command, or one not found: one line, exit 127; one that cannot be
//!   executed: one line, exit 126.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::assembly::backend::MockFactory;
use crate::assembly::config::{self, AgentConfig};
use crate::assembly::{Assembled, Assembly, Families};
use crate::core::diagnose::RunJob;
use crate::core::report::compare::{CommandOutcome, RunRecord, WatchScope, Watched};
use crate::core::report::{Report, ReportHandle};
use crate::core::{Family, Snapshot};
use clap::Parser;

use crate::cli::common::{
    config_failure, init_logging, on_the_agent_runtime, parse, print_stdout, spawn_with_services,
};
use crate::cli::diagnose::ReportFormat;
use crate::cli::flags::Cli;

/// The environment variable that carries the steps socket's path to the command.
pub const STEPS_SOCKET_ENV: &str = "GPUMON_STEPS_SOCKET";

/// A pause after the command exited before waiting for its steps connections to be read
/// ([`read_every_mark`]): a connection the command opened just before it exited may still be in
/// the listener's queue, not yet counted open.
const SETTLE: Duration = Duration::from_millis(300);

/// `gpumon-agent run`: the agent's flags, `--report-file`, and the command.
#[derive(Debug, Parser)]
#[command(
    name = "gpumon-agent run",
    about = "Run a command under gpumon: watch its GPUs and steps, print the run report at its exit, exit with its code",
    long_about = None
)]
pub struct RunCli {
    /// Every agent flag (sinks, backend, diagnosis, …).
    #[command(flatten)]
    pub agent: Cli,
    /// Also write the run report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub report_file: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD ARGS")]
    pub command: Vec<OsString>,
}

/// Exit code: no such command.
const NOT_FOUND: u8 = 127;
/// Exit code: the command cannot be executed.
const NOT_EXECUTABLE: u8 = 126;

/// Parses `gpumon-agent run …` (`args` without the program name and `run`) and runs it.
pub fn main(args: Vec<OsString>, mock: Option<MockFactory>) -> u8 {
    let cli = match parse::<RunCli>(std::iter::once(OsString::from("gpumon-agent run")).chain(args)) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Err(e) = init_logging(&cli.agent.log) {
        return config_failure(&e.0);
    }
    if cli.command.is_empty() {
        eprintln!("gpumon: run: no command given (gpumon-agent run [FLAGS] -- CMD ARGS…)");
        return NOT_FOUND;
    }
    if cli.agent.once || cli.agent.diagnose.duration.is_some() || cli.agent.source.replay.is_some() {
        return config_failure(
            "run: --once, --duration and --replay do not apply: the run lasts as long as the command",
        );
    }
    let mut file = match &cli.agent.config {
        Some(path) => match config::load(path) {
            Ok(f) => f,
            Err(e) => return config_failure(&e),
        },
        None => AgentConfig::default(),
    };
    let options = match cli.agent.onto_config(&mut file).and_then(|()| cli.agent.options(mock)) {
        Ok(options) => options,
        Err(e) => return config_failure(&e.0),
    };
    // Which GPUs the job's processes are on: the processes family, whatever else is chosen.
    let mut families: Families = options.families.clone().with_enabled([Family::Processes]);
    families.disable.retain(|f| *f != Family::Processes);
    // The job's processes, as the watcher finds them: diagnosis takes the GPUs they run on for
    // one job, before step marks, owners or launchers say otherwise (issue #42, item 1).
    let options = options.with_report(true).with_families(families).with_run_job(RunJob::new());
    // Opened now, so that a file that cannot be written is said before the job runs, not after.
    let report_file = match cli.report_file.as_deref().map(ReportFile::open).transpose() {
        Ok(f) => f,
        Err(e) => return config_failure(&e),
    };
    let private = if file.steps.socket.is_none() {
        match PrivateDir::new() {
            Ok(dir) => {
                file.steps.socket = Some(dir.path.join("steps.sock"));
                Some(dir)
            }
            Err(e) => {
                eprintln!("gpumon: run: cannot create a private directory for the steps socket: {e}");
                return 1;
            }
        }
    } else {
        None
    };
    let code = on_the_agent_runtime(run(cli, file, options, report_file));
    drop(private);
    code
}

/// `--report-file`, opened before the command starts; written when it has exited.
struct ReportFile {
    path: PathBuf,
    file: std::fs::File,
    /// Whether opening it created it: a run that never started removes it again.
    created: bool,
}

impl ReportFile {
    fn open(path: &Path) -> Result<Self, String> {
        let created = !path.exists();
        // Not truncated yet: a run that cannot start leaves an earlier report as it was.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(|file| Self { path: path.to_owned(), file, created })
            .map_err(|e| format!("--report-file {}: cannot write it: {e}", path.display()))
    }

    fn write(mut self, record: &RunRecord) -> std::io::Result<()> {
        use std::io::{Seek, Write};
        let json = serde_json::to_string_pretty(record).map_err(std::io::Error::other)?;
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(json.as_bytes())?;
        self.file.write_all(b"\n")?;
        self.file.sync_all()
    }

    /// No report to write: the file is as it was before the run.
    fn discard(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Waits (at most `limit`) until the steps socket has read every connection to its end: a
/// command that wrote a burst of marks just before it exited has them all reported, however
/// long reading them takes. A connection still open past `limit` (a daemon the command left
/// behind) is said, not waited for.
async fn read_every_mark(steps: &crate::core::steps::StepRegistry, limit: Duration) {
    let until = tokio::time::Instant::now() + limit;
    while steps.connections_open() > 0 {
        if tokio::time::Instant::now() >= until {
            tracing::warn!(
                open = steps.connections_open(),
                "steps socket: connections still open after the command exited; marks they send later are not in the report"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A directory only this user can enter, removed on drop.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!("gpumon-run-{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The GPUs (by UUID) the job's processes were seen on, and whether any snapshot listed
/// processes at all.
#[derive(Debug, Default)]
struct JobGpus {
    seen: HashSet<String>,
    processes_listed: bool,
    /// Pids listed on a GPU so far, and whether each is the job's: /proc is read again only when
    /// a pid not classified yet shows up.
    classified: HashMap<u32, bool>,
    /// The job's pids among them, shared with diagnosis.
    run_job: RunJob,
}

async fn run(
    cli: RunCli,
    file: AgentConfig,
    options: crate::assembly::AssemblyOptions,
    mut report_file: Option<ReportFile>,
) -> u8 {
    let discard = |f: Option<ReportFile>| {
        if let Some(f) = f {
            f.discard();
        }
    };
    // The handle the diagnosis reads the job's pids from; the watcher writes them.
    let run_job = options.run_job.clone().unwrap_or_default();
    let assembled = match Assembly::build(&file, options) {
        Ok(assembled) => assembled,
        Err(e) => {
            discard(report_file);
            return crate::cli::backend::failure(&e, cli.agent.diagnose.diagnose_window.is_some());
        }
    };
    let window = assembled.plan.diagnosis_window;
    if let Some(source) = &assembled.source {
        crate::cli::backend::say(source, &assembled.plan);
    }
    let mock = assembled.source.as_ref().is_some_and(|s| s.is_mock());
    let Assembled { builder, mut services, report, steps, steps_socket, plan, .. } = assembled;
    let shutdown_timeout = plan.shutdown_timeout;
    let Some(report) = report else {
        eprintln!("gpumon: run: the run report was not assembled");
        discard(report_file);
        return 1;
    };
    let handle = match spawn_with_services(builder, &mut services, shutdown_timeout).await {
        Ok(h) => h,
        Err(code) => {
            discard(report_file);
            return code;
        }
    };
    // The socket the assembly checked and serves, not the raw config's value.
    let socket = steps_socket.unwrap_or_default();

    // Registered before CMD starts, so that a signal from now on is forwarded, not fatal.
    let signals = Signals::register();
    let child = match spawn_command(&cli.command, &socket) {
        Ok(child) => child,
        Err(code) => {
            services.stop().await;
            let _ = handle.shutdown(shutdown_timeout).await;
            discard(report_file.take());
            return code;
        }
    };
    let pid = child.id();
    tracing::info!(pid, socket = %socket.display(), "command started");

    let (job, watcher) = watch_job_gpus(&handle, pid, run_job);

    let status = wait_forwarding_signals(child, signals).await;
    let outcome = outcome_of(status);
    // The marks the command wrote before it exited: read them, then one last sample reports them.
    tokio::time::sleep(SETTLE).await;
    // A connection still open (a process the command left behind holds it) is waited for, but
    // the run's figures end when the command exited: the GPUs' from the sample taken now, the
    // steps from the last sample, the marks read during the wait included.
    let leftover = steps.as_ref().is_some_and(|s| s.connections_open() > 0);
    if let Err(e) = handle.flush(shutdown_timeout).await {
        tracing::warn!(error = %e, "final sample incomplete");
    }
    let job = std::mem::take(&mut *job.lock().unwrap_or_else(PoisonError::into_inner));
    let (mut run_report, watched) = scoped_report(&report, &job, mock);
    // The wait for the leftover has its own limit; the last sample and the shutdown theirs.
    let mut until = tokio::time::Instant::now() + shutdown_timeout;
    if let (true, Some(steps)) = (leftover, &steps) {
        read_every_mark(steps, shutdown_timeout).await;
        until = tokio::time::Instant::now() + shutdown_timeout;
        if let Err(e) = handle.flush(shutdown_timeout).await {
            tracing::warn!(error = %e, "sample of the marks read after the command exited incomplete");
        }
        run_report.steps = scoped_report(&report, &job, mock).0.steps;
    }
    services.stop().await;
    let shut = handle.shutdown(until.saturating_duration_since(tokio::time::Instant::now())).await;
    watcher.abort();

    let scope = scope_of(&watched);
    let record = RunRecord::new(run_report).with_command(outcome).with_watched(watched).with_diagnosis_window(window);
    // The file first: a reader of stdout that went away (`| head`) must not cost the report.
    if let Some(f) = report_file {
        let path = f.path.clone();
        if let Err(e) = f.write(&record) {
            eprintln!("gpumon: run: --report-file {}: {e}", path.display());
        }
    }
    print_report(&cli, &record, &scope);
    if let Err(e) = shut {
        if !matches!(e, crate::core::AgentError::ShutDown) {
            eprintln!("gpumon: shutdown incomplete: {e}");
        }
    }
    exit_code(status)
}

/// Starts CMD in its own process group, told the steps socket; on failure, says why in one line
/// and returns the exit code (127 not found, 126 not executable).
fn spawn_command(command: &[OsString], socket: &Path) -> Result<std::process::Child, u8> {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env(STEPS_SOCKET_ENV, socket).process_group(0);
    cmd.spawn().map_err(|e| {
        let name = Path::new(&command[0]).display().to_string();
        match e.kind() {
            std::io::ErrorKind::NotFound => {
                eprintln!("gpumon: run: {name}: command not found");
                NOT_FOUND
            }
            std::io::ErrorKind::PermissionDenied => {
                eprintln!("gpumon: run: {name}: permission denied");
                NOT_EXECUTABLE
            }
            _ => {
                eprintln!("gpumon: run: {name}: cannot execute: {e}");
                NOT_EXECUTABLE
            }
        }
    })
}

/// Which GPUs the job (`pid` and its descendants) uses, from each snapshot's process lists: the
/// shared tally and the task that keeps it (abort it when done). The job's pids go to
/// diagnosis through `run_job` as they are found (it reads them from the next sample on).
fn watch_job_gpus(
    handle: &crate::core::AgentHandle,
    pid: u32,
    run_job: RunJob,
) -> (Arc<Mutex<JobGpus>>, tokio::task::JoinHandle<()>) {
    let job = Arc::new(Mutex::new(JobGpus { run_job, ..JobGpus::default() }));
    let tally = Arc::clone(&job);
    let mut snapshots = handle.subscribe();
    let watcher = tokio::spawn(async move {
        loop {
            match snapshots.recv().await {
                Ok(s) => note_job_gpus(
                    &s,
                    pid,
                    Path::new("/proc"),
                    &mut tally.lock().unwrap_or_else(PoisonError::into_inner),
                ),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
    (job, watcher)
}

/// What the report covers, in words: the job's GPUs, or every GPU sampled and why.
fn scope_of(watched: &Watched) -> String {
    match &watched.reason {
        Some(why) => format!("every GPU sampled: {why}"),
        None => {
            let indices: Vec<String> = watched.gpus.iter().map(u32::to_string).collect();
            format!("GPU {} (the job's processes were seen on them)", indices.join(", "))
        }
    }
}

/// The report over the job's GPUs (every GPU sampled when the job was seen on none, saying why).
fn scoped_report(report: &ReportHandle, job: &JobGpus, mock: bool) -> (Report, Watched) {
    if job.seen.is_empty() {
        let why = match (job.processes_listed, mock) {
            (true, true) => "the job's processes were not seen on any GPU (the mock backend's processes are simulated)",
            (true, false) => {
                "the job's processes were not seen on any GPU (inside a container, NVML lists the host's pids)"
            }
            (false, _) => "no process was listed on any GPU",
        };
        let r = report.report();
        let gpus = r.gpus.iter().map(|g| g.index).collect();
        (r, Watched::new(WatchScope::EveryGpu, gpus, Some(why.to_owned())))
    } else {
        let r = report.report_of(|uuid| job.seen.contains(uuid));
        let gpus = r.gpus.iter().map(|g| g.index).collect();
        (r, Watched::new(WatchScope::JobGpus, gpus, None))
    }
}

/// SIGINT and SIGTERM, caught (each `None` when it cannot be: then it keeps its default action).
struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn register() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self { int: signal(SignalKind::interrupt()).ok(), term: signal(SignalKind::terminate()).ok() }
    }
}

/// Waits for the command, forwarding SIGINT and SIGTERM to its process group.
async fn wait_forwarding_signals(mut child: std::process::Child, signals: Signals) -> ExitStatus {
    let pid = child.id();
    let (tx, mut exited) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("gpumon-run-wait".into())
        .spawn(move || {
            let status = child.wait();
            let _ = tx.send(status);
        })
        .map_err(|e| tracing::error!(error = %e, "cannot wait for the command"))
        .ok();
    let Signals { mut int, mut term } = signals;
    loop {
        let forward = tokio::select! {
            status = &mut exited => {
                return match status {
                    Ok(Ok(status)) => status,
                    Ok(Err(e)) => {
                        eprintln!("gpumon: run: cannot wait for the command: {e}");
                        ExitStatus::from_raw(1 << 8)
                    }
                    Err(_) => ExitStatus::from_raw(1 << 8),
                };
            }
            Some(()) = async { int.as_mut()?.recv().await } => libc::SIGINT,
            Some(()) = async { term.as_mut()?.recv().await } => libc::SIGTERM,
        };
        tracing::info!(signal = forward, "forwarding the signal to the command");
        let group = i32::try_from(pid).map_or(0, |p| -p);
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is touched.
        if group != 0 && unsafe { libc::kill(group, forward) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot forward the signal");
        }
    }
}

/// The command's exit code as a shell gives it: its own, or 128 + the signal that killed it.
fn exit_number(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    exit_number(status)
}

/// How the command ended, as the report says it.
fn outcome_of(status: ExitStatus) -> CommandOutcome {
    match (status.code(), status.signal()) {
        (Some(code), _) => CommandOutcome::exited(code),
        (None, Some(signal)) => {
            let name = match signal {
                libc::SIGHUP => Some("SIGHUP"),
                libc::SIGINT => Some("SIGINT"),
                libc::SIGQUIT => Some("SIGQUIT"),
                libc::SIGABRT => Some("SIGABRT"),
                libc::SIGKILL => Some("SIGKILL"),
                libc::SIGSEGV => Some("SIGSEGV"),
                libc::SIGPIPE => Some("SIGPIPE"),
                libc::SIGTERM => Some("SIGTERM"),
                _ => None,
            };
            CommandOutcome::killed(signal, name)
        }
        (None, None) => CommandOutcome::exited(1),
    }
}

/// Prints the run report to stdout; a reader that went away ends the printing, no more.
fn print_report(cli: &RunCli, record: &RunRecord, scope: &str) {
    match cli.agent.diagnose.report_format.unwrap_or_default() {
        ReportFormat::Human => {
            let outcome = record.command.as_ref().map_or_else(|| "ended".to_owned(), ToString::to_string);
            let _ = print_stdout(&format!(
                "gpumon run: the command {outcome}; watched {scope}\n{}",
                cli.agent.diagnose.human_report(&record.report)
            ));
        }
        ReportFormat::Json => match serde_json::to_string(record) {
            Ok(json) => {
                let _ = print_stdout(&(json + "\n"));
            }
            Err(e) => eprintln!("gpumon: cannot encode the report: {e}"),
        },
    }
}

/// Adds to `job` the GPUs of `snapshot` on which a process of the tree rooted at `root` runs.
fn note_job_gpus(snapshot: &Snapshot, root: u32, proc_root: &Path, job: &mut JobGpus) {
    if snapshot.devices.iter().all(|d| d.processes.is_empty()) {
        return;
    }
    job.processes_listed = true;
    let listed = || snapshot.devices.iter().flat_map(|d| d.processes.iter().map(|p| p.pid));
    if listed().any(|pid| !job.classified.contains_key(&pid)) {
        let tree = process_tree(proc_root, root);
        let mut found = false;
        for pid in listed() {
            found |= *job.classified.entry(pid).or_insert_with(|| tree.contains(&pid));
        }
        if found {
            job.run_job.set_pids(job.classified.iter().filter_map(|(&pid, &mine)| mine.then_some(pid)));
        }
    }
    for d in &snapshot.devices {
        let the_job_s = |pid: &u32| job.classified.get(pid).copied().unwrap_or(false);
        if d.processes.iter().any(|p| the_job_s(&p.pid)) && !job.seen.contains(&d.info.uuid) {
            tracing::info!(gpu = d.info.index, uuid = %d.info.uuid, "the job runs on this GPU");
            job.seen.insert(d.info.uuid.clone());
        }
    }
}

/// `root` and its descendants, from the parent pids in `proc_root/<pid>/stat`.
fn process_tree(proc_root: &Path, root: u32) -> HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir(proc_root) {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if let Some(ppid) = parent_pid(&stat) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut tree = HashSet::from([root]);
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for &c in children.get(&pid).map_or(&[][..], Vec::as_slice) {
            if tree.insert(c) {
                todo.push(c);
            }
        }
    }
    tree
}

/// The parent pid in a `/proc/<pid>/stat` line (field 4).
fn parent_pid(stat: &str) -> Option<u32> {
    crate::core::attribution::procfs::stat_field(stat.as_bytes(), 4).and_then(|p| u32::try_from(p).ok())
}

#[cfg(test)]
mod tests {
    use gpumon_mock::test_kit::TempDir;

    use super::*;

    fn proc_entry(root: &Path, pid: u32, ppid: u32, comm: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stat"), format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0")).unwrap();
    }

    #[test]
    fn the_tree_holds_every_descendant_and_nothing_else() {
        let tmp = TempDir::new("run-tree");
        let dir = tmp.path();
        proc_entry(dir, 100, 1, "torchrun");
        proc_entry(dir, 101, 100, "python (rank 0)");
        proc_entry(dir, 102, 100, "python) S 1"); // a name that looks like the end of the name
        proc_entry(dir, 103, 101, "loader");
        proc_entry(dir, 200, 1, "other");
        proc_entry(dir, 201, 200, "other child");
        std::fs::create_dir_all(dir.join("self")).unwrap();
        let tree = process_tree(dir, 100);
        assert_eq!(tree, HashSet::from([100, 101, 102, 103]));
    }

    #[test]
    fn the_job_s_gpus_are_those_its_processes_are_on_and_proc_is_read_for_new_pids_only() {
        use crate::core::{DeviceInfo, DeviceSample, ProcessSample, SystemInfo};
        let tmp = TempDir::new("run-gpus");
        let dir = tmp.path();
        proc_entry(dir, 100, 1, "launcher");
        proc_entry(dir, 101, 100, "rank 0");
        proc_entry(dir, 200, 1, "someone else");
        let snapshot = |pids: [&[u32]; 3]| {
            let devices = pids
                .iter()
                .enumerate()
                .map(|(i, pids)| {
                    let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(i as u32, format!("GPU-{i}"), "test")));
                    d.processes = pids.iter().map(|&p| ProcessSample::new(p)).collect();
                    d
                })
                .collect();
            Snapshot::new(Arc::new(SystemInfo::new("node", "test")), devices)
        };
        let mut job = JobGpus::default();
        note_job_gpus(&snapshot([&[], &[], &[]]), 100, dir, &mut job);
        assert!(!job.processes_listed && job.seen.is_empty());
        note_job_gpus(&snapshot([&[101], &[200], &[]]), 100, dir, &mut job);
        assert_eq!(job.seen, HashSet::from(["GPU-0".to_owned()]));
        assert_eq!(job.classified, HashMap::from([(101, true), (200, false)]));
        // Diagnosis is told the job's pids, and only those.
        assert!(job.run_job.contains(101) && !job.run_job.contains(200));
        // A second rank starts on GPU 2: a pid not classified yet, so /proc is read again.
        proc_entry(dir, 102, 100, "rank 1");
        note_job_gpus(&snapshot([&[101], &[200], &[102]]), 100, dir, &mut job);
        assert_eq!(job.seen, HashSet::from(["GPU-0".to_owned(), "GPU-2".to_owned()]));
        assert!(job.run_job.contains(101) && job.run_job.contains(102));
        // Known pids only: /proc is not read (a pid that vanished from it keeps its class).
        std::fs::remove_dir_all(dir.join("101")).unwrap();
        note_job_gpus(&snapshot([&[101], &[200], &[102]]), 100, dir, &mut job);
        assert_eq!(job.classified.get(&101), Some(&true));
    }

    #[test]
    fn parent_pid_reads_past_a_name_with_parentheses() {
        assert_eq!(parent_pid("42 (a) b)) R 7 42 42 0"), Some(7));
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn exit_codes_are_a_shells() {
        assert_eq!(exit_number(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_number(ExitStatus::from_raw(libc::SIGINT)), 130);
        assert_eq!(exit_number(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}

//! Who owns a training run on the steps socket, with real Unix users: the socket (mode 0666, so
//! both can reach it, as in the attack) reads each client's credentials from the kernel,
//! and the clients are this test binary run again as uid 60001 ("alice") and uid 60002 ("bob")
//! (`subprocess_steps_client`). Alice cannot mark bob's run, fill the table or hold every
//! connection so that bob is refused; a run nobody marks is evicted.
//!
//! Needs root (to run the clients as other users); runs under scripts/test.sh (`#[ignore]`
//! otherwise). Not being root is a failure with a message, never a pass.
#![cfg(feature = "mock")]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpumon::core::steps::socket::{
    SocketConfig, StepSocket, DEFAULT_MAX_CONNECTIONS_PER_UID, DEFAULT_MAX_RUNS_PER_UID,
};
use gpumon::core::steps::{Rejection, StepConfig, StepRegistry, StepRejections, StepTracker, MAX_RUNS};
use gpumon_mock::test_kit::TempDir;

#[cfg(all(feature = "agent", feature = "prometheus", feature = "nvml"))]
mod common;

/// Unix users no system has names for (the same as tests/tenancy_e2e.rs).
const ALICE: u32 = 60_001;
const BOB: u32 = 60_002;

fn require_root() {
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    assert_eq!(
        euid, 0,
        "this test runs steps-socket clients as uids {ALICE} and {BOB} and must run as root (scripts/test.sh runs \
         as root in CI); as uid {euid} it cannot test anything"
    );
}

/// A steps socket served on a runtime of its own, reachable by every user; stopped on drop.
struct Served {
    _dir: TempDir,
    path: PathBuf,
    steps: StepRegistry,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    fn start(configure: impl FnOnce(&mut SocketConfig)) -> Served {
        let dir = TempDir::new("steps-owners");
        // The clients run as other users: they must reach the socket through its directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("steps.sock");
        let (_tracker, steps) = StepTracker::new(StepConfig::default()).unwrap();
        let mut config = SocketConfig::new(&path);
        config.mode = 0o666;
        configure(&mut config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let registry = steps.clone();
        let runtime = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let socket = StepSocket::bind(config, registry).unwrap();
                bound_tx.send(()).unwrap();
                socket
                    .serve(async move {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        bound_rx.recv_timeout(Duration::from_secs(10)).expect("the steps socket never bound");
        Served { _dir: dir, path, steps, stop: Some(stop), runtime: Some(runtime) }
    }

    fn rejections(&self) -> StepRejections {
        self.steps.rejections().unwrap()
    }

    /// The last step of run (`job`, `rank`), if registered.
    fn last_step(&self, job: &str, rank: u32) -> Option<u64> {
        self.steps.last_step(job, Some(rank))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            let _ = rt.join();
        }
    }
}

/// This test binary again, as `uid`: `subprocess_steps_client` sends `lines` on one connection,
/// then opens `hold` more, and keeps them all until dropped (its stdin closes).
struct Client(Child, Option<std::thread::JoinHandle<()>>);

impl Client {
    fn start(uid: u32, socket: &Path, lines: &str, hold: usize) -> Client {
        let mut client = Client::spawn(uid, socket, lines, hold);
        client.wait_ready(uid);
        client
    }

    /// The client, without waiting for it to connect (it retries until the socket exists).
    fn spawn(uid: u32, socket: &Path, lines: &str, hold: usize) -> Client {
        let exe = std::env::current_exe().unwrap();
        let child = Command::new(&exe)
            .args(["subprocess_steps_client", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("GPUMON_STEPS_CLIENT_SOCKET", socket)
            .env("GPUMON_STEPS_CLIENT_LINES", lines)
            .env("GPUMON_STEPS_CLIENT_HOLD", hold.to_string())
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} as uid {uid} (can that user read it?): {e}", exe.display()));
        Client(child, None)
    }

    /// Waits until the client has connected and sent its marks.
    fn wait_ready(&mut self, uid: u32) {
        // libtest may print `test subprocess_steps_client ... ` on the same line first.
        let mut lines = BufReader::new(self.0.stdout.take().unwrap()).lines();
        let ready = lines.by_ref().map_while(Result::ok).any(|l| l.contains("steps client ready"));
        assert!(ready, "the client as uid {uid} did not get ready: {:?}", self.0.wait());
        // Keep reading what it prints at exit (the test's result) so that it never hits EPIPE.
        self.1 = Some(std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop)));
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        if self.0.wait().is_err() {
            let _ = self.0.kill();
        }
        if let Some(drain) = self.1.take() {
            let _ = drain.join();
        }
    }
}

/// Polls `cond` every 10 ms for `within`; whether it came true.
fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if started.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn mark(job: &str, rank: u32, step: u64) -> String {
    format!("{{\"job\":\"{job}\",\"rank\":{rank},\"step\":{step}}}\n")
}

#[test]
#[ignore = "needs scripts/test.sh (root, to run the socket's clients as other users)"]
fn a_mark_for_another_users_run_is_refused_and_counted() {
    require_root();
    let served = Served::start(|_| {});
    let _bob = Client::start(BOB, &served.path, &mark("train", 0, 1), 0);
    assert!(eventually(Duration::from_secs(10), || served.last_step("train", 0) == Some(1)), "bob's first mark");

    // alice marks bob's run far ahead: were it taken, bob's next marks would be "not increasing".
    let _alice = Client::start(ALICE, &served.path, &mark("train", 0, 1_000), 0);
    assert!(
        eventually(Duration::from_secs(10), || served.rejections().get(Rejection::NotOwner) == 1),
        "alice's mark was never refused: {:?}, bob's run at {:?}",
        served.rejections(),
        served.last_step("train", 0)
    );
    let _bob_again = Client::start(BOB, &served.path, &mark("train", 0, 2), 0);
    assert!(
        eventually(Duration::from_secs(10), || served.last_step("train", 0) == Some(2)),
        "bob's run is at {:?} after alice's mark, not at his step 2",
        served.last_step("train", 0)
    );
    let r = served.rejections();
    assert_eq!((r.not_owner, r.refused, r.malformed), (1, 0, 0), "{r:?}");
    assert_eq!(served.steps.len(), 1, "alice's mark made no run of its own");
}

#[test]
#[ignore = "needs scripts/test.sh (root, to run the socket's clients as other users)"]
fn one_user_filling_the_table_cannot_block_another() {
    require_root();
    let served = Served::start(|_| {});
    let junk: String = (0..300).map(|rank| mark("junk", rank, 1)).collect();
    let _alice = Client::start(ALICE, &served.path, &junk, 0);
    // Every one of alice's marks is either a run or refused.
    assert!(
        eventually(Duration::from_secs(10), || served.steps.len() as u64 + served.rejections().refused == 300),
        "alice's 300 marks not all handled: {} runs, {:?}",
        served.steps.len(),
        served.rejections()
    );
    let held = served.steps.len();
    assert!(held < MAX_RUNS, "alice alone filled the table ({held} runs)");

    let _bob = Client::start(BOB, &served.path, &mark("train", 0, 1), 0);
    assert!(
        eventually(Duration::from_secs(10), || served.steps.len() == held + 1),
        "bob's new run was refused after alice registered {held}: {:?}",
        served.rejections()
    );
    assert_eq!(served.last_step("train", 0), Some(1));
    assert_eq!(held, DEFAULT_MAX_RUNS_PER_UID, "alice holds exactly her share");
}

#[test]
#[ignore = "needs scripts/test.sh (root, to run the socket's clients as other users)"]
fn one_user_holding_connections_cannot_shut_another_out() {
    require_root();
    let served = Served::start(|_| {});
    let all = SocketConfig::new("/unused").max_connections;
    let _alice = Client::start(ALICE, &served.path, "", all);
    // Give the server time to accept (or close) each of alice's connections.
    let over = (all - DEFAULT_MAX_CONNECTIONS_PER_UID) as u64;
    eventually(Duration::from_secs(3), || served.rejections().connections >= over);

    let _bob = Client::start(BOB, &served.path, &mark("train", 0, 1), 0);
    assert!(
        eventually(Duration::from_secs(10), || served.steps.len() == 1),
        "alice holds {all} connections and bob's was closed: {:?}",
        served.rejections()
    );
    assert_eq!(served.last_step("train", 0), Some(1));
    // The agent's own user (root, here) gets in too.
    let mut admin = UnixStream::connect(&served.path).unwrap();
    admin.write_all(mark("admin", 0, 1).as_bytes()).unwrap();
    assert!(eventually(Duration::from_secs(10), || served.steps.len() == 2), "{:?}", served.rejections());
    assert_eq!(served.rejections().connections, over, "only alice's connections past her share were closed");
}

#[test]
#[ignore = "needs scripts/test.sh (root, to run the socket's clients as other users)"]
fn a_run_nobody_marks_is_evicted() {
    require_root();
    let served = Served::start(|c| c.idle_timeout = Duration::from_millis(300));
    let alice = Client::start(ALICE, &served.path, &mark("train", 0, 1), 0);
    assert!(eventually(Duration::from_secs(10), || served.steps.len() == 1), "alice's run");
    // Her connection stays open, but no mark comes: the run goes.
    assert!(eventually(Duration::from_secs(10), || served.steps.is_empty()), "alice's idle run was never evicted");
    assert_eq!(served.steps.evicted(), 1);
    drop(alice);
    // The name is free again: bob's mark registers it as his.
    let _bob = Client::start(BOB, &served.path, &mark("train", 0, 7), 0);
    assert!(eventually(Duration::from_secs(10), || served.last_step("train", 0) == Some(7)), "bob's run");
    assert_eq!(served.rejections().not_owner, 0);
}

/// The tenant view end to end: alice's and bob's clients are the GPU processes the fake
/// libnvidia-ml reports (GPU 0 and GPU 1), the agent attributes them from `/proc` (`--attribution`)
/// and reads their credentials on the steps socket; each tenant's scrape shows its own run, never
/// the other's, and the admin's shows both.
#[cfg(all(feature = "agent", feature = "prometheus", feature = "nvml"))]
#[test]
#[ignore = "needs scripts/test.sh (root, to run the socket's clients as other users; the fake libnvidia-ml)"]
fn each_tenant_scrapes_the_runs_its_own_processes_registered() {
    use gpumon_mock::test_kit::{free_port, Ready, Scrape};
    require_root();
    let dir = TempDir::new("steps-tenants");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("steps.sock");
    let mut alice = Client::spawn(ALICE, &socket, &mark("job-of-alice", 0, 1), 0);
    let mut bob = Client::spawn(BOB, &socket, &mark("job-of-bob", 1, 1), 0);
    let (pid_a, pid_b) = (alice.0.id(), bob.0.id());

    let port = free_port();
    let cfg = dir.file(
        "agent.toml",
        &format!(
            "[agent]\nbackend = \"nvml\"\ninterval = \"200ms\"\nenable = [\"processes\"]\n\
             [steps]\nsocket = \"{}\"\nmode = \"0666\"\n\
             [prometheus]\nlisten = \"127.0.0.1:{port}\"\nauth = {{ bearer = {{ token = \"tok-admin\" }} }}\n\
             [[prometheus.tenants]]\nname = \"a\"\nselector = {{ user = {ALICE} }}\nbearer = \"tok-a\"\n\
             [[prometheus.tenants]]\nname = \"b\"\nselector = {{ user = {BOB} }}\nbearer = \"tok-b\"\n",
            socket.display()
        ),
    );
    let _agent = common::agent_process()
        .arg("--config")
        .arg(&cfg)
        .arg("--nvml-library")
        .arg(common::fake_nvml())
        .arg("--attribution")
        .env("GPUMON_FAKE_NVML_PROFILE", "h100x8")
        .env("GPUMON_FAKE_NVML_PIDS", format!("0={pid_a},1={pid_b}"))
        .ready(Ready::Port(([127, 0, 0, 1], port).into()))
        .spawn();
    alice.wait_ready(ALICE);
    bob.wait_ready(BOB);

    let scrape = |token: &str, what: &str, done: &dyn Fn(&str) -> bool| -> String {
        let s = Scrape::port(port).bearer(token).timeout(Duration::from_secs(20)).every(Duration::from_millis(100));
        s.until(what, |r| done(&r.raw)).raw
    };
    let run_line =
        |body: &str, job: &str| body.lines().any(|l| l.starts_with("gpumon_training_step{") && l.contains(job));
    let admin = scrape("tok-admin", "both runs on the admin's scrape", &|r| {
        run_line(r, "job=\"job-of-alice\"") && run_line(r, "job=\"job-of-bob\"")
    });
    assert!(admin.contains(&format!("pid=\"{pid_a}\"")), "{admin}");
    for (token, own, other, own_pid) in
        [("tok-a", "job-of-alice", "job-of-bob", pid_a), ("tok-b", "job-of-bob", "job-of-alice", pid_b)]
    {
        let what = format!("{token}'s run and process {own_pid}");
        let r = scrape(token, &what, &|r| run_line(r, own) && r.contains(&format!("pid=\"{own_pid}\"")));
        assert!(!r.contains(other), "{token} sees the other's run:\n{r}");
        assert!(!r.contains("gpumon_steps_rejected_total"), "{token} sees every user's refusals:\n{r}");
    }
}

/// Not a test of its own: the client the tests above run as another user. `scripts/test.sh`
/// skips it (`--skip subprocess_`).
#[test]
#[ignore = "the child process of the steps-ownership tests"]
fn subprocess_steps_client() {
    let path = std::env::var("GPUMON_STEPS_CLIENT_SOCKET").expect("GPUMON_STEPS_CLIENT_SOCKET");
    let lines = std::env::var("GPUMON_STEPS_CLIENT_LINES").unwrap_or_default();
    let hold: usize = std::env::var("GPUMON_STEPS_CLIENT_HOLD").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut open = Vec::new();
    // The socket may not exist yet (the agent starts after its clients): wait for it, 60 s.
    let started = Instant::now();
    while !Path::new(&path).exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !lines.is_empty() {
        let mut c = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect {path}: {e}"));
        c.write_all(lines.as_bytes()).unwrap_or_else(|e| panic!("send to {path}: {e}"));
        open.push(c);
    }
    for _ in 0..hold {
        open.push(UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect {path}: {e}")));
    }
    println!("steps client ready: {} connections", open.len());
    std::io::stdout().flush().unwrap();
    // Hold the connections until the test closes stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

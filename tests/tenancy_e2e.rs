//! Tenant scopes end to end with real processes: two `sleep` processes running as two different
//! Unix users, the fake libnvidia-ml reporting one on GPU 0 and the other on GPU 1
//! (`GPUMON_FAKE_NVML_PIDS`), the example agent with attribution on (`--attribution`: owners
//! from the real `/proc`, each process's `uid`), and two tenants selected by uid. Each tenant's
//! token scrapes exactly its GPU and its process; the other's never appear.
//!
//! Needs root (to start processes as other users) and the attribution processor; runs under
//! scripts/test.sh (`#[ignore]` otherwise). Not being root is a failure with a message, never a
//! pass.
#![cfg(all(feature = "agent", feature = "prometheus", feature = "nvml"))]

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::{free_port, AgentProcess, KillOnDrop, Ready, Scrape, TempDir};

mod common;
use common::{agent_process, fake_nvml};

/// Unix users no system has names for (attribution reports the uid).
const UID_A: u32 = 60_001;
const UID_B: u32 = 60_002;

/// The agent on the fake libnvidia-ml (h100x8) with attribution, listing `pids`
/// (`GPU=PID,…`) on their GPUs, its Prometheus endpoint on `port` with an admin token and two
/// tenants, `names` (uid UID_A, token tok-a; uid UID_B, token tok-b). The returned guards stop
/// the agent and remove its config.
fn tenant_agent(port: u16, names: [&str; 2], pids: String) -> (AgentProcess, TempDir) {
    let dir = TempDir::new("tenancy-e2e");
    let [a, b] = names;
    let cfg = dir.file(
        "agent.toml",
        &format!(
            "[agent]\nbackend = \"nvml\"\ninterval = \"200ms\"\nenable = [\"processes\"]\n\
             [prometheus]\nlisten = \"127.0.0.1:{port}\"\nauth = {{ bearer = {{ token = \"tok-admin\" }} }}\n\
             [[prometheus.tenants]]\nname = \"{a}\"\nselector = {{ user = {UID_A} }}\nbearer = \"tok-a\"\n\
             [[prometheus.tenants]]\nname = \"{b}\"\nselector = {{ user = {UID_B} }}\nbearer = \"tok-b\"\n"
        ),
    );
    // A quick exit (an unknown flag, a bad config) is reported with its stderr: does it have
    // --attribution (the attribution branch)?
    let agent = agent_process()
        .arg("--config")
        .arg(&cfg)
        .arg("--nvml-library")
        .arg(fake_nvml())
        .arg("--attribution")
        .env("GPUMON_FAKE_NVML_PROFILE", "h100x8")
        .env("GPUMON_FAKE_NVML_PIDS", pids)
        .ready(Ready::Port(([127, 0, 0, 1], port).into()))
        .spawn();
    (agent, dir)
}

/// `sleep 300` as `uid` (and gid = uid).
fn sleeper(uid: u32) -> KillOnDrop {
    let child = Command::new("sleep")
        .arg("300")
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `sleep 300` as uid {uid}: {e}"));
    KillOnDrop(child)
}

/// `GET /metrics` with `token`.
fn scrape(port: u16, token: &str) -> Scrape {
    Scrape::port(port).bearer(token).timeout(Duration::from_secs(20)).every(Duration::from_millis(100))
}

/// Scrapes with `token` until `done` holds for the whole answer (20 s: the agent starts,
/// attribution refreshes).
fn scrape_until(port: u16, token: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    scrape(port, token).until(what, |r| done(&r.raw)).raw
}

/// The value of `label` on every series line that has it.
fn label_values(body: &str, label: &str) -> BTreeSet<String> {
    let needle = format!(",{label}=\"");
    let needle_first = format!("{{{label}=\"");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let i = l
                .find(&needle)
                .map(|i| i + needle.len())
                .or_else(|| l.find(&needle_first).map(|i| i + needle_first.len()))?;
            let rest = &l[i..];
            Some(rest[..rest.find('"')?].to_owned())
        })
        .collect()
}

#[test]
#[ignore = "needs scripts/test.sh (root, to run processes as other users; the fake libnvidia-ml)"]
fn each_tenant_scrapes_exactly_the_gpu_its_real_process_holds() {
    let _ = require_env("GPUMON_TEST_BACKENDS");
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    assert_eq!(
        euid, 0,
        "this test starts processes as uids {UID_A} and {UID_B} and must run as root (scripts/test.sh runs as \
         root in CI); as uid {euid} it cannot test anything"
    );
    let a = sleeper(UID_A);
    let b = sleeper(UID_B);
    let (pid_a, pid_b) = (a.0.id(), b.0.id());

    let port = free_port();
    let _agent = tenant_agent(port, ["a", "b"], format!("0={pid_a},1={pid_b}"));

    // The admin view: GPU 0 and GPU 1's UUIDs, and both processes.
    let admin = scrape_until(port, "tok-admin", "both processes on the admin's scrape", |r| {
        r.contains(&format!("pid=\"{pid_a}\"")) && r.contains(&format!("pid=\"{pid_b}\""))
    });
    let uuid_of = |gpu: &str| -> String {
        let line = admin
            .lines()
            .find(|l| l.starts_with("gpumon_gpu_info{") && l.contains(&format!("{{gpu=\"{gpu}\",")))
            .unwrap_or_else(|| panic!("no gpumon_gpu_info for GPU {gpu}:\n{admin}"));
        label_values(line, "uuid").into_iter().next().unwrap()
    };
    let (uuid_0, uuid_1) = (uuid_of("0"), uuid_of("1"));
    assert_eq!(label_values(&admin, "uuid").len(), 8, "{admin}");

    for (token, own_uuid, own_pid, other_uuid, other_pid) in
        [("tok-a", &uuid_0, pid_a, &uuid_1, pid_b), ("tok-b", &uuid_1, pid_b, &uuid_0, pid_a)]
    {
        let what = format!("{token}'s process {own_pid} (attribution must report its uid)");
        let r = scrape_until(port, token, &what, |r| r.contains(&format!("pid=\"{own_pid}\"")));
        assert!(r.starts_with("HTTP/1.1 200"), "{token}: {r}");
        assert_eq!(label_values(&r, "uuid"), [own_uuid.clone()].into(), "{token}: every series is its GPU's:\n{r}");
        assert_eq!(label_values(&r, "pid"), [own_pid.to_string()].into(), "{token}: only its process:\n{r}");
        assert!(!r.contains(other_uuid.as_str()), "{token} sees the other's GPU:\n{r}");
        assert!(!r.contains(&format!("pid=\"{other_pid}\"")), "{token} sees the other's process:\n{r}");
        let other_uid = if token == "tok-a" { UID_B } else { UID_A };
        assert!(!r.contains(&format!("=\"{other_uid}\"")), "{token} sees the other's uid:\n{r}");
    }
    let r = scrape(port, "tok-unknown").fetch().raw;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
}

/// Starts `sleep 300` as `uid` under exactly `pid`: writes `pid - 1` to
/// `/proc/sys/kernel/ns_last_pid` (root only) and forks at once; another process on the machine
/// may take the pid in between, so a miss is killed and the whole is retried.
fn sleeper_at_pid(uid: u32, pid: u32) -> KillOnDrop {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("write /proc/sys/kernel/ns_last_pid (needs root)");
        let s = sleeper(uid);
        if s.0.id() == pid {
            return s;
        }
        drop(s);
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("could not start a process under pid {pid} in 200 tries");
}

/// #31: bob's listed pid exits and alice's new process gets the same pid (`ns_last_pid`), while
/// the fake libnvidia-ml keeps listing the pid on GPU 0 every tick. Attribution must read the new
/// process: bob's view loses the GPU and the pid, alice's gains them — bob's view never shows
/// alice's process under his name.
#[test]
#[ignore = "needs scripts/test.sh (root, to run processes as other users and set ns_last_pid; the fake libnvidia-ml)"]
fn a_reused_pid_moves_to_the_new_process_owner_tenant() {
    let _ = require_env("GPUMON_TEST_BACKENDS");
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    assert_eq!(euid, 0, "this test sets ns_last_pid and runs processes as other users: it must run as root");
    let bob = sleeper(UID_B);
    let pid = bob.0.id();

    let port = free_port();
    let _agent = tenant_agent(port, ["alice", "bob"], format!("0={pid}"));
    let listed = format!("pid=\"{pid}\"");
    let r = scrape_until(port, "tok-b", "bob's process on bob's scrape", |r| r.contains(&listed));
    let gpu0 = label_values(&r, "uuid");
    assert_eq!(gpu0.len(), 1, "bob holds GPU 0 alone:\n{r}");
    let r = scrape(port, "tok-a").fetch().raw;
    assert!(
        r.starts_with("HTTP/1.1 200") && !r.contains(&listed) && !r.contains("uuid=\""),
        "alice holds nothing:\n{r}"
    );

    // bob's process exits; alice's new one gets its pid.
    drop(bob);
    let alice = sleeper_at_pid(UID_A, pid);
    assert_eq!(alice.0.id(), pid);

    let r = scrape_until(port, "tok-a", "the reused pid on alice's scrape", |r| r.contains(&listed));
    assert_eq!(label_values(&r, "uuid"), gpu0, "alice now holds GPU 0:\n{r}");
    let r = scrape_until(port, "tok-b", "the reused pid gone from bob's scrape", |r| {
        r.starts_with("HTTP/1.1 200") && !r.contains(&listed)
    });
    assert!(!r.contains("uuid=\""), "bob holds no GPU any more:\n{r}");
    // And stays gone (not a one-tick flicker).
    std::thread::sleep(Duration::from_secs(1));
    let r = scrape(port, "tok-b").fetch().raw;
    assert!(!r.contains(&listed) && !r.contains("uuid=\""), "bob's view shows alice's process or GPU:\n{r}");
}

//! What the agent tests share: launching the example agent as a user runs it, and loopback ports.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

use gpumon_mock::test_kit::{example_path, AgentBuilder};

/// `target/<profile>/examples/agent`, which `cargo test` builds alongside the tests, with no
/// GPU-visibility variables from the caller's environment and warn-level logs.
pub fn agent() -> Command {
    let bin = example_path("agent");
    assert!(bin.exists(), "{} not built; run `cargo test` (it builds examples)", bin.display());
    let mut cmd = Command::new(bin);
    cmd.env_remove("CUDA_VISIBLE_DEVICES").env_remove("NVIDIA_VISIBLE_DEVICES").env("GPUMON_LOG", "warn");
    cmd
}

/// [`agent`] as a process of the test kit: killed on drop, its stderr collected.
pub fn agent_process() -> AgentBuilder {
    AgentBuilder::from_command(agent())
}

/// Runs `cmd` to completion: (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// Runs `cmd` as `--backend mock --once --stdout-format json` (the flags appended to its own):
/// it must exit 0 and print exactly one snapshot, which is returned.
#[cfg(feature = "agent")]
pub fn mock_once(cmd: &mut Command) -> gpumon::core::Snapshot {
    let (code, stdout, stderr) = run(cmd.args(["--backend", "mock", "--once", "--stdout-format", "json"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one snapshot: {stdout}");
    serde_json::from_str(lines[0]).unwrap()
}

/// A Prometheus started by the backends dir's `start-prometheus.sh` under `BACKEND_INSTANCE`
/// (instance, backends dir), stopped with `stop-prometheus.sh` when dropped.
pub struct PrometheusInstance(pub String, pub String);

impl Drop for PrometheusInstance {
    fn drop(&mut self) {
        let _ = Command::new(format!("{}/stop-prometheus.sh", self.1)).env("BACKEND_INSTANCE", &self.0).status();
    }
}

/// A variable `scripts/test.sh` sets for the tests that need a server (its address, a tool's
/// path).
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run this test through scripts/test.sh"))
}

/// One PromQL instant query against the Prometheus on 127.0.0.1:`port`, which must answer
/// `success`: each result's labels and value.
pub fn promql(port: u16, q: &str) -> Vec<(serde_json::Value, f64)> {
    #[cfg(feature = "tls")]
    gpumon::sinks::tls::install_crypto_provider();
    let client = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(10)).build().unwrap();
    let url = format!("http://127.0.0.1:{port}/api/v1/query");
    let body = client.get(&url).query(&[("query", q)]).send().and_then(|r| r.text()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"]
        .as_array()
        .map(|rs| rs.iter().map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse().unwrap())).collect())
        .unwrap_or_default()
}

/// [`promql`] every 500 ms until `done` holds of its results, which are returned; fails after
/// `limit`.
pub fn promql_until(
    port: u16,
    q: &str,
    limit: std::time::Duration,
    done: impl Fn(&[(serde_json::Value, f64)]) -> bool,
) -> Vec<(serde_json::Value, f64)> {
    let started = std::time::Instant::now();
    loop {
        let r = promql(port, q);
        if done(&r) {
            return r;
        }
        assert!(started.elapsed() < limit, "{q}: not there after {limit:?}: {r:?}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// The fake's cdylib, `target/<profile>/libgpumon_fake_nvml.so` (built here when missing).
pub fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.ancestors().nth(2).unwrap().to_path_buf(); // target/<profile>
    let lib = profile_dir.join("libgpumon_fake_nvml.so");
    if !lib.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let status = Command::new(cargo)
            .args(["build", "-p", "gpumon-fake-nvml", "--lib"])
            .args(release.then_some("--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build -p gpumon-fake-nvml");
        assert!(status.success(), "cargo build -p gpumon-fake-nvml failed");
    }
    assert!(lib.is_file(), "{} missing", lib.display());
    lib
}

/// A fixture proc root under `dir` in which `pid` (a process of the mock's) runs as uid 1234 in
/// the systemd unit `session-7.scope`, and a passwd file that names uid 1234 `user`: the
/// `--proc-root` and `--passwd-file` of an agent with `--attribution`.
pub fn proc_root_owning(dir: &Path, pid: u32, user: &str) -> (PathBuf, PathBuf) {
    let proc_root = dir.join("proc");
    let d = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("stat"), format!("{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0")).unwrap();
    std::fs::write(d.join("status"), "Uid:\t1234\t1234\t1234\t1234\nGid:\t1234\t1234\t1234\t1234\n").unwrap();
    std::fs::write(d.join("cgroup"), "0::/user.slice/user-1234.slice/session-7.scope\n").unwrap();
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, format!("{user}:x:1234:1234::/home/u:/bin/sh\n")).unwrap();
    (proc_root, passwd)
}

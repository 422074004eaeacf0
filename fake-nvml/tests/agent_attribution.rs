//! End to end: the example agent with `--attribution` on the fake libnvidia-ml, whose GPU 0
//! reports real processes this test started (`GPUMON_FAKE_NVML_PIDS`). The Prometheus scrape
//! shows their process series labelled with their real user (read from the real `/proc`), and,
//! with a fixture proc root, with the container and pod the fixture's cgroups name.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpumon_mock::test_kit::{http_get, AgentProcess, KillOnDrop, Ready};

/// `n` processes that live as long as the test (killed on drop).
fn sleepers(n: usize) -> Vec<KillOnDrop> {
    (0..n).map(|_| KillOnDrop(Command::new("sleep").arg("60").spawn().expect("spawn sleep"))).collect()
}

/// The agent on the fake, scraped over loopback.
struct Served(AgentProcess);

impl Served {
    fn start(fake: &common::Fake, pids: &[u32], extra: &[&str]) -> Served {
        let spec = format!("0={}", pids.iter().map(u32::to_string).collect::<Vec<_>>().join("+"));
        let agent = AgentProcess::builder(common::agent())
            // GPU 0 only: the other GPUs' simulated pids may name no process (or any process).
            .args(["--backend", "nvml", "--attribution", "--interval", "100ms", "--devices", "0"])
            .args(["--prometheus-listen", "127.0.0.1:0", "--log", "info", "--config", "/dev/null"])
            .args(extra)
            .env("LD_LIBRARY_PATH", &fake.dir)
            .env("GPUMON_FAKE_NVML_PROFILE", "h100x8")
            .env("GPUMON_FAKE_NVML_PIDS", spec)
            .env_remove("GPUMON_FAKE_NVML_FAULTS")
            .env_remove("GPUMON_PROC_ROOT")
            .env_remove("GPUMON_PASSWD_FILE")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("NVIDIA_VISIBLE_DEVICES")
            .ready(Ready::ListeningLog)
            .spawn();
        Served(agent)
    }

    fn metrics(&self) -> String {
        http_get(self.0.addr(), "/metrics").1
    }

    /// Scrapes until every pid has a process series (10 s at most); returns those series.
    fn process_series(&self, pids: &[u32]) -> Vec<String> {
        let of = |body: &str| -> Vec<String> {
            body.lines().filter(|l| l.starts_with("gpumon_process_memory_used_bytes{")).map(str::to_owned).collect()
        };
        let r = self.0.scrape().until(&format!("process series for {pids:?}"), |r| {
            let series = of(r.body());
            pids.iter().all(|p| series.iter().any(|l| l.contains(&format!("pid=\"{p}\""))))
        });
        of(r.body())
    }
}

/// The user name of this test's uid, as `/etc/passwd` has it (`None` when it has none).
fn my_user() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().next()).unwrap();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 2 && f[2] == uid).then(|| f[0].to_owned())
    })
}

fn line_of(series: &[String], pid: u32) -> &str {
    series.iter().find(|l| l.contains(&format!("pid=\"{pid}\""))).unwrap()
}

#[test]
fn real_processes_carry_their_real_user() {
    let sleepers = sleepers(2);
    let pids: Vec<u32> = sleepers.iter().map(KillOnDrop::id).collect();
    let fake = common::Fake::new("clock=manual");
    let agent = Served::start(&fake, &pids, &[]);
    let series = agent.process_series(&pids);
    let user = my_user();
    for &pid in &pids {
        let line = line_of(&series, pid);
        match &user {
            Some(name) => assert!(line.contains(&format!(",user=\"{name}\",pid=\"{pid}\"")), "{line}"),
            None => assert!(!line.contains("user="), "{line}"),
        }
        // The test's processes run in whatever cgroup the test runner has: no pod, ever.
        assert!(!line.contains("pod="), "{line}");
    }
    // GPU 0's own series carry the same user (both processes have it); the proc source
    // reports no failures.
    let body = agent.metrics();
    if let Some(name) = &user {
        let util = body.lines().find(|l| l.starts_with("gpumon_utilization_ratio{gpu=\"0\",")).unwrap();
        assert!(util.contains(&format!("user=\"{name}\"")), "{util}");
    }
    assert!(body.contains("gpumon_attribution_failures_total{host="), "{body}");
    assert!(body.lines().any(|l| l.contains("source=\"proc\"} 0")), "{body}");
}

/// A proc root of fixtures for the real pids: `<dir>/proc/<pid>/{stat,status,cgroup}` and a
/// passwd file.
fn fixture_root(dir: &Path, pods: &[(u32, u32, String)]) -> (PathBuf, PathBuf) {
    let proc = dir.join("proc");
    for (pid, uid, cgroup) in pods {
        let d = proc.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("stat"),
            format!("{pid} (sleep) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 12345 1000 10"),
        )
        .unwrap();
        std::fs::write(d.join("status"), format!("Name:\tsleep\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n"))
            .unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
    }
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/sh\ntrainer:x:2000:2000::/home/trainer:/bin/sh\n").unwrap();
    (proc, passwd)
}

#[test]
fn a_fixture_proc_root_names_containers_and_pods() {
    const DOCKER: &str = "9f2c4e6a8b0d1f3e5a7c9b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a3c5b7d9f2e";
    const K8S: &str = "3b8e1f5a7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e8f0a1b3c5d7e9f2a4b6c8d0e1f";
    let sleepers = sleepers(2);
    let pids: Vec<u32> = sleepers.iter().map(KillOnDrop::id).collect();
    let dir = std::env::temp_dir().join(format!("gpumon-agent-attribution-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (proc, passwd) = fixture_root(
        &dir,
        &[
            (pids[0], 2000, format!("0::/system.slice/docker-{DOCKER}.scope\n")),
            (
                pids[1],
                0,
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d1c0b6e_2f3a_4e5d_9c8b_1a2b3c4d5e6f.slice/cri-containerd-{K8S}.scope\n"
                ),
            ),
        ],
    );
    let fake = common::Fake::new("clock=manual");
    let agent = Served::start(
        &fake,
        &pids,
        &["--proc-root", proc.to_str().unwrap(), "--passwd-file", passwd.to_str().unwrap()],
    );
    let series = agent.process_series(&pids);
    let docker = line_of(&series, pids[0]);
    assert!(docker.contains(&format!(",container=\"{}\",user=\"trainer\",pid=", &DOCKER[..12])), "{docker}");
    // A pod's process: its user; its container has no name without the kubelet.
    let pod = line_of(&series, pids[1]);
    assert!(pod.contains(&format!(",user=\"root\",pid=\"{}\"", pids[1])) && !pod.contains("container="), "{pod}");
    // The GPU: one container known, two users.
    let body = agent.metrics();
    let util = body.lines().find(|l| l.starts_with("gpumon_utilization_ratio{gpu=\"0\",")).unwrap();
    assert!(util.contains(&format!(",container=\"{}\",user=\"(shared)\"}} ", &DOCKER[..12])), "{util}");
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

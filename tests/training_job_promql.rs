//! A training job on three nodes, as a fleet reports it: three example agents on the mock
//! backend, each with its own `--host`, each running one rank of the job under `gpumon-agent run`
//! and remote-writing into one real Prometheus that loads `deploy/prometheus/gpumon-training.yml`.
//! Rank 2 (node-3) steps twice as slowly as the others: the straggler alert fires on it and on no
//! other rank, and every query of `dashboards/training-job.json` returns data.
#![cfg(all(feature = "agent", feature = "remote-write"))]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpumon_mock::test_kit::free_port;
use serde_json::Value;

mod common;
use common::{agent, env, promql, promql_until, PrometheusInstance};

/// One rank of job `train`: marks a step every PAUSE seconds (rank from LOCAL_RANK) until
/// stopped.
const RANK: &str = r#"
import json, os, socket, sys, time
pause = float(sys.argv[1])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["GPUMON_STEPS_SOCKET"])
rank = int(os.environ["LOCAL_RANK"])
step = 0
while True:
    time.sleep(pause)
    step += 1
    s.sendall((json.dumps({"job": "train", "rank": rank, "step": step}) + "\n").encode())
"#;

/// [`promql`] until `done` holds of its results (90 s at most).
fn wait_for(port: u16, q: &str, done: impl Fn(&[(Value, f64)]) -> bool) -> Vec<(Value, f64)> {
    promql_until(port, q, Duration::from_secs(90), done)
}

/// An agent running one rank; stopped with SIGTERM (forwarded to the rank) when dropped.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let started = Instant::now();
        while self.0.try_wait().ok().flatten().is_none() && started.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node(host: &str, rank: u32, pause: &str, scenario: &str, prom_port: u16, job: &Path) -> Node {
    let python = std::env::var("GPUMON_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let child = agent()
        .args(["run", "--backend", "mock", "--mock-profile", "a100x4", "--mock-scenario", scenario])
        .args(["--interval", "500ms", "--diagnose-window", "3s", "--host", host])
        .args(["--remote-write-url", &format!("http://127.0.0.1:{prom_port}/api/v1/write")])
        .arg("--")
        .arg(python)
        .arg(job)
        .arg(pause)
        .env("LOCAL_RANK", rank.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Node(child)
}

/// The shipped rules with the straggler's `for: 5m` at 5 s, so that the test need not wait five
/// minutes; everything else as shipped.
fn rules_for_the_test(dir: &Path) -> PathBuf {
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/gpumon-training.yml");
    let text = std::fs::read_to_string(shipped).unwrap();
    assert_eq!(text.matches("for: 5m").count(), 1, "the straggler alert's `for:`");
    let path = dir.join("gpumon-training.yml");
    std::fs::write(&path, text.replace("for: 5m", "for: 5s")).unwrap();
    path
}

/// Every `expr` under `v`, with the panel's title.
fn exprs(v: &Value, title: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            let title = m.get("title").and_then(Value::as_str).unwrap_or(title);
            if let Some(e) = m.get("expr").and_then(Value::as_str) {
                out.push((title.to_owned(), e.to_owned()));
            }
            for x in m.values() {
                exprs(x, title, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, title, out)),
        _ => {}
    }
}

#[test]
#[ignore = "needs scripts/test.sh (Prometheus)"]
fn a_slow_rank_on_one_of_three_nodes_is_the_straggler() {
    let backends = env("GPUMON_TEST_BACKENDS_DIR");
    let dir = std::env::temp_dir().join(format!("gpumon-training-job-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let job = dir.join("rank.py");
    std::fs::write(&job, RANK).unwrap();
    let prom_port = free_port();
    let instance = format!("training{}", std::process::id());
    let status = Command::new(format!("{backends}/start-prometheus.sh"))
        .env("BACKEND_INSTANCE", &instance)
        .env("PROM_PORT", prom_port.to_string())
        .env("PROM_REMOTE_WRITE", "1")
        .env("PROM_RULE_FILES", rules_for_the_test(&dir))
        .status()
        .unwrap();
    assert!(status.success(), "start-prometheus.sh failed");
    let _prometheus = PrometheusInstance(instance, backends);

    // Ranks 0 and 1 keep their GPUs fed; rank 2's node starves and steps twice as slowly.
    let _nodes = [
        node("node-1", 0, "0.3", "training", prom_port, &job),
        node("node-2", 1, "0.3", "training", prom_port, &job),
        node("node-3", 2, "0.6", "dataloader-starved", prom_port, &job),
    ];

    let ranks = wait_for(prom_port, "job:gpumon_step_duration_seconds:ranks{job=\"train\"}", |r| {
        r.first().is_some_and(|(_, v)| *v == 3.0)
    });
    assert_eq!(ranks.len(), 1);
    let firing =
        wait_for(prom_port, "ALERTS{alertname=\"GpuTrainingStraggler\", alertstate=\"firing\"}", |r| !r.is_empty());
    assert_eq!(firing.len(), 1, "only the slow rank: {firing:?}");
    let labels = &firing[0].0;
    assert_eq!(
        (labels["job"].as_str(), labels["rank"].as_str(), labels["host"].as_str()),
        (Some("train"), Some("2"), Some("node-3"))
    );
    assert_eq!(labels["kind"], "straggler");
    let ratio = promql(prom_port, "job_rank:gpumon_step_duration_seconds:ratio_to_median{job=\"train\", rank=\"2\"}");
    assert!((1.6..2.4).contains(&ratio[0].1), "rank 2 steps about twice the median: {ratio:?}");
    let median = promql(prom_port, "job:gpumon_step_duration_seconds:median{job=\"train\"}");
    assert!((0.25..0.4).contains(&median[0].1), "{median:?}");

    // Every panel of the training-job dashboard has data, for job `train` on its three nodes.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards/training-job.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut all = Vec::new();
    exprs(&dashboard["panels"], "", &mut all);
    assert_eq!(all.len(), 10, "panel queries in the dashboard: {all:?}");
    for (title, expr) in &all {
        let q =
            expr.replace("$__rate_interval", "1m").replace("$job", "train").replace("$host", "node-1|node-2|node-3");
        let r = wait_for(prom_port, &q, |r| !r.is_empty());
        assert!(!r.is_empty(), "panel `{title}`: {q}");
    }
    // The template variables: the job, then its nodes.
    let jobs = promql(prom_port, "count by (job) (gpumon_step_duration_seconds)");
    assert_eq!(jobs.iter().map(|(l, _)| l["job"].as_str().unwrap()).collect::<Vec<_>>(), ["train"]);
    let hosts = promql(prom_port, "count by (host) (gpumon_step_duration_seconds{job=~\"train\"})");
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

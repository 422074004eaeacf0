//! The agent's `--steps-socket`, as a training process on the node uses it: JSON lines over a
//! Unix socket, the step series on the Prometheus endpoint, the socket file's lifecycle.
#![cfg(all(feature = "mock", feature = "prometheus"))]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

mod common;
use common::{agent, agent_process};
use gpumon_mock::test_kit::{AgentProcess, Ready, TempDir};

/// The agent on the mock with a Prometheus endpoint on a free port and 100 ms ticks.
fn serve(args: &[&str]) -> AgentProcess {
    agent_process()
        .env("GPUMON_LOG", "info")
        .args(["--backend", "mock", "--prometheus-listen", "127.0.0.1:0", "--interval", "100ms"])
        .args(["--config", "/dev/null"])
        .args(args)
        .ready(Ready::ListeningLog)
        .spawn()
}

/// A connection to the steps socket at `path`, once the agent has bound it (10 s at most).
fn connect(path: &std::path::Path) -> UnixStream {
    let started = Instant::now();
    loop {
        if let Ok(c) = UnixStream::connect(path) {
            return c;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the steps socket never accepted");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn steps_socket_feeds_the_prometheus_endpoint() {
    let dir = TempDir::new("agent-steps");
    let path = dir.path().join("steps.sock");
    // A stale socket left by a killed agent does not stop the next one.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let mut served = serve(&["--steps-socket", path.to_str().unwrap()]);
    // The socket is bound once the agent runs (the Prometheus endpoint may be up first).
    let mut client = connect(&path);
    {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o660, "documented permissions");
    }
    for step in 1..=5 {
        writeln!(client, "{{\"job\":\"train\",\"rank\":0,\"step\":{step}}}").unwrap();
        std::thread::sleep(Duration::from_millis(120));
    }
    writeln!(client, "{{\"job\":\"solo\",\"step\":3}}").unwrap();
    client.write_all(b"this is not json\n").unwrap();
    client.write_all(&[b'x'; 2000]).unwrap();
    client.write_all(b"\n").unwrap();
    let body = served.scrape().until("the step series", |r| {
        let s: Vec<&str> = r.body().lines().filter(|l| !l.starts_with('#')).collect();
        s.iter().any(|l| {
            l.starts_with("gpumon_training_step{") && l.contains("job=\"train\",rank=\"0\"") && l.ends_with(" 5")
        }) && s.iter().any(|l| l.contains("reason=\"oversized\"") && l.ends_with(" 1"))
            && s.iter().any(|l| l.starts_with("gpumon_training_step{") && l.contains("job=\"solo\""))
    });
    let body = body.body();
    let series: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
    // Simulated data stays marked; a run without a rank has no rank label.
    let solo = series.iter().find(|l| l.starts_with("gpumon_training_step{") && l.contains("job=\"solo\"")).unwrap();
    assert!(solo.contains("backend=\"mock\"") && !solo.contains("rank="), "{solo}");
    assert!(series.iter().any(|l| l.starts_with("gpumon_steps_rejected_total{")
        && l.contains("reason=\"malformed\"")
        && l.ends_with(" 1")));
    let duration =
        series.iter().find(|l| l.starts_with("gpumon_step_duration_seconds{") && l.contains("job=\"train\"")).unwrap();
    let secs: f64 = duration.rsplit_once(' ').unwrap().1.parse().unwrap();
    assert!((0.1..0.5).contains(&secs), "a step every ~120 ms: {duration}");
    // Marks without "gpu": rank 0 is GPU 0 of the h100x8 (docs/steps.md), not every GPU.
    for family in ["gpumon_step_utilization_ratio{", "gpumon_step_energy_joules{"] {
        let gpus: Vec<&&str> = series.iter().filter(|l| l.starts_with(family) && l.contains("job=\"train\"")).collect();
        assert_eq!(gpus.len(), 1, "{family}: rank 0's GPU only: {gpus:?}");
        assert!(gpus[0].contains("gpu=\"0\""), "{}", gpus[0]);
    }
    assert!(series.iter().any(|l| l.starts_with("gpumon_step_memory_peak_bytes{")));

    drop(client);
    let status = served.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

#[test]
fn a_path_in_use_or_not_a_socket_fails_clearly() {
    let dir = TempDir::new("agent-steps-bad");
    let file = dir.file("regular", "keep me");
    let out = agent()
        .args(["--backend", "mock", "--interval", "100ms", "--duration", "1s", "--steps-socket"])
        .arg(&file)
        .output()
        .unwrap();
    // A configuration error, as every other one.
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a socket") && stderr.contains("steps.socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

    let cfg = dir.file("bad.toml", "[steps]\nsocket = \"/tmp/x.sock\"\nevery_n = 0\n");
    let out = agent().args(["--backend", "mock", "--once", "--config"]).arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("steps.every_n"));
}

#[test]
fn marks_received_before_sigterm_are_reported_at_exit() {
    // A 3 s interval: the marks below arrive between two ticks, and SIGTERM comes before the
    // next one. The agent takes one last sample at shutdown, so the steps are reported.
    use std::io::BufRead;
    let dir = TempDir::new("agent-steps-exit");
    let path = dir.path().join("steps.sock");
    let mut child = agent_process()
        .args(["--backend", "mock", "--interval", "3s", "--config", "/dev/null", "--stdout-format", "json"])
        .args(["--steps-socket", path.to_str().unwrap()])
        .stdout_piped()
        .spawn();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = child.take_stdout();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let mut client = connect(&path);
    let last_step = |v: &serde_json::Value| v["steps"]["runs"][0]["last_step"].as_u64();
    // Step 1, and a tick that reads it (its start is now known to the tracker).
    writeln!(client, "{{\"job\":\"train\",\"rank\":0,\"step\":1}}").unwrap();
    loop {
        let v = rx.recv_timeout(Duration::from_secs(10)).expect("a tick that reads step 1");
        if last_step(&v) == Some(1) {
            break;
        }
    }
    for step in 2..=3 {
        std::thread::sleep(Duration::from_millis(50));
        writeln!(client, "{{\"job\":\"train\",\"rank\":0,\"step\":{step}}}").unwrap();
    }
    // The socket reads the marks at once; give it a moment, then stop the agent.
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.terminate(Duration::from_secs(30)).success());
    reader.join().unwrap();
    let rest: Vec<serde_json::Value> = rx.try_iter().collect();
    let last = rest.last().expect("a last snapshot at shutdown");
    assert_eq!(last_step(last), Some(3), "{last}");
    let reported: Vec<u64> = rest
        .iter()
        .flat_map(|v| v["steps"]["runs"][0]["reported"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(reported, [2, 3]);
}

//! The example agent as a user runs it: flags, config errors, output, signals.
#![cfg(all(feature = "mock", feature = "stdout"))]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpumon::core::{DeviceFilter, DeviceState, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon::mock::MockSampler;

/// `target/<profile>/examples/agent`, which `cargo test` builds alongside this test.
fn agent() -> Command {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin: PathBuf = dir.join("examples").join("agent");
    assert!(bin.exists(), "{} not built; run `cargo test` (it builds examples)", bin.display());
    let mut cmd = Command::new(bin);
    // No real NVML here, and no GPU-visibility variables from the caller's environment.
    cmd.env_remove("CUDA_VISIBLE_DEVICES").env_remove("NVIDIA_VISIBLE_DEVICES").env("GPUMON_LOG", "warn");
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

fn expected_first_sample(profile: &str) -> Snapshot {
    let sampler = MockSampler::from_profile_name(profile).unwrap();
    sampler.sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::all())).unwrap()
}

#[test]
fn once_json_prints_one_snapshot_matching_the_profile() {
    let (code, stdout, stderr) =
        run(agent().args(["--backend", "mock", "--mock-profile", "a100x4", "--once", "--stdout-format", "json"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one snapshot: {stdout}");
    let got: Snapshot = serde_json::from_str(lines[0]).unwrap();
    let want = expected_first_sample("a100x4");
    assert_eq!(got.seq, 1);
    assert_eq!(got.system.backend, "mock");
    assert_eq!(got.devices, want.devices, "values equal the profile's first tick");
    assert_eq!(got.devices.len(), 4);
    assert_eq!(got.devices[0].info.name, "NVIDIA A100-SXM4-40GB");
}

#[test]
fn a_lost_gpu_keeps_the_others_reporting() {
    let dir = std::env::temp_dir().join(format!("gpumon-agent-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = dir.join("lost.toml");
    std::fs::write(&scenario, "workload = \"training\"\n[[faults]]\nkind = \"device_lost\"\ndevice = 2\nat_tick = 0\n")
        .unwrap();
    let (code, stdout, stderr) = run(agent()
        .args(["--backend", "mock", "--once", "--stdout-format", "json"])
        .args(["--mock-scenario".as_ref(), scenario.as_os_str()]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let got: Snapshot = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(got.devices.len(), 8);
    for d in &got.devices {
        if d.info.index == 2 {
            assert_eq!(d.state, DeviceState::Lost);
            assert!(d.utilization.gpu.is_none());
        } else {
            assert!(d.is_up() && d.utilization.gpu.is_some(), "GPU{} still reports", d.info.index);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn auto_without_nvml_says_it_runs_on_the_mock() {
    let (code, stdout, stderr) =
        run(agent().args(["--once", "--nvml-library", "/nonexistent/libnvidia-ml.so.1"]).env("LD_LIBRARY_PATH", ""));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stderr.contains("running on the MOCK backend"), "stderr: {stderr}");
    assert!(stderr.contains("/nonexistent/libnvidia-ml.so.1"), "says what was looked for: {stderr}");
    assert_eq!(stdout.lines().count(), 8, "one human line per GPU: {stdout}");
    assert!(stdout.lines().all(|l| l.contains("| Util: ")), "{stdout}");
}

#[test]
fn nvml_backend_without_nvml_fails_clearly() {
    let (code, _, stderr) =
        run(agent().args(["--once", "--backend", "nvml", "--nvml-library", "/nonexistent/libnvidia-ml.so.1"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("unavailable") && stderr.contains("/nonexistent/libnvidia-ml.so.1"), "{stderr}");
}

#[test]
fn devices_flag_hides_other_gpus() {
    let (code, stdout, stderr) =
        run(agent().args(["--backend", "mock", "--once", "--stdout-format", "json", "--devices", "1,3"]));
    assert_eq!(code, 0, "{stderr}");
    let got: Snapshot = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(got.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [1, 3]);
    // The same through the CUDA convention.
    let (code, stdout, _) =
        run(agent().args(["--backend", "mock", "--once", "--stdout-format", "json"]).env("CUDA_VISIBLE_DEVICES", "0"));
    assert_eq!(code, 0);
    let got: Snapshot = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(got.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [0]);
}

#[test]
fn invalid_configuration_exits_2_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("gpumon-agent-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[&str], &str); 6] = [
        ("[agent]\nintervall = \"1s\"\n", &[], "intervall"),
        ("[agent]\ninterval = \"soon\"\n", &[], "soon"),
        ("[agent]\ninterval = \"10ms\"\n", &[], "agent.interval"),
        ("[mock]\nprofile = \"dgx-z9\"\n", &["--backend", "mock"], "mock.profile"),
        ("", &["--devices", "gpu0"], "gpu0"),
        ("", &["--enable", "telepathy"], "telepathy"),
    ];
    for (i, (toml, args, needle)) in cases.iter().enumerate() {
        let path = dir.join(format!("c{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        let (code, stdout, stderr) = run(agent().arg("--once").arg("--config").arg(&path).args(*args));
        assert_eq!(code, 2, "case {i}: {stderr}");
        assert!(stderr.contains(needle), "case {i}: `{needle}` not in: {stderr}");
        assert!(stdout.is_empty(), "no data on a config error");
    }
    let (code, _, stderr) = run(agent().args(["--config", "/nonexistent/gpumon.toml"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent/gpumon.toml"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut child = agent()
        .args(["--backend", "mock", "--interval", "100ms", "--stdout-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        let _: Snapshot = serde_json::from_str(&line).unwrap();
    }
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "graceful exit: {status:?}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "agent did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whatever it printed until the end is whole JSON lines (the flush on shutdown completed).
    for line in lines {
        let _: Snapshot = serde_json::from_str(&line.unwrap()).unwrap();
    }
}

#[test]
fn example_config_file_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agent/gpumon.example.toml");
    let (code, stdout, stderr) = run(agent().args(["--once", "--backend", "mock", "--config", path]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 8);
}

#[cfg(feature = "prometheus")]
#[test]
fn prometheus_endpoint_from_the_config_file_enforces_its_auth() {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = std::env::temp_dir().join(format!("gpumon-agent-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("auth.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nbackend = \"mock\"\ninterval = \"200ms\"\n\n[prometheus]\nlisten = \"127.0.0.1:{port}\"\nauth = {{ bearer = {{ token = \"s3cret\" }} }}\n"
        ),
    )
    .unwrap();
    let mut child = agent().arg("--config").arg(&cfg).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let get = |auth: Option<&str>| -> String {
        let started = Instant::now();
        loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(mut s) => {
                    let header = auth.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
                    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n").unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).unwrap();
                    return out;
                }
                Err(_) if started.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => panic!("agent never listened on {port}: {e}"),
            }
        }
    };
    let denied = get(None);
    let wrong = get(Some("guess"));
    std::thread::sleep(Duration::from_millis(500));
    let allowed = get(Some("s3cret"));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(denied.to_ascii_lowercase().contains("www-authenticate: bearer"), "{denied}");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    assert!(allowed.starts_with("HTTP/1.1 200"), "{allowed}");
    assert!(allowed.contains("gpumon_utilization_ratio{"), "{allowed}");
}

#[test]
fn sigterm_exits_within_the_deadline_even_with_a_sample_stuck_in_the_backend() {
    let dir = std::env::temp_dir().join(format!("gpumon-agent-hang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = dir.join("hang.toml");
    std::fs::write(&scenario, "[[faults]]\nkind = \"hang\"\nat_tick = 2\nduration_ms = 120000\n").unwrap();
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, "[agent]\ninterval = \"100ms\"\nsample_timeout = \"200ms\"\nshutdown_timeout = \"1s\"\n")
        .unwrap();
    let mut child = agent()
        .args(["--backend", "mock", "--stdout-format", "json"])
        .arg("--config")
        .arg(&cfg)
        .arg("--mock-scenario")
        .arg(&scenario)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        lines.next().unwrap().unwrap();
    }
    std::thread::sleep(Duration::from_millis(500)); // tick 2 is now stuck for two minutes
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("agent still running 5 s after SIGTERM with a 1 s shutdown deadline");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "pushgateway")]
#[test]
fn once_fails_when_its_only_sample_cannot_be_delivered() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let (code, _, stderr) = run(agent().args([
        "--backend",
        "mock",
        "--once",
        "--pushgateway-url",
        "http://127.0.0.1:1",
        "--config",
        "/dev/null",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("pushgateway"), "names the failing sink: {stderr}");
}

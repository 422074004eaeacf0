//! The example agent as a user runs it: flags, config errors, output, signals.
#![cfg(all(feature = "agent", feature = "stdout"))]

use std::process::Command;
use std::time::{Duration, Instant};

use gpumon::core::{DeviceFilter, DeviceState, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_mock::MockSampler;

mod common;
use common::{agent, agent_process, mock_once, run};
#[cfg(feature = "prometheus")]
use gpumon_mock::test_kit::{free_port, http_get, AgentProcess, Credential, Ready, Scrape, TempDir};

fn expected_first_sample(profile: &str) -> Snapshot {
    let sampler = MockSampler::from_profile_name(profile).unwrap();
    sampler.sample(&SampleRequest::new(MetricSet::default(), DeviceFilter::all())).unwrap()
}

#[test]
fn once_json_prints_one_snapshot_matching_the_profile() {
    let got = mock_once(agent().args(["--mock-profile", "a100x4"]));
    let want = expected_first_sample("a100x4");
    assert_eq!(got.seq, 1);
    assert_eq!(got.system.backend, "mock");
    assert_eq!(got.devices, want.devices, "values equal the profile's first tick");
    assert_eq!(got.devices.len(), 4);
    assert_eq!(got.devices[0].info.name, "NVIDIA A100-SXM4-40GB");
}

#[test]
fn a_lost_gpu_keeps_the_others_reporting() {
    let dir = TempDir::new("agent-test");
    let scenario =
        dir.file("lost.toml", "workload = \"training\"\n[[faults]]\nkind = \"device_lost\"\ndevice = 2\nat_tick = 0\n");
    let got = mock_once(agent().args(["--mock-scenario".as_ref(), scenario.as_os_str()]));
    assert_eq!(got.devices.len(), 8);
    for d in &got.devices {
        if d.info.index == 2 {
            assert_eq!(d.state, DeviceState::Lost);
            assert!(d.utilization.gpu.is_none());
        } else {
            assert!(d.is_up() && d.utilization.gpu.is_some(), "GPU{} still reports", d.info.index);
        }
    }
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
    let got = mock_once(agent().args(["--devices", "1,3"]));
    assert_eq!(got.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [1, 3]);
    // The same through the CUDA convention.
    let got = mock_once(agent().env("CUDA_VISIBLE_DEVICES", "0"));
    assert_eq!(got.devices.iter().map(|d| d.info.index).collect::<Vec<_>>(), [0]);
}

#[test]
fn invalid_configuration_exits_2_naming_the_key() {
    let dir = TempDir::new("agent-cfg");
    let cases: [(&str, &[&str], &str); 13] = [
        ("[agent]\nintervall = \"1s\"\n", &[], "intervall"),
        ("[agent]\ninterval = \"soon\"\n", &[], "soon"),
        ("[agent]\ninterval = \"10ms\"\n", &[], "agent.interval"),
        ("[mock]\nprofile = \"dgx-z9\"\n", &["--backend", "mock"], "mock.profile"),
        ("", &["--devices", "gpu0"], "gpu0"),
        ("", &["--enable", "telepathy"], "telepathy"),
        // A flag that refines a sink or a feature nobody configured would be silently ignored.
        ("", &["--influx-db", "x"], "--influx-db refines a sink that is not configured"),
        ("", &["--prometheus-naming", "bogus"], "--prometheus-naming refines"),
        ("", &["--replay-speed", "2x"], "--replay-speed: no trace"),
        ("", &["--no-diagnose", "--diagnose-window", "10s"], "--no-diagnose"),
        // Values that aborted the process on allocation.
        ("[agent]\nsink_queue = 99999999999999\n", &[], "agent.sink_queue"),
        ("", &["--diagnose-window", "10000d"], "diagnose.window"),
        ("", &["--log", "gpumon=verbose"], "--log / GPUMON_LOG"),
    ];
    for (i, (toml, args, needle)) in cases.iter().enumerate() {
        let path = dir.file(&format!("c{i}.toml"), toml);
        let (code, stdout, stderr) = run(agent().arg("--once").arg("--config").arg(&path).args(*args));
        assert_eq!(code, 2, "case {i}: {stderr}");
        assert!(stderr.contains(needle), "case {i}: `{needle}` not in: {stderr}");
        assert!(stdout.is_empty(), "no data on a config error");
    }
    let (code, _, stderr) = run(agent().args(["--config", "/nonexistent/gpumon.toml"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent/gpumon.toml"), "{stderr}");
}

/// Values outside what the agent can hold are refused at start, naming the key (exit 2): an
/// interval beyond its range (from the file or a flag), a bare number where the interval needs
/// its unit, and a web history beyond memory.
#[test]
fn out_of_range_settings_exit_2_naming_the_key() {
    let dir = TempDir::new("agent-bounds");
    let mut cases: Vec<(&str, &[&str], &[&str])> = vec![
        ("[agent]\ninterval = \"1000000000h\"\n", &[], &["agent.interval", "maximum of 3600s"]),
        ("", &["--interval", "2h"], &["agent.interval", "maximum"]),
        ("[agent]\ninterval = 5\n", &[], &["interval", "bare number", "\"5s\""]),
        ("[agent]\ninterval = 0.5\n", &[], &["interval", "bare number"]),
    ];
    if cfg!(feature = "web") {
        cases.push(("[web]\nhistory = 10000000000\n", &["--backend", "mock"], &["web.history", "86400"]));
    }
    for (i, (toml, args, needles)) in cases.iter().enumerate() {
        let path = dir.file(&format!("c{i}.toml"), toml);
        let (code, stdout, stderr) = run(agent().arg("--once").arg("--config").arg(&path).args(*args));
        assert_eq!(code, 2, "case {i}: {stderr}");
        for needle in *needles {
            assert!(stderr.contains(needle), "case {i}: `{needle}` not in: {stderr}");
        }
        assert!(stdout.is_empty(), "no data on a config error");
    }
    // The bounds themselves are accepted, with the unit written.
    let path = dir.file("ok.toml", "[agent]\ninterval = \"1h\"\n");
    let (code, _, stderr) = run(agent().args(["--once", "--backend", "mock", "--config"]).arg(&path));
    assert_eq!(code, 0, "{stderr}");
}

/// A token from the environment that conflicts with a flag: the error says where it came from
/// (the user wrote only `--influx-db`), and the value itself is not printed.
#[cfg(feature = "influxdb")]
#[test]
fn a_conflict_with_a_credential_from_the_environment_names_the_variable() {
    let (code, stdout, stderr) = run(agent().env("GPUMON_INFLUX_TOKEN", "tok-from-env").args([
        "--once",
        "--backend",
        "mock",
        "--influx-url",
        "http://127.0.0.1:9",
        "--influx-db",
        "x",
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("influxdb.api") && stderr.contains("GPUMON_INFLUX_TOKEN"), "{stderr}");
    assert!(!stderr.contains("tok-from-env"), "{stderr}");
    assert!(stdout.is_empty());
    // The variable alone, with no InfluxDB sink, is not an error (a secret in every container).
    let (code, _, stderr) = run(agent().env("GPUMON_INFLUX_TOKEN", "tok").args(["--once", "--backend", "mock"]));
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut child = agent_process()
        .args(["--backend", "mock", "--interval", "100ms", "--stdout-format", "json"])
        .stdout_piped()
        .spawn();
    let mut lines = child.stdout_lines();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        let _: Snapshot = serde_json::from_str(&line).unwrap();
    }
    let status = child.terminate(Duration::from_secs(10));
    assert!(status.success(), "graceful exit: {status:?}");
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
    let port = free_port();
    let dir = TempDir::new("agent-auth");
    let cfg = dir.file(
        "auth.toml",
        &format!(
            "[agent]\nbackend = \"mock\"\ninterval = \"200ms\"\n\n[prometheus]\nlisten = \"127.0.0.1:{port}\"\nauth = {{ bearer = {{ token = \"s3cret\" }} }}\n"
        ),
    );
    let mut child = agent_process().arg("--config").arg(&cfg).spawn();
    let get = |auth: Option<&str>| -> String {
        let scrape = Scrape::port(port).credential(auth.map(Credential::bearer));
        scrape.until("the endpoint to listen", |_| true).raw
    };
    let denied = get(None);
    let wrong = get(Some("guess"));
    // Authorised, the endpoint serves the first sample once it is taken.
    let allowed = Scrape::port(port)
        .bearer("s3cret")
        .until("the first sample", |r| r.body().contains("gpumon_utilization_ratio{"))
        .raw;
    child.kill();
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(denied.to_ascii_lowercase().contains("www-authenticate: bearer"), "{denied}");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    assert!(allowed.starts_with("HTTP/1.1 200"), "{allowed}");
    assert!(allowed.contains("gpumon_utilization_ratio{"), "{allowed}");
}

#[test]
fn sigterm_exits_within_the_deadline_even_with_a_sample_stuck_in_the_backend() {
    let dir = TempDir::new("agent-hang");
    let scenario = dir.file("hang.toml", "[[faults]]\nkind = \"hang\"\nat_tick = 2\nduration_ms = 120000\n");
    let cfg = dir
        .file("agent.toml", "[agent]\ninterval = \"100ms\"\nsample_timeout = \"200ms\"\nshutdown_timeout = \"1s\"\n");
    let mut child = agent_process()
        .args(["--backend", "mock", "--stdout-format", "json"])
        .arg("--config")
        .arg(&cfg)
        .arg("--mock-scenario")
        .arg(&scenario)
        .stdout_piped()
        .spawn();
    let mut lines = child.stdout_lines();
    // Ticks 0 and 1, then tick 2 hangs for two minutes: its timeout reaches stdout as a
    // sampling-failed snapshot, and from then on a sample is stuck in the backend.
    for _ in 0..2 {
        let snap: Snapshot = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert!(snap.sampling.is_ok() && !snap.devices.is_empty());
    }
    let stuck: Snapshot = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(stuck.sampling_failure().is_some_and(|r| r.contains("timed out")), "{stuck:?}");
    let started = Instant::now();
    // Still running 5 s after SIGTERM, with a 1 s shutdown deadline, is a failure.
    let status = child.terminate(Duration::from_secs(5));
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
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

/// A running agent with a Prometheus endpoint on a free port (`--prometheus-listen
/// 127.0.0.1:0`; the address is read from its log) and its stderr collected.
#[cfg(feature = "prometheus")]
fn serve(args: &[&str]) -> AgentProcess {
    agent_process()
        .env("GPUMON_LOG", "info")
        .args(["--prometheus-listen", "127.0.0.1:0", "--interval", "100ms", "--config", "/dev/null"])
        .args(args)
        .ready(Ready::ListeningLog)
        .spawn()
}

/// Scrapes `/metrics` until the answer is a 200 whose body satisfies `done` (10 s at most).
#[cfg(feature = "prometheus")]
fn scrape_until(agent: &AgentProcess, what: &str, done: impl Fn(&str) -> bool) -> String {
    agent.scrape().until(what, |r| r.status == 200 && done(r.body())).body().to_owned()
}

/// Series lines of an exposition (no comments).
#[cfg(feature = "prometheus")]
fn series(body: &str) -> Vec<&str> {
    body.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
}

/// dcgm-exporter's default counters per GPU: the fields its `etc/default-counters.csv` enables
/// (listed in shared/reference/exporters.md §1.1): clocks 2, temperatures 2, power and energy 2,
/// PCIe 3, utilisation 4, XID 1, framebuffer 3, NVLink bandwidth 1, vGPU licence 1, row remapping
/// 3, profiling 3 — 25 (the driver version is a label, not a series).
#[cfg(feature = "prometheus")]
const DCGM_EXPORTER_DEFAULT_SERIES_PER_GPU: usize = 25;

/// Issue 45: the default families export at most dcgm-exporter's default series per GPU. Counted
/// on the Prometheus exposition of a mock H100 ×8 node running a healthy training job: device
/// series only (those with a `uuid` label), the accounts included. The opt-in families the
/// stages read are sampled but none of their series is exported. (A finding adds two series to
/// its GPU while it holds — `gpumon_finding_active{kind}` and the account's
/// `lost_seconds_total{cause}` — docs/fleet.md §8.)
#[cfg(feature = "prometheus")]
#[test]
fn default_series_per_gpu_stay_at_or_under_dcgm_exporters_default_counters() {
    let agent = agent_process()
        .env("GPUMON_LOG", "info")
        .args(["--backend", "mock", "--mock-profile", "h100x8", "--mock-scenario", "training"])
        .args(["--prometheus-listen", "127.0.0.1:0", "--interval", "200ms", "--config", "/dev/null"])
        .ready(Ready::ListeningLog)
        .spawn();
    let body = scrape_until(&agent, "the accounts of every GPU", |b| {
        series(b).iter().filter(|l| l.starts_with("gpumon_account_observed_seconds_total{")).count() == 8
    });
    let mut per_gpu = std::collections::BTreeMap::<&str, Vec<&str>>::new();
    for line in series(&body) {
        if let Some(uuid) = line.split("uuid=\"").nth(1).and_then(|rest| rest.split('"').next()) {
            per_gpu.entry(uuid).or_default().push(line);
        }
    }
    assert_eq!(per_gpu.len(), 8, "{body}");
    for (uuid, lines) in &per_gpu {
        assert!(
            lines.len() <= DCGM_EXPORTER_DEFAULT_SERIES_PER_GPU,
            "{uuid}: {} series, dcgm-exporter's default has {DCGM_EXPORTER_DEFAULT_SERIES_PER_GPU}:\n{}",
            lines.len(),
            lines.join("\n")
        );
        assert!(lines.iter().any(|l| l.starts_with("gpumon_account_energy_joules_total{")), "{uuid}");
        assert!(!lines.iter().any(|l| l.starts_with("gpumon_finding_active{")), "a healthy job: {uuid}");
    }
    println!("device series per GPU (default families): {:?}", per_gpu.values().map(Vec::len).collect::<Vec<_>>());
    let opt_in = [
        "gpumon_utilization_min_ratio",
        "gpumon_utilization_mean_ratio",
        "gpumon_sm_activity_ratio",
        "gpumon_nvlink_",
        "gpumon_pcie_link_",
        "gpumon_pcie_replays",
        "gpumon_ecc_",
        "gpumon_remapped_rows_",
        "gpumon_performance_state",
        "gpumon_clock_event_active",
    ];
    for line in series(&body) {
        assert!(!opt_in.iter().any(|p| line.starts_with(p)), "an opt-in family's series: {line}");
    }
    assert!(series(&body).iter().any(|l| l.starts_with("gpumon_clock_event_reasons{")), "the mask is exported");
}

/// An opt-in family selected is exported again: `--enable` on the command line, `agent.enable`
/// in the config file; the per-reason clock events with `clock_events_by_reason`.
#[cfg(feature = "prometheus")]
#[test]
fn enabled_opt_in_families_are_exported_again() {
    let dir = TempDir::new("agent-enable");
    let config = dir.file("enable.toml", "[agent]\nenable = [\"clock_events_by_reason\"]\n");
    let agent = agent_process()
        .env("GPUMON_LOG", "info")
        .args(["--backend", "mock", "--mock-profile", "h100x8", "--enable", "high_resolution,nvlink"])
        .args(["--prometheus-listen", "127.0.0.1:0", "--interval", "200ms", "--config"])
        .arg(&config)
        .ready(Ready::ListeningLog)
        .spawn();
    let body = scrape_until(&agent, "the enabled families", |b| b.contains("gpumon_utilization_mean_ratio{"));
    let count = |name: &str| series(&body).iter().filter(|l| l.starts_with(name)).count();
    assert_eq!(count("gpumon_utilization_mean_ratio{"), 8, "{body}");
    assert_eq!(count("gpumon_nvlink_links_up{"), 8, "{body}");
    assert_eq!(count("gpumon_clock_event_active{"), 8 * 9, "one per reason and GPU: {body}");
    // What was not enabled stays off.
    assert_eq!(count("gpumon_sm_activity_ratio{") + count("gpumon_ecc_uncorrected_errors_total{"), 0, "{body}");
}

/// A node whose driver did not load: `auto` with an exporting sink never falls back to the mock.
/// It keeps serving, says `gpumon_up 0` and exports no device series; readiness fails,
/// liveness holds.
#[cfg(feature = "prometheus")]
#[test]
fn auto_without_nvml_and_an_exporting_sink_serves_gpumon_up_0_and_no_simulated_gpus() {
    let agent = serve(&[
        "--backend",
        "auto",
        "--nvml-library",
        "/nonexistent/libnvidia-ml.so.1",
        "--host",
        "node-without-driver",
    ]);
    // Three failed samples: the agent keeps running and serving.
    let body = scrape_until(&agent, "three failed samples", |b| {
        series(b).iter().any(|l| {
            l.strip_prefix("gpumon_sample_failures_total{host=\"node-without-driver\"} ")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n >= 3)
        })
    });
    let lines = series(&body);
    // `up 0` about the host, in the GPUs' `gpumon_up` family: the only `gpumon_up` series.
    let up: Vec<_> = lines.iter().filter(|l| l.starts_with("gpumon_up")).collect();
    assert_eq!(up, [&"gpumon_up{host=\"node-without-driver\"} 0"], "{body}");
    assert!(lines.contains(&"gpumon_samples_total{host=\"node-without-driver\"} 0"), "{body}");
    let device_series: Vec<_> = lines.iter().filter(|l| l.contains("gpu=\"") || l.contains("uuid=")).collect();
    assert!(device_series.is_empty(), "device series without NVML: {device_series:?}");
    assert!(!body.contains("mock"), "{body}");
    assert_eq!(http_get(agent.addr(), "/health").0, 503);
    assert_eq!(http_get(agent.addr(), "/live"), (200, "live\n".to_owned()));
    let log = agent.log();
    assert!(log.contains("NVML unavailable") && log.contains("retrying NVML with backoff"), "{log}");
    assert!(!log.contains("MOCK backend"), "{log}");
    // Said once, not once per tick.
    assert_eq!(log.matches("retrying NVML with backoff").count(), 1, "{log}");
}

/// `--backend mock` exports simulated GPUs, and every series says so, in both namings.
#[cfg(feature = "prometheus")]
#[test]
fn an_explicit_mock_backend_marks_every_prometheus_series() {
    for naming in ["native", "dcgm"] {
        let agent = serve(&["--backend", "mock", "--mock-profile", "a100x4", "--prometheus-naming", naming]);
        let body = scrape_until(&agent, "device series", |b| b.contains("gpumon_gpu_info{"));
        let lines = series(&body);
        let devices = lines.iter().filter(|l| l.starts_with("gpumon_gpu_info{")).count();
        assert_eq!(devices, 4, "{body}");
        assert!(lines.len() > 4 * 10, "{body}");
        for line in lines {
            assert_eq!(line.matches("backend=\"mock\"").count(), 1, "{naming}: {line}");
        }
    }
}

#[test]
fn the_host_label_can_be_overridden() {
    let host_of = |cmd: &mut Command| -> String { mock_once(cmd).system.hostname.clone() };
    let system = host_of(agent().env_remove("GPUMON_HOST").env_remove("NODE_NAME"));
    assert_eq!(system, gpumon::core::hostname());
    assert_eq!(host_of(agent().args(["--host", "node-17"]).env("NODE_NAME", "pod-x")), "node-17");
    assert_eq!(host_of(agent().env("GPUMON_HOST", "node-18").env("NODE_NAME", "node-19")), "node-18");
    assert_eq!(host_of(agent().env_remove("GPUMON_HOST").env("NODE_NAME", "node-19")), "node-19");
    assert_eq!(host_of(agent().env_remove("GPUMON_HOST").env("NODE_NAME", "")), system);
}

/// A negative value is the flag's value, refused by its own parser: not taken for a flag
/// (`unexpected argument '-1' found`).
#[test]
fn a_negative_value_is_refused_naming_its_flag() {
    for (args, needle) in [
        (["--interval", "-1s"], "invalid value '-1s' for '--interval <DURATION>'"),
        (["--mock-seed", "-1"], "invalid value '-1' for '--mock-seed <N>'"),
        (["--sample-timeout", "-5s"], "invalid value '-5s' for '--sample-timeout <DURATION>'"),
    ] {
        let (code, stdout, stderr) = run(agent().args(["--once", "--backend", "mock"]).args(args));
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
        assert!(stdout.is_empty());
    }
}

/// What is known of the steps socket's path before binding it is a configuration error naming
/// the flag: a path too long for a Unix socket (with the limit), a path that is not a socket.
#[test]
fn a_steps_socket_path_that_cannot_be_bound_exits_2_naming_the_flag() {
    let dir = std::env::temp_dir().join(format!("gpumon-cli-socket-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let regular = dir.join("regular");
    std::fs::write(&regular, "not a socket").unwrap();
    let long = dir.join("s".repeat(120));
    let cases = [
        (
            regular.clone(),
            format!("--steps-socket / steps.socket: {}: the path exists and is not a socket", regular.display()),
        ),
        (long.clone(), format!("--steps-socket / steps.socket: {}: ", long.display())),
    ];
    for (path, needle) in cases {
        let (code, _, stderr) = run(agent().args(["--once", "--backend", "mock", "--steps-socket"]).arg(&path));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(&needle), "`{needle}` not in: {stderr}");
    }
    let (_, _, stderr) = run(agent().args(["--once", "--backend", "mock", "--steps-socket"]).arg(&long));
    assert!(stderr.contains("longer than a Unix socket's path may be (at most 107 bytes"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&regular).unwrap(), "not a socket", "the file is left as it was");
    let _ = std::fs::remove_dir_all(&dir);
}

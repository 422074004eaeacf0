//! End to end: the example agent with `--backend nvml` on the fake (through `LD_LIBRARY_PATH`,
//! unmodified loading of `libnvidia-ml.so.1`) prints the same snapshot as `--backend mock` with
//! the same profile — modulo timestamps, the backend name, XID arrival times and float rounding
//! in the window statistics and GPM ratios (1e-9). GPM is compared too: the sampler takes a GPM
//! baseline when it is built, so even a `--once` run reports it.
//!
//! Uses `target/<profile>/examples/agent`, brought up to date here with `cargo build --example
//! agent` (a no-op when `cargo test --workspace` just built it; without it a stale binary from an
//! earlier build would be tested).

mod common;

use std::process::Command;

use common::agent;
use serde_json::Value;

fn run(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut cmd = Command::new(agent());
    cmd.args(args).args(["--once", "--stdout-format", "json", "--log", "warn"]);
    for k in
        ["GPUMON_FAKE_NVML_PROFILE", "GPUMON_FAKE_NVML_SCENARIO", "GPUMON_FAKE_NVML_FAULTS", "GPUMON_FAKE_NVML_SEED"]
    {
        cmd.env_remove(k);
    }
    cmd.env_remove("CUDA_VISIBLE_DEVICES").env_remove("NVIDIA_VISIBLE_DEVICES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the agent");
    assert!(out.status.success(), "agent {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with('{')).unwrap_or_else(|| panic!("no JSON in:\n{text}"));
    serde_json::from_str(line).expect("JSON snapshot")
}

fn normalize(mut v: Value) -> Value {
    let o = v.as_object_mut().unwrap();
    o.remove("taken_at");
    o.remove("duration");
    if let Some(s) = o.get_mut("system").and_then(Value::as_object_mut) {
        s.remove("backend");
    }
    for d in o.get_mut("devices").and_then(Value::as_array_mut).unwrap() {
        let d = d.as_object_mut().unwrap();
        if let Some(x) = d.get_mut("xid_errors").and_then(Value::as_array_mut) {
            for e in x {
                e.as_object_mut().unwrap().remove("last_seen");
            }
        }
    }
    v
}

fn close(a: &Value, b: &Value, path: &str) -> Result<(), String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            if (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0) {
                Ok(())
            } else {
                Err(format!("{path}: {x} != {y}"))
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                close(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Err(format!("{path}: {} vs {} entries", x.len(), y.len()));
            }
            x.iter().zip(y).enumerate().try_for_each(|(i, (p, q))| close(p, q, &format!("{path}[{i}]")))
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{path}: {a} != {b}")),
    }
}

fn same_snapshot(profile: &str) -> Value {
    let dir = common::Fake::new("clock=manual"); // a private directory holding libnvidia-ml.so.1
    let ld = dir.dir.to_string_lossy().into_owned();
    // Every family a default agent reads exported, the opt-in ones diagnosis reads and the
    // P-state too: the comparison covers them (docs/fleet.md §8).
    let all = "high_resolution,gpm,nvlink,pcie_link,ecc,remapped_rows,performance_state";
    let mock = run(&["--backend", "mock", "--mock-profile", profile, "--enable", all], &[]);
    let nvml = run(
        &["--backend", "nvml", "--enable", all],
        &[("LD_LIBRARY_PATH", &ld), ("GPUMON_FAKE_NVML_PROFILE", profile), ("GPUMON_FAKE_NVML_CLOCK", "manual")],
    );
    assert_eq!(nvml["system"]["backend"], "nvml");
    assert_eq!(mock["system"]["backend"], "mock");
    let nvml = normalize(nvml);
    if let Err(e) = close(&nvml, &normalize(mock), "snapshot") {
        panic!("{profile}: --backend nvml on the fake differs from --backend mock: {e}");
    }
    nvml
}

#[test]
fn agent_nvml_on_the_fake_equals_agent_mock_h100x8() {
    let snap = same_snapshot("h100x8");
    // GPM is part of the comparison, not vacuously equal.
    let gpm = &snap["devices"][0]["gpm"];
    assert!(gpm["sm_activity"].is_number(), "no GPM on the first tick: {gpm}");
}

#[test]
fn agent_nvml_on_the_fake_equals_agent_mock_a100x8_mig() {
    same_snapshot("a100x8-mig");
}

/// A GPU whose XID events cannot be registered reads as "not monitored" on the scrape endpoint,
/// not as a GPU without XID errors: `gpumon_metric_failure{…,family="xid"} 1` for that GPU only,
/// and the agent's self-metric counts it.
#[test]
fn agent_exports_a_gpu_whose_xids_are_not_watched_as_not_monitored() {
    use gpumon_mock::test_kit::{AgentProcess, Ready};
    use std::time::Duration;

    let dir = common::Fake::new("clock=manual");
    let ld = dir.dir.to_string_lossy().into_owned();
    let child = AgentProcess::builder(agent())
        .args(["--backend", "nvml", "--prometheus-listen", "127.0.0.1:0", "--interval", "200ms", "--log", "info"])
        .args(["--host", "fake-node", "--config", "/dev/null"])
        .env_remove("GPUMON_FAKE_NVML_SCENARIO")
        .env_remove("GPUMON_FAKE_NVML_SEED")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .env("LD_LIBRARY_PATH", &ld)
        .env("GPUMON_FAKE_NVML_PROFILE", "a100x4")
        .env("GPUMON_FAKE_NVML_CLOCK", "manual")
        .env("GPUMON_FAKE_NVML_FAULTS", "notsupported:nvmlDeviceRegisterEvents@1")
        .ready(Ready::ListeningLog)
        .spawn();
    let r = child.scrape().timeout(Duration::from_secs(20)).until("GPU data", |r| r.raw.contains("gpumon_gpu_info{"));
    let body = r.raw;
    let failures: Vec<_> = body.lines().filter(|l| l.starts_with("gpumon_metric_failure{")).collect();
    assert_eq!(failures.len(), 1, "GPU 1 only: {failures:?}");
    assert!(failures[0].starts_with("gpumon_metric_failure{gpu=\"1\","), "{failures:?}");
    assert!(failures[0].ends_with(",family=\"xid\"} 1"), "{failures:?}");
    assert!(body.lines().any(|l| l == "gpumon_last_sample_metric_failures{host=\"fake-node\"} 1"), "{body}");
    // Not monitored is not lost: all four GPUs are up.
    assert_eq!(body.lines().filter(|l| l.starts_with("gpumon_up{") && l.ends_with(" 1")).count(), 4, "{body}");
    let log = child.log();
    assert!(log.contains("XID errors of this GPU are not monitored"), "warned: {log}");
}

//! `--only` / `agent.only`: the agent samples exactly the families named.
#![cfg(all(feature = "agent", feature = "stdout"))]

use std::process::Command;

use gpumon::core::{DeviceFilter, Family, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_mock::test_kit::TempDir;
use gpumon_mock::MockSampler;

mod common;
use common::run;

/// The example agent on the mock's a100x4, one sample as JSON.
fn agent() -> Command {
    let mut cmd = common::agent();
    cmd.args(["--backend", "mock", "--mock-profile", "a100x4", "--once", "--stdout-format", "json"]);
    cmd
}

fn first_sample(metrics: MetricSet) -> Snapshot {
    let sampler = MockSampler::from_profile_name("a100x4").unwrap();
    sampler.sample(&SampleRequest::new(metrics, DeviceFilter::all())).unwrap()
}

fn only(families: &[Family]) -> MetricSet {
    families.iter().fold(MetricSet::nothing(), |m, f| m.with(*f))
}

fn snapshot(stdout: &str) -> Snapshot {
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one snapshot: {stdout}");
    serde_json::from_str(lines[0]).unwrap()
}

#[test]
fn only_samples_exactly_the_families_named() {
    let (code, stdout, stderr) = run(agent().args(["--only", "utilization,memory"]));
    assert_eq!(code, 0, "{stderr}");
    let got = snapshot(&stdout);
    let want = first_sample(only(&[Family::Utilization, Family::Memory]));
    assert_eq!(got.devices, want.devices, "utilisation and memory, nothing else");
    assert!(got.devices[0].utilization.gpu.is_some() && got.devices[0].memory.used.is_some());
    assert!(got.devices[0].temperature.gpu.is_none(), "temperature is not among the families named");
    // The default set samples more than that: `--only` is not a no-op.
    assert_ne!(got.devices, first_sample(MetricSet::default()).devices);
}

/// The high-resolution windows are opt-in (docs/fleet.md §8): sampled for diagnosis, left out of
/// the snapshots the sinks get, until selected — by `--enable`, `agent.enable` or `--only`.
#[test]
fn windows_reach_the_sinks_only_when_selected() {
    let windows = |s: &Snapshot| s.devices.iter().filter(|d| d.windows.gpu_utilization.is_some()).count();
    let (code, stdout, stderr) = run(&mut agent());
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(windows(&snapshot(&stdout)), 0, "not exported by default");
    let (code, stdout, stderr) = run(agent().args(["--enable", "high_resolution"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(windows(&snapshot(&stdout)), 4, "--enable exports them");
    let dir = TempDir::new("agent-enable-windows");
    let path = dir.file("enable.toml", "[agent]\nenable = [\"high_resolution\"]\n");
    let (code, stdout, stderr) = run(agent().arg("--config").arg(&path));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(windows(&snapshot(&stdout)), 4, "agent.enable exports them");
    let (code, stdout, stderr) = run(agent().args(["--only", "utilization,high_resolution"]));
    assert_eq!(code, 0, "{stderr}");
    let got = snapshot(&stdout);
    assert_eq!(got.devices, first_sample(only(&[Family::Utilization, Family::HighResolution])).devices);
}

#[test]
fn only_in_the_config_file_and_flags_overriding_it() {
    let dir = TempDir::new("agent-only");
    let path = dir.file("only.toml", "[agent]\nonly = [\"temperature\"]\ndisable = []\n");
    let (code, stdout, stderr) = run(agent().arg("--config").arg(&path));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(snapshot(&stdout).devices, first_sample(only(&[Family::Temperature])).devices);
    // Flags override the file: --only replaces it, --enable refines it.
    let (code, stdout, stderr) = run(agent().arg("--config").arg(&path).args(["--only", "power"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(snapshot(&stdout).devices, first_sample(only(&[Family::Power])).devices);
    let (code, stdout, stderr) = run(agent().arg("--config").arg(&path).args(["--enable", "power"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(snapshot(&stdout).devices, first_sample(only(&[Family::Temperature, Family::Power])).devices);
}

#[test]
fn bad_only_settings_exit_2_naming_the_key() {
    let dir = TempDir::new("agent-only-bad");
    let cases: [(&str, &[&str], &str); 5] = [
        ("", &["--only", "telepathy"], "--only: unknown metric family `telepathy`"),
        ("", &["--only", ""], "--only: names no metric family"),
        ("", &["--only", "power", "--disable", "fan"], "--disable"),
        ("[agent]\nonly = []\n", &[], "agent.only: names no metric family"),
        ("[agent]\nonly = [\"power\"]\ndisable = [\"fan\"]\n", &[], "agent.only: cannot be combined"),
    ];
    for (i, (toml, args, needle)) in cases.iter().enumerate() {
        let path = dir.file(&format!("c{i}.toml"), toml);
        let (code, stdout, stderr) = run(agent().arg("--config").arg(&path).args(*args));
        assert_eq!(code, 2, "case {i}: {stderr}");
        assert!(stderr.contains(needle), "case {i}: `{needle}` not in: {stderr}");
        assert!(stdout.is_empty(), "case {i}: no data on a config error");
    }
}

/// The XID watcher on the fake libnvidia-ml (needs the NVML backend).
#[cfg(feature = "nvml")]
mod xid_watcher {
    use std::io::BufRead;

    use super::common::{self, fake_nvml};
    use gpumon::core::Snapshot;

    /// The names of the threads of a running process.
    fn threads(pid: u32) -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|c| c.trim().to_owned())
            .collect()
    }

    #[test]
    fn the_xid_watcher_runs_only_when_xid_events_are_sampled() {
        // On the fake libnvidia-ml: the watcher is NVML's (a thread blocked in the event wait, an
        // event set, a registration per GPU at start-up); without the `xid` family nothing reads it.
        for (families, watched) in [(None, true), (Some("utilization,memory"), false), (Some("memory,xid"), true)] {
            let mut agent = common::agent_process()
                .args(["--backend", "nvml", "--nvml-library"])
                .arg(fake_nvml())
                .args(["--interval", "100ms", "--duration", "20s", "--stdout-format", "json"])
                .env("GPUMON_FAKE_NVML_PROFILE", "h100x8")
                .stdout_piped();
            if let Some(f) = families {
                agent = agent.args(["--only", f]);
            }
            let mut agent = agent.spawn();
            // Once the first snapshot is out, every thread the sampler starts is running.
            let mut first = String::new();
            std::io::BufReader::new(agent.take_stdout()).read_line(&mut first).unwrap();
            let names = threads(agent.id());
            agent.kill();
            let snapshot: Snapshot = serde_json::from_str(&first)
                .unwrap_or_else(|e| panic!("{families:?}: {e}: {first:?}; stderr: {}", agent.log()));
            assert_eq!(snapshot.devices.len(), 8, "{families:?}");
            assert!(names.iter().any(|n| n == "gpumon-sampler"), "{families:?}: {names:?}");
            assert_eq!(names.iter().any(|n| n == "gpumon-nvml-xid"), watched, "{families:?}: {names:?}");
        }
    }
}

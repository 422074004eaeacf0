//! The agent's diagnosis flags, `--duration` and the run report, as a user runs them.
#![cfg(all(feature = "agent", feature = "stdout"))]

use std::io::Read;
use std::time::{Duration, Instant};

use gpumon::core::report::Report;
use gpumon::core::{FindingKind, Snapshot};
use gpumon_mock::test_kit::TempDir;

mod common;
use common::{agent, agent_process, mock_once, run};

#[test]
fn imbalance_report_names_the_idle_twins_and_prints_nothing_else() {
    let started = Instant::now();
    // Processes sampled: each pair of the scenario is one process on both GPUs, one job.
    let (code, stdout, stderr) = run(agent().args([
        "--backend",
        "mock",
        "--mock-scenario",
        "imbalance",
        "--enable",
        "processes",
        "--interval",
        "100ms",
        "--duration",
        "3s",
        "--diagnose-window",
        "1s",
        "--report",
        "--report-format",
        "json",
    ]));
    let elapsed = started.elapsed();
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(elapsed >= Duration::from_secs(3), "ran its --duration: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(15), "then stopped: {elapsed:?}");
    // --report alone does not switch the stdout sink on: the report is the only line.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report.gpus.len(), 8);
    assert!(report.ticks >= 10, "about 30 ticks in 3 s: {}", report.ticks);
    assert!((report.interval_seconds - 0.1).abs() < 1e-9);

    // Which GPUs idle and which are busy is read from the report's own utilisation figures.
    let busy: Vec<_> = report.gpus.iter().filter(|g| g.utilization_mean.unwrap() >= 0.6).collect();
    let idle: Vec<_> = report.gpus.iter().filter(|g| g.utilization_mean.unwrap() <= 0.25).collect();
    assert!(!busy.is_empty() && !idle.is_empty(), "{report:#?}");
    assert_eq!(busy.len() + idle.len(), 8);
    for g in &idle {
        let f: Vec<_> = g.findings.iter().filter(|f| f.kind == FindingKind::Imbalance).collect();
        assert_eq!(f.len(), 1, "GPU {}: {:?}", g.index, g.findings);
        assert!(f[0].held_seconds > 0.0 && f[0].held_seconds <= report.wall_seconds, "{:?}", f[0]);
        assert!(f[0].active_at_exit);
        assert!(f[0].evidence.contains("while GPU"), "{}", f[0].evidence);
        assert!(g.idle_allocated_ticks <= g.samples);
    }
    for g in &busy {
        assert!(g.findings.is_empty(), "busy GPU {}: {:?}", g.index, g.findings);
        assert_eq!(g.idle_allocated_ticks, 0);
        let p5 = g.utilization_p5.unwrap();
        let p95 = g.utilization_p95.unwrap();
        // A steady GPU reads the same every tick: p5 = mean = p95 up to the rounding of the sum.
        let mean = g.utilization_mean.unwrap();
        assert!(p5 <= mean + 1e-9 && mean <= p95 + 1e-9, "GPU {}: p5 {p5} mean {mean} p95 {p95}", g.index);
    }
    for g in &report.gpus {
        assert_eq!(g.samples, report.ticks);
        assert!(g.energy_joules.unwrap() > 0.0 && g.power_mean_watts.unwrap() > 0.0);
        assert!(g.memory_peak_bytes.unwrap() <= g.memory_total_bytes.unwrap());
    }
}

#[test]
fn with_no_process_read_the_idle_twins_are_imbalance_or_their_own_job() {
    // The default families: no process read, nothing says the twins share a job — both
    // readings are named, and the evidence says why.
    let (code, stdout, stderr) = run(agent().args([
        "--backend",
        "mock",
        "--mock-scenario",
        "imbalance",
        "--interval",
        "100ms",
        "--duration",
        "2s",
        "--diagnose-window",
        "1s",
        "--report",
        "--report-format",
        "json",
    ]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    let flagged: Vec<u32> = report
        .gpus
        .iter()
        .filter(|g| !g.findings.is_empty())
        .inspect(|g| {
            assert!(g.findings.iter().all(|f| f.kind == FindingKind::ImbalanceOrOwnJob), "{:?}", g.findings);
            assert!(g.findings[0].evidence.contains("no process is read on it"), "{}", g.findings[0].evidence);
        })
        .map(|g| g.index)
        .collect();
    assert_eq!(flagged, [1, 3, 5, 7], "{report:#?}");
}

#[test]
fn a_disabled_rule_raises_nothing() {
    let dir = TempDir::new("agent-diag-disable");
    let path = dir.file("c.toml", "[diagnose]\nwindow = \"1s\"\ndisable = [\"imbalance\"]\n");
    let (code, stdout, stderr) = run(agent()
        .args(["--backend", "mock", "--mock-scenario", "imbalance", "--enable", "processes"])
        .args(["--interval", "100ms", "--duration", "2s"])
        .args(["--report-format", "json", "--config"])
        .arg(&path));
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report.gpus.len(), 8);
    for g in &report.gpus {
        assert!(g.findings.iter().all(|f| f.kind != FindingKind::Imbalance), "GPU {}: {:?}", g.index, g.findings);
    }
}

#[test]
fn snapshots_then_the_report_when_stdout_is_also_asked_for() {
    let (code, stdout, stderr) = run(agent().args([
        "--backend",
        "mock",
        "--interval",
        "100ms",
        "--duration",
        "1s",
        "--stdout-format",
        "json",
        "--report-format",
        "json",
    ]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let (snapshots, report) = snapshots_then_report(&stdout);
    assert!(snapshots.len() >= 2, "{stdout}");
    for s in &snapshots {
        assert!(s.output::<gpumon::core::Diagnosis>().is_some(), "diagnosis is on by default");
    }
    assert_eq!(report.ticks as usize, snapshots.len(), "the report saw every tick the sink printed");
}

/// A run's stdout with `--stdout-format json --report-format json`: one snapshot per line, then
/// the run report.
fn snapshots_then_report(stdout: &str) -> (Vec<Snapshot>, Report) {
    let lines: Vec<_> = stdout.lines().collect();
    let (last, snapshots) = lines.split_last().unwrap_or_else(|| panic!("no output: {stdout}"));
    let snapshots = snapshots.iter().map(|line| serde_json::from_str(line).unwrap()).collect();
    (snapshots, serde_json::from_str(last).unwrap())
}

/// The high-resolution windows are opt-in for export (docs/fleet.md §8) but still sampled for
/// diagnosis: with the default families, no snapshot leaving through a sink carries a window,
/// and the starvation the windows show is found from them (its evidence quotes the min and max
/// within the interval, which only the windows hold).
#[test]
fn starvation_is_found_from_windows_that_no_sink_gets() {
    let (code, stdout, stderr) = run(agent().args([
        "--backend",
        "mock",
        "--mock-profile",
        "h100x8",
        "--mock-scenario",
        "dataloader-starved",
        "--interval",
        "500ms",
        "--diagnose-window",
        "2s",
        "--duration",
        "4s",
        "--stdout-format",
        "json",
        "--report-format",
        "json",
    ]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let (snapshots, report) = snapshots_then_report(&stdout);
    assert!(snapshots.len() >= 4, "{stdout}");
    for s in &snapshots {
        for d in &s.devices {
            assert_eq!(d.windows, Default::default(), "GPU {}: a window left the agent", d.info.index);
            assert_eq!(d.gpm, Default::default(), "GPU {}: GPM left the agent", d.info.index);
            assert!(d.utilization.gpu.is_some(), "the default families are exported");
        }
    }
    assert_eq!(report.gpus.len(), 8);
    // Each GPU starves on its own schedule: in 4 s some have held the finding's window, not all.
    // (In 3 s — six ticks — a loaded CI machine once saw none: the first ticks can fall before
    // a GPU's first batch, and the 2 s window needs four holding ticks.)
    let found: Vec<_> =
        report.gpus.iter().flat_map(|g| &g.findings).filter(|f| f.kind == FindingKind::DataloaderStarvation).collect();
    assert!(!found.is_empty(), "{report:#?}");
    for f in found {
        assert!(f.evidence.contains("within the interval"), "found from the windows: {}", f.evidence);
    }
}

#[test]
fn no_diagnose_leaves_snapshots_without_diagnosis() {
    let s = mock_once(&mut agent());
    assert!(s.output::<gpumon::core::Diagnosis>().is_some());
    let s = mock_once(agent().arg("--no-diagnose"));
    assert!(s.output::<gpumon::core::Diagnosis>().is_none());
}

#[test]
fn once_with_a_human_report() {
    let (code, stdout, stderr) =
        run(agent().args(["--backend", "mock", "--mock-profile", "a100x4", "--once", "--report"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.starts_with("gpumon run report: host "), "{stdout}");
    assert!(stdout.contains("1 tick(s)"), "{stdout}");
    for i in 0..4 {
        assert!(stdout.contains(&format!("GPU {i} NVIDIA A100")), "GPU {i}: {stdout}");
    }
    assert_eq!(stdout.matches("utilisation   mean").count(), 4, "{stdout}");
}

#[test]
fn sigterm_prints_the_report() {
    let mut agent = agent_process()
        .args(["--backend", "mock", "--interval", "100ms", "--report-format", "json"])
        .stdout_piped()
        .spawn();
    std::thread::sleep(Duration::from_millis(800));
    agent.sigterm();
    let mut stdout = String::new();
    agent.take_stdout().read_to_string(&mut stdout).unwrap();
    let status = agent.wait_timeout(Duration::from_secs(30));
    assert!(status.success(), "{status}; stderr: {}", agent.log());
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report.gpus.len(), 8);
    assert!(report.ticks >= 1);
}

#[test]
fn bad_diagnosis_configuration_exits_2_naming_the_key() {
    let dir = TempDir::new("agent-diag-cfg");
    let cases: [(&str, &[&str], &str); 11] = [
        ("", &["--interval", "1s", "--diagnose-window", "500ms"], "--diagnose-window"),
        ("[diagnose]\nwindow = \"500ms\"\n", &[], "diagnose.window"),
        ("[diagnose.thresholds]\nstarvation_dip = 1.5\n", &[], "diagnose.thresholds.starvation_dip"),
        ("[diagnose.thresholds]\nstarvation_dip = 0.7\n", &[], "must be below starvation_peak"),
        // Pairs out of order switch a rule off silently: refused, naming the key.
        ("[diagnose.thresholds]\nstarvation_min_mean = 0.9\n", &[], "diagnose.thresholds.starvation_min_mean"),
        ("[diagnose.thresholds]\nidle_level = 0.3\nidle_peak = 0.15\n", &[], "diagnose.thresholds.idle_level"),
        ("[diagnose.thresholds]\nloader_dip = 0.1\n", &[], "diagnose.thresholds.loader_dip"),
        ("[diagnose]\ndisable = [\"imbalanse\"]\n", &[], "diagnose.disable: unknown rule `imbalanse`"),
        ("[diagnose]\nenable = true\n", &[], "enable"),
        ("", &["--duration", "0s"], "--duration"),
        ("", &["--duration", "soon"], "soon"),
    ];
    for (i, (toml, args, needle)) in cases.iter().enumerate() {
        let path = dir.file(&format!("c{i}.toml"), toml);
        let (code, stdout, stderr) =
            run(agent().args(["--backend", "mock", "--report"]).arg("--config").arg(&path).args(*args));
        assert_eq!(code, 2, "case {i}: {stderr}");
        assert!(stderr.contains(needle), "case {i}: `{needle}` not in: {stderr}");
        assert!(stdout.is_empty(), "case {i}: no data on a config error: {stdout}");
    }
    // --duration makes no sense with --once.
    let (code, _, stderr) = run(agent().args(["--backend", "mock", "--once", "--duration", "1s"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("--duration"), "{stderr}");
}

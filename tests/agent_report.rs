//! The run report's overview as a user reads it: `--report` on a starving mock job opens with the
//! GPUs, the wall time, the idle GPU-time while allocated, the main cause with what it cost, the
//! time lost per cause and the settings under which rules cannot work — said at start-up too.
#![cfg(all(feature = "agent", feature = "stdout"))]

use gpumon::core::report::Report;
use gpumon::core::FindingKind;
use serde_json::Value;

mod common;
use common::{agent, run};

/// The built-in starving job: 8 GPUs busy 0.45 s of every 1.2 s step, so every 1 s interval
/// holds a busy stretch and an idle one (never a whole idle tick).
const STARVED: [&str; 10] = [
    "--backend",
    "mock",
    "--mock-scenario",
    "dataloader-starved",
    "--interval",
    "1s",
    "--duration",
    "8s",
    "--diagnose-window",
    "5s",
];

/// The number after `prefix` in `line` (up to the next space).
fn number_after(line: &str, prefix: &str) -> f64 {
    let rest = &line[line.find(prefix).unwrap_or_else(|| panic!("`{prefix}` in `{line}`")) + prefix.len()..];
    rest.split_whitespace().next().unwrap().trim_end_matches([',', '%', '(']).parse().unwrap()
}

#[test]
fn the_human_report_opens_with_the_overview() {
    let (code, stdout, stderr) = run(agent().args(STARVED).arg("--report"));
    assert_eq!(code, 0, "stderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("gpumon run report: host "), "{stdout}");
    assert_eq!(lines[1], "overview", "{stdout}");
    let first_gpu = lines.iter().position(|l| l.starts_with("GPU 0 ")).expect("the per-GPU part");
    let overview = &lines[1..first_gpu];
    let line =
        |start: &str| *overview.iter().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("`{start}`: {stdout}"));

    let gpus = line("  GPUs ");
    assert!(gpus.starts_with("  GPUs                  8, wall time "), "{gpus}");
    let wall = number_after(gpus, "wall time ");
    assert!((7.0..12.0).contains(&wall), "{gpus}");

    // The GPUs are idle about 62 % of every interval without a single whole idle tick: the
    // idle share is counted within the intervals.
    let idle = line("  idle while allocated ");
    let share = number_after(idle, "allocated (");
    assert!((45.0..80.0).contains(&share), "{idle}");
    assert!(stdout.contains("0 whole idle tick(s)"), "{stdout}");

    let main = line("  main cause ");
    assert!(main.starts_with("  main cause            dataloader_starvation on 8 GPU(s): "), "{main}");
    let lost = number_after(main, "GPU-h (");
    assert!(lost > 0.0, "{main}");
    let per_cause = overview.iter().position(|l| l.starts_with("  time lost per cause")).expect("per cause");
    assert!(overview[per_cause + 1].trim_start().starts_with("dataloader_starvation"), "{stdout}");
    assert!(overview.iter().any(|l| l.starts_with("  driver sampling       utilisation every ")), "{stdout}");

    // PCIe throughput is opt-in: pcie_bound cannot work, in the report and at start-up.
    let limits = overview.iter().position(|l| *l == "  limitations:").expect("limitations");
    assert!(
        overview[limits + 1..]
            .iter()
            .any(|l| l.starts_with("    [warning] pcie_bound: PCIe throughput is not sampled")),
        "{stdout}"
    );
    assert!(stderr.contains("diagnosis limitation: pcie_bound: PCIe throughput is not sampled"), "{stderr}");
}

#[test]
fn the_json_report_carries_the_overview() {
    let (code, stdout, stderr) = run(agent().args(STARVED).args(["--report-format", "json"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    let o = &report.overview;
    assert_eq!(o.gpus, 8);
    let tick = report.interval_seconds;
    assert!((o.gpu_seconds - report.gpus.iter().map(|g| g.observed_seconds).sum::<f64>()).abs() < 1e-9);
    for g in &report.gpus {
        // The first tick opens the run and covers nothing; each later one covers the time since
        // the one before, at most an interval (the last, taken at exit, part of one). So a GPU
        // seen throughout has at most the wall time, and all of it when no tick came late.
        let whole = (g.samples - 2) as f64 * tick;
        assert!(g.observed_seconds > whole - 1e-9, "{g:?}");
        assert!(g.observed_seconds <= report.wall_seconds + 1e-9, "wall {}: {g:?}", report.wall_seconds);
    }
    assert!(
        (o.idle_allocated_seconds - report.gpus.iter().map(|g| g.idle_allocated_seconds).sum::<f64>()).abs() < 1e-9
    );
    let share = o.idle_allocated_seconds / o.allocated_seconds;
    assert!((0.45..0.8).contains(&share), "idle share {share}: {o:#?}");
    for g in &report.gpus {
        assert_eq!(g.idle_allocated_ticks, 0, "GPU {}: never a whole idle tick", g.index);
        assert!(g.idle_allocated_seconds > 0.3 * g.allocated_seconds, "GPU {}: {g:?}", g.index);
    }

    let main = o.main_cause.as_ref().expect("a main cause");
    assert_eq!(main.kind, FindingKind::DataloaderStarvation);
    assert_eq!(main.gpus, 8);
    assert_eq!(Some(main), o.causes.first());
    // What it cost is the idle time while it held: some, and never more than all the idle time.
    assert!(main.lost_gpu_seconds > 0.0 && main.lost_gpu_seconds <= o.idle_allocated_seconds, "{main:?}");
    assert!(main.lost_gpu_seconds < main.active_gpu_seconds, "{main:?}");
    // The main cause's figure is the sum of its findings on the GPUs (another kind held on a
    // GPU for a tick is its own cause's).
    let per_gpu: f64 =
        report.gpus.iter().flat_map(|g| &g.findings).filter(|f| f.kind == main.kind).map(|f| f.lost_gpu_seconds).sum();
    assert!((per_gpu - main.lost_gpu_seconds).abs() < 1e-9, "{per_gpu} vs {main:?}");

    // The built-in scenarios' driver samples utilisation every 1/6 s, whatever the interval.
    let period = o.driver_sample_period_seconds.expect("a measured period");
    assert!((period - 1.0 / 6.0).abs() < 0.02, "{period} (interval {tick} s)");

    // The field names, as a script reads them.
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["overview"]["main_cause"]["kind"], "dataloader_starvation");
    assert!(v["overview"]["causes"][0]["lost_gpu_seconds"].as_f64().unwrap() > 0.0);
    let limits = v["overview"]["limitations"].as_array().unwrap();
    let pcie = limits.iter().find(|l| l["rules"] == serde_json::json!(["pcie_bound"])).expect("pcie_bound");
    assert_eq!(pcie["severity"], "warning");
    assert!(pcie["remedy"].as_str().unwrap().contains("--enable pcie_throughput"), "{pcie}");
    let starvation = limits.iter().find(|l| l["rules"] == serde_json::json!(["dataloader_starvation"])).unwrap();
    assert!(starvation["reason"].as_str().unwrap().contains("(measured here: "), "{starvation}");
}

#[test]
fn the_limitations_follow_the_settings() {
    // PCIe throughput sampled, but a window of three ticks: starvation across ticks cannot work.
    let (code, stdout, stderr) = run(agent().args([
        "--backend",
        "mock",
        "--once",
        "--interval",
        "100ms",
        "--diagnose-window",
        "300ms",
        "--enable",
        "pcie_throughput",
        "--report-format",
        "json",
    ]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    let limits = &report.overview.limitations;
    assert!(!limits.iter().any(|l| l.rules.contains(&FindingKind::PcieBound)), "{limits:#?}");
    let window = limits.iter().find(|l| l.reason.contains("the window holds 3 tick(s)")).expect("the window");
    assert_eq!(window.rules, [FindingKind::DataloaderStarvation, FindingKind::PipelineBubbles]);
    assert!(window.remedy.contains("--diagnose-window 500ms"), "{window}");
    assert!(
        stderr.contains("diagnosis limitation: dataloader_starvation, pipeline_bubbles: the window holds 3"),
        "{stderr}"
    );
    assert!(!stderr.contains("pcie_bound"), "{stderr}");

    // Diagnosis off: no rule, so nothing it cannot do.
    let (code, stdout, stderr) =
        run(agent().args(["--backend", "mock", "--once", "--no-diagnose", "--report-format", "json"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report.overview.limitations.is_empty(), "{:#?}", report.overview.limitations);
    assert!(!stderr.contains("diagnosis limitation"), "{stderr}");
}

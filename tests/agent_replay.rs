//! `--record` and `--backend replay`, as a user runs them: a mock run recorded, then replayed as
//! fast as possible, reports the same findings; bad traces and flags are refused clearly.
#![cfg(all(feature = "agent", feature = "stdout"))]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpumon::core::report::Report;
use gpumon::core::Snapshot;

mod common;
use common::{agent, run};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-agent-replay-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What a report says that a replay must reproduce: per GPU, the samples, the utilisation and
/// every finding (kind, when raised, evidence).
fn findings(report: &Report) -> Vec<(u32, u64, Option<f64>, Vec<String>)> {
    report
        .gpus
        .iter()
        .map(|g| {
            let f = g.findings.iter().map(|f| format!("{:?} {:?} {}", f.kind, f.raised_at, f.evidence)).collect();
            (g.index, g.samples, g.utilization_mean, f)
        })
        .collect()
}

#[test]
fn a_recorded_run_replays_to_the_same_report() {
    let dir = temp_dir("same");
    let trace = dir.join("run.gpumon-trace.gz");
    let window = ["--diagnose-window", "1s", "--report-format", "json"];
    let (code, live, stderr) = run(agent()
        .args(["--backend", "mock", "--mock-scenario", "imbalance", "--interval", "100ms", "--duration", "3s"])
        .args(window)
        .arg("--record")
        .arg(&trace));
    assert_eq!(code, 0, "{stderr}");
    let live: Report = serde_json::from_str(live.trim()).unwrap();
    assert!(live.gpus.iter().any(|g| !g.findings.is_empty()), "the imbalance scenario raises findings");

    let started = Instant::now();
    let (code, replayed, stderr) =
        run(agent().arg("--replay").arg(&trace).args(["--replay-speed", "max"]).args(window));
    assert_eq!(code, 0, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(3), "as fast as possible, not the recorded 3 s");
    let replayed: Report = serde_json::from_str(replayed.trim()).unwrap();
    assert_eq!(replayed.ticks, live.ticks);
    assert_eq!(findings(&replayed), findings(&live));

    // Through a sink, replayed data says so.
    let (code, stdout, stderr) =
        run(agent().arg("--replay").arg(&trace).args(["--replay-speed", "0", "--stdout-format", "json"]));
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Snapshot> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len() as u64, live.ticks);
    assert!(lines.iter().all(|s| s.system.backend == "replay"));
    assert!(lines.windows(2).all(|w| w[1].taken_at > w[0].taken_at && w[1].seq == w[0].seq + 1));
}

#[test]
fn a_replay_at_real_time_takes_the_recorded_time() {
    let dir = temp_dir("pace");
    let trace = dir.join("run.gz");
    let (code, _, stderr) =
        run(agent().args(["--backend", "mock", "--interval", "100ms", "--duration", "1s", "--record"]).arg(&trace));
    assert_eq!(code, 0, "{stderr}");
    let started = Instant::now();
    let (code, stdout, stderr) = run(agent().arg("--replay").arg(&trace).args(["--stdout-format", "json"]));
    assert_eq!(code, 0, "{stderr}");
    let n = stdout.lines().count();
    assert!(n >= 8, "{n} snapshots");
    // n snapshots 100 ms apart: the last is due (n - 1) × 100 ms after the first.
    assert!(started.elapsed() >= Duration::from_millis(100 * (n as u64 - 1)), "{:?}", started.elapsed());
}

/// A replay's diagnosis limitations are those of what its trace recorded — the families, the
/// step marks — whatever the replay's own flags (which add nothing to a trace): PCIe throughput
/// recorded is not "not sampled", a recording that read step marks is not told to mark steps.
#[test]
fn a_replays_limitations_are_those_of_what_was_recorded() {
    let dir = temp_dir("limits");
    let trace = dir.join("run.gz");
    let socket = dir.join("steps.sock");
    let (code, _, stderr) = run(agent()
        .args(["--backend", "mock", "--interval", "200ms", "--duration", "1s", "--enable", "pcie_throughput"])
        .arg("--steps-socket")
        .arg(&socket)
        .arg("--record")
        .arg(&trace));
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run(agent().env("GPUMON_LOG", "info").arg("--replay").arg(&trace).args([
        "--replay-speed",
        "max",
        "--report-format",
        "json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let report: Report = serde_json::from_str(stdout.trim()).unwrap();
    let limits = &report.overview.limitations;
    assert!(!limits.iter().any(|l| l.reason.contains("PCIe throughput")), "{limits:#?}");
    assert!(!stderr.contains("PCIe throughput is not sampled"), "{stderr}");
    let starvation = limits.iter().find(|l| l.reason.contains("driver's utilisation sampling period")).unwrap();
    assert!(starvation.remedy.starts_with("step marks are read"), "{starvation:?}");
    // At start-up too, before a step is replayed.
    assert!(stderr.contains("step marks are read") && !stderr.contains("mark training steps"), "{stderr}");
}

#[test]
fn bad_traces_and_flags_are_refused_clearly() {
    let dir = temp_dir("bad");
    let empty = dir.join("empty.gz");
    std::fs::write(&empty, b"").unwrap();
    let (code, _, stderr) = run(agent().arg("--replay").arg(&empty));
    assert_eq!(code, 2);
    assert!(stderr.contains("empty"), "{stderr}");

    let future = dir.join("future.jsonl");
    std::fs::write(&future, "{\"format\":\"gpumon-trace\",\"version\":99,\"gpumon_version\":\"9.0.0\"}\n").unwrap();
    let (code, _, stderr) = run(agent().arg("--replay").arg(&future));
    assert_eq!(code, 2);
    assert!(stderr.contains("format version 99") && stderr.contains("gpumon 9.0.0"), "{stderr}");

    // A corrupt line mid-trace: the lines before it are replayed, then the agent stops, exit 1,
    // naming the line.
    let good = dir.join("good.gz");
    let (code, _, stderr) =
        run(agent().args(["--backend", "mock", "--interval", "100ms", "--duration", "500ms", "--record"]).arg(&good));
    assert_eq!(code, 0, "{stderr}");
    let text = plain_text(&good);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(3, "{\"seq\": 3, \"taken_at\": oops}");
    let corrupt = dir.join("corrupt.jsonl");
    std::fs::write(&corrupt, lines.join("\n")).unwrap();
    let (code, stdout, stderr) =
        run(agent().arg("--replay").arg(&corrupt).args(["--replay-speed", "max", "--stdout-format", "json"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("line 4"), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "the two snapshots before the bad line were replayed");

    // A plain trace cut mid-line by its writer: truncated, not corrupt (docs/replay.md's table).
    let cut = dir.join("cut.jsonl");
    std::fs::write(&cut, &text[..text.len() - text.lines().last().unwrap().len() / 2]).unwrap();
    let (code, stdout, stderr) =
        run(agent().arg("--replay").arg(&cut).args(["--replay-speed", "max", "--stdout-format", "json"]));
    assert_eq!(code, 1, "{stderr}");
    let last = text.lines().count();
    assert!(stderr.contains(&format!("line {last}: the trace is truncated")), "{stderr}");
    assert!(!stderr.contains("corrupt"), "{stderr}");
    assert_eq!(stdout.lines().count(), last - 2, "every whole snapshot was replayed");

    // No snapshot to replay — only the header, or a first snapshot cut off — is refused before
    // anything runs, naming the file and the recorded host, as an empty file is.
    let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let host = header["system"]["hostname"].as_str().unwrap();
    assert!(!host.is_empty(), "{header}");
    let header_only = dir.join("header-only.jsonl");
    std::fs::write(&header_only, format!("{}\n", text.lines().next().unwrap())).unwrap();
    let second = text.lines().nth(1).unwrap();
    let first_cut = dir.join("first-cut.jsonl");
    std::fs::write(&first_cut, format!("{}\n{}", text.lines().next().unwrap(), &second[..second.len() / 2])).unwrap();
    for (trace, why) in [(&header_only, "it ends after its header"), (&first_cut, "line 2: the trace is truncated")] {
        let (code, stdout, stderr) =
            run(agent().arg("--replay").arg(trace).args(["--replay-speed", "max", "--report"]));
        assert_eq!(code, 2, "{stderr}");
        assert!(stdout.is_empty(), "no report of nothing: {stdout}");
        for needle in [&trace.display().to_string(), "holds no snapshot", &format!("host `{host}`"), why] {
            assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
        }
    }

    let (code, _, stderr) = run(agent().args(["--backend", "replay"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("--replay FILE"), "{stderr}");
    let (code, _, stderr) = run(agent().args(["--backend", "nvml", "--replay"]).arg(&good));
    assert_eq!(code, 2);
    assert!(stderr.contains("--backend replay"), "{stderr}");
    let (code, _, stderr) = run(agent().args(["--replay-speed", "fast", "--replay"]).arg(&good));
    assert_eq!(code, 2);
    assert!(stderr.contains("fast"), "{stderr}");
    let (code, _, stderr) = run(agent().args(["--backend", "mock", "--once", "--record", "/nonexistent/dir/t.gz"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("--record") && stderr.contains("/nonexistent/dir/t.gz"), "{stderr}");
}

/// The trace at `path` as uncompressed JSON lines that the reader accepts: its header, then
/// every snapshot with its identity inline (read and written back by the library, so this test
/// needs no gzip of its own).
fn plain_text(path: &std::path::Path) -> String {
    let reader = gpumon::core::trace::TraceReader::open(path).unwrap();
    let mut out = serde_json::to_string(reader.header()).unwrap();
    out.push('\n');
    for s in reader {
        out.push_str(&serde_json::to_string(&s.unwrap()).unwrap());
        out.push('\n');
    }
    out
}

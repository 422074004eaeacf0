//! `gpumon-agent run -- CMD` and `gpumon-agent compare`, as a user runs them: the example agent
//! on the mock backend runs a small Python job that marks steps through the socket the
//! environment names (the line protocol, no gpumon package needed), and the report, the exit
//! code and the report file are checked.
#![cfg(all(feature = "agent", feature = "stdout"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpumon::core::report::Report;
use serde_json::Value;

mod common;
use common::{agent, run};

/// A job that marks steps 1..=N on the socket in `GPUMON_STEPS_SOCKET`, one every PAUSE
/// seconds, as run RANK of job `train` (rank from `LOCAL_RANK`, if set), then exits with CODE.
/// With READY it creates that file after the third step. On SIGINT it marks one more step,
/// 1000, and dies of SIGINT (as Python does on an uncaught KeyboardInterrupt).
const JOB: &str = r#"
import json, os, signal, socket, sys, time
n, pause, code = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
ready = sys.argv[4] if len(sys.argv) > 4 else None
rank = os.environ.get("LOCAL_RANK")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["GPUMON_STEPS_SOCKET"])
def mark(i):
    s.sendall((json.dumps({"job": "train", "rank": None if rank is None else int(rank), "step": i}) + "\n").encode())
def interrupted(signum, frame):
    mark(1000)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
signal.signal(signal.SIGINT, interrupted)
for i in range(1, n + 1):
    time.sleep(pause)
    mark(i)
    if ready and i == 3:
        open(ready, "w").close()
sys.exit(code)
"#;

/// torchrun in small: starts two ranks of JOB (LOCAL_RANK 0 and 1) and waits for both.
const LAUNCHER: &str = r#"
import os, subprocess, sys
job, n, pause = sys.argv[1], sys.argv[2], sys.argv[3]
ranks = [subprocess.Popen([sys.executable, job, n, pause, "0"], env=dict(os.environ, LOCAL_RANK=str(r))) for r in range(2)]
sys.exit(max(p.wait() for p in ranks))
"#;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-agent-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn python() -> String {
    std::env::var("GPUMON_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// `agent run` on the mock (4 GPUs, 500 ms ticks) with `flags`, writing the report to
/// `dir/report.json`. Jobs that count their steps mark one every 0.6 s, longer than a tick: the
/// step tracker reads the last mark of each tick, so two marks in one tick would be one step.
fn run_cmd(dir: &Path, flags: &[&str]) -> Command {
    let mut cmd = agent();
    cmd.args(["run", "--backend", "mock", "--mock-profile", "a100x4", "--interval", "500ms", "--report-file"])
        .arg(dir.join("report.json"))
        .args(flags);
    cmd
}

fn report_file(dir: &Path) -> (Report, Value) {
    let text = std::fs::read_to_string(dir.join("report.json")).unwrap();
    (serde_json::from_str(&text).unwrap(), serde_json::from_str(&text).unwrap())
}

#[test]
fn a_job_marking_steps_and_failing_keeps_its_code_and_every_step() {
    let dir = temp_dir("fail");
    let job = write(&dir, "job.py", JOB);
    let (code, stdout, stderr) = run(run_cmd(&dir, &[]).arg("--").arg(python()).arg(&job).args(["6", "0.6", "3"]));
    assert_eq!(code, 3, "the command's code; stderr: {stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("gpumon run: the command exited with code 3; watched every GPU sampled"), "{stdout}");
    assert!(stdout.contains("\ngpumon run report: host "), "{stdout}");
    assert!(stdout.contains(" (MOCK backend: simulated GPUs), "), "simulated data says so: {stdout}");
    // The socket's first mark has no known start; every later one is a step, the last included.
    assert!(stdout.contains("\nsteps                   5 step(s), step time median 0.6"), "{stdout}");
    assert!(stdout.contains("\n  train                 5 step(s) (2–6), "), "{stdout}");

    let (report, json) = report_file(&dir);
    assert_eq!(json["format"], 1);
    let steps = report.steps.expect("steps in the report");
    assert_eq!(steps.runs.len(), 1);
    assert_eq!((steps.runs[0].first_step, steps.runs[0].last_step), (Some(2), Some(6)));
    let median = steps.duration_median_seconds.unwrap();
    assert!((0.55..0.9).contains(&median), "{median}");
    assert!(steps.energy_per_step_joules.unwrap() > 0.0);
    assert_eq!(report.gpus.len(), 4);
}

#[test]
fn an_interrupted_job_exits_130_with_its_report_and_its_last_mark() {
    let dir = temp_dir("sigint");
    let job = write(&dir, "job.py", JOB);
    let ready = dir.join("ready");
    let mut child = run_cmd(&dir, &[])
        .arg("--")
        .arg(python())
        .arg(&job)
        .args(["1000", "0.2", "0"])
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ready.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "the job never marked three steps");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the agent did not stop after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert_eq!(out.status.code(), Some(130), "128 + SIGINT, as a shell says; stderr: {stderr}");
    assert!(stdout.starts_with("gpumon run: the command was killed by signal 2 (SIGINT)"), "{stdout}");
    let (report, _) = report_file(&dir);
    let run = &report.steps.expect("steps").runs[0];
    // The mark the job wrote on SIGINT, just before it died, is in the last sample.
    assert_eq!(run.last_step, Some(1000), "{run:?}");
    assert!(run.steps >= 3, "{run:?}");
}

#[test]
fn a_launcher_with_two_ranks_is_one_job_on_the_gpus_it_was_given() {
    let dir = temp_dir("ranks");
    let job = write(&dir, "job.py", JOB);
    let launcher = write(&dir, "launch.py", LAUNCHER);
    let (code, stdout, stderr) = run(run_cmd(&dir, &[])
        .env("CUDA_VISIBLE_DEVICES", "1,2")
        .arg("--")
        .arg(python())
        .arg(&launcher)
        .arg(&job)
        .args(["5", "0.6"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let (report, _) = report_file(&dir);
    assert_eq!(report.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 2], "{stdout}");
    let steps = report.steps.expect("steps");
    let mut ranks: Vec<(Option<u32>, Option<u64>)> = steps.runs.iter().map(|r| (r.rank, r.last_step)).collect();
    ranks.sort();
    assert_eq!(ranks, [(Some(0), Some(5)), (Some(1), Some(5))], "{stdout}");
    assert_eq!(steps.steps, 8, "4 steps per rank after each rank's first mark");
    assert!(stdout.contains("\n  train rank 0          4 step(s) (2–5)"), "{stdout}");
}

#[test]
fn a_missing_or_unexecutable_command_says_so_and_exits_as_a_shell_would() {
    let dir = temp_dir("cannot");
    let (code, stdout, stderr) = run(agent().args(["run", "--backend", "mock"]));
    assert_eq!((code, stdout.as_str()), (127, ""));
    assert_eq!(stderr.trim(), "gpumon: run: no command given (gpumon-agent run [FLAGS] -- CMD ARGS…)");

    let (code, _, stderr) = run(agent().args(["run", "--backend", "mock", "--", "gpumon-no-such-command"]));
    assert_eq!(code, 127);
    assert_eq!(stderr.trim(), "gpumon: run: gpumon-no-such-command: command not found");

    let script = write(&dir, "not-executable.sh", "#!/bin/sh\nexit 0\n");
    let (code, _, stderr) = run(agent().args(["run", "--backend", "mock", "--"]).arg(&script));
    assert_eq!(code, 126);
    assert_eq!(stderr.trim(), format!("gpumon: run: {}: permission denied", script.display()));
}

/// The article's case on the mock: the starved run, then the same job with the input pipeline
/// fixed (the GPU no longer waits 0.75 s of every 1.2 s step: 0.45 s steps).
#[test]
fn compare_names_the_fix_of_a_starved_job_and_its_size() {
    let dir = temp_dir("compare");
    let job = write(&dir, "job.py", JOB);
    // Each run lasts longer than its 4 s diagnosis window: a finding gone is then a finding gone.
    let one = |scenario: &str, steps: &str, pause: &str, name: &str| {
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let (code, stdout, stderr) = run(agent()
            .args(["run", "--backend", "mock", "--mock-scenario", scenario, "--interval", "1s", "--diagnose-window"])
            .args(["4s", "--report-file"])
            .arg(dir.join(format!("{name}.json")))
            .arg("--")
            .arg(python())
            .arg(&job)
            .args([steps, pause, "0"]));
        assert_eq!(code, 0, "{scenario}: {stdout}\n{stderr}");
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        serde_json::from_str::<Report>(&text).unwrap()
    };
    let before = one("dataloader-starved", "8", "1.2", "before");
    let after = one("training", "14", "0.45", "after");
    assert_eq!(
        before.overview.main_cause.as_ref().map(|c| c.kind.name()),
        Some("dataloader_starvation"),
        "{before:#?}"
    );

    let (code, stdout, stderr) = run(agent().arg("compare").arg(dir.join("before.json")).arg(dir.join("after.json")));
    assert_eq!(code, 0, "{stderr}");
    let (b, a) = (before.steps.as_ref().unwrap(), after.steps.as_ref().unwrap());
    let (mb, ma) = (b.duration_median_seconds.unwrap(), a.duration_median_seconds.unwrap());
    let expected = format!(
        "  main change           step time median {mb:.3} s → {ma:.3} s, {:+.1} % (better)",
        (ma / mb - 1.0) * 100.0
    );
    assert!(stdout.contains(&expected), "`{expected}` in\n{stdout}");
    assert!((-70.0..-55.0).contains(&((ma / mb - 1.0) * 100.0)), "{stdout}");
    let line =
        |start: &str| stdout.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {stdout}"));
    assert!(line("  utilisation ").ends_with("(better)"), "{stdout}");
    assert!(line("  idle while allocated ").ends_with("(better)"), "{stdout}");
    assert!(line("  energy per step ").ends_with("(better)"), "{stdout}");
    // The starvation is gone; on a loaded machine the fixed run may still hold it for a tick or
    // two at its start, and then it is in both runs, at a fraction of the cost.
    let lost = |r: &Report| {
        r.overview.causes.iter().find(|c| c.kind.name() == "dataloader_starvation").map(|c| c.lost_gpu_seconds)
    };
    match lost(&after) {
        None => assert!(line("  findings gone ").contains("dataloader_starvation ("), "{stdout}"),
        Some(a) => {
            assert!(line("  findings in both ").contains("dataloader_starvation ("), "{stdout}");
            assert!(a < 0.2 * lost(&before).unwrap(), "{stdout}");
        }
    }
    assert_eq!(line("  findings new "), "  findings new          none");

    let (code, stdout, _) =
        run(agent().arg("compare").arg("--json").arg(dir.join("before.json")).arg(dir.join("after.json")));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["main"], "step_time_median");
    if lost(&after).is_none() {
        // Starvation is gone; the ranks' last ticks may also have read "cannot tell" (their
        // readings change as the job ends), gone too.
        let gone: Vec<&str> = v["findings_gone"].as_array().unwrap().iter().filter_map(|k| k.as_str()).collect();
        assert!(gone.contains(&"dataloader_starvation"), "{gone:?}");
        assert!(gone.iter().all(|k| matches!(*k, "dataloader_starvation" | "starvation_or_bubbles")), "{gone:?}");
    }
    let util = v["changes"].as_array().unwrap().iter().find(|c| c["measure"] == "utilization").unwrap();
    assert!(util["after"].as_f64().unwrap() > 0.9 && util["before"].as_f64().unwrap() < 0.6, "{util}");
}

#[test]
fn compare_refuses_what_is_not_a_report_of_this_format_in_one_line() {
    let dir = temp_dir("bad");
    let good = write(
        &dir,
        "good.json",
        r#"{"format":1,"hostname":"h","ticks":1,"interval_seconds":1.0,"wall_seconds":0.0,"gpus":[],"host_findings":[],"overview":{"gpus":0,"gpu_seconds":0.0,"allocated_seconds":0.0,"idle_allocated_seconds":0.0,"main_cause":null,"causes":[],"driver_sample_period_seconds":null,"limitations":[]}}"#,
    );
    let other =
        write(&dir, "other.json", &std::fs::read_to_string(&good).unwrap().replace(r#""format":1"#, r#""format":7"#));
    let unversioned = write(&dir, "old.json", &std::fs::read_to_string(&good).unwrap().replace(r#""format":1,"#, ""));
    let not_report = write(&dir, "not.json", r#"{"hello":"world"}"#);
    let not_json = write(&dir, "not.txt", "gpumon run report: host h\n");
    let missing = dir.join("missing.json");

    let (code, stdout, _) = run(agent().arg("compare").arg(&good).arg(&good));
    assert_eq!(code, 0, "a valid pair compares");
    assert!(stdout.contains("main change           none measurable"), "{stdout}");
    let cases: [(&Path, String); 5] = [
        (&other, format!("{}: a run report of format 7; this gpumon reads format 1", other.display())),
        (&unversioned, format!("{}: a run report of format 0; this gpumon reads format 1", unversioned.display())),
        (&not_report, format!("{}: not a gpumon run report (no `gpus`, `overview` and `ticks`)", not_report.display())),
        (&not_json, format!("{}: not a gpumon run report (not JSON: ", not_json.display())),
        (&missing, format!("{}: cannot read: ", missing.display())),
    ];
    for (path, expected) in cases {
        let (code, stdout, stderr) = run(agent().arg("compare").arg(&good).arg(path));
        assert_eq!(code, 2, "{stderr}");
        assert!(stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with(&format!("gpumon: compare: {expected}")), "`{expected}` in {stderr}");
    }
}

/// `gpumon-agent run` in a PID namespace of its own (`unshare`) on the fake libnvidia-ml's
/// `a100x4`: the agent is pid 1 and the job's processes get small pids, so the fake can list them
/// on GPUs before they exist (`pids`, as `GPUMON_FAKE_NVML_PIDS` reads it; `JOB_PIDS` stands for
/// pids 2–150, among which the launcher and its ranks are). `flags` go to the agent, `command`
/// after `--`, `env` to the fake. Its output, and the report file in `dir`.
fn run_in_pid_namespace(dir: &Path, flags: &[&str], command: &[&Path], args: &[&str], env: &[(&str, &str)]) -> Output {
    let usable = Command::new("unshare")
        .args(["--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(usable, "this test needs `unshare --user --pid --mount-proc` (util-linux, user namespaces)");
    let job_pids = (2..=150).map(|p: u32| p.to_string()).collect::<Vec<_>>().join("+");
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--pid", "--fork", "--mount-proc"])
        .arg(gpumon_mock::test_kit::example_path("agent"))
        .args(["run", "--backend", "nvml", "--nvml-library"])
        .arg(common::fake_nvml())
        .args(flags)
        .arg("--report-file")
        .arg(dir.join("report.json"))
        .arg("--")
        .arg(python())
        .args(command)
        .args(args)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .env("GPUMON_LOG", "warn")
        .env("GPUMON_FAKE_NVML_PROFILE", "a100x4");
    for (key, value) in env {
        cmd.env(key, value.replace("JOB_PIDS", &job_pids));
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    out
}

/// The process-tree case: pids 2–150 on GPUs 1 and 2, the agent's own pid on GPU 0 (not the
/// job's), nothing on the others.
#[test]
fn the_report_is_about_the_gpus_the_job_s_processes_were_seen_on() {
    let dir = temp_dir("tree");
    let job = write(&dir, "job.py", JOB);
    let launcher = write(&dir, "launch.py", LAUNCHER);
    let out = run_in_pid_namespace(
        &dir,
        &["--interval", "300ms"],
        &[&launcher, &job],
        &["5", "0.3"],
        &[("GPUMON_FAKE_NVML_PIDS", "0=1,1=JOB_PIDS,2=JOB_PIDS")],
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.starts_with(
            "gpumon run: the command exited with code 0; watched GPU 1, 2 (the job's processes were seen on them)"
        ),
        "{stdout}\n{stderr}"
    );
    let (report, _) = report_file(&dir);
    assert_eq!(report.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(report.overview.gpus, 2);
    let steps = report.steps.expect("steps");
    assert_eq!(steps.runs.iter().map(|r| r.last_step).collect::<Vec<_>>(), [Some(5), Some(5)]);
}

/// The `run` command's process tree names the job for diagnosis (issue #42, item 1), before
/// anything else: on the fake libnvidia-ml's `imbalance` scenario (GPU 0 busy at 95 %, GPU 1
/// idle at 9 % holding as much memory), the job's processes listed on both and nothing else
/// saying they are one job (no owners, no marks naming the GPUs, several processes on each), GPU
/// 1 is the idle half of the run's uneven split: `imbalance`. Without the tree, its own process
/// read and no job known, it would be a job of its own (nothing named). The ranks mark no steps
/// (marks naming rank `r` would put the job on GPU `r` by themselves).
#[test]
fn the_run_s_process_tree_is_the_job_diagnosis_compares() {
    let dir = temp_dir("tree-diagnosis");
    // The LAUNCHER's ranks, marking nothing: each sleeps N × PAUSE seconds.
    let job = write(&dir, "job.py", "import sys, time\ntime.sleep(int(sys.argv[1]) * float(sys.argv[2]))\n");
    let launcher = write(&dir, "launch.py", LAUNCHER);
    let out = run_in_pid_namespace(
        &dir,
        &["--interval", "250ms", "--diagnose-window", "3s"],
        &[&launcher, &job],
        &["24", "0.4"],
        &[
            ("GPUMON_FAKE_NVML_SCENARIO", "imbalance"),
            ("GPUMON_FAKE_NVML_TICK_MS", "250"),
            ("GPUMON_FAKE_NVML_PIDS", "0=JOB_PIDS,1=JOB_PIDS,2=1"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (report, _) = report_file(&dir);
    assert_eq!(report.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1], "{stdout}");
    let kinds = |i: usize| report.gpus[i].findings.iter().map(|f| f.kind.to_string()).collect::<Vec<_>>();
    assert_eq!(kinds(1), ["imbalance"], "{stdout}");
    assert!(kinds(0).is_empty(), "{stdout}");
}

/// A loop marking thousands of steps a second, the last ones just before it exits: the report
/// counts every step, not only those the tracker reports one by one (64 a tick), and none of the
/// marks still unread when the command exited is cut off.
#[test]
fn a_fast_loop_s_every_step_is_counted_up_to_its_last_mark() {
    const FAST: &str = r#"
import json, os, socket, sys
n = int(sys.argv[1])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["GPUMON_STEPS_SOCKET"])
s.sendall(b"".join(b'{"job":"fast","step":%d}\n' % i for i in range(1, n + 1)))
"#;
    let dir = temp_dir("fast");
    let job = write(&dir, "fast.py", FAST);
    let (code, stdout, stderr) = run(run_cmd(&dir, &[]).arg("--").arg(python()).arg(&job).arg("20000"));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.contains("\n  fast                  19999 step(s) (2–20000), "), "{stdout}");
    let (report, _) = report_file(&dir);
    let steps = report.steps.expect("steps in the report");
    assert_eq!(steps.steps, 19_999);
}

/// `run … | head -1`: the reader of stdout is gone when the report is printed. The report file
/// is written all the same, the printing stops without a panic, and the command's code is the
/// exit code; `compare` into a closed pipe exits 0.
#[test]
fn a_closed_stdout_costs_neither_the_report_file_nor_the_command_s_code() {
    let dir = temp_dir("epipe");
    let mut child = run_cmd(&dir, &[])
        .args(["--", "sh", "-c", "sleep 1; exit 3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away before the report is printed
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "the command's code; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let (report, json) = report_file(&dir);
    assert_eq!(report.gpus.len(), 4);
    assert_eq!(json["command"]["exit_code"], 3);

    let report = dir.join("report.json");
    let mut compare =
        agent().arg("compare").arg(&report).arg(&report).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(compare.stdout.take());
    let out = compare.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A report file that cannot be written is said before the command starts (exit 2, naming the
/// flag), not found out after the job.
#[test]
fn an_unwritable_report_file_is_refused_before_the_command_runs() {
    let dir = temp_dir("unwritable");
    let ran = dir.join("ran");
    let target = dir.join("no-such-dir").join("r.json");
    let (code, stdout, stderr) = run(agent()
        .args(["run", "--backend", "mock", "--report-file"])
        .arg(&target)
        .args(["--", "sh", "-c", "touch \"$0\"; sleep 1"])
        .arg(&ran));
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("gpumon: configuration error: --report-file {}: ", target.display())),
        "{stderr}"
    );
    assert!(!ran.exists(), "the command must not have run");
    // A run that cannot start leaves no empty report behind.
    let fresh = dir.join("fresh.json");
    let (code, _, _) = run(agent()
        .args(["run", "--backend", "mock", "--report-file"])
        .arg(&fresh)
        .args(["--", "gpumon-no-such-command"]));
    assert_eq!(code, 127);
    assert!(!fresh.exists());
}

/// The JSON report says how the command ended and which GPUs it is about; `compare` notes a run
/// whose command failed against one whose command did not.
#[test]
fn the_json_report_names_the_command_s_end_and_the_gpus_watched_and_compare_notes_a_failure() {
    let dir = temp_dir("outcome");
    let (code, stdout, stderr) = run(run_cmd(&dir, &["--report-format", "json", "--devices", "1,2"]).args([
        "--",
        "sh",
        "-c",
        "sleep 1; kill -9 $$",
    ]));
    assert_eq!(code, 137, "{stderr}");
    let printed: Value = serde_json::from_str(stdout.trim()).unwrap();
    let (_, file) = report_file(&dir);
    for v in [&printed, &file] {
        assert_eq!(
            v["command"],
            serde_json::json!({"exit_code": null, "signal": 9, "signal_name": "SIGKILL", "status": 137})
        );
        assert_eq!(v["watched"]["scope"], "every_gpu");
        assert_eq!(v["watched"]["gpus"], serde_json::json!([1, 2]));
        assert!(v["watched"]["reason"].as_str().unwrap().contains("the mock backend's processes are simulated"), "{v}");
        assert_eq!(v["format"], 1);
    }
    std::fs::rename(dir.join("report.json"), dir.join("killed.json")).unwrap();
    let (code, _, stderr) = run(run_cmd(&dir, &["--devices", "1,2"]).args(["--", "sleep", "1"]));
    assert_eq!(code, 0, "{stderr}");
    let (_, ok) = report_file(&dir);
    assert_eq!(ok["command"]["exit_code"], 0);
    let (code, stdout, stderr) = run(agent().arg("compare").arg(dir.join("report.json")).arg(dir.join("killed.json")));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(
            "\n  note                  the command was killed by signal 9 (SIGKILL) in the run after, not in the other"
        ),
        "{stdout}"
    );
    assert!(stdout.contains(", the command exited with code 0\n"), "{stdout}");
}

/// A process the command left behind holds the steps socket: the agent waits for it (at most
/// its shutdown timeout) and counts the marks it reads meanwhile, but the run's figures end
/// when the command exited.
#[test]
fn the_run_ends_when_the_command_exits_even_while_a_leftover_holds_the_socket() {
    let dir = temp_dir("leftover");
    let job = write(&dir, "job.py", JOB);
    let script = format!("{} {} 25 0.3 0 & sleep 1.5; exit 4", python(), job.display());
    let started = Instant::now();
    let (code, _, stderr) = run(run_cmd(&dir, &[]).args(["--", "sh", "-c", &script]));
    let took = started.elapsed();
    assert_eq!(code, 4, "{stderr}");
    let (report, _) = report_file(&dir);
    // The agent waited for the leftover (about 5 s): the report ends well before that.
    assert!(took > Duration::from_secs(5), "{took:?}: the leftover was not waited for");
    assert!(report.wall_seconds < 4.0, "wall {} s: the wait for the leftover is in the run", report.wall_seconds);
    assert!(report.overview.gpu_seconds < 4.0 * 4.0, "{:?}", report.overview);
    // About 5 marks before the command exited; those read during the wait count as steps.
    let last = report.steps.expect("steps").runs[0].last_step.unwrap();
    assert!(last >= 10, "last step {last}: the marks read after the command exited are missing");
}

/// A replay of a mock run's trace is simulated too: `compare` sets them side by side without a
/// note on the data, and names the recording's backend.
#[test]
fn compare_knows_the_replay_of_a_mock_trace_is_simulated() {
    let dir = temp_dir("replay");
    let trace = dir.join("run.gpumon-trace.gz");
    let (code, _, stderr) = run(run_cmd(&dir, &["--record"]).arg(&trace).args(["--", "sleep", "2"]));
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) =
        run(agent().args(["--replay-speed", "max", "--report", "--report-format", "json", "--replay"]).arg(&trace));
    assert_eq!(code, 0, "{stderr}");
    let replayed: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!((replayed["backend"].as_str(), replayed["recorded_backend"].as_str()), (Some("replay"), Some("mock")));
    write(&dir, "replay.json", stdout.trim());
    let (code, stdout, stderr) = run(agent().arg("compare").arg(dir.join("report.json")).arg(dir.join("replay.json")));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("simulated (mock backend)") && !stdout.contains("not a measurement"), "{stdout}");
    assert!(
        stdout.contains("\n  after                 host ")
            && stdout.contains("(REPLAY of a trace recorded on the MOCK backend: simulated GPUs)"),
        "{stdout}"
    );
}

/// The reviewer's case: a starved job on 4 GPUs against the same job on 1 GPU, stopped before
/// its diagnosis window: `compare` says both, claims no finding gone, and does not lead with
/// the energy per step of other GPUs.
#[test]
fn compare_says_when_two_runs_cannot_be_compared_as_they_stand() {
    let dir = temp_dir("incomparable");
    let job = write(&dir, "job.py", JOB);
    let one = |devices: &str, window: &[&str], steps: &str, name: &str| {
        let (code, _, stderr) = run(agent()
            .args(["run", "--backend", "mock", "--mock-scenario", "dataloader-starved", "--interval", "1s"])
            .args(["--devices", devices])
            .args(window)
            .arg("--report-file")
            .arg(dir.join(name))
            .arg("--")
            .arg(python())
            .arg(&job)
            .args([steps, "1.2", "0"]));
        assert_eq!(code, 0, "{stderr}");
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        serde_json::from_str::<Report>(&text).unwrap()
    };
    let before = one("0,1,2,3", &["--diagnose-window", "4s"], "8", "before.json");
    assert!(before.overview.causes.iter().any(|c| c.kind.name() == "dataloader_starvation"), "{before:#?}");
    let after = one("0", &[], "3", "after.json");
    assert!(after.wall_seconds < 30.0);
    let (code, stdout, stderr) = run(agent().arg("compare").arg(dir.join("before.json")).arg(dir.join("after.json")));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\n  note                  the reports are about 4 GPU(s) before and 1 after"), "{stdout}");
    assert!(
        stdout.contains("\n  note                  the run after lasted ")
            && stdout.contains(" s, shorter than its diagnosis window (30 s)"),
        "{stdout}"
    );
    assert!(stdout.contains("\n  findings gone         none\n"), "{stdout}");
    let not_compared = stdout.lines().find(|l| l.starts_with("  findings not compared ")).unwrap_or_default();
    assert!(not_compared.contains("dataloader_starvation"), "{stdout}");
    assert!(!stdout.contains("main change           energy per step"), "{stdout}");
}

/// A loop whose numbering restarts each epoch (steps 1–5 twice, on one connection: one client
/// going back on its own run, unlike a second fit in a new process, which is a run segment) and
/// a line that is not JSON: the report counts the marks the socket dropped, per reason, and says
/// what a refused one is.
#[test]
fn the_report_counts_the_marks_the_socket_dropped() {
    const EPOCHS: &str = r#"
import json, os, socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["GPUMON_STEPS_SOCKET"])
for epoch in range(2):
    for i in range(1, 6):
        time.sleep(0.3)
        s.sendall((json.dumps({"job": "epochs", "rank": 0, "step": i}) + "\n").encode())
s.sendall(b"not json\n")
"#;
    let dir = temp_dir("dropped");
    let job = write(&dir, "epochs.py", EPOCHS);
    let (code, stdout, stderr) = run(run_cmd(&dir, &[]).arg("--").arg(python()).arg(&job));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.contains("\n  epochs rank 0         4 step(s) (2–5), "), "{stdout}");
    assert!(
        stdout.contains("\n  marks dropped         1 malformed, 5 refused (not in the step figures)\n"),
        "{stdout}"
    );
    assert!(stdout.contains("numbering restarted"), "{stdout}");
    let (report, json) = report_file(&dir);
    let dropped = report.steps.expect("steps").marks_rejected.expect("the socket's counts");
    assert_eq!((dropped.refused, dropped.malformed, dropped.total()), (5, 1, 6));
    assert_eq!(json["steps"]["marks_rejected"]["refused"], 5);
}

/// Two fits of one job and rank, each in a process of its own numbering from 1 (a script that
/// runs `train.py` twice): the second marks in the run segment `train#2`. No mark is refused,
/// the 2 s between the fits is no step, and the report shows both fits.
#[test]
fn a_second_fit_in_a_new_process_is_a_run_segment_of_its_own() {
    const TWO_FITS: &str = r#"
import os, subprocess, sys, time
env = dict(os.environ, LOCAL_RANK="0")
for fit in range(2):
    if fit:
        time.sleep(2)
    code = subprocess.call([sys.executable, sys.argv[1], "5", "0.6", "0"], env=env)
    if code:
        sys.exit(code)
"#;
    let dir = temp_dir("two-fits");
    let job = write(&dir, "job.py", JOB);
    let fits = write(&dir, "fits.py", TWO_FITS);
    let (code, stdout, stderr) = run(run_cmd(&dir, &[]).arg("--").arg(python()).arg(&fits).arg(&job));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(!stdout.contains("marks dropped"), "{stdout}");
    assert!(stdout.contains("\n  train rank 0          4 step(s) (2–5), "), "{stdout}");
    assert!(stdout.contains("\n  train#2 rank 0        4 step(s) (2–5), "), "{stdout}");
    let (report, _) = report_file(&dir);
    let steps = report.steps.expect("steps");
    let mut runs: Vec<_> =
        steps.runs.iter().map(|r| (r.job.as_str(), r.rank, r.steps, r.first_step, r.last_step)).collect();
    runs.sort();
    assert_eq!(runs, [("train", Some(0), 4, Some(2), Some(5)), ("train#2", Some(0), 4, Some(2), Some(5))]);
    assert_eq!(steps.marks_rejected.map(|r| r.total()), Some(0));
    // Each step took about 0.6 s: the gap between the fits is in none.
    for run in &steps.runs {
        let p95 = run.duration_p95_seconds.unwrap();
        assert!(p95 < 1.2, "{}: {p95} s", run.job);
    }
}

/// A job shorter than the diagnosis window: the report says so where the main cause would be;
/// its limitations are one line each, whole under `--verbose` and in the JSON.
#[test]
fn a_job_shorter_than_the_window_says_so_and_lists_its_limitations_one_line_each() {
    let dir = temp_dir("short");
    let (code, stdout, stderr) = run(run_cmd(&dir, &[]).args(["--", "sleep", "2"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let main = stdout.lines().find(|l| l.starts_with("  main cause ")).expect("a main-cause line");
    assert!(main.starts_with("  main cause            not diagnosed: the run ("), "{stdout}");
    assert!(main.contains("shorter than the diagnosis window (30.0 s)"), "{stdout}");
    let (report, json) = report_file(&dir);
    assert!(report.shorter_than_window(), "{json}");
    assert_eq!(json["overview"]["diagnosis_window_seconds"], 30.0);
    let limits = &report.overview.limitations;
    let long = limits.iter().find(|l| l.reason.len() > 120).expect("a limitation with a long reason");
    assert!(!stdout.contains(&long.reason), "{stdout}");
    assert!(stdout.contains("    (each in full: --verbose, or the JSON report)\n"), "{stdout}");

    let (code, verbose, stderr) = run(run_cmd(&dir, &["--verbose"]).args(["--", "sleep", "2"]));
    assert_eq!(code, 0, "stderr: {stderr}");
    let (report, _) = report_file(&dir);
    for l in &report.overview.limitations {
        assert!(verbose.contains(&format!("    [{}] {l}\n", l.severity)), "{verbose}");
    }
}

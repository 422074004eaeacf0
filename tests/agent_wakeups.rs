//! One thread wake-up per tick: the installable agent on the fake libnvidia-ml, with stdout to a
//! file and the Prometheus endpoint (sinks that export inline, on the sampling thread), wakes
//! once per tick in the steady state — its sampling thread, and nothing else.
//!
//! Counted as the kernel counts them: the voluntary and non-voluntary context switches of every
//! thread (`/proc/<pid>/task/*/status`), read at two points of one run, once start-up is over,
//! and divided by the ticks between them (from the stdout file, one `GPU0` line per tick). The
//! difference of the two points is what two runs of different lengths would give, without the
//! start-up either includes. Threads that exit between the points would take their count with
//! them: the agent starts none in the steady state (the count of threads is checked too).
#![cfg(all(target_os = "linux", feature = "agent", feature = "nvml", feature = "prometheus"))]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the agent when the test ends, however it ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Context switches (voluntary + non-voluntary) summed over every thread of `pid`, and the
/// number of threads.
fn context_switches(pid: u32) -> (u64, usize) {
    let mut total = 0;
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(status) = std::fs::read_to_string(task.unwrap().path().join("status")) else { continue };
        threads += 1;
        for line in status.lines() {
            if let Some(n) =
                line.strip_prefix("voluntary_ctxt_switches:").or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
    }
    (total, threads)
}

/// Ticks written so far: one `GPU0` line per tick in the human format.
fn ticks(stdout: &Path) -> usize {
    std::fs::read_to_string(stdout).unwrap_or_default().lines().filter(|l| l.contains("] GPU0 |")).count()
}

/// A reading between two ticks: the count of ticks did not move while the switches were read.
fn reading(pid: u32, stdout: &Path) -> (usize, u64, usize) {
    loop {
        let before = ticks(stdout);
        let (switches, threads) = context_switches(pid);
        if ticks(stdout) == before {
            return (before, switches, threads);
        }
    }
}

fn wait_for_ticks(stdout: &Path, n: usize, agent: &mut Agent) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while ticks(stdout) < n {
        assert!(agent.0.try_wait().unwrap().is_none(), "the agent exited early");
        assert!(Instant::now() < deadline, "{} ticks after 60 s, expected {n}", ticks(stdout));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_agent_wakes_once_per_tick_with_stdout_to_a_file_and_prometheus() {
    let stdout = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("agent_wakeups.{}.stdout", std::process::id()));
    let child = Command::new(env!("CARGO_BIN_EXE_gpumon-agent"))
        .args(["--backend", "nvml", "--nvml-library"])
        .arg(common::fake_nvml())
        .args(["--interval", "100ms", "--prometheus-listen", "127.0.0.1:0", "--log", "warn"])
        .env("GPUMON_FAKE_NVML_PROFILE", "h100x8")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut agent = Agent(child);
    let pid = agent.0.id();
    // Start-up (loading the library, the first samples, the listener, the XID watcher) is over
    // well before the 20th tick.
    wait_for_ticks(&stdout, 20, &mut agent);
    let (ticks_a, switches_a, threads_a) = reading(pid, &stdout);
    wait_for_ticks(&stdout, ticks_a + 150, &mut agent);
    let (ticks_b, switches_b, threads_b) = reading(pid, &stdout);
    assert!(agent.0.try_wait().unwrap().is_none(), "the agent exited early");
    assert_eq!(threads_a, threads_b, "a thread started or ended in the steady state");

    let ticks = (ticks_b - ticks_a) as f64;
    let per_tick = (switches_b - switches_a) as f64 / ticks;
    eprintln!(
        "{} context switches over {ticks} ticks, {threads_b} threads: {per_tick:.3} per tick",
        switches_b - switches_a
    );
    // One: the sampling thread's sleep until the tick. A second wake-up per tick (the runtime
    // woken to export) reads 2.0; the XID watcher's 5 s wait slices add 0.02, and a loaded
    // machine's preemptions a few hundredths more.
    let _ = std::fs::remove_file(&stdout);
    assert!(per_tick >= 0.9, "{per_tick:.3} switches per tick: is the agent ticking?");
    assert!(per_tick < 1.3, "{per_tick:.3} context switches per tick; one wake-up per tick expected");
}

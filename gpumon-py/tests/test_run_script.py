"""The wheel's console scripts ``gpumon-run`` and ``gpumon-agent`` (gpumon/_run.py): the agent's
command line from the extension module, with nothing but the wheel installed — no gpumon-agent
binary on PATH, GPUMON_AGENT unset."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import free_port, wait_for

BIN = os.path.dirname(sys.executable)
RUN_SCRIPT = os.path.join(BIN, "gpumon-run")
AGENT_SCRIPT = os.path.join(BIN, "gpumon-agent")


@pytest.fixture
def wheel_only_env():
    """The environment of a user who only pip-installed the wheel: the virtualenv's bin first, no
    Rust toolchain, and no directory with another gpumon-agent (a cargo-installed binary)."""
    def wheel_only(d):
        return d == BIN or not any(os.access(os.path.join(d, exe), os.X_OK) for exe in ("cargo", "gpumon-agent"))

    path = [BIN] + [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != BIN and wheel_only(d)]
    env = dict(os.environ, PATH=os.pathsep.join(path))
    env.pop("GPUMON_AGENT", None)  # what the old gpumon-run looked for
    env.pop("GPUMON_STEPS_SOCKET", None)
    return env


def test_the_wheel_installs_both_console_scripts():
    for script in (RUN_SCRIPT, AGENT_SCRIPT):
        assert os.access(script, os.X_OK), f"{script} not installed by the wheel"


MARKING_JOB = textwrap.dedent(
    """
    import sys, time
    from gpumon import StepClient
    client = StepClient()   # GPUMON_STEPS_SOCKET, set by gpumon-run
    for step in range(1, 7):  # the first mark starts the run: 5 steps
        client.step(step)
        time.sleep(0.6)     # longer than a tick: each mark is a step of its own
    sys.exit(3)
    """
)


def test_gpumon_run_reports_the_steps_marked_through_the_socket_and_keeps_the_exit_code(wheel_only_env, tmp_path):
    report_file = tmp_path / "report.json"
    proc = subprocess.run(
        [RUN_SCRIPT, "--backend", "mock", "--mock-profile", "a100x4", "--interval", "500ms",
         "--report-file", str(report_file), "--", sys.executable, "-c", MARKING_JOB],
        capture_output=True, text=True, env=wheel_only_env, timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("gpumon run: the command exited with code 3; watched every GPU sampled"), proc.stdout
    assert "\ngpumon run report: host " in proc.stdout
    assert " (MOCK backend: simulated GPUs), " in proc.stdout, "simulated data says so"
    assert "\nsteps                   5 step(s), step time median 0.6" in proc.stdout, proc.stdout
    # The agent's own logs, on stderr after --log (info), as the binary writes them.
    assert "command started" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(report_file.read_text())
    run = report["steps"]["runs"][0]
    assert (run["first_step"], run["last_step"]) == (2, 6), run
    assert len(report["gpus"]) == 4


SCRAPING_JOB = textwrap.dedent(
    """
    import json, sys, time, urllib.request
    metrics_url, snapshot_url = sys.argv[1], sys.argv[2]
    deadline = time.monotonic() + 30
    while True:
        try:
            metrics = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
            snapshot = json.load(urllib.request.urlopen(snapshot_url, timeout=5))
            break
        except OSError:  # not listening yet, or 503 before the first sample
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    up = [l for l in metrics.splitlines() if l.startswith("gpumon_up{")]
    print(json.dumps({"up": up, "gpus": len(snapshot["devices"]), "backend": snapshot["system"]["backend"]}))
    """
)


def test_gpumon_run_exports_through_the_agent_s_sinks(wheel_only_env):
    prometheus, web = free_port(), free_port()
    proc = subprocess.run(
        [RUN_SCRIPT, "--backend", "mock", "--mock-profile", "a100x4", "--interval", "200ms",
         "--prometheus-listen", f"127.0.0.1:{prometheus}", "--web-listen", f"127.0.0.1:{web}",
         "--report-format", "json",
         "--", sys.executable, "-c", SCRAPING_JOB,
         f"http://127.0.0.1:{prometheus}/metrics", f"http://127.0.0.1:{web}/api/snapshot"],
        capture_output=True, text=True, env=wheel_only_env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen, report = (json.loads(line) for line in proc.stdout.splitlines())  # the job's line, then the report
    assert (seen["gpus"], seen["backend"]) == (4, "mock"), seen
    assert len(seen["up"]) == 4 and all('backend="mock"' in l and l.endswith(" 1") for l in seen["up"]), seen["up"]
    assert len(report["gpus"]) == 4


def test_gpumon_run_without_a_command_says_so_in_one_line(wheel_only_env):
    proc = subprocess.run([RUN_SCRIPT], capture_output=True, text=True, env=wheel_only_env, timeout=60)
    assert (proc.returncode, proc.stdout) == (127, "")
    assert proc.stderr.strip() == "gpumon: run: no command given (gpumon-agent run [FLAGS] -- CMD ARGS…)"


SIGINT_JOB = textwrap.dedent(
    """
    import os, signal, sys, time
    ready, out = sys.argv[1], sys.argv[2]
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # a second SIGINT forwarded would land here
    with open(out, "w") as f:
        f.write(str(len(got)))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)  # dies of SIGINT, as a job without a handler would
    """
)


def test_sigint_reaches_the_command_once_and_gpumon_run_exits_with_its_status(wheel_only_env, tmp_path):
    ready, out = tmp_path / "ready", tmp_path / "count"
    proc = subprocess.Popen(
        [RUN_SCRIPT, "--backend", "mock", "--interval", "200ms", "--", sys.executable, "-c", SIGINT_JOB, str(ready), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=wheel_only_env,
    )
    try:
        wait_for("the command to start", ready.exists, timeout=60)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)  # to gpumon-run only, as a scheduler would
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.read_text() == "1", "the command got SIGINT exactly once"
    assert proc.returncode == 130, f"128 + SIGINT, as a shell says; stderr: {stderr}"
    assert stdout.startswith("gpumon run: the command was killed by signal 2 (SIGINT)"), stdout
    assert "\ngpumon run report: host " in stdout
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr


def test_gpumon_agent_from_the_wheel_runs_the_agent(wheel_only_env):
    proc = subprocess.run(
        [AGENT_SCRIPT, "--once", "--backend", "mock", "--mock-profile", "a100x4", "--stdout-format", "json"],
        capture_output=True, text=True, env=wheel_only_env, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    snapshot = json.loads(proc.stdout.splitlines()[0])
    assert len(snapshot["devices"]) == 4
    assert snapshot["system"]["backend"] == "mock", "simulated data is marked as such"


def test_gpumon_agent_from_the_wheel_stops_on_sigint_with_code_0_and_no_traceback(wheel_only_env):
    proc = subprocess.Popen(
        [AGENT_SCRIPT, "--backend", "mock", "--interval", "200ms", "--stdout-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=wheel_only_env,
    )
    try:
        # Two ticks: the agent waits for signals from just after its first one.
        for _ in range(2):
            assert json.loads(proc.stdout.readline())["system"]["backend"] == "mock"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "shutting down" in stderr and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr


def test_gpumon_agent_help_and_bad_flags_are_clap_s_without_a_traceback(wheel_only_env):
    helped = subprocess.run([AGENT_SCRIPT, "--help"], capture_output=True, text=True, env=wheel_only_env, timeout=60)
    assert helped.returncode == 0
    assert "Usage: gpumon-agent [OPTIONS]" in helped.stdout
    assert "gpumon-agent run [FLAGS] -- CMD ARGS..." in helped.stdout
    bad = subprocess.run([AGENT_SCRIPT, "--no-such-flag"], capture_output=True, text=True, env=wheel_only_env, timeout=60)
    assert bad.returncode == 2
    assert "unexpected argument '--no-such-flag'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bad = subprocess.run([RUN_SCRIPT, "--interval", "soon", "--", "true"], capture_output=True, text=True, env=wheel_only_env, timeout=60)
    assert bad.returncode == 2
    assert "invalid value 'soon' for '--interval <DURATION>'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_what_the_wheel_s_agent_lacks_is_named(wheel_only_env):
    grpc = subprocess.run(
        [AGENT_SCRIPT, "--once", "--backend", "mock", "--otlp-endpoint", "http://127.0.0.1:4317", "--otlp-protocol", "grpc"],
        capture_output=True, text=True, env=wheel_only_env, timeout=60,
    )
    assert grpc.returncode == 2, grpc.stderr
    assert "needs the `otlp-grpc` cargo feature" in grpc.stderr, grpc.stderr
    kubelet = subprocess.run(
        [AGENT_SCRIPT, "--once", "--backend", "mock", "--attribution", "--kubelet"],
        capture_output=True, text=True, env=wheel_only_env, timeout=60,
    )
    assert kubelet.returncode == 2, kubelet.stderr
    assert "no kubelet client" in kubelet.stderr, kubelet.stderr


TWO_FITS_JOB = textwrap.dedent(
    """
    import sys, time
    from gpumon import StepClient
    # Two training runs in one process, each with a new client numbering from 1 (what the
    # callbacks do at a second trainer.train() / fit()), 2 s apart.
    for fit in range(2):
        client = StepClient(job="train", rank=0)
        for step in range(1, 6):
            client.step(step)
            time.sleep(0.6)
        print("segment", client.segment, "dropped", client.dropped, flush=True)
        client.close()
        if fit == 0:
            time.sleep(2.0)
    """
)


def test_gpumon_run_reports_both_fits_of_a_job_as_segments(wheel_only_env, tmp_path):
    report_file = tmp_path / "report.json"
    proc = subprocess.run(
        [RUN_SCRIPT, "--backend", "mock", "--mock-profile", "a100x4", "--interval", "500ms",
         "--report-file", str(report_file), "--", sys.executable, "-c", TWO_FITS_JOB],
        capture_output=True, text=True, env=wheel_only_env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "segment 1 dropped 0\n" in proc.stdout and "segment 2 dropped 0\n" in proc.stdout, proc.stdout
    # No mark refused by the agent.
    assert "refused" not in proc.stdout.split("gpumon run report", 1)[1], proc.stdout
    report = json.loads(report_file.read_text())
    runs = {run["job"]: run for run in report["steps"]["runs"]}
    assert set(runs) == {"train", "train#2"}, runs
    for run in runs.values():
        # Each segment's first mark starts it: steps 2..5, none spanning the 2 s gap.
        assert (run["first_step"], run["last_step"]) == (2, 5), run
    print(proc.stdout)  # the report, for the record (pytest -s)

"""``gpumon-run``: ``gpumon-agent run`` from the Python package (gpumon/_run.py)."""

import os
import subprocess
import sys

import pytest

AGENT = os.environ.get("GPUMON_TEST_AGENT", "")


def run_script(args, env):
    return subprocess.run([sys.executable, "-m", "gpumon._run", *args], capture_output=True, text=True, env=env, timeout=60)


def test_gpumon_run_execs_the_agent_and_keeps_the_exit_code():
    if not AGENT or not os.access(AGENT, os.X_OK):
        pytest.skip("GPUMON_TEST_AGENT (the example agent, target/debug/examples/agent) is not set; run-tests.sh sets it")
    env = dict(os.environ, GPUMON_AGENT=AGENT)
    proc = run_script(["--backend", "mock", "--interval", "200ms", "--", sys.executable, "-c", "import sys; sys.exit(5)"], env)
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout.startswith("gpumon run: the command exited with code 5"), proc.stdout
    assert "gpumon run report: host " in proc.stdout


def test_gpumon_run_without_an_agent_says_what_it_needs(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))
    env.pop("GPUMON_AGENT", None)
    proc = run_script(["--", "true"], env)
    assert proc.returncode == 127
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("gpumon-run: needs the gpumon-agent binary, which the gpumon-nvml wheel does not ship (no gpumon-agent on PATH)")
    env["GPUMON_AGENT"] = str(tmp_path / "missing")
    proc = run_script(["--", "true"], env)
    assert proc.returncode == 127
    assert f"GPUMON_AGENT={tmp_path / 'missing'} is not an executable file" in proc.stderr

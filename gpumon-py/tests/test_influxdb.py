"""InfluxDB receives one gpu_step point per reported step and GPU (needs scripts/test.sh's
InfluxDB 1.x: GPUMON_TEST_INFLUXDB_URL, GPUMON_TEST_INFLUXDB_DB)."""

import json
import os
import time
import urllib.parse
import urllib.request
import uuid

import pytest

import gpumon
from conftest import mark_steps, run_python, training_steps, wait_for

URL = os.environ.get("GPUMON_TEST_INFLUXDB_URL")
DB = os.environ.get("GPUMON_TEST_INFLUXDB_DB", "gpumon")


def _gpu_steps(job):
    """{gpu: [step, ...]} of the gpu_step points InfluxDB holds for `job`."""
    q = f"SELECT step, gpu, backend FROM gpu_step WHERE job = '{job}'"
    url = f"{URL}/query?" + urllib.parse.urlencode({"db": DB, "q": q, "epoch": "ns"})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    by_gpu = {}
    for s in body["results"][0].get("series", []):
        cols = s["columns"]
        for v in s["values"]:
            row = dict(zip(cols, v))
            assert row["backend"] == "mock"
            by_gpu.setdefault(row["gpu"], []).append(int(row["step"]))
    return by_gpu


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_one_gpu_step_point_per_reported_step(no_rank_env):
    job = "py-" + uuid.uuid4().hex[:12]
    with gpumon.Monitor(backend="mock", interval="100ms", influx_url=URL, influx_db=DB, job=job, rank=0,
                        devices=[0, 1]) as m:
        def reported(n):
            runs = (m.snapshot().get("steps") or {}).get("runs", [])
            return runs and runs[0].get("last") and runs[0]["last"]["step"] == n

        # Step 1 alone first: the tracker reads one (step, time) pair per run at each tick, and
        # before it has seen any mark of a run it cannot tell how many steps a later mark
        # closes — marks 1 and 2 in the first sampling period would report step 2 only
        # (gpumon_core::steps, StepTracker: `k = 1` while `seen` is None).
        time.sleep(0.05)
        m.step(1)
        wait_for("step 1 reported", lambda: reported(1), every=0.02)
        # Then two steps per sampling period: both reported, one point each.
        for n in range(2, 11):
            time.sleep(0.05)
            m.step(n)
        wait_for("step 10 reported", lambda: reported(10), every=0.02)
        # then close(), which flushes the sink
    by_gpu = _gpu_steps(job)
    assert sorted(by_gpu) == ["0", "1"]
    for gpu, steps in by_gpu.items():
        assert sorted(steps) == list(range(1, 11)), gpu


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_close_reports_every_marked_step(no_rank_env):
    # The case: 30 steps of 50 ms at a 1 s interval, then close() at once. Before, the
    # ~13 steps marked after the last tick never reached InfluxDB (steps 1-17 of 30).
    job = "py-close-" + uuid.uuid4().hex[:12]
    m = gpumon.Monitor(backend="mock", interval="1s", influx_url=URL, influx_db=DB, job=job, rank=0,
                       devices=[0, 1], prometheus_listen="127.0.0.1:0")
    mark_steps(m, 30, every=0.05)
    started = time.monotonic()
    m.close()
    took = time.monotonic() - started
    assert took < 5.5, f"close() took {took:.2f} s, over its documented 5 s bound"
    by_gpu = _gpu_steps(job)
    assert {g: sorted(s) for g, s in by_gpu.items()} == {"0": list(range(1, 31)), "1": list(range(1, 31))}


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_flush_then_scrape_shows_the_last_step(no_rank_env):
    job = "py-flush-" + uuid.uuid4().hex[:12]
    with gpumon.Monitor(backend="mock", interval="1s", influx_url=URL, influx_db=DB, job=job, rank=0,
                        devices=[0], prometheus_listen="127.0.0.1:0") as m:
        mark_steps(m, 30, every=0.05)
        m.flush()
        assert training_steps(m.prometheus_address) == [30.0]
        # flush() also flushed the InfluxDB writer: the points are there before close().
        assert sorted(_gpu_steps(job).get("0", [])) == list(range(1, 31))


def _run_marking_script(job, last, every, then=""):
    """Runs, in a fresh interpreter, a Monitor on GPU 0 writing to InfluxDB as `job` (1 s
    interval) that marks steps 1..`last`, one every `every` seconds, then runs the code `then`;
    the script never calls close(). Returns the finished process."""
    code = f"""
import os, signal, time, gpumon
m = gpumon.Monitor(backend="mock", interval="1s", influx_url={URL!r}, influx_db={DB!r}, job={job!r},
                   rank=0, devices=[0])
for n in range(1, {last + 1}):
    time.sleep({every})
    m.step(n)
{then}
"""
    return run_python(code, env={"LOCAL_RANK": "", "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_interpreter_exit_reports_every_marked_step(no_rank_env):
    job = "py-exit-" + uuid.uuid4().hex[:12]
    p = _run_marking_script(job, 30, every=0.05)  # no close(): the atexit hook closes it
    assert p.returncode == 0, p.stderr
    assert sorted(_gpu_steps(job).get("0", [])) == list(range(1, 31))


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_sigterm_reports_every_marked_step_then_terminates_by_sigterm(no_rank_env):
    """Slurm, Kubernetes and torchrun stop workers with SIGTERM, whose default action skips
    ``atexit``: the open Monitor still reports the steps since its last tick, and the process
    still ends by SIGTERM."""
    import signal

    job = "py-sigterm-" + uuid.uuid4().hex[:12]
    then = """
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
print("still running")
"""
    p = _run_marking_script(job, 25, every=0.1, then=then)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stdout, p.stderr)
    assert "still running" not in p.stdout
    # Steps 20-25 were marked after the last tick: only the close on SIGTERM reports them.
    assert sorted(_gpu_steps(job).get("0", [])) == list(range(1, 26))

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

URL = os.environ.get("GPUMON_TEST_INFLUXDB_URL")
DB = os.environ.get("GPUMON_TEST_INFLUXDB_DB", "gpumon")


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_one_gpu_step_point_per_reported_step(no_rank_env):
    job = "py-" + uuid.uuid4().hex[:12]
    with gpumon.Monitor(backend="mock", interval="100ms", influx_url=URL, influx_db=DB, job=job, rank=0,
                        devices=[0, 1]) as m:
        def reported(n):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                runs = (m.snapshot().get("steps") or {}).get("runs", [])
                if runs and runs[0].get("last") and runs[0]["last"]["step"] == n:
                    return
                time.sleep(0.02)
            pytest.fail(f"step {n} not reported within 15 s")

        # Step 1 alone first: the tracker reads one (step, time) pair per run at each tick, and
        # before it has seen any mark of a run it cannot tell how many steps a later mark
        # closes — marks 1 and 2 in the first sampling period would report step 2 only
        # (gpumon_core::steps, StepTracker: `k = 1` while `seen` is None).
        time.sleep(0.05)
        m.step(1)
        reported(1)
        # Then two steps per sampling period: both reported, one point each.
        for n in range(2, 11):
            time.sleep(0.05)
            m.step(n)
        reported(10)  # then close(), which flushes the sink
    q = f"SELECT step, gpu, backend FROM gpu_step WHERE job = '{job}'"
    url = f"{URL}/query?" + urllib.parse.urlencode({"db": DB, "q": q, "epoch": "ns"})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    series = body["results"][0].get("series", [])
    assert series, body
    cols = series[0]["columns"]
    rows = [dict(zip(cols, v)) for s in series for v in s["values"]]
    by_gpu = {}
    for row in rows:
        assert row["backend"] == "mock"
        by_gpu.setdefault(row["gpu"], []).append(int(row["step"]))
    assert sorted(by_gpu) == ["0", "1"]
    for gpu, steps in by_gpu.items():
        assert sorted(steps) == list(range(1, 11)), gpu


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
def test_close_reports_every_marked_step(no_rank_env):
    # The case: 30 steps of 50 ms at a 1 s interval, then close() at once. Before, the
    # ~13 steps marked after the last tick never reached InfluxDB (steps 1-17 of 30).
    job = "py-close-" + uuid.uuid4().hex[:12]
    m = gpumon.Monitor(backend="mock", interval="1s", influx_url=URL, influx_db=DB, job=job, rank=0,
                       devices=[0, 1], prometheus_listen="127.0.0.1:0")
    for n in range(1, 31):
        time.sleep(0.05)
        m.step(n)
    started = time.monotonic()
    m.close()
    took = time.monotonic() - started
    assert took < 5.5, f"close() took {took:.2f} s, over its documented 5 s bound"
    by_gpu = _gpu_steps(job)
    assert {g: sorted(s) for g, s in by_gpu.items()} == {"0": list(range(1, 31)), "1": list(range(1, 31))}


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_flush_then_scrape_shows_the_last_step(no_rank_env):
    from conftest import scrape, series

    job = "py-flush-" + uuid.uuid4().hex[:12]
    with gpumon.Monitor(backend="mock", interval="1s", influx_url=URL, influx_db=DB, job=job, rank=0,
                        devices=[0], prometheus_listen="127.0.0.1:0") as m:
        for n in range(1, 31):
            time.sleep(0.05)
            m.step(n)
        m.flush()
        text = scrape(m.prometheus_address)
        assert [v for _, v in series(text, "gpumon_training_step")] == [30.0]
        # flush() also flushed the InfluxDB writer: the points are there before close().
        assert sorted(_gpu_steps(job).get("0", [])) == list(range(1, 31))


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_interpreter_exit_reports_every_marked_step(no_rank_env):
    from conftest import run_python

    job = "py-exit-" + uuid.uuid4().hex[:12]
    code = f"""
import time, gpumon
m = gpumon.Monitor(backend="mock", interval="1s", influx_url={URL!r}, influx_db={DB!r}, job={job!r},
                   rank=0, devices=[0])
for n in range(1, 31):
    time.sleep(0.05)
    m.step(n)
# no close(): the atexit hook closes it
"""
    p = run_python(code, env={"LOCAL_RANK": "", "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr
    assert sorted(_gpu_steps(job).get("0", [])) == list(range(1, 31))


@pytest.mark.skipif(not URL, reason="needs scripts/test.sh (InfluxDB: GPUMON_TEST_INFLUXDB_URL unset)")
def test_sigterm_reports_every_marked_step_then_terminates_by_sigterm(no_rank_env):
    """Slurm, Kubernetes and torchrun stop workers with SIGTERM, whose default action skips
    ``atexit``: the open Monitor still reports the steps since its last tick, and the process
    still ends by SIGTERM."""
    import signal

    from conftest import run_python

    job = "py-sigterm-" + uuid.uuid4().hex[:12]
    code = f"""
import os, signal, time, gpumon
m = gpumon.Monitor(backend="mock", interval="1s", influx_url={URL!r}, influx_db={DB!r}, job={job!r},
                   rank=0, devices=[0])
for n in range(1, 26):
    time.sleep(0.1)
    m.step(n)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
print("still running")
"""
    p = run_python(code, env={"LOCAL_RANK": "", "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stdout, p.stderr)
    assert "still running" not in p.stdout
    # Steps 20-25 were marked after the last tick: only the close on SIGTERM reports them.
    assert sorted(_gpu_steps(job).get("0", [])) == list(range(1, 26))

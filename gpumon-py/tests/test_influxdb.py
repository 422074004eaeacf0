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

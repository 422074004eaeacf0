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
        for n in range(1, 11):
            time.sleep(0.05)
            m.step(n)
        # Wait until the tracker has reported step 10, then close (flushes the sink).
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            runs = (m.snapshot().get("steps") or {}).get("runs", [])
            if runs and runs[0]["last"] and runs[0]["last"]["step"] == 10:
                break
            time.sleep(0.05)
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

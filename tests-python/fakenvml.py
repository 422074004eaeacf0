"""Helpers: run a Python snippet or program against the fake libnvidia-ml in a child process.

Each child gets its own copy of the fake (a new process), configured by GPUMON_FAKE_NVML_*;
the tick is frozen (clock=manual) so the expected values printed by gpumon-fake-nvml-expect for
the same environment are exactly what the client reads.
"""
import json
import os
import subprocess
import sys

FAKE_DIR = os.environ.get("GPUMON_FAKE_NVML_DIR", "")
EXPECT = os.environ.get("GPUMON_FAKE_NVML_EXPECT", "")
PYTHON = os.environ.get("GPUMON_TEST_PYTHON", sys.executable)


def env(profile="h100x8", tick=0, faults=None, scenario=None, pids=None):
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = FAKE_DIR + (":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    e["GPUMON_FAKE_NVML_PROFILE"] = profile
    e["GPUMON_FAKE_NVML_CLOCK"] = "manual"
    e["GPUMON_FAKE_NVML_TICK"] = str(tick)
    for k in ("GPUMON_FAKE_NVML_FAULTS", "GPUMON_FAKE_NVML_SCENARIO", "GPUMON_FAKE_NVML_SEED", "GPUMON_FAKE_NVML_PIDS"):
        e.pop(k, None)
    if faults:
        e["GPUMON_FAKE_NVML_FAULTS"] = faults
    if scenario:
        e["GPUMON_FAKE_NVML_SCENARIO"] = scenario
    if pids:
        e["GPUMON_FAKE_NVML_PIDS"] = pids
    return e


def expected(**kw):
    out = subprocess.run([EXPECT], env=env(**kw), check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def run_python(code, **kw):
    """Runs `code` (which prints one JSON document) under the fake; returns the parsed JSON."""
    out = subprocess.run([PYTHON, "-c", code], env=env(**kw), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"child failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)


def run(args, **kw):
    return subprocess.run(args, env=env(**kw), capture_output=True, text=True, timeout=120)


def physical_gpus(want):
    """The expected devices a client lists by index: the physical GPUs (not their MIG instances)."""
    return [d for d in want["devices"] if d["mig"] is None]


def assert_each_gpu(test, profile, got_gpus, want_gpus, fields):
    """One subTest per GPU: for every (key, expect[, why]) of `fields`, the client's `got[key]`
    equals `expect` of the expected device — a key into it, or a function of it."""
    for g, w in zip(got_gpus, want_gpus):
        with test.subTest(profile=profile, gpu=w["index"]):
            for key, expect, *why in fields:
                test.assertEqual(g[key], expect(w) if callable(expect) else w[expect], why[0] if why else key)

"""Shared helpers for the gpumon Python tests (run by gpumon-py/run-tests.sh against the built
wheel in a clean virtualenv)."""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    """A port free on 127.0.0.1 now (bound to 0 and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port P with P and P + 1 free (two ranks listen on port + local rank)."""
    for _ in range(50):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two adjacent free ports")


def wait_for(what: str, cond, timeout: float = 15.0, every: float = 0.05):
    """Polls `cond()` until it returns something truthy; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def scrape(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        return r.read().decode()


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series(text: str, name: str):
    """[(labels dict, value)] of metric `name` in a Prometheus exposition."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) == name:
            out.append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def mark_steps(target, last: int, every: float) -> None:
    """Marks steps 1..`last` on `target` (a Monitor or StepClient), one every `every` seconds."""
    for n in range(1, last + 1):
        time.sleep(every)
        target.step(n)


def training_steps(addr: str):
    """The values of gpumon_training_step on the Prometheus endpoint at `addr` (one per run)."""
    return [v for _, v in series(scrape(addr), "gpumon_training_step")]


def run_python(code: str, env=None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter of this virtualenv; returns the finished process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=HERE
    )


@pytest.fixture
def no_rank_env(monkeypatch):
    """Runs without LOCAL_RANK / CUDA_VISIBLE_DEVICES, whatever the CI machine sets."""
    for var in ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(var, raising=False)

"""Process life: fork with a live Monitor, exit without close(), quiet output, two ranks."""

import json
import os
import subprocess
import sys

from conftest import HERE, free_port_pair, scrape, series, run_python

CLEAN_ENV = {"LOCAL_RANK": "", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES")}
    env.update(extra)
    return env


def _run(code, timeout=60, **env):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=HERE
    )


def test_fork_with_a_live_monitor():
    code = r"""
import os, sys, time, gc, multiprocessing, urllib.request
import gpumon
m = gpumon.Monitor(backend="mock", interval="100ms", prometheus_listen="127.0.0.1:0")
m.step(1)
addr = m.prometheus_address
pid = os.fork()
if pid == 0:
    # The child: the Monitor is the parent's; using it raises, closing or dropping it neither
    # hangs nor touches the parent's agent; then a normal interpreter exit (atexit, GC).
    ok = m.closed
    try:
        m.snapshot(); ok = False
    except gpumon.GpumonError:
        pass
    try:
        m.step(2); ok = False
    except gpumon.GpumonError:
        pass
    m.close()
    del m; gc.collect()
    sys.exit(0 if ok else 3)
deadline = time.monotonic() + 20
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9); print("CHILD HUNG"); sys.exit(1)
    time.sleep(0.05)
assert os.waitstatus_to_exitcode(status) == 0, status
# Data-loader style workers (multiprocessing, fork) with the Monitor alive.
with multiprocessing.get_context("fork").Pool(2) as pool:
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
# The parent's agent is unaffected.
m.step(2)
before = m.snapshot()["seq"]
while m.snapshot()["seq"] <= before:
    time.sleep(0.05)
urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read()
m.close()
print("OK")
"""
    p = _run(code)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "OK"


def test_exit_with_an_unclosed_monitor_neither_hangs_nor_aborts():
    code = r"""
import gpumon
m = gpumon.Monitor(backend="mock", interval="100ms", prometheus_listen="127.0.0.1:0")
m.step(1)
m.snapshot()
keep = [gpumon.Monitor(backend="mock", interval="100ms")]  # a second one, never closed either
"""
    p = _run(code, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""


def test_quiet_nothing_printed_and_logs_go_to_logging():
    code = r"""
import logging, io
stream = io.StringIO()
handler = logging.StreamHandler(stream)
logging.getLogger("gpumon").addHandler(handler)
logging.getLogger("gpumon").setLevel(logging.DEBUG)
import gpumon
with gpumon.Monitor(interval="100ms") as m:  # auto without NVML: the mock, with a warning
    m.step(1); m.snapshot()
with gpumon.Monitor(backend="mock", interval="100ms", prometheus_listen="127.0.0.1:0") as m:
    m.step(1); m.snapshot()
import sys
sys.__stdout__.flush()
open("log.out", "w").write(stream.getvalue())
"""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(), cwd=d
        )
        assert p.returncode == 0, p.stderr
        assert p.stdout == "" and p.stderr == "", (p.stdout, p.stderr)
        log = open(os.path.join(d, "log.out")).read()
    assert "listening" in log  # the Prometheus endpoint's start, through logging
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml") is None:
        assert "MOCK" in log  # the auto fallback's warning, through logging


def test_importing_gpumon_does_not_import_transformers():
    p = _run("import sys, gpumon, gpumon.integrations; print('transformers' in sys.modules, 'torch' in sys.modules)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False False"


def test_two_ranks_in_two_processes():
    port = free_port_pair()
    code = r"""
import json, os, sys, time
import gpumon
with gpumon.Monitor(backend="mock", interval="100ms", prometheus_listen=f"127.0.0.1:{sys.argv[1]}", job="ddp") as m:
    for n in range(1, 6):
        time.sleep(0.03)
        m.step(n)
    while True:
        runs = (m.snapshot().get("steps") or {}).get("runs", [])
        if runs and runs[0]["last"] and runs[0]["last"]["step"] == 5:
            break
        time.sleep(0.05)
    print(json.dumps({"rank": m.rank, "addr": m.prometheus_address,
                      "devices": [d["info"]["index"] for d in m.snapshot()["devices"]]}), flush=True)
    sys.stdin.readline()  # stay up until the test has scraped
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env(LOCAL_RANK=str(rank)), cwd=HERE,
        )
        for rank in (0, 1)
    ]
    try:
        infos = [json.loads(p.stdout.readline() or "null") for p in procs]
        for rank, info in enumerate(infos):
            assert info is not None, procs[rank].stderr.read() if procs[rank].poll() is not None else "no output"
            # Each rank: its own GPU, its own port (port + local rank), its own step series.
            assert info["rank"] == rank
            assert info["devices"] == [rank]
            assert info["addr"] == f"127.0.0.1:{port + rank}"
            text = scrape(info["addr"])
            assert {l["gpu"] for l, _ in series(text, "gpumon_step_utilization_ratio")} == {str(rank)}
            assert [(l["job"], l["rank"], v) for l, v in series(text, "gpumon_training_step")] == [("ddp", str(rank), 5.0)]
    finally:
        for p in procs:
            try:
                p.communicate("\n", timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                raise
    assert [p.returncode for p in procs] == [0, 0]


def test_a_logging_handler_may_call_the_monitor():
    """A handler on the "gpumon" logger that calls back into the Monitor (snapshot, flush) used
    to abort the interpreter: records were delivered on the agent's runtime threads, where
    `flush()` cannot block, and the panic's own record re-entered the handler."""
    code = r"""
import json, logging, socket, time
import gpumon
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
mon = None
seen = {"snapshots": 0, "flushes": 0, "errors": []}
class Reentrant(logging.Handler):
    def emit(self, record):
        if mon is None or mon.closed or seen["snapshots"] >= 3:
            return
        try:
            assert "devices" in mon.snapshot()
            seen["snapshots"] += 1
            mon.flush(0.5)
            seen["flushes"] += 1
        except gpumon.GpumonError as e:  # the sink is down: a flush may report it
            seen["errors"].append(str(e))
log = logging.getLogger("gpumon"); log.addHandler(Reentrant()); log.setLevel(logging.WARNING)
# Nobody listens on the port: every export fails and logs a warning.
mon = gpumon.Monitor(backend="mock", interval="100ms", devices="0",
                     influx_url=f"http://127.0.0.1:{port}", influx_db="train")
for i in range(1, 11):
    time.sleep(0.1)
    mon.step(i)
try:
    mon.flush(1)  # the export fails: warnings from the agent's threads, for the handler
except gpumon.GpumonError:
    pass
mon.close()
print(json.dumps(seen))
"""
    p = _run(code, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    seen = json.loads(p.stdout)
    assert seen["snapshots"] >= 1, seen
    assert seen["flushes"] + len(seen["errors"]) == seen["snapshots"], seen
    assert all(e.startswith("flush: ") and "closed" not in e for e in seen["errors"]), seen


def test_ctrl_c_during_close_raises_keyboard_interrupt_when_close_returns():
    """close() blocks on a sink that never answers; a Ctrl-C meanwhile must surface once close
    has done its work (the close's own warning used to run Python logging on the main thread,
    which consumed the signal's KeyboardInterrupt)."""
    code = r"""
import json, os, signal, socket, threading, time
import gpumon
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(16)
held = []
def accept_and_never_answer():
    while True:
        held.append(server.accept()[0])
threading.Thread(target=accept_and_never_answer, daemon=True).start()
m = gpumon.Monitor(backend="mock", interval="10s", devices="0",
                   influx_url=f"http://127.0.0.1:{server.getsockname()[1]}", influx_db="train")
m.step(1)
# Python's own Ctrl-C handler, whatever this process inherited: a child of a background job
# starts with SIGINT ignored, and Python then installs no handler (the signal would do nothing).
signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    m.close()
    outcome = "returned"
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
print(json.dumps({"outcome": outcome, "closed": m.closed, "seconds": time.monotonic() - t0}))
"""
    p = _run(code, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    result = json.loads(p.stdout)
    assert result["outcome"] == "KeyboardInterrupt", result
    # close() finished its work (the 5 s bound on a sink that never answers) before raising.
    assert result["closed"] and result["seconds"] >= 2, result


def test_sigterm_disposition_while_a_monitor_is_open():
    """The Monitor takes SIGTERM only over the default disposition and gives it back when the
    last such Monitor closes; a program's own handler, SIG_IGN and handle_sigterm=False are left
    alone."""
    code = """
import signal, gpumon
get = lambda: signal.getsignal(signal.SIGTERM)
a = gpumon.Monitor(backend="mock", devices="0")
b = gpumon.Monitor(backend="mock", devices="1")
taken = get()
assert taken is not signal.SIG_DFL and callable(taken), taken
a.close()
assert get() is taken, "b is still open"
b.close()
assert get() is signal.SIG_DFL, get()
with gpumon.Monitor(backend="mock", devices="0", handle_sigterm=False):
    assert get() is signal.SIG_DFL
def mine(signum, frame):
    pass
signal.signal(signal.SIGTERM, mine)
with gpumon.Monitor(backend="mock", devices="0"):
    assert get() is mine
assert get() is mine
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with gpumon.Monitor(backend="mock", devices="0"):
    assert get() is signal.SIG_IGN
print("ok")
"""
    p = _run(code, **CLEAN_ENV)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_sigterm_ends_the_process_by_sigterm_and_closes_the_monitor():
    """Without a server: the close runs (its log says so) and the exit status is SIGTERM's —
    also for a Monitor opted out (no close), and for a program's own handler (which decides)."""
    import signal

    template = """
import logging, os, signal, sys, time, gpumon
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="LOG %(message)s")
m = gpumon.Monitor(backend="mock", interval="100ms", devices="0", {args})
m.step(1)
{before}
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("after", m.closed)
"""
    p = _run(template.format(args="", before=""), **CLEAN_ENV)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr)
    assert "monitor closed" in p.stderr and "after" not in p.stdout
    p = _run(template.format(args="handle_sigterm=False", before=""), **CLEAN_ENV)
    assert p.returncode == -signal.SIGTERM and "monitor closed" not in p.stderr, (p.returncode, p.stderr)
    own = "signal.signal(signal.SIGTERM, lambda *a: print('mine', flush=True))"
    p = _run(template.format(args="", before=own), **CLEAN_ENV)
    assert p.returncode == 0 and p.stdout.split() == ["mine", "after", "False"], (p.returncode, p.stdout, p.stderr)

"""StepClient: marks over the agent's steps socket."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import gpumon
from conftest import free_port, scrape, series, training_steps, wait_for

AGENT = os.environ.get("GPUMON_TEST_AGENT", "")


@pytest.fixture
def agent():
    if not AGENT or not os.access(AGENT, os.X_OK):
        pytest.skip("GPUMON_TEST_AGENT (the example agent, target/debug/examples/agent) is not set; run-tests.sh sets it")
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "steps.sock")
    port = free_port()
    proc = subprocess.Popen(
        [AGENT, "--backend", "mock", "--interval", "100ms", "--prometheus-listen", f"127.0.0.1:{port}",
         "--steps-socket", sock],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for("the steps socket", lambda: os.path.exists(sock) or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read()
        yield sock, f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_step_client_marks_reach_the_agent(agent):
    sock, addr = agent
    with gpumon.StepClient(sock, job="sockjob", rank=3) as client:
        for n in range(1, 11):
            client.step(n)
            time.sleep(0.02)
        assert client.dropped == 0

        def at_ten():
            got = series(scrape(addr), "gpumon_training_step")
            return got if got and got[0][1] == 10 else None

        ((labels, value),) = wait_for("gpumon_training_step 10", at_ten)
        assert (labels["job"], labels["rank"], labels["backend"]) == ("sockjob", "3", "mock")
        # The same connection carries on.
        client.step(11)
        wait_for("step 11", lambda: training_steps(addr) == [11.0])


def test_step_client_without_rank_omits_the_label(agent, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    sock, addr = agent
    client = gpumon.StepClient(sock)
    assert (client.job, client.rank) == ("train", None)
    client.step(7)
    ((labels, value),) = wait_for("a step series", lambda: series(scrape(addr), "gpumon_training_step"))
    assert value == 7 and labels["job"] == "train" and "rank" not in labels
    client.close()


def test_step_client_never_raises_without_an_agent(tmp_path):
    client = gpumon.StepClient(tmp_path / "nobody.sock", job="x", rank=0)
    client.step(1)
    client.step(2)
    assert client.dropped == 2


def test_step_client_bad_input(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="job"):
        gpumon.StepClient(tmp_path / "s", job="")
    with pytest.raises(ValueError, match="rank"):
        gpumon.StepClient(tmp_path / "s", rank=-2)
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        gpumon.StepClient(tmp_path / "s")
    monkeypatch.setenv("LOCAL_RANK", "2")
    client = gpumon.StepClient(tmp_path / "s")
    assert client.rank == 2
    client.step(3)
    with pytest.raises(ValueError, match="negative"):
        client.step(-1)
    with pytest.raises(ValueError, match="not after"):
        client.step(3)
    with pytest.raises(TypeError):
        client.step(4.0)


def test_under_gpumon_agent_run_the_client_and_the_callbacks_find_the_socket(tmp_path):
    """``gpumon-agent run -- python job.py``: StepClient() without a path and a callback's
    StepMarker without a Monitor mark on the socket the agent put in GPUMON_STEPS_SOCKET."""
    if not AGENT or not os.access(AGENT, os.X_OK):
        pytest.skip("GPUMON_TEST_AGENT (the example agent, target/debug/examples/agent) is not set; run-tests.sh sets it")
    job = tmp_path / "job.py"
    job.write_text(
        "import time, gpumon\n"
        "from gpumon.integrations._common import StepMarker\n"
        "client = gpumon.StepClient(job='client', rank=0)\n"
        "marker = StepMarker(None, every_n_steps=1, per_gpu=False, backend='auto')\n"
        "marker.begin('callback', 1, 0)\n"
        "for n in range(1, 6):\n"
        "    time.sleep(0.15)\n"
        "    client.step(n)\n"
        "    marker.mark(n)\n"
        "marker.end()\n"
        "client.close()\n"
    )
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [AGENT, "run", "--backend", "mock", "--interval", "100ms", "--report-file", str(report), "--",
         sys.executable, str(job)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    runs = {(r["job"], r["rank"]): r for r in json.loads(report.read_text())["steps"]["runs"]}
    assert runs[("client", 0)]["last_step"] == 5
    assert runs[("callback", 1)]["last_step"] == 5


def test_step_client_without_a_path_needs_the_environment(monkeypatch):
    monkeypatch.delenv("GPUMON_STEPS_SOCKET", raising=False)
    with pytest.raises(ValueError, match="GPUMON_STEPS_SOCKET"):
        gpumon.StepClient()
    monkeypatch.setenv("GPUMON_STEPS_SOCKET", "/nonexistent/steps.sock")
    assert gpumon.StepClient().path == "/nonexistent/steps.sock"


@pytest.mark.parametrize("job", ["x" * 200, "a\tb", "a\nb", "   "])
def test_step_client_refuses_the_job_names_monitor_refuses(tmp_path, no_rank_env, job):
    # The agent drops every mark of such a job (a WARN on its side only): the client used to
    # send them anyway, losing every step without an error or a `dropped` count.
    with pytest.raises(ValueError) as monitor_error:
        gpumon.Monitor(backend="mock", devices="0", job=job)
    with pytest.raises(ValueError) as client_error:
        gpumon.StepClient(tmp_path / "s", job=job)
    assert str(client_error.value) == str(monitor_error.value)
    assert str(client_error.value).startswith("job: ")


def test_step_client_takes_the_steps_and_ranks_monitor_takes(tmp_path, no_rank_env):
    with pytest.raises(ValueError, match=r"rank: 4294967296 is not a rank \(0 to 4294967295\)"):
        gpumon.StepClient(tmp_path / "s", rank=2**32)
    with pytest.raises(TypeError, match="rank: expected an int, got a bool"):
        gpumon.StepClient(tmp_path / "s", rank=True)
    client = gpumon.StepClient(tmp_path / "s", rank=0)
    with gpumon.Monitor(backend="mock", devices="0", rank=0) as m:
        for bad, error in [(2**64, ValueError), (2**64 - 1, ValueError), (-1, ValueError), (True, TypeError),
                           (1.0, TypeError), ("1", TypeError)]:
            with pytest.raises(error) as monitor_error:
                m.step(bad)
            with pytest.raises(error) as client_error:
                client.step(bad)
            assert str(client_error.value) == str(monitor_error.value), bad
        # An object with __index__ (a NumPy integer) is a step number to both.
        class Index:
            def __index__(self):
                return 7

        m.step(Index())
        client.step(Index())
        # The largest step the tracker stores is taken by both.
        m.step(2**64 - 2)
        client.step(2**64 - 2)
    assert client.dropped == 2  # no agent: the marks sent are dropped, counted


def test_marks_pending_at_exit_are_written_out_or_counted(tmp_path):
    # An agent that does not read until the client has exited: the kernel's buffer fills, the
    # client queues what it can (and drops, counted, the rest), and at interpreter exit writes
    # the queue out. Every mark is either received or counted as dropped.
    path = str(tmp_path / "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    n = 20000
    script = (
        "import gpumon, sys\n"
        f"c = gpumon.StepClient({path!r}, job='burst', rank=0)\n"
        f"for i in range(1, {n} + 1): c.step(i)\n"
        "print(c.dropped, flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        conn, _ = server.accept()
        dropped_before_exit = int(proc.stdout.readline())
        received = b""
        while True:
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            received += chunk
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        server.close()
    lines = received.decode().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # Marks queued in the client when the loop ended reached the agent after it exited.
    assert len(steps) + dropped_before_exit == n, (len(steps), dropped_before_exit)


def _first_line(path, make_client):
    """The first line a client made by ``make_client(path)`` sends, read on a socket of our own."""
    import socket as _socket

    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        client = make_client(path)
        client.step(1)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(4096)
        client.close()
    os.unlink(path)
    return client, json.loads(data)


@pytest.mark.parametrize(
    "env, kwargs, gpu",
    [
        # torch.cuda.set_device(local_rank) drives entry `rank` of CUDA_VISIBLE_DEVICES.
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, dict(rank=1), "5"),
        ({"CUDA_VISIBLE_DEVICES": "4,5", "LOCAL_RANK": "0"}, {}, "4"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb"}, dict(rank=1), "MIG-bbbb"),
        # A launcher that gives each rank its one GPU.
        ({"CUDA_VISIBLE_DEVICES": "6"}, dict(rank=3), "6"),
        # Unset: GPU `rank`, as the Monitor.
        ({}, dict(rank=2), "2"),
        # No rank: what the environment makes visible; nothing narrows it: no key.
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, {}, "4,5"),
        ({}, {}, None),
        # Given: the Monitor's devices= syntax.
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, dict(rank=1, gpu=[0, "GPU-cc"]), "0,GPU-cc"),
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, dict(rank=1, gpu="all"), None),
    ],
)
def test_marks_name_the_physical_gpu_the_monitor_would_watch(tmp_path, no_rank_env, monkeypatch, env, kwargs, gpu):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client, line = _first_line(tmp_path / "s.sock", lambda p: gpumon.StepClient(p, job="j", **kwargs))
    assert client.gpu == line.get("gpu") == gpu
    assert line["step"] == 1
    if "rank" in kwargs and "gpu" not in kwargs:
        # One resolver: the Monitor of that rank watches the GPU the marks name.
        m = gpumon.Monitor(backend="mock", rank=kwargs["rank"]) if gpu and gpu[0].isdigit() else None
        if m is not None:
            with m:
                assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [int(gpu)]


def test_an_environment_without_the_ranks_gpu_names_none_and_says_so(tmp_path, no_rank_env, monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ValueError) as monitor_error:
        gpumon.Monitor(backend="mock", rank=3)
    with caplog.at_level("WARNING", logger="gpumon"):
        client, line = _first_line(tmp_path / "s.sock", lambda p: gpumon.StepClient(p, rank=3))
    # Steps still counted; no GPU's figures: attributing them to GPU 3 would be wrong.
    assert line["gpu"] == client.gpu == "none"
    assert str(monitor_error.value) in caplog.text
    with pytest.raises(ValueError, match="^gpu: "):
        gpumon.StepClient(tmp_path / "s.sock", rank=0, gpu="four")


def test_under_cuda_visible_devices_the_agent_gives_each_rank_its_own_gpu(agent, no_rank_env, monkeypatch):
    """Ranks 0 and 1 under CUDA_VISIBLE_DEVICES=4,5 drive GPUs 4 and 5: the agent's per-GPU step
    figures for them are those GPUs', not GPUs 0 and 1 (nor all eight)."""
    sock, addr = agent
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    clients = [gpumon.StepClient(sock, job="cvd", rank=r) for r in range(2)]
    for n in range(1, 8):
        time.sleep(0.12)
        for c in clients:
            c.step(n)

    def figures():
        got = [(l["rank"], l["gpu"]) for l, _ in series(scrape(addr), "gpumon_step_utilization_ratio")
               if l.get("job") == "cvd"]
        return sorted(got) if {r for r, _ in got} == {"0", "1"} else None

    assert wait_for("both ranks' step figures", figures) == [("0", "4"), ("1", "5")]
    for c in clients:
        c.close()

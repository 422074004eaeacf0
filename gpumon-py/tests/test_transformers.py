"""The Hugging Face callback, driven through transformers' own CallbackHandler (no torch): steps
marked, each log's figures tied to the step they describe, compact keys, mock data marked, a
second train(), the last steps reported at the end."""

import ctypes.util
import logging
import time
import types

import pytest

transformers = pytest.importorskip("transformers")
from transformers.trainer_callback import (  # noqa: E402
    CallbackHandler,
    DefaultFlowCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)

# transformers.trainer.DEFAULT_CALLBACKS (that module needs torch).
DEFAULT_CALLBACKS = [DefaultFlowCallback]

import gpumon  # noqa: E402
from gpumon.integrations.transformers import GpumonCallback, gpu_figures  # noqa: E402
from conftest import training_steps  # noqa: E402

COMPACT = {"step", "step_seconds", "utilization", "utilization_min", "memory_peak_gib", "energy_joules",
           "findings"}


class Reporter(TrainerCallback):
    """Stands for TensorBoardCallback / WandbCallback: writes out what on_log receives."""

    def __init__(self):
        self.logged = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append((state.global_step, dict(logs)))


def _args(logging_steps=1, max_steps=6):
    # What DefaultFlowCallback reads; TrainingArguments itself needs torch.
    return types.SimpleNamespace(
        logging_first_step=False, logging_strategy="steps", logging_steps=logging_steps, eval_strategy="no",
        eval_steps=None, eval_delay=0, save_strategy="no", save_steps=500, max_steps=max_steps,
        run_name="hf-test", include_num_input_tokens_seen=False,
    )


class Loop:
    """The parts of Trainer's loop the callbacks see: on_step_end, then Trainer.log (which appends
    to log_history before on_log), and the run summary log before on_train_end."""

    def __init__(self, handler, args):
        self.handler, self.args = handler, args
        self.state, self.control = TrainerState(logging_steps=args.logging_steps), TrainerControl()

    def log(self, logs):
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.handler.on_log(self.args, self.state, self.control, logs=logs)

    def train(self, steps, step_seconds):
        self.state.global_step = 0
        self.handler.on_train_begin(self.args, self.state, self.control)
        for _ in range(steps):
            time.sleep(step_seconds)
            self.state.global_step += 1
            self.control = self.handler.on_step_end(self.args, self.state, self.control)
            if self.control.should_log:
                self.control.should_log = False
                self.log({"loss": 1.0 / self.state.global_step})
        self.log({"train_runtime": 1.0})
        self.handler.on_train_end(self.args, self.state, self.control)


def _handler(cb, *more):
    handler = CallbackHandler(DEFAULT_CALLBACKS + list(more), None, None, None, None)
    cb.attach(types.SimpleNamespace(callback_handler=handler))
    return handler


def test_attach_puts_the_callback_before_the_reporters(no_rank_env):
    reporter = Reporter()
    handler = CallbackHandler(DEFAULT_CALLBACKS + [reporter], None, None, None, None)
    trainer = types.SimpleNamespace(callback_handler=handler)
    cb = GpumonCallback(gpumon.StepClient("/nonexistent.sock")).attach(trainer)
    order = [type(c) for c in handler.callbacks]
    assert order == [DefaultFlowCallback, GpumonCallback, Reporter]
    assert cb.attach(trainer) is cb and [type(c) for c in handler.callbacks] == order  # idempotent


def test_callbacks_list_placement_is_fixed_at_train_begin(no_rank_env):
    # Trainer(callbacks=[cb]) and ms-swift's `extra_callbacks` put the callback after the
    # reporters; at on_train_begin it moves itself before them, so they get the figures.
    reporter = Reporter()
    with gpumon.Monitor(backend="mock", interval="100ms", job="late", rank=0, devices="0") as m:
        cb = GpumonCallback(m)
        handler = CallbackHandler(DEFAULT_CALLBACKS + [reporter, cb], None, None, None, None)
        Loop(handler, _args(logging_steps=1, max_steps=3)).train(3, 0.12)
        assert [type(c) for c in handler.callbacks] == [DefaultFlowCallback, GpumonCallback, Reporter]
    assert _figured(reporter, "mock_gpu")


def _figured(reporter, prefix):
    return [(gs, logs) for gs, logs in reporter.logged if f"{prefix}/step" in logs]


def test_steps_longer_than_the_interval_log_their_own_figures(no_rank_env):
    # 300 ms steps, 100 ms interval: at each log the Monitor samples at once, so the figures are
    # those of the step being logged — never the one before, whatever the ticks did.
    reporter = Reporter()
    with gpumon.Monitor(backend="mock", interval="100ms", job="hf", rank=0, devices="0,1") as m:
        cb = GpumonCallback(m)
        loop = Loop(_handler(cb, reporter), _args(logging_steps=1, max_steps=6))
        loop.train(6, 0.3)
        assert m.last_step == 6
    figured = _figured(reporter, "mock_gpu")
    steps = [int(logs["mock_gpu/step"]) for _, logs in figured]
    assert steps == sorted(set(steps)), "each step's figures are logged once, in order"
    for global_step, logs in figured:
        assert int(logs["mock_gpu/step"]) == global_step
        # The step's own duration, not an interval's or another step's: 0.3 s, plus the sample
        # the previous log took on the training thread (a sample and a flush of the sinks).
        assert 0.25 <= logs["mock_gpu/step_seconds"] < 1.5  # slower only on a loaded machine
        keys = set(k.split("/", 1)[1] for k in logs if k.startswith("mock_gpu/"))
        # Energy needs a sample before the step as its baseline: from the second step on.
        assert keys == COMPACT if logs["mock_gpu/step"] > 1 else keys == COMPACT - {"energy_joules"}
        assert not any(k.startswith("gpu") for k in logs), "mock figures are never unmarked"
    # Every step logged, with its own figures: nothing lost, nothing shifted.
    assert steps == [1, 2, 3, 4, 5, 6]
    # log_history holds the same figures as the logs of the same step.
    for entry in loop.state.log_history:
        logged = [logs for gs, logs in figured if gs == entry["step"] and logs.get("loss") == entry.get("loss")]
        if logged:
            assert {k: v for k, v in entry.items() if k.startswith("mock_gpu/")} == {
                k: v for k, v in logged[0].items() if k.startswith("mock_gpu/")}
    assert sum(1 for e in loop.state.log_history if "mock_gpu/step" in e) == len(figured)


def test_steps_shorter_than_the_interval_share_a_sample_and_say_which(no_rank_env):
    # 20 ms steps, 200 ms interval: about ten steps per tick, but each log samples at once, so
    # every log has the figures of its own step (the samples since the previous log).
    reporter = Reporter()
    with gpumon.Monitor(backend="mock", interval="200ms", job="hf", rank=0, devices="0") as m:
        loop = Loop(_handler(GpumonCallback(m, per_gpu=True), reporter), _args(logging_steps=1, max_steps=40))
        loop.train(40, 0.02)
    figured = _figured(reporter, "mock_gpu")
    steps = [int(logs["mock_gpu/step"]) for _, logs in figured]
    assert steps == list(range(1, 41))
    for global_step, logs in figured:
        assert logs["mock_gpu/step"] == global_step
        assert logs["mock_gpu/step_seconds"] < 0.1  # the mean of the steps sharing the tick
        # per_gpu: GPU 0's keys, equal to the compact ones on a one-GPU run.
        assert logs["mock_gpu0/utilization"] == pytest.approx(logs["mock_gpu/utilization"])
        assert logs["mock_gpu0/memory_peak_bytes"] / 2**30 == pytest.approx(logs["mock_gpu/memory_peak_gib"])


def test_thirty_steps_all_reported_at_train_end(no_rank_env):
    # The case: 50 ms steps, 1 s interval, the callback's user-supplied Monitor; right
    # after train() the endpoint shows step 30 (on_train_end flushed), and every step's mark
    # was read.
    with gpumon.Monitor(backend="mock", interval="1s", prometheus_listen="127.0.0.1:0", job="hf30", rank=0,
                        devices="all") as m:
        loop = Loop(_handler(GpumonCallback(m)), _args(logging_steps=10, max_steps=30))
        loop.train(30, 0.05)
        assert training_steps(m.prometheus_address) == [30.0]


def test_a_second_train_marks_and_logs_again(no_rank_env, caplog):
    reporter = Reporter()
    with gpumon.Monitor(backend="mock", interval="100ms", job="twice", rank=0, devices="0") as m:
        cb = GpumonCallback(m)
        loop = Loop(_handler(cb, reporter), _args(logging_steps=1, max_steps=3))
        loop.train(3, 0.25)
        assert m.last_step == 3
        first = len(_figured(reporter, "mock_gpu"))
        with caplog.at_level(logging.INFO, logger="gpumon"):
            loop.train(3, 0.25)  # global_step restarts at 0
        # The tracker's run counts on (4, 5, 6); the logs keep the loop's numbering 1..3.
        assert m.last_step == 6
        assert any("continue" in r.getMessage() for r in caplog.records)
    second = _figured(reporter, "mock_gpu")[first:]
    assert second and [int(l["mock_gpu/step"]) for _, l in second][-1] == 3
    assert all(1 <= l["mock_gpu/step"] <= 3 for _, l in second)


def test_the_callbacks_own_monitor_closes_and_restarts(no_rank_env):
    reporter = Reporter()
    cb = GpumonCallback(backend="mock", every_n_steps=2)
    loop = Loop(_handler(cb, reporter), _args(logging_steps=2, max_steps=4))
    for _ in range(2):  # a second train() gets a new Monitor
        loop.train(4, 0.05)
        assert cb.target is None
        logs = _figured(reporter, "mock_gpu")[-1][1]
        assert logs["mock_gpu/step"] == 4  # the last step's own figures, at its log


NO_NVML = ctypes.util.find_library("nvidia-ml") is None


@pytest.mark.skipif(not NO_NVML, reason="this machine has libnvidia-ml: the no-NVML rule cannot be seen")
def test_no_simulated_figures_unless_asked(no_rank_env, caplog):
    reporter = Reporter()
    cb = GpumonCallback()  # backend="auto": NVML or nothing
    with caplog.at_level(logging.WARNING, logger="gpumon"):
        Loop(_handler(cb, reporter), _args(logging_steps=1, max_steps=3)).train(3, 0.01)
    assert reporter.logged and all(set(logs) <= {"loss", "train_runtime"} for _, logs in reporter.logged)
    assert [r for r in caplog.records if "NVML is unavailable" in r.getMessage()], caplog.text


def test_callback_with_a_step_client_adds_no_figures(tmp_path):
    client = gpumon.StepClient(tmp_path / "none.sock", job="x", rank=0)
    reporter = Reporter()
    handler = _handler(GpumonCallback(client), reporter)
    args, state, control = _args(), TrainerState(), TrainerControl()
    state.global_step = 1
    handler.on_step_end(args, state, control)
    handler.on_log(args, state, control, logs={"loss": 0.5})
    assert reporter.logged == [(1, {"loss": 0.5})]
    assert client.dropped == 1  # the mark was attempted (no agent there)


def test_gpu_figures_of_the_latest_sample_are_marked_mock(no_rank_env):
    with gpumon.Monitor(backend="mock", devices="0,1") as m:
        figs = gpu_figures(m.snapshot())
    assert set(figs) == {f"mock_gpu{i}/{k}" for i in (0, 1)
                         for k in ("utilization", "memory_used_bytes", "power_watts", "temperature_celsius")}


def test_callback_bad_arguments():
    with pytest.raises(ValueError):
        GpumonCallback(every_n_steps=0)
    with pytest.raises(ValueError):
        GpumonCallback(every_n_steps=True)
    with pytest.raises(TypeError):
        GpumonCallback(monitor_or_client="not a monitor")
    with pytest.raises(ValueError, match="backend"):
        GpumonCallback(backend="cuda")


def test_the_callbacks_own_monitor_watches_the_processs_own_gpu(no_rank_env, monkeypatch):
    # Not every GPU of the node (8 on the mock, ~1.8 kJ a step): the process's own, or devices=.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    seen = []

    class Peek(GpumonCallback):
        def on_train_end(self, args, state, control, **kwargs):
            seen.append(sorted(d["info"]["index"] for d in self.target.snapshot()["devices"]))
            super().on_train_end(args, state, control, **kwargs)

    for cb in (Peek(backend="mock"), Peek(backend="mock", devices=[0, 1])):
        Loop(_handler(cb), _args(logging_steps=1, max_steps=2)).train(2, 0.01)
    monkeypatch.setenv("LOCAL_RANK", "1")  # a torchrun rank without a CUDA device: its entry
    Loop(_handler(Peek(backend="mock")), _args(logging_steps=1, max_steps=2)).train(2, 0.01)
    assert seen == [[3], [0, 1], [4]], "rank 1 watches entry 1 of CUDA_VISIBLE_DEVICES"

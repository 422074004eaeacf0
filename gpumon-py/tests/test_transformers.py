"""The Hugging Face callback, driven through transformers' own CallbackHandler (no torch)."""

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
from conftest import wait_for  # noqa: E402


class Reporter(TrainerCallback):
    """Stands for TensorBoardCallback / WandbCallback: writes out what on_log receives."""

    def __init__(self):
        self.logged = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append(dict(logs))


def _args():
    # What DefaultFlowCallback reads; TrainingArguments itself needs torch.
    return types.SimpleNamespace(
        logging_first_step=False, logging_strategy="steps", logging_steps=2, eval_strategy="no",
        eval_steps=None, eval_delay=0, save_strategy="no", save_steps=500, max_steps=6,
        run_name="hf-test", include_num_input_tokens_seen=False,
    )


def test_callback_feeds_gpu_figures_to_the_reporters(no_rank_env):
    reporter = Reporter()
    with gpumon.Monitor(backend="mock", interval="100ms", job="hf", rank=0, devices="all") as monitor:
        # The Trainer's order: defaults, the reporting callbacks, then user callbacks; the
        # progress callback last.
        handler = CallbackHandler(DEFAULT_CALLBACKS + [reporter], None, None, None, None)
        trainer = types.SimpleNamespace(callback_handler=handler)
        cb = GpumonCallback(monitor, every_n_steps=2).attach(trainer)
        types_in_order = [type(c) for c in handler.callbacks]
        assert types_in_order == [DefaultFlowCallback, GpumonCallback, Reporter]
        assert cb.attach(trainer) is cb and [type(c) for c in handler.callbacks] == types_in_order  # idempotent

        args, state, control = _args(), TrainerState(logging_steps=2), TrainerControl()
        handler.on_train_begin(args, state, control)
        for step in range(1, 7):
            state.global_step = step
            control = handler.on_step_end(args, state, control)
            if control.should_log:
                handler.on_log(args, state, control, logs={"loss": 1.0 / step})
        # DefaultFlowCallback asked for a log every 2 steps: 3 logs, each with the GPU figures.
        assert len(reporter.logged) == 3
        for logs in reporter.logged:
            assert "loss" in logs
            for i in range(8):
                assert 0.0 <= logs[f"gpu{i}/utilization"] <= 1.0
                assert logs[f"gpu{i}/memory_used_bytes"] > 0
                assert logs[f"gpu{i}/power_watts"] > 0
        # every_n_steps=2 marked steps 2, 4, 6.
        def last_step():
            runs = (monitor.snapshot().get("steps") or {}).get("runs", [])
            return runs and runs[0]["last_step"] == 6 and runs[0]
        run = wait_for("step 6 in the snapshot", last_step)
        assert (run["job"], run["rank"]) == ("hf", 0)
        # A later log carries the per-step figures too.
        logs = {}
        handler.on_log(args, state, control, logs=logs)
        assert set(gpu_figures(monitor.snapshot())) == set(logs)
        assert "gpu0/step_utilization_mean" in logs and "gpumon/step_duration_seconds" in logs


def test_callback_with_a_step_client_adds_no_figures(tmp_path):
    client = gpumon.StepClient(tmp_path / "none.sock", job="x", rank=0)
    reporter = Reporter()
    handler = CallbackHandler(DEFAULT_CALLBACKS + [reporter], None, None, None, None)
    GpumonCallback(client).attach(types.SimpleNamespace(callback_handler=handler))
    args, state, control = _args(), TrainerState(), TrainerControl()
    state.global_step = 1
    handler.on_step_end(args, state, control)
    handler.on_log(args, state, control, logs={"loss": 0.5})
    assert reporter.logged == [{"loss": 0.5}]
    assert client.dropped == 1  # the mark was attempted (no agent there)


def test_callback_bad_arguments():
    with pytest.raises(ValueError):
        GpumonCallback(every_n_steps=0)
    with pytest.raises(TypeError):
        GpumonCallback(monitor_or_client="not a monitor")

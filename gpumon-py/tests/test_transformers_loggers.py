"""The Hugging Face callback in a real Trainer (torch on CPU) reporting to TensorBoard and W&B
(offline): each logger's own files read back — TensorBoard's event files through tensorboard's
reader, W&B's run file through its datastore, and ``state.log_history`` — put every GPU figure
at the step it describes (``gpu/step`` equals the logger's step: offset zero)."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

import gpumon  # noqa: E402
from gpumon.integrations.transformers import GpumonCallback  # noqa: E402
from conftest import wait_for  # noqa: E402


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        import time

        time.sleep(0.12)  # a step the sampler sees
        out = self.layer(x)
        loss = torch.nn.functional.mse_loss(out, labels)
        return {"loss": loss, "logits": out}


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}


def _train(tmp_path, report_to, callback, steps=6, logging_steps=1):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=2,
        logging_steps=logging_steps, report_to=report_to, use_cpu=True,
        save_strategy="no", disable_tqdm=True, run_name="hf-loggers",
    )
    trainer = transformers.Trainer(model=Regression(), args=args, train_dataset=Data(32))
    callback.attach(trainer)
    trainer.train()
    return trainer


def _tb_points(log_dir, suffix):
    runs = {os.path.dirname(p) for p in glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"),
                                                  recursive=True)}
    points = {}
    for run in runs:
        acc = event_accumulator.EventAccumulator(run)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag.endswith(suffix):
                points[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    return points


def _wandb_records(path):
    """The records of a W&B run file (``run-*.wandb``): a 7-byte header (``:W&B``, magic, version),
    then LevelDB-log blocks of 32 KiB whose records (crc32c, length, type: 1 full, 2 first,
    3 middle, 4 last) carry one protobuf ``Record`` each — wandb's own format, which wandb 0.31
    ships no Python reader for."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left  # zero padding to the end of the block
            continue
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield payload
        elif kind == 2:
            pending = payload
        elif kind == 3:
            pending += payload
        elif kind == 4:
            yield pending + payload
            pending = b""


def test_tensorboard_and_log_history_show_each_steps_figures_at_that_step(no_rank_env, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    with gpumon.Monitor(backend="mock", interval="100ms", job="hf-tb", devices="0") as m:
        trainer = _train(tmp_path, ["tensorboard"], GpumonCallback(m))
    points = _tb_points(str(tmp_path / "tb"), "mock_gpu/step")
    (tag,) = points
    # Every log (one per step) has the figures of its own step: TensorBoard's step == gpu/step.
    assert points[tag] == [(n, float(n)) for n in range(1, 7)], points
    loss_steps = [s for s, _ in next(v for k, v in _tb_points(str(tmp_path / "tb"), "loss").items())]
    assert [s for s, _ in points[tag]] == loss_steps
    history = [e for e in trainer.state.log_history if "mock_gpu/step" in e]
    assert [(e["step"], e["mock_gpu/step"]) for e in history] == [(n, float(n)) for n in range(1, 7)]


def test_wandb_offline_run_shows_each_steps_figures_at_that_step(no_rank_env, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "gpumon-test")
    with gpumon.Monitor(backend="mock", interval="100ms", job="hf-wandb", devices="0") as m:
        _train(tmp_path, ["wandb"], GpumonCallback(m), steps=4)
    wandb.finish()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))

    def records():
        out = []
        for data in _wandb_records(run_file):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(data)
            except Exception:  # a record still being written
                return None
            out.append(record)
        # wandb's service process writes the file behind the run: read it once it is closed.
        return out if any(r.WhichOneof("record_type") == "exit" for r in out) else None

    rows = []
    for record in wait_for("the W&B run file written to its end", records, timeout=60):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    figured = [r for r in rows if any(k.endswith("mock_gpu/step") for k in r)]
    assert len(figured) == 4, rows
    for r in figured:
        step_key = next(k for k in r if k.endswith("mock_gpu/step"))
        # W&B's x-axis for the Trainer's logs is train/global_step.
        assert r["train/global_step"] == r[step_key]

"""The PyTorch Lightning callback, with Lightning and torch on CPU: a tiny model trained for a few
steps; each step's figures logged on Lightning's own step axis (batch n at step n - 1, beside
Lightning's metrics of that batch, read back from CSVLogger's metrics.csv and TensorBoard's event
files), the last one reported at the end of fit, the findings of the diagnosis logged, the rank's
own GPU watched."""

import csv
import glob
import os
import time

import pytest

L = pytest.importorskip("lightning")
torch = pytest.importorskip("torch")
from lightning.pytorch.loggers.logger import Logger  # noqa: E402
from lightning.pytorch.utilities import rank_zero_only  # noqa: E402

import gpumon  # noqa: E402
from gpumon.integrations.lightning import GpumonCallback  # noqa: E402
from conftest import training_steps  # noqa: E402


class Recorder(Logger):
    """A logger that keeps what it is given: (step, metrics)."""

    def __init__(self):
        super().__init__()
        self.records = []

    @property
    def name(self):
        return "recorder"

    @property
    def version(self):
        return 0

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs):
        pass

    @rank_zero_only
    def log_metrics(self, metrics, step=None):
        self.records.append((step, dict(metrics)))


class Tiny(L.LightningModule):
    def __init__(self, step_seconds):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.step_seconds = step_seconds

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_seconds)  # a step long enough for the sampler to see it
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        # Lightning's own metric of this batch, and the batch's number: the x-axis gpumon must share.
        self.log("loss", loss)
        self.log("batch_global_step", float(self.trainer.global_step + 1))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=1)


def _trainer(cb, logger, steps, **kw):
    return L.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=logger, callbacks=[cb], log_every_n_steps=1,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, **kw,
    )


def _figures(logger, prefix="mock_gpu"):
    return [(step, m) for step, m in logger.records if f"{prefix}/step" in m]


def test_each_steps_figures_sit_on_lightnings_step_axis(no_rank_env):
    logger = Recorder()
    with gpumon.Monitor(backend="mock", interval="100ms", prometheus_listen="127.0.0.1:0", job="pl", rank=0,
                        devices="0,1") as m:
        _trainer(GpumonCallback(m), logger, 8).fit(Tiny(0.3), _loader(16))
        assert m.last_step == 8
        # on_fit_end flushed: the endpoint shows the last step at once.
        assert training_steps(m.prometheus_address) == [8.0]
    figured = _figures(logger)
    # One log per batch (log_every_n_steps=1), each with its own step's figures: none skipped.
    assert [int(m["mock_gpu/step"]) for _, m in figured] == list(range(1, 9))
    lightning_steps = {step: m["batch_global_step"] for step, m in logger.records if "batch_global_step" in m}
    for step, metrics in figured:
        # Batch n's figures at n - 1, where Lightning put that batch's own metrics.
        assert step == metrics["mock_gpu/step"] - 1
        assert lightning_steps[step] == metrics["mock_gpu/step"]
        # The step's own duration (0.3 s), plus the sample the previous log took on the training
        # thread (slow only on a loaded machine): never an interval's or two steps'.
        assert 0.25 <= metrics["mock_gpu/step_seconds"] < 1.5
        assert 0.0 <= metrics["mock_gpu/utilization"] <= 1.0
        assert not any(k.startswith("gpu") for k in metrics)


def _csv_rows(log_dir):
    (path,) = glob.glob(os.path.join(log_dir, "**", "metrics.csv"), recursive=True)
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_metrics_csv_has_every_gpu_point_beside_lightnings_own(no_rank_env, tmp_path):
    # Lightning's own CSVLogger, read back: each gpumon row's step is a step at which Lightning
    # logged the loss of the batch the figures describe — the last one included.
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    csv_logger = CSVLogger(str(tmp_path / "csv"), name="run")
    tb_logger = TensorBoardLogger(str(tmp_path / "tb"), name="run")
    with gpumon.Monitor(backend="mock", interval="100ms", job="csv", rank=0, devices="0") as m:
        _trainer(GpumonCallback(m), [csv_logger, tb_logger], 6).fit(Tiny(0.15), _loader(12))
    rows = _csv_rows(str(tmp_path / "csv"))
    loss_at = {int(r["step"]): float(r["batch_global_step"]) for r in rows if r.get("batch_global_step")}
    gpu_rows = [r for r in rows if r.get("mock_gpu/step")]
    described = [int(float(r["mock_gpu/step"])) for r in gpu_rows]
    assert described == [1, 2, 3, 4, 5, 6]
    for r in gpu_rows:
        step, figures_of = int(r["step"]), float(r["mock_gpu/step"])
        assert loss_at[step] == figures_of, f"row {r}: Lightning's batch at step {step} is {loss_at.get(step)}"
    # TensorBoard's event files, through tensorboard's own reader: the same steps.
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    (run_dir,) = {os.path.dirname(p) for p in glob.glob(str(tmp_path / "tb" / "**" / "events.out.tfevents.*"),
                                                       recursive=True)}
    acc = ea.EventAccumulator(run_dir)
    acc.Reload()
    points = [(e.step, e.value) for e in acc.Scalars("mock_gpu/step")]
    assert points == [(n - 1, float(n)) for n in range(1, 7)]
    loss_steps = {e.step: e.value for e in acc.Scalars("batch_global_step")}
    assert all(loss_steps[step] == value for step, value in points)


def test_the_rank_watches_its_own_gpu_unless_told(no_rank_env, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    seen = {}

    class Peek(GpumonCallback):
        def on_fit_end(self, trainer, pl_module):
            seen.setdefault("devices", []).append(
                [d["info"]["index"] for d in self.target.snapshot()["devices"]])
            super().on_fit_end(trainer, pl_module)

    # A CPU run of rank 0: entry 0 of CUDA_VISIBLE_DEVICES, GPU 5 — not all 8 of the node.
    _trainer(Peek(backend="mock", job="own-gpu"), Recorder(), 2).fit(Tiny(0.01), _loader(4))
    _trainer(Peek(backend="mock", job="own-gpu", devices=[1, 2]), Recorder(), 2).fit(Tiny(0.01), _loader(4))
    assert seen["devices"] == [[5], [1, 2]]
    with pytest.raises(ValueError, match="devices"):
        GpumonCallback(gpumon.Monitor(backend="mock", devices="0"), devices="1")


def test_findings_are_logged_when_raised_and_cleared(no_rank_env, tmp_path, caplog):
    # ecc-burst: GPU 1 gets uncorrectable ECC errors at tick 10; hardware_errors is raised at
    # once (its row remapping stays pending, so it holds to the end).
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    csv_logger = CSVLogger(str(tmp_path / "csv"), name="run")
    tb_logger = TensorBoardLogger(str(tmp_path / "tb"), name="run")
    with gpumon.Monitor(backend="mock", interval="100ms", mock_scenario="ecc-burst", devices="1", job="ecc",
                        rank=0, diagnose_window="1s") as m:
        assert m.diagnose
        with caplog.at_level("WARNING", logger="gpumon"):
            _trainer(GpumonCallback(m), [csv_logger, tb_logger], 20).fit(Tiny(0.2), _loader(40))
    rows = _csv_rows(str(tmp_path / "csv"))
    marks = [(int(r["step"]), float(r["mock_gpu/finding/hardware_errors"]))
             for r in rows if r.get("mock_gpu/finding/hardware_errors")]
    assert [v for _, v in marks] == [1.0], marks  # logged once, at the log after it was raised
    counts = [float(r["mock_gpu/findings"]) for r in rows if r.get("mock_gpu/findings")]
    assert counts[0] == 0.0 and counts[-1] == 1.0, counts
    texts = [r.getMessage() for r in caplog.records if "finding" in r.getMessage()]
    assert any("raised on GPU 1: hardware_errors" in t for t in texts), texts
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    (run_dir,) = {os.path.dirname(p) for p in glob.glob(str(tmp_path / "tb" / "**" / "events.out.tfevents.*"),
                                                       recursive=True)}
    acc = ea.EventAccumulator(run_dir, size_guidance={ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert any(t.startswith("gpu/findings") for t in tags), tags


# A fault that clears: memory 97 % full for the first 2 s of simulated time (near_oom raised
# once 80 % of the 1 s window holds), then 50 % (cleared once at most 20 % of it holds).
_NEAR_OOM_THEN_FREED = """
name = "near-oom-then-freed"

[[phases]]
until_s = 2
shape = "steady"
busy = 0.95
memory = 0.97
memory_controller = 0.47

[[phases]]
from_s = 2
shape = "steady"
busy = 0.95
memory = 0.5
memory_controller = 0.47
"""


def test_a_cleared_finding_is_logged_as_cleared(no_rank_env, tmp_path, caplog):
    from lightning.pytorch.loggers import CSVLogger

    scenario = tmp_path / "near-oom-then-freed.toml"
    scenario.write_text(_NEAR_OOM_THEN_FREED)
    csv_logger = CSVLogger(str(tmp_path / "csv"), name="run")
    with gpumon.Monitor(backend="mock", interval="100ms", mock_scenario=str(scenario), devices="0", job="freed",
                        rank=0, diagnose_window="1s") as m:
        with caplog.at_level("WARNING", logger="gpumon"):
            _trainer(GpumonCallback(m), [csv_logger], 30).fit(Tiny(0.2), _loader(60))
    rows = _csv_rows(str(tmp_path / "csv"))
    marks = [float(r["mock_gpu/finding/near_oom"]) for r in rows if r.get("mock_gpu/finding/near_oom")]
    assert marks == [1.0, 0.0], marks  # raised, then cleared: each logged once
    counts = [float(r["mock_gpu/findings"]) for r in rows if r.get("mock_gpu/findings")]
    assert 1.0 in counts and counts[-1] == 0.0, counts
    texts = [r.getMessage() for r in caplog.records]
    assert any(t.startswith("gpumon: finding cleared on GPU 0 after ") and ": near_oom - no longer holds" in t
               for t in texts), texts


def test_gradient_accumulation_marks_optimizer_steps(no_rank_env):
    logger = Recorder()
    with gpumon.Monitor(backend="mock", interval="100ms", job="acc", rank=0, devices="0") as m:
        _trainer(GpumonCallback(m, per_gpu=True), logger, 3, accumulate_grad_batches=2).fit(Tiny(0.1), _loader(16))
        assert m.last_step == 3
    step, metrics = _figures(logger)[-1]
    assert step == 2 and metrics["mock_gpu/step"] == 3 and metrics["mock_gpu0/utilization"] == pytest.approx(metrics["mock_gpu/utilization"])


def test_the_callbacks_own_monitor_across_two_fits(no_rank_env):
    cb = GpumonCallback(backend="mock", job="own")
    for _ in range(2):
        logger = Recorder()
        _trainer(cb, logger, 4).fit(Tiny(0.02), _loader(8))
        assert cb.target is None  # closed at the end of fit, a new one next time
        assert _figures(logger)[-1][1]["mock_gpu/step"] == 4

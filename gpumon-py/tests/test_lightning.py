"""The PyTorch Lightning callback, with Lightning and torch on CPU: a tiny model trained for a few
steps; each step's figures logged at that step, the last one reported at the end of fit."""

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
        return torch.nn.functional.mse_loss(self.layer(x), y)

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


def test_each_steps_figures_are_logged_at_that_step(no_rank_env):
    logger = Recorder()
    with gpumon.Monitor(backend="mock", interval="100ms", prometheus_listen="127.0.0.1:0", job="pl", rank=0,
                        devices="0,1") as m:
        _trainer(GpumonCallback(m), logger, 8).fit(Tiny(0.3), _loader(16))
        assert m.last_step == 8
        # on_fit_end flushed: the endpoint shows the last step at once.
        assert training_steps(m.prometheus_address) == [8.0]
    figured = _figures(logger)
    assert len(figured) >= 4
    steps = [step for step, _ in figured]
    assert steps == sorted(set(steps)) and steps[-1] == 8
    for step, metrics in figured:
        assert metrics["mock_gpu/step"] == step  # logged at the step they describe
        assert metrics["mock_gpu/step_seconds"] == pytest.approx(0.3, abs=0.1)
        assert 0.0 <= metrics["mock_gpu/utilization"] <= 1.0
        assert not any(k.startswith("gpu") for k in metrics)


def test_gradient_accumulation_marks_optimizer_steps(no_rank_env):
    logger = Recorder()
    with gpumon.Monitor(backend="mock", interval="100ms", job="acc", rank=0, devices="0") as m:
        _trainer(GpumonCallback(m, per_gpu=True), logger, 3, accumulate_grad_batches=2).fit(Tiny(0.1), _loader(16))
        assert m.last_step == 3
    step, metrics = _figures(logger)[-1]
    assert step == 3 and metrics["mock_gpu0/utilization"] == pytest.approx(metrics["mock_gpu/utilization"])


def test_the_callbacks_own_monitor_across_two_fits(no_rank_env):
    cb = GpumonCallback(backend="mock", job="own")
    for _ in range(2):
        logger = Recorder()
        _trainer(cb, logger, 4).fit(Tiny(0.02), _loader(8))
        assert cb.target is None  # closed at the end of fit, a new one next time
        assert _figures(logger)[-1][0] == 4

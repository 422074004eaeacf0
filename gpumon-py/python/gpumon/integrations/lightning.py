"""PyTorch Lightning integration: a ``Callback`` that marks each optimizer step and logs each
reported step's GPU figures **at that step**.

::

    import lightning as L
    from gpumon.integrations.lightning import GpumonCallback

    trainer = L.Trainer(max_epochs=3, callbacks=[GpumonCallback()])
    trainer.fit(model, train_dataloaders=loader)

Lightning's loggers take the step a record belongs to (``logger.log_metrics(metrics, step=)``),
so unlike the Hugging Face Trainer each step's figures are logged under their own step number:
at every ``log_every_n_steps``-th batch, the figures of the newest step the agent has reported
(usually a step or two back: a step is read at the first sample after it ends) go to every
logger at that step, and ``gpu/step`` names it too. At the end of ``fit`` every marked step is
reported (a final sample) and the newest one logged. Keys: :mod:`gpumon.figures` (compact by
default, ``per_gpu=True`` for per-GPU keys; ``mock_gpu/...`` on the mock backend).

The marks are ``trainer.global_step`` (optimizer steps: with gradient accumulation, one mark per
``accumulate_grad_batches`` batches). Each process marks on its own Monitor (rank =
``trainer.local_rank``, watching that rank's GPU); loggers write from rank 0 only, as Lightning's
loggers do.

Works with ``lightning`` (``import lightning``) and the older ``pytorch_lightning`` package.
"""

from typing import Any, Optional, Union

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from .. import Monitor, StepClient
from ._common import StepMarker

__all__ = ["GpumonCallback"]


class GpumonCallback(Callback):
    """Marks every ``every_n_steps``-th optimizer step and logs the GPU figures of each reported
    step at that step.

    :param monitor_or_client: a :class:`gpumon.Monitor` (flushed at the end of ``fit``), a
        :class:`gpumon.StepClient` (marks on the node's agent; no figures logged), or ``None``:
        a Monitor is started when ``fit`` starts (job ``job``, rank = the process's local rank)
        and closed — every marked step reported — when it ends.
    :param every_n_steps: mark every N-th step.
    :param per_gpu: also log per-GPU keys.
    :param backend: for the callback's own Monitor: ``"auto"`` (NVML; without it no figures,
        said once in the log), ``"nvml"`` or ``"mock"`` (keys ``mock_gpu/...``).
    :param job: the job name of the callback's own Monitor (default: the logger's name, else
        ``"train"``).
    """

    def __init__(
        self,
        monitor_or_client: Optional[Union[Monitor, StepClient]] = None,
        every_n_steps: int = 1,
        per_gpu: bool = False,
        backend: str = "auto",
        job: Optional[str] = None,
    ):
        super().__init__()
        self._marker = StepMarker(monitor_or_client, every_n_steps, per_gpu, backend)
        self._job = job

    @property
    def target(self) -> Optional[Union[Monitor, StepClient]]:
        """The Monitor or StepClient steps are marked on."""
        return self._marker.target

    def _log_figures(self, trainer: Any) -> None:
        step, figures = self._marker.figures()
        if step is None or not trainer.loggers:
            return
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=step)

    # -- Callback -------------------------------------------------------------------------------

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        job = self._job
        if job is None:
            logger = getattr(trainer, "logger", None)
            job = getattr(logger, "name", None) or "train"
        rank = getattr(trainer, "local_rank", None)
        self._marker.begin(str(job), None if rank is None else int(rank), int(trainer.global_step))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step == 0:
            return  # no optimizer step yet (gradient accumulation)
        self._marker.mark(step)
        every = max(1, int(getattr(trainer, "log_every_n_steps", 1) or 1))
        if step % every == 0:
            self._log_figures(trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        # Report the steps marked since the last tick, log the newest, then release.
        self._marker.flush()
        self._log_figures(trainer)
        self._marker.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # fit failed: still report what was marked and release the callback's own Monitor.
        self._marker.end()

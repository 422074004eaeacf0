"""PyTorch Lightning integration: a ``Callback`` that marks each optimizer step and logs each
logged step's GPU figures **on Lightning's own step axis**, beside Lightning's metrics of the same
batch.

::

    import lightning as L
    from gpumon.integrations.lightning import GpumonCallback

    trainer = L.Trainer(max_epochs=3, callbacks=[GpumonCallback()])
    trainer.fit(model, train_dataloaders=loader)

**The step axis.** Lightning logs batch ``n``'s metrics (``trainer.global_step == n`` after its
optimizer step) at step ``n - 1`` — the count of batches that had stepped before it, as its own
``DeviceStatsMonitor`` does. At every ``log_every_n_steps``-th batch the callback marks the step,
has the Monitor sample at once (one sample per log: the step tracker then reports that very
step), and logs step ``n``'s figures at Lightning's step ``n - 1``, with ``gpu/step = n``: every
GPU point sits on the same x as Lightning's loss of that batch, in TensorBoard, CSV, W&B and any
other logger. At the end of ``fit`` the last step is reported and logged the same way. Keys:
:mod:`gpumon.figures` (compact by default, ``per_gpu=True`` for per-GPU keys; ``mock_gpu/...`` on
the mock backend).

**Findings.** The callback's Monitor diagnoses its GPUs (``Monitor(diagnose=True)``, the default
where no ``gpumon-run`` agent watches the job). A finding raised or cleared is logged at the next
log: ``gpu/finding/<kind>`` (1 raised, 0 cleared) and ``gpu/findings`` (how many hold) reach
every logger; its text goes to the ``gpumon`` logger (a warning) and, for loggers that show text,
to TensorBoard (``add_text``, tag ``gpu/findings``) and W&B (``log_text``).

**GPUs.** The marks are ``trainer.global_step`` (optimizer steps: with gradient accumulation, one
mark per ``accumulate_grad_batches`` batches). Each process marks on its own Monitor (rank =
``trainer.local_rank``) watching its own GPU — the device Lightning put it on
(``trainer.strategy.root_device``), or ``devices=``. Loggers write from rank 0 only, as
Lightning's loggers do.

Works with ``lightning`` (``import lightning``) and the older ``pytorch_lightning`` package.
"""

import logging
from typing import Any, Optional, Union

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from .. import Monitor, StepClient
from ._common import Devices, Finding, StepMarker, own_devices

__all__ = ["GpumonCallback"]

_log = logging.getLogger("gpumon")


def _log_text(logger: Any, finding: Finding, step: int) -> None:
    """A finding's text in a logger that shows text: TensorBoard's ``add_text``, W&B's
    ``log_text``; other loggers have its ``gpu/finding/<kind>`` number."""
    try:
        log_text = getattr(logger, "log_text", None)
        experiment = getattr(logger, "experiment", None)
        if callable(log_text) and type(logger).__name__ == "WandbLogger":
            log_text(key="gpu/findings", columns=["finding"], data=[[finding.text]], step=step)
        elif hasattr(experiment, "add_text"):
            experiment.add_text("gpu/findings", finding.text, global_step=step)
    except Exception as e:  # a logger's failure is not the training's
        _log.warning("gpumon: finding not written to %s: %s", type(logger).__name__, e)


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
    :param devices: the GPUs the callback's own Monitor watches (``Monitor(devices=)``'s
        syntax); default: the process's own (``trainer.strategy.root_device``, else the local
        rank's).
    """

    def __init__(
        self,
        monitor_or_client: Optional[Union[Monitor, StepClient]] = None,
        every_n_steps: int = 1,
        per_gpu: bool = False,
        backend: str = "auto",
        job: Optional[str] = None,
        devices: Devices = None,
    ):
        super().__init__()
        self._marker = StepMarker(monitor_or_client, every_n_steps, per_gpu, backend, devices)
        self._job = job

    @property
    def target(self) -> Optional[Union[Monitor, StepClient]]:
        """The Monitor or StepClient steps are marked on."""
        return self._marker.target

    def _log(self, trainer: Any, step: Optional[int]) -> None:
        """Reads the figures of ``step`` (``None``: the newest marked) and logs them on
        Lightning's axis: step ``n``'s at ``n - 1``."""
        reading = self._marker.read(step)
        if not trainer.loggers or (reading.step is None and not reading.figures):
            return
        described = reading.step if reading.step is not None else (step or int(trainer.global_step))
        at = max(0, described - 1)
        for logger in trainer.loggers:
            logger.log_metrics(reading.figures, step=at)
            for finding in reading.findings:
                _log_text(logger, finding, at)

    # -- Callback -------------------------------------------------------------------------------

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        job = self._job
        if job is None:
            logger = getattr(trainer, "logger", None)
            job = getattr(logger, "name", None) or "train"
        rank = getattr(trainer, "local_rank", None)
        rank = None if rank is None else int(rank)
        device = getattr(getattr(trainer, "strategy", None), "root_device", None)
        index = device.index if getattr(device, "type", None) == "cuda" else None
        self._marker.begin(str(job), rank, int(trainer.global_step), own_devices(index, rank))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step == 0:
            return  # no optimizer step yet (gradient accumulation)
        self._marker.mark(step)
        every = max(1, int(getattr(trainer, "log_every_n_steps", 1) or 1))
        if step % every == 0:
            self._log(trainer, step)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        # Report the steps marked since the last log, log the newest, then release.
        self._log(trainer, None)
        self._marker.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # fit failed: still report what was marked and release the callback's own Monitor.
        self._marker.end()

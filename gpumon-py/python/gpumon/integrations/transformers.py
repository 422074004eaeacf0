"""Hugging Face ``transformers`` integration: a ``TrainerCallback`` that marks steps and adds
the GPU figures of **the step being logged** to the Trainer's logs.

::

    from gpumon.integrations.transformers import GpumonCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    GpumonCallback().attach(trainer)
    trainer.train()

**The step axis.** Every reporter of the Trainer (TensorBoard, W&B, MLflow, ...) and
``state.log_history`` put a log at ``state.global_step``. At each of the Trainer's logs the
callback marks that step (if ``every_n_steps`` skipped it) and has the Monitor sample at once
(one sample per log, at the Trainer's ``logging_steps``, not per step): the step tracker then
reports that very step, so the figures added to the logs are those of ``global_step`` itself and
``gpu/step`` equals it — the offset is zero in every logger. Compact by default (``gpu/step``,
``gpu/step_seconds``, ``gpu/utilization``, ``gpu/utilization_min``, ``gpu/memory_peak_gib``,
``gpu/energy_joules``); ``per_gpu=True`` adds per-GPU keys (see :mod:`gpumon.figures`). The same
figures are added to the entry the Trainer has just appended to ``state.log_history``.

**Findings.** The callback's Monitor diagnoses its GPUs (``Monitor(diagnose=True)``, the default
where no ``gpumon-run`` agent watches the job). A finding raised or cleared since the last log
adds ``gpu/finding/<kind>`` (1 raised, 0 cleared) to the logs, and every log carries
``gpu/findings`` (how many hold); its text goes to the ``gpumon`` logger (a warning) and to
TensorBoard (``add_text``, tag ``gpu/findings``) when the Trainer reports there.

**GPUs.** By default the callback's own Monitor watches the process's own GPU: ``args.device``
(``cuda:k``: entry ``k`` of ``CUDA_VISIBLE_DEVICES``), else the local rank's; every visible GPU
only when the Trainer drives several from one process (``n_gpu > 1``, DataParallel).
``devices=`` chooses others.

``attach`` places the callback before the reporting callbacks (TensorBoard, W&B, ...): the
Trainer calls callbacks in order and hands each the same ``logs`` dict, so figures added there
reach every reporter through the Trainer's own reporting. ``trainer.add_callback`` would put it
last, after the reporters have already written the logs.

ms-swift runs on the Hugging Face Trainer (its trainers subclass it), so the same callback works
there: pass it in the trainer's ``callbacks`` list, or ``attach`` it to the trainer ms-swift built.
"""

import logging
import os
import sys
import types
from typing import Any, Dict, Optional, Union

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from .. import Monitor, StepClient
from ..figures import prefix_for  # noqa: F401  (re-exported for users of gpu_figures)
from ._common import Devices, Finding, StepMarker, own_devices

__all__ = ["GpumonCallback", "gpu_figures"]

_log = logging.getLogger("gpumon")


def gpu_figures(snapshot: Dict[str, Any], prefix: str = "gpu") -> Dict[str, float]:
    """Flat ``{"gpu0/utilization": 0.93, ...}`` figures of the *latest sample* in a
    ``Monitor.snapshot()`` dict: per device utilisation (0..1), memory used (bytes), power
    (watts), temperature (°C). They describe the moment of the sample, not a step; for a step's
    figures use :func:`gpumon.figures.step_figures`. Keys start with ``mock_gpu`` on the mock
    backend."""
    p = prefix_for(snapshot, prefix)
    out: Dict[str, float] = {}
    for d in snapshot.get("devices", []):
        info = d.get("info", {})
        key = f"{p}{info.get('index', '?')}"
        if info.get("mig"):
            key += f"_mig{info['mig'].get('mig_index', '?')}"
        for value, name in (
            ((d.get("utilization") or {}).get("gpu"), "utilization"),
            ((d.get("memory") or {}).get("used"), "memory_used_bytes"),
            ((d.get("power") or {}).get("usage_watts"), "power_watts"),
            ((d.get("temperature") or {}).get("gpu"), "temperature_celsius"),
        ):
            if value is not None:
                out[f"{key}/{name}"] = float(value)
    return out


class GpumonCallback(TrainerCallback):
    """Marks every ``every_n_steps``-th step and adds the GPU figures of each reported step to the
    Trainer's logs.

    :param monitor_or_client: a :class:`gpumon.Monitor` (marks steps and supplies the figures;
        flushed at ``on_train_end``), a :class:`gpumon.StepClient` (marks steps on the node's
        agent; the figures are the agent's, so none are added to the logs), or ``None``: a
        ``Monitor`` is started at ``on_train_begin`` with the job named after ``args.run_name``
        and closed — every marked step reported — at ``on_train_end``.
    :param every_n_steps: mark every N-th step.
    :param per_gpu: also log per-GPU keys (``gpu0/utilization``, ...).
    :param backend: for the callback's own Monitor: ``"auto"`` (NVML; without it no figures, said
        once in the log), ``"nvml"`` (raises without NVML) or ``"mock"`` (simulated GPUs; every
        key starts with ``mock_gpu``).
    :param devices: the GPUs the callback's own Monitor watches (``Monitor(devices=)``'s
        syntax); default: the process's own (``args.device``, else the local rank's).
    """

    def __init__(
        self,
        monitor_or_client: Optional[Union[Monitor, StepClient]] = None,
        every_n_steps: int = 1,
        per_gpu: bool = False,
        backend: str = "auto",
        devices: Devices = None,
    ):
        self._marker = StepMarker(monitor_or_client, every_n_steps, per_gpu, backend, devices)
        # The handler that calls this callback (``attach``): its TensorBoard writer shows the
        # findings' text.
        self._handler: Any = None

    @property
    def every_n_steps(self) -> int:
        return self._marker.every_n_steps

    @property
    def target(self) -> Optional[Union[Monitor, StepClient]]:
        """The Monitor or StepClient steps are marked on."""
        return self._marker.target

    def attach(self, trainer: Any) -> "GpumonCallback":
        """Adds this callback to ``trainer`` just after the Trainer's own flow callbacks, before
        the reporting ones (and any added later). Returns ``self``."""
        handler = trainer.callback_handler
        callbacks = [c for c in handler.callbacks if not isinstance(c, GpumonCallback)]
        # The Trainer's defaults (transformers.trainer.DEFAULT_CALLBACKS, importable only with
        # torch) are DefaultFlowCallback alone; reporters follow it.
        index = 0
        for i, c in enumerate(callbacks):
            if isinstance(c, DefaultFlowCallback):
                index = i + 1
        callbacks.insert(index, self)
        handler.callbacks = callbacks
        self._handler = handler
        return self

    # -- TrainerCallback ------------------------------------------------------------------------

    def _move_before_reporters(self) -> None:
        """``Trainer(callbacks=[...])`` and ms-swift's ``extra_callbacks`` add the callback after
        the reporters, which would then log before it adds the figures. The handler calling us
        is the caller's ``self`` (``CallbackHandler.call_event``); ``attach`` swaps in a new
        list, so the call in progress keeps iterating the old one."""
        frame = sys._getframe(1)
        for _ in range(4):  # on_train_begin <- call_event (<- on_train_begin of the handler)
            frame = frame.f_back
            if frame is None:
                return
            handler = frame.f_locals.get("self")
            if isinstance(handler, CallbackHandler):
                if self in handler.callbacks:
                    self.attach(types.SimpleNamespace(callback_handler=handler))
                return

    def on_train_begin(self, args, state, control, **kwargs):
        self._move_before_reporters()
        job = getattr(args, "run_name", None) or "train"
        local_rank = getattr(args, "local_rank", None)
        if local_rank is None:  # not TrainingArguments: the launcher's variable
            env = os.environ.get("LOCAL_RANK", "").strip()
            local_rank = int(env) if env.isdigit() else None
        rank = int(local_rank) if isinstance(local_rank, int) and local_rank >= 0 else None
        n_gpu = getattr(args, "_n_gpu", None) or 1  # `args.n_gpu` would set up devices itself
        device = getattr(args, "__dict__", {}).get("device")  # a cached torch.device, if any
        if device is None and hasattr(type(args), "device"):
            try:
                device = args.device
            except Exception:  # no torch or no accelerator: the rank's GPU
                device = None
        index = device.index if getattr(device, "type", None) == "cuda" else None
        self._marker.begin(str(job), rank, int(state.global_step or 0), own_devices(index, rank, int(n_gpu)))

    def on_step_end(self, args, state, control, **kwargs):
        self._marker.mark(int(state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        step = int(state.global_step)
        # The run summary log ("train_runtime", just before on_train_end) is at the last step too.
        reading = self._marker.read(step)
        if reading.step is not None and reading.step != step:
            # A sample that failed or lagged: figures of another step must not sit at this one.
            reading.figures.clear()
        figures = reading.figures
        if not figures:
            return
        logs.update(figures)
        # Trainer.log appended {**logs, "step": global_step} to log_history before calling the
        # callbacks; the figures belong in that entry too.
        history = getattr(state, "log_history", None)
        if history and isinstance(history[-1], dict) and history[-1].get("step") == state.global_step:
            history[-1].update(figures)
        for finding in reading.findings:
            self._write_text(finding, step)

    def _write_text(self, finding: Finding, step: int) -> None:
        """A finding's text in TensorBoard, when the Trainer reports there."""
        for c in getattr(self._handler, "callbacks", ()):
            writer = getattr(c, "tb_writer", None)
            if writer is not None and hasattr(writer, "add_text"):
                try:
                    writer.add_text("gpu/findings", finding.text, step)
                except Exception as e:
                    _log.warning("gpumon: finding not written to TensorBoard: %s", e)

    def on_train_end(self, args, state, control, **kwargs):
        self._marker.end()

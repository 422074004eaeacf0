"""Hugging Face ``transformers`` integration: a ``TrainerCallback`` that marks steps and adds
the GPU figures to the Trainer's logs.

::

    from gpumon.integrations.transformers import GpumonCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    GpumonCallback(every_n_steps=10).attach(trainer)
    trainer.train()

``attach`` places the callback before the reporting callbacks (TensorBoard, W&B, ...): the
Trainer calls callbacks in order and hands each the same ``logs`` dict, so figures added there
reach every reporter through the Trainer's own reporting. ``trainer.add_callback`` would put it
last, after the reporters have already written the logs.

ms-swift runs on the Hugging Face Trainer, so the same callback works there.
"""

import logging
from typing import Any, Dict, Optional, Union

from transformers import TrainerCallback
from transformers.trainer_callback import DefaultFlowCallback

from .. import Monitor, StepClient

__all__ = ["GpumonCallback", "gpu_figures"]

_log = logging.getLogger("gpumon")


def gpu_figures(snapshot: Dict[str, Any], prefix: str = "gpu") -> Dict[str, float]:
    """Flat ``{"gpu0/utilization": 0.93, ...}`` figures from a ``Monitor.snapshot()`` dict:
    per device utilisation (0..1), memory used (bytes), power (watts), temperature (°C); and,
    once steps are marked, the last step's duration and per-GPU step figures."""
    out: Dict[str, float] = {}
    for d in snapshot.get("devices", []):
        info = d.get("info", {})
        key = f"{prefix}{info.get('index', '?')}"
        if info.get("mig"):
            key += f"_mig{info['mig'].get('mig_index', '?')}"
        util = (d.get("utilization") or {}).get("gpu")
        if util is not None:
            out[f"{key}/utilization"] = float(util)
        mem = (d.get("memory") or {}).get("used")
        if mem is not None:
            out[f"{key}/memory_used_bytes"] = float(mem)
        power = (d.get("power") or {}).get("usage_watts")
        if power is not None:
            out[f"{key}/power_watts"] = float(power)
        temp = (d.get("temperature") or {}).get("gpu")
        if temp is not None:
            out[f"{key}/temperature_celsius"] = float(temp)
    # The last reported step's figures (Monitor.step), per GPU by UUID.
    index_of = {(d.get("info") or {}).get("uuid"): (d.get("info") or {}).get("index") for d in snapshot.get("devices", [])}
    for run in (snapshot.get("steps") or {}).get("runs", []):
        last = run.get("last")
        if not last:
            continue
        if last.get("duration") is not None:
            out["gpumon/step_duration_seconds"] = float(last["duration"])
        for d in last.get("devices", []):
            key = f"{prefix}{index_of.get(d.get('uuid'), d.get('uuid'))}"
            for field in ("utilization_mean", "utilization_max", "memory_peak_bytes", "energy_joules"):
                if d.get(field) is not None:
                    out[f"{key}/step_{field}"] = float(d[field])
    return out


class GpumonCallback(TrainerCallback):
    """Marks every ``every_n_steps``-th step and adds GPU figures to the Trainer's logs.

    :param monitor_or_client: a :class:`gpumon.Monitor` (marks steps and supplies the figures),
        a :class:`gpumon.StepClient` (marks steps on the node's agent; the figures are the
        agent's, so none are added to the logs), or ``None``: a ``Monitor`` is started at
        ``on_train_begin`` with the job named after ``args.run_name`` and closed at
        ``on_train_end``.
    :param every_n_steps: mark every N-th step (the logs get figures at every ``on_log``).
    """

    def __init__(self, monitor_or_client: Optional[Union[Monitor, StepClient]] = None, every_n_steps: int = 1):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps: {every_n_steps!r} is not a positive int")
        if monitor_or_client is not None and not hasattr(monitor_or_client, "step"):
            raise TypeError("monitor_or_client: expected a gpumon.Monitor, a gpumon.StepClient or None")
        self.every_n_steps = every_n_steps
        self._target = monitor_or_client
        self._owned = False
        self._last_marked: Optional[int] = None

    @property
    def target(self) -> Optional[Union[Monitor, StepClient]]:
        """The Monitor or StepClient steps are marked on."""
        return self._target

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
        return self

    # -- TrainerCallback ------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if self._target is None:
            job = getattr(args, "run_name", None) or "train"
            self._target = Monitor(job=str(job))
            self._owned = True

    def on_step_end(self, args, state, control, **kwargs):
        step = int(state.global_step)
        if self._target is None or step % self.every_n_steps != 0:
            return
        if self._last_marked is not None and step <= self._last_marked:
            return  # a resumed or re-entered loop: never mark a step twice
        self._last_marked = step
        self._target.step(step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not isinstance(self._target, Monitor) or self._target.closed:
            return
        try:
            logs.update(gpu_figures(self._target.snapshot()))
        except Exception as e:  # a failed sample must not stop training
            _log.warning("no GPU figures for this log: %s", e)

    def on_train_end(self, args, state, control, **kwargs):
        if self._owned and self._target is not None:
            self._target.close()
            self._target = None
            self._owned = False

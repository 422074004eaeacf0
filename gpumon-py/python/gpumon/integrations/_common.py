"""What the framework callbacks share: which Monitor they mark on, the step numbering across
several ``fit`` / ``train`` calls, and the figures they log. Imports no framework."""

import logging
import os
from typing import Any, Dict, Optional, Tuple, Union

from .. import BackendUnavailableError, Monitor, StepClient
from ..client import STEPS_SOCKET_ENV
from ..figures import step_figures

_log = logging.getLogger("gpumon")

BACKENDS = ("auto", "nvml", "mock")


class StepMarker:
    """Marks a framework's global step on a Monitor or StepClient and finds the figures to log.

    - Under ``gpumon-agent run`` (``GPUMON_STEPS_SOCKET`` set) with ``backend="auto"`` and no
      Monitor given, the callback marks its steps on that agent's socket (a StepClient): the
      agent samples the GPUs, and no second sampler runs in the job.
    - ``backend="auto"`` (no Monitor given): the callback starts a Monitor on NVML; without
      NVML it logs no GPU figures and says so once — simulated figures only with
      ``backend="mock"``, and then every key says ``mock_gpu``.
    - A second training loop on the same Monitor numbers its steps from 0 again; a tracker's run
      only counts up, so its marks continue from the last one (``offset``) and the logged
      ``gpu/step`` is in the loop's own numbering.
    """

    def __init__(
        self,
        monitor_or_client: Optional[Union[Monitor, StepClient]],
        every_n_steps: int,
        per_gpu: bool,
        backend: str,
    ):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps: {every_n_steps!r} is not a positive int")
        if monitor_or_client is not None and not hasattr(monitor_or_client, "step"):
            raise TypeError("monitor_or_client: expected a gpumon.Monitor, a gpumon.StepClient or None")
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
        if monitor_or_client is not None and backend != "auto":
            raise ValueError("backend: only without a monitor_or_client (the callback's own Monitor)")
        self.every_n_steps = every_n_steps
        self.per_gpu = bool(per_gpu)
        self.backend = backend
        self.target = monitor_or_client
        self.owned = False
        # The loop's step 0 is the tracker's step `offset`.
        self.offset = 0
        # Last tracker step marked by this callback.
        self.last_marked: Optional[int] = None
        # Last figures' step logged (loop numbering), so each step's figures are logged once.
        self.last_logged: Optional[int] = None
        self._warned_unavailable = False
        self._flushed_mark: Optional[int] = None

    # -- lifecycle ------------------------------------------------------------------------------

    def begin(self, job: str, rank: Optional[int], loop_step: int) -> None:
        """A training loop starts at ``loop_step`` (0, or the step it resumes from)."""
        if self.target is None:
            self._start_owned(job, rank)
        self.last_logged = None
        self._flushed_mark = None
        last = self._tracker_last()
        if last is not None and loop_step <= last:
            self.offset = last - loop_step
            _log.info(
                "gpumon: this training loop starts at step %d but the Monitor's run already marked step %d; "
                "its marks continue as step %d + the loop's step (the logged gpu/step stays the loop's)",
                loop_step, last, self.offset,
            )
        else:
            self.offset = 0

    def _start_owned(self, job: str, rank: Optional[int]) -> None:
        socket_path = os.environ.get(STEPS_SOCKET_ENV, "").strip()
        if self.backend == "auto" and socket_path:
            self.target = StepClient(socket_path, job=job, rank=rank)
            self.owned = True
            self.last_marked = None
            return
        backend = "nvml" if self.backend == "auto" else self.backend
        try:
            self.target = Monitor(backend=backend, job=job, rank=rank)
        except BackendUnavailableError as e:
            if not self._warned_unavailable:
                _log.warning(
                    "gpumon: NVML is unavailable (%s): no GPU figures are logged and no steps marked; "
                    "backend='mock' logs simulated figures (keys mock_gpu/...)", e,
                )
                self._warned_unavailable = True
            self.target = None
            return
        self.owned = True
        self.last_marked = None

    def _tracker_last(self) -> Optional[int]:
        if isinstance(self.target, Monitor):
            return self.target.last_step
        return self.last_marked

    def flush(self) -> None:
        """Reports every step marked so far now (a sample and the sinks' flush), without
        stopping; a failure is logged, never raised into the training loop."""
        if not isinstance(self.target, Monitor) or self.target.closed:
            return
        if self.last_marked is not None and self.last_marked == self._flushed_mark:
            return  # nothing marked since the last flush (on_log's, then on_train_end's)
        self._flushed_mark = self.last_marked
        try:
            self.target.flush()
        except Exception as e:
            _log.warning("gpumon: flush incomplete: %s", e)

    def end(self) -> None:
        """The loop ended: report every step marked (a final sample) and flush the sinks; close
        the callback's own Monitor."""
        if self.target is None:
            return
        if self.owned:
            self.target.close()
            self.target = None
            self.owned = False
        else:
            self.flush()

    # -- per step -------------------------------------------------------------------------------

    def mark(self, loop_step: int) -> None:
        if self.target is None or loop_step % self.every_n_steps != 0:
            return
        n = loop_step + self.offset
        if self.last_marked is not None and n <= self.last_marked:
            return  # a re-entered loop: never mark a step twice
        self.last_marked = n
        try:
            self.target.step(n)
        except ValueError as e:
            # Someone else marked on the same Monitor: not worth failing the training for.
            _log.warning("gpumon: step %d not marked: %s", n, e)

    def figures(self) -> Tuple[Optional[int], Dict[str, float]]:
        """The newest step's figures not logged yet: ``(loop step, {key: value})``, or
        ``(None, {})``. A StepClient has none (its figures are the node agent's)."""
        m = self.target
        if not isinstance(m, Monitor) or m.closed:
            return None, {}
        try:
            snap: Dict[str, Any] = m.snapshot()
        except Exception as e:  # a failed sample must not stop training
            _log.warning("gpumon: no GPU figures for this log: %s", e)
            return None, {}
        step, figs = step_figures(snap, job=m.job, rank=m.rank, per_gpu=self.per_gpu, offset=self.offset)
        if step is None or (self.last_logged is not None and step <= self.last_logged):
            return None, {}
        self.last_logged = step
        return step, figs

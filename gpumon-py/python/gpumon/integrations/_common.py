"""What the framework callbacks share: which Monitor they mark on and which GPUs it watches, the
step numbering across several ``fit`` / ``train`` calls, the figures they log at a trainer's log
and the findings of the diagnosis. Imports no framework."""

import logging
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from .. import BackendUnavailableError, Monitor, StepClient
from ..client import STEPS_SOCKET_ENV
from ..figures import prefix_for, step_figures

_log = logging.getLogger("gpumon")

BACKENDS = ("auto", "nvml", "mock")

#: What ``devices=`` takes: Monitor's syntax (``0``, ``"0,2"``, ``[0, 2]``, UUIDs, ``"all"``).
Devices = Union[None, int, str, Sequence[Union[int, str]]]


def own_devices(device_index: Optional[int], local_rank: Optional[int], n_gpu: int = 1) -> Devices:
    """The GPUs a training process drives, as ``Monitor(devices=)`` takes them: the CUDA device
    its framework put it on (``cuda:k`` is entry ``k`` of ``CUDA_VISIBLE_DEVICES``, or GPU ``k``
    when the variable is unset); without one (a CPU run), the local rank's entry, else the first
    visible GPU. ``None`` (every visible GPU) when the process drives several at once
    (``torch.nn.DataParallel``: the Hugging Face Trainer with ``n_gpu > 1``), or when the
    environment has no entry for it (the Monitor then applies, and explains, its own rule)."""
    if n_gpu > 1:
        return None
    index = device_index if device_index is not None else (local_rank if local_rank is not None and local_rank >= 0 else 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    return entries[index] if index < len(entries) else None


class Finding(NamedTuple):
    """A finding of the diagnosis raised or cleared, as a callback logs it."""

    raised: bool
    kind: str
    gpu: Optional[int]
    text: str


def finding_of(event: Dict[str, Any]) -> Finding:
    """One event of ``Monitor.finding_events()`` in a logger's words."""
    raised = event.get("transition") == "raised"
    f = event.get("finding") or {}
    kind = str(f.get("kind", "unknown"))
    gpu = f.get("gpu")
    where = f"GPU {gpu}" if gpu is not None else "the host"
    if raised:
        text = f"raised on {where}: {kind} ({f.get('severity', '?')}) - {f.get('evidence', '')}. {f.get('advice', '')}"
    else:
        held = event.get("held_for")
        if isinstance(held, dict):
            # The agent's JSON of a Rust Duration: {"secs": s, "nanos": n}.
            held = held.get("secs", 0) + held.get("nanos", 0) / 1e9
        held_text = f" after {held:.0f} s" if isinstance(held, (int, float)) else ""
        text = f"cleared on {where}{held_text}: {kind} - {f.get('evidence', '')}"
    return Finding(raised, kind, gpu, text.strip())


class Reading(NamedTuple):
    """What a callback logs at one of the trainer's logs: the step the figures describe (the
    loop's numbering; ``None`` without figures), the figures, the findings raised or cleared
    since the last reading, and their numbers as keys (``gpu/findings``: active now;
    ``gpu/finding/<kind>``: 1 raised, 0 cleared)."""

    step: Optional[int]
    figures: Dict[str, float]
    findings: List[Finding]


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
        devices: Devices = None,
    ):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps: {every_n_steps!r} is not a positive int")
        if monitor_or_client is not None and not hasattr(monitor_or_client, "step"):
            raise TypeError("monitor_or_client: expected a gpumon.Monitor, a gpumon.StepClient or None")
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
        if monitor_or_client is not None and backend != "auto":
            raise ValueError("backend: only without a monitor_or_client (the callback's own Monitor)")
        if monitor_or_client is not None and devices is not None:
            raise ValueError("devices: only without a monitor_or_client (the Monitor given watches its own)")
        self.devices = devices
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
        # Of the last snapshot read: its key prefix and how many findings were active.
        self._prefix: Optional[str] = None
        self._active: Optional[int] = None

    # -- lifecycle ------------------------------------------------------------------------------

    def begin(self, job: str, rank: Optional[int], loop_step: int, own: Devices = None) -> None:
        """A training loop starts at ``loop_step`` (0, or the step it resumes from). ``own``: the
        GPUs the process drives (:func:`own_devices`), which the callback's own Monitor watches
        unless ``devices=`` was given."""
        if self.target is None:
            self._start_owned(job, rank, self.devices if self.devices is not None else own)
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

    def _start_owned(self, job: str, rank: Optional[int], devices: Devices) -> None:
        socket_path = os.environ.get(STEPS_SOCKET_ENV, "").strip()
        if self.backend == "auto" and socket_path:
            self.target = StepClient(socket_path, job=job, rank=rank, gpu=devices)
            self.owned = True
            self.last_marked = None
            return
        backend = "nvml" if self.backend == "auto" else self.backend
        try:
            self.target = Monitor(backend=backend, job=job, rank=rank, devices=devices)
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

    def mark(self, loop_step: int, logged: bool = False) -> None:
        """Marks the loop's step ``loop_step`` when it is an ``every_n_steps``-th one, or when the
        trainer logs it (``logged``: its figures are about to be read)."""
        if self.target is None or (loop_step % self.every_n_steps != 0 and not logged):
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

    def read(self, loop_step: Optional[int]) -> Reading:
        """What to log at the trainer's log of ``loop_step`` (``None``: the newest step marked).

        The step is marked if it was not, and the Monitor samples at once (``flush``): the step
        tracker reports every step marked so far, so the figures are those of ``loop_step``
        itself, not of a step or two before — a trainer's logger shows them on the step they
        describe. The cost is one sample per log (the trainer's logging interval, not per step).
        Findings raised or cleared since the last reading come with them."""
        if loop_step is not None:
            self.mark(loop_step, logged=True)
        self.flush()
        step, figures = self.figures()
        findings = self._findings(figures)
        return Reading(step, figures, findings)

    def _findings(self, figures: Dict[str, float]) -> List[Finding]:
        m = self.target
        if not isinstance(m, Monitor) or m.closed or not m.diagnose:
            return []
        try:
            events = m.finding_events()
        except Exception as e:  # never into the training loop
            _log.warning("gpumon: findings not read: %s", e)
            return []
        p = self._prefix or "gpu"
        found = [finding_of(e) for e in events]
        for f in found:
            _log.warning("gpumon: finding %s", f.text)
            figures[f"{p}/finding/{f.kind}"] = 1.0 if f.raised else 0.0
        if self._active is not None:
            figures[f"{p}/findings"] = float(self._active)
        return found

    def figures(self) -> Tuple[Optional[int], Dict[str, float]]:
        """The newest step's figures not logged yet: ``(loop step, {key: value})``, or
        ``(None, {})``. A StepClient has none (its figures are the node agent's)."""
        m = self.target
        self._active = None
        if not isinstance(m, Monitor) or m.closed:
            return None, {}
        try:
            snap: Dict[str, Any] = m.snapshot()
        except Exception as e:  # a failed sample must not stop training
            _log.warning("gpumon: no GPU figures for this log: %s", e)
            return None, {}
        self._prefix = prefix_for(snap)
        diagnosis = snap.get("diagnosis")
        if isinstance(diagnosis, dict):
            self._active = len(diagnosis.get("active") or [])
        step, figs = step_figures(snap, job=m.job, rank=m.rank, per_gpu=self.per_gpu, offset=self.offset)
        if step is None or (self.last_logged is not None and step <= self.last_logged):
            return None, {}
        self.last_logged = step
        return step, figs

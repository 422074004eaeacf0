"""``StepClient``: step marks to a running gpumon agent over its steps socket."""

import atexit
import json
import logging
import os
import select
import socket
import time
import weakref
from typing import Dict, Optional, Sequence, Tuple, Union

from ._gpumon import DEFAULT_JOB, _check_run, _check_step, _steps_gpu

__all__ = ["StepClient", "STEPS_SOCKET_ENV"]

#: The environment variable ``gpumon-agent run`` sets to its steps socket's path: a StepClient
#: created without a path, and the trainer callbacks created without a Monitor, use it.
STEPS_SOCKET_ENV = "GPUMON_STEPS_SOCKET"

_log = logging.getLogger("gpumon")

# The agent drops lines longer than this (the socket protocol's bound).
_MAX_LINE = 1024
# Bytes a client keeps when the agent reads slower than marks arrive; beyond, marks are dropped
# (counted in ``dropped``) rather than blocking the training loop.
_MAX_PENDING = 64 * 1024
# How long closing a client (also at interpreter exit) may wait for the agent to take the marks
# still pending: a loop that marks a burst of steps and exits has them reported.
_DRAIN_SECONDS = 2.0

# Connected clients: at interpreter exit each writes out its pending marks, as close() does.
_connected: "weakref.WeakSet[StepClient]" = weakref.WeakSet()

# Per (socket, job, rank) in this process: the last step marked and the run segment it was in.
# A client whose numbering starts again at or below that step (a second ``train()`` / ``fit()``,
# whose callback makes a new client) starts the next segment instead of having its marks
# refused by the agent as "not increasing".
_segments: Dict[Tuple[str, str, Optional[int]], Tuple[int, int]] = {}


@atexit.register
def _close_all() -> None:
    for client in list(_connected):
        client.close()


class StepClient:
    """Sends step marks to ``gpumon-agent --steps-socket PATH`` (a Unix stream socket).

    Each mark is one line, ``{"job": "train", "rank": 1, "gpu": "5", "step": 42}``: ``gpu`` is
    the physical GPU the rank drives, resolved from the environment exactly as ``Monitor`` chooses
    its GPUs — entry ``rank`` of ``CUDA_VISIBLE_DEVICES`` (``torch.cuda.set_device(local_rank)``'s
    device; an index, a ``GPU-`` UUID or a ``MIG-`` id as written there), GPU ``rank`` when the
    variable is unset, and without a rank what ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``
    make visible. The agent attributes the run's steps, their figures and its diagnosis to that
    GPU; under ``CUDA_VISIBLE_DEVICES=4,5`` rank 1 is GPU 5, not GPU 1. An environment that gives
    the rank no GPU (``CUDA_VISIBLE_DEVICES=""``, fewer entries than ranks) is logged once and the
    marks name no GPU (``"gpu": "none"``: steps counted, no GPU's figures). The client keeps one
    connection, never blocks the caller (the socket is non-blocking; marks that cannot be sent
    are dropped and counted in :attr:`dropped`) and reconnects on the next mark after the agent
    restarts. Only bad input raises, and it raises exactly where ``Monitor`` does (the same
    checks, in the extension): a job name the agent would refuse (empty, over 128 bytes, with a
    control character), a rank outside 0 to 2**32 - 1 or a step outside 0 to 2**64 - 2 is an
    error here, not a mark the agent drops.

    **Run segments.** A second client of the same socket, job and rank in one process whose
    numbering starts again (a second ``trainer.train()`` / ``trainer.fit()``: the callbacks make a
    new client per run, numbering from 1) reports under the job ``"<job>#2"`` (then ``#3``, …):
    a run segment of its own in the agent and in ``gpumon-run``'s report. None of its marks is
    refused, and the time between the two runs is no step (a segment's first mark starts it).
    :attr:`segment` says which segment the client marks in.

    The agent reads the connection's credentials from the kernel: a run (``job``, ``rank``)
    belongs to the Unix user whose marks registered it, and another user's marks for it are
    dropped (counted as ``not_owner`` in ``gpumon_steps_rejected_total``). A run with no mark for
    the agent's ``[steps] idle_timeout`` (default 1 h) is forgotten; the next mark registers it
    again.

    :param path: the agent's steps socket (default: ``GPUMON_STEPS_SOCKET`` from the environment,
        which ``gpumon-agent run -- CMD`` sets for CMD).
    :param job: the job name the marks are reported under.
    :param rank: the rank, or ``None`` (default: ``LOCAL_RANK`` from the environment, if set).
    :param gpu: the physical GPU(s) the marks are about, as ``Monitor``'s ``devices=`` takes them
        (``5``, ``"GPU-8f1e…"``, ``[4, 5]``, ``"all"`` for none in particular); default: from the
        environment, as above. Indices are NVML's (``nvidia-smi``'s); inside a container whose
        GPUs the agent outside sees under other indices, give UUIDs.
    """

    def __init__(
        self,
        path: Optional[Union[str, "os.PathLike[str]"]] = None,
        job: str = DEFAULT_JOB,
        rank: Optional[int] = None,
        gpu: Union[None, int, str, Sequence[Union[int, str]]] = None,
    ):
        if path is None:
            path = os.environ.get(STEPS_SOCKET_ENV, "").strip()
            if not path:
                raise ValueError(f"path: none given and {STEPS_SOCKET_ENV} is not set (gpumon-agent run sets it)")
        self._path = os.fspath(path)
        # Monitor's checks (the step tracker's rule for job names; rank None: LOCAL_RANK).
        job, rank = _check_run(job, rank)
        self._job = job
        self._rank = rank
        if gpu is not None:
            resolved = _steps_gpu(rank, gpu)
        else:
            try:
                resolved = _steps_gpu(rank)
            except ValueError as e:
                # A Monitor would refuse to start; a client only loses the GPU attribution, which
                # must not stop training.
                _log.warning("StepClient: %s; the marks name no GPU", e)
                resolved = "none"
        self._gpu = resolved
        # The line without its step: the JSON for job, rank and GPU is made once.
        fields = {"job": job, "rank": rank}
        if resolved is not None:
            fields["gpu"] = resolved
        prefix = json.dumps(fields, separators=(",", ":"))
        self._prefix = prefix[:-1] + ',"step":'
        if len(self._prefix) + 22 > _MAX_LINE:
            raise ValueError(f"job, gpu: too long (a mark must fit in {_MAX_LINE} bytes)")
        self._fields = fields
        self._segment = 1
        self._sock: Optional[socket.socket] = None
        self._pending = b""
        self._last: Optional[int] = None
        self._pid = os.getpid()
        self._warned = False
        #: Marks that could not be sent (no agent, or the agent not keeping up).
        self.dropped = 0

    @property
    def path(self) -> str:
        """The agent's steps socket."""
        return self._path

    @property
    def job(self) -> str:
        """The job name marks are reported under."""
        return self._job

    @property
    def rank(self) -> Optional[int]:
        """The rank marks are reported under."""
        return self._rank

    @property
    def gpu(self) -> Optional[str]:
        """The physical GPUs the marks name (``CUDA_VISIBLE_DEVICES`` syntax: ``"5"``,
        ``"GPU-…"``), or ``None`` when nothing narrows them (every GPU)."""
        return self._gpu

    def step(self, n: int) -> None:
        """Marks the end of training step ``n`` (the last completed step).

        Raises ``TypeError`` when ``n`` is not an int (a bool is not a step number),
        ``ValueError`` when it is negative, above 2**64 - 2 or not above the last step marked
        (as ``Monitor.step``); never raises for a missing or slow agent (the mark is dropped and
        counted).
        """
        n = _check_step(n)
        if self._last is not None and n <= self._last:
            raise ValueError(f"step: {n} is not after the last step marked ({self._last}); steps must increase")
        key = (self._path, self._job, self._rank)
        if self._last is None:
            before = _segments.get(key)
            if before is not None and n <= before[0]:
                self._start_segment(before[1] + 1)
            elif before is not None:
                self._segment = before[1]
        self._last = n
        _segments[key] = (n, self._segment)
        self._send((self._prefix + str(n) + "}\n").encode())

    @property
    def segment(self) -> int:
        """The run segment this client marks in: 1, or 2, 3, … for a later run of the same job
        and rank in this process that numbered from the start again (job ``"<job>#<segment>"``)."""
        return self._segment

    def _start_segment(self, segment: int) -> None:
        self._segment = segment
        fields = dict(self._fields, job=f"{self._job}#{segment}")
        prefix = json.dumps(fields, separators=(",", ":"))
        self._prefix = prefix[:-1] + ',"step":'
        _log.info(
            "StepClient: job %r rank %r numbers its steps from the start again: run segment %d (job %r)",
            self._job, self._rank, segment, fields["job"],
        )

    def close(self) -> None:
        """Writes out the marks still pending — waiting at most 2 s for the agent to take them;
        those it does not are counted in :attr:`dropped` — and closes the connection (a later
        ``step`` reconnects). Done for every connected client at interpreter exit too, so a loop
        that marks a burst of steps just before it exits loses none of them silently."""
        if self._sock is None:
            return
        try:
            if self._pid == os.getpid():
                self._drain(time.monotonic() + _DRAIN_SECONDS)
            self._sock.close()
        finally:
            self._sock = None
            self._pending = b""
            _connected.discard(self)

    def _drain(self, deadline: float) -> None:
        """Sends what is pending until ``deadline``; counts the lines left unsent as dropped."""
        assert self._sock is not None
        while self._pending:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not select.select([], [self._sock], [], left)[1]:
                    break
                sent = self._sock.send(self._pending)
            except BlockingIOError:
                continue
            except OSError:
                break
            self._pending = self._pending[sent:]
        # Lines stay whole in `_pending` but for the first, which may have been sent in part.
        self.dropped += self._pending.count(b"\n")

    def __enter__(self) -> "StepClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StepClient(path={self._path!r}, job={self._job!r}, rank={self._rank!r}, gpu={self._gpu!r})"

    def _connect(self) -> Optional[socket.socket]:
        if self._pid != os.getpid():
            # A forked child shares the parent's connection: interleaved writes would corrupt
            # both streams. The child opens its own.
            self._sock, self._pending, self._pid = None, b"", os.getpid()
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self._path)
            except OSError as e:
                s.close()
                self._warn(f"steps socket {self._path}: {e}")
                return None
            s.setblocking(False)
            self._sock = s
            self._warned = False
            _connected.add(self)
        return self._sock

    def _send(self, line: bytes) -> None:
        sock = self._connect()
        if sock is None:
            self.dropped += 1
            return
        if len(self._pending) + len(line) > _MAX_PENDING:
            self.dropped += 1
            line = b""
        data = self._pending + line
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            # The agent went away: drop what was queued, reconnect on the next mark.
            self.dropped += 1 + self._pending.count(b"\n")
            self.close()
            self._warn(f"steps socket {self._path}: {e}")
            return
        # A partial write leaves the rest of the line for the next call, so lines stay whole.
        self._pending = data[sent:]

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("%s; step marks are dropped until the agent is reachable", message)

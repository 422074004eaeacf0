"""gpumon: watch NVIDIA GPUs from a training loop.

``Monitor`` runs gpumon's agent (written in Rust) in background threads of its own: it samples
the GPUs, exports to Prometheus / InfluxDB / OTLP, and turns ``step(n)`` marks into per-step
GPU figures, and diagnoses its GPUs (``diagnose=True``: ``finding_events()``, ``report()``).
``StepClient`` sends the same marks to an agent already running on the node
(``gpumon-agent --steps-socket PATH``).

Importing ``gpumon`` imports nothing heavy (no ``transformers``, no ``torch``); the trainer
integrations live in ``gpumon.integrations.transformers`` (Hugging Face, ms-swift) and
``gpumon.integrations.lightning`` (PyTorch Lightning); ``gpumon.figures`` turns a snapshot into
per-step figures. Logs go to the ``logging`` logger ``"gpumon"``; nothing is printed.

The distribution is ``gpumon-nvml`` (not published on PyPI yet: install the wheel that
``gpumon-py/build-wheel.sh`` builds, or build from source with Rust 1.88+); ``gpumon`` on PyPI is an
unrelated tool that also installs a top-level ``gpumon`` package, so the two cannot be installed
in one environment.
"""

import atexit as _atexit

from ._gpumon import (
    DEFAULT_JOB,
    BackendUnavailableError,
    GpumonError,
    Monitor,
    __version__,
)
from ._gpumon import _atexit as _close_all
from .client import StepClient
from . import figures

__all__ = [
    "Monitor",
    "StepClient",
    "GpumonError",
    "BackendUnavailableError",
    "DEFAULT_JOB",
    "figures",
    "__version__",
]

# An interpreter that exits with a Monitor still open: close it (flushing its sinks, at most a
# few seconds) while the interpreter is whole, then stop handing log records to Python.
_atexit.register(_close_all)

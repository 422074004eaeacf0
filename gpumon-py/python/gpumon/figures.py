"""Per-step GPU figures as flat ``{key: number}`` dicts, for the loggers of training frameworks.

Every dict says which step it describes: ``gpu/step`` is that step's number. The figures come
from the step tracker (``Monitor.step(n)``): a step's figures exist once the agent has read its
mark, at the first sample taken after it — so at the moment a trainer logs step ``N`` they are
usually those of an earlier step, and ``gpu/step`` says which. Never another step's figures
under the wrong number:

- **steps longer than the interval**: each step is read at the first tick after it ends; its
  figures come from the samples taken during it plus that one.
- **steps shorter than the interval**: several steps end between two ticks and share the
  figures of the sample that covers them (and the mean duration); ``gpu/step`` is the last of
  them.

Keys (``p`` is ``gpu``, or ``mock_gpu`` when the Monitor runs on the mock backend, so simulated
figures can never pass for real ones in TensorBoard, W&B or a log file):

- compact (the default): ``p/step``, ``p/step_seconds``, ``p/utilization`` (mean over the GPUs
  of each GPU's mean utilisation during the step, 0..1), ``p/utilization_min`` (the least busy
  GPU's), ``p/memory_peak_gib`` (the largest peak over the GPUs), and ``p/energy_joules`` (all
  GPUs, when every GPU has an energy counter);
- with ``per_gpu=True`` also, per GPU ``i`` (``p{i}``, MIG instances ``p{i}_mig{j}``):
  ``/utilization``, ``/utilization_max``, ``/memory_peak_bytes``, ``/energy_joules``.
"""

from typing import Any, Dict, Optional, Tuple

__all__ = ["step_figures", "prefix_for"]

GIB = float(1 << 30)


def prefix_for(snapshot: Dict[str, Any], prefix: str = "gpu") -> str:
    """``prefix``, or ``"mock_" + prefix`` when the snapshot is simulated (the mock backend)."""
    backend = (snapshot.get("system") or {}).get("backend")
    return f"mock_{prefix}" if backend == "mock" else prefix


def _device_keys(snapshot: Dict[str, Any], prefix: str) -> Dict[str, str]:
    """UUID -> ``gpu3`` / ``gpu0_mig1`` key stem, from the snapshot's devices."""
    keys: Dict[str, str] = {}
    for d in snapshot.get("devices", []):
        info = d.get("info") or {}
        stem = f"{prefix}{info.get('index', '?')}"
        mig = info.get("mig")
        if mig:
            stem += f"_mig{mig.get('mig_index', '?')}"
        if info.get("uuid"):
            keys[info["uuid"]] = stem
    return keys


def _find_run(snapshot: Dict[str, Any], job: Optional[str], rank: Optional[int]) -> Optional[Dict[str, Any]]:
    runs = (snapshot.get("steps") or {}).get("runs") or []
    if job is None:
        return runs[0] if runs else None
    for run in runs:
        if run.get("job") == job and run.get("rank") == rank:
            return run
    return None


def step_figures(
    snapshot: Dict[str, Any],
    job: Optional[str] = None,
    rank: Optional[int] = None,
    per_gpu: bool = False,
    offset: int = 0,
    prefix: str = "gpu",
) -> Tuple[Optional[int], Dict[str, float]]:
    """The figures of the last step the agent reported for the run ``(job, rank)`` (the first
    run when ``job`` is None) in a ``Monitor.snapshot()`` dict.

    Returns ``(step, figures)``: the step they describe, in the caller's numbering (the
    tracker's step number minus ``offset``, for a loop that numbers steps from 0 again on a
    Monitor that already marked some), and the flat dict; ``(None, {})`` when no step of
    this numbering has been reported yet.

    >>> snap = {"system": {"backend": "nvml"},
    ...         "devices": [{"info": {"index": 0, "uuid": "GPU-a"}}],
    ...         "steps": {"runs": [{"job": "train", "rank": None, "last": {"step": 7, "duration": 0.5,
    ...             "devices": [{"uuid": "GPU-a", "utilization_mean": 0.9, "utilization_max": 1.0,
    ...                          "memory_peak_bytes": 2147483648, "energy_joules": 150.0}]}}]}}
    >>> step, figs = step_figures(snap)
    >>> step, figs["gpu/step"], figs["gpu/utilization"], figs["gpu/memory_peak_gib"]
    (7, 7.0, 0.9, 2.0)
    """
    run = _find_run(snapshot, job, rank)
    last = (run or {}).get("last")
    if not last or last.get("step") is None:
        return None, {}
    step = int(last["step"]) - offset
    if step < 0 or (offset and step == 0):
        return None, {}  # a step of an earlier loop on the same Monitor (its last is `offset`)
    p = prefix_for(snapshot, prefix)
    out: Dict[str, float] = {f"{p}/step": float(step)}
    if last.get("duration") is not None:
        out[f"{p}/step_seconds"] = float(last["duration"])
    devices = last.get("devices") or []
    utils = [float(d["utilization_mean"]) for d in devices if d.get("utilization_mean") is not None]
    if utils:
        out[f"{p}/utilization"] = sum(utils) / len(utils)
        out[f"{p}/utilization_min"] = min(utils)
    peaks = [int(d["memory_peak_bytes"]) for d in devices if d.get("memory_peak_bytes") is not None]
    if peaks:
        out[f"{p}/memory_peak_gib"] = max(peaks) / GIB
    energy = [d.get("energy_joules") for d in devices]
    if devices and all(e is not None for e in energy):
        out[f"{p}/energy_joules"] = float(sum(energy))
    if per_gpu:
        stems = _device_keys(snapshot, p)
        for d in devices:
            stem = stems.get(d.get("uuid"), f"{p}_{d.get('uuid')}")
            for field, key in (
                ("utilization_mean", "utilization"),
                ("utilization_max", "utilization_max"),
                ("memory_peak_bytes", "memory_peak_bytes"),
                ("energy_joules", "energy_joules"),
            ):
                if d.get(field) is not None:
                    out[f"{stem}/{key}"] = float(d[field])
    return step, out

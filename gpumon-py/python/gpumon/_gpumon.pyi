"""Type stubs for the native module gpumon._gpumon (PyO3)."""

from types import TracebackType
from typing import Any, Dict, List, Optional, Sequence, Type, Union

from typing_extensions import final

__all__ = [
    "Monitor", "_atexit", "_close_for_sigterm", "_sigterm_monitors_open", "agent_main", "_check_run",
    "_check_step", "_steps_gpu", "GpumonError", "BackendUnavailableError", "__version__", "DEFAULT_JOB",
]

__version__: str
DEFAULT_JOB: str

def agent_main(argv: Sequence[str]) -> int:
    """Runs the gpumon-agent command line with argv (without the program name) in this process,
    the GIL released, and returns its exit code (run: the command's). It writes to file
    descriptors 1 and 2, does not exit the process (--help and bad flags return 0 or 2), and
    installs SIGINT/SIGTERM handlers that stay after it returns and still call Python's: the
    console scripts (gpumon/_run.py) set both signals to SIG_DFL first."""

class GpumonError(RuntimeError):
    """A gpumon operation failed (sampling, a listener that cannot bind, a closed Monitor)."""

class BackendUnavailableError(GpumonError):
    """The backend asked for cannot run (backend="nvml" without NVML)."""

@final
class Monitor:
    """Runs the gpumon agent in background Rust threads (a tokio runtime of its own).

    backend: "auto" (NVML; without it, the mock only when no sink exports), "nvml" (raises
    BackendUnavailableError without NVML) or "mock" (simulated GPUs, marked backend="mock" in
    every export). interval: "1s", "250ms", or seconds. prometheus_listen: "127.0.0.1:9400"
    (port + local rank with a rank; port 0: any free port, see prometheus_address).
    influx_url / influx_db: InfluxDB 1.x. otlp_endpoint: OTLP/HTTP. mock_profile (default
    "h100x8"), mock_scenario: the mock's fleet and script. devices: "0,2", [0, 2], UUIDs, "all";
    default: the rank's own GPU (LOCAL_RANK, CUDA_VISIBLE_DEVICES), else every visible GPU.
    job (default "train") and rank (default LOCAL_RANK): the labels of step marks.
    diagnose (default: True unless GPUMON_STEPS_SOCKET is set, where gpumon-run's agent diagnoses
    the job): run gpumon's diagnosis on the Monitor's GPUs; diagnose_window: its window ("30s").
    handle_sigterm (default True): while the Monitor is open, a SIGTERM whose disposition is the
    default closes the open Monitors (every marked step reaches the sinks), then ends the process
    by SIGTERM; a handler of the program's own is left alone (call close() in it).
    Bad arguments raise ValueError (or TypeError) naming the argument.
    """

    def __new__(
        cls,
        backend: str = "auto",
        interval: Union[str, float, None] = "1s",
        prometheus_listen: Optional[str] = None,
        influx_url: Optional[str] = None,
        influx_db: Optional[str] = None,
        otlp_endpoint: Optional[str] = None,
        mock_profile: Optional[str] = None,
        mock_scenario: Optional[str] = None,
        devices: Union[str, int, Sequence[Union[int, str]], None] = None,
        job: Optional[str] = None,
        rank: Optional[int] = None,
        handle_sigterm: bool = True,
        diagnose: Optional[bool] = None,
        diagnose_window: Union[str, float, None] = None,
    ) -> "Monitor": ...
    def step(self, n: int) -> None:
        """Marks the end of step n (the last completed step); keeps the GIL (lock-free hand-off).
        GpumonError when closed (whatever n is); TypeError when n is not an int (a bool
        included); ValueError when n is negative, above 2**64 - 2 or not above the last step."""
    def snapshot(self) -> Dict[str, Any]:
        """The latest snapshot: {"seq", "taken_at", "system", "devices": [...], "steps"?}.
        Releases the GIL. GpumonError while no sample has succeeded (degraded mode: no NVML)."""
    def flush(self, timeout: Union[str, float, None] = None) -> None:
        """Reports every step marked so far and waits (default 5 s) for every sink to export
        and flush. GpumonError when closed, when the sample failed (not for the missing NVML
        of backend="auto"'s degraded mode) or when a sink did not finish in time."""
    def close(self) -> None:
        """Stops the agent, flushing the sinks (up to 5 s). Releases the GIL. Idempotent. A
        Ctrl-C meanwhile raises KeyboardInterrupt once the close has finished."""
    def report(self, format: str = "text") -> str:
        """The run report gpumon-run prints ("text"), or its JSON ("json"). An open Monitor
        first reports every step marked so far; after close(), the whole run's."""
    def finding_events(self) -> List[Dict[str, Any]]:
        """The findings raised or cleared since the last call, oldest first."""
    @property
    def findings_dropped(self) -> int: ...
    @property
    def diagnose(self) -> bool: ...
    @property
    def last_step(self) -> Optional[int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def backend(self) -> str:
        """"nvml" or "mock"."""
    @property
    def prometheus_address(self) -> Optional[str]: ...
    @property
    def job(self) -> str: ...
    @property
    def rank(self) -> Optional[int]: ...
    def __enter__(self) -> "Monitor": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def _atexit() -> None: ...
def _close_for_sigterm() -> None: ...
def _sigterm_monitors_open() -> int: ...
def _check_run(job: str, rank: Optional[int]) -> "tuple[str, Optional[int]]":
    """StepClient's job and rank checked as Monitor's are (rank None: LOCAL_RANK)."""
def _steps_gpu(rank: Optional[int], gpu: Union[None, str, int, Sequence[Union[int, str]]] = None) -> Optional[str]:
    """The physical GPUs a StepClient's marks are about (CUDA_VISIBLE_DEVICES syntax), by the
    Monitor's device rule; None: every GPU."""
def _check_step(n: int) -> int:
    """StepClient.step's n checked as Monitor.step's is."""

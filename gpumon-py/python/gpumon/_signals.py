"""SIGTERM while a Monitor is open: report and flush, then terminate as SIGTERM would.

Slurm, Kubernetes and torchrun stop a job's workers with SIGTERM. Its default action ends the
process at once: ``atexit`` does not run, so a Monitor would lose the steps marked since its last
tick and whatever its sinks had queued. While a Monitor made with ``handle_sigterm=True`` (the
default) is open and SIGTERM's disposition is the default one, this module's handler closes
every open Monitor (each within ``close()``'s 5 s deadline, side by side), gives SIGTERM its
default disposition back and sends it again, so that the process ends *by* SIGTERM (a parent
sees ``-SIGTERM`` / exit status 143 as before).

What it leaves alone: a handler the program installed itself (call ``Monitor.close()`` in it),
SIGTERM ignored (``SIG_IGN``), and processes whose Monitors are created outside the main thread
(Python lets only the main thread set handlers; ``atexit`` still covers a normal exit). When the
last such Monitor closes, SIGTERM gets back the disposition it had (the default).

Python runs signal handlers in the main thread between bytecodes: a main thread blocked in a
long call into C (a CUDA synchronisation, say) runs the handler when that call returns.
"""

import logging
import os
import signal
import threading

from ._gpumon import _close_for_sigterm, _sigterm_monitors_open

_log = logging.getLogger("gpumon")

_lock = threading.Lock()
# Whether SIGTERM's disposition is ours (installed over SIG_DFL).
_installed = False


def _on_sigterm(signum, frame):
    """Closes the open Monitors, then terminates the process by SIGTERM."""
    try:
        _close_for_sigterm()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        # Delivered before kill() returns (unblocked, sent to this process); should the signal
        # be blocked in this thread, the process still must not carry on as if nothing happened.
        os._exit(128 + signal.SIGTERM)


def _monitor_opened() -> None:
    """A Monitor with ``handle_sigterm=True`` started: take SIGTERM if nobody else has."""
    global _installed
    with _lock:
        if _installed:
            return
        if threading.current_thread() is not threading.main_thread():
            _log.debug("Monitor made outside the main thread: SIGTERM is not handled (close() it yourself)")
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            # The program's own handler (or SIG_IGN): it decides; it should call close().
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
        _installed = True


def _monitor_closed() -> None:
    """A Monitor with ``handle_sigterm=True`` closed: the last one restores the default."""
    global _installed
    with _lock:
        if not _installed or _sigterm_monitors_open() > 0:
            return
        if threading.current_thread() is not threading.main_thread():
            # Only the main thread may set it; the handler, finding no Monitor open, just
            # terminates the process as the default would.
            return
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _installed = False

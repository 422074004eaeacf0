"""The wheel's console scripts: ``gpumon-run [agent flags] -- CMD ARGS...`` (``gpumon-agent run``)
and ``gpumon-agent`` (the whole agent: ``--once``, ``--prometheus-listen``, ``compare``, ...).

Both run the agent's command line in this process, from the extension module
(``gpumon._gpumon.agent_main``, the same Rust code as the ``gpumon-agent`` binary): a ``pip
install gpumon-nvml`` is all they need. The exit code is the agent's, or with ``run`` the
command's (128 + the signal's number when a signal killed it).

SIGINT and SIGTERM get their default action before the agent starts: the agent then installs its
own handlers (``run`` forwards the signal to the command's process group once and exits with the
command's status), and Python's handler is not chained behind them — it would raise
``KeyboardInterrupt`` after the agent returned, printing a traceback instead of exiting with the
command's code.
"""

import signal
import sys
from typing import List, Optional


def _agent_main(argv: List[str]) -> int:
    from gpumon._gpumon import agent_main

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    return agent_main(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """``gpumon-run``: ``gpumon-agent run`` with these arguments (default ``sys.argv[1:]``)."""
    return _agent_main(["run", *(sys.argv[1:] if argv is None else argv)])


def agent(argv: Optional[List[str]] = None) -> int:
    """``gpumon-agent``: the agent with these arguments (default ``sys.argv[1:]``)."""
    return _agent_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

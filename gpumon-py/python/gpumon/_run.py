"""``gpumon-run [agent flags] -- CMD ARGS...``: ``gpumon-agent run`` from the Python package.

The wheel ships the extension module, not the agent binary, so this finds the agent:
``GPUMON_AGENT`` (a path), else ``gpumon-agent`` on ``PATH``, and replaces itself with
``gpumon-agent run ...`` (same process, so signals, the exit code and the terminal are the
agent's). Without an agent it says what it needs in one line and exits 127, as a shell does for a
command it cannot find.
"""

import os
import shutil
import sys
from typing import List, Optional

AGENT_ENV = "GPUMON_AGENT"


def find_agent() -> Optional[str]:
    """The agent binary: ``GPUMON_AGENT``, else ``gpumon-agent`` on ``PATH``; ``None`` without."""
    given = os.environ.get(AGENT_ENV, "").strip()
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("gpumon-agent")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    agent = find_agent()
    if agent is None:
        given = os.environ.get(AGENT_ENV, "").strip()
        where = f"{AGENT_ENV}={given} is not an executable file" if given else "no gpumon-agent on PATH"
        print(
            f"gpumon-run: needs the gpumon-agent binary, which the gpumon-nvml wheel does not ship ({where}): "
            f"install it (cargo install --path . in gpumon's repository) or set {AGENT_ENV} to its path",
            file=sys.stderr,
        )
        return 127
    os.execv(agent, [agent, "run", *args])
    return 126  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A training loop in miniature for `gpumon-agent run` on the mock backend (docs/run.md).

It does no work: it marks one step every --step-seconds on the steps socket that
`gpumon-agent run` names in GPUMON_STEPS_SOCKET, as a real loop's callback would. The mock
backend plays the GPU side (`--mock-scenario`); this script plays the loop's pace. With the
gpumon package installed, a real loop needs only `gpumon.StepClient()` or a trainer callback.
"""

import argparse
import json
import os
import socket
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step-seconds", type=float, default=1.0)
parser.add_argument("--job", default="finetune")
args = parser.parse_args()

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["GPUMON_STEPS_SOCKET"])
rank = os.environ.get("LOCAL_RANK")
for step in range(1, args.steps + 1):
    time.sleep(args.step_seconds)  # forward, backward, optimizer step ... or waiting for data
    mark = {"job": args.job, "rank": None if rank is None else int(rank), "step": step}
    sock.sendall((json.dumps(mark) + "\n").encode())
print(f"train_sim: {args.steps} steps done")

#!/usr/bin/env python3
"""The classic monitoring-agent script: poll every GPU through nvidia-ml-py (pynvml) on a fixed
interval, reading utilisation, memory, temperature and power, and emit one JSON line per round.

Used by scripts/bench-peers.sh as the "plain Python polling loop" peer.

    python pynvml_loop.py --interval 0.1 --samples 200 > /dev/null

Runs until --samples rounds are done (0 = forever) or SIGTERM/SIGINT; prints the number of
rounds on stderr as `rounds=N` when it stops.
"""
import argparse
import json
import signal
import sys
import time

import pynvml

from pacing import Pacer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between rounds")
    ap.add_argument("--samples", type=int, default=0, help="rounds to take (0 = until signalled)")
    args = ap.parse_args()

    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
    out = sys.stdout
    rounds = 0
    pacer = Pacer(args.interval)
    while not stop and (args.samples == 0 or rounds < args.samples):
        gpus = []
        for i, h in enumerate(handles):
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            power = pynvml.nvmlDeviceGetPowerUsage(h)  # mW
            gpus.append(
                {
                    "index": i,
                    "uuid": uuids[i],
                    "utilization_gpu": util.gpu / 100.0,
                    "utilization_memory": util.memory / 100.0,
                    "memory_used_bytes": mem.used,
                    "memory_total_bytes": mem.total,
                    "temperature_c": temp,
                    "power_watts": power / 1000.0,
                }
            )
        out.write(json.dumps({"timestamp": time.time(), "gpus": gpus}) + "\n")
        out.flush()
        rounds += 1
        pacer.wait()
    pynvml.nvmlShutdown()
    print(f"rounds={rounds}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

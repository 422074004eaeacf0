"""A training loop that marks its steps with gpumon.

    gpumon-py/build-wheel.sh && pip install target/wheels/gpumon_nvml-*.whl   # or: pip install ./gpumon-py
    python examples/python/train_loop.py          # the mock (no NVML here, nothing exported)
    python examples/python/train_loop.py --prometheus 127.0.0.1:9400 --backend mock
    curl -s 127.0.0.1:9400/metrics | grep gpumon_step

Under torchrun every rank runs this file: each Monitor watches its rank's GPU (LOCAL_RANK,
CUDA_VISIBLE_DEVICES) and listens on port + LOCAL_RANK. With an agent already on the node
(`gpumon-agent --steps-socket /run/gpumon/steps.sock`), use --socket instead: the loop only
sends step marks.
"""

import argparse
import logging
import time

import gpumon


def train_step(step: int) -> float:
    """Stands for forward, backward and the optimizer step."""
    time.sleep(0.05)
    return 1.0 / step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--backend", default="auto", choices=["auto", "nvml", "mock"])
    p.add_argument("--prometheus", metavar="ADDR", help="serve /metrics on ADDR, e.g. 127.0.0.1:9400")
    p.add_argument("--socket", metavar="PATH", help="send marks to a running agent's --steps-socket instead")
    args = p.parse_args()
    # gpumon logs through `logging` (logger "gpumon") and prints nothing itself.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    if args.socket:
        client = gpumon.StepClient(args.socket, job="example")
        for step in range(1, args.steps + 1):
            train_step(step)
            client.step(step)
        print(f"sent {args.steps} marks ({client.dropped} dropped)")
        return

    with gpumon.Monitor(backend=args.backend, interval="250ms", prometheus_listen=args.prometheus,
                        job="example") as monitor:
        for step in range(1, args.steps + 1):
            loss = train_step(step)
            monitor.step(step)  # cheap: a lock-free hand-off, the GIL kept
            if step % 10 == 0:
                snap = monitor.snapshot()
                run = (snap.get("steps") or {}).get("runs", [{}])[0]
                last = run.get("last") or {}
                utils = [f"{d['utilization_mean']:.2f}" for d in last.get("devices", [])]
                print(f"step {step}: loss {loss:.3f}, backend {monitor.backend}, "
                      f"step {last.get('step')} took {last.get('duration', 0):.3f}s, GPU utilisation {utils}")


if __name__ == "__main__":
    main()

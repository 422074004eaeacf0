"""Reads back what a `swift sft` run with gpumon's plugin wrote and checks it:

    check_logs.py OUTPUT_DIR STEPS [OUTPUT_DIR STEPS ...]      (one run per pair)

- ms-swift's ``logging.jsonl`` (one entry per log, ``global_step/max_steps`` naming the step):
  every step 1..STEPS has its figures in some entry (``mock_gpu/step``), each entry's figures
  describe a step at most one before the entry's own (a 1 s sample falls in each >= 1.2 s step),
  and a step's ``mock_gpu/step_seconds`` is the pace plugin's sleep for that step plus compute,
  so the figures are that step's and no neighbour's;
- the TensorBoard event files: every figure in logging.jsonl is a scalar ``train/<key>`` at the
  entry's global step, with the same value.
Exits non-zero naming what is missing or wrong.
"""

import glob
import json
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pace_plugin import PACE  # noqa: E402

FIGURES = ("mock_gpu/step", "mock_gpu/step_seconds", "mock_gpu/utilization", "mock_gpu/memory_peak_gib")


def fail(msg: str) -> None:
    print(f"check_logs.py: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def read_jsonl(out_dir: str):
    paths = glob.glob(os.path.join(out_dir, "**", "logging.jsonl"), recursive=True)
    if len(paths) != 1:
        fail(f"expected one logging.jsonl under {out_dir}, found {paths}")
    entries = []
    with open(paths[0]) as f:
        for line in f:
            if line.strip():
                entries.append(json.loads(line))
    return paths[0], entries


def check_jsonl(entries, steps: int):
    figured = {}
    for e in entries:
        if "global_step/max_steps" not in e:
            continue
        global_step = int(str(e["global_step/max_steps"]).split("/")[0])
        if "mock_gpu/step" not in e:
            continue
        missing = [k for k in FIGURES if k not in e]
        if missing:
            fail(f"entry at step {global_step} has mock_gpu/step but not {missing}: {e}")
        step = int(e["mock_gpu/step"])
        if not (global_step - 1 <= step <= global_step):
            fail(f"entry at step {global_step} carries the figures of step {step}")
        if step in figured:
            fail(f"step {step}'s figures logged twice (steps {figured[step][0]} and {global_step})")
        figured[step] = (global_step, e)
    absent = [s for s in range(1, steps + 1) if s not in figured]
    if absent:
        fail(f"no figures for steps {absent} in logging.jsonl (figured: {sorted(figured)})")
    for step, (global_step, e) in sorted(figured.items()):
        if step == 1:
            continue  # measured from the start of training: includes the loop's set-up
        seconds, pace = e["mock_gpu/step_seconds"], PACE[step % 3]
        if seconds < pace:
            fail(f"step {step}: step_seconds {seconds:.3f} is shorter than its own pace, {pace} s")
        if not (0.0 <= e["mock_gpu/utilization"] <= 1.0):
            fail(f"step {step}: utilization {e['mock_gpu/utilization']} outside 0..1")
    return figured


def check_tensorboard(out_dir: str, figured) -> int:
    event_files = glob.glob(os.path.join(out_dir, "**", "events.out.tfevents.*"), recursive=True)
    if not event_files:
        fail(f"no TensorBoard event files under {out_dir}")
    scalars = {}
    for path in event_files:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for ev in acc.Scalars(tag):
                scalars.setdefault((tag, ev.step), []).append(ev.value)
    checked = 0
    for step, (global_step, e) in figured.items():
        for key in FIGURES:
            # The last global step has two logs (its own, the run summary): two values there.
            values = scalars.get((f"train/{key}", global_step))
            if not values:
                fail(f"TensorBoard has no train/{key} at step {global_step}")
            if not any(abs(v - e[key]) <= 1e-4 * max(1.0, abs(e[key])) for v in values):
                fail(f"TensorBoard train/{key} at step {global_step} is {values}, logging.jsonl says {e[key]}")
            checked += 1
    return checked


def main() -> None:
    args = sys.argv[1:]
    if not args or len(args) % 2:
        fail("usage: check_logs.py OUTPUT_DIR STEPS [OUTPUT_DIR STEPS ...]")
    # One process for every run: importing TensorBoard's reader takes seconds.
    for out_dir, steps in zip(args[::2], map(int, args[1::2])):
        path, entries = read_jsonl(out_dir)
        figured = check_jsonl(entries, steps)
        checked = check_tensorboard(out_dir, figured)
        print(
            f"check_logs.py: ok: steps 1..{steps} each with its figures in {path}; "
            f"{checked} figures found again in TensorBoard at their steps"
        )


if __name__ == "__main__":
    main()

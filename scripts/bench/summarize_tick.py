#!/usr/bin/env python3
"""Summary of scripts/bench-peers.sh --tick: tick.tsv (+ the perf attribution) -> Markdown.

Usage: summarize_tick.py TICK_TSV ATTRIBUTION_TSV MACHINE_TXT

Every figure is whole-process CPU (perf stat task-clock: every thread, from exec to exit).
Per configuration and fleet, medians over the rounds of:
  incl. start-up  = CPU of the run / samples it took (what the target compares);
  start-up        = CPU of a run that takes one sample and exits (`--once`, `--samples 1`);
  per tick        = (CPU of the run - start-up) / (samples - 1): the steady cost of one more tick.
"""
import csv
import statistics
import sys
from collections import defaultdict


def new_row(rows):
    return rows.get(("gpumon-only4", "h100x8"))


def main() -> int:
    tick_tsv, attribution_tsv, machine_txt = sys.argv[1:4]
    runs = defaultdict(dict)  # (config, fleet) -> {round: (ms, samples)}
    once = defaultdict(dict)  # (config, fleet) -> {round: ms}
    with open(tick_tsv) as f:
        for row in csv.DictReader(f, delimiter="\t"):
            key = (row["config"], row["fleet"])
            ms, n = float(row["task_clock_ms"]), int(row["samples"])
            if row["kind"] == "once":
                once[key][row["round"]] = ms
            else:
                runs[key][row["round"]] = (ms, n)

    print("## Tick cost: whole process, start-up and every thread included\n")
    print("```text")
    print(open(machine_txt).read().rstrip())
    print("```\n")

    def startup(config, fleet, rnd):
        o = once.get((config, fleet), {})
        return o.get(rnd, statistics.median(o.values()) if o else float("nan"))

    rows = {}
    print("| configuration | fleet | samples | CPU ms / sample, incl. start-up | start-up ms (`--once`) "
          "| µs / tick without start-up | per round (incl. start-up, ms) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for (config, fleet), by_round in sorted(runs.items(), key=lambda kv: (kv[0][1] != "h100x8", kv[0])):
        incl = [ms / n for ms, n in by_round.values()]
        steady = [(ms - startup(config, fleet, r)) / max(n - 1, 1) * 1000 for r, (ms, n) in by_round.items()]
        su = statistics.median(once[(config, fleet)].values()) if once.get((config, fleet)) else float("nan")
        samples = statistics.median(n for _, n in by_round.values())
        rows[(config, fleet)] = (statistics.median(incl), statistics.median(steady))
        print(f"| {config} | {fleet} | {samples:.0f} | {statistics.median(incl):.4f} | {su:.1f} "
              f"| {statistics.median(steady):.1f} | {', '.join(f'{v:.4f}' for v in incl)} |")
    print()

    loop = rows.get(("pynvml-loop", "h100x8"))
    print("### Ratios (medians; same work: 8 GPUs, utilisation, memory, temperature, power)\n")
    print("| comparison | incl. start-up | per tick without start-up |")
    print("|---|---:|---:|")
    for a, b in [("pynvml-loop", "gpumon-only4"), ("pynvml-loop", "before-only4"), ("before-only4", "gpumon-only4"),
                 ("pynvml-loop", "floor-1thread"), ("pynvml-loop", "floor-2threads")]:
        ra, rb = rows.get((a, "h100x8")), rows.get((b, "h100x8"))
        if ra and rb:
            print(f"| {a} ÷ {b} | {ra[0] / rb[0]:.2f}× | {ra[1] / rb[1]:.2f}× |")
    print()
    floor1, floor2 = rows.get(("floor-1thread", "h100x8")), rows.get(("floor-2threads", "h100x8"))
    if floor1 and floor2 and new_row(rows):
        g = new_row(rows)
        print("### Against the floor (a program that only wakes on the same grid)\n")
        print(f"* Waking alone: {floor1[1]:.1f} µs per tick with one thread, {floor2[1]:.1f} µs with two "
              f"(the agent's shape: sampling thread, then runtime).")
        print(f"* gpumon-only4 per tick beyond waking on two threads: {g[1] - floor2[1]:.1f} µs "
              f"(of {g[1]:.1f} µs).")
        print(f"* The most any program that wakes once per tick could show against the pynvml loop here "
              f"(pynvml-loop ÷ floor-1thread, incl. start-up): {loop[0] / floor1[0]:.2f}×.\n" if loop else "")
    print()

    # Attribution: share of the profile inside the fake libnvidia-ml = the NVML calls themselves.
    shares = defaultdict(float)
    threads = defaultdict(float)
    lines = []
    try:
        with open(attribution_tsv) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 3:
                    continue
                comm, dso, pct = parts[0], parts[1], float(parts[2])
                shares[dso] += pct
                threads[comm] += pct
                lines.append((comm, dso, pct))
    except FileNotFoundError:
        pass
    new = rows.get(("gpumon-only4", "h100x8"))
    if lines and new:
        nvml = shares.get("libgpumon_fake_nvml.so", 0.0) / 100.0
        per_tick = new[1]
        print("### What is left per tick (perf record of gpumon-only4, 8 GPUs, 20 s at 100 ms)\n")
        print(f"* NVML calls (samples inside the fake libnvidia-ml): {nvml * 100:.1f} % of the profile "
              f"→ ≈ {per_tick * nvml:.1f} µs of the {per_tick:.1f} µs per tick; "
              f"**beyond the NVML calls: ≈ {per_tick * (1 - nvml):.1f} µs per tick**.")
        print("* By thread: " + ", ".join(f"{c} {p:.1f} %" for c, p in sorted(threads.items(), key=lambda x: -x[1])))
        print("* By shared object: " + ", ".join(f"{d} {p:.1f} %" for d, p in sorted(shares.items(), key=lambda x: -x[1])))
        print()
        print("| thread | shared object | % of samples |")
        print("|---|---|---:|")
        for comm, dso, pct in lines:
            if pct >= 1.0:
                print(f"| {comm} | {dso} | {pct:.2f} |")
        print()

    print("### Fleet size (gpumon-only4, µs per tick without start-up)\n")
    print("| fleet | µs / tick | µs / GPU (physical) |")
    print("|---|---:|---:|")
    for fleet, gpus in [("h100x1", 1), ("h100x8", 8), ("h100x64", 64), ("a100x8-mig", 8)]:
        r = rows.get(("gpumon-only4", fleet))
        if r:
            print(f"| {fleet} | {r[1]:.1f} | {r[1] / gpus:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

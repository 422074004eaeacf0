#!/usr/bin/env python3
"""Summarises scripts/bench-peers.sh's raw.tsv: medians over rounds and gpumon/peer ratios, as
markdown on stdout.  Usage: summarize.py RAW.tsv [MACHINE.txt]"""
import csv
import statistics
import sys
from collections import defaultdict

GPUMON = ["gpumon-json", "gpumon-json-min", "gpumon-prom", "gpumon-influx", "gpumon-otlp", "gpumon-all", "before-all"]
PEERS = ["pynvml-loop", "gpustat", "nvitop-exporter"]
# Not a monitor: scripts/bench/export_floor.rs, the sinks' bytes moved and nothing else (1 Hz).
FLOORS = ["floor-io"]


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=3):
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{nd}f}"


def main():
    rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
    by = defaultdict(list)
    for r in rows:
        by[(r["phase"], r["config"])].append(r)

    def metrics(r):
        n = num(r["samples_window"])
        tc = num(r["task_clock_ms"])
        total = num(r["total_samples"])
        us = (num(r["user_s"]) or 0) + (num(r["sys_s"]) or 0)
        xid = num(r.get("xid_thread_ms")) or 0.0
        ex = tc - xid if tc is not None else None
        return {
            # excluding the fake NVML's busy-polling nvmlEventSetWait (gpumon-nvml-xid thread)
            "cpu_per_1k_ex": ex / n if ex is not None and n else None,
            "core_pct_ex": ex / (num(r["window_s"]) * 1000) * 100 if ex is not None and num(r["window_s"]) else None,
            # CPU ms per sample == CPU s per 1000 samples
            "cpu_per_1k": tc / n if tc is not None and n else None,
            "cpu_per_1k_total": us / total * 1000 if total else None,
            "rss_mib": num(r["max_rss_kib"]) / 1024 if num(r["max_rss_kib"]) else None,
            "p50": num(r["p50_ms"]),
            "p99": num(r["p99_ms"]),
            "core_pct": tc / (num(r["window_s"]) * 1000) * 100 if tc is not None and num(r["window_s"]) else None,
            "n": n,
        }

    summary = {}
    for key, rs in by.items():
        ms = [metrics(r) for r in rs]
        summary[key] = {k: med([m[k] for m in ms]) for k in ms[0]} | {"runs": len(rs), "all": ms}

    out = []
    if len(sys.argv) > 2:
        out.append("```text\n" + open(sys.argv[2]).read().rstrip() + "\n```\n")
    fast = {c: summary.get(("fast", c)) for c in GPUMON + PEERS}
    if any(fast.values()):
        out.append("### Per-sample cost (8 GPUs; medians of %d rounds)\n" % max(s["runs"] for s in fast.values() if s))
        out.append("| configuration | CPU s / 1000 samples (steady) | same, excl. fake XID polling | incl. startup | peak RSS MiB | scrape p50 ms | scrape p99 ms | runs (steady CPU s/1000 each) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---|")
        for c in GPUMON + PEERS:
            s = fast[c]
            if not s:
                continue
            each = ", ".join(fmt(m["cpu_per_1k"]) for m in s["all"])
            out.append(
                f"| {c} | {fmt(s['cpu_per_1k'])} | {fmt(s['cpu_per_1k_ex'])} | {fmt(s['cpu_per_1k_total'])} | {fmt(s['rss_mib'], 1)} | "
                f"{fmt(s['p50'])} | {fmt(s['p99'])} | {each} |"
            )
        out.append("")
        peers = [p for p in PEERS if fast.get(p)]
        if peers:
            out.append("### Ratios gpumon / peer (medians) — below 1 means gpumon costs less; (1/N) = N× less\n")
            out.append("CPU: steady CPU per sample, gpumon excluding the fake's XID polling thread (the peers do not use events).\n")
            out.append("| gpumon | " + " | ".join(f"CPU ÷ {p}" for p in peers) + " | " + " | ".join(f"RSS ÷ {p}" for p in peers) + " |")
            out.append("|---|" + "---:|" * (2 * len(peers)))
            for c in GPUMON:
                s = fast.get(c)
                if not s:
                    continue
                cells = []
                for key, pkey in (("cpu_per_1k_ex", "cpu_per_1k"), ("rss_mib", "rss_mib")):
                    for p in peers:
                        a, b = s[key], fast[p][pkey]
                        cells.append((f"{a / b:.3f} (1/{b / a:.1f})" if b / a < 10 else f"{a / b:.4f} (1/{b / a:.0f})") if a and b else "–")
                out.append(f"| {c} | " + " | ".join(cells) + " |")
            out.append("")
    hz = {c: summary.get(("1hz", c)) for c in FLOORS + GPUMON + PEERS}
    if any(hz.values()):
        out.append("### At 1 Hz (8 GPUs; medians)\n")
        out.append("| configuration | % of one core | same, excl. fake XID polling | peak RSS MiB | scrape p50 ms | scrape p99 ms | runs (% core each; excl.) |")
        out.append("|---|---:|---:|---:|---:|---:|---|")
        for c, s in hz.items():
            if not s:
                continue
            each = ", ".join(f"{fmt(m['core_pct'], 4)}; {fmt(m['core_pct_ex'], 4)}" for m in s["all"])
            out.append(
                f"| {c} | {fmt(s['core_pct'], 4)} | {fmt(s['core_pct_ex'], 4)} | {fmt(s['rss_mib'], 1)} | "
                f"{fmt(s['p50'])} | {fmt(s['p99'])} | {each} |"
            )
        out.append("")
        floor, everything = hz.get("floor-io"), hz.get("gpumon-all")
        if floor and everything and floor["core_pct"] and everything["core_pct"]:
            out.append(
                f"floor-io moves gpumon-all's bytes and does nothing else: {fmt(floor['core_pct'], 4)} % of a core. "
                f"gpumon-all spends {fmt(everything['core_pct'] - floor['core_pct'], 4)} % beyond it "
                "(sampling, encoding, the runtime).\n"
            )
    print("\n".join(out))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Records a reference trace on a real GPU (docs/replay.md): the NVML backend only, every metric
# family, at 1 s, for 10 minutes by default; then replays it as fast as possible and prints its
# size and the findings of the replay.
#
#   scripts/record-reference-trace.sh [OUT] [DURATION]
#   scripts/record-reference-trace.sh reference.gpumon-trace.gz 10m
#
# Refuses to run without a real GPU: on the mock backend or the fake libnvidia-ml (whose GPUs are
# simulated) a "reference" trace would be worthless.
set -euo pipefail

out=${1:-reference.gpumon-trace.gz}
duration=${2:-10m}
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ -n "${LD_LIBRARY_PATH:-}" && "$LD_LIBRARY_PATH" == *fake-nvml* ]]; then
    echo "record-reference-trace: LD_LIBRARY_PATH points at the fake libnvidia-ml; a reference trace needs a real GPU" >&2
    exit 2
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "record-reference-trace: no NVIDIA GPU answers (nvidia-smi -L failed); a reference trace needs a real GPU" >&2
    exit 2
fi

cd "$root"
cargo build --release --bin gpumon-agent
agent=target/release/gpumon-agent
# The opt-in families; every other family is on by default.
families=processes,pcie_throughput

# --backend nvml: fail rather than fall back to anything simulated.
echo "recording $duration of every GPU at 1 s to $out" >&2
"$agent" --backend nvml --interval 1s --duration "$duration" --enable "$families" --record "$out" --log warn

# Check what was recorded: the header must say nvml (never mock), and the trace must replay.
backend=$(gzip -dc "$out" | head -n 1 | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["backend"]); print(len(h["devices"]), "GPU(s):", ", ".join(d["name"] for d in h["devices"]), file=sys.stderr)')
if [[ "$backend" != "nvml" ]]; then
    echo "record-reference-trace: the trace says backend '$backend', not nvml; discarded" >&2
    rm -f "$out"
    exit 1
fi
"$agent" --replay "$out" --replay-speed max --report --log warn
lines=$(gzip -dc "$out" | wc -l)
bytes=$(stat -c %s "$out")
echo "$out: $bytes bytes, $((lines - 1)) snapshots ($((bytes / (lines > 1 ? lines - 1 : 1))) bytes each, ~$((bytes * 3600 / (lines > 1 ? lines - 1 : 1) / 1000000)) MB per hour at 1 s)" >&2

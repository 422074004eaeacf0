#!/usr/bin/env bash
# On a machine WITH a GPU: record what the real NVML reports, to correct the fake's profiles.
#
#   cargo build --release --example agent        # beforehand (the device machine may be offline)
#   scripts/fake-nvml-gpu-check.sh [AGENT_BINARY] [OUT_DIR]
#
# Runs the agent with --backend nvml --once (JSON, every family incl. the opt-in ones) and writes
# OUT_DIR (default docs/)/nvml-observed-<gpu model>.json plus a Markdown table of which families
# had values per GPU. GPM needs two ticks, so it is absent from a --once snapshot by design.
#
# Then, with nvidia-ml-py available ($GPUMON_TEST_PYTHON, else python3), it records what every
# function the fake implements returns on this GPU (support and value class:
# scripts/fake-nvml-surface.py) into OUT_DIR/nvml-surface-<model>.json, records the fake's
# profile of the same model (FAKE_PROFILE, default <h100|h200|a100>x<GPU count>; needs the fake
# built beforehand: scripts/fake-nvml-dir.sh) and writes the differences to
# OUT_DIR/nvml-surface-diff-<model>.txt. A single GPU cannot show NVLink traffic or topology.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AGENT="${1:-$REPO/target/release/examples/agent}"
OUT="${2:-$REPO/docs}"
[ -x "$AGENT" ] || { echo "fake-nvml-gpu-check.sh: $AGENT not built" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$AGENT" --backend nvml --once --stdout-format json --enable processes,pcie_throughput --log warn > "$tmp/snap.json"
nvidia-smi -q > "$tmp/nvidia-smi.txt" 2>&1 || true
python3 - "$tmp/snap.json" "$OUT" <<'PY'
import json, re, sys
snap = json.loads(next(l for l in open(sys.argv[1]) if l.lstrip().startswith("{")))
out = sys.argv[2]
model = re.sub(r"[^a-z0-9]+", "-", snap["devices"][0]["info"]["name"].lower()).strip("-") if snap["devices"] else "none"
json.dump(snap, open(f"{out}/nvml-observed-{model}.json", "w"), indent=2)
fams = {
    "utilization": lambda d: d["utilization"], "memory": lambda d: d["memory"],
    "temperature": lambda d: d["temperature"], "power": lambda d: d["power"], "clocks": lambda d: d["clocks"],
    "fan": lambda d: d["fan_speed"], "performance_state": lambda d: d["performance_state"],
    "clock_events": lambda d: d["clock_event_reasons"], "pcie": lambda d: d["pcie"], "ecc": lambda d: d["ecc"],
    "processes": lambda d: d["processes"], "high_resolution": lambda d: d["windows"], "gpm": lambda d: d["gpm"],
}
def present(v):
    if isinstance(v, dict):
        return [k for k, x in v.items() if x is not None]
    return "yes" if v not in (None, [], {}) else "no"
lines = [f"# NVML observed on {snap['devices'][0]['info']['name'] if snap['devices'] else '?'}", "",
         f"driver {snap['system'].get('driver_version')}, CUDA {snap['system'].get('cuda_driver_version')}, "
         f"NVML {snap['system'].get('nvml_version')}", "", "| GPU | family | fields with values |", "|---|---|---|"]
for d in snap["devices"]:
    for f, get in fams.items():
        lines.append(f"| {d['info']['index']} {d['info']['uuid'][:12]} | {f} | {present(get(d))} |")
    lines.append(f"| {d['info']['index']} | errors | {d['errors']} |")
open(f"{out}/nvml-observed-{model}.md", "w").write("\n".join(lines) + "\n")
print(f"wrote {out}/nvml-observed-{model}.json and .md")
print(model, len(snap["devices"]), file=open(sys.argv[1] + ".model", "w"))
PY
PY_NVML="${GPUMON_TEST_PYTHON:-python3}"
if ! "$PY_NVML" -c 'import pynvml' 2>/dev/null; then
    echo "fake-nvml-gpu-check.sh: $PY_NVML lacks nvidia-ml-py; skipping the surface record" >&2
    exit 0
fi
read -r model count < "$tmp/snap.json.model"
"$PY_NVML" "$REPO/scripts/fake-nvml-surface.py" record "$OUT/nvml-surface-$model.json"
echo "wrote $OUT/nvml-surface-$model.json"
case "$model" in
    *h200*) guess="h200x$count" ;; *h100*) guess="h100x$count" ;; *a100*) guess="a100x$count" ;; *) guess="" ;;
esac
profile="${FAKE_PROFILE:-$guess}"
fake_dir=""
for flags in "--release --no-build" "--no-build"; do
    d="$("$REPO/scripts/fake-nvml-dir.sh" $flags 2>/dev/null || true)"
    if [ -n "$d" ] && [ -e "$d/libnvidia-ml.so.1" ]; then fake_dir="$d"; break; fi
done
if [ -z "$profile" ] || [ ! -e "$fake_dir/libnvidia-ml.so.1" ]; then
    echo "fake-nvml-gpu-check.sh: no fake build or no profile for $model (set FAKE_PROFILE); no comparison" >&2
    exit 0
fi
LD_LIBRARY_PATH="$fake_dir" GPUMON_FAKE_NVML_PROFILE="$profile" GPUMON_FAKE_NVML_CLOCK=manual \
    "$PY_NVML" "$REPO/scripts/fake-nvml-surface.py" record "$tmp/fake.json"
"$PY_NVML" "$REPO/scripts/fake-nvml-surface.py" compare "$OUT/nvml-surface-$model.json" "$tmp/fake.json" \
    > "$OUT/nvml-surface-diff-$model.txt" || true
echo "wrote $OUT/nvml-surface-diff-$model.txt (fake profile $profile)"


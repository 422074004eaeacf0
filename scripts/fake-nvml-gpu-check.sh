#!/usr/bin/env bash
# On a machine WITH a GPU: record what the real NVML reports, to correct the fake's profiles.
#
#   cargo build --release --example agent        # beforehand (the device machine may be offline)
#   scripts/fake-nvml-gpu-check.sh [AGENT_BINARY] [OUT_DIR]
#
# Runs the agent with --backend nvml --once (JSON, every family incl. the opt-in ones) and writes
# OUT_DIR (default docs/)/nvml-observed-<gpu model>.json plus a Markdown table of which families
# had values per GPU. GPM needs two ticks, so it is absent from a --once snapshot by design.
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
PY

#!/usr/bin/env bash
# Fleet scale, simulated: FLEET_AGENTS example agents on the mock backend, each with its own
# --host, remote-writing into one VictoriaMetrics on 127.0.0.1 for FLEET_DURATION seconds. Reports
# the ingest rate, each agent's CPU and memory, and samples lost (expected: none).
#
#   ./scripts/fleet-remote-write.sh                                   # 50 agents, 180 s
#   FLEET_AGENTS=20 FLEET_DURATION=60 ./scripts/fleet-remote-write.sh
#
# Settings (environment):
#   FLEET_AGENTS       number of agents                                 (default 50)
#   FLEET_DURATION     seconds the agents run                           (default 180)
#   FLEET_INTERVAL     each agent's sampling interval                   (default 1s)
#   FLEET_PROFILE      mock fleet per agent                             (default h100x8)
#   FLEET_AGENT        agent binary (default target/{release,debug}/examples/agent, whichever
#                      exists, release first; build one with `cargo build [--release] --example agent`)
#   FLEET_VM_PORT      VictoriaMetrics port                             (default 28428)
#   FLEET_OUT          output directory (default: a new ${TMPDIR:-/tmp}/gpumon-fleet.XXXXXX)
#
# "Lost" per agent: the agent counts its snapshots (gpumon_samples_total, itself a pushed
# series); VictoriaMetrics must hold one gpumon_up{gpu="0"} sample per snapshot the agent took
# up to its last pushed snapshot. All addresses are 127.0.0.1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
B="$HERE/backends"
N="${FLEET_AGENTS:-50}"
DURATION="${FLEET_DURATION:-180}"
INTERVAL="${FLEET_INTERVAL:-1s}"
PROFILE="${FLEET_PROFILE:-h100x8}"
PORT="${FLEET_VM_PORT:-28428}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
AGENT="${FLEET_AGENT:-}"
if [ -z "$AGENT" ]; then
    for p in release debug; do
        [ -x "$TARGET/$p/examples/agent" ] && { AGENT="$TARGET/$p/examples/agent"; break; }
    done
fi
[ -x "${AGENT:-}" ] || { echo "no agent binary: cargo build --release --example agent, or set FLEET_AGENT" >&2; exit 1; }
OUT="${FLEET_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpumon-fleet.XXXXXX")}"
mkdir -p "$OUT"
export BACKENDS_STATE_DIR="${BACKENDS_STATE_DIR:-$OUT/backends}"
INSTANCE="fleet$$"
VM="http://127.0.0.1:$PORT"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    BACKEND_INSTANCE="$INSTANCE" "$B/stop-victoria-metrics.sh" >/dev/null 2>&1 || true
}
trap cleanup EXIT
BACKEND_INSTANCE="$INSTANCE" VM_PORT="$PORT" "$B/start-victoria-metrics.sh" 2>"$OUT/vm-start.log"

ticks=$(getconf CLK_TCK)
echo "agent: $AGENT; $N agents x $PROFILE at $INTERVAL for ${DURATION}s -> $VM" >&2
for i in $(seq 1 "$N"); do
    "$AGENT" --backend mock --mock-profile "$PROFILE" --host "fleet-$i" --interval "$INTERVAL" \
        --remote-write-url "$VM/api/v1/write" --log warn >/dev/null 2>"$OUT/agent-$i.log" &
    pids+=($!)
done
start=$(date +%s.%N)
sleep "$DURATION"
# CPU (utime + stime) and RSS of every agent, just before it is stopped.
: > "$OUT/agents.csv"
for i in $(seq 1 "$N"); do
    p=${pids[$((i-1))]}
    read -r ut st < <(awk '{print $14, $15}' "/proc/$p/stat")
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status")
    hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status")
    echo "$i,$ut,$st,$rss,$hwm" >> "$OUT/agents.csv"
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()
end=$(date +%s.%N)
curl -fsS "$VM/internal/force_flush" >/dev/null || true
sleep 2
curl -fsS "$VM/metrics" > "$OUT/vm-metrics.txt"
q() { curl -fsS --get "$VM/api/v1/query" --data-urlencode "query=$1" --data-urlencode "time=$(date +%s)"; }
q 'count_over_time(gpumon_up{host=~"fleet-.*",gpu="0"}[1h])' > "$OUT/up-counts.json"
q 'max_over_time(gpumon_samples_total{host=~"fleet-.*"}[1h])' > "$OUT/samples-total.json"
q 'count(last_over_time({host=~"fleet-.*"}[1h]))' > "$OUT/series.json"
q 'sum(count_over_time({host=~"fleet-.*"}[1h]))' > "$OUT/points.json"
python3 - "$OUT" "$N" "$DURATION" "$start" "$end" "$ticks" "$AGENT" "$PROFILE" "$INTERVAL" <<'PY'
import json, os, re, sys
out, n, duration, start, end, ticks, agent, profile, interval = sys.argv[1:]
n, duration, ticks = int(n), float(duration), int(ticks)
wall = float(end) - float(start)
def vec(name):
    return {r["metric"].get("host"): float(r["value"][1]) for r in json.load(open(os.path.join(out, name)))["data"]["result"]}
up, taken = vec("up-counts.json"), vec("samples-total.json")
points = sum(vec("points.json").values())
series = sum(vec("series.json").values())
rows = 0.0
for line in open(os.path.join(out, "vm-metrics.txt")):
    m = re.match(r'vm_rows_inserted_total\{type="promremotewrite"\} (\S+)', line)
    if m:
        rows = float(m.group(1))
agents = [l.strip().split(",") for l in open(os.path.join(out, "agents.csv"))]
cpu = [(int(u) + int(s)) / ticks / duration * 100 for _, u, s, _, _ in agents]
rss = [int(r) / 1024 for *_, r, _ in agents]
hwm = [int(h) / 1024 for *_, h in agents]
# One gpumon_up{gpu="0"} sample per snapshot: the agent's count in its last pushed snapshot
# includes that snapshot.
lost = {h: taken[h] - up.get(h, 0) for h in taken}
missing_hosts = n - len(up)
def stats(xs):
    xs = sorted(xs)
    return f"min {xs[0]:.2f} / median {xs[len(xs)//2]:.2f} / max {xs[-1]:.2f}"
print(f"## Remote-write fleet: {n} agents x {profile} at {interval}, {duration:.0f} s, one VictoriaMetrics\n")
print(f"- agent binary: `{agent}`")
print(f"- series per agent: {series / max(len(up), 1):.0f}; series in total: {series:.0f}")
print(f"- samples stored: {points:.0f} (VictoriaMetrics rows inserted via remote write: {rows:.0f})")
print(f"- ingest rate: {rows / wall:.0f} samples/s over {wall:.0f} s wall ({rows / wall / n:.0f} per agent)")
print(f"- agent CPU (% of one core): {stats(cpu)}")
print(f"- agent RSS at the end (MiB): {stats(rss)}; peak (VmHWM): {stats(hwm)}")
print(f"- samples lost: {sum(max(0, v) for v in lost.values()) * (series / max(len(up), 1)):.0f} "
      f"(snapshots lost per agent: {stats(list(lost.values())) if lost else 'n/a'}; agents with no data: {missing_hosts})")
json.dump({"agents": n, "duration_s": duration, "wall_s": wall, "series": series, "points": points, "rows": rows,
           "cpu_pct": cpu, "rss_mib": rss, "hwm_mib": hwm, "lost_snapshots": lost}, open(os.path.join(out, "summary.json"), "w"))
PY
echo "output: $OUT" >&2

#!/usr/bin/env bash
# Makes the web view's screenshots in docs/: the example agent on the mock, in headless Chromium
# (scripts/web-browser.py), after SECONDS of live data:
#   docs/web.png      h100x8, dataloader-starved scenario, diagnosis window 5 s, processes on
#   docs/web-64.png   h100x64, imbalance scenario, diagnosis window 5 s (the overview, folded findings)
#   docs/web-mig.png  a100x8-mig, processes on (GPUs and their MIG instances)
# Run by hand after changing the page; needs `chromium` (scripts/backends/install.sh chromium).
#
#   scripts/screenshot-web.sh [OUT_DIR] [SECONDS]      (default docs/, 20)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/docs}"
WAIT="${2:-20}"
PORT="${GPUMON_WEB_PORT:-19402}"
command -v chromium >/dev/null || { echo "chromium not found: scripts/backends/install.sh chromium" >&2; exit 1; }
cd "$REPO"
cargo build --example agent
BIN="${CARGO_TARGET_DIR:-$REPO/target}/debug/examples/agent"
agent=""
trap '[ -n "$agent" ] && kill "$agent" 2>/dev/null; wait 2>/dev/null || true' EXIT

# shot FILE SIZE [--full-page] -- AGENT ARGS...
shot() {
    local file="$1" size="$2" full="$3"
    shift 4
    "$BIN" --backend mock --interval 500ms --web-listen "127.0.0.1:$PORT" "$@" >/dev/null 2>&1 &
    agent=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$PORT/api/snapshot" >/dev/null && break
        sleep 0.1
    done
    python3 "$REPO/scripts/web-browser.py" "http://127.0.0.1:$PORT/" --at "$WAIT" --size "$size" $full \
        --screenshot "$OUT/$file" >/dev/null
    kill "$agent"
    wait "$agent" 2>/dev/null || true
    agent=""
    echo "wrote $OUT/$file"
}

shot web.png 1280x1000 "" -- --mock-profile h100x8 --mock-scenario dataloader-starved --diagnose-window 5s \
    --enable processes --host gpu-node-01
# The whole page: its height at 64 GPUs is part of what the picture shows. The window is as tall
# as the page, so that every card counts as on screen and draws its chart.
shot web-64.png 1280x4600 --full-page -- --mock-profile h100x64 --mock-scenario imbalance --diagnose-window 5s \
    --host gpu-node-64
shot web-mig.png 1280x1000 "" -- --mock-profile a100x8-mig --enable processes --host mig-node-01

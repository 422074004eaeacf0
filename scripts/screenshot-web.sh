#!/usr/bin/env bash
# Makes docs/web.png: the web view of the example agent on the mock (h100x8, training scenario,
# diagnosis on), after OUT seconds of live data, in headless Chromium (scripts/web-browser.py).
# Run by hand after changing the page; needs `chromium` (scripts/backends/install.sh chromium).
#
#   scripts/screenshot-web.sh [OUT.png] [SECONDS]      (default docs/web.png, 20)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/docs/web.png}"
WAIT="${2:-20}"
PORT="${GPUMON_WEB_PORT:-19402}"
command -v chromium >/dev/null || { echo "chromium not found: scripts/backends/install.sh chromium" >&2; exit 1; }
cd "$REPO"
cargo build --example agent
BIN="${CARGO_TARGET_DIR:-$REPO/target}/debug/examples/agent"
"$BIN" --backend mock --mock-profile h100x8 --mock-scenario dataloader-starved --interval 500ms --diagnose-window 5s --enable processes \
    --web-listen "127.0.0.1:$PORT" --host gpu-node-01 >/dev/null 2>&1 &
agent=$!
trap 'kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/api/snapshot" >/dev/null && break
    sleep 0.1
done
python3 "$REPO/scripts/web-browser.py" "http://127.0.0.1:$PORT/" --at "$WAIT" --size 1280x1000 \
    --screenshot "$OUT" >/dev/null
echo "wrote $OUT"

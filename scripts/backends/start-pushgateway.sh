#!/usr/bin/env bash
# Start the Prometheus Pushgateway (Debian package "prometheus-pushgateway",
# 1.5.1) on 127.0.0.1 with its persistence file in a temporary directory.
#
#   PUSHGW_PORT        listen port                     (default 19191)
#   PUSHGW_EXTRA_ARGS  extra command-line flags, word-split
#   PUSHGW_SCHEME      https when PUSHGW_EXTRA_ARGS has a --web.config.file with TLS
#                      (start-pushgateway-tls.sh; readiness via BACKENDS_CURL_TLS)
#   BACKEND_INSTANCE, KEEP_DATA: see lib.sh (KEEP_DATA=1 stop + KEEP_DATA=1
#                      start keeps the pushed groups: the gateway writes its
#                      persistence file on SIGTERM and reloads it on start)
#
# Ready when GET /-/ready answers 200.
# Push:  curl -X PUT --data-binary @file http://127.0.0.1:19191/metrics/job/<job>/instance/<inst>
# Read:  /metrics (exposition text), /api/v1/metrics (JSON); admin API on
#        (PUT /api/v1/admin/wipe removes every group).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
need_cmd prometheus-pushgateway prometheus-pushgateway
PORT="${PUSHGW_PORT:-19191}"
claim_instance pushgateway DATA "$PORT"

args=(--web.listen-address="$BACKENDS_BIND:$PORT"
      --persistence.file="$DATA/pushgateway.data"
      --persistence.interval=1s
      --web.enable-admin-api
      --log.level=info)
# shellcheck disable=SC2206
[ -n "${PUSHGW_EXTRA_ARGS:-}" ] && args+=($PUSHGW_EXTRA_ARGS)

serve "$NAME" "${PUSHGW_SCHEME:-http}://127.0.0.1:$PORT/-/ready" "" \
    /usr/bin/prometheus-pushgateway /usr/bin/prometheus-pushgateway "${args[@]}"
log "$NAME ready on ${PUSHGW_SCHEME:-http}://127.0.0.1:$PORT (pid $SPAWNED_PID, $READY_MS ms, data $DATA)"

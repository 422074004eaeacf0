#!/usr/bin/env bash
# Start single-node VictoriaMetrics (Debian package "victoria-metrics", 1.79.5)
# on 127.0.0.1 with a temporary storage directory.
#
#   VM_PORT        HTTP port (all ingestion + query APIs)   (default 18428)
#   VM_EXTRA_ARGS  extra command-line flags, word-split, e.g.
#                  '-httpAuth.username=u -httpAuth.password=p' (basic auth)
#   VM_SCHEME      http | https (with '-tls -tlsCertFile=… -tlsKeyFile=…' in VM_EXTRA_ARGS
#                  and BACKENDS_CURL_TLS for the readiness check: start-victoria-metrics-tls.sh)
#   BACKEND_INSTANCE, KEEP_DATA: see lib.sh
#
# Flags chosen for tests: -search.latencyOffset=0s and -search.disableCache so
# that freshly written samples are visible to /api/v1/query at once (defaults:
# 30 s offset + result cache). Samples still become searchable only ~1-1.5 s
# after GET /internal/force_flush (8-9 s without it): poll, don't sleep.
#
# Ready when GET /health answers "OK".
# Ingest on the same port: /write and /api/v2/write (Influx line protocol),
# /api/v1/write (Prometheus remote_write), /api/v1/import/prometheus (text
# exposition), /api/v1/import (JSON lines), /api/v1/import/csv.
# Query: /api/v1/query, /api/v1/query_range, /api/v1/export.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
need_cmd victoria-metrics victoria-metrics
PORT="${VM_PORT:-18428}"
claim_instance victoria-metrics DATA "$PORT"

args=(-httpListenAddr="$BACKENDS_BIND:$PORT"
      -storageDataPath="$DATA/storage"
      -retentionPeriod=100y
      -search.latencyOffset=0s
      -search.disableCache
      -loggerLevel=INFO)
# shellcheck disable=SC2206
[ -n "${VM_EXTRA_ARGS:-}" ] && args+=($VM_EXTRA_ARGS)

serve "$NAME" "${VM_SCHEME:-http}://127.0.0.1:$PORT/health" OK \
    /usr/bin/victoria-metrics /usr/bin/victoria-metrics "${args[@]}"
log "$NAME ready on ${VM_SCHEME:-http}://127.0.0.1:$PORT (pid $SPAWNED_PID, $READY_MS ms, data $DATA)"

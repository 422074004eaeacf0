#!/usr/bin/env bash
# Start the OTLP metrics receiver (otlp_receiver.py: official opentelemetry-proto
# classes + grpcio) on 127.0.0.1, appending every received data point as one
# JSON line to a file in a temporary directory.
#
#   OTLP_GRPC_PORT   OTLP/gRPC port                    (default 14317)
#   OTLP_HTTP_PORT   OTLP/HTTP port (POST /v1/metrics)  (default 14318)
#   OTLP_OUT         JSON-lines output file             (default <datadir>/otlp-metrics.jsonl)
#   OTLP_RECORD      points: one JSON line per data point; requests: one per
#                    export request with counts and distinct point times, for
#                    long runs (scripts/soak.sh)       (default points)
#   GPUMON_VENV      virtualenv made by install.sh      (default /opt/gpumon-venv)
#   BACKEND_INSTANCE, KEEP_DATA: see lib.sh (KEEP_DATA=1 keeps the JSON lines
#                    across a restart)
#
# Ready when GET http://127.0.0.1:$OTLP_HTTP_PORT/health answers OK (sent only
# after both the gRPC and the HTTP listener are up).
# Read back: GET /received on the HTTP port (JSON lines, one per data point),
# or the file printed as OTLP_OUT=... on stdout. POST /reset empties it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
PY="$GPUMON_VENV/bin/python"
[ -x "$PY" ] || die "$PY not found: run scripts/backends/install.sh (creates $GPUMON_VENV)"
"$PY" -c 'import grpc, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc' 2>/dev/null \
    || die "$GPUMON_VENV lacks grpcio/opentelemetry-proto: run scripts/backends/install.sh"
GPORT="${OTLP_GRPC_PORT:-14317}"
HPORT="${OTLP_HTTP_PORT:-14318}"
claim_instance otlp-receiver DATA "$GPORT" "$HPORT"
OUT="${OTLP_OUT:-$DATA/otlp-metrics.jsonl}"

tls_args=()
SCHEME=http
if [ -n "${OTLP_TLS_CERT:-}" ]; then
    tls_args=(--tls-cert "$OTLP_TLS_CERT" --tls-key "${OTLP_TLS_KEY:?OTLP_TLS_KEY goes with OTLP_TLS_CERT}")
    [ -n "${OTLP_TLS_CLIENT_CA:-}" ] && tls_args+=(--tls-client-ca "$OTLP_TLS_CLIENT_CA")
    SCHEME=https
fi
serve "$NAME" "$SCHEME://127.0.0.1:$HPORT/health" OK otlp_receiver.py \
    "$PY" -u "$HERE/otlp_receiver.py" --grpc-port "$GPORT" --http-port "$HPORT" --out "$OUT" \
    --record "${OTLP_RECORD:-points}" ${tls_args[@]+"${tls_args[@]}"}
log "$NAME ready: grpc 127.0.0.1:$GPORT, http 127.0.0.1:$HPORT (pid $SPAWNED_PID, $READY_MS ms, out $OUT)"
echo "OTLP_OUT=$OUT"

#!/usr/bin/env bash
# The OTLP receiver over TLS, gRPC on 127.0.0.1:${OTLP_TLS_GRPC_PORT:-14319} and HTTP on
# ${OTLP_TLS_HTTP_PORT:-14320} (instance "otlp-receiver-tls"), with the test certificates of
# make-test-certs.sh (made now if missing); no client certificate asked. Prints OTLP_OUT=<file>.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
CERTS="${GPUMON_TEST_CERTS_DIR:-$BACKENDS_STATE_DIR/certs}"
[ -f "$CERTS/server.pem" ] || "$HERE/make-test-certs.sh" >/dev/null
export BACKEND_INSTANCE=tls OTLP_GRPC_PORT="${OTLP_TLS_GRPC_PORT:-14319}" OTLP_HTTP_PORT="${OTLP_TLS_HTTP_PORT:-14320}" \
    OTLP_TLS_CERT="$CERTS/server.pem" OTLP_TLS_KEY="$CERTS/server.key" BACKENDS_CURL_TLS="--cacert $CERTS/ca.pem"
exec "$HERE/start-otlp-receiver.sh"

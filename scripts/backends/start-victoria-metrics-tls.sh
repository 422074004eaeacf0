#!/usr/bin/env bash
# VictoriaMetrics over https (`-tls`): instance "victoria-metrics-tls" on
# 127.0.0.1:${VM_TLS_PORT:-18429}, with the test certificates of make-test-certs.sh (made now if
# missing). A Prometheus remote-write receiver behind TLS (/api/v1/write), queried back over
# https on the same port. VictoriaMetrics cannot ask for client certificates (enterprise only).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
CERTS="${GPUMON_TEST_CERTS_DIR:-$BACKENDS_STATE_DIR/certs}"
[ -f "$CERTS/server.pem" ] || "$HERE/make-test-certs.sh" >/dev/null
export BACKEND_INSTANCE=tls VM_PORT="${VM_TLS_PORT:-18429}" VM_SCHEME=https \
    VM_EXTRA_ARGS="-tls -tlsCertFile=$CERTS/server.pem -tlsKeyFile=$CERTS/server.key ${VM_EXTRA_ARGS:-}" \
    BACKENDS_CURL_TLS="--cacert $CERTS/ca.pem"
exec "$HERE/start-victoria-metrics.sh"

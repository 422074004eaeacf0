#!/usr/bin/env bash
# InfluxDB 1.x over https (`https-enabled`): start-influxdb.sh with the test certificates of
# make-test-certs.sh (made now if missing), on 127.0.0.1:18090 (RPC 18091), no auth, database
# INFLUX_DB (default gpumon). InfluxDB 1.x cannot ask for client certificates.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
CERTS="${GPUMON_TEST_CERTS_DIR:-$BACKENDS_STATE_DIR/certs}"
[ -f "$CERTS/server.pem" ] || "$HERE/make-test-certs.sh" >/dev/null
INFLUX_TLS_CERT="$CERTS/server.pem" INFLUX_TLS_KEY="$CERTS/server.key" INFLUX_TLS_CA="$CERTS/ca.pem" \
    exec "$HERE/start-influxdb.sh"

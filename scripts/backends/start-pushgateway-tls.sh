#!/usr/bin/env bash
# A Pushgateway over https that requires a client certificate (mTLS), via
# `--web.config.file`: instance "pushgateway-tls" on 127.0.0.1:${PUSHGW_TLS_PORT:-19192}, with the
# test certificates of make-test-certs.sh (made now if missing): server.pem for the server,
# client certificates signed by ca.pem required.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
CERTS="${GPUMON_TEST_CERTS_DIR:-$BACKENDS_STATE_DIR/certs}"
[ -f "$CERTS/server.pem" ] || "$HERE/make-test-certs.sh" >/dev/null
WEB="$BACKENDS_STATE_DIR/pushgateway-tls-web.yml"
cat > "$WEB" <<Y
tls_server_config:
  cert_file: $CERTS/server.pem
  key_file: $CERTS/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: $CERTS/ca.pem
Y
export BACKEND_INSTANCE=tls PUSHGW_PORT="${PUSHGW_TLS_PORT:-19192}" PUSHGW_SCHEME=https \
    PUSHGW_EXTRA_ARGS="--web.config.file=$WEB" \
    BACKENDS_CURL_TLS="--cacert $CERTS/ca.pem --cert $CERTS/client.pem --key $CERTS/client.key"
exec "$HERE/start-pushgateway.sh"

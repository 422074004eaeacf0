#!/usr/bin/env bash
# Generate, at test time, the certificates of the TLS test backends (EC P-256, 2 days):
#   ca.pem / ca.key           the test CA
#   server.pem / server.key   a leaf signed by it, SAN IP:127.0.0.1 and DNS:localhost (webpki
#                             rejects a self-signed CA used as the server's own certificate)
#   client.pem / client.key   a client certificate (mTLS) signed by the CA
#   other-ca.pem              an unrelated CA: trusting it must fail the handshake
# into GPUMON_TEST_CERTS_DIR (default $BACKENDS_STATE_DIR/certs). Prints CERTS_DIR=<dir>.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
need_cmd openssl openssl
DIR="${GPUMON_TEST_CERTS_DIR:-$BACKENDS_STATE_DIR/certs}"
mkdir -p "$DIR"
cd "$DIR"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -days 2 -subj "/CN=gpumon test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.pem 2>/dev/null
key other-ca.key
openssl req -x509 -new -key other-ca.key -days 2 -subj "/CN=gpumon unrelated CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out other-ca.pem 2>/dev/null

leaf() { # NAME CN EXTFILE-LINES
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr" 2>/dev/null
    printf '%s\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
leaf server localhost "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf client gpumon-test-client "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
# influxd and the Python receiver run as this user and must read the keys.
chmod 644 ./*.pem ./*.key
openssl verify -CAfile ca.pem server.pem client.pem >/dev/null
log "test certificates in $DIR (CA, server for 127.0.0.1/localhost, client, unrelated CA)"
echo "CERTS_DIR=$DIR"

#!/usr/bin/env bash
# Start InfluxDB 1.x (Debian package "influxdb", 1.6.7~rc0) on 127.0.0.1 with
# all data (meta, data, wal) in a temporary directory.
#
#   INFLUX_AUTH       1 = enable HTTP auth and create an admin user; the
#                     instance is then named "influxdb-auth" and its ports
#                     default to 18087 / 18089, so it runs beside the plain
#                     one (start-influxdb-auth.sh sets this)   (default 0)
#   INFLUX_TLS_CERT, INFLUX_TLS_KEY, INFLUX_TLS_CA
#                     serve https with this certificate/key (CA: for the
#                     readiness check); the instance is then "influxdb-tls" on
#                     18090 / 18091 (start-influxdb-tls.sh sets these)
#   INFLUX_PORT       HTTP API port                   (default 18086, auth 18087)
#   INFLUX_RPC_PORT   backup/restore RPC port (always bound)
#                                                     (default 18088, auth 18089)
#   INFLUX_DB         database to create once ready ("" = none)  (default gpumon)
#   INFLUX_USER / INFLUX_PASSWORD   the admin user (auth only)
#                                             (default gpumon / gpumon-test-pw)
#   BACKEND_INSTANCE, KEEP_DATA: see lib.sh (KEEP_DATA=1 stop + KEEP_DATA=1
#                     start keeps the databases, points and users)
#
# Ready when GET /ping answers 204 (no credentials needed even with auth on).
# Write: POST /write?db=gpumon&precision=ns  (line protocol; 404 for a missing db)
# Query: GET  /query?db=gpumon&q=SELECT ...   (JSON)
# Auth: HTTP Basic (curl -u user:pw) or ?u=user&p=pw; 401 without.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
AUTH="${INFLUX_AUTH:-0}"
TLS_CERT="${INFLUX_TLS_CERT:-}"     # PEM certificate + INFLUX_TLS_KEY: serve https (start-influxdb-tls.sh)
if [ -n "$TLS_CERT" ]; then
    base=influxdb-tls; def_port=18090; def_rpc=18091
elif [ "$AUTH" = 1 ]; then
    base=influxdb-auth; def_port=18087; def_rpc=18089
else
    base=influxdb;      def_port=18086; def_rpc=18088
fi
PORT="${INFLUX_PORT:-$def_port}"
RPC_PORT="${INFLUX_RPC_PORT:-$def_rpc}"
DB="${INFLUX_DB-gpumon}"
USER_="${INFLUX_USER:-gpumon}"
PASS_="${INFLUX_PASSWORD:-gpumon-test-pw}"
need_cmd influxd influxdb
claim_instance "$base" DATA "$PORT" "$RPC_PORT"
[ "$AUTH" = 1 ] && auth_enabled=true || auth_enabled=false
SCHEME=http
https_conf=""
if [ -n "$TLS_CERT" ]; then
    SCHEME=https
    https_conf="  https-enabled = true
  https-certificate = \"$TLS_CERT\"
  https-private-key = \"${INFLUX_TLS_KEY:?INFLUX_TLS_KEY goes with INFLUX_TLS_CERT}\""
    export BACKENDS_CURL_TLS="--cacert ${INFLUX_TLS_CA:?INFLUX_TLS_CA (the CA of INFLUX_TLS_CERT) is needed to check readiness}"
fi

cat > "$DATA/influxdb.conf" <<C
reporting-disabled = true
bind-address = "$BACKENDS_BIND:$RPC_PORT"
[meta]
  dir = "$DATA/meta"
[data]
  dir = "$DATA/data"
  wal-dir = "$DATA/wal"
  query-log-enabled = false
[monitor]
  store-enabled = false
[subscriber]
  enabled = false
[continuous_queries]
  enabled = false
[http]
  enabled = true
  bind-address = "$BACKENDS_BIND:$PORT"
  auth-enabled = $auth_enabled
  log-enabled = true
  pprof-enabled = false
  unix-socket-enabled = false
$https_conf
[ifql]
  enabled = false
[logging]
  suppress-logo = true
C

serve "$NAME" "$SCHEME://127.0.0.1:$PORT/ping" "" /usr/bin/influxd /usr/bin/influxd run -config "$DATA/influxdb.conf"

# shellcheck disable=SC2086
q() { curl -fsS --noproxy '*' ${BACKENDS_CURL_TLS:-} -XPOST "$SCHEME://127.0.0.1:$PORT/query" "$@" >/dev/null; }
if [ "$AUTH" = 1 ]; then
    # With auth on and no users yet, InfluxDB allows exactly this statement
    # unauthenticated. A reused (KEEP_DATA=1) data dir already has the user.
    if ! { [ "$DATADIR_REUSED" = 1 ] && q -u "$USER_:$PASS_" --data-urlencode "q=SHOW DATABASES" 2>/dev/null; }; then
        q --data-urlencode "q=CREATE USER \"$USER_\" WITH PASSWORD '$PASS_' WITH ALL PRIVILEGES" \
            || { "$HERE/stop-influxdb.sh"; die "could not create admin user"; }
    fi
    if [ -n "$DB" ]; then q -u "$USER_:$PASS_" --data-urlencode "q=CREATE DATABASE \"$DB\""; fi
elif [ -n "$DB" ]; then
    q --data-urlencode "q=CREATE DATABASE \"$DB\""
fi
log "$NAME ready on $SCHEME://127.0.0.1:$PORT (pid $SPAWNED_PID, ${READY_MS} ms to /ping, db '${DB}', auth $auth_enabled, data $DATA)"

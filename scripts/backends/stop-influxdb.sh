#!/usr/bin/env bash
# Stop the InfluxDB started by start-influxdb.sh (by its saved PID) and remove
# its temporary data directory (KEEP_DATA=1 keeps it). A no-op when it is not
# running. INFLUX_AUTH=1 (or stop-influxdb-auth.sh) stops the auth-enabled
# instance instead. BACKEND_INSTANCE: see lib.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
if [ -n "${INFLUX_TLS:-}" ]; then
    stop_backend "$(instance_name influxdb-tls)"
elif [ "${INFLUX_AUTH:-0}" = 1 ]; then
    stop_backend "$(instance_name influxdb-auth)"
else
    stop_backend "$(instance_name influxdb)"
fi

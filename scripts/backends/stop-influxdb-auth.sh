#!/usr/bin/env bash
# Stop the auth-enabled InfluxDB (start-influxdb-auth.sh). KEEP_DATA=1 keeps its data.
set -euo pipefail
INFLUX_AUTH=1 exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stop-influxdb.sh"

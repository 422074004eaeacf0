#!/usr/bin/env bash
# Stop the https InfluxDB (start-influxdb-tls.sh). KEEP_DATA=1 keeps its data.
set -euo pipefail
INFLUX_TLS=1 exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stop-influxdb.sh"

#!/usr/bin/env bash
# The auth-enabled InfluxDB 1.x: start-influxdb.sh with INFLUX_AUTH=1, i.e. on
# 127.0.0.1:18087 (RPC 18089), admin user INFLUX_USER / INFLUX_PASSWORD
# (default gpumon / gpumon-test-pw), database INFLUX_DB (default gpumon).
set -euo pipefail
INFLUX_AUTH=1 exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/start-influxdb.sh"

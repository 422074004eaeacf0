#!/usr/bin/env bash
# Stop Prometheus (if running) and start it again with the current environment,
# e.g. to scrape a new target:
#   PROM_SCRAPE_TARGETS=127.0.0.1:39123 restart-prometheus.sh
# Takes the same variables as start-prometheus.sh. The TSDB is fresh unless
# KEEP_DATA=1. The first scrape again comes 5-6 s after ready.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/stop-prometheus.sh"
exec "$HERE/start-prometheus.sh"

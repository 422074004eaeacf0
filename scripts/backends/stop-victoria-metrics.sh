#!/usr/bin/env bash
# Stop the VictoriaMetrics started by start-victoria-metrics.sh (by its saved
# PID) and remove its temporary data directory (KEEP_DATA=1 keeps it). A no-op
# when it is not running. BACKEND_INSTANCE: see lib.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
stop_backend "$(instance_name victoria-metrics)"

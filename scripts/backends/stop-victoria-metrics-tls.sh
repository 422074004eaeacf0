#!/usr/bin/env bash
# Stop the https VictoriaMetrics (start-victoria-metrics-tls.sh). KEEP_DATA=1 keeps its data.
set -euo pipefail
BACKEND_INSTANCE=tls exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stop-victoria-metrics.sh"

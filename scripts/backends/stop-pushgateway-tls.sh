#!/usr/bin/env bash
# Stop the https Pushgateway (start-pushgateway-tls.sh). KEEP_DATA=1 keeps its groups.
set -euo pipefail
BACKEND_INSTANCE=tls exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stop-pushgateway.sh"

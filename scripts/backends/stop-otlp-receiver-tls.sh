#!/usr/bin/env bash
# Stop the TLS OTLP receiver (start-otlp-receiver-tls.sh). KEEP_DATA=1 keeps its JSON lines.
set -euo pipefail
BACKEND_INSTANCE=tls exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stop-otlp-receiver.sh"

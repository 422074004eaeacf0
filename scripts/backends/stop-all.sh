#!/usr/bin/env bash
# Stop every backend recorded in $BACKENDS_STATE_DIR (shared and private
# BACKEND_INSTANCE ones alike), each only by its saved PID and only if that PID
# is still the expected program, and delete their temporary data directories,
# including ones a KEEP_DATA=1 stop kept (KEEP_DATA=1 here keeps them).
# scripts/test.sh runs this on exit. Always exits 0.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
shopt -s nullglob
names=()
for f in "$BACKENDS_STATE_DIR"/*.pid "$BACKENDS_STATE_DIR"/*.datadir; do
    n="$(basename "$f")"; n="${n%.*}"
    case " ${names[*]:-} " in *" $n "*) ;; *) names+=("$n") ;; esac
done
for n in "${names[@]}"; do
    ( stop_backend "$n" ) || log "stop-all: could not stop $n"
done
exit 0

#!/usr/bin/env bash
# torch, installed once for both Python test virtualenvs, which see it through a .pth file:
#
#   gpumon-py/torch-base.sh            makes the base if it is missing; prints its site-packages
#   gpumon-py/torch-base.sh VENV       the same, then links VENV to it (VENV/.../gpumon_torch_base.pth)
#
# Why: the tests pin torch==2.15.0 (pyproject.toml's test extra, and tests-swift/requirements.txt
# with the same pin). From PyPI it brings its CUDA libraries: 5.3 GB installed. Installed into
# run-tests.sh's virtualenv and into the ms-swift test's, that was 10.6 GB of the machine's
# disk, on top of the 3.1 GB wheelhouse and cargo's target; a CI run failed on a full disk. Linked,
# each virtualenv holds only what it adds (1.1-1.2 GB), and torch is unpacked once, not twice.
#
# The link is a .pth file naming the base's site-packages: Python appends that directory to
# sys.path after the virtualenv's own, so pip sees torch and its CUDA libraries as installed
# ("Requirement already satisfied") and installs nothing of them; a package the virtualenv needs
# in another version than the base holds is installed into the virtualenv, which comes first on
# sys.path (pip does not uninstall outside the virtualenv). Nothing is ever installed into the
# base after it is complete, so the virtualenvs stay independent of each other.
#
# The base is kept in $GPUMON_TORCH_BASES (default ~/.cache/gpumon/torch-base), keyed by the
# torch pin and the Python (one kept, older ones removed). It installs from GPUMON_PY_WHEELHOUSE
# when that is set (offline, wheelhouse.sh's downloads), else from the index. Concurrent callers
# (scripts/test.sh prepares it in the background while run-tests.sh may already need it) wait on
# one lock. Environment: GPUMON_PY_BASE (the Python; default /usr/bin/python3, else python3).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASES="${GPUMON_TORCH_BASES:-$HOME/.cache/gpumon/torch-base}"
BASE="${GPUMON_PY_BASE:-}"
[ -n "$BASE" ] || { [ -x /usr/bin/python3 ] && BASE=/usr/bin/python3 || BASE=python3; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log() { printf '[%s] gpumon-py/torch-base.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
site_packages() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# The pin, from the test extra (the one place run-tests.sh's virtualenv takes it from).
pin="$("$BASE" - "$HERE/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    test = tomllib.load(f)["project"]["optional-dependencies"]["test"]
print("\n".join(r for r in test if r.replace(" ", "").startswith("torch==")))
EOF
)"
[ -n "$pin" ] || { log "ERROR: no torch==... pin in pyproject.toml's test extra"; exit 1; }
if ! grep -qxF "$pin" "$HERE/tests-swift/requirements.txt"; then
    # Still works (the ms-swift virtualenv installs its own torch over the link), at 5 GB more.
    log "WARNING: tests-swift/requirements.txt does not pin $pin as the test extra does"
fi
key="$( (printf '%s\n' "$pin"; "$BASE" -VV) | sha256sum | cut -c1-16)"
base="$BASES/$key"
mkdir -p "$BASES"

exec 9>"$BASES/.lock"
flock 9
if [ ! -f "$base/.complete" ]; then
    for old in "$BASES"/*; do [ "$old" = "$base" ] || rm -rf "$old"; done
    pip_from=()
    from="the index"
    if [ -n "${GPUMON_PY_WHEELHOUSE:-}" ]; then
        [ -f "$GPUMON_PY_WHEELHOUSE/.complete" ] || { log "ERROR: $GPUMON_PY_WHEELHOUSE is not a complete wheelhouse (gpumon-py/wheelhouse.sh)"; exit 1; }
        pip_from=(--no-index --find-links "$GPUMON_PY_WHEELHOUSE")
        from="$GPUMON_PY_WHEELHOUSE"
    fi
    t0=$(date +%s)
    "$BASE" -m venv --clear "$base"
    nice "$base/bin/pip" install -q "${pip_from[@]}" "$pin"
    touch "$base/.complete"
    log "$pin installed into $base from $from in $(( $(date +%s) - t0 )) s ($(du -sh "$base" | cut -f1))"
fi
flock -u 9
base_sp="$(site_packages "$base")"

if [ -n "${1:-}" ]; then
    venv="$1"
    [ -x "$venv/bin/python" ] || { log "ERROR: $venv is not a virtualenv"; exit 1; }
    echo "$base_sp" > "$(site_packages "$venv")/gpumon_torch_base.pth"
fi
echo "$base_sp"

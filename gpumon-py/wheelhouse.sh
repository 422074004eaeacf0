#!/usr/bin/env bash
# Downloads, once, every wheel the two test virtualenvs install, so that they install offline:
#
#   gpumon-py/wheelhouse.sh DIR
#
# - the gpumon wheel's `test` extra (pyproject.toml's pins: pytest, transformers, lightning,
#   torch, ...), which run-tests.sh installs;
# - tests-swift/requirements.txt (ms-swift 4.6.0 with its own pins, the same torch), which
#   tests-swift/run.sh installs.
# Both pin torch==2.15.0: its wheel and its CUDA libraries (most of the 3.1 GB, 168 wheels) are
# downloaded once and installed into both virtualenvs. `pip wheel` also turns the few sdists
# (oss2, crcmod, ...) into wheels (--use-pep517: built with setuptools and wheel fetched for
# the build), so the offline installs build nothing.
#
# Why not pip's own cache: pip keeps a download only when the server says it may be cached, and
# behind some proxies (this project's build machines) it stores nothing; a wheelhouse does not
# depend on that. The installs then use `pip install --no-index --find-links DIR`: with both the
# index and DIR, pip prefers the index's copy of an equal version and downloads it again.
#
# DIR holds one set: when the pins or the Python change, it is emptied and filled anew. A
# complete set is marked by DIR/.complete (holding the key); a second run with the same key
# downloads nothing. Run by scripts/test.sh in the background while cargo builds and tests
# (downloading is mostly network and disk). Environment: GPUMON_PY_BASE (the Python the
# virtualenvs use; default /usr/bin/python3, else python3).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WH="${1:?usage: wheelhouse.sh DIR}"
BASE="${GPUMON_PY_BASE:-}"
[ -n "$BASE" ] || { [ -x /usr/bin/python3 ] && BASE=/usr/bin/python3 || BASE=python3; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log() { printf '[%s] gpumon-py/wheelhouse.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t0=$(date +%s)

# The test extra's pins, as the wheel's metadata will carry them.
test_reqs="$("$BASE" - "$HERE/pyproject.toml" <<'EOF'
import sys
try:
    import tomllib
except ImportError:
    sys.exit("wheelhouse.sh: needs Python >= 3.11 (tomllib) to read pyproject.toml")
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["test"]))
EOF
)"
[ -n "$test_reqs" ] || { log "ERROR: no test extra in pyproject.toml"; exit 1; }
swift_reqs="$HERE/tests-swift/requirements.txt"
key="$( (printf '%s\n' "$test_reqs"; cat "$swift_reqs"; "$BASE" -VV) | sha256sum | cut -c1-16)"

if [ "$(cat "$WH/.complete" 2>/dev/null)" = "$key" ]; then
    log "$WH complete ($(find "$WH" -name '*.whl' | wc -l) wheels, key $key): nothing to download"
    exit 0
fi
rm -rf "$WH"
mkdir -p "$WH"
# pip, from the Python the virtualenvs use (the wheels' tags are that Python's).
pvenv="$WH/.pip-venv"
"$BASE" -m venv "$pvenv"
req_file="$WH/.test-extra.txt"
printf '%s\n' "$test_reqs" > "$req_file"
# Separate resolutions: ms-swift pins transformers<5.20, the test extra transformers 5.24.
"$pvenv/bin/pip" wheel -q --use-pep517 -w "$WH" -r "$swift_reqs"
log "ms-swift test's wheels in $WH ($(( $(date +%s) - t0 )) s)"
"$pvenv/bin/pip" wheel -q --use-pep517 -w "$WH" -r "$req_file"
rm -rf "$pvenv"
echo "$key" > "$WH/.complete"
log "$WH complete: $(find "$WH" -name '*.whl' | wc -l) wheels, $(du -sh "$WH" | cut -f1) in $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Builds the gpumon wheel and runs the Python tests against it in a clean virtualenv:
#
#   gpumon-py/run-tests.sh [pytest args...]
#
# 1. maturin (pinned in pyproject.toml) in a build virtualenv of its own, reused while its
#    version matches;
# 2. `maturin build` — the dev profile (debug, like `cargo test`): it shares CARGO_TARGET_DIR
#    with the cargo build, so CI compiles only the extension itself; a release build would
#    recompile every dependency with optimisations, minutes on 2 cores. GPUMON_PY_RELEASE=1
#    builds the release wheel instead (what `pip install ./gpumon-py` builds);
# 3. the example agent (target/debug/examples/agent) for the StepClient tests;
# 4. a NEW virtualenv with only the wheel and tests/requirements.txt, then pytest.
#
# Environment: GPUMON_PY_BASE (the Python that makes the virtualenvs; default /usr/bin/python3,
# else python3), GPUMON_PY_WORK (work dir; default $TMPDIR/gpumon-py-tests). Tests that need
# scripts/test.sh's servers read GPUMON_TEST_* and skip, naming the variable, without them.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
WORK="${GPUMON_PY_WORK:-${TMPDIR:-/tmp}/gpumon-py-tests}"
BASE="${GPUMON_PY_BASE:-}"
[ -n "$BASE" ] || { [ -x /usr/bin/python3 ] && BASE=/usr/bin/python3 || BASE=python3; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log() { printf '[%s] gpumon-py/run-tests.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
mkdir -p "$WORK"
t0=$(date +%s)

maturin_req="$(sed -n 's/.*"\(maturin==[^"]*\)".*/\1/p' "$HERE/pyproject.toml" | head -n1)"
[ -n "$maturin_req" ] || { log "ERROR: no pinned maturin in pyproject.toml"; exit 1; }
bvenv="$WORK/build-venv"
if [ "$(cat "$bvenv/.maturin" 2>/dev/null)" != "$maturin_req" ]; then
    log "build virtualenv with $maturin_req"
    "$BASE" -m venv --clear "$bvenv"
    "$bvenv/bin/pip" install -q "$maturin_req"
    echo "$maturin_req" > "$bvenv/.maturin"
fi

profile=(); [ "${GPUMON_PY_RELEASE:-0}" = 1 ] && profile=(--release)
rm -rf "$WORK/wheels"
log "maturin build ${profile[*]:-(dev profile)}"
"$bvenv/bin/maturin" build --quiet -m "$HERE/Cargo.toml" -i "$BASE" --out "$WORK/wheels" "${profile[@]}" >&2
wheel="$(ls "$WORK"/wheels/gpumon-*.whl)"
log "built $(basename "$wheel") ($(( $(date +%s) - t0 )) s)"

# The features of scripts/test.sh's `cargo test --workspace --all-features`: there, a no-op.
(cd "$REPO" && cargo build -q --workspace --all-features --example agent)
export GPUMON_TEST_AGENT="${CARGO_TARGET_DIR:-$REPO/target}/debug/examples/agent"

tvenv="$WORK/test-venv"
"$BASE" -m venv --clear "$tvenv"
"$tvenv/bin/pip" install -q "$wheel" -r "$HERE/tests/requirements.txt"
log "test virtualenv ready ($(( $(date +%s) - t0 )) s); pytest"
# From the tests directory, so `import gpumon` can only find the installed wheel.
cd "$HERE/tests"
exec "$tvenv/bin/python" -m pytest -p no:cacheprovider -rs "$@" .

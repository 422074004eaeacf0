#!/usr/bin/env bash
# Builds the release wheel and runs the Python tests against it in a clean virtualenv:
#
#   gpumon-py/run-tests.sh [pytest args...]
#
# 1. the wheel people install: build-wheel.sh (release code, stripped, manylinux2014, abi3;
#    ~6 min on 2 cores from a cold cache). GPUMON_PY_DEV=1 builds a dev-profile wheel with
#    plain maturin instead (shares `cargo test`'s build, for quick local runs; not for CI);
# 2. the sdist, built with maturin (pinned in pyproject.toml);
# 3. the example agent (target/debug/examples/agent) for the StepClient tests;
# 4. a NEW virtualenv: the wheel installed with a PATH that has no cargo or rustc and
#    --only-binary (nothing compiled; the time it takes is printed), then the wheel's `test`
#    extra (pyproject.toml: pytest, transformers, lightning with torch, tensorboard, wandb, mypy;
#    torch and its CUDA libraries from torch-base.sh's shared install, the rest, 1.2 GB, into
#    the virtualenv; measured once on 2 shared cores before the sharing: 265 s from the index,
#    128 s offline from GPUMON_PY_WHEELHOUSE);
# 5. mypy's stubtest: python/gpumon/_gpumon.pyi checked against the installed extension (every
#    name, signature and property; ~4 s, measured once on 2 shared cores);
# 6. pytest, which also checks the wheel's tags and the sdist's one-line "needs Rust" error
#    (GPUMON_TEST_WHEEL, GPUMON_TEST_SDIST).
#
# Environment: GPUMON_PY_BASE (the Python that makes the virtualenvs; default /usr/bin/python3,
# else python3), GPUMON_PY_WORK (work dir; default $TMPDIR/gpumon-py-tests),
# GPUMON_PY_WHEELHOUSE (a directory filled by wheelhouse.sh: step 4 installs the test extra from
# it, offline, instead of downloading it; scripts/test.sh sets it). Tests that need
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

if [ "${GPUMON_PY_PREBUILT:-0}" = 1 ]; then
    # scripts/test.sh built the release wheel (build-wheel.sh, into $WORK/wheels) while cargo
    # test ran.
    wheel="$(ls "$WORK"/wheels/gpumon_nvml-*.whl)"
    log "the wheel built beforehand: $(basename "$wheel")"
elif [ "${GPUMON_PY_DEV:-0}" = 1 ]; then
    rm -rf "$WORK/wheels"
    maturin_req="$(sed -n 's/.*"\(maturin==[^"]*\)".*/\1/p' "$HERE/pyproject.toml" | head -n1)"
    bvenv="$WORK/dev-build-venv"
    if [ "$(cat "$bvenv/.maturin" 2>/dev/null)" != "$maturin_req" ]; then
        "$BASE" -m venv --clear "$bvenv"
        "$bvenv/bin/pip" install -q "$maturin_req"
        echo "$maturin_req" > "$bvenv/.maturin"
    fi
    log "maturin build --profile dev (GPUMON_PY_DEV=1: not the release wheel)"
    "$bvenv/bin/maturin" build --quiet -m "$HERE/Cargo.toml" -i "$BASE" --profile dev --out "$WORK/wheels" >&2
    wheel="$(ls "$WORK"/wheels/gpumon_nvml-*.whl)"
else
    rm -rf "$WORK/wheels"
    QUIET="${QUIET:-1}" GPUMON_PY_WORK="$WORK/build" "$HERE/build-wheel.sh" "$WORK/wheels" >/dev/null
    wheel="$(ls "$WORK"/wheels/gpumon_nvml-*.whl)"
fi
log "built $(basename "$wheel") ($(( $(date +%s) - t0 )) s)"
maturin=""
for m in "$WORK/build/build-venv/bin/maturin" "$WORK/dev-build-venv/bin/maturin"; do
    [ -x "$m" ] && { maturin="$m"; break; }
done
[ -n "$maturin" ] || { log "ERROR: no maturin in $WORK"; exit 1; }
rm -f "$WORK"/wheels/gpumon_nvml-*.tar.gz
"$maturin" sdist -m "$HERE/Cargo.toml" --out "$WORK/wheels" >&2
sdist="$(ls "$WORK"/wheels/gpumon_nvml-*.tar.gz)"
log "sdist $(basename "$sdist")"

# The features of scripts/test.sh's `cargo test --workspace --all-features`: there, a no-op.
(cd "$REPO" && cargo build -q --workspace --all-features --example agent)
export GPUMON_TEST_AGENT="${CARGO_TARGET_DIR:-$REPO/target}/debug/examples/agent"

# A PATH without Rust: what a user without a toolchain has. The wheel must install there.
norust="$WORK/norust-bin"
rm -rf "$norust"; mkdir -p "$norust"
norust_path="$norust"
IFS=: read -r -a dirs <<< "$PATH"
for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ -d "$d" ] || continue
    if [ -x "$d/cargo" ] || [ -x "$d/rustc" ]; then continue; fi
    norust_path="$norust_path:$d"
done
if PATH="$norust_path" command -v cargo >/dev/null || PATH="$norust_path" command -v rustc >/dev/null; then
    log "ERROR: could not make a PATH without cargo/rustc"; exit 1
fi

tvenv="$WORK/test-venv"
"$BASE" -m venv --clear "$tvenv"
t1=$(date +%s%3N)
PATH="$norust_path" "$tvenv/bin/pip" install -q --only-binary :all: --no-deps "$wheel"
log "wheel installed without Rust in $(( $(date +%s%3N) - t1 )) ms ($(( $(stat -c %s "$wheel") / 1024 )) KiB)"
# torch with its CUDA libraries (5.3 GB), installed once and shared with the ms-swift test's
# virtualenv (torch-base.sh says why); the test extra's other packages go into this one.
"$HERE/torch-base.sh" "$tvenv" >/dev/null
if [ -n "${GPUMON_PY_WHEELHOUSE:-}" ]; then
    # wheelhouse.sh's downloads (scripts/test.sh fetched them while cargo ran): nothing from the
    # network here, and torch's download is shared with the ms-swift test's virtualenv.
    [ -f "$GPUMON_PY_WHEELHOUSE/.complete" ] || { log "ERROR: $GPUMON_PY_WHEELHOUSE is not a complete wheelhouse (gpumon-py/wheelhouse.sh)"; exit 1; }
    "$tvenv/bin/pip" install -q --no-index --find-links "$GPUMON_PY_WHEELHOUSE" "${wheel}[test]"
else
    "$tvenv/bin/pip" install -q "${wheel}[test]"
fi
log "test virtualenv ready ($(( $(date +%s) - t0 )) s); stubtest"
# From the tests directory, so `import gpumon` can only find the installed wheel.
t1=$(date +%s%3N)
(cd "$HERE/tests" && "$tvenv/bin/python" -m mypy.stubtest gpumon._gpumon)
log "stubs match the module ($(( $(date +%s%3N) - t1 )) ms); pytest"
export GPUMON_TEST_WHEEL="$wheel" GPUMON_TEST_SDIST="$sdist" GPUMON_TEST_NORUST_PATH="$norust_path"
cd "$HERE/tests"
exec "$tvenv/bin/python" -m pytest -p no:cacheprovider -rs "$@" .

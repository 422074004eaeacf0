#!/usr/bin/env bash
# Builds the release wheel of gpumon-nvml, the one to publish and install:
#
#   gpumon-py/build-wheel.sh [OUT_DIR]        (default: target/wheels)
#
# - maturin (pinned in pyproject.toml) and ziglang in a build virtualenv of their own, reused
#   while their versions match;
# - `maturin build --zig --compatibility manylinux2014`: zig links against glibc 2.17's symbol
#   versions, so the wheel installs on any x86_64 Linux with glibc >= 2.17 (the manylinux2014 /
#   manylinux_2_17 tag), not only on a machine like the one that built it; maturin's own
#   auditwheel check refuses the tag if a library needs more;
# - the `wheel` cargo profile (pyproject.toml: release code, no debug information, stripped);
# - abi3 (Cargo.toml: pyo3 `abi3-py39`): one wheel for CPython 3.9 and later;
# - cargo's progress is shown (QUIET=1 hides it).
#
# Then it checks what it claims: the tags in the file name, no debug sections in the extension,
# the highest glibc symbol version it needs, and prints the wheel's size.
#
# Environment: GPUMON_PY_BASE (the Python for the build virtualenv; default /usr/bin/python3),
# GPUMON_PY_WORK (work dir; default $TMPDIR/gpumon-py-build).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
OUT="${1:-${CARGO_TARGET_DIR:-$REPO/target}/wheels}"
WORK="${GPUMON_PY_WORK:-${TMPDIR:-/tmp}/gpumon-py-build}"
BASE="${GPUMON_PY_BASE:-}"
[ -n "$BASE" ] || { [ -x /usr/bin/python3 ] && BASE=/usr/bin/python3 || BASE=python3; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log() { printf '[%s] build-wheel.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# The zig release maturin's --zig is tested with here; pinned like maturin.
ZIG_REQ="ziglang==0.17.0"
mkdir -p "$WORK" "$OUT"
t0=$(date +%s)

maturin_req="$(sed -n 's/.*"\(maturin==[^"]*\)".*/\1/p' "$HERE/pyproject.toml" | head -n1)"
[ -n "$maturin_req" ] || { log "ERROR: no pinned maturin in pyproject.toml"; exit 1; }
bvenv="$WORK/build-venv"
if [ "$(cat "$bvenv/.reqs" 2>/dev/null)" != "$maturin_req $ZIG_REQ" ]; then
    log "build virtualenv with $maturin_req $ZIG_REQ"
    "$BASE" -m venv --clear "$bvenv"
    "$bvenv/bin/pip" install -q "$maturin_req" "$ZIG_REQ"
    echo "$maturin_req $ZIG_REQ" > "$bvenv/.reqs"
fi

rm -f "$OUT"/gpumon_nvml-*.whl
quiet=(); [ "${QUIET:-0}" = 1 ] && quiet=(--quiet)
log "maturin build --zig --compatibility manylinux2014 (profile wheel: release, stripped)"
# maturin finds zig through the `ziglang` module of the Python that runs it: the venv's.
PATH="$bvenv/bin:$PATH" "$bvenv/bin/maturin" build "${quiet[@]}" -m "$HERE/Cargo.toml" -i "$BASE" \
    --zig --compatibility manylinux2014 --out "$OUT" >&2
wheel="$(ls "$OUT"/gpumon_nvml-*.whl)"

# What the wheel claims, checked.
name="$(basename "$wheel")"
case "$name" in
    *-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl|*-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl) ;;
    *) log "ERROR: $name is not tagged cp39-abi3 manylinux_2_17 / manylinux2014"; exit 1 ;;
esac
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
"$BASE" -m zipfile -e "$wheel" "$tmp"
so="$(ls "$tmp"/gpumon/_gpumon*.so)"
if readelf -S "$so" | grep -qE '\.debug_(info|line)|\.symtab'; then
    log "ERROR: $(basename "$so") still has debug sections or a symbol table"; exit 1
fi
glibc="$(readelf --version-info --wide "$so" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sort -uV | tail -n1)"
log "built $name in $(( $(date +%s) - t0 )) s"
log "  wheel $(( $(stat -c %s "$wheel") / 1024 )) KiB, extension $(( $(stat -c %s "$so") / 1024 )) KiB (stripped), needs $glibc at most"
echo "$wheel"

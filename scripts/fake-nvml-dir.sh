#!/usr/bin/env bash
# Builds the fake libnvidia-ml (fake-nvml) and prints a directory holding it under
# NVIDIA's names, so that any NVML program runs on it unmodified:
#
#   LD_LIBRARY_PATH=$(scripts/fake-nvml-dir.sh) nvidia-smi-like-program
#   LD_LIBRARY_PATH=$(scripts/fake-nvml-dir.sh --release) GPUMON_FAKE_NVML_PROFILE=a100x8-mig gpustat --json
#
# Usage: scripts/fake-nvml-dir.sh [--release] [--no-build]
# Creates target/<profile>/fake-nvml/{libnvidia-ml.so.1,libnvidia-ml.so} -> ../libgpumon_fake_nvml.so
# (symlinks; the cdylib has SONAME libnvidia-ml.so.1) and prints that directory on stdout.
# Build output goes to stderr. Configuration: GPUMON_FAKE_NVML_* (see docs/fake-nvml.md).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile=debug
build=1
for arg in "$@"; do
    case "$arg" in
        --release) profile=release ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "fake-nvml-dir.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done
cd "$REPO"
target="${CARGO_TARGET_DIR:-$REPO/target}"
if [ "$build" = 1 ]; then
    flags=(-p gpumon-fake-nvml --lib)
    [ "$profile" = release ] && flags+=(--release)
    cargo build "${flags[@]}" >&2
fi
lib="$target/$profile/libgpumon_fake_nvml.so"
[ -f "$lib" ] || { echo "fake-nvml-dir.sh: $lib not found (build failed?)" >&2; exit 1; }
dir="$target/$profile/fake-nvml"
mkdir -p "$dir"
ln -sf ../libgpumon_fake_nvml.so "$dir/libnvidia-ml.so.1"
ln -sf ../libgpumon_fake_nvml.so "$dir/libnvidia-ml.so"
echo "$dir"

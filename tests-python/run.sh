#!/usr/bin/env bash
# Runs the Python client tests against the fake libnvidia-ml: NVIDIA's `nvidia-ml-py` (pynvml) and
# `gpustat`, unmodified, loaded through LD_LIBRARY_PATH.
#
#   GPUMON_TEST_PYTHON=/path/to/venv/bin/python tests-python/run.sh [unittest args...]
#
# GPUMON_TEST_PYTHON: a Python with nvidia-ml-py and gpustat installed (scripts/test.sh creates
# the venv). Unset: `python3`, and the tests are skipped (exit 0) if the modules are missing;
# set: missing modules are a failure. Builds the fake (scripts/fake-nvml-dir.sh) and the
# expected-values tool first.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${GPUMON_TEST_PYTHON:-python3}"
cd "$REPO"
if ! "$PY" -c 'import pynvml, gpustat' 2>/dev/null; then
    if [ -n "${GPUMON_TEST_PYTHON:-}" ]; then
        echo "tests-python/run.sh: $PY lacks nvidia-ml-py or gpustat" >&2
        exit 1
    fi
    echo "tests-python/run.sh: SKIPPED (python3 lacks nvidia-ml-py/gpustat; set GPUMON_TEST_PYTHON)" >&2
    exit 0
fi
export GPUMON_FAKE_NVML_DIR="$(scripts/fake-nvml-dir.sh)"
cargo build -q -p gpumon-fake-nvml --bin gpumon-fake-nvml-expect >&2
export GPUMON_FAKE_NVML_EXPECT="${CARGO_TARGET_DIR:-$REPO/target}/debug/gpumon-fake-nvml-expect"
export GPUMON_TEST_PYTHON="$PY"
exec "$PY" -m unittest discover -s "$REPO/tests-python" -p 'test_*.py' -v "$@"

#!/usr/bin/env bash
# The project's test command:
#
#   ./scripts/test.sh [cargo test args...] [-- test binary args...]
#       e.g. ./scripts/test.sh -p gpumon-sinks -- --nocapture
#
# 1. installs the real backends (scripts/backends/install.sh; idempotent, fast
#    when already installed; needs root only the first time),
# 2. starts Pushgateway, InfluxDB 1.x (plain, and a second auth-enabled one),
#    VictoriaMetrics and the OTLP receiver, each on 127.0.0.1 only, plus TLS
#    instances (InfluxDB https, Pushgateway requiring a client certificate, the
#    OTLP receiver over TLS) with certificates made now by make-test-certs.sh,
#    and stops them all on exit, also on failure or Ctrl-C,
# 3. exports GPUMON_TEST_* variables that the Rust integration tests read
#    (see scripts/backends/README.md),
# 4. runs the Python client tests (tests-python/run.sh: nvidia-ml-py and gpustat on the fake
#    libnvidia-ml), then
#      cargo test --workspace --all-features [cargo args] -- --include-ignored \
#          --skip manual_ --skip subprocess_ [test binary args]
#    then the gpumon Python package's tests (gpumon-py/run-tests.sh: the wheel built with maturin,
#    installed into a clean virtualenv, pytest), then the real ms-swift test on that wheel
#    (gpumon-py/tests-swift/run.sh: `swift sft` with gpumon's plugin), and exits non-zero if any
#    of them failed. The Python virtualenvs' downloads (gpumon-py/wheelhouse.sh) and the ms-swift
#    virtualenv's install start in the background before the backends, while cargo runs.
#
# Tests that need these servers (or the venv's nvml.h) are #[ignore = "needs scripts/test.sh
# (...)"]: a plain `cargo test` lists them as ignored, never as passed, and here they run
# (--include-ignored). Ignored tests whose name starts with `manual_` (measurements) or
# `subprocess_` (the child half of a test that re-runs its own binary) are not tests to run here.
#
# Prometheus is not started here: a test starts it itself, after its gpumon
# agent is listening, with PROM_SCRAPE_TARGETS=127.0.0.1:<port>
# $GPUMON_TEST_BACKENDS_DIR/start-prometheus.sh (or restart-prometheus.sh),
# and stops it with stop-prometheus.sh. The first scrape comes 5-6 s after it
# is ready. Anything a test leaves running in $BACKENDS_STATE_DIR is stopped
# here on exit.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="$REPO/scripts/backends"
# A state dir of test.sh's own (not lib.sh's default, which people use when
# they run the start/stop scripts by hand), so cleaning up never touches
# backends that test.sh did not start.
export BACKENDS_STATE_DIR="${GPUMON_TEST_STATE_DIR:-${TMPDIR:-/tmp}/gpumon-test-run}"
export GPUMON_VENV="${GPUMON_VENV:-/opt/gpumon-venv}"
cd "$REPO"

log() { printf '[%s] test.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v cargo >/dev/null || { log "ERROR: cargo not found in PATH"; exit 1; }

# ------------------------------------------------------------------ install
"$B/install.sh"
# Figures the docs and manifests cite from BENCHMARKS.md are in its current tables.
"$REPO/scripts/check-bench-citations.py"

# ------------------------------------------------------------------ one run at a time
# The ports are fixed, so two runs cannot share a machine. An owner file (not a
# *.pid, which stop-all.sh would take for a backend) tells a live run apart
# from the leftovers of one that was killed before its exit trap ran.
mkdir -p "$BACKENDS_STATE_DIR"
owner="$BACKENDS_STATE_DIR/test-run.owner"
if [ -f "$owner" ]; then
    opid="$(cat "$owner" 2>/dev/null || true)"
    if [ -n "$opid" ] && [ "$opid" != $$ ] && kill -0 "$opid" 2>/dev/null \
            && tr '\0' ' ' < "/proc/$opid/cmdline" 2>/dev/null | grep -q 'test\.sh'; then
        log "ERROR: another scripts/test.sh (pid $opid) is running with state dir $BACKENDS_STATE_DIR"
        exit 1
    fi
    log "cleaning up after an earlier run (pid ${opid:-?}) that was killed before its exit trap"
    "$B/stop-all.sh"    # only the PIDs that run recorded, each checked against its program
else
    for f in "$BACKENDS_STATE_DIR"/*.pid; do
        [ -e "$f" ] || continue
        if kill -0 "$(cat "$f")" 2>/dev/null; then
            log "ERROR: $(basename "$f" .pid) (pid $(cat "$f")) runs under $BACKENDS_STATE_DIR but was not started by test.sh;"
            log "       stop it with: BACKENDS_STATE_DIR=$BACKENDS_STATE_DIR $B/stop-all.sh"
            exit 1
        fi
    done
    "$B/stop-all.sh" 2>/dev/null   # tidy stale records and data dirs
fi
echo $$ > "$owner"

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_prepare
    stop_wheel
    log "stopping backends"
    "$B/stop-all.sh" || true
    rm -f "$owner"
    exit "$rc"
}
# cargo runs in its own process group (setsid) in the background, so that a
# signal to this script alone (e.g. from `timeout`) is acted on at once: it is
# passed on to cargo and the test binaries, then the backends are stopped.
cargo_pid=""
# The Python test virtualenvs' downloads and the ms-swift one's install, in the background (below).
prepare_pid=""
stop_prepare() {
    if [ -n "$prepare_pid" ] && kill -0 "$prepare_pid" 2>/dev/null; then
        log "stopping the Python test preparation (pid $prepare_pid)"
        kill -TERM -- "-$prepare_pid" 2>/dev/null || kill -TERM "$prepare_pid" 2>/dev/null || true
        wait "$prepare_pid" 2>/dev/null || true
    fi
    prepare_pid=""
}
# The release wheel, built in the background while the tests run (below).
wheel_pid=""
stop_wheel() {
    if [ -n "$wheel_pid" ] && kill -0 "$wheel_pid" 2>/dev/null; then
        log "stopping the wheel build (pid $wheel_pid)"
        kill -TERM -- "-$wheel_pid" 2>/dev/null || kill -TERM "$wheel_pid" 2>/dev/null || true
        wait "$wheel_pid" 2>/dev/null || true
    fi
    wheel_pid=""
}
on_signal() {
    if [ -n "$cargo_pid" ]; then
        kill -"$1" -- "-$cargo_pid" 2>/dev/null || kill -"$1" "$cargo_pid" 2>/dev/null || true
        wait "$cargo_pid" 2>/dev/null || true
    fi
    exit "$2"
}
trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

# ------------------------------------------------------------------ python test downloads, in the background
# The two Python test virtualenvs (gpumon-py/run-tests.sh's, tests-swift/run.sh's real ms-swift)
# need 3.1 GB of wheels, torch 2.15.0 and its CUDA libraries in both. gpumon-py/wheelhouse.sh
# downloads them once into $GPUMON_PY_WHEELHOUSE (kept: a second run downloads nothing), then
# tests-swift/run.sh --prepare installs the ms-swift virtualenv from there (kept too), after
# gpumon-py/torch-base.sh's one install of torch that both virtualenvs share (5.3 GB). Both need
# no gpumon wheel, so they run now, niced, while cargo builds and tests (CPU-bound; this is
# mostly network and disk); run-tests.sh and the ms-swift test wait for them below. Log:
# $prepare_log, printed on failure.
skip_python="${GPUMON_TEST_SKIP_PYTHON:-0}"
export GPUMON_PY_WHEELHOUSE="${GPUMON_PY_WHEELHOUSE:-$HOME/.cache/gpumon/wheelhouse}"
prepare_log="$BACKENDS_STATE_DIR/python-prepare.log"
wheelhouse_done="$BACKENDS_STATE_DIR/wheelhouse.done"
rm -f "$prepare_log" "$wheelhouse_done"
if [ "$skip_python" != 1 ]; then
    setsid nice -n 10 bash -c 'gpumon-py/wheelhouse.sh "$GPUMON_PY_WHEELHOUSE" && touch "$1" \
        && gpumon-py/tests-swift/run.sh --prepare' prepare "$wheelhouse_done" > "$prepare_log" 2>&1 &
    prepare_pid=$!
    log "Python test downloads and the ms-swift virtualenv: in the background (pid $prepare_pid, log $prepare_log)"
fi
# Waits for the background preparation: `wheelhouse` until the wheels are all there, `all` until
# it has ended. Non-zero (its log printed) if it failed.
wait_prepare() {
    local t0 rc=0
    t0=$(date +%s)
    if [ "$1" = wheelhouse ]; then
        while [ ! -f "$wheelhouse_done" ] && kill -0 "$prepare_pid" 2>/dev/null; do sleep 1; done
        [ -f "$wheelhouse_done" ] || rc=1
    else
        wait "$prepare_pid" || rc=$?
        prepare_pid=""
    fi
    log "waited $(( $(date +%s) - t0 )) s for the Python test preparation ($1)"
    if [ "$rc" -ne 0 ]; then
        log "FAILED: the Python test preparation (wheelhouse.sh, tests-swift/run.sh --prepare); its log:"
        tail -n 80 "$prepare_log" >&2
    fi
    return "$rc"
}

# ------------------------------------------------------------------ start
export INFLUX_DB=gpumon INFLUX_USER=gpumon INFLUX_PASSWORD=gpumon-test-pw
t0=$(date +%s%3N)
"$B/start-pushgateway.sh"
"$B/start-influxdb.sh"                     # 127.0.0.1:18086 (RPC 18088), no auth
"$B/start-influxdb-auth.sh"                # 127.0.0.1:18087 (RPC 18089), auth on
"$B/start-victoria-metrics.sh"
"$B/start-otlp-receiver.sh" >/dev/null     # prints OTLP_OUT=<file>; tests use /received
# TLS: a CA, a server leaf for 127.0.0.1, a client certificate and an unrelated CA, made now.
export GPUMON_TEST_CERTS_DIR="$BACKENDS_STATE_DIR/certs"
rm -rf "$GPUMON_TEST_CERTS_DIR"
"$B/make-test-certs.sh" >/dev/null
"$B/start-influxdb-tls.sh"                 # https://127.0.0.1:18090 (RPC 18091)
"$B/start-pushgateway-tls.sh"              # https://127.0.0.1:19192, client certificate required
"$B/start-otlp-receiver-tls.sh" >/dev/null # grpc 14319, http 14320, TLS
"$B/start-victoria-metrics-tls.sh"         # https://127.0.0.1:18429 (remote write over TLS)
log "backends ready in $(( $(date +%s%3N) - t0 )) ms"

# ------------------------------------------------------------------ environment for the tests
export GPUMON_TEST_BACKENDS=1
# Headless Chromium for the web view's browser tests (tests/web_browser.rs, scripts/web-browser.py).
GPUMON_TEST_CHROMIUM="$(command -v chromium)"; export GPUMON_TEST_CHROMIUM
export GPUMON_TEST_BACKENDS_DIR="$B"
export GPUMON_TEST_PUSHGATEWAY_URL=http://127.0.0.1:19191
export GPUMON_TEST_INFLUXDB_URL=http://127.0.0.1:18086
export GPUMON_TEST_INFLUXDB_DB="$INFLUX_DB"
export GPUMON_TEST_INFLUXDB_AUTH_URL=http://127.0.0.1:18087
export GPUMON_TEST_INFLUXDB_AUTH_USER="$INFLUX_USER"
export GPUMON_TEST_INFLUXDB_AUTH_PASSWORD="$INFLUX_PASSWORD"
export GPUMON_TEST_VM_URL=http://127.0.0.1:18428
export GPUMON_TEST_OTLP_GRPC=http://127.0.0.1:14317
export GPUMON_TEST_OTLP_HTTP=http://127.0.0.1:14318
export GPUMON_TEST_OTLP_RECEIVED=http://127.0.0.1:14318/received
export GPUMON_TEST_TLS_CERTS_DIR="$GPUMON_TEST_CERTS_DIR"
export GPUMON_TEST_INFLUXDB_TLS_URL=https://127.0.0.1:18090
export GPUMON_TEST_PUSHGATEWAY_TLS_URL=https://127.0.0.1:19192
export GPUMON_TEST_OTLP_TLS_GRPC=https://127.0.0.1:14319
export GPUMON_TEST_OTLP_TLS_HTTP=https://127.0.0.1:14320
export GPUMON_TEST_OTLP_TLS_RECEIVED=https://127.0.0.1:14320/received
export GPUMON_TEST_VM_TLS_URL=https://127.0.0.1:18429
export GPUMON_TEST_PROMETHEUS_BIN=/usr/bin/prometheus
export GPUMON_TEST_PROMTOOL=/usr/bin/promtool
export GPUMON_TEST_PYTHON="$GPUMON_VENV/bin/python"
nvml_inc="$(ls -d "$GPUMON_VENV"/lib/python3*/site-packages/nvidia/cu*/include 2>/dev/null | head -n1 || true)"
export GPUMON_TEST_NVML_INCLUDE_DIR="$nvml_inc"   # holds nvml.h (PyPI nvidia-nvml-dev)
env | grep -E '^GPUMON_TEST_' | sort >&2

# ------------------------------------------------------------------ python clients on the fake NVML
# NVIDIA's nvidia-ml-py and gpustat, unmodified, against the fake libnvidia-ml (tests-python/).
# GPUMON_TEST_SKIP_PYTHON=1 skips both Python suites (a developer's quick run of one Rust test
# file; CI never sets it, and the run says so).
py_rc=0
if [ "$skip_python" = 1 ]; then
    log "GPUMON_TEST_SKIP_PYTHON=1: the Python suites are NOT run (not a full test run)"
else
    log "tests-python/run.sh (nvidia-ml-py, gpustat on the fake libnvidia-ml)"
    set +e
    tests-python/run.sh
    py_rc=$?
    set -e
fi
log "python client tests exited with $py_rc"

# ------------------------------------------------------------------ test
# Split "$@" at the first `--`: what comes before goes to cargo, what comes after to the test
# binaries, after our own test-binary arguments.
cargo_args=()
bin_args=()
seen_sep=0
for a in "$@"; do
    if [ "$seen_sep" -eq 0 ] && [ "$a" = "--" ]; then
        seen_sep=1
    elif [ "$seen_sep" -eq 0 ]; then
        cargo_args+=("$a")
    else
        bin_args+=("$a")
    fi
done
# libtest's --skip matches anywhere in a test's full path: list what the filters catch, from the
# test binaries' own lists, and refuse any whose name does not start with the prefix (a real test
# that would be skipped silently: rename it). Prints how many are filtered, and why.
listed="$(cargo test --workspace --all-features "${cargo_args[@]}" -- --list --include-ignored 2>/dev/null \
    | sed -n 's/: test$//p' || true)"
filtered="$(grep -E 'manual_|subprocess_' <<<"$listed" || true)"
caught="$(grep -vE '(^|::)(manual|subprocess)_[^:]*$' <<<"$filtered" || true)"
if [ -n "$caught" ]; then
    printf '%s\n' "$caught" >&2
    echo "FAIL: the tests above would be skipped by --skip manual_/subprocess_ without being either (rename them)" >&2
    exit 1
fi
log "filtered out: $(grep -cE '(^|::)manual_' <<<"$filtered" || true) manual_ tests (measurements, run by hand)," \
    "$(grep -cE '(^|::)subprocess_' <<<"$filtered" || true) subprocess_ tests (child halves, run by their parent test)," \
    "of $(grep -c . <<<"$listed" || true) listed"
test_cmd=(cargo test --workspace --all-features --no-fail-fast "${cargo_args[@]}" -- --include-ignored --skip manual_ --skip subprocess_ "${bin_args[@]}")
# The release wheel that gpumon-py/run-tests.sh tests, built while the tests run and niced below
# them: the tests mostly wait on servers and timers (CI used 54 % of its 2 cores over a whole
# run, measured once), and the wheel's build (193 s in CI) would otherwise follow them.
py_work="${GPUMON_PY_WORK:-${TMPDIR:-/tmp}/gpumon-py-tests}"
wheel_log="$BACKENDS_STATE_DIR/python-wheel.log"
if [ "$skip_python" != 1 ]; then
    rm -rf "$py_work/wheels"
    mkdir -p "$py_work"
    QUIET=1 GPUMON_PY_WORK="$py_work/build" setsid nice -n 19 gpumon-py/build-wheel.sh "$py_work/wheels" \
        > "$wheel_log" 2>&1 &
    wheel_pid=$!
    log "the release wheel: building in the background (pid $wheel_pid, log $wheel_log)"
fi
log "${test_cmd[*]}"
setsid "${test_cmd[@]}" &
cargo_pid=$!
set +e
wait "$cargo_pid"
rc=$?
set -e
cargo_pid=""
log "cargo test exited with $rc"

# ------------------------------------------------------------------ the gpumon Python package
# gpumon-py/run-tests.sh: builds the wheel (maturin, dev profile, this CARGO_TARGET_DIR), installs
# it into a clean virtualenv with its test extra (offline, from the wheelhouse above), runs
# gpumon-py/tests/ (the InfluxDB test uses the server started above). After cargo test, which
# has built the example agent.
pkg_rc=0
swift_rc=0
if [ "$skip_python" != 1 ]; then
    wait_prepare wheelhouse || swift_rc=1
    [ "$swift_rc" -eq 0 ] || unset GPUMON_PY_WHEELHOUSE   # run-tests.sh downloads for itself
    t0=$(date +%s)
    set +e
    wait "$wheel_pid"
    pkg_rc=$?
    set -e
    wheel_pid=""
    log "waited $(( $(date +%s) - t0 )) s for the release wheel"
    if [ "$pkg_rc" -ne 0 ]; then
        log "FAILED: the release wheel's build (gpumon-py/build-wheel.sh); its log:"
        tail -n 80 "$wheel_log" >&2
    else
        log "gpumon-py/run-tests.sh (the Python package: the wheel just built, clean virtualenv, pytest)"
        set +e
        GPUMON_PY_PREBUILT=1 setsid gpumon-py/run-tests.sh &
        cargo_pid=$!
        wait "$cargo_pid"
        pkg_rc=$?
        cargo_pid=""
        set -e
    fi
    log "python package tests exited with $pkg_rc"
    # ms-swift's real `swift sft` with gpumon's plugin, on the wheel just built (issue 46), in
    # the virtualenv prepared in the background (~60 s once it is there).
    if [ "$swift_rc" -eq 0 ]; then
        wait_prepare all || swift_rc=$?
    fi
    if [ "$swift_rc" -eq 0 ] && [ "$pkg_rc" -eq 0 ]; then
        log "gpumon-py/tests-swift/run.sh (the real ms-swift: swift sft with gpumon's plugin)"
        set +e
        setsid gpumon-py/tests-swift/run.sh "$(ls "${GPUMON_PY_WORK:-${TMPDIR:-/tmp}/gpumon-py-tests}"/wheels/gpumon_nvml-*.whl)" &
        cargo_pid=$!
        wait "$cargo_pid"
        swift_rc=$?
        cargo_pid=""
        set -e
        log "ms-swift test exited with $swift_rc"
    elif [ "$swift_rc" -eq 0 ]; then
        log "ms-swift test not run: it needs the wheel that run-tests.sh failed to test"
    fi
fi

if [ "$rc" -eq 0 ] && [ "$py_rc" -ne 0 ]; then
    log "FAILED: python client tests (exit $py_rc)"
    rc=$py_rc
fi
if [ "$rc" -eq 0 ] && [ "$pkg_rc" -ne 0 ]; then
    log "FAILED: python package tests (gpumon-py/run-tests.sh, exit $pkg_rc)"
    rc=$pkg_rc
fi
if [ "$rc" -eq 0 ] && [ "$swift_rc" -ne 0 ]; then
    log "FAILED: the real ms-swift test (gpumon-py/tests-swift/run.sh or its preparation, exit $swift_rc)"
    rc=$swift_rc
fi
exit "$rc"

#!/usr/bin/env bash
# Overhead of the gpumon agent, measured side by side with the tools people use today, on the fake
# libnvidia-ml (fake-nvml) serving the same 8-GPU fleet (h100x8) to everyone.
# Documented in BENCHMARKS.md (what is measured, how, and one full run's figures).
#
#   scripts/bench-peers.sh [--rounds N] [--samples N] [--gpustat-runs N] [--hz1-seconds S]
#                          [--out DIR] [--no-build] [--skip-1hz] [--skip-fast] [--hz1-per-sink]
#                          [--profile NAME]
#
# Peers (throw-away venv, scripts/bench/requirements-peers.txt, exact pins, from PyPI):
#   pynvml-loop     scripts/bench/pynvml_loop.py: the classic polling script (util, memory,
#                   temperature, power per GPU; one JSON line per round to /dev/null)
#   gpustat         `gpustat --json`, one process per sample
#   nvitop-exporter scraped by scripts/bench/scrape_loop.py, the same loop that scrapes gpumon
# gpumon (the gpumon-agent binary, default features, --backend nvml on the fake), built with
# --profile (default `profiling`: the code of `dist`, the profile deploy/ and docs/deploy.md ship —
# fat LTO, one codegen unit — with its symbols kept so perf can attribute it; `release` is thin
# LTO, what `cargo run --release` builds):
#   gpumon-json     stdout JSON lines to /dev/null
#   gpumon-prom     Prometheus endpoint, scraped by scrape_loop.py
#   gpumon-influx   InfluxDB 1.x writer (private InfluxDB on 127.0.0.1)
#   gpumon-otlp     OTLP/HTTP (private OTLP receiver on 127.0.0.1)
#   gpumon-all      all four at once (+ the scrape loop)
#
# Phase 1 ("fast", per-sample cost): every configuration takes --samples samples (default 200)
# at 100 ms (nvitop-exporter: 250 ms, its minimum; scraped at the same rate), in the order above,
# for --rounds rounds (default 3): A B C ... A B C ..., so machine drift hits all alike. CPU is
# `perf stat -e task-clock -p PID` over the measuring window (after a 2 s warm-up; startup is
# excluded), peak RSS is `/usr/bin/time -v`'s maximum resident set size (whole life).
# gpustat is measured with /usr/bin/time -v per process (--gpustat-runs of them), startup included,
# because that is how it is used.
# Phase 2 ("1 Hz", the deployment figure): gpumon-all at 1 s, alternated with the pynvml loop at
# 1 s (and with --before-agent BIN, that build with the same sinks: before-all), each for
# --hz1-seconds (default 60) after the warm-up; CPU as % of one core. Alongside them floor-io,
# scripts/bench/export_floor.rs: a program that moves the same bytes per second as gpumon-all's
# sinks (sizes read from the agent by scripts/bench/body_sizes.py) and does nothing else: what
# the sinks' I/O alone costs here. --hz1-per-sink adds each sink on its own at 1 s.
#
# Phase 0 ("tick", --tick; runs alone, no backends needed): the whole-process cost per sample,
# start-up and every thread included, of the pynvml loop and of the agent doing the same work
# (--only utilization,memory,temperature,power, human lines to /dev/null, diagnosis on as by
# default), --tick-samples samples each at 100 ms, alternated for --rounds rounds; plus the
# agent with every default family, on 1 / 8 / 64 GPUs and the MIG fleet, and one `--once` run
# of each (the start-up cost, shown separately). With --before-agent BIN [--before-fake DIR] a
# previous build runs in the same alternation (before/after in one run), right next to this
# build and in ABBA order (this build first in odd rounds, second in even ones; so in the 1 Hz
# phase). CPU is
# `perf stat -e task-clock` over the whole process (all threads, from exec to exit). Then one
# `perf record` of the agent attributes what is left per tick (thread, shared object).
#   scripts/bench-peers.sh --tick [--rounds N] [--tick-samples N] [--before-agent BIN --before-fake DIR]
#                          [--profile NAME]
#
# Output: DIR (default target/bench-peers/<timestamp>) gets raw.tsv (one line per run), the
# per-run tool outputs, and summary.md (medians + gpumon/peer ratios), which is also printed.
# Needs: python3 (venv + pip reaching PyPI), cargo, perf, /usr/bin/time (apt-get install time
# linux-perf), and the backends of scripts/backends (install.sh). Loopback only.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

ROUNDS=3
SAMPLES=200
GPUSTAT_RUNS=100
HZ1_SECONDS=60
WARMUP=2
BUILD=1
DO_FAST=1
DO_1HZ=1
OUT=""
FAST_INTERVAL_MS=100
NVITOP_INTERVAL_MS=250
DO_TICK=0
TICK_SAMPLES=200
BEFORE_AGENT=""
BEFORE_FAKE_DIR=""
HZ1_PER_SINK=0
PROFILE=profiling
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --samples) SAMPLES="$2"; shift 2 ;;
        --gpustat-runs) GPUSTAT_RUNS="$2"; shift 2 ;;
        --hz1-seconds) HZ1_SECONDS="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --skip-1hz) DO_1HZ=0; shift ;;
        --skip-fast) DO_FAST=0; shift ;;
        --hz1-per-sink) HZ1_PER_SINK=1; shift ;;
        --tick) DO_TICK=1; shift ;;
        --tick-samples) TICK_SAMPLES="$2"; shift 2 ;;
        --before-agent) BEFORE_AGENT="$2"; shift 2 ;;
        --before-fake) BEFORE_FAKE_DIR="$2"; shift 2 ;;
        --profile) PROFILE="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo pipefail/{/^#/p}' "$0"; exit 0 ;;
        *) echo "bench-peers.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- tools ----------------------------------------------------------------------------------------
if [ ! -x /usr/bin/time ] || ! command -v perf >/dev/null; then
    log "installing Debian packages time, linux-perf"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends time linux-perf >/dev/null
fi
perf stat -e task-clock -x, -o /dev/null true || die "perf stat -e task-clock does not work here"

TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
[ -n "$OUT" ] || OUT="$TARGET/bench-peers/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT/runs"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpumon-bench-peers.XXXXXX")"
export BACKENDS_STATE_DIR="$WORK/backends"
export BACKEND_INSTANCE=bench
# Ports on 127.0.0.1: BENCH_*_PORT, else six free ones the kernel picks (other engineers' backends
# may hold the usual ones).
read -r p1 p2 p3 p4 p5 p6 < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(6)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
INFLUX_PORT="${BENCH_INFLUX_PORT:-$p1}"
INFLUX_RPC_PORT="${BENCH_INFLUX_RPC_PORT:-$p2}"
OTLP_GRPC_PORT="${BENCH_OTLP_GRPC_PORT:-$p3}"
OTLP_HTTP_PORT="${BENCH_OTLP_HTTP_PORT:-$p4}"
PROM_PORT="${BENCH_PROM_PORT:-$p5}"
NVITOP_PORT="${BENCH_NVITOP_PORT:-$p6}"

CHILDREN=()
cleanup() {
    local p
    for p in "${CHILDREN[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    BACKEND_INSTANCE=bench "$REPO/scripts/backends/stop-influxdb.sh" >/dev/null 2>&1 || true
    BACKEND_INSTANCE=bench "$REPO/scripts/backends/stop-otlp-receiver.sh" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- peers venv -----------------------------------------------------------------------------------
log "creating the peers venv in $WORK/venv"
PYBASE=/usr/bin/python3
[ -x "$PYBASE" ] || PYBASE="$(command -v python3)"
"$PYBASE" -m venv "$WORK/venv"
if [ "$DO_TICK" = 1 ]; then
    # The tick phase needs only the NVML bindings (same pin).
    "$WORK/venv/bin/pip" install -q --disable-pip-version-check \
        "$(grep -E '^nvidia-ml-py==' "$REPO/scripts/bench/requirements-peers.txt")"
else
    "$WORK/venv/bin/pip" install -q --disable-pip-version-check -r "$REPO/scripts/bench/requirements-peers.txt"
fi
PY="$WORK/venv/bin/python"
"$WORK/venv/bin/pip" freeze > "$OUT/peers-freeze.txt"

# --- gpumon agent + fake NVML ---------------------------------------------------------------------
# The installable binary, as users run it. (Not examples/agent: examples are built with the
# dev-dependencies, which switch on tokio's `test-util`, whose paused-clock bookkeeping adds a
# wake-up to every blocking task and a lock to every clock read.)
if [ "$BUILD" = 1 ]; then
    log "building the agent (profile $PROFILE, default features)"
    cargo build --profile "$PROFILE" --bin gpumon-agent >&2
fi
# Cargo's folder for a profile: its name, but `debug` for dev and test, `release` for bench.
case "$PROFILE" in
    dev|test) PROFILE_DIR=debug ;;
    bench) PROFILE_DIR=release ;;
    *) PROFILE_DIR="$PROFILE" ;;
esac
AGENT="$TARGET/$PROFILE_DIR/gpumon-agent"
[ -x "$AGENT" ] || die "$AGENT not found (drop --no-build)"
[ -x "$REPO/scripts/fake-nvml-dir.sh" ] || die "scripts/fake-nvml-dir.sh not found"
if [ "$BUILD" = 1 ]; then
    FAKE_DIR="$("$REPO/scripts/fake-nvml-dir.sh" --release)"
else
    FAKE_DIR="$("$REPO/scripts/fake-nvml-dir.sh" --release --no-build)"
fi
export LD_LIBRARY_PATH="$FAKE_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUMON_FAKE_NVML_PROFILE=h100x8
FAKE_LIB="$FAKE_DIR/libnvidia-ml.so.1"
"$AGENT" --backend nvml --nvml-library "$FAKE_LIB" --once --stdout-format json --log warn \
    | "$PY" -c 'import json,sys; s=json.loads(sys.stdin.readline()); print(len(s["devices"]), "GPUs:", s["devices"][0]["info"]["name"])' >&2 \
    || die "the agent cannot sample the fake NVML"
"$PY" -c 'import pynvml; pynvml.nvmlInit(); n=pynvml.nvmlDeviceGetCount(); assert n==8, n' \
    || die "pynvml does not see 8 GPUs on the fake NVML"

# --- backends -------------------------------------------------------------------------------------
if [ "$DO_TICK" = 0 ]; then
    log "starting private InfluxDB (127.0.0.1:$INFLUX_PORT) and OTLP receiver (127.0.0.1:$OTLP_HTTP_PORT)"
    INFLUX_PORT=$INFLUX_PORT INFLUX_RPC_PORT=$INFLUX_RPC_PORT INFLUX_DB=gpumon \
        "$REPO/scripts/backends/start-influxdb.sh" 2>>"$OUT/backends.log"
    OTLP_GRPC_PORT=$OTLP_GRPC_PORT OTLP_HTTP_PORT=$OTLP_HTTP_PORT OTLP_OUT=/dev/null \
        "$REPO/scripts/backends/start-otlp-receiver.sh" >/dev/null 2>>"$OUT/backends.log"
fi

# --- measuring ------------------------------------------------------------------------------------
RAW="$OUT/raw.tsv"
printf 'phase\tround\tconfig\tsamples_window\twindow_s\ttask_clock_ms\txid_thread_ms\ttotal_samples\tuser_s\tsys_s\tmax_rss_kib\tp50_ms\tp99_ms\n' > "$RAW"

# time_field FILE "Label" -> the value of a /usr/bin/time -v line
time_field() { sed -n "s/^[[:space:]]*$2: //p" "$1" | head -1; }
elapsed_field() { awk -F, '$3=="task-clock"{print $1}' "$1"; }
wall_field() { sed -n 's/^[[:space:]]*\([0-9.]*\) seconds time elapsed.*/\1/p' "$1"; }
percentiles() { # FILE -> "p50 p99" (nearest rank)
    sort -g "$1" | awk '{a[NR]=$1} END{ if (NR==0) {print "NA NA"; exit}
        i50=int(0.50*NR+0.999999); i99=int(0.99*NR+0.999999); if(i50<1)i50=1; if(i99<1)i99=1; print a[i50], a[i99]}'
}

# child_of PID -> the single child process of PID (waits for it)
child_of() {
    local c _
    for _ in $(seq 1 100); do
        c="$(pgrep -P "$1" | head -1 || true)"
        [ -n "$c" ] && { echo "$c"; return 0; }
        sleep 0.02
    done
    return 1
}

# --- phase 0: tick (whole process, start-up and every thread included) ----------------------------
if [ "$DO_TICK" = 1 ]; then
    TICK="$OUT/tick.tsv"
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
        echo "args: tick rounds=$ROUNDS tick_samples=$TICK_SAMPLES profile=$PROFILE before_agent=${BEFORE_AGENT:-none}"
        echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "kernel: $(uname -r)"
        echo "rustc: $(rustc --version)"
        echo "python: $("$PY" --version)"
        lscpu | grep -E '^(Model name|CPU\(s\)|Hypervisor vendor)'
    } > "$OUT/machine.txt"
    ONLY=utilization,memory,temperature,power
    # The same four families for a build without --only: every default family but these (status
    # and diagnosis select nothing in the backend).
    ONLY_AS_DISABLE=energy,clocks,fan,performance_state,clock_events,pcie_link,ecc,retired_pages,remapped_rows,xid,high_resolution,gpm
    TICK_S="$(awk -v n="$TICK_SAMPLES" 'BEGIN{printf "%.1f", n/10}')"
    # Without --before-fake the previous build runs on the same fake as the new one.
    BEFORE_FAKE_LIB="${BEFORE_FAKE_DIR:+$BEFORE_FAKE_DIR/libnvidia-ml.so.1}"
    BEFORE_FAKE_LIB="${BEFORE_FAKE_LIB:-$FAKE_LIB}"
    [ -z "$BEFORE_AGENT" ] || [ -x "$BEFORE_AGENT" ] || die "--before-agent $BEFORE_AGENT is not executable"
    # The same families for the previous build: with --only where it has the flag; otherwise by
    # disabling the rest of the defaults of its day (a build with more default families, without
    # --only, would do more work here).
    BEFORE_SELECT=(--disable "$ONLY_AS_DISABLE")
    if [ -n "$BEFORE_AGENT" ]; then
        BEFORE_HELP="$("$BEFORE_AGENT" --help 2>/dev/null || true)"
        if grep -qE -- '--only[[:space:]<=]' <<<"$BEFORE_HELP"; then
            BEFORE_SELECT=(--only "$ONLY")
        fi
    fi
    printf 'round\tconfig\tfleet\tkind\ttask_clock_ms\tsamples\n' > "$TICK"
    # whole CFG ROUND FLEET KIND -- CMD...: perf stat over the whole life of CMD (all threads).
    whole() {
        local cfg=$1 round=$2 fleet=$3 kind=$4 tag n tc
        shift 5
        tag="tick.$cfg.$fleet.$kind.r$round"
        log "$tag: $*"
        GPUMON_FAKE_NVML_PROFILE="$fleet" perf stat -e task-clock -x, -o "$OUT/runs/$tag.perf" -- "$@" \
            >/dev/null 2>"$OUT/runs/$tag.stderr" || die "$tag failed; see $OUT/runs/$tag.stderr"
        tc="$(elapsed_field "$OUT/runs/$tag.perf")"
        n="$(sed -n 's/.*samples=\([0-9]*\).*/\1/p; s/^rounds=\([0-9]*\)$/\1/p' "$OUT/runs/$tag.stderr" | tail -1)"
        [ "$kind" = once ] && n=1
        [ -n "$n" ] || die "$tag: no sample count in $OUT/runs/$tag.stderr"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$cfg" "$fleet" "$kind" "$tc" "$n" >> "$TICK"
    }
    LOOP=("$PY" "$REPO/scripts/bench/pynvml_loop.py" --interval 0.1)
    NEW=("$AGENT" --backend nvml --nvml-library "$FAKE_LIB" --log info)
    # The floor: a program that only wakes on the same grid (one thread, as the pynvml loop; two,
    # as the agent's sampling thread and runtime), to show what waking alone costs here.
    FLOOR="$WORK/tick_floor"
    rustc -O -o "$FLOOR" "$REPO/scripts/bench/tick_floor.rs" || die "cannot build scripts/bench/tick_floor.rs"
    # ROUND: the same-work run of this build, and of --before-agent (none without it).
    this_only4() {
        whole gpumon-only4 "$1" h100x8 run -- "${NEW[@]}" --interval 100ms --only "$ONLY" --duration "${TICK_S}s"
    }
    before_only4() {
        [ -n "$BEFORE_AGENT" ] || return 0
        whole before-only4 "$1" h100x8 run -- "$BEFORE_AGENT" --backend nvml --nvml-library "$BEFORE_FAKE_LIB" \
            --log info --interval 100ms "${BEFORE_SELECT[@]}" --duration "${TICK_S}s"
    }
    for r in $(seq 1 "$ROUNDS"); do
        whole floor-1thread "$r" h100x8 run -- "$FLOOR" 100 "$TICK_SAMPLES" 1
        whole floor-2threads "$r" h100x8 run -- "$FLOOR" 100 "$TICK_SAMPLES" 2
        whole pynvml-loop "$r" h100x8 run -- "${LOOP[@]}" --samples "$TICK_SAMPLES"
        # This build and the previous one run back to back, in ABBA order (odd rounds this build
        # first, even rounds the previous one): a fixed order gave whichever ran second a
        # different machine (caches, the VM's other tenants) every round.
        if [ $((r % 2)) = 1 ]; then this_only4 "$r"; before_only4 "$r"; else before_only4 "$r"; this_only4 "$r"; fi
        whole gpumon-default "$r" h100x8 run -- "${NEW[@]}" --interval 100ms --duration "${TICK_S}s"
        for fleet in h100x1 h100x64 a100x8-mig; do
            whole gpumon-only4 "$r" "$fleet" run -- "${NEW[@]}" --interval 100ms --only "$ONLY" --duration "${TICK_S}s"
        done
        # Start-up: one sample and exit, for every configuration and fleet above.
        whole floor-1thread "$r" h100x8 once -- "$FLOOR" 100 1 1
        whole floor-2threads "$r" h100x8 once -- "$FLOOR" 100 1 2
        whole pynvml-loop "$r" h100x8 once -- "${LOOP[@]}" --samples 1
        for fleet in h100x8 h100x1 h100x64 a100x8-mig; do
            whole gpumon-only4 "$r" "$fleet" once -- "${NEW[@]}" --only "$ONLY" --once
        done
        whole gpumon-default "$r" h100x8 once -- "${NEW[@]}" --once
        if [ -n "$BEFORE_AGENT" ]; then
            whole before-only4 "$r" h100x8 once -- "$BEFORE_AGENT" --backend nvml --nvml-library "$BEFORE_FAKE_LIB" \
                --log info "${BEFORE_SELECT[@]}" --once
        fi
    done
    # What is left per tick: one profile of the agent (same work), by thread and shared object.
    log "profile: gpumon-only4, 20 s at 100 ms"
    GPUMON_FAKE_NVML_PROFILE=h100x8 perf record -q -e cpu-clock -F 10000 -o "$WORK/perf.tick.data" -- \
        "${NEW[@]}" --interval 100ms --only "$ONLY" --duration 20s >/dev/null 2>"$OUT/runs/profile.tick.stderr"
    perf report -i "$WORK/perf.tick.data" --no-children --sort comm,dso --stdio 2>/dev/null \
        | awk '/^ +[0-9.]+%/ {gsub("%","",$1); printf "%s\t%s\t%s\n", $2, $3, $1}' > "$OUT/tick-attribution.tsv"
    perf report -i "$WORK/perf.tick.data" --no-children --sort comm,dso,sym --stdio 2>/dev/null \
        | awk '/^ +[0-9.]+%/ && n++ < 40' > "$OUT/tick-symbols.txt" || true
    echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
    "$PY" "$REPO/scripts/bench/summarize_tick.py" "$TICK" "$OUT/tick-attribution.tsv" "$OUT/machine.txt" \
        > "$OUT/tick-summary.md"
    cat "$OUT/tick-summary.md"
    log "raw results: $TICK; summary: $OUT/tick-summary.md"
    exit 0
fi

# run_service PHASE ROUND CONFIG INTERVAL_S WINDOW_SAMPLES SCRAPE_URL -- CMD...
# Starts CMD under /usr/bin/time -v, waits WARMUP s, then measures task-clock over a window of
# WINDOW_SAMPLES intervals (while the scrape loop runs, when SCRAPE_URL is set), stops CMD with
# SIGTERM and records one raw line.
run_service() {
    local phase=$1 round=$2 cfg=$3 interval=$4 nsamp=$5 url=$6
    shift 7
    local tag="$phase.$cfg.r$round" tpid pid window
    log "$tag: $*"
    /usr/bin/time -v -o "$OUT/runs/$tag.time" "$@" >/dev/null 2>"$OUT/runs/$tag.stderr" &
    tpid=$!
    CHILDREN+=("$tpid")
    pid="$(child_of "$tpid")" || die "$tag: no process"
    sleep "$WARMUP"
    kill -0 "$pid" 2>/dev/null || die "$tag: exited early; see $OUT/runs/$tag.stderr"
    window="$(awk -v n="$nsamp" -v i="$interval" 'BEGIN{printf "%.3f", n*i}')"
    # Two perf sessions on the same process over the same window: the inner one counts the whole
    # process (threads started later included), the outer one per thread, to single out the
    # fake's XID polling (gpumon-nvml-xid thread; see BENCHMARKS.md).
    local perf=(perf stat --per-thread -e task-clock -x, -o "$OUT/runs/$tag.perthread" -p "$pid" --
        perf stat -e task-clock -x, -o "$OUT/runs/$tag.perf" -p "$pid" --)
    if [ -n "$url" ]; then
        "${perf[@]}" \
            "$PY" "$REPO/scripts/bench/scrape_loop.py" --url "$url" --count "$nsamp" --interval "$interval" \
            --out "$OUT/runs/$tag.lat" 2>>"$OUT/runs/$tag.scrape" || die "$tag: scrape loop failed; see $OUT/runs/$tag.scrape"
    else
        "${perf[@]}" sleep "$window"
    fi
    kill -TERM "$pid" 2>/dev/null || true
    wait "$tpid" || true
    local tc wall total xid lat="NA NA"
    tc="$(elapsed_field "$OUT/runs/$tag.perf")"
    xid="$(awk -F, '$1 ~ /^gpumon-nvml-xid-/ && $4=="task-clock" {s+=$2} END{printf "%.2f", s+0}' "$OUT/runs/$tag.perthread")"
    # Wall time of the window: perf -x, has no elapsed line, so use the nominal window.
    wall="$window"
    total="$(sed -n 's/.*samples=\([0-9]*\).*/\1/p; s/^rounds=\([0-9]*\)$/\1/p' "$OUT/runs/$tag.stderr" | tail -1)"
    [ -n "$total" ] || total=NA
    [ -n "$url" ] && lat="$(percentiles "$OUT/runs/$tag.lat")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$phase" "$round" "$cfg" "$nsamp" "$wall" "$tc" "$xid" "$total" \
        "$(time_field "$OUT/runs/$tag.time" 'User time (seconds)')" \
        "$(time_field "$OUT/runs/$tag.time" 'System time (seconds)')" \
        "$(time_field "$OUT/runs/$tag.time" 'Maximum resident set size (kbytes)')" \
        ${lat% *} ${lat#* } >> "$RAW"
}

# run_gpustat ROUND: GPUSTAT_RUNS sequential `gpustat --json` processes, each under time -v.
run_gpustat() {
    local round=$1 tag="fast.gpustat.r$1" i u=0 s=0 rss=0 f
    log "$tag: ${GPUSTAT_RUNS}x gpustat --json"
    for i in $(seq 1 "$GPUSTAT_RUNS"); do
        f="$OUT/runs/$tag.time"
        /usr/bin/time -v -o "$f" "$WORK/venv/bin/gpustat" --json >/dev/null 2>"$OUT/runs/$tag.stderr" \
            || die "$tag: gpustat failed; see $OUT/runs/$tag.stderr"
        u="$(awk -v a="$u" -v b="$(time_field "$f" 'User time (seconds)')" 'BEGIN{print a+b}')"
        s="$(awk -v a="$s" -v b="$(time_field "$f" 'System time (seconds)')" 'BEGIN{print a+b}')"
        rss="$(awk -v a="$rss" -v b="$(time_field "$f" 'Maximum resident set size (kbytes)')" 'BEGIN{print (b>a)?b:a}')"
    done
    # task-clock column: user+sys of all runs (ms); a gpustat sample *is* a process.
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' fast "$round" gpustat "$GPUSTAT_RUNS" NA \
        "$(awk -v a="$u" -v b="$s" 'BEGIN{printf "%.1f", (a+b)*1000}')" 0 "$GPUSTAT_RUNS" "$u" "$s" "$rss" NA NA >> "$RAW"
}

# gpumon-json-min: only the four families the Python loop reads (+ status), for a same-work comparison.
MIN_DISABLE=energy,clocks,fan,performance_state,clock_events,pcie_link,ecc,retired_pages,remapped_rows,xid,high_resolution,gpm
AGENT_BASE=("$AGENT" --backend nvml --nvml-library "$FAKE_LIB" --log info)
INFLUX_ARGS=(--influx-url "http://127.0.0.1:$INFLUX_PORT" --influx-db gpumon)
OTLP_ARGS=(--otlp-endpoint "http://127.0.0.1:$OTLP_HTTP_PORT" --otlp-protocol http)
PROM_ARGS=(--prometheus-listen "127.0.0.1:$PROM_PORT")
PROM_URL="http://127.0.0.1:$PROM_PORT/metrics"
NVITOP_URL="http://127.0.0.1:$NVITOP_PORT/metrics"

fast_round() {
    local r=$1 iv ivs
    iv="${FAST_INTERVAL_MS}ms"
    ivs="$(awk -v m="$FAST_INTERVAL_MS" 'BEGIN{print m/1000}')"
    run_service fast "$r" gpumon-json "$ivs" "$SAMPLES" "" -- "${AGENT_BASE[@]}" --interval "$iv" --stdout-format json
    run_service fast "$r" gpumon-json-min "$ivs" "$SAMPLES" "" -- "${AGENT_BASE[@]}" --interval "$iv" --stdout-format json \
        --disable "$MIN_DISABLE"
    run_service fast "$r" gpumon-prom "$ivs" "$SAMPLES" "$PROM_URL" -- "${AGENT_BASE[@]}" --interval "$iv" "${PROM_ARGS[@]}"
    run_service fast "$r" gpumon-influx "$ivs" "$SAMPLES" "" -- "${AGENT_BASE[@]}" --interval "$iv" "${INFLUX_ARGS[@]}"
    run_service fast "$r" gpumon-otlp "$ivs" "$SAMPLES" "" -- "${AGENT_BASE[@]}" --interval "$iv" "${OTLP_ARGS[@]}"
    run_service fast "$r" gpumon-all "$ivs" "$SAMPLES" "$PROM_URL" -- "${AGENT_BASE[@]}" --interval "$iv" \
        --stdout-format json --stdout "${PROM_ARGS[@]}" "${INFLUX_ARGS[@]}" "${OTLP_ARGS[@]}"
    run_service fast "$r" pynvml-loop "$ivs" "$SAMPLES" "" -- "$PY" "$REPO/scripts/bench/pynvml_loop.py" --interval "$ivs"
    run_gpustat "$r"
    local nivs
    nivs="$(awk -v m="$NVITOP_INTERVAL_MS" 'BEGIN{print m/1000}')"
    run_service fast "$r" nvitop-exporter "$nivs" "$SAMPLES" "$NVITOP_URL" -- \
        "$WORK/venv/bin/nvitop-exporter" --bind-address 127.0.0.1 --port "$NVITOP_PORT" --interval "$nivs"
}

# The I/O floor of the 1 Hz phase: the bytes gpumon-all's sinks move, moved by a program that
# does nothing else (scripts/bench/export_floor.rs), to the same servers and the same scrape loop.
if [ "$DO_1HZ" = 1 ]; then
    EXPORT_FLOOR="$WORK/export_floor"
    rustc -O -o "$EXPORT_FLOOR" "$REPO/scripts/bench/export_floor.rs" || die "cannot build scripts/bench/export_floor.rs"
    read -r SZ_STDOUT SZ_OTLP SZ_INFLUX SZ_SCRAPE < <("$PY" "$REPO/scripts/bench/body_sizes.py" -- "${AGENT_BASE[@]}") \
        || die "cannot read the agent's body sizes (scripts/bench/body_sizes.py)"
    log "bytes per tick: stdout $SZ_STDOUT, OTLP $SZ_OTLP, InfluxDB $SZ_INFLUX, scrape $SZ_SCRAPE"
    echo "stdout $SZ_STDOUT OTLP $SZ_OTLP InfluxDB $SZ_INFLUX scrape $SZ_SCRAPE" > "$OUT/hz1-bytes.txt"
fi

hz1_round() {
    local r=$1
    run_service 1hz "$r" floor-io 1 "$HZ1_SECONDS" "$PROM_URL" -- "$EXPORT_FLOOR" 1000 $((HZ1_SECONDS + WARMUP + 60)) \
        "$SZ_STDOUT" "http://127.0.0.1:$OTLP_HTTP_PORT/v1/metrics" "$SZ_OTLP" \
        "http://127.0.0.1:$INFLUX_PORT/write?db=gpumon&precision=ns" "$SZ_INFLUX" "127.0.0.1:$PROM_PORT" "$SZ_SCRAPE"
    if [ "$HZ1_PER_SINK" = 1 ]; then
        run_service 1hz "$r" gpumon-json 1 "$HZ1_SECONDS" "" -- "${AGENT_BASE[@]}" --interval 1s --stdout-format json --stdout
        run_service 1hz "$r" gpumon-prom 1 "$HZ1_SECONDS" "$PROM_URL" -- "${AGENT_BASE[@]}" --interval 1s "${PROM_ARGS[@]}"
        run_service 1hz "$r" gpumon-influx 1 "$HZ1_SECONDS" "" -- "${AGENT_BASE[@]}" --interval 1s "${INFLUX_ARGS[@]}"
        run_service 1hz "$r" gpumon-otlp 1 "$HZ1_SECONDS" "" -- "${AGENT_BASE[@]}" --interval 1s "${OTLP_ARGS[@]}"
    fi
    # With --before-agent, the previous build with the same sinks, back to back with this one in
    # ABBA order (odd rounds this build first), as in the tick phase.
    local order=(this before)
    [ $((r % 2)) = 1 ] || order=(before this)
    local which
    for which in "${order[@]}"; do
        if [ "$which" = this ]; then
            run_service 1hz "$r" gpumon-all 1 "$HZ1_SECONDS" "$PROM_URL" -- "${AGENT_BASE[@]}" --interval 1s \
                --stdout-format json --stdout "${PROM_ARGS[@]}" "${INFLUX_ARGS[@]}" "${OTLP_ARGS[@]}"
        elif [ -n "$BEFORE_AGENT" ]; then
            run_service 1hz "$r" before-all 1 "$HZ1_SECONDS" "$PROM_URL" -- "$BEFORE_AGENT" --backend nvml \
                --nvml-library "$FAKE_LIB" --log info --interval 1s --stdout-format json --stdout "${PROM_ARGS[@]}" \
                "${INFLUX_ARGS[@]}" "${OTLP_ARGS[@]}"
        fi
    done
    run_service 1hz "$r" pynvml-loop 1 "$HZ1_SECONDS" "" -- "$PY" "$REPO/scripts/bench/pynvml_loop.py" --interval 1
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "args: rounds=$ROUNDS samples=$SAMPLES gpustat_runs=$GPUSTAT_RUNS hz1_seconds=$HZ1_SECONDS warmup=${WARMUP}s profile=$PROFILE"
    echo "kernel: $(uname -r)"
    echo "rustc: $(rustc --version)"
    echo "python: $("$PY" --version)"
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|CPU max MHz|Hypervisor vendor|L3 cache)'
    grep MemTotal /proc/meminfo
} > "$OUT/machine.txt"

for r in $(seq 1 "$ROUNDS"); do
    [ "$DO_FAST" = 1 ] && fast_round "$r"
    [ "$DO_1HZ" = 1 ] && hz1_round "$r"
done

# --- attribution: where the CPU goes (perf record, by shared object) -------------------------------
# One 10 s profile each of gpumon (same-work config, and all sinks) and the Python loop at 100 ms:
# the share spent inside the fake libnvidia-ml, which every NVML client pays per call.
attribute() {
    local cfg=$1 tpid pid
    shift 2
    log "profile.$cfg: $*"
    "$@" >/dev/null 2>"$OUT/runs/profile.$cfg.stderr" &
    tpid=$!
    CHILDREN+=("$tpid")
    sleep "$WARMUP"
    pid=$tpid
    perf record -q -e cpu-clock -F 2000 -p "$pid" -o "$WORK/perf.$cfg.data" -- sleep 10 2>/dev/null
    kill -TERM "$pid" 2>/dev/null || true
    wait "$tpid" || true
    perf report -i "$WORK/perf.$cfg.data" --no-children --sort comm,dso --stdio 2>/dev/null \
        | awk -v c="$cfg" '/^ +[0-9.]+%/ {gsub("%","",$1); printf "%s\t%s\t%s\t%s\n", c, $2, $3, $1}' >> "$OUT/attribution.tsv"
}
if [ "$DO_FAST" = 1 ]; then
    printf 'config\tthread\tdso\tpercent\n' > "$OUT/attribution.tsv"
    attribute gpumon-json-min -- "${AGENT_BASE[@]}" --interval 100ms --stdout-format json --disable "$MIN_DISABLE"
    attribute gpumon-all -- "${AGENT_BASE[@]}" --interval 100ms --stdout-format json --stdout "${PROM_ARGS[@]}" \
        "${INFLUX_ARGS[@]}" "${OTLP_ARGS[@]}"
    attribute pynvml-loop -- "$PY" "$REPO/scripts/bench/pynvml_loop.py" --interval 0.1
fi

"$PY" "$REPO/scripts/bench/summarize.py" "$RAW" "$OUT/machine.txt" > "$OUT/summary.md"
if [ -s "$OUT/attribution.tsv" ]; then
    { echo "### CPU by thread and shared object (perf record -e cpu-clock, 10 s at 100 ms)"; echo
      echo '| configuration | thread | shared object | % of samples |'; echo '|---|---|---|---:|'
      awk -F'\t' 'NR>1 && $4>=1 {printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$OUT/attribution.tsv"; echo; } >> "$OUT/summary.md"
fi
cat "$OUT/summary.md"
log "raw results: $RAW; summary: $OUT/summary.md"

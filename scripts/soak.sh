#!/usr/bin/env bash
# Soak test: the example agent at 10 Hz on the mock backend with every sink (stdout, the scrape
# endpoint, Pushgateway, InfluxDB, remote write, OTLP, the web view with a live stream open)
# against the real backends (scripts/backends/, all on 127.0.0.1), each backend restarted on a
# schedule and one backend down for SOAK_LONG_OUTAGE, for SOAK_DURATION. Then it compares what the
# agent sent with what arrived, prints a markdown summary and exits non-zero when a check fails.
#
#   ./scripts/soak.sh                                      # 1 h, release agent, 10 min outage
#   SOAK_DURATION=2m SOAK_RESTART_EVERY=80s SOAK_PROFILE=debug ./scripts/soak.sh   # CI (.ci/run)
#
# Settings (environment):
#   SOAK_DURATION       how long the agent runs (s/m/h suffix)                  (default 1h)
#   SOAK_RESTART_EVERY  each backend is restarted this often; the four backends
#                       are staggered by a quarter of it, the first restart comes
#                       SOAK_RESTART_START after the agent starts, and no restart
#                       begins in the last SOAK_TAIL                            (default 10m)
#   SOAK_RESTART_START  first restart                                          (default 15s)
#   SOAK_LONG_OUTAGE    one long outage of SOAK_LONG_OUTAGE_BACKEND, starting at
#                       SOAK_LONG_OUTAGE_AT; skipped (and said so) when it and
#                       SOAK_LONG_SETTLE do not fit before SOAK_TAIL; 0: none   (default 10m)
#   SOAK_LONG_OUTAGE_AT / SOAK_LONG_OUTAGE_BACKEND                             (default 20m / influxdb)
#   SOAK_LONG_SETTLE    after the long outage's backlog drained, RSS must be back within
#                       SOAK_RSS_MAX_GROWTH_PCT of its level just before the outage
#                       this long after the backend came back                   (default 3m)
#   SOAK_LONG_RECOVERY_MAX  fresh data after the long outage (the backlog goes first)
#                                                                               (default 180s)
#   SOAK_OUTAGE         how long a backend stays down in a restart              (default 5s)
#   SOAK_TAIL           quiet time at the end, so that retries drain            (default 35s)
#   SOAK_WARMUP         RSS baseline: the first sample at or after this         (default 60s)
#   SOAK_RSS_MAX_GROWTH_KIB / SOAK_RSS_MAX_GROWTH_PCT
#                       RSS growth from the baseline to the end may exceed one
#                       of these bounds but not both                            (default 5120 / 20)
#   SOAK_RECOVERY_MAX   a restarted backend must see fresh data within this     (default 45s)
#   SOAK_PROFILE        release | debug: which agent build to use              (default release)
#   SOAK_AGENT          a prebuilt agent binary (skips the cargo build)
#   SOAK_MOCK_PROFILE   mock fleet                                               (default h100x8)
#   SOAK_SAMPLE_TIMEOUT the agent's sample_timeout. The agent's default is the interval
#                       (100 ms here); a mock sample takes ~0.3 ms, so only CPU starvation
#                       of a shared runner can exceed it, and the soak measures the agent,
#                       not the runner's scheduling latency. The longest sample is reported.
#                                                                               (default 1s)
#   SOAK_OUT            output directory (default: a new ${TMPDIR:-/tmp}/gpumon-soak.XXXXXX)
#   SOAK_PORT_BASE      ports used: base+86/+88 InfluxDB, +191 Pushgateway, +317/+318 OTLP,
#                       +90 Prometheus, +428 VictoriaMetrics, +400/+401 the agent's
#                       scrape endpoint and web view                            (default 27000)
#
# What "nothing lost" means per sink, and why (the checks are printed with the summary):
#   InfluxDB     the sink buffers and retries, so every sample must be stored: for every GPU,
#                the number of points in measurement `gpu` equals the agent's samples_total
#                (same series + timestamp overwrite in InfluxDB, so the count cannot be
#                inflated by a retried batch).
#   OTLP         the sink does not retry by design (the next snapshot supersedes a gauge), so a
#                snapshot exported while the receiver is down is lost *and counted*: every
#                export the agent counted as successful arrived (distinct data-point times at the
#                receiver == exported), every sample is either exported or counted as a failure,
#                and failures happen only during the receiver's outages.
#   Pushgateway  keeps only the last push per group, so the check is that pushes are accepted
#                again after every restart (push_time_seconds newer than the restart) and that
#                the final group is current. A push retries inside the sink for up to its 8 s
#                timeout, so during an outage the sink's queue fills and the oldest snapshots
#                are dropped and counted: failed + dropped only during outages (harmless here).
#   Prometheus   scrapes the agent's --prometheus-listen endpoint every 1 s: no scrape may fail
#                (up == 0); gaps in `up` are expected only around Prometheus's own restarts
#                (outage + its 5-6 s first-scrape delay) and are reported, not failures.
#   Agent        no skipped ticks, no sample failures, no snapshot dropped by the InfluxDB, OTLP
#                or Prometheus sink queues,
#                samples_total >= 95 % of wall time x 10 Hz, RSS growth after warm-up bounded.
#
#   Remote write buffers and retries like InfluxDB: every snapshot must arrive, so the distinct
#                timestamps of `gpumon_utilization_ratio` in VictoriaMetrics equal samples_total
#                (a retried batch cannot inflate a count of distinct timestamps).
#   Web view     a live stream (/api/stream) is open for the whole run: it must stay connected
#                until the agent stops and receive a `snapshot` event for >= 90 % of the samples.
#   Long outage  the InfluxDB sink's outage buffer holds the whole outage (its bounds are raised
#                in the soak's config: 10 min of this fleet at 10 Hz is ~150 MB of line protocol,
#                over the 128 MiB default; nothing may be dropped, the counts check it), and after
#                the drain RSS returns within SOAK_RSS_MAX_GROWTH_PCT of its pre-outage level.
#
# Output in SOAK_OUT: agent.log (agent stderr), rss.csv, restarts.csv, metrics-final.txt (the
# agent's /metrics just before it was stopped), summary.md, backends/ (backend logs).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="$REPO/scripts/backends"
cd "$REPO"

log() { printf '[%s] soak: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# seconds DURATION -> integer seconds (accepts 90, 90s, 2m, 1h, 1h30m)
seconds() {
    local s="$1" total=0 n u
    [[ "$s" =~ ^([0-9]+[smh]?)+$ ]] || die "bad duration '$1' (use e.g. 90s, 2m, 1h)"
    while [[ "$s" =~ ^([0-9]+)([smh]?)(.*)$ ]]; do
        n="${BASH_REMATCH[1]}"; u="${BASH_REMATCH[2]}"; s="${BASH_REMATCH[3]}"
        case "$u" in h) n=$((n * 3600));; m) n=$((n * 60));; esac
        total=$((total + n))
    done
    printf '%s\n' "$total"
}

DURATION=$(seconds "${SOAK_DURATION:-1h}")
RESTART_EVERY=$(seconds "${SOAK_RESTART_EVERY:-10m}")
RESTART_START=$(seconds "${SOAK_RESTART_START:-15s}")
OUTAGE=$(seconds "${SOAK_OUTAGE:-5s}")
TAIL=$(seconds "${SOAK_TAIL:-35s}")
WARMUP=$(seconds "${SOAK_WARMUP:-60s}")
RECOVERY_MAX=$(seconds "${SOAK_RECOVERY_MAX:-45s}")
RSS_MAX_KIB="${SOAK_RSS_MAX_GROWTH_KIB:-5120}"
RSS_MAX_PCT="${SOAK_RSS_MAX_GROWTH_PCT:-20}"
PROFILE="${SOAK_PROFILE:-release}"
MOCK_PROFILE="${SOAK_MOCK_PROFILE:-h100x8}"
SAMPLE_TIMEOUT="${SOAK_SAMPLE_TIMEOUT:-1s}"
PB="${SOAK_PORT_BASE:-27000}"
LONG_OUTAGE=$(seconds "${SOAK_LONG_OUTAGE:-10m}")
LONG_AT=$(seconds "${SOAK_LONG_OUTAGE_AT:-20m}")
LONG_BACKEND="${SOAK_LONG_OUTAGE_BACKEND:-influxdb}"
LONG_SETTLE=$(seconds "${SOAK_LONG_SETTLE:-3m}")
LONG_RECOVERY_MAX=$(seconds "${SOAK_LONG_RECOVERY_MAX:-180s}")
[ "$DURATION" -gt "$((WARMUP + 10))" ] || die "SOAK_DURATION must exceed SOAK_WARMUP + 10s"
[ "$RESTART_EVERY" -ge 4 ] || die "SOAK_RESTART_EVERY must be at least 4s"
case "$LONG_BACKEND" in influxdb|victoria-metrics|otlp-receiver|pushgateway|prometheus) ;;
    *) die "SOAK_LONG_OUTAGE_BACKEND: unknown backend '$LONG_BACKEND'" ;; esac
if [ "$LONG_OUTAGE" -gt 0 ] && [ $((LONG_AT + LONG_OUTAGE + LONG_SETTLE)) -gt $((DURATION - TAIL)) ]; then
    log "long outage (${LONG_OUTAGE}s at ${LONG_AT}s + ${LONG_SETTLE}s settle) does not fit in ${DURATION}s: skipped"
    LONG_OUTAGE=0
fi

INFLUX_PORT=$((PB + 86)); INFLUX_RPC=$((PB + 88)); PUSHGW_PORT=$((PB + 191))
OTLP_GRPC=$((PB + 317)); OTLP_HTTP=$((PB + 318)); PROM_PORT=$((PB + 90)); AGENT_PORT=$((PB + 400))
VM_PORT=$((PB + 428)); WEB_PORT=$((PB + 401))
INSTANCE=soak
JOB=gpumon-soak

OUT="${SOAK_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpumon-soak.XXXXXX")}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# Private state dir and instance names: never touches test.sh's or anyone's backends.
export BACKENDS_STATE_DIR="$OUT/backends"
export BACKEND_INSTANCE="$INSTANCE"
export GPUMON_VENV="${GPUMON_VENV:-/opt/gpumon-venv}"
mkdir -p "$BACKENDS_STATE_DIR"
PY=/usr/bin/python3
command -v "$PY" >/dev/null || PY=python3

# ------------------------------------------------------------------ cleanup
AGENT_PID=""; SCHED_PID=""; RSS_PID=""; LONG_PID=""; WEB_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "$SCHED_PID" "$RSS_PID" "$LONG_PID" "$WEB_PID"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    if [ -n "$AGENT_PID" ] && kill -0 "$AGENT_PID" 2>/dev/null; then
        kill -TERM "$AGENT_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$AGENT_PID" 2>/dev/null || true
    fi
    # The scheduler may have been killed mid-restart with KEEP_DATA=1: a stop without it
    # removes the kept data dirs too.
    "$B/stop-all.sh" >/dev/null 2>&1 || true
    for n in influxdb pushgateway otlp-receiver prometheus victoria-metrics; do
        KEEP_DATA=0 "$B/stop-$n.sh" >/dev/null 2>&1 || true
    done
    log "output in $OUT (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ install + build
"$B/install.sh"
if [ -n "${SOAK_AGENT:-}" ]; then
    AGENT="$SOAK_AGENT"
else
    flags=(--example agent --all-features)
    [ "$PROFILE" = release ] && flags+=(--release)
    log "building the agent ($PROFILE): cargo build ${flags[*]}"
    cargo build "${flags[@]}"
    tdir="${CARGO_TARGET_DIR:-$REPO/target}"
    AGENT="$tdir/$([ "$PROFILE" = release ] && echo release || echo debug)/examples/agent"
fi
[ -x "$AGENT" ] || die "agent binary '$AGENT' not found"

# ------------------------------------------------------------------ backends
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in $INFLUX_PORT $INFLUX_RPC $PUSHGW_PORT $OTLP_GRPC $OTLP_HTTP $PROM_PORT $AGENT_PORT $VM_PORT $WEB_PORT; do
    port_free "$p" || die "port 127.0.0.1:$p is in use (another soak? set SOAK_PORT_BASE)"
done

start_backend() {  # start_backend NAME  (uses KEEP_DATA from the environment)
    case "$1" in
        influxdb) INFLUX_PORT=$INFLUX_PORT INFLUX_RPC_PORT=$INFLUX_RPC INFLUX_DB=gpumon "$B/start-influxdb.sh" ;;
        pushgateway) PUSHGW_PORT=$PUSHGW_PORT "$B/start-pushgateway.sh" ;;
        otlp-receiver) OTLP_GRPC_PORT=$OTLP_GRPC OTLP_HTTP_PORT=$OTLP_HTTP OTLP_RECORD=requests \
            "$B/start-otlp-receiver.sh" >/dev/null ;;
        prometheus) PROM_PORT=$PROM_PORT PROM_SCRAPE_TARGETS=127.0.0.1:$AGENT_PORT PROM_JOB_NAME=$JOB \
            PROM_EXTRA_ARGS="--storage.tsdb.retention.time=2d" "$B/start-prometheus.sh" ;;
        victoria-metrics) VM_PORT=$VM_PORT "$B/start-victoria-metrics.sh" ;;
    esac
}
for n in influxdb pushgateway otlp-receiver victoria-metrics; do start_backend "$n"; done

# ------------------------------------------------------------------ agent
cat > "$OUT/agent.toml" <<EOF
[agent]
backend = "mock"
interval = "100ms"
shutdown_timeout = "30s"
sample_timeout = "$SAMPLE_TIMEOUT"

[mock]
profile = "$MOCK_PROFILE"
scenario = "training"
seed = 42

[prometheus]
listen = "127.0.0.1:$AGENT_PORT"

[pushgateway]
url = "http://127.0.0.1:$PUSHGW_PORT"
job = "$JOB"

[influxdb]
url = "http://127.0.0.1:$INFLUX_PORT"
db = "gpumon"
# the long outage must be held whole (see the header): ~25 KB a snapshot here
buffer_max_points = 4000000
buffer_max_bytes = 536870912

[remote_write]
url = "http://127.0.0.1:$VM_PORT/api/v1/write"

[web]
listen = "127.0.0.1:$WEB_PORT"

[otlp]
endpoint = "http://127.0.0.1:$OTLP_GRPC"
protocol = "grpc"
service_name = "gpumon-soak"
EOF
log "agent: $AGENT --config $OUT/agent.toml (duration ${DURATION}s)"
"$AGENT" --config "$OUT/agent.toml" --backend mock --interval 100ms 2>"$OUT/agent.log" >/dev/null &
AGENT_PID=$!
T0=$(date +%s)
for _ in $(seq 1 100); do
    curl -fsS --max-time 1 "http://127.0.0.1:$AGENT_PORT/metrics" >/dev/null 2>&1 && break
    kill -0 "$AGENT_PID" 2>/dev/null || { tail -n 20 "$OUT/agent.log" >&2; die "agent exited at start-up"; }
    sleep 0.1
done
curl -fsS --max-time 1 "http://127.0.0.1:$AGENT_PORT/metrics" >/dev/null || die "agent not serving on :$AGENT_PORT"
start_backend prometheus   # after the agent, as the scripts expect

# ------------------------------------------------------------------ web: one live stream, all run
# web-stream.txt: `snapshot` events received; web-stream.end: when the stream ended.
(
    n="$(curl -sN --max-time $((DURATION + 120)) "http://127.0.0.1:$WEB_PORT/api/stream" 2>/dev/null \
        | grep -c '^event: snapshot' || true)"
    echo "${n:-0}" > "$OUT/web-stream.txt"
    date +%s > "$OUT/web-stream.end"
) &
WEB_PID=$!

# ------------------------------------------------------------------ RSS sampler
echo "elapsed_s,rss_kib" > "$OUT/rss.csv"
(
    trap 'exit 0' TERM
    while kill -0 "$AGENT_PID" 2>/dev/null; do
        rss="$(awk '/^VmRSS:/ {print $2}' "/proc/$AGENT_PID/status" 2>/dev/null || true)"
        [ -n "$rss" ] && echo "$(( $(date +%s) - T0 )),$rss" >> "$OUT/rss.csv"
        sleep 10 & wait $!
    done
) &
RSS_PID=$!

# ------------------------------------------------------------------ restart scheduler
# restarts.csv: backend,stop_at,start_at,ready_at,recovered_at (seconds since agent start;
# recovered_at = first fresh data seen by that backend after the restart, -1 = never)
echo "backend,stop_at,start_at,ready_at,recovered_at" > "$OUT/restarts.csv"
BACKENDS=(influxdb otlp-receiver pushgateway prometheus victoria-metrics)
schedule=()
for i in "${!BACKENDS[@]}"; do
    t=$((RESTART_START + i * RESTART_EVERY / ${#BACKENDS[@]}))
    while [ $((t + OUTAGE)) -le $((DURATION - TAIL)) ]; do
        # no short restart of the long outage's backend within a minute of it, or while it is down
        if [ "$LONG_OUTAGE" -gt 0 ] && [ "${BACKENDS[$i]}" = "$LONG_BACKEND" ] \
            && [ $((t + OUTAGE + 60)) -gt "$LONG_AT" ] && [ "$t" -lt $((LONG_AT + LONG_OUTAGE + LONG_RECOVERY_MAX)) ]; then
            t=$((t + RESTART_EVERY)); continue
        fi
        schedule+=("$t ${BACKENDS[$i]}")
        t=$((t + RESTART_EVERY))
    done
done
mapfile -t schedule < <(printf '%s\n' "${schedule[@]}" | sort -n)
log "restart schedule (s after start): $(printf '%s; ' "${schedule[@]}")"

q() { curl -fsS --max-time 5 -G "$@" 2>/dev/null; }
# fresh NAME SINCE_EPOCH -> 0 when the backend holds data from after SINCE_EPOCH
fresh() {
    local since="$1" v
    case "$2" in
        influxdb)
            v="$(q "http://127.0.0.1:$INFLUX_PORT/query" --data-urlencode db=gpumon \
                --data-urlencode "q=SELECT count(*) FROM gpu WHERE time > ${since}s" | grep -c '"values"' || true)"
            [ "${v:-0}" -gt 0 ] ;;
        otlp-receiver)
            v="$(q "http://127.0.0.1:$OTLP_HTTP/stats" | sed -n 's/.*"requests": *\([0-9]*\).*/\1/p')"
            [ "${v:-0}" -gt 0 ] ;;  # a restarted receiver counts from 0
        pushgateway)
            v="$(q "http://127.0.0.1:$PUSHGW_PORT/metrics" | awk -v j="job=\"$JOB\"" \
                '/^push_time_seconds\{/ && index($0, j) {print int($2)}' | sort -n | tail -n1)"
            [ "${v:-0}" -gt "$since" ] ;;
        victoria-metrics)
            q "http://127.0.0.1:$VM_PORT/internal/force_flush" >/dev/null || true
            v="$(q "http://127.0.0.1:$VM_PORT/api/v1/query" --data-urlencode "query=count(timestamp(gpumon_utilization_ratio) > $since)" \
                | grep -c '"value"' || true)"
            [ "${v:-0}" -gt 0 ] ;;
        prometheus)
            v="$(q "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=timestamp(up{job=\"$JOB\"}) > $since" \
                | grep -c '"value"' || true)"
            [ "${v:-0}" -gt 0 ] ;;
    esac
}
# back_up NAME T_STOP RECOVERY_MAX POLL CSV WHAT: the second half of every outage: start NAME again
# (KEEP_DATA=1), wait up to RECOVERY_MAX s (polling every POLL s) for fresh data in it, log it as
# WHAT and append "backend,stop_at,start_at,ready_at,recovered_at" to CSV (-1: never). Fails when
# the backend does not start.
back_up() {
    local name="$1" t_stop="$2" max="$3" poll="$4" csv="$5" what="$6" t_start t_ready_epoch t_ready rec=-1
    t_start=$(( $(date +%s) - T0 ))
    if ! KEEP_DATA=1 start_backend "$name" 2>>"$OUT/restarts.log"; then
        log "$what: start FAILED"
        echo "$name,$t_stop,$t_start,-1,-1" >> "$csv"
        return 1
    fi
    t_ready_epoch=$(date +%s); t_ready=$((t_ready_epoch - T0))
    while [ $(( $(date +%s) - t_ready_epoch )) -le "$max" ]; do
        if fresh "$t_ready_epoch" "$name"; then rec=$(( $(date +%s) - T0 )); break; fi
        sleep "$poll"
    done
    log "$what: down ${t_stop}s..${t_start}s, ready ${t_ready}s, fresh data at ${rec}s"
    echo "$name,$t_stop,$t_start,$t_ready,$rec" >> "$csv"
}
(
    trap 'exit 0' TERM
    for ev in "${schedule[@]}"; do
        at="${ev%% *}"; name="${ev#* }"
        while [ $(( $(date +%s) - T0 )) -lt "$at" ]; do sleep 0.5; done
        t_stop=$(( $(date +%s) - T0 ))
        log "restart $name: stop"
        KEEP_DATA=1 "$B/stop-$name.sh" 2>>"$OUT/restarts.log"
        sleep "$OUTAGE"
        back_up "$name" "$t_stop" "$RECOVERY_MAX" 0.5 "$OUT/restarts.csv" "restart $name" || continue
    done
) &
SCHED_PID=$!

# ------------------------------------------------------------------ the long outage
# long-outage.csv: the same columns as restarts.csv, for the one long outage.
echo "backend,stop_at,start_at,ready_at,recovered_at" > "$OUT/long-outage.csv"
if [ "$LONG_OUTAGE" -gt 0 ]; then
    (
        trap 'exit 0' TERM
        while [ $(( $(date +%s) - T0 )) -lt "$LONG_AT" ]; do sleep 0.5; done
        t_stop=$(( $(date +%s) - T0 ))
        log "long outage of $LONG_BACKEND: stop for ${LONG_OUTAGE}s"
        KEEP_DATA=1 "$B/stop-$LONG_BACKEND.sh" 2>>"$OUT/restarts.log"
        while [ $(( $(date +%s) - T0 )) -lt $((t_stop + LONG_OUTAGE)) ]; do sleep 0.5; done
        back_up "$LONG_BACKEND" "$t_stop" "$LONG_RECOVERY_MAX" 1 "$OUT/long-outage.csv" \
            "long outage of $LONG_BACKEND" || exit 0
    ) &
    LONG_PID=$!
fi

# ------------------------------------------------------------------ run
while [ $(( $(date +%s) - T0 )) -lt "$DURATION" ]; do
    kill -0 "$AGENT_PID" 2>/dev/null || { tail -n 20 "$OUT/agent.log" >&2; die "agent exited during the run"; }
    sleep 1
done
wait "$SCHED_PID" 2>/dev/null || true   # the tail leaves time for the last recovery check
SCHED_PID=""
if [ -n "$LONG_PID" ]; then wait "$LONG_PID" 2>/dev/null || true; fi
LONG_PID=""
kill "$RSS_PID" 2>/dev/null; wait "$RSS_PID" 2>/dev/null || true
RSS_PID=""
# One last RSS sample, then the agent's own counters, then a clean stop (it flushes every sink).
echo "$(( $(date +%s) - T0 )),$(awk '/^VmRSS:/ {print $2}' "/proc/$AGENT_PID/status")" >> "$OUT/rss.csv"
curl -fsS --max-time 5 "http://127.0.0.1:$AGENT_PORT/metrics" > "$OUT/metrics-final.txt"
T_END=$(date +%s)
kill -TERM "$AGENT_PID"
agent_rc=0; wait "$AGENT_PID" || agent_rc=$?
AGENT_PID=""
T_EXIT=$(date +%s)
log "agent stopped (exit $agent_rc)"
# the stream ends with the agent
for _ in $(seq 1 50); do [ -f "$OUT/web-stream.end" ] && break; sleep 0.2; done
kill "$WEB_PID" 2>/dev/null || true
wait "$WEB_PID" 2>/dev/null || true
WEB_PID=""

# ------------------------------------------------------------------ collect from the backends
curl -fsS -G "http://127.0.0.1:$INFLUX_PORT/query" --data-urlencode db=gpumon \
    --data-urlencode "q=SELECT count(up) FROM gpu GROUP BY *" > "$OUT/influx-counts.json" || true
curl -fsS "http://127.0.0.1:$OTLP_HTTP/received" > "$OUT/otlp-requests.jsonl" || true
curl -fsS "http://127.0.0.1:$PUSHGW_PORT/api/v1/metrics" > "$OUT/pushgateway.json" || true
RANGE=$((T_END - T0 + 60))
curl -fsS -G "http://127.0.0.1:$PROM_PORT/api/v1/query" \
    --data-urlencode "query=up{job=\"$JOB\"}[${RANGE}s]" --data-urlencode "time=$T_END" > "$OUT/prom-up.json" || true
curl -fsS -G "http://127.0.0.1:$PROM_PORT/api/v1/query" \
    --data-urlencode "query=max_over_time(gpumon_last_sample_duration_seconds{job=\"$JOB\"}[${RANGE}s])" \
    --data-urlencode "time=$T_END" > "$OUT/prom-sample-duration.json" || true
# VictoriaMetrics: flushed, then searchable ~1-1.5 s later; the export has every raw sample.
curl -fsS "http://127.0.0.1:$VM_PORT/internal/force_flush" >/dev/null || true
sleep 3
curl -fsS "http://127.0.0.1:$VM_PORT/api/v1/export" --data-urlencode 'match[]=gpumon_utilization_ratio' \
    > "$OUT/vm-export.jsonl" || true
cp "$BACKENDS_STATE_DIR"/*.log "$OUT/" 2>/dev/null || true

# ------------------------------------------------------------------ checks + summary
export OUT T0 T_END T_EXIT DURATION OUTAGE WARMUP LONG_OUTAGE LONG_SETTLE LONG_RECOVERY_MAX RSS_MAX_KIB RSS_MAX_PCT RECOVERY_MAX PROFILE MOCK_PROFILE agent_rc
"$PY" - <<'PYEOF' | tee "$OUT/summary.md"
import csv, json, os, re, sys

out = os.environ["OUT"]; T0 = int(os.environ["T0"]); T_END = int(os.environ["T_END"]); T_EXIT = int(os.environ["T_EXIT"])
outage = int(os.environ["OUTAGE"]); warmup = int(os.environ["WARMUP"])
fails = []
rows = []  # (check, value, expectation, ok)

def check(name, value, expect, ok):
    rows.append((name, value, expect, "ok" if ok else "**FAIL**"))
    if not ok:
        fails.append(name)

# agent self-metrics (just before the stop)
m = {}
for line in open(os.path.join(out, "metrics-final.txt")):
    mm = re.match(r'^(gpumon_(?:samples_total|sample_failures_total|skipped_ticks_total|sink_\w+?))(\{[^}]*\})? (\S+)$', line)
    if mm:
        sink = re.search(r'sink="([^"]*)"', mm.group(2) or "")
        m[(mm.group(1), sink.group(1) if sink else None)] = float(mm.group(3))
def sm(name, sink=None):
    return int(m.get((name, sink), 0))
samples_at_scrape = sm("gpumon_samples_total")
# the exact final count is in the agent's last log line ("stopped samples=N failures=M")
log = open(os.path.join(out, "agent.log"), errors="replace").read()
st = re.findall(r"stopped samples=(\d+) failures=(\d+)", re.sub(r"\x1b\[[0-9;]*m", "", log))
samples = int(st[-1][0]) if st else -1
run_s = T_END - T0
restarts = list(csv.DictReader(open(os.path.join(out, "restarts.csv"))))
def outages(name):
    return [r for r in restarts if r["backend"] == name]

print("## Soak summary\n")
long = list(csv.DictReader(open(os.path.join(out, "long-outage.csv"))))
long_s = int(os.environ["LONG_OUTAGE"])
long_desc = (f", and {long[0]['backend']} down {long_s} s from {long[0]['stop_at']} s" if long
             else ", no long outage")
print(f"agent `{os.environ['PROFILE']}` build, mock `{os.environ['MOCK_PROFILE']}`, 10 Hz, "
      f"{run_s} s, {len(restarts)} backend restarts ({outage} s outage each){long_desc}\n")

# --- agent
check("agent exit code", os.environ["agent_rc"], "0", os.environ["agent_rc"] == "0")
check("samples (final)", samples, f">= 95 % of {run_s * 10} (wall time x 10 Hz)", samples >= 0.95 * run_s * 10)
check("skipped ticks", sm("gpumon_skipped_ticks_total"), "0", sm("gpumon_skipped_ticks_total") == 0)
check("sample failures", sm("gpumon_sample_failures_total"), "0", sm("gpumon_sample_failures_total") == 0)
try:
    longest = max(float(r["value"][1]) for r in json.load(open(os.path.join(out, "prom-sample-duration.json")))["data"]["result"])
    longest = f"{longest * 1000:.1f} ms"
except Exception:  # noqa: BLE001
    longest = "n/a"
check("longest sample (seen by 1 s scrapes)", longest, "reported", True)
for s in ("influxdb", "otlp", "prometheus", "remote_write", "web"):
    d = sm("gpumon_sink_dropped_total", s)
    check(f"{s}: snapshots dropped (queue full)", d, "0", d == 0)

# --- RSS
rss = [(int(a), int(b)) for a, b in (l.strip().split(",") for l in open(os.path.join(out, "rss.csv")).readlines()[1:]) if b]
base = next((r for t, r in rss if t >= warmup), None)
end = rss[-1][1] if rss else None
if base is None or end is None:
    check("RSS samples", len(rss), f"one at >= {warmup} s", False)
else:
    growth = end - base
    lim_kib = int(os.environ["RSS_MAX_KIB"]); lim_pct = float(os.environ["RSS_MAX_PCT"])
    ok = growth <= lim_kib or growth <= base * lim_pct / 100
    check("RSS growth after warm-up", f"{base} -> {end} KiB ({growth:+d} KiB, {100.0 * growth / base:+.1f} %); peak {max(r for _, r in rss)} KiB",
          f"<= {lim_kib} KiB or <= {lim_pct:g} %", ok)

# --- the long outage: recovered, and RSS back within the bound of its level before it
if long_s > 0:
    if not long:
        check("long outage", "did not happen", "one", False)
    else:
        lo = long[0]
        rec = int(lo["recovered_at"]); ready = int(lo["ready_at"]); stop = int(lo["stop_at"])
        lmax = int(os.environ["LONG_RECOVERY_MAX"])
        check(f"long outage ({lo['backend']}, {long_s} s): fresh data after", "never" if rec < 0 else f"{rec - ready} s",
              f"<= {lmax} s", rec >= 0)
        pre = [r for t, r in rss if t < stop]
        settle_at = ready + int(os.environ["LONG_SETTLE"])
        post = next((r for t, r in rss if t >= settle_at), None)
        peak_during = max((r for t, r in rss if stop <= t <= settle_at), default=None)
        if not pre or post is None:
            check("long outage: RSS before / after", f"{len(pre)} samples before, after {post}", "both", False)
        else:
            lim_pct = float(os.environ["RSS_MAX_PCT"])
            before = pre[-1]
            check("long outage: RSS before -> peak -> after the drain",
                  f"{before} -> {peak_during} -> {post} KiB ({100.0 * (post - before) / before:+.1f} %, at {settle_at} s)",
                  f"after <= before + {lim_pct:g} %", post <= before * (1 + lim_pct / 100))

# --- restarts: every backend saw fresh data again within the bound
rmax = int(os.environ["RECOVERY_MAX"])
for r in restarts:
    rec = int(r["recovered_at"]); ready = int(r["ready_at"])
    check(f"{r['backend']} restart at {r['stop_at']} s: fresh data after", "never" if rec < 0 else f"{rec - ready} s",
          f"<= {rmax} s", rec >= 0)

# --- InfluxDB: every sample stored, for every GPU
try:
    res = json.load(open(os.path.join(out, "influx-counts.json")))["results"][0].get("series", [])
except Exception as e:  # noqa: BLE001
    res = []
counts = {json.dumps(s.get("tags", {}), sort_keys=True): s["values"][0][1] for s in res}
n_gpu = len(counts)
check("influxdb: series (GPUs) in `gpu`", n_gpu, "> 0", n_gpu > 0)
bad = {k: v for k, v in counts.items() if v != samples}
check("influxdb: points per GPU == samples", f"{min(counts.values(), default=0)}..{max(counts.values(), default=0)} (x{n_gpu} = {sum(counts.values())} points)",
      f"== {samples} each", n_gpu > 0 and not bad)
check("influxdb: sink failures (retried, reported)", sm("gpumon_sink_failures_total", "influxdb"), "any (retried)", True)

# --- OTLP: everything counted as exported arrived; the rest counted as failures, in outages only
times = set(); reqs = 0; points = 0
for line in open(os.path.join(out, "otlp-requests.jsonl")):
    if not line.strip():
        continue
    r = json.loads(line)
    if r.get("resource", {}).get("service.name") != "gpumon-soak":
        continue
    reqs += 1; points += r["points"]; times.update(r["time_unix_nano"])
o_exp = sm("gpumon_sink_exported_total", "otlp"); o_fail = sm("gpumon_sink_failures_total", "otlp")
# down = from the stop until the restarted receiver answered, +2 s for the edges
o_down = sum(max(int(r["ready_at"]), int(r["start_at"])) - int(r["stop_at"]) + 2 for r in outages("otlp-receiver"))
# Failures only happen in outages, so the count scraped before the stop is final; the shutdown
# flushes the last snapshot, so every sample must be received or counted as failed.
check("otlp: snapshots received + failed == samples", f"{len(times)} received ({reqs} requests, {points} points) + {o_fail} failed = {len(times) + o_fail}",
      f"== {samples}", len(times) + o_fail == samples and len(times) > 0)
check("otlp: exported (before the stop) all received", f"{o_exp} exported, {len(times)} received", "received >= exported", len(times) >= o_exp > 0)
check("otlp: failed exports only during outages", o_fail, f"<= {o_down * 10} ({o_down} s down x 10 Hz)", o_fail <= o_down * 10)

# --- Pushgateway: pushes accepted again after every restart (checked live), final group current
try:
    groups = json.load(open(os.path.join(out, "pushgateway.json")))["data"]
except Exception:  # noqa: BLE001
    groups = []
pt = [float(g["push_time_seconds"]["metrics"][0]["value"]) for g in groups
      if g.get("labels", {}).get("job") == "gpumon-soak" and "push_time_seconds" in g]
last_push = max(pt, default=0.0)
p_exp = sm("gpumon_sink_exported_total", "pushgateway"); p_fail = sm("gpumon_sink_failures_total", "pushgateway")
p_drop = sm("gpumon_sink_dropped_total", "pushgateway")
# a push retries inside the sink for up to its 8 s timeout, so during an outage later snapshots
# queue up and the oldest are dropped (counted): harmless, the gateway keeps only the last push
p_down = sum(max(int(r["ready_at"]), int(r["start_at"])) - int(r["stop_at"]) + 8 for r in outages("pushgateway"))
check("pushgateway: final push current", f"last push {last_push - T0:.1f} s, agent stopped {T_EXIT - T0} s",
      "within 2 s of the stop", T_END - 2 <= last_push <= T_EXIT + 2)
check("pushgateway: pushes accepted / failed / dropped", f"{p_exp} / {p_fail} / {p_drop}",
      f"failed + dropped <= {p_down * 10} ({p_down} s around outages x 10 Hz)", p_exp > 0 and p_fail + p_drop <= p_down * 10)

# --- remote write: every snapshot arrived (distinct timestamps of one family)
rw_times = set(); rw_series = 0
try:
    for line in open(os.path.join(out, "vm-export.jsonl")):
        if line.strip():
            rw_series += 1
            rw_times.update(json.loads(line)["timestamps"])
except OSError:
    pass
check("remote write: snapshots in VictoriaMetrics (distinct timestamps of gpumon_utilization_ratio)",
      f"{len(rw_times)} ({rw_series} series); exported / failed {sm('gpumon_sink_exported_total', 'remote_write')} / {sm('gpumon_sink_failures_total', 'remote_write')}",
      f"== {samples}", len(rw_times) == samples)

# --- web view: the live stream stayed open and kept up
try:
    events = int(open(os.path.join(out, "web-stream.txt")).read().strip() or 0)
    ended = int(open(os.path.join(out, "web-stream.end")).read().strip())
except (OSError, ValueError):
    events, ended = 0, 0
check("web: live stream open until the agent stopped", f"ended {ended - T0} s (agent stopped {T_END - T0}..{T_EXIT - T0} s)",
      f">= {T_END - T0} s", ended >= T_END)
check("web: snapshot events on the live stream", events, f">= 90 % of {samples}", events >= 0.9 * samples)

# --- Prometheus: no failed scrape; gaps only around its own restarts
try:
    series = json.load(open(os.path.join(out, "prom-up.json")))["data"]["result"]
except Exception:  # noqa: BLE001
    series = []
vals = sorted((float(t), float(v)) for s in series for t, v in s["values"])
failed = sum(1 for _, v in vals if v == 0)
check("prometheus: scrapes stored / failed (up == 0)", f"{len(vals)} / {failed}", "failed == 0", len(vals) > 0 and failed == 0)
windows = [(T0 + int(r["stop_at"]) - 1, T0 + int(r["ready_at"]) + 12) for r in outages("prometheus")]
gaps = [(a, b) for (a, _), (b, _) in zip(vals, vals[1:]) if b - a > 2.5]
unexpected = [(a, b) for a, b in gaps if not any(w0 <= a and b <= w1 for w0, w1 in windows)]
expected_scrapes = (vals[-1][0] - vals[0][0]) + 1 if vals else 0
gap_desc = ", ".join(f"{b - a:.0f} s at {a - T0:.0f} s" for a, b in gaps) or "none"
check("prometheus: gaps > 2.5 s", gap_desc, "only during its own restarts (reported)", not unexpected)
check("prometheus: scrapes missing (first..last)", f"{expected_scrapes - len(vals):.0f} of {expected_scrapes:.0f}", "reported", True)

print("| check | value | expected | result |")
print("| --- | --- | --- | --- |")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
print()
print("Restarts (s after agent start):\n")
print("| backend | down | ready | fresh data |")
print("| --- | --- | --- | --- |")
for r in restarts:
    print(f"| {r['backend']} | {r['stop_at']}..{r['start_at']} | {r['ready_at']} | {r['recovered_at']} |")
for r in long:
    print(f"| {r['backend']} (long outage) | {r['stop_at']}..{r['start_at']} | {r['ready_at']} | {r['recovered_at']} |")
print()
print(f"RESULT: {'FAIL (' + ', '.join(fails) + ')' if fails else 'PASS'}")
sys.exit(1 if fails else 0)
PYEOF

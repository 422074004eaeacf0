#!/usr/bin/env bash
# End-to-end check of every backend script: start it on 127.0.0.1, feed it a
# small sample, query the sample back, restart it with KEEP_DATA=1 where tests
# rely on that, stop it. Prints one PASS/FAIL line per check and
# "N passed, N failed" at the end; exit code 1 if any check failed.
#
#   selftest.sh                      all backends
#   selftest.sh prometheus influxdb  only those (prometheus pushgateway influxdb
#                                    victoria-metrics otlp)
#
# Run scripts/backends/install.sh first.
# Uses its own BACKENDS_STATE_DIR so it never touches backends that
# scripts/test.sh started, but the ports are the same: don't run both at once.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export BACKENDS_STATE_DIR="${SELFTEST_STATE_DIR:-${TMPDIR:-/tmp}/gpumon-backends-selftest}"
. "$HERE/lib.sh"
want=("$@"); [ ${#want[@]} -eq 0 ] && want=(prometheus pushgateway influxdb victoria-metrics otlp)
PASS=0; FAIL=0
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpumon-selftest.XXXXXX")"
TARGET_PID=""

cleanup() {
    [ -n "$TARGET_PID" ] && kill "$TARGET_PID" 2>/dev/null
    "$HERE/stop-all.sh" >/dev/null 2>&1
    rm -rf -- "$WORK"
}
trap cleanup EXIT

ok()   { PASS=$((PASS+1)); printf 'PASS  %s\n' "$*"; }
bad()  { FAIL=$((FAIL+1)); printf 'FAIL  %s\n' "$*"; }
check() { local what="$1"; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
selected() { printf '%s\n' "${want[@]}" | grep -qx "$1"; }
ms_since() { echo $(( $(now_ms) - $1 )); }
C() { curl -fsS --noproxy '*' --max-time 10 "$@"; }

# poll_until SECONDS CMD...: retry CMD every 0.2 s until it succeeds
poll_until() {
    local limit="$1"; shift
    local deadline=$(( $(now_ms) + limit * 1000 ))
    until "$@" >/dev/null 2>&1; do
        [ "$(now_ms)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}
promq() {  # promq BASE QUERY EXPECTED_VALUE
    C -G "$1/api/v1/query" --data-urlencode "query=$2" 2>/dev/null |
        python3 -c "import json,sys; r=json.load(sys.stdin)['data']['result']; sys.exit(0 if r and float(r[0]['value'][1])==float('$3') else 1)"
}
stopped() {  # stopped PORT: nothing listens any more
    port_free "$1"
}
both_free() { port_free "$1" && port_free "$2"; }

# ------------------------------------------------------------------ Prometheus
if selected prometheus; then
    mkdir -p "$WORK/target"
    printf '# TYPE selftest_gpu_temperature_celsius gauge\nselftest_gpu_temperature_celsius{gpu="0"} 42.5\n' > "$WORK/target/metrics"
    python3 -m http.server --bind 127.0.0.1 --directory "$WORK/target" 19092 >/dev/null 2>&1 &
    TARGET_PID=$!
    poll_until 10 C -o /dev/null http://127.0.0.1:19092/metrics
    t=$(now_ms)
    if PROM_SCRAPE_TARGETS=127.0.0.1:19092 "$HERE/start-prometheus.sh"; then
        echo "      prometheus started in $(ms_since "$t") ms"
        P=http://127.0.0.1:${PROM_PORT:-19090}
        t=$(now_ms)
        check "prometheus scraped the target given by PROM_SCRAPE_TARGETS (1s interval)" \
            poll_until 20 promq "$P" 'selftest_gpu_temperature_celsius{gpu="0",job="gpumon"}' 42.5
        echo "      first scraped sample visible $(ms_since "$t") ms after ready"
        check "promtool answers" sh -c "promtool --version >/dev/null 2>&1"
        printf '# TYPE selftest_gpu_temperature_celsius gauge\nselftest_gpu_temperature_celsius{gpu="0"} 50\n' > "$WORK/target/metrics"
        t=$(now_ms)
        check "restart-prometheus.sh with new PROM_SCRAPE_TARGETS" \
            env PROM_SCRAPE_TARGETS=localhost:19092 "$HERE/restart-prometheus.sh"
        check "restarted prometheus scrapes the new target" \
            poll_until 20 promq "$P" 'selftest_gpu_temperature_celsius{instance="localhost:19092"}' 50
        echo "      restart + first scrape took $(ms_since "$t") ms"
        check "start-prometheus.sh refuses a non-loopback target" \
            sh -c "! BACKEND_INSTANCE=bad PROM_PORT=19099 PROM_SCRAPE_TARGETS=10.0.0.1:9400 '$HERE/start-prometheus.sh' 2>/dev/null"
    else
        bad "prometheus start"
    fi
    "$HERE/stop-prometheus.sh" 2>/dev/null
    check "prometheus port is free after stop" stopped "${PROM_PORT:-19090}"
    kill "$TARGET_PID" 2>/dev/null; wait "$TARGET_PID" 2>/dev/null; TARGET_PID=""
fi

# ------------------------------------------------------------------ Pushgateway
if selected pushgateway; then
    t=$(now_ms)
    if "$HERE/start-pushgateway.sh"; then
        echo "      pushgateway started in $(ms_since "$t") ms"
        G=http://127.0.0.1:${PUSHGW_PORT:-19191}
        check "pushgateway accepted a PUT of a metric group" \
            sh -c "printf '# TYPE selftest_pg gauge\nselftest_pg{gpu=\"0\"} 0.75\n' |
                   curl -fsS --noproxy '*' -X PUT --data-binary @- $G/metrics/job/selftest/instance/host-a"
        check "pushgateway /metrics shows the pushed sample" \
            sh -c "curl -fsS --noproxy '*' $G/metrics | grep -qx 'selftest_pg{gpu=\"0\",instance=\"host-a\",job=\"selftest\"} 0.75'"
        KEEP_DATA=1 "$HERE/stop-pushgateway.sh" 2>/dev/null
        check "pushgateway port is free after stop" stopped "${PUSHGW_PORT:-19191}"
        check "pushgateway restarted with KEEP_DATA=1" env KEEP_DATA=1 "$HERE/start-pushgateway.sh"
        check "pushgateway kept the group across the restart" \
            sh -c "curl -fsS --noproxy '*' $G/metrics | grep -qx 'selftest_pg{gpu=\"0\",instance=\"host-a\",job=\"selftest\"} 0.75'"
    else
        bad "pushgateway start"
    fi
    "$HERE/stop-pushgateway.sh" 2>/dev/null
    check "pushgateway data dir removed by the final stop" \
        sh -c "! ls -d '${TMPDIR:-/tmp}'/backend-pushgateway.* 2>/dev/null | grep -q ."
fi

# ------------------------------------------------------------------ InfluxDB
if selected influxdb; then
    t=$(now_ms); ns_0=""; ns_1=""
    if "$HERE/start-influxdb.sh" && "$HERE/start-influxdb-auth.sh"; then
        echo "      influxdb + influxdb-auth started in $(ms_since "$t") ms"
        for auth in 0 1; do
            if [ $auth = 1 ]; then I=http://127.0.0.1:18087; cred="-u gpumon:gpumon-test-pw"; else I=http://127.0.0.1:18086; cred=""; fi
            ns=$(date +%s%N)
            check "influxdb (auth=$auth) accepted line protocol on /write?precision=ns" \
                sh -c "printf 'selftest_gpu,host=a,gpu=0 util=0.75,temp=61i $ns\n' |
                       curl -fsS --noproxy '*' $cred --data-binary @- '$I/write?db=gpumon&precision=ns'"
            check "influxdb (auth=$auth) returns the point from /query" \
                sh -c "curl -fsS --noproxy '*' $cred -G '$I/query' --data-urlencode db=gpumon --data-urlencode epoch=ns \
                         --data-urlencode 'q=SELECT util, temp FROM selftest_gpu' | grep -q '\[$ns,0.75,61\]'"
            if [ $auth = 1 ]; then ns_1=$ns; else ns_0=$ns; fi
        done
        check "influxdb (auth=1) rejects an unauthenticated write with 401" \
            sh -c "[ \"\$(printf 'x v=1\n' | curl -s -o /dev/null -w '%{http_code}' --noproxy '*' --data-binary @- 'http://127.0.0.1:18087/write?db=gpumon')\" = 401 ]"
        KEEP_DATA=1 "$HERE/stop-influxdb.sh" 2>/dev/null
        KEEP_DATA=1 "$HERE/stop-influxdb-auth.sh" 2>/dev/null
        check "influxdb ports are free after stop" both_free 18086 18087
        check "influxdb + influxdb-auth restarted with KEEP_DATA=1" \
            sh -c "KEEP_DATA=1 '$HERE/start-influxdb.sh' 2>/dev/null && KEEP_DATA=1 '$HERE/start-influxdb-auth.sh' 2>/dev/null"
        check "influxdb kept its point across the restart" \
            sh -c "curl -fsS --noproxy '*' -G 'http://127.0.0.1:18086/query' --data-urlencode db=gpumon --data-urlencode epoch=ns \
                     --data-urlencode 'q=SELECT util FROM selftest_gpu' | grep -q '\[$ns_0,0.75\]'"
        check "influxdb-auth kept its user and point across the restart" \
            sh -c "curl -fsS --noproxy '*' -u gpumon:gpumon-test-pw -G 'http://127.0.0.1:18087/query' --data-urlencode db=gpumon --data-urlencode epoch=ns \
                     --data-urlencode 'q=SELECT util FROM selftest_gpu' | grep -q '\[$ns_1,0.75\]'"
    else
        bad "influxdb start"
    fi
    "$HERE/stop-influxdb.sh" 2>/dev/null; "$HERE/stop-influxdb-auth.sh" 2>/dev/null
fi

# ------------------------------------------------------------------ VictoriaMetrics
if selected victoria-metrics; then
    t=$(now_ms)
    if "$HERE/start-victoria-metrics.sh"; then
        echo "      victoria-metrics started in $(ms_since "$t") ms"
        V=http://127.0.0.1:${VM_PORT:-18428}
        check "victoria-metrics accepted Influx line protocol on /write" \
            sh -c "printf 'selftest_influx,gpu=0 util=0.5\n' | curl -fsS --noproxy '*' --data-binary @- '$V/write?db=selftest'"
        check "victoria-metrics accepted Prometheus text on /api/v1/import/prometheus" \
            sh -c "printf '# TYPE selftest_text gauge\nselftest_text{gpu=\"0\"} 42.5\n' | curl -fsS --noproxy '*' --data-binary @- $V/api/v1/import/prometheus"
        C "$V/internal/force_flush" >/dev/null
        t=$(now_ms)
        check "victoria-metrics returns the /write sample"      poll_until 15 promq "$V" 'selftest_influx_util{db="selftest"}' 0.5
        check "victoria-metrics returns the text-import sample" poll_until 15 promq "$V" 'selftest_text{gpu="0"}' 42.5
        echo "      samples visible $(ms_since "$t") ms after force_flush"
    else
        bad "victoria-metrics start"
    fi
    "$HERE/stop-victoria-metrics.sh" 2>/dev/null
    check "victoria-metrics port is free after stop" stopped "${VM_PORT:-18428}"
fi

# ------------------------------------------------------------------ OTLP receiver
otlp_point_seen() {  # URL TRANSPORT
    curl -fsS --noproxy '*' "$1" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
t = sys.argv[1]
ok = any(r["transport"] == t and r["name"] == "demo.gpu.temperature"
         and r["type"] == "gauge" and r["unit"] == "Cel" and r["value"] == 61.5
         and r["attributes"] == {"gpu": "0", "uuid": "GPU-demo-0"}
         and r["resource"].get("service.name") == "otlp-demo" and r["time_unix_nano"] > 0
         for r in rows)
ok = ok and any(r["transport"] == t and r["name"] == "demo.gpu.ecc_errors"
                and r["type"] == "sum" and r["value"] == 3 and r["value_type"] == "int"
                and r["is_monotonic"] for r in rows)
sys.exit(0 if ok else 1)' "$2"
}
if selected otlp; then
    t=$(now_ms)
    GP=${OTLP_GRPC_PORT:-14317}; HP=${OTLP_HTTP_PORT:-14318}
    if out="$("$HERE/start-otlp-receiver.sh")"; then
        echo "      otlp receiver started in $(ms_since "$t") ms ($out)"
        R="http://127.0.0.1:$HP/received"
        check "opentelemetry-sdk exported over OTLP/gRPC" \
            "$GPUMON_VENV/bin/python" "$HERE/otlp_client_demo.py" grpc "http://127.0.0.1:$GP"
        check "receiver recorded the gRPC data points" otlp_point_seen "$R" grpc
        check "opentelemetry-sdk exported over OTLP/HTTP protobuf" \
            "$GPUMON_VENV/bin/python" "$HERE/otlp_client_demo.py" http "http://127.0.0.1:$HP/v1/metrics"
        check "receiver recorded the HTTP data points" otlp_point_seen "$R" http
        check "receiver's JSON-lines file has them too" grep -q demo.gpu.temperature "${out#OTLP_OUT=}"
        check "POST /reset empties the received points" \
            sh -c "curl -fsS --noproxy '*' -X POST http://127.0.0.1:$HP/reset >/dev/null && [ -z \"\$(curl -fsS --noproxy '*' $R)\" ]"
    else
        bad "otlp receiver start"
    fi
    "$HERE/stop-otlp-receiver.sh" 2>/dev/null
    check "otlp receiver ports are free after stop" both_free "$GP" "$HP"
    check "venv has pynvml, gpustat and nvml.h" sh -c "'$GPUMON_VENV/bin/python' -c 'import pynvml, gpustat' &&
        '$GPUMON_VENV/bin/gpustat' --version >/dev/null && ls '$GPUMON_VENV'/lib/python3*/site-packages/nvidia/cu*/include/nvml.h >/dev/null"
fi

check "nothing left running in $BACKENDS_STATE_DIR" sh -c "! ls '$BACKENDS_STATE_DIR'/*.pid 2>/dev/null | grep -q ."
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]

#!/usr/bin/env bash
# Start Prometheus (Debian package "prometheus", 2.42) on 127.0.0.1 with a
# temporary TSDB directory, scraping static targets every second.
#
#   PROM_PORT              listen port                                   (default 19090)
#   PROM_SCRAPE_TARGETS    comma-separated host:port scrape targets, e.g. the
#                          gpumon agent a test started first            (default: none)
#   PROM_SCRAPE_PATH       metrics path of the targets                   (default /metrics)
#   PROM_SCRAPE_INTERVAL   scrape (and rule evaluation) interval         (default 1s)
#   PROM_SCRAPE_SCHEME     http or https                                 (default http)
#   PROM_SCRAPE_CA_FILE    CA certificate for https targets              (default: none)
#   PROM_SCRAPE_INSECURE   1 = skip TLS verification of https targets    (default 0)
#   PROM_JOB_NAME          job label of the scraped series               (default gpumon)
#   PROM_RULE_FILES        comma-separated alerting/recording rule files, copied into
#                          the data dir and loaded (rule_files:)          (default: none)
#   PROM_CONFIG            use this prometheus.yml instead of the generated one
#   PROM_REMOTE_WRITE      1 = accept remote_write on /api/v1/write      (default 1)
#   PROM_EXTRA_ARGS        extra command-line flags, word-split
#   BACKEND_INSTANCE, KEEP_DATA: see lib.sh
#
# Ready when GET /-/ready answers 200. Query: /api/v1/query?query=...
# THE FIRST SCRAPE HAPPENS 5-6 s AFTER READY, whatever the interval (the scrape
# manager applies target changes on a 5 s tick): poll for up to ~15 s.
# To point it at another target, use restart-prometheus.sh with new
# PROM_SCRAPE_TARGETS (the same 5-6 s delay applies again).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lib.sh"
PORT="${PROM_PORT:-19090}"
TARGETS="${PROM_SCRAPE_TARGETS:-}"
SPATH="${PROM_SCRAPE_PATH:-/metrics}"
INTERVAL="${PROM_SCRAPE_INTERVAL:-1s}"
SCHEME="${PROM_SCRAPE_SCHEME:-http}"
JOB="${PROM_JOB_NAME:-gpumon}"
need_cmd prometheus prometheus
need_cmd promtool prometheus
tlist=""
IFS=',' read -r -a tarr <<< "$TARGETS"
for t in "${tarr[@]}"; do
    t="${t// /}"
    case "$t" in
        "") ;;
        127.*|localhost:*|\[::1\]:*) tlist="$tlist\"$t\", " ;;
        *) die "scrape target '$t' is not on loopback (127.0.0.0/8, localhost, [::1])" ;;
    esac
done
claim_instance prometheus DATA "$PORT"

if [ -n "${PROM_CONFIG:-}" ]; then
    cp "$PROM_CONFIG" "$DATA/prometheus.yml"
else
    {
        printf 'global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n' \
            "$INTERVAL" "$INTERVAL" "$INTERVAL"
        printf 'scrape_configs:\n'
        if [ -n "$tlist" ]; then
            printf '  - job_name: "%s"\n    scheme: %s\n    metrics_path: "%s"\n' "$JOB" "$SCHEME" "$SPATH"
            if [ "$SCHEME" = https ]; then
                printf '    tls_config:\n'
                if [ -n "${PROM_SCRAPE_CA_FILE:-}" ]; then printf '      ca_file: "%s"\n' "$PROM_SCRAPE_CA_FILE"; fi
                if [ "${PROM_SCRAPE_INSECURE:-0}" = 1 ]; then printf '      insecure_skip_verify: true\n'; fi
            fi
            printf '    static_configs:\n      - targets: [%s]\n' "${tlist%, }"
        fi
    } > "$DATA/prometheus.yml"
    if [ -z "$tlist" ]; then
        sed -i 's/^scrape_configs:$/scrape_configs: []/' "$DATA/prometheus.yml"
    fi
fi
if [ -n "${PROM_RULE_FILES:-}" ]; then
    printf 'rule_files:\n' >> "$DATA/prometheus.yml"
    IFS=',' read -r -a rarr <<< "$PROM_RULE_FILES"
    for r in "${rarr[@]}"; do
        [ -f "$r" ] || die "rule file '$r' not found"
        cp "$r" "$DATA/$(basename "$r")"
        printf '  - "%s"\n' "$DATA/$(basename "$r")" >> "$DATA/prometheus.yml"
    done
fi
promtool check config "$DATA/prometheus.yml" >/dev/null || { cat "$DATA/prometheus.yml" >&2; die "invalid config $DATA/prometheus.yml"; }

args=(--config.file="$DATA/prometheus.yml"
      --storage.tsdb.path="$DATA/tsdb"
      --web.listen-address="$BACKENDS_BIND:$PORT"
      --web.enable-lifecycle
      --log.level=info)
[ "${PROM_REMOTE_WRITE:-1}" = 1 ] && args+=(--web.enable-remote-write-receiver)
# shellcheck disable=SC2206
[ -n "${PROM_EXTRA_ARGS:-}" ] && args+=($PROM_EXTRA_ARGS)

serve "$NAME" "http://127.0.0.1:$PORT/-/ready" "" /usr/bin/prometheus /usr/bin/prometheus "${args[@]}"
log "$NAME ready on http://127.0.0.1:$PORT (pid $SPAWNED_PID, $READY_MS ms, targets [${TARGETS}], data $DATA); first scrape in ~5-6 s"

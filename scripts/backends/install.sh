#!/usr/bin/env bash
# Install the metric backends for the tests from Debian 12 packages, and the
# Python virtualenv (OTLP receiver, nvidia-ml-py, gpustat, nvml.h) from PyPI.
# Idempotent: what is already installed is skipped (no apt-get update, no pip)
# and a rerun takes well under a second. Needs root only when something is
# missing.
#
#   install.sh                 everything
#   install.sh prometheus pushgateway influxdb victoria-metrics venv chromium
#                              just those ("otlp" is an alias of "venv";
#                              chromium: Debian's headless browser for the web
#                              view's tests, scripts/web-browser.py)
#
#   GPUMON_VENV  the virtualenv (default /opt/gpumon-venv), made with Debian's
#                /usr/bin/python3 from requirements-otlp.txt + requirements-test.txt
#                (exact pins). It is rebuilt from scratch whenever those files
#                or the base Python change (a stamp file in the venv records them).
#
# The Debian packages' maintainer scripts would otherwise start each service
# at once on its default port ON ALL INTERFACES (prometheus :9090, pushgateway
# :9091, influxd :8086, victoria-metrics :8428). This script installs with a
# /usr/sbin/policy-rc.d that forbids service starts (created only if absent,
# removed afterwards), and on a systemd machine also disables the units, so
# nothing listens until a start-*.sh starts it on 127.0.0.1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${GPUMON_VENV:-/opt/gpumon-venv}"
BASE_PY=/usr/bin/python3
REQS=("$HERE/requirements-otlp.txt" "$HERE/requirements-test.txt")
want=("$@"); [ ${#want[@]} -eq 0 ] && want=(prometheus pushgateway influxdb victoria-metrics venv chromium)

log() { printf '[%s] install.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 is missing and installing it needs root: run as root"; }

pkgs=(curl ca-certificates openssl)   # openssl: make-test-certs.sh
units=()
do_venv=0
for w in "${want[@]}"; do
    case "$w" in
        prometheus)       pkgs+=(prometheus);             units+=(prometheus) ;;  # ships promtool too
        pushgateway)      pkgs+=(prometheus-pushgateway); units+=(prometheus-pushgateway) ;;
        influxdb)         pkgs+=(influxdb);               units+=(influxdb) ;;
        victoria-metrics) pkgs+=(victoria-metrics);       units+=(victoria-metrics) ;;
        venv|otlp)        pkgs+=(python3 python3-venv);   do_venv=1 ;;
        chromium)         pkgs+=(chromium python3) ;;
        *) die "unknown component '$w' (prometheus pushgateway influxdb victoria-metrics venv chromium)" ;;
    esac
done

# ------------------------------------------------------------ Debian packages
installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
missing=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done

if [ ${#missing[@]} -eq 0 ]; then
    log "Debian packages already installed: ${pkgs[*]}"
else
    need_root "Debian packages (${missing[*]})"
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# gpumon install.sh: no service starts during package installs\nexit 101\n' > "$policy"
        chmod 755 "$policy"; made_policy=1
    fi
    trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
    t0=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    log "installing ${missing[*]}"
    apt-get -q -o DPkg::Lock::Timeout=300 update
    apt-get -q -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${missing[@]}"
    if [ -d /run/systemd/system ] && [ ${#units[@]} -gt 0 ]; then
        systemctl disable --now "${units[@]}" 2>/dev/null || true
    fi
    log "Debian packages installed in $(( $(date +%s) - t0 ))s"
fi
for b in "${want[@]}"; do
    case "$b" in
        prometheus)       for x in /usr/bin/prometheus /usr/bin/promtool; do [ -x "$x" ] || die "$x missing after install"; done ;;
        pushgateway)      [ -x /usr/bin/prometheus-pushgateway ] || die "/usr/bin/prometheus-pushgateway missing after install" ;;
        influxdb)         [ -x /usr/bin/influxd ] || die "/usr/bin/influxd missing after install" ;;
        victoria-metrics) [ -x /usr/bin/victoria-metrics ] || die "/usr/bin/victoria-metrics missing after install" ;;
    esac
done

# ------------------------------------------------------------ Python virtualenv
if [ "$do_venv" = 1 ]; then
    stamp="$( { "$BASE_PY" --version 2>&1; cat "${REQS[@]}"; } | sha256sum | cut -d' ' -f1)"
    stampf="$VENV/.gpumon-requirements.sha256"
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null \
            && [ "$(cat "$stampf" 2>/dev/null)" = "$stamp" ]; then
        log "virtualenv $VENV already up to date"
    else
        [ -w "$(dirname "$VENV")" ] || [ -w "$VENV" ] || need_root "virtualenv $VENV"
        t1=$(date +%s)
        log "creating virtualenv $VENV ($("$BASE_PY" --version 2>&1))"
        "$BASE_PY" -m venv --clear "$VENV"
        rargs=(); for r in "${REQS[@]}"; do rargs+=(-r "$r"); done
        PIP_NO_INPUT=1 "$VENV/bin/pip" install -q --disable-pip-version-check "${rargs[@]}"
        "$VENV/bin/pip" check --disable-pip-version-check >/dev/null || die "pip check failed in $VENV"
        "$VENV/bin/python" -c 'import grpc, pynvml, gpustat, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc' \
            || die "imports failed in $VENV"
        printf '%s\n' "$stamp" > "$stampf"
        log "virtualenv $VENV ready in $(( $(date +%s) - t1 ))s"
    fi
fi

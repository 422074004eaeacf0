# shellcheck shell=bash
# Shared helpers for the start-*.sh / stop-*.sh scripts. Source it; do not run it.
#
# Every backend is started on 127.0.0.1 only. Its PID, data directory and
# output are kept in
#   $BACKENDS_STATE_DIR/<name>.pid | <name>.exe | <name>.datadir | <name>.log
# (default BACKENDS_STATE_DIR=${TMPDIR:-/tmp}/gpumon-backends), and the stop
# script kills exactly that PID, after checking that it is still the expected
# program.
#
# <name> is the backend's base name (prometheus, pushgateway, influxdb,
# influxdb-auth, victoria-metrics, otlp-receiver), or "<base>-$BACKEND_INSTANCE"
# when BACKEND_INSTANCE is set: a test can run a private instance on its own
# port(s) next to the shared one, e.g.
#   BACKEND_INSTANCE=outage PUSHGW_PORT=19291 start-pushgateway.sh
#   BACKEND_INSTANCE=outage stop-pushgateway.sh
#
# Data directories: a start makes a fresh `mktemp -d ${TMPDIR:-/tmp}/backend-<name>.XXXXXX`.
# KEEP_DATA=1 on a stop keeps the directory (and its record); KEEP_DATA=1 on the
# next start reuses it, so a restart keeps the database. A start without
# KEEP_DATA=1 deletes a directory an earlier KEEP_DATA=1 stop kept.

BACKENDS_STATE_DIR="${BACKENDS_STATE_DIR:-${TMPDIR:-/tmp}/gpumon-backends}"
BACKENDS_READY_TIMEOUT="${BACKENDS_READY_TIMEOUT:-30}"   # seconds
# The Python virtualenv made by install.sh (OTLP receiver, nvidia-ml-py, gpustat).
GPUMON_VENV="${GPUMON_VENV:-/opt/gpumon-venv}"
export BACKENDS_BIND="127.0.0.1"                         # never anything else

mkdir -p "$BACKENDS_STATE_DIR"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

now_ms() { date +%s%3N; }

# instance_name BASE -> BASE, or BASE-$BACKEND_INSTANCE
instance_name() {
    if [ -n "${BACKEND_INSTANCE:-}" ]; then
        case "$BACKEND_INSTANCE" in
            *[!A-Za-z0-9_.-]*) die "BACKEND_INSTANCE='$BACKEND_INSTANCE': use only letters, digits, _ . -" ;;
        esac
        printf '%s-%s\n' "$1" "$BACKEND_INSTANCE"
    else
        printf '%s\n' "$1"
    fi
}

# alive PID -> 0 if the process exists and is not a zombie (an exited child of
# init that has not been reaped yet still answers kill -0; some container
# inits reap only every couple of seconds)
alive() {
    [ -n "$1" ] || return 1
    kill -0 "$1" 2>/dev/null || return 1
    local st
    st="$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null)"
    [ "$st" != Z ] && [ "$st" != X ]
}

need_cmd() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found: run scripts/backends/install.sh (or apt-get install -y $2)"
}

# port_free PORT -> 0 if nothing listens on 127.0.0.1:PORT
port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# wait_port_free NAME PORT: a restarted server may find its port still held for
# a moment by the old process's sockets; wait up to 5 s, then fail.
wait_port_free() {
    local _
    for _ in $(seq 1 50); do
        port_free "$2" && return 0
        sleep 0.1
    done
    die "$1: port 127.0.0.1:$2 is already in use"
}

# refuse to start twice
check_not_running() {
    local name="$1" pidf="$BACKENDS_STATE_DIR/$1.pid"
    if [ -f "$pidf" ] && alive "$(cat "$pidf")"; then
        die "$name already running (pid $(cat "$pidf")); run its stop script first"
    fi
    rm -f "$pidf" "$BACKENDS_STATE_DIR/$name.exe"
}

# claim_instance BASE VAR PORT...: what every start script does before it
# spawns: sets NAME to the instance's name (instance_name BASE), refuses a NAME
# already running, waits for each PORT to be free, and sets VAR to the data
# directory (make_datadir_into).
claim_instance() {
    local var="$2" port
    NAME="$(instance_name "$1")"
    shift 2
    check_not_running "$NAME"
    for port in "$@"; do
        wait_port_free "$NAME" "$port"
    done
    make_datadir_into "$NAME" "$var"
}

# remove_datadir NAME DIR: delete DIR only if it is one of ours
remove_datadir() {
    case "$2" in
        "${TMPDIR:-/tmp}"/backend-"$1".*) rm -rf -- "$2" ;;
        *) log "$1: not deleting '$2' (not a backend-$1.* temp dir)" ;;
    esac
}

# make_datadir NAME -> prints the data directory to use. With KEEP_DATA=1 and a
# directory kept by an earlier "KEEP_DATA=1 stop", that one (DATADIR_REUSED=1
# is then set for the caller -- call it without $(...) via make_datadir_into);
# otherwise a new empty temporary directory.
DATADIR_REUSED=0
make_datadir_into() {  # make_datadir_into NAME VAR
    local rec="$BACKENDS_STATE_DIR/$1.datadir" d=""
    DATADIR_REUSED=0
    if [ -f "$rec" ]; then
        d="$(cat "$rec")"
        if [ "${KEEP_DATA:-0}" = 1 ] && [ -d "$d" ]; then
            DATADIR_REUSED=1
            log "$1: reusing kept data dir $d"
            printf -v "$2" '%s' "$d"
            return 0
        fi
        [ -d "$d" ] && { log "$1: deleting data dir $d left by an earlier run"; remove_datadir "$1" "$d"; }
        rm -f "$rec"
    fi
    d="$(mktemp -d "${TMPDIR:-/tmp}/backend-$1.XXXXXX")" || die "mktemp failed"
    printf '%s\n' "$d" > "$rec"
    printf -v "$2" '%s' "$d"
}

# spawn NAME MATCH CMD ARGS... : start CMD in the background, detached from
# stdin, stdout+stderr to $BACKENDS_STATE_DIR/NAME.log (appended to when the
# data dir was reused, so a restart keeps the earlier log), and record its PID
# and MATCH, a string its /proc/PID/cmdline must contain for a stop to kill it.
spawn() {
    local name="$1" match="$2"; shift 2
    local logf="$BACKENDS_STATE_DIR/$name.log"
    if [ "$DATADIR_REUSED" = 1 ]; then
        printf '\n===== restart %s =====\n' "$(date '+%F %T')" >>"$logf"
    else
        : >"$logf"
    fi
    nohup "$@" >>"$logf" 2>&1 </dev/null &
    local pid=$!
    printf '%s\n' "$pid" > "$BACKENDS_STATE_DIR/$name.pid"
    printf '%s\n' "$match" > "$BACKENDS_STATE_DIR/$name.exe"
    # shellcheck disable=SC2034  # read by the start scripts
    SPAWNED_PID=$pid
}

# wait_http NAME URL [EXPECTED_SUBSTRING]: poll URL until HTTP 2xx (and body
# contains the substring, if given) or until BACKENDS_READY_TIMEOUT seconds.
wait_http() {
    local name="$1" url="$2" want="${3:-}" pid body
    pid="$(cat "$BACKENDS_STATE_DIR/$name.pid")"
    local deadline=$(( $(date +%s) + BACKENDS_READY_TIMEOUT ))
    while :; do
        if ! alive "$pid"; then
            log "$name (pid $pid) exited during startup; last log lines:"
            tail -n 20 "$BACKENDS_STATE_DIR/$name.log" >&2
            return 1
        fi
        # shellcheck disable=SC2086  # BACKENDS_CURL_TLS: extra curl flags (--cacert, --cert, --key), word-split
        if body="$(curl -fsS --max-time 2 --noproxy '*' ${BACKENDS_CURL_TLS:-} "$url" 2>/dev/null)"; then
            if [ -z "$want" ] || printf '%s' "$body" | grep -q -- "$want"; then
                return 0
            fi
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "$name not ready at $url after ${BACKENDS_READY_TIMEOUT}s; last log lines:"
            tail -n 20 "$BACKENDS_STATE_DIR/$name.log" >&2
            return 1
        fi
        sleep 0.1
    done
}

# serve NAME READY_URL WANT MATCH CMD ARGS...: what every start script does to
# run its server: spawn it (MATCH as for spawn), wait until READY_URL answers
# (with WANT in the body unless WANT is empty: wait_http), and if it never does,
# stop it (stop_backend) and exit 1. Sets READY_MS to how long that took.
serve() {
    local name="$1" url="$2" want="$3" t0
    shift 3
    t0=$(now_ms)
    spawn "$name" "$@"
    wait_http "$name" "$url" "$want" || { stop_backend "$name"; exit 1; }
    # shellcheck disable=SC2034  # read by the start scripts
    READY_MS=$(( $(now_ms) - t0 ))
}

# stop_backend NAME: SIGTERM the recorded PID, wait up to 10 s, then SIGKILL;
# remove the data directory unless KEEP_DATA=1. Without a pid file (never
# started, or already stopped) it only tidies up and returns 0, so a test and
# test.sh's exit trap may both call it.
stop_backend() {
    local name="$1" pidf="$BACKENDS_STATE_DIR/$1.pid" pid cmd want
    if [ ! -f "$pidf" ]; then
        log "$name: not running (no $pidf)"
    else
        pid="$(cat "$pidf")"
        want="$(cat "$BACKENDS_STATE_DIR/$name.exe" 2>/dev/null || true)"
        if alive "$pid"; then
            # guard against a recycled PID: the process must still be our program
            cmd="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)"
            case "$cmd" in
                *"$want"*) ;;
                *) rm -f "$pidf" "$BACKENDS_STATE_DIR/$name.exe"
                   die "$name: pid $pid is now '$cmd', not '$want'; not killing it" ;;
            esac
            kill -TERM "$pid" 2>/dev/null || true
            local _
            for _ in $(seq 1 100); do
                alive "$pid" || break
                sleep 0.1
            done
            if alive "$pid"; then
                log "$name: pid $pid ignored SIGTERM for 10s; sending SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
                for _ in $(seq 1 20); do alive "$pid" || break; sleep 0.1; done
            fi
            log "$name: stopped pid $pid"
        else
            log "$name: pid $pid was not running"
        fi
        rm -f "$pidf" "$BACKENDS_STATE_DIR/$name.exe"
    fi
    local rec="$BACKENDS_STATE_DIR/$name.datadir"
    if [ -f "$rec" ]; then
        if [ "${KEEP_DATA:-0}" = 1 ]; then
            log "$name: keeping data dir $(cat "$rec") (KEEP_DATA=1 start reuses it)"
        else
            remove_datadir "$name" "$(cat "$rec")"
            rm -f "$rec"
        fi
    fi
}

#!/usr/bin/env bash
# Validates deploy/ (systemd unit, container recipe, Kubernetes manifests, Grafana provisioning)
# and the dashboards it provisions, then proves each check rejects a deliberately broken copy:
#
#   scripts/validate-deploy.sh            # ~20 s; .ci/run calls it after scripts/test.sh
#
# Needs: systemd-analyze and systemd-sysusers (Debian package `systemd`, installed here when
# missing, as root), Debian's python3 with venv, PyPI for the tools in
# scripts/deploy/requirements-validate.txt (a throw-away virtualenv, removed on exit), and a
# gpumon-agent binary with the mock backend: GPUMON_AGENT_BIN, else the one `cargo test
# --all-features` left in the target directory, else built here (`cargo build --bin gpumon-agent
# --features mock`). The checks themselves: scripts/deploy/validate.py.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
log() { printf '[%s] validate-deploy: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ------------------------------------------------------------------ Debian packages
installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
missing=()
for p in systemd python3 python3-venv; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { log "ERROR: missing Debian packages ${missing[*]}; run as root or install them"; exit 1; }
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # A unit a package would start during the install must not start (a CI container has no init).
    policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; made_policy=1; fi
    apt-get -q -o DPkg::Lock::Timeout=300 update
    apt-get -q -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${missing[@]}"
    [ "$made_policy" = 1 ] && rm -f "$policy"
fi
for b in systemd-analyze systemd-sysusers; do command -v "$b" >/dev/null || { log "ERROR: $b not found"; exit 1; }; done

# ------------------------------------------------------------------ the agent binary
target="${CARGO_TARGET_DIR:-$REPO/target}"
agent="${GPUMON_AGENT_BIN:-}"
if [ -z "$agent" ]; then
    for c in "$target/debug/gpumon-agent" "$target/debug/examples/agent"; do
        if [ -x "$c" ] && "$c" --help 2>/dev/null | grep -q -- '--mock-profile'; then agent="$c"; break; fi
    done
fi
if [ -z "$agent" ]; then
    log "no gpumon-agent with the mock backend in $target; building one"
    cargo build --quiet --bin gpumon-agent --features mock
    agent="$target/debug/gpumon-agent"
fi
log "agent: $agent"

# ------------------------------------------------------------------ the tools, in a throw-away venv
venv="$(mktemp -d "${TMPDIR:-/tmp}/gpumon-validate-deploy.XXXXXX")"
trap 'rm -rf "$venv"' EXIT
t0=$(date +%s)
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r scripts/deploy/requirements-validate.txt
log "tools installed in $(( $(date +%s) - t0 ))s"

"$venv/bin/python" -B scripts/deploy/validate.py \
    --agent "$agent" \
    --hadolint "$venv/bin/hadolint" \
    --kubernetes-validate "$venv/bin/kubernetes-validate" \
    --self-test

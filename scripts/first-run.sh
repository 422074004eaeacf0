#!/usr/bin/env bash
# Times README command 1 as a new user meets it: a fresh clone, an empty cargo cache (the crates
# are downloaded), the command with `--timings` added; every output line is stamped with the
# seconds since the start, and the agent is stopped 3 s after its first line.
# BENCHMARKS.md, "First run", gives the figures. Stop other work on the machine first.
#
# Usage: scripts/first-run.sh REPO LABEL [REF]   (clones REPO at REF into /tmp/first-run-LABEL)
set -u
src=$1 label=$2 ref=${3:-HEAD}
dir=/tmp/first-run-$label home=/tmp/first-run-cargo-$label
rm -rf "$dir" "$home" && mkdir -p "$home"
git clone -q "$src" "$dir" && cd "$dir" && git checkout -q "$ref" || exit 1
cmd=$(sed -n '/^```sh/{n;p;q}' README.md | sed 's/ *#.*//')
echo "command: $cmd" >&2
export CARGO_HOME=$home CARGO_TERM_COLOR=never
start=$(date +%s.%N)
(eval "${cmd/cargo run/cargo run --timings}" 2>&1) | while IFS= read -r line; do
    t=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '%8s %s\n' "$t" "$line"
    case "$line" in *'Running `'*) running=1; continue ;; esac
    if [ "${running:-0}" = 1 ] && [ "${seen:-0}" = 0 ]; then
        seen=1
        echo "first output at $t s" >&2
        (sleep 3; pkill -INT -f "target/(demo|release)/") &
    fi
done

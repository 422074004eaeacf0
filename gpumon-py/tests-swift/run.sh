#!/usr/bin/env bash
# The gpumon ms-swift plugin against a real ms-swift (issue 46):
#
#   gpumon-py/tests-swift/run.sh [WHEEL]      (WHEEL: default $GPUMON_TEST_WHEEL, else built)
#   gpumon-py/tests-swift/run.sh --prepare    (step 1's virtualenv only, no gpumon wheel needed)
#
# 1. a virtualenv of its own with requirements.txt (ms-swift's release wheel and its pins, torch
#    as the other Python tests pin it, tensorboard) and the gpumon wheel (--no-deps). With
#    GPUMON_PY_WHEELHOUSE (a directory filled by ../wheelhouse.sh; scripts/test.sh sets it) it
#    installs from there, offline; else from the index. The virtualenv is kept, keyed by
#    requirements.txt and the Python, in $GPUMON_SWIFT_VENVS (default
#    ~/.cache/gpumon/swift-venvs; one kept, older ones removed): ms-swift and its pins, 1.1 GB;
#    torch and its CUDA libraries (5.3 GB) are linked from ../torch-base.sh's install, shared
#    with the other Python tests. A kept virtualenv costs only the gpumon wheel's install. scripts/test.sh runs `--prepare` in the background while cargo
#    builds and tests, so a fresh machine's install overlaps them;
# 2. a tiny Qwen2 built from a config, a tokenizer trained here, a local dataset file
#    (make_tiny_model.py); nothing is downloaded from here on (HF_HUB_OFFLINE=1);
# 3. `swift sft` for $STEPS steps on CPU with
#       --external_plugins "$(python -m gpumon.integrations.swift --plugin-path)" --callbacks gpumon
#    on gpumon's mock backend (GPUMON_SWIFT_BACKEND=mock), and the test-only pace plugin
#    (pace_plugin.py: steps of 1.2 / 1.6 / 2.0 s, so every step is sampled and named by its
#    duration); at the same time, two $TRAINER_STEPS-step runs through ms-swift's Python API
#    that add the callback to the trainer ms-swift built, one with attach(trainer), one with
#    trainer.add_callback (trainer_run.py);
# 4. check_logs.py on each run: ms-swift's logging.jsonl and the TensorBoard events, every
#    step's figures on the step they describe.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY_DIR="$(dirname "$HERE")"
WORK="${GPUMON_SWIFT_WORK:-${TMPDIR:-/tmp}/gpumon-swift-test}"
VENVS="${GPUMON_SWIFT_VENVS:-$HOME/.cache/gpumon/swift-venvs}"
BASE="${GPUMON_PY_BASE:-}"
[ -n "$BASE" ] || { [ -x /usr/bin/python3 ] && BASE=/usr/bin/python3 || BASE=python3; }
STEPS=20
TRAINER_STEPS=6
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log() { printf '[%s] tests-swift/run.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t0=$(date +%s)
mkdir -p "$WORK" "$VENVS"

prepare=0
if [ "${1:-}" = --prepare ]; then
    prepare=1
    shift
fi

# torch with its CUDA libraries, shared with run-tests.sh's virtualenv (../torch-base.sh); its
# path is part of the key, so a new torch base means a new virtualenv.
torch_base="$("$PY_DIR/torch-base.sh")"
key="$( (cat "$HERE/requirements.txt"; "$BASE" -VV; echo "$torch_base") | sha256sum | cut -c1-16)"
venv="$VENVS/$key"
if [ ! -f "$venv/.complete" ]; then
    for old in "$VENVS"/*; do [ "$old" = "$venv" ] || rm -rf "$old"; done
    from="the index"
    pip_from=()
    if [ -n "${GPUMON_PY_WHEELHOUSE:-}" ]; then
        [ -f "$GPUMON_PY_WHEELHOUSE/.complete" ] || { log "ERROR: $GPUMON_PY_WHEELHOUSE is not a complete wheelhouse (gpumon-py/wheelhouse.sh)"; exit 1; }
        from="$GPUMON_PY_WHEELHOUSE"
        pip_from=(--no-index --find-links "$GPUMON_PY_WHEELHOUSE")
    fi
    log "new virtualenv $venv from $from: $(grep -v '^#' "$HERE/requirements.txt" | xargs)"
    t1=$(date +%s)
    "$BASE" -m venv --clear "$venv"
    "$PY_DIR/torch-base.sh" "$venv" >/dev/null
    nice "$venv/bin/pip" install -q "${pip_from[@]}" -r "$HERE/requirements.txt"
    touch "$venv/.complete"
    log "virtualenv installed in $(( $(date +%s) - t1 )) s"
else
    log "virtualenv $venv kept (requirements.txt unchanged)"
fi
[ "$prepare" = 0 ] || exit 0

wheel="${1:-${GPUMON_TEST_WHEEL:-}}"
if [ -z "$wheel" ]; then
    QUIET="${QUIET:-1}" GPUMON_PY_WORK="$WORK/build" "$PY_DIR/build-wheel.sh" "$WORK/wheels" >/dev/null
    wheel="$(ls "$WORK"/wheels/gpumon_nvml-*.whl)"
fi
[ -f "$wheel" ] || { log "ERROR: no gpumon wheel at $wheel"; exit 1; }
"$venv/bin/pip" install -q --no-deps --force-reinstall "$wheel"
log "ms-swift $("$venv/bin/python" -c 'import swift; print(swift.__version__)'), $(basename "$wheel")"

run="$WORK/run"
rm -rf "$run"; mkdir -p "$run"
"$venv/bin/python" "$HERE/make_tiny_model.py" "$run"
log "tiny model and dataset ready ($(( $(date +%s) - t0 )) s in all)"
plugin="$("$venv/bin/python" -m gpumon.integrations.swift --plugin-path)"

# The same training in three processes at once (2 cores: the runs mostly sleep in the pace
# plugin; measured once: 80 CPU-s for the three, against 30 for the plugin run alone):
#   plugin:       `swift sft ... --external_plugins <gpumon plugin> --callbacks gpumon`, $STEPS steps;
#   attach:       ms-swift's Python API (trainer_run.py), GpumonCallback().attach(trainer) on the
#                 trainer it built, $TRAINER_STEPS steps;
#   add_callback: the same with trainer.add_callback(GpumonCallback()).
sft_args=(--model "$run/model" --model_type qwen2 --template qwen --check_model false
    --dataset "$run/train.jsonl" --split_dataset_ratio 0 --max_length 64
    --tuner_type full --torch_dtype float32
    --per_device_train_batch_size 1 --gradient_accumulation_steps 1 --learning_rate 1e-3
    --logging_steps 1 --save_strategy no --eval_strategy no --report_to tensorboard
    --dataloader_num_workers 0 --dataset_num_proc 1)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
t2=$(date +%s)
# From $run: `import gpumon` can only find the installed wheel.
(cd "$run" && GPUMON_SWIFT_BACKEND=mock PATH="$venv/bin:$PATH" timeout 600 swift sft "${sft_args[@]}" \
    --max_steps "$STEPS" --output_dir "$run/out-plugin" \
    --external_plugins "$plugin" "$HERE/pace_plugin.py" --callbacks gpumon_test_pace gpumon \
    > "$run/plugin.log" 2>&1) &
pids=("$!")
for mode in attach add_callback; do
    (cd "$run" && timeout 600 "$venv/bin/python" "$HERE/trainer_run.py" "$mode" "${sft_args[@]}" \
        --max_steps "$TRAINER_STEPS" --output_dir "$run/out-$mode" \
        --external_plugins "$HERE/pace_plugin.py" --callbacks gpumon_test_pace \
        > "$run/$mode.log" 2>&1) &
    pids+=("$!")
done
names=(plugin attach add_callback)
failed=0
for i in 0 1 2; do
    if ! wait "${pids[$i]}"; then
        tail -n 60 "$run/${names[$i]}.log" >&2
        log "FAILED: swift sft, ${names[$i]} run (log: $run/${names[$i]}.log)"
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 1
log "swift sft: $STEPS steps with the plugin, $TRAINER_STEPS with attach and with add_callback, at once, in $(( $(date +%s) - t2 )) s"
grep -h '^trainer_run.py: ' "$run/attach.log" "$run/add_callback.log" >&2
"$venv/bin/python" "$HERE/check_logs.py" "$run/out-plugin" "$STEPS" \
    "$run/out-attach" "$TRAINER_STEPS" "$run/out-add_callback" "$TRAINER_STEPS"
log "passed ($(( $(date +%s) - t0 )) s in all)"

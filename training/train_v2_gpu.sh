#!/usr/bin/env bash
# Train the embedded model v2 on one GPU, from the repository root: three configurations at once as
# separate processes (each with its own batch-building workers on the CPU cores), each bounded by a
# training-clock limit and by `timeout`, then evaluate each on the GPU (held-out scenes with training
# and held-out phrasings, detailed descriptions, a shuffled-image control), write $OUT/summary.md and
# pack each trained model folder into $OUT/<name>.tar (the device tool returns at most 8 files).
#
#   OUT=/some/dir bash training/train_v2_gpu.sh          # bounded to ~6 min wall (230 s training clock)
#   SMOKE=1 OUT=/tmp/smoke bash training/train_v2_gpu.sh # CPU smoke run of the same path: a few steps
#
# Files in $OUT: summary.md, logs.tar (train/eval logs, JSON reports, env), v2a.tar, v2b.tar, v2c.tar.
# Wheels in .whl/ (e.g. the transformers of requirements.txt) are installed first into /tmp/site.
set -uo pipefail
OUT=${OUT:-runs/train-v2}
SMOKE=${SMOKE:-0}
mkdir -p "$OUT"
W=/tmp/train-v2-work
rm -rf "$W" && mkdir -p "$W"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0))s] $*"; }

if [ "$SMOKE" = 1 ]; then
    DEVICE=${DEVICE:-cpu} STEPS=${STEPS:-3} BATCH=${BATCH:-4} WARMUP=1 TRAIN_S=${TRAIN_S:-60}
    WORKERS=${WORKERS:-1} N_PER_TYPE=${N_PER_TYPE:-1} EVAL_S=${EVAL_S:-500} LOG_EVERY=1
else
    # Steps are an upper bound; the 230 s training clock is what ends a run (the decay follows it).
    DEVICE=${DEVICE:-cuda} STEPS=${STEPS:-8000} BATCH=${BATCH:-128} WARMUP=${WARMUP:-150}
    TRAIN_S=${TRAIN_S:-230} WORKERS=${WORKERS:-4} N_PER_TYPE=${N_PER_TYPE:-100} EVAL_S=${EVAL_S:-90}
    LOG_EVERY=${LOG_EVERY:-100}
fi
# name: options (two seeds of the main size, and a smaller, faster model).
declare -A CONFIGS=(
    [v2a]="--hidden 256 --mlp 640 --seed 1 --lr 2e-3"
    [v2b]="--hidden 256 --mlp 640 --seed 2 --lr 3e-3"
    [v2c]="--hidden 192 --mlp 640 --seed 1 --lr 2e-3"
    [v2d]="--hidden 256 --mlp 640 --seed 2 --lr 3e-3"  # v2b's options, run alone with more workers
)
read -ra NAMES <<<"${ONLY:-v2a v2b v2c}"  # ONLY="v2d" WORKERS=14 trains one configuration

# (skipped when a caller, e.g. scripts/gpu_check.sh, installed them already: never reinstall under a running test)
if [[ ":${PYTHONPATH:-}:" != *":/tmp/site:"* ]] && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site || exit 1
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"
    echo "device $DEVICE, steps <= $STEPS, batch $BATCH, training clock ${TRAIN_S}s, workers $WORKERS each, n/type $N_PER_TYPE"
} 2>&1 | tee "$W/env.txt"

pack() {
    tar -C "$W" -cf "$OUT/logs.tar" --exclude='v2?' . 2>/dev/null
    python3 -m training.summary "$W" "${NAMES[@]}" >"$OUT/summary.md" 2>>"$W/summary.err"
}

stamp "training ${NAMES[*]} in parallel"
for name in "${NAMES[@]}"; do
    args="--world v2 --out $W/$name --steps $STEPS --batch $BATCH --warmup $WARMUP --attn-weight 1.0 \
--attn-scope mentions --device $DEVICE --workers $WORKERS --time-limit-s $TRAIN_S --log-every $LOG_EVERY ${CONFIGS[$name]}"
    echo "$args" >"$W/$name.args"
    # shellcheck disable=SC2086
    timeout $((TRAIN_S + 60)) python3 -m training.train $args >"$W/$name.train.json" 2>"$W/$name.log" &
done
while [ -n "$(jobs -r)" ]; do
    sleep 20
    for name in "${NAMES[@]}"; do stamp "$name: $(grep -a ' step ' "$W/$name.log" | tail -1 | cut -c25-)"; done
done
wait
pack

stamp "evaluating on $DEVICE"
for name in "${NAMES[@]}"; do
    if [ -f "$W/$name/model.safetensors" ]; then
        timeout "$EVAL_S" python3 -m training.train --eval "$W/$name" --device "$DEVICE" \
            --n-per-type "$N_PER_TYPE" --failures 3 >"$W/$name.eval.json" 2>"$W/$name.eval.log" &
    fi
done
wait
for name in "${NAMES[@]}"; do
    [ -f "$W/$name/model.safetensors" ] && tar -C "$W" -cf "$OUT/$name.tar" "$name"
done
pack
stamp "done"
grep -E "^## |^\| |^goals|^trained|^greedy|did not|no evaluation" "$OUT/summary.md"
ls -la "$OUT"

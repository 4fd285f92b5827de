#!/usr/bin/env bash
# The GPU checks, as one run on a machine with CUDA (no network needed):
#   1. the benchmark of the embedded model v1 on its scenes on CUDA (fp32, so the lossless match is
#      exact; the model of the recorded docs/results/gpu-h200*), with the `auto` budget and at budget 80,
#      first, while the GPU is otherwise idle; then the embedded model v2 on scenes2 with the `auto` budget
#      (the real-GPU twin of the H200 replay in docs/results/v2-scenes2-h200-curve; SCENES2=0 skips it);
#      each results.md holds the image-sensitive breakdowns, by mention and by depth of the state;
#   2. the GPU twins of the lossless tests (tests/test_gpu.py, marker `gpu`);
#   3. the tree-pass cost curve of the paper's 7B language-model backbones (scripts/tree_cost.py;
#      TREE_COST=0 skips it, e.g. when docs/results/gpu-h200 already holds it);
#   0. when .suffix/ holds arctic-inference's source archive and its build wheels (nanobind, protobuf,
#      grpcio, grpcio-tools for the machine's Python), SuffixDecoding is built first and joins the bench;
#   4. with TRAIN=SCRIPT, a training script run beside step 2 (it gets its own folder $OUT/train).
# DEVICE=cpu BENCH_ARGS="--limit 2" TREE_COST=0 makes a quick dry run of the script on a CPU.
# Results go to $OUT (default runs/gpu): the checks' files packed in $OUT/checks.tar (the device tool
# brings back at most 8 files), the training script's own files under $OUT/train. Wheels in .whl/ (e.g. the transformers version of
# requirements.txt, and numba + llvmlite for the machine's Python when its image lacks them) are installed first into
# /tmp/site when present.
set -uo pipefail
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
C=/tmp/gpu-checks
rm -rf "$C" && mkdir -p "$C"
pack() { tar -C "$C" -cf "$OUT/checks.tar" . ; }
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site || exit 1
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$C/env.txt"
status=0
methods=ar,pld,tr,recap,recap-request-context
if compgen -G ".suffix/arctic_inference-*.tar.gz" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/suffix-build .suffix/*.whl \
        && PYTHONPATH=/tmp/suffix-build:${PYTHONPATH:-} PATH="$(dirname "$(command -v python3)"):$PATH" \
            timeout 150 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/suffix-site \
            .suffix/arctic_inference-*.tar.gz 2>&1 | tail -5
    if PYTHONPATH=/tmp/suffix-site:${PYTHONPATH:-} python3 -c "import arctic_inference.suffix_decoding"; then
        export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/suffix-site
        methods=$methods,suffix
    else
        echo "SuffixDecoding did not build: the bench runs without it" | tee "$C/suffix-build.txt"
    fi
fi
for budget in auto 80; do
    bench=/tmp/bench-scenes-cuda-$budget
    timeout 200 python3 -m recap.bench --model assets/models/tiny-scenes-llava --dataset scenes --methods "$methods" \
        --device "${DEVICE:-cuda}" --dtype float32 --budget "$budget" ${BENCH_ARGS:-} --max-new-tokens 64 --no-progress --out "$bench" 2>&1 \
        | tail -12 || status=1
    cp "$bench/results.md" "$C/bench-$budget.md" && cp "$bench/results.json" "$C/bench-$budget.json" || status=1
done
if [ "${SCENES2:-1}" != 0 ]; then
    bench=/tmp/bench-scenes2-cuda-auto
    timeout 200 python3 -m recap.bench --dataset scenes2 --methods "$methods" --device "${DEVICE:-cuda}" --dtype float32 \
        ${BENCH_ARGS:-} --max-new-tokens 64 --no-progress --out "$bench" 2>&1 | tail -12 || status=1
    cp "$bench/results.md" "$C/bench-v2-auto.md" && cp "$bench/results.json" "$C/bench-v2-auto.json" || status=1
fi
pack
train_pid=
if [ -n "${TRAIN:-}" ]; then
    mkdir -p "$OUT/train"
    OUT="$OUT/train" bash "$TRAIN" >"$C/train.log" 2>&1 &
    train_pid=$!
fi
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee "$C/pytest-gpu.txt" || status=1
if [ "${TREE_COST:-1}" != 0 ]; then
    for preset in qwen2.5-vl-7b-lm llava-1.6-7b-lm; do
        timeout 150 python3 -m scripts.tree_cost --preset "$preset" --context 1024 2048 --out "$C/tree-cost-$preset.json" 2>&1 \
            | grep -E "context|Error|error" || status=1
    done
fi
if [ -n "$train_pid" ]; then
    wait "$train_pid" || status=1
    tail -30 "$C/train.log"
fi
pack
exit $status

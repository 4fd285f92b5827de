#!/usr/bin/env bash
# The GPU checks, as one run on a machine with CUDA (no network needed):
#   1. the GPU twins of the lossless tests (tests/test_gpu.py, marker `gpu`);
#   2. the tree-pass cost curve of the paper's 7B language-model backbones (tools/tree_cost.py);
#   3. the benchmark of the embedded model on CUDA (fp32, so the lossless match is exact).
# Results go to $OUT (default runs/gpu). Wheels in .whl/ (e.g. the transformers version of
# requirements.txt) are installed first into /tmp/site when present.
set -uo pipefail
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site || exit 1
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/env.txt"
status=0
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest-gpu.txt" || status=1
for preset in qwen2.5-vl-7b-lm llava-1.6-7b-lm; do
    timeout 150 python3 -m tools.tree_cost --preset "$preset" --context 1024 2048 --out "$OUT/tree-cost-$preset.json" 2>&1 \
        | grep -E "context|Error|error" || status=1
done
bench=/tmp/bench-scenes-cuda
timeout 240 python3 -m recap.bench --dataset scenes --methods ar,pld,tr,recap --device cuda --dtype float32 \
    --max-new-tokens 64 --no-progress --out "$bench" 2>&1 | tail -20 || status=1
cp "$bench/results.json" "$bench/results.md" "$OUT/" 2>/dev/null || status=1
exit $status

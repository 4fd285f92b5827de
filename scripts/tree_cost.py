"""Cost of one tree-verification pass of T tokens, relative to one token, for a paper-sized language model.

    python -m scripts.tree_cost --preset qwen2.5-vl-7b-lm --device cuda --dtype bfloat16 --out cost.json

The paper's models cannot be downloaded on our machines, so this builds their *language-model backbone*
from its published dimensions with random weights (the cost of a pass does not depend on the weight
values) and times `TargetModel.forward_tree` over a cache of ``--context`` tokens (image tokens plus
prompt, in a real request). This is the curve the cost-aware budget (`recap.models.cost`) reads on such a
model.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from recap.models import TargetModel

# Published dimensions of the language-model backbones (config.json of each hub model).
PRESETS: dict[str, dict] = {
    "qwen2.5-vl-7b-lm": dict(  # Qwen/Qwen2.5-VL-7B-Instruct, text part
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        rope_theta=1_000_000.0,
        max_position_embeddings=32768,
    ),
    "llava-1.6-7b-lm": dict(  # llava-hf/llava-v1.6-vicuna-7b-hf, text part (Vicuna-7B = Llama-7B)
        model_type="llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32064,
        max_position_embeddings=4096,
    ),
    "tiny": dict(  # a smoke test of this script on a CPU
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=4096,
    ),
}


def build(preset: str, device: str, dtype: torch.dtype) -> TargetModel:
    """A randomly initialised causal LM with the preset's dimensions, wrapped as a `TargetModel`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(PRESETS[preset])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return TargetModel(model.eval(), processor=None, name=preset)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen2.5-vl-7b-lm")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, nargs="+", default=[1024])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    target = build(args.preset, args.device, dtype)
    n_params = sum(p.numel() for p in target.model.parameters())
    result = {
        "preset": args.preset,
        "parameters": n_params,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "build_seconds": round(time.perf_counter() - start, 1),
        "curves": {},
    }
    with torch.inference_mode():
        for context in args.context:
            points = target.measure_tree_cost(args.sizes, context=context, repeats=args.repeats)
            base = points[0][1]
            result["curves"][str(context)] = [
                {"T": t, "ms": round(s * 1e3, 3), "relative": round(s / base, 3)} for t, s in points
            ]
            logging.info(
                "%s context %d: %s",
                args.preset,
                context,
                ", ".join(f"T={t} {s / base:.2f}x" for t, s in points),
            )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    logging.info("%s", text)
    return result


if __name__ == "__main__":
    main()

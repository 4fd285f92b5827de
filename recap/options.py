"""Command-line options shared by ``python -m recap`` and ``python -m recap.bench``: one home for each.

- `add_model_options` / `check_model_options` / `load_runtime`: which model, on which device and dtype,
  and how it is loaded;
- `add_sampling_options` / `sampling_settings`: greedy (the default) or temperature / top-k / top-p
  sampling with a seed.

Only command-line entry points read arguments; the library takes the values these functions return.
"""

from __future__ import annotations

import argparse
import logging

from recap.sampling import SamplingSettings

log = logging.getLogger(__name__)


def add_model_options(parser: argparse.ArgumentParser, default_model: str) -> None:
    """``--model --gguf-file --device --device-map --dtype --attn --threads``."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default=default_model,
        help="hub id or local directory (default: the embedded tiny model v2; "
        "assets/models/tiny-scenes-llava is the embedded model v1)",
    )
    group.add_argument("--gguf-file", default=None, help="GGUF file name inside --model (text models)")
    group.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    group.add_argument(
        "--device-map",
        default=None,
        choices=["auto"],
        help="'auto': spread a model one device cannot hold over GPUs and CPU memory (accelerate)",
    )
    group.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)"
    )
    group.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    group.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def check_model_options(args: argparse.Namespace) -> None:
    """The model options' checks that need no model (ValueError with a reason): cheap, run them first."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")


def load_runtime(args: argparse.Namespace):
    """Set the thread count and load ``args.model`` as a `Runtime` (ValueError with a reason if it can't)."""
    import torch

    from recap.runtime import Runtime

    check_model_options(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return Runtime.load(
        args.model,
        device=args.device,
        device_map=args.device_map,
        dtype=args.dtype,
        attn_implementation=args.attn,
        gguf_file=args.gguf_file,
    )


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """``--temperature --top-k --top-p --seed`` (temperature 0, the default, is greedy decoding)."""
    group = parser.add_argument_group("sampling (lossless: the output distribution is the target's)")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    group.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (1 = off)")
    group.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: random)")


def sampling_settings(args: argparse.Namespace) -> SamplingSettings:
    """The validated `SamplingSettings` of the parsed arguments (ValueError names the bad option)."""
    try:
        return SamplingSettings(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
        )
    except ValueError as error:
        raise ValueError(f"--{str(error).split()[0].replace('_', '-')}: {error}") from None

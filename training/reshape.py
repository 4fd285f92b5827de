"""Reshape a saved embedded model's language model at (about) the same decode cost: split its attention
heads into more, narrower heads, or keep only its most important MLP units. Unlike `training.grow`,
this changes what the model computes; fine-tune the result (``python -m training.train --init OUT``).

    python -m training.reshape --model assets/models/tiny-scenes-llava-v2 --split-heads 2 --out runs/h8d32
    python -m training.reshape --model runs/h8 --mlp 384 --out runs/h8m384

- ``--split-heads F``: every head of ``d`` dimensions becomes ``F`` heads of ``d / F`` (same weights,
  so the same size and matrix cost; more, smaller attention patterns). The query and key dimensions
  are dealt so that each rotary pair (dimension ``i`` with ``i + d/2``) stays a pair; new head ``r`` of
  a split head takes the rotary frequencies ``r, r + F, r + 2F, ...`` of the old one, which for
  ``r = 0`` are exactly the frequencies a ``d / F``-dimensional head uses (the others move slightly).
  Each new head attends on its own, so the attention weights change: that is the point, and why the
  result is fine-tuned.
- ``--mlp N`` (smaller than today's): every layer keeps its ``N`` MLP units of largest
  ``|gate row| * |up row| * |down column|`` in their order; a unit whose down column is zero (a unit
  ``training.grow`` added and training never used) goes first, and removing it changes nothing.
The output folder is a copy of ``--model`` with the new config and weights.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from training.grow import LAYER, read_config, write_model
from training.soup import WEIGHTS

logger = logging.getLogger(__name__)


def split_order(heads: int, head_dim: int, factor: int) -> list[int]:
    """The old projection rows, in the order of the ``heads * factor`` new heads of ``head_dim // factor``
    dimensions: new head ``r`` of old head ``h`` takes rotary pairs ``r, r + factor, ...`` of ``h``, each
    pair's two dimensions ``half`` apart as before (transformers rotates ``i`` with ``i + half``)."""
    if factor < 2 or head_dim % (2 * factor):
        raise ValueError(f"a {head_dim}-dimensional head cannot be split {factor} ways (rotary pairs)")
    half = head_dim // 2
    order: list[int] = []
    for head in range(heads):
        for part in range(factor):
            first = [head * head_dim + pair for pair in range(part, half, factor)]
            order += first + [row + half for row in first]
    return order


def split_heads(
    weights: dict[str, torch.Tensor], heads: int, head_dim: int, factor: int
) -> dict[str, torch.Tensor]:
    """``weights`` with every attention head split ``factor`` ways (see `split_order`)."""
    order = torch.tensor(split_order(heads, head_dim, factor))
    out = dict(weights)
    for name, tensor in weights.items():
        match = LAYER.match(name)
        if match is None:
            continue
        rest = match["rest"]
        if rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            out[name] = tensor[order].contiguous()
        elif rest == "self_attn.o_proj.weight":
            out[name] = tensor[:, order].contiguous()
        elif rest.startswith("self_attn.") and "bias" in rest:
            raise ValueError(f"{name}: splitting heads with biases is not supported")
    return out


def prune_mlp(weights: dict[str, torch.Tensor], keep: int) -> dict[str, torch.Tensor]:
    """``weights`` with every layer's ``keep`` most important MLP units, in their order."""
    out = dict(weights)
    pruned = 0
    for name, down in weights.items():
        match = LAYER.match(name)
        if match is None or match["rest"] != "mlp.down_proj.weight":
            continue
        layer = f"{match['prefix']}{match['index']}.mlp."
        gate, up = layer + "gate_proj.weight", layer + "up_proj.weight"
        if not 1 <= keep <= down.shape[1]:
            raise ValueError(f"--mlp must be within [1, {down.shape[1]}], got {keep}")
        score = down.float().norm(dim=0) * weights[gate].float().norm(dim=1) * weights[up].float().norm(dim=1)
        kept = score.topk(keep).indices.sort().values
        out[name] = down[:, kept].contiguous()
        out[gate], out[up] = weights[gate][kept].contiguous(), weights[up][kept].contiguous()
        pruned += 1
    if not pruned:
        raise ValueError("no language-model MLP tensors found (is this an embedded LLaVA?)")
    return out


def reshape(model: Path, out: Path, split: int = 1, mlp: int | None = None) -> Path:
    """Write ``model`` with its heads split ``split`` ways and/or its MLP cut to ``mlp`` units to ``out``."""
    config = read_config(model)
    text = config.get("text_config", config)
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    if split == 1 and mlp is None:
        raise ValueError("nothing to reshape: give --split-heads or --mlp")
    if split < 1:
        raise ValueError(f"--split-heads must be at least 2 (1: no split), got {split}")
    if mlp is not None and mlp >= int(text["intermediate_size"]):
        size = text["intermediate_size"]
        raise ValueError(f"--mlp keeps fewer units than today's {size} (to add units: training.grow)")
    text.setdefault("head_dim", head_dim)  # explicit, so that a split can change it
    weights = load_file(str(model / WEIGHTS))
    if split > 1:
        if int(text.get("num_key_value_heads", heads)) != heads:
            raise ValueError("splitting a model with grouped key/value heads is not supported")
        weights = split_heads(weights, heads, head_dim, split)
        text.update(num_attention_heads=heads * split, num_key_value_heads=heads * split,
                    head_dim=head_dim // split)  # fmt: skip
    if mlp is not None:
        weights = prune_mlp(weights, mlp)
        text["intermediate_size"] = mlp
    write_model(model, out, config, weights)
    logger.info("wrote %s: %d heads of %d, MLP %d", out, text["num_attention_heads"], text["head_dim"],
                text["intermediate_size"])  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the saved model's folder")
    parser.add_argument("--split-heads", type=int, default=1, help="split every head this many ways")
    parser.add_argument("--mlp", type=int, help="MLP units to keep per layer (fewer than today's)")
    parser.add_argument("--out", type=Path, required=True, help="write the reshaped model here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        reshape(args.model, args.out, args.split_heads, args.mlp)
    except (OSError, ValueError, KeyError) as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

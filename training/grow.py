"""Grow a saved embedded model's language model (more layers, heads or MLP units) without changing
what it computes.

    python -m training.grow --model assets/models/tiny-scenes-llava-v2 --heads 8 --mlp 896 --out runs/grown
    python -m training.grow --model assets/models/tiny-scenes-llava-v2 --new-layers 1 --at 3 --out runs/deeper

Every new part starts with zero weights where its output reaches the residual stream, so the grown
model gives the original's logits (exactly for a new layer; to float rounding where a projection
grows wider, since its sums then run in another order: tested) and fine-tuning it (``python -m training.train
--init OUT``) starts from the original's answers with more capacity:
- a new decoder layer (``--new-layers``, inserted before layer ``--at``: 0 = first, the layer count =
  after the last) has a zero attention output projection and a zero MLP down projection; its other
  weights are copies of the layer it is inserted before (the last one when appended);
- new attention heads (``--heads``, appended after the existing ones in every layer) have zero
  columns in the output projection; their query, key and value rows copy existing heads (in turn)
  with a little noise, so that they can move apart; with ``--share-kv`` they are query heads only,
  each reading an existing head's keys and values (grouped-query attention, cheaper to decode);
- new MLP units (``--mlp``, the intermediate size) have zero columns in the down projection; their gate
  and up rows copy existing units (in turn) with a little noise.
The output folder is a copy of ``--model`` with the grown config and weights.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from training.soup import WEIGHTS

logger = logging.getLogger(__name__)

CONFIG = "config.json"
#: The per-layer tensors of the language model: ``<prefix>layers.<index>.<rest>``.
LAYER = re.compile(r"^(?P<prefix>(?:.*\.)?language_model\.(?:model\.)?layers\.)(?P<index>\d+)\.(?P<rest>.+)$")
#: Tensors of a layer whose output reaches the residual stream: zero in a new layer.
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def grow_weights(
    weights: dict[str, torch.Tensor], layers: int, at: int, new: int = 1
) -> dict[str, torch.Tensor]:
    """``weights`` with ``new`` zero-output layers inserted before layer ``at`` of ``layers``."""
    if not 0 <= at <= layers:
        raise ValueError(
            f"--at must be within [0, {layers}] (the language model has {layers} layers), got {at}"
        )
    if not 1 <= new <= 16:
        raise ValueError(f"new layers must be within [1, 16], got {new}")
    template = at if at < layers else layers - 1
    grown: dict[str, torch.Tensor] = {}
    copied: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        match = LAYER.match(name)
        if match is None:
            grown[name] = tensor
            continue
        index = int(match["index"])
        shifted = index + new if index >= at else index
        grown[f"{match['prefix']}{shifted}.{match['rest']}"] = tensor
        if index == template:
            copied[match["prefix"] + "{}." + match["rest"]] = tensor
    if not copied:
        raise ValueError("no language-model layer tensors found (is this an embedded LLaVA?)")
    for offset in range(new):
        for pattern, tensor in copied.items():
            rest = pattern.split("{}.", 1)[1]
            value = torch.zeros_like(tensor) if rest in ZEROED else tensor.clone()
            grown[pattern.format(at + offset)] = value
    return grown


def _copies(
    rows: torch.Tensor, groups: int, new: int, noise: float, generator: torch.Generator
) -> torch.Tensor:
    """``new`` groups of rows copied from the ``groups`` groups of ``rows`` in turn, plus relative noise."""
    size = rows.shape[0] // groups
    picked = torch.cat([rows[(g % groups) * size : (g % groups + 1) * size] for g in range(new)])
    scale = noise * picked.float().std().item()
    return picked + scale * torch.randn(picked.shape, generator=generator).to(picked.dtype)


def _grouped(
    tensor: torch.Tensor, heads: int, extra: int, rest: str, noise: float, generator: torch.Generator
) -> torch.Tensor:
    """A query or output projection with ``extra`` new query heads after each of its ``heads``: noisy
    copies of that head's query rows, zero output columns (transformers' grouped-query attention gives
    query head ``j`` key/value head ``j // (1 + extra)``, so the old heads keep theirs)."""
    out = rest == "self_attn.o_proj.weight"
    blocks = (tensor.T if out else tensor).chunk(heads)
    grown = []
    for block in blocks:
        grown.append(block)
        for _ in range(extra):
            grown.append(torch.zeros_like(block) if out else _copies(block, 1, 1, noise, generator))
    merged = torch.cat(grown)
    return merged.T.contiguous() if out else merged


def widen_weights(
    weights: dict[str, torch.Tensor],
    heads: int,
    new_heads: int,
    mlp: int,
    new_mlp: int,
    seed: int = 0,
    noise: float = 0.01,
    share_kv: bool = False,
) -> dict[str, torch.Tensor]:
    """``weights`` with ``new_heads`` attention heads (of ``heads``) and ``new_mlp`` MLP units (of
    ``mlp``) added to every language-model layer, each with zero output weights. ``share_kv``: the new
    heads are query heads only, sharing the existing key/value heads (grouped-query attention:
    ``heads + new_heads`` must be a multiple of ``heads``; head ``h``'s new queries sit right after it)."""
    if new_heads < 0 or new_mlp < 0:
        raise ValueError("a model can only grow: the new head count and MLP size must not be smaller")
    if share_kv and new_heads % heads:
        raise ValueError(f"query heads sharing {heads} key/value heads must be a multiple of {heads}")
    generator = torch.Generator().manual_seed(seed)
    grown = dict(weights)
    for name, tensor in weights.items():
        match = LAYER.match(name)
        if match is None:
            continue
        rest = match["rest"]
        if share_kv and new_heads and rest in ("self_attn.q_proj.weight", "self_attn.o_proj.weight"):
            grown[name] = _grouped(tensor, heads, new_heads // heads, rest, noise, generator)
        elif share_kv and rest in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            continue
        elif new_heads and rest in (
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
        ):
            grown[name] = torch.cat([tensor, _copies(tensor, heads, new_heads, noise, generator)])
        elif new_heads and rest == "self_attn.o_proj.weight":
            extra = tensor.new_zeros(tensor.shape[0], tensor.shape[1] // heads * new_heads)
            grown[name] = torch.cat([tensor, extra], dim=1)
        elif new_mlp and rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            grown[name] = torch.cat([tensor, _copies(tensor, mlp, new_mlp, noise, generator)])
        elif new_mlp and rest == "mlp.down_proj.weight":
            grown[name] = torch.cat([tensor, tensor.new_zeros(tensor.shape[0], new_mlp)], dim=1)
        elif (new_heads or new_mlp) and "bias" in rest:
            raise ValueError(f"{name}: widening a layer with biases is not supported")
    return grown


def read_config(model: Path) -> dict:
    """The config of the saved model folder ``model``, once its weights and config are known to be there."""
    for name in (WEIGHTS, CONFIG):
        if not (model / name).is_file():
            raise FileNotFoundError(f"no {name} in {model}")
    return json.loads((model / CONFIG).read_text())


def write_model(model: Path, out: Path, config: dict, weights: dict[str, torch.Tensor]) -> None:
    """Write ``out``: a copy of the folder ``model`` with ``config`` and ``weights`` instead of its own."""
    out.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        if item.is_file() and item.name not in (WEIGHTS, CONFIG):
            shutil.copy2(item, out / item.name)
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, str(out / WEIGHTS), metadata={"format": "pt"})


def grow(
    model: Path,
    out: Path,
    at: int = 0,
    new: int = 0,
    heads: int | None = None,
    mlp: int | None = None,
    seed: int = 0,
    share_kv: bool = False,
) -> Path:
    """Write ``model`` grown to ``out``: ``new`` layers before layer ``at``, ``heads`` attention heads and
    ``mlp`` MLP units per layer (None: as they are); ``share_kv``: the new heads are query heads over
    the existing key/value heads (see `widen_weights`)."""
    config = read_config(model)
    text = config.get("text_config", config)
    layers, old_heads = int(text["num_hidden_layers"]), int(text["num_attention_heads"])
    old_mlp = int(text["intermediate_size"])
    heads = old_heads if heads is None else heads
    mlp = old_mlp if mlp is None else mlp
    if int(text.get("num_key_value_heads", old_heads)) != old_heads:
        raise ValueError("widening a model with grouped key/value heads is not supported")
    if heads < 1 or int(text["hidden_size"]) % heads:
        raise ValueError(
            f"transformers needs the head count to divide the hidden size {text['hidden_size']}: {heads}"
        )
    if heads == old_heads and mlp == old_mlp and new == 0:
        raise ValueError("nothing to grow: give --new-layers, --heads or --mlp")
    if "head_dim" not in text:
        text["head_dim"] = int(text["hidden_size"]) // old_heads
    grown = widen_weights(
        load_file(str(model / WEIGHTS)),
        old_heads,
        heads - old_heads,
        old_mlp,
        mlp - old_mlp,
        seed,
        share_kv=share_kv,
    )
    if new:
        grown = grow_weights(grown, layers, at, new)
        if "layer_types" in text:
            kinds = list(text["layer_types"])
            text["layer_types"] = kinds[:at] + [kinds[min(at, layers - 1)]] * new + kinds[at:]
    text.update(num_hidden_layers=layers + new, num_attention_heads=heads,
                num_key_value_heads=old_heads if share_kv else heads, intermediate_size=mlp)  # fmt: skip
    write_model(model, out, config, grown)
    logger.info("wrote %s: %d layers (%d new), %d heads, MLP %d", out, layers + new, new, heads, mlp)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the saved model's folder")
    parser.add_argument("--new-layers", type=int, default=0, help="decoder layers to insert (default 0)")
    parser.add_argument("--at", type=int, default=0, help="insert the new layers before this layer")
    parser.add_argument("--heads", type=int, help="attention heads per layer (default: as it is)")
    parser.add_argument("--mlp", type=int, help="MLP intermediate size (default: as it is)")
    parser.add_argument("--share-kv", action="store_true", help="new heads share the key/value heads")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new rows' noise")
    parser.add_argument("--out", type=Path, required=True, help="write the grown model here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        grow(args.model, args.out, args.at, args.new_layers, args.heads, args.mlp, args.seed, args.share_kv)
    except (OSError, ValueError, KeyError) as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Average two fine-tunings of the same model, weight by weight (a "model soup").

    python -m training.soup --base assets/models/tiny-scenes-llava-v2 --other runs/ft --share 0.6 \
        --out runs/soup

The output folder is a copy of ``--other`` (config, tokenizer, processor) whose weights are
``(1 - share) * base + share * other`` for every floating-point tensor; integer tensors (buffers) are
``--other``'s. Both models must have the same tensors, shapes and dtypes: a soup only makes sense for
two fine-tunings from one starting point.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

logger = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"


def average(base: dict[str, torch.Tensor], other: dict[str, torch.Tensor], share: float) -> dict:
    """``(1 - share) * base + share * other`` per floating-point tensor (``other``'s dtype)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be within [0, 1], got {share}")
    if base.keys() != other.keys():
        missing = sorted(base.keys() ^ other.keys())[:5]
        raise ValueError(f"the two models hold different tensors (e.g. {missing})")
    mixed = {}
    for name, theirs in other.items():
        ours = base[name]
        if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
            mine, yours = f"{tuple(ours.shape)} {ours.dtype}", f"{tuple(theirs.shape)} {theirs.dtype}"
            raise ValueError(f"{name}: {mine} against {yours}")
        if theirs.is_floating_point():
            mixed[name] = ((1.0 - share) * ours.double() + share * theirs.double()).to(theirs.dtype)
        else:
            mixed[name] = theirs.clone()
    return mixed


def soup(base: Path, other: Path, share: float, out: Path) -> Path:
    """Write the averaged model to ``out`` (a copy of ``other`` with averaged weights)."""
    for folder in (base, other):
        if not (folder / WEIGHTS).is_file():
            raise FileNotFoundError(f"no {WEIGHTS} in {folder}")
    mixed = average(load_file(str(base / WEIGHTS)), load_file(str(other / WEIGHTS)), share)
    out.mkdir(parents=True, exist_ok=True)
    for item in other.iterdir():
        if item.is_file() and item.name != WEIGHTS:
            shutil.copy2(item, out / item.name)
    save_file(mixed, str(out / WEIGHTS), metadata={"format": "pt"})
    logger.info("wrote %s: %.2f of %s, %.2f of %s", out, 1 - share, base, share, other)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the first model's folder")
    parser.add_argument("--other", type=Path, required=True, help="the second model's folder (copied)")
    parser.add_argument("--share", type=float, required=True, help="the second model's share, 0 to 1")
    parser.add_argument("--out", type=Path, required=True, help="write the averaged model here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        soup(args.base, args.other, args.share, args.out)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far RECAP's trees follow the last bits of the target's logits.

Runs the Compare summary's check (`scripts.compare_summary`: AR, TR and RECAP on the first samples of
an embedded model's held-out scenes, 80 nodes) twice: as it is, then with every tree pass's logits
multiplied by ``1 + noise * N(0, 1)`` (seeded), and prints each method's passes per sample. A relative
noise of a few float32 ulps is what another CPU's kernels can give.

    python -m scripts.near_ties --model v1 --noise 1e-6
"""

from __future__ import annotations

import argparse
import sys

import torch

from recap.bench.datasets import load_dataset
from recap.models import adapter
from scripts import compare_summary

METHODS = ["ar", "tr", "recap"]


def perturbed(forward_tree, noise: float, seed: int = 0):
    """``TargetModel.forward_tree`` whose logits are multiplied by ``1 + noise * N(0, 1)``."""
    generator = torch.Generator().manual_seed(seed)

    def forward(self, state, pending, tree):
        logits = forward_tree(self, state, pending, tree)
        return logits + logits.abs() * noise * torch.randn(logits.shape, generator=generator)

    return forward


def passes(version: str, samples: int) -> dict[str, list[int]]:
    folder, dataset = compare_summary.MODELS[version]
    runtime = compare_summary.Runtime.load(str(folder), device="cpu", dtype=torch.float32)
    chosen = load_dataset(dataset, compare_summary.DEFAULT_LIMIT)[:samples]
    return compare_summary.per_sample_passes(
        compare_summary.run_on(runtime, chosen, METHODS), METHODS, samples
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(compare_summary.MODELS), default="v1")
    parser.add_argument("--noise", type=float, default=1e-6, help="relative noise on the logits")
    parser.add_argument("--samples", type=int, default=compare_summary.CHECKED)
    args = parser.parse_args(argv)
    if not 0 < args.noise < 1 or args.samples < 1:
        parser.error("--noise must be within (0, 1) and --samples 1 or more")
    torch.set_num_threads(1)
    print(f"as it is: {passes(args.model, args.samples)}")
    original = adapter.TargetModel.forward_tree
    adapter.TargetModel.forward_tree = perturbed(original, args.noise)
    try:
        print(f"logits x (1 + {args.noise:g} N(0, 1)): {passes(args.model, args.samples)}")
    finally:
        adapter.TargetModel.forward_tree = original
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far RECAP's trees follow the last bits of the target's logits.

Runs the Compare summary's check (`scripts.compare_summary`: AR, TR and RECAP on the first samples of
an embedded model's held-out scenes, 80 nodes) twice: as it is, then with every tree pass's logits
multiplied by ``1 + noise * N(0, 1)`` (seeded), and prints each method's passes per sample. A relative
noise of a few float32 ulps is what another CPU's kernels can give. With ``--samples`` beyond the
summary's three it prints each method's MAT and acceptance at image-sensitive tokens instead.

    python -m scripts.near_ties --model v1 --noise 1e-6
    python -m scripts.near_ties --model v2 --noise 1e-5 --seed 2 --samples 100 --limit 100
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


def run(version: str, samples: int, limit: int = compare_summary.DEFAULT_LIMIT) -> dict:
    """The Compare summary's benchmark (AR, TR, RECAP) on the first ``samples`` of ``limit`` held-out
    scenes of ``version``'s world."""
    folder, dataset = compare_summary.MODELS[version]
    runtime = compare_summary.Runtime.load(str(folder), device="cpu", dtype=torch.float32)
    return compare_summary.run_on(runtime, load_dataset(dataset, limit)[:samples], METHODS)


def described(data: dict, samples: int) -> str:
    """Per-sample passes for a few samples, else each method's MAT and image-sensitive acceptance."""
    if samples <= compare_summary.CHECKED:
        return str(compare_summary.per_sample_passes(data, METHODS, samples))
    methods = data["methods"]
    return ", ".join(
        f"{m} MAT {methods[m]['mat']:.3f}, {100 * methods[m]['accept_sensitive']:.1f}% at image-sensitive"
        for m in METHODS
        if m != "ar"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(compare_summary.MODELS), default="v1")
    parser.add_argument("--noise", type=float, default=1e-6, help="relative noise on the logits")
    parser.add_argument("--seed", type=int, default=0, help="the noise's seed")
    parser.add_argument("--samples", type=int, default=compare_summary.CHECKED, help="the first N scenes")
    parser.add_argument("--limit", type=int, default=compare_summary.DEFAULT_LIMIT, help="of this many")
    args = parser.parse_args(argv)
    if not 0 < args.noise < 1 or not 1 <= args.samples <= args.limit:
        parser.error("--noise must be within (0, 1) and --samples within 1 to --limit")
    torch.set_num_threads(1)
    print(f"as it is: {described(run(args.model, args.samples, args.limit), args.samples)}")
    original = adapter.TargetModel.forward_tree
    adapter.TargetModel.forward_tree = perturbed(original, args.noise, args.seed)
    try:
        noisy = described(run(args.model, args.samples, args.limit), args.samples)
        print(f"logits x (1 + {args.noise:g} N(0, 1)), seed {args.seed}: {noisy}")
    finally:
        adapter.TargetModel.forward_tree = original
    return 0


if __name__ == "__main__":
    sys.exit(main())

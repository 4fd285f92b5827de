"""Greedy decoding speed of the project's engine against transformers' ``generate()``, and the tree-pass
cost curve of a model. One CPU thread, fp32.

    python -m scripts.engine_overhead [--model DIR] [--scenes 1] [--tokens 160] [--repeats 5] [--no-curve]

For an embedded model the prompts are held-out scenes of its world, ``--scenes`` per question type
(v2: describe, colour, count, position, relation and the detailed description); for any other model, a
white image (if it takes images) and ``--prompt``. For every prompt it checks that the autoregressive
path of `recap.decode.generate` gives the same tokens as ``model.generate(do_sample=False)``, then
times both, prompt preparation and prefill included, best of ``--repeats``: tokens per second in wall
time and in this thread's CPU time (which other processes' load does not inflate). Then one tree pass
of T tokens (T = 1, 4, 16, 64) over a 256-token cache, relative to T = 1. The load average is printed
before and after: the numbers are only comparable on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

import torch

from recap.decode import generate
from recap.drafters.autoregressive import AutoregressiveDrafter
from recap.embedded import embedded_world
from recap.runtime import EMBEDDED_MODEL, Runtime


def prompts_of(model: str, target, scenes: int, prompt: str) -> list[tuple[str, list, str]]:
    """``(label, images, prompt)`` to time: held-out scenes for an embedded model, else ``prompt``."""
    world = embedded_world(model)
    if world is not None:
        items = world.heldout_set(seed=0, n_per_type=scenes)
        return [(item["qtype"], [item["image"]], item["prompt"]) for item in items]
    images = []
    if target.family != "text":
        from PIL import Image

        images = [Image.new("RGB", (64, 64), "white")]
    return [("prompt", images, prompt)]


def best_rates(fn: Callable[[], list[int]], repeats: int) -> tuple[int, float, float]:
    """Tokens, and the best tokens/s over ``repeats`` runs in wall time and in thread CPU time."""
    wall = cpu = 0.0
    count = 0
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        count = len(fn())
        wall = max(wall, count / (time.perf_counter() - start))
        cpu = max(cpu, count / max(time.thread_time() - start_cpu, 1e-9))
    return count, wall, cpu


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(EMBEDDED_MODEL))
    parser.add_argument("--prompt", default="Describe the image.", help="the prompt of a non-embedded model")
    parser.add_argument("--scenes", type=int, default=1, help="held-out scenes per question type (embedded)")
    parser.add_argument("--tokens", type=int, default=160, help="most new tokens per answer")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-hf", action="store_true", help="time only the engine")
    parser.add_argument("--no-curve", action="store_true", help="skip the tree-pass cost curve")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("load average before:", load_average())
    runtime = Runtime.load(args.model, device="cpu", dtype="float32")
    target = runtime.target
    eos = sorted(target.eos_ids)

    def hf(images, prompt) -> list[int]:
        # Both paths start from (images, prompt): chat template + processor are timed in each.
        inputs = target.prepare(images, prompt)
        with torch.inference_mode():
            out = target.model.generate(
                **inputs, max_new_tokens=args.tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos[0]
            )
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def ours(images, prompt) -> list[int]:
        return generate(target, AutoregressiveDrafter(), prompt, images, args.tokens, details=False).tokens

    header = ("prompt", "tokens", "engine (ar) tok/s wall / cpu", "generate() tok/s wall / cpu")
    print(f"{header[0]:10s} {header[1]:>6s}  {header[2]:>28s}  {header[3]:>27s}")
    totals = {"ours": [0, 0.0, 0.0], "hf": [0, 0.0, 0.0]}
    for label, images, prompt in prompts_of(args.model, target, args.scenes, args.prompt):
        ours(images, prompt)  # warm-up
        if not args.no_hf and hf(images, prompt) != ours(images, prompt):
            raise SystemExit(f"{label}: the engine's AR tokens differ from model.generate()")
        rows = {"ours": best_rates(partial(ours, images, prompt), args.repeats)}
        if not args.no_hf:
            rows["hf"] = best_rates(partial(hf, images, prompt), args.repeats)
        cells = []
        for name, (count, wall, cpu) in rows.items():
            total = totals[name]
            total[0] += count
            total[1] += count / wall if wall > 0 else 0.0  # (an empty answer: no rate)
            total[2] += count / cpu if cpu > 0 else 0.0
            cells.append(f"{wall:13.1f} / {cpu:6.1f}")
        print(f"{label:10s} {rows['ours'][0]:6d}  {cells[0]:>28s}  {cells[1] if len(cells) > 1 else '':>27s}")
    overall = [f"{t[0] / t[1]:13.1f} / {t[0] / t[2]:6.1f}" if t[0] else "" for t in totals.values()]
    print(f"{'all':10s} {totals['ours'][0]:6d}  {overall[0]:>28s}  {overall[1]:>27s}")
    print("load average after:", load_average())
    if args.no_curve:
        return
    points = target.measure_tree_cost(sizes=(1, 4, 16, 64), context=256, repeats=args.repeats)
    base = points[0][1]
    print(
        "tree pass cost, T tokens over a 256-token cache (relative to T=1):",
        ", ".join(f"T={t}: {s / base:.2f}x ({s * 1000:.2f} ms)" for t, s in points),
    )


if __name__ == "__main__":
    main()

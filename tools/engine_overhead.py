"""Measure the decode loop's own overhead and the tree-forward cost curve of a model.

    python -m tools.engine_overhead [--model DIR] [--tokens 64] [--repeats 5]

Compares the autoregressive path of `recap.decode.generate_steps` with transformers' own greedy
``model.generate()`` on the same prompt (same tokens, checked), then times one tree pass of T tokens
(T = 1, 4, 16, 64) relative to T = 1. One CPU thread, fp32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from recap.decode import generate
from recap.drafters.autoregressive import AutoregressiveDrafter
from recap.runtime import EMBEDDED_MODEL, Runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(EMBEDDED_MODEL))
    parser.add_argument("--prompt", default="Describe the image.")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runtime = Runtime.load(args.model, device="cpu", dtype="float32")
    target = runtime.target
    images = []
    if target.family != "text":
        from PIL import Image

        images = [Image.new("RGB", (64, 64), "white")]
    eos = sorted(target.eos_ids)

    def hf() -> list[int]:
        # Both paths start from (images, prompt): chat template + processor are timed in each.
        inputs = target.prepare(images, args.prompt)
        with torch.inference_mode():
            out = target.model.generate(
                **inputs, max_new_tokens=args.tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos[0]
            )
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def ours() -> list[int]:
        return generate(target, AutoregressiveDrafter(), args.prompt, images, args.tokens).tokens

    assert hf() == ours(), "AR through generate_steps must equal model.generate()"
    for name, fn in (("model.generate", hf), ("generate_steps (ar)", ours)):
        times, count = [], 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            count = len(fn())
            times.append(time.perf_counter() - start)
        best = statistics.median(times)
        print(f"{name:22s} {count} tokens  median {best * 1000:.1f} ms  {count / best:.1f} tokens/s")
    points = target.measure_tree_cost(sizes=(1, 4, 16, 64), context=256, repeats=args.repeats)
    base = points[0][1]
    print(
        "tree pass cost, T tokens over a 256-token cache (relative to T=1):",
        ", ".join(f"T={t}: {s / base:.2f}x ({s * 1000:.2f} ms)" for t, s in points),
    )


if __name__ == "__main__":
    main()

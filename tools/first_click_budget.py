"""How the measured tree-cost curve sizes the studio's first click: RECAP (``auto`` budget, the shipped
memory) on an embedded model's first example, with a curve measured the old way (the median of 3
wall-clock passes per size, one size after the other) and the way `Runtime.cost_model` measures it
now (each size's fastest pass of a few sweeps, in this thread's CPU time), in turn, ``--rounds`` times
each.

    python -m tools.first_click_budget --model v2 --rounds 8

Prints each round's curve, nodes per pass and tokens per pass (the page's "mean accepted / pass"), then
the median and range of each. Run it once on a quiet machine and once beside a load (e.g.
``python -m pytest tests/test_lossless.py``) to see how far load moves the budget.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from recap.config import RecapConfig
from recap.cost import CostModel
from recap.decode import generate
from recap.hotstart import shipped_start
from recap.inputs import load_image
from recap.runtime import EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2, Runtime
from recap.trace import summarize

#: ``--model`` -> (studio id, folder) of the embedded models; v2 is the studio's default.
MODELS = {"v1": ("embedded-v1", EMBEDDED_MODEL_V1), "v2": ("embedded-v2", EMBEDDED_MODEL_V2)}


def old_curve(runtime: Runtime) -> CostModel:
    """The curve as `Runtime.cost_model` measured it before: median of 3 wall-clock passes per size."""
    return CostModel(runtime.target.measure_tree_cost(repeats=3))


def new_curve(runtime: Runtime) -> CostModel:
    """The curve `Runtime.cost_model` measures now (measured afresh)."""
    runtime._cost = None
    return runtime.cost_model()


def first_click(runtime: Runtime, curve: CostModel, example: tuple[str, str], max_new_tokens: int = 64):
    """``(nodes per pass, tokens per pass)`` of RECAP's first request from the shipped memory."""
    runtime.use_cost_model(curve)
    start = shipped_start(runtime.target)
    drafter = runtime.drafter(
        "recap", config=RecapConfig(budget="auto"), persistent=start.fresh(runtime.target.vocab_size)
    )
    image, prompt = example
    result = generate(runtime.target, drafter, prompt, [load_image(image)], max_new_tokens)
    passes = [s for s in result.steps if s.step > 0]
    return sum(len(s.nodes) for s in passes) / len(passes), summarize(result.steps).mat


def main(argv: list[str] | None = None) -> int:
    from recap.studio.examples import examples

    parser = argparse.ArgumentParser(
        prog="python -m tools.first_click_budget", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="v2")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    model_id, folder = MODELS[args.model]
    runtime = Runtime.load(str(folder))
    example = tuple(examples(model_id)[0])
    rows: dict[str, list[tuple[float, float, float]]] = {"old": [], "new": []}
    for round_ in range(args.rounds):
        for name, measure in (("old", old_curve), ("new", new_curve)):
            began = time.perf_counter()
            curve = measure(runtime)
            seconds = time.perf_counter() - began
            nodes, mat = first_click(runtime, curve, example)
            rows[name].append((nodes, mat, seconds))
            ms = [round(s * 1e3, 2) for _, s in curve.points]
            print(
                f"{name} {round_}: curve ms {ms}; {seconds:.2f} s; "
                f"nodes/pass {nodes:.1f}; tokens/pass {mat:.2f}"
            )
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, values in rows.items():
        nodes, mats, secs = ([v[i] for v in values] for i in range(3))
        print(
            f"{name}: nodes/pass median {statistics.median(nodes):.1f} ({min(nodes):.1f}-{max(nodes):.1f}); "
            f"tokens/pass median {statistics.median(mats):.2f} ({min(mats):.2f}-{max(mats):.2f}); "
            f"measured in {statistics.median(secs):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How well a drafter's path scores predict acceptance, and acceptance by depth (a diagnostic).

    python -m scripts.calibration --dataset mtbench --limit 12 --max-new-tokens 128 --budget 80 \
        --temperature 0.7 --model "$SMOLLM2_DIR" --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf

Runs one method over a dataset as one stream of requests (fresh memories, sample ``i`` seeded
``seed + i`` as in the benchmark), bins every drafted node by its score (RECAP: its path estimate,
the chance the drafter gives it of being accepted) and prints, per bin, the mean score beside the share
of those nodes that were accepted (a calibrated drafter has the two equal), and the same by the depth
of the state each node was drafted at. ``--greedy-labels`` hides
the sampling labels from the drafter (`Observation.commit_probs`), so that RECAP's acceptance estimates
learn "is the argmax" while sampling, as they did before they learnt sampling acceptance.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

#: Upper edges of the score bins.
EDGES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def calibration(steps_of_runs, edges: Sequence[float] = EDGES) -> tuple[list[dict], dict[int, float]]:
    """Per score bin ``{"upper", "nodes", "mean_score", "accepted"}`` (empty bins left out), and accepted
    nodes per decoding pass by depth, from the `StepRecord` lists of several runs."""
    uppers = np.asarray(edges, dtype=float)
    count, score, accepted = (np.zeros(len(uppers)) for _ in range(3))
    by_depth: Counter = Counter()
    passes = 0
    for steps in steps_of_runs:
        for step in steps[1:]:  # the prefill pass drafts nothing
            passes += 1
            for node in step.nodes:
                at = min(int(np.searchsorted(uppers, node.score, side="right")), len(uppers) - 1)
                count[at] += 1
                score[at] += node.score
                accepted[at] += node.accepted
                by_depth[node.depth] += node.accepted
    bins = [
        {
            "upper": float(uppers[i]),
            "nodes": int(count[i]),
            "mean_score": score[i] / count[i],
            "accepted": accepted[i] / count[i],
        }
        for i in range(len(uppers))
        if count[i]
    ]
    return bins, {depth: by_depth[depth] / max(passes, 1) for depth in sorted(by_depth)}


def depth_calibration(steps_of_runs) -> list[dict]:
    """Per depth of the state a node was drafted at (drafts its pass had accepted before it, in
    `recap.bench.coverage.DEPTH_BUCKETS`, as the benchmark's depth tables) ``{"depths", "nodes",
    "mean_score", "accepted"}`` (empty buckets left out): are the path scores of deep nodes as
    calibrated as those of shallow ones (a search that multiplies estimates along a path would under- or
    over-invest in depth otherwise)?"""
    from recap.bench.coverage import DEPTH_LABELS, depth_bucket

    count, score, accepted = Counter(), Counter(), Counter()
    for steps in steps_of_runs:
        for step in steps[1:]:
            for node in step.nodes:
                bucket = depth_bucket(node.depth - 1)  # (a node at depth 1 is drafted at the root)
                count[bucket] += 1
                score[bucket] += node.score
                accepted[bucket] += node.accepted
    return [
        {
            "depths": label,
            "nodes": count[label],
            "mean_score": score[label] / count[label],
            "accepted": accepted[label] / count[label],
        }
        for label in DEPTH_LABELS
        if count[label]
    ]


def _hide_sampling_labels(drafter) -> None:
    """Make ``drafter`` observe every pass as if greedy labels were all there is."""
    observe = drafter.observe
    drafter.observe = lambda observation: observe(dataclasses.replace(observation, commit_probs=None))


def main(argv: Sequence[str] | None = None) -> int:
    from tqdm import tqdm

    from recap.bench.cli import local_image_size
    from recap.bench.datasets import check_scene_world, default_dataset, load_dataset
    from recap.decode import generate
    from recap.memory.persistent import PersistentMemory
    from recap.options import add_model_options, add_sampling_options, load_runtime, sampling_settings
    from recap.runtime import EMBEDDED_MODEL, parse_budget
    from recap.state import DrafterState

    parser = argparse.ArgumentParser(prog="python -m scripts.calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default=None, help="default: the model's own scenes (as the benchmark)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--method", default="recap")
    parser.add_argument("--budget", default="80")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--greedy-labels", action="store_true", help="RECAP learns argmax labels while sampling"
    )
    add_model_options(parser, str(EMBEDDED_MODEL))
    add_sampling_options(parser)
    args = parser.parse_args(argv)
    args.threads = 1 if args.threads is None else args.threads
    sampling = sampling_settings(args)
    image_size = local_image_size(args.model)
    args.dataset = args.dataset or default_dataset(image_size)
    check_scene_world(args.dataset, image_size)
    runtime = load_runtime(args)
    samples = load_dataset(args.dataset, limit=args.limit)
    persistent = PersistentMemory(runtime.target.vocab_size)
    given = DrafterState.given(runtime.target.vocab_size, persistent=persistent)
    drafter = runtime.drafter(args.method, budget=parse_budget(args.budget), state=given)
    if args.greedy_labels:
        _hide_sampling_labels(drafter)
    runs, tokens, passes = [], 0, 0
    for index, sample in enumerate(tqdm(samples, desc=args.method, unit="req")):
        seeded = (
            sampling if sampling.greedy else dataclasses.replace(sampling, seed=(sampling.seed or 0) + index)
        )
        result = generate(
            runtime.target,
            drafter,
            sample.prompt,
            sample.images,
            args.max_new_tokens,
            sampling=seeded,
            details=False,
        )
        runs.append(result.steps)
        tokens, passes = tokens + len(result.tokens), passes + len(result.steps)
    bins, by_depth = calibration(runs)
    print(f"{args.method} on {args.dataset}: MAT {tokens / passes:.3f} ({tokens} tokens, {passes} passes)")
    print("accepted nodes per pass by depth: " + ", ".join(f"{d}: {v:.3f}" for d, v in by_depth.items()))
    print("| score below | nodes | mean score | accepted |\n|---|---|---|---|")
    for row in bins:
        print(f"| {row['upper']:.2f} | {row['nodes']} | {row['mean_score']:.3f} | {row['accepted']:.3f} |")
    print("\n| depth of the state | nodes | mean score | accepted |\n|---|---|---|---|")
    for row in depth_calibration(runs):
        print(f"| {row['depths']} | {row['nodes']} | {row['mean_score']:.3f} | {row['accepted']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

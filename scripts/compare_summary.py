"""Build the benchmark summaries the studio's Compare tab shows under its table.

For each embedded model: the benchmark (`recap.bench.run_benchmark`) on its held-out scenes (v1:
``scenes``, v2: ``scenes2``) at the Compare tab's default, equal budgets (every tree method
`recap.studio.ui.measure.EQUAL_NODES` nodes a pass), and one summary per model in
``assets/summaries/<model folder>.json``: per method MAT and the share of drafts accepted at
image-sensitive and insensitive tokens (and there, by the depth of the state), how many scenes each
tree method accepted more, as many or fewer drafts there than Token Recycling, the command that
reproduces it, and each method's passes on the first `CHECKED` samples, which
``tests/test_compare_summary.py`` recomputes with the current code (a drafter change that alters the
trees makes the shipped summary fail the test until it is rebuilt).

    python -m scripts.compare_summary                  # both embedded models, 40 scenes each
    python -m scripts.compare_summary --model v2 --limit 100
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from importlib import metadata

import torch

from recap.bench.coverage import sensitive_depths
from recap.bench.datasets import load_dataset
from recap.bench.metrics import sample_wins
from recap.bench.runner import StreamSettings, run_benchmark
from recap.drafters.recap.config import RecapConfig
from recap.drafters.suffix_decoding import SuffixConfig, suffix_decoding_available
from recap.runtime import EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2, Runtime
from recap.studio.ui.measure import EQUAL_NODES, summary_path

MODELS = {"v1": (EMBEDDED_MODEL_V1, "scenes"), "v2": (EMBEDDED_MODEL_V2, "scenes2")}
METHODS = ("ar", "pld", "tr", "suffix", "recap")
#: Samples whose passes the summary records for the staleness check.
CHECKED = 3
#: Held-out scenes per summary.
DEFAULT_LIMIT = 40
#: Packages whose versions the summary records: RECAP's trees rank candidates by float32
#: probabilities, so a new release of one of these (or another CPU) can move a near tie.
RECORDED_PACKAGES = ("torch", "transformers", "numpy", "numba", "llvmlite", "pillow", "tokenizers")
MAX_NEW_TOKENS = 64


def methods_here() -> list[str]:
    return [m for m in METHODS if m != "suffix" or suffix_decoding_available()]


def run(runtime: Runtime, dataset: str, limit: int, methods: list[str]) -> dict:
    """The benchmark behind a summary: ``limit`` held-out samples of ``dataset`` (or fewer)."""
    samples = load_dataset(dataset, limit)
    return run_on(runtime, samples, methods)


def run_on(runtime: Runtime, samples, methods: list[str]) -> dict:
    result = run_benchmark(
        runtime,
        samples,
        methods,
        max_new_tokens=MAX_NEW_TOKENS,
        warmup=1,
        setup=StreamSettings(
            EQUAL_NODES, RecapConfig(budget=EQUAL_NODES), SuffixConfig(max_spec_tokens=EQUAL_NODES)
        ),
        progress=False,
    )
    return result.to_dict()


def per_sample_passes(data: dict, methods: list[str], count: int = CHECKED) -> dict[str, list[int]]:
    """Each method's target passes on the first ``count`` samples of a benchmark run's result (the
    streams go sample by sample, so a run on those samples alone gives the same)."""
    return {m: [note["passes"][m] for note in data["samples"][:count]] for m in methods}


def environment() -> dict[str, str]:
    """The versions of `RECORDED_PACKAGES` installed here (``"absent"`` for one that is not)."""
    found = {}
    for name in RECORDED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def method_summary(result: dict) -> dict:
    """What the summary keeps of one method's benchmark result: MAT, acceptance at image-sensitive and
    insensitive tokens, and (for the methods with a coverage breakdown) positions and acceptances at
    image-sensitive tokens by the depth of the state, ``{bucket: [positions, accepted]}``."""
    kept = {key: result[key] for key in ("mat", "accept_sensitive", "accept_insensitive")}
    depths = sensitive_depths(result.get("breakdown"))
    if depths:
        kept["sensitive_depths"] = {label: list(counts) for label, counts in depths.items()}
    return kept


def wins_against_tr(data: dict, methods: list[str]) -> dict[str, list[int]]:
    """Per tree method, the samples where it accepted more, as many or fewer drafts at image-sensitive
    tokens than Token Recycling (`recap.bench.metrics.sample_wins`), ``{method: [more, tied, fewer]}``."""
    found = {}
    for method in methods:
        if method not in ("ar", "tr"):
            wins = sample_wins(data["samples"], method, "tr")
            if wins is not None:
                found[method] = list(wins)
    return found


def build(version: str, limit: int) -> dict:
    folder, dataset = MODELS[version]
    runtime = Runtime.load(str(folder), device="cpu", dtype=torch.float32)
    methods = methods_here()
    data = run(runtime, dataset, limit, methods)
    summary = {
        "model": folder.name,
        "dataset": dataset,
        "samples": data["settings"]["samples"],
        "budget_note": f"{EQUAL_NODES} nodes a pass for every tree method, greedy, up to {MAX_NEW_TOKENS} "
        "new tokens, one CPU thread",
        "command": f"python -m scripts.compare_summary --model {version} --limit {limit}",
        "methods": {m: method_summary(data["methods"][m]) for m in methods},
        "sample_wins": wins_against_tr(data, methods),
        "config": asdict(RecapConfig(budget=EQUAL_NODES)),
        "check": {"samples": CHECKED, "limit": limit, "passes": per_sample_passes(data, methods)},
        "environment": environment(),
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), action="append", help="default: both")
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"held-out scenes per model (default {DEFAULT_LIMIT})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    for version in args.model or sorted(MODELS):
        summary = build(version, args.limit)
        path = summary_path(summary["model"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {path.relative_to(path.parents[2])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

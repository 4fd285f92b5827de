"""The benchmark: every method on the same samples, in one process, against greedy AR.

``python -m recap.bench --dataset scenes2 --methods ar,pld,tr,recap --out runs/scenes2`` writes
``results.json``, ``results.md`` and plotly charts into ``--out``.

One module per concept; this package re-exports their public names:

- `recap.bench.runner`: the run (one stream of requests per method with memories of its own, methods
  interleaved per sample, warm-up, wall-clock timing, image-sensitive positions, the environment record).
- `recap.bench.metrics`: the records (`SampleRun`, `MethodResult`, `CategoryResult`, `BenchmarkResult`)
  and the definitions of every metric (MAT, MAT w/o bonus, speedup, match rate, acceptance columns).
- `recap.bench.report`: ``results.json``, the markdown tables (per method, per RECAP source, per
  category) and the charts.
- `recap.bench.cli`: the command line (`main`); ``__main__`` runs it.
"""

from __future__ import annotations

from recap.bench.cli import main
from recap.bench.metrics import (
    BenchmarkResult,
    CategoryResult,
    MethodResult,
    SampleRun,
    aggregate,
    per_category,
    sample_category,
)
from recap.bench.report import category_table, charts, markdown_table, write_outputs
from recap.bench.runner import environment, normalize_methods, other_images, run_benchmark

__all__ = [
    "BenchmarkResult",
    "CategoryResult",
    "MethodResult",
    "SampleRun",
    "aggregate",
    "category_table",
    "charts",
    "environment",
    "main",
    "markdown_table",
    "normalize_methods",
    "other_images",
    "per_category",
    "run_benchmark",
    "sample_category",
    "write_outputs",
]

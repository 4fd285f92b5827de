"""How much the Compare tab's measured speedups move from one click to the next.

Builds the studio in this process (the embedded default model, its first example), runs the Compare
tab's handler ``--runs`` times with the page's default settings (as a click does), and prints each
method's timed speedup over AR per run, the median and the largest deviation from it (in % of the
median), then each method's timed seconds per run (which side of a ratio moved: AR's or the method's).

    python -m scripts.compare_spread --runs 5 [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from recap.studio.ui import measure


def _rows(table) -> list:
    """The table's rows (gradio gives a dict with ``data``, or the list itself)."""
    return table["data"] if isinstance(table, dict) else table


def speedups(table) -> dict[str, float]:
    """Method label -> the table's timed speedup over AR."""
    column = measure.HEADERS.index("speedup vs AR (timed)")
    return {row[0]: float(str(row[column]).rstrip("x")) for row in _rows(table) if str(row[column]) != "-"}


def seconds(table) -> dict[str, float]:
    """Method label -> the table's timed seconds (the fastest-pass total, without the range)."""
    column = next(i for i, h in enumerate(measure.HEADERS) if h.startswith("timed s"))
    return {row[0]: float(str(row[column]).split()[0]) for row in _rows(table) if str(row[column]) != "-"}


def nodes(table) -> dict[str, str]:
    """Method label -> the table's nodes per pass."""
    column = measure.HEADERS.index(measure.NODES)
    return {row[0]: str(row[column]) for row in _rows(table)}


def spread(
    compare, inputs: list, runs: int, shown: dict | None = None, timed: dict | None = None
) -> dict[str, list[float]]:
    """Each method's speedup over ``runs`` calls of the tab's handler ``compare`` with ``inputs``
    (``shown``, if given, receives the last table's nodes per pass; ``timed``, each method's timed
    seconds per call)."""
    seen: dict[str, list[float]] = {}
    for _ in range(runs):
        *_, final = compare(*inputs)
        table = next(v for v in final.values() if isinstance(v, list) and v and isinstance(v[0], list))
        for method, value in speedups(table).items():
            seen.setdefault(method, []).append(value)
        if shown is not None:
            shown.update(nodes(table))
        if timed is not None:
            for method, value in seconds(table).items():
                timed.setdefault(method, []).append(value)
    return seen


def compare_handler(warmup: int | None = None) -> tuple:
    """The Compare tab's handler on a studio built in this process (a fresh server), and the page's
    default inputs; ``warmup``: the requests each method is warmed on (None: the studio's own)."""
    from recap.studio.demo import build_demo

    demo = build_demo()
    if warmup is not None:
        demo.studio.compare_warmup = warmup
    handler = next(fn for fn in demo.fns.values() if fn.api_name == "compare")
    return handler.fn, [component.value for component in handler.inputs]


def click_inputs(defaults: list, image, prompt: str, budgets: str = "equal") -> list:
    """The page's defaults with ``image`` and ``prompt`` filled in and the budget choice, as a click sends."""
    values = list(defaults)
    values[0], values[1] = {"path": str(image)}, prompt
    values[-1] = measure.EQUAL if budgets == "equal" else measure.DEVICE
    return values


def deviation(values: list[float]) -> float:
    """The largest distance from the median, in % of the median."""
    median = statistics.median(values)
    return 100 * max(abs(v - median) for v in values) / median if median else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budgets", choices=("equal", "device"), default="equal")
    parser.add_argument(
        "--repeats", type=int, default=measure.REPEATS, help="timed repeats per method and click"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.repeats < 1:
        parser.error("--runs and --repeats must be 1 or more")
    measure.REPEATS = args.repeats  # read by the tab's handler at every click
    import torch

    from recap.studio.environment import DEFAULT_MODEL_ID
    from recap.studio.ui.examples import examples

    torch.set_num_threads(1)
    image, prompt = examples(DEFAULT_MODEL_ID)[0]
    compare, defaults = compare_handler()
    values = click_inputs(defaults, image, prompt, args.budgets)
    shown: dict[str, str] = {}
    timed: dict[str, list[float]] = {}
    seen = spread(compare, values, args.runs, shown, timed)
    for method, values in seen.items():
        runs = ", ".join(f"{v:.2f}x" for v in values)
        median = statistics.median(values)
        print(
            f"{method} ({shown.get(method, '-')} nodes / pass): {runs}; median {median:.2f}x,"
            f" at most {deviation(values):.0f}% off it"
        )
    for method, values in timed.items():
        runs = ", ".join(f"{v:.3f}" for v in values)
        print(f"{method} timed s: {runs}; at most {deviation(values):.0f}% off their median")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much the Compare tab's measured speedups move from one click to the next.

Builds the studio in this process (the embedded default model, its first example or ``--example N``),
runs the Compare tab's handler ``--runs`` times with the page's default settings (as a click does), and
prints each method's timed speedup over AR per run, the median and the largest deviation from it (in %
of the median), then each method's timed seconds per run (which side of a ratio moved: AR's or the method's),
then each method's projected speedup on the H200 curve per run beside the benchmark's ``--cost-curve``
projection of the same click's passes (`recap.bench.metrics.aggregate` on `SampleRun.from_steps` of the
runs the tab shows: the same records, the benchmark's own code), with the largest gap between the two.

``--busy N`` starts N CPU-bound processes beside it for the whole measurement (as
``scripts/busy_suite.py`` does; they stop when it ends).

    python -m scripts.compare_spread --runs 5 [--repeats 3] [--busy 3] [--example 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence

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


def projected(table) -> dict[str, float]:
    """Method label -> the table's projected speedup on the H200 curve (from "0.031 s (2.90x)")."""
    column = measure.HEADERS.index("projected on an H200 (speedup)")
    found = {}
    for row in _rows(table):
        cell = str(row[column])
        if cell != "-":
            found[row[0]] = float(cell.split("(")[1].rstrip("x)"))
    return found


def bench_projection(runs: Mapping[str, Sequence], projection: measure.Projection) -> dict[str, float]:
    """Method label -> the projected speedup `python -m recap.bench --cost-curve` computes for these runs
    (its own code: `SampleRun.from_steps`, then `aggregate` with the curve, drafting in CPU time), AR's
    runs the reference."""
    from recap.bench.metrics import SampleRun, aggregate
    from recap.studio.ui.render import method_label

    ar = [SampleRun.from_steps("input", runs["ar"], 0.0)]
    found = {}
    for method, steps in runs.items():
        result = aggregate(
            method, [SampleRun.from_steps("input", steps, 0.0)], ar, None, projection=projection.curve
        )
        if result.projected_speedup is not None:
            found[method_label(method)] = result.projected_speedup
    return found


def nodes(table) -> dict[str, str]:
    """Method label -> the table's nodes per pass."""
    column = measure.HEADERS.index(measure.NODES)
    return {row[0]: str(row[column]) for row in _rows(table)}


def spread(
    compare,
    inputs: list,
    runs: int,
    shown: dict | None = None,
    timed: dict | None = None,
    final_states: list | None = None,
) -> dict[str, list[float]]:
    """Each method's speedup over ``runs`` calls of the tab's handler ``compare`` with ``inputs``
    (``shown``, if given, receives the last table's nodes per pass; ``timed``, each method's timed
    seconds per call; ``final_states``, each call's final table and comparison state, as
    ``(table, state)``)."""
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
        if final_states is not None:
            state = next((v for v in final.values() if isinstance(v, dict) and "runs" in v), None)
            final_states.append((table, state))
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


def fastest_total(repeats: Sequence[Sequence[float]]) -> float:
    """The sum over passes of each pass's fastest repeat (the same passes in each repeat), for comparing
    that count with the tab's median of the repeats' totals; the fastest total where pass counts differ."""
    if len({len(r) for r in repeats}) != 1:
        return min(sum(r) for r in repeats)
    return sum(min(column) for column in zip(*repeats))


def deviation(values: list[float]) -> float:
    """The largest distance from the median, in % of the median."""
    median = statistics.median(values)
    return 100 * max(abs(v - median) for v in values) / median if median else 0.0


def gap(ours: float, theirs: float) -> float:
    """How far ``ours`` is from ``theirs``, in % of ``theirs``."""
    return 100 * abs(ours - theirs) / theirs if theirs else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budgets", choices=("equal", "device"), default="equal")
    parser.add_argument(
        "--repeats", type=int, default=measure.REPEATS, help="timed repeats per method and click"
    )
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes to run beside it")
    parser.add_argument(
        "--example", type=int, default=1, help="which example of the default model (1: the page's default)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.repeats < 1 or args.busy < 0 or args.example < 1:
        parser.error("--runs, --repeats and --example must be 1 or more, --busy 0 or more")
    measure.REPEATS = args.repeats  # read by the tab's handler at every click
    from scripts import busy_suite

    busy = busy_suite.start_busy(args.busy, 3600.0)
    try:
        return _measure(args)
    finally:
        busy_suite.stop_busy(busy)


def _measure(args: argparse.Namespace) -> int:
    import torch

    from recap.studio.environment import DEFAULT_MODEL_ID, EMBEDDED_FOLDERS
    from recap.studio.ui.examples import examples

    torch.set_num_threads(1)
    shipped = examples(DEFAULT_MODEL_ID)
    if args.example > len(shipped):
        print(f"--example {args.example}: the default model ships {len(shipped)} examples", file=sys.stderr)
        return 2
    image, prompt = shipped[args.example - 1]
    compare, defaults = compare_handler()
    values = click_inputs(defaults, image, prompt, args.budgets)
    shown: dict[str, str] = {}
    timed: dict[str, list[float]] = {}
    finals: list = []
    seen = spread(compare, values, args.runs, shown, timed, finals)
    print(f"{args.runs} clicks of {prompt!r}, {args.busy} busy processes started beside it")
    for method, values in seen.items():
        runs = ", ".join(f"{v:.2f}x" for v in values)
        median = statistics.median(values)
        print(
            f"{method} ({shown.get(method, '-')} nodes / pass): {runs}; median {median:.2f}x,"
            f" at most {deviation(values):.0f}% off it (range {min(values):.2f}-{max(values):.2f}x)"
        )
    for method, values in timed.items():
        runs = ", ".join(f"{v:.3f}" for v in values)
        print(f"{method} timed s: {runs}; at most {deviation(values):.0f}% off their median")
    fastest: dict[str, list[float]] = {}  # the same clicks counted at each pass's fastest repeat
    for _, state in finals:
        times = state.get("times", {})
        for method, repeats in times.items():
            if repeats and times.get("ar"):
                ratio = fastest_total(times["ar"]) / fastest_total(repeats)
                fastest.setdefault(method, []).append(ratio)
    for method, values in fastest.items():
        runs = ", ".join(f"{v:.2f}x" for v in values)
        worst = deviation(values)
        print(f"{method} counted at each pass's fastest repeat instead: {runs}; at most {worst:.0f}% off")
    projection = measure.projection_for(str(EMBEDDED_FOLDERS[DEFAULT_MODEL_ID]), "cpu")
    if projection is None:
        print("no recorded H200 curve for this model: no projection")
        return 0
    tab: dict[str, list[float]] = {}
    bench: dict[str, list[float]] = {}
    for table, state in finals:
        for method, value in projected(table).items():
            tab.setdefault(method, []).append(value)
        for method, value in bench_projection(state["runs"], projection).items():
            bench.setdefault(method, []).append(value)
    print(
        f"projected speedups on {projection.label}, per click: the tab's / the benchmark's on the same passes"
    )
    for method, values in tab.items():
        theirs = bench.get(method, [])
        pairs = ", ".join(f"{a:.2f}/{b:.2f}x" for a, b in zip(values, theirs))
        print(
            f"{method}: {pairs}; the tab's at most {deviation(values):.1f}% off their median, "
            f"{max(map(gap, values, theirs), default=0.0):.1f}% from the benchmark's"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

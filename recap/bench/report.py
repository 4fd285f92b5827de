"""The benchmark's report: ``results.json``, ``results.md`` (the tables) and plotly charts.

Everything here reads a finished `BenchmarkResult`; nothing runs a model. Rows are methods in run order
(AR first); the per-source table lists RECAP methods only, the per-category table appears when the
samples carry categories (Spec-Bench, MT-Bench, scenes' question types), the coverage table (covered /
drafted / accepted at image-sensitive positions, `recap.bench.coverage`), the depth table (accepted
there by the depth of the state) and the per-sample table (accepted there against Token Recycling,
sample by sample) when the samples have images.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from recap.bench.coverage import DEPTH_LABELS, GROUPS, at_depths, sensitive_depths
from recap.bench.metrics import BenchmarkResult, MethodResult, sample_wins
from recap.drafters import is_recap_method

log = logging.getLogger(__name__)

#: Memories a RECAP drafter credits for accepted tokens (the per-source acceptance columns).
RECAP_SOURCES = ("ctx3", "ctx2", "persistent", "suffix", "backoff")


def markdown_table(result: BenchmarkResult) -> str:
    """The results as a markdown table (plus the per-source table when RECAP methods ran, and the
    per-category table when the samples have categories)."""
    header = (
        "| method | MAT | MAT w/o bonus | speedup vs AR | tokens/s | nodes/pass | draft+update ms/step "
        "| draft+update CPU ms/step | match vs AR | accept @ sensitive | accept @ insensitive | passes "
        "| tokens | seconds |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = "".join(
        f"| {r.method} | {r.mat:.2f} | {r.mat_no_bonus:.2f} | {_num(r.speedup, 'x')} | {r.tokens_per_s:.1f} "
        f"| {r.nodes_per_step:.1f} | {r.draft_ms_per_step:.2f} | {r.draft_cpu_ms_per_step:.2f} "
        f"| {100 * r.match_rate:.1f}% "
        f"| {_pct(r.accept_sensitive)} | {_pct(r.accept_insensitive)} "
        f"| {r.passes} | {r.tokens} | {r.seconds:.1f} |\n"
        for r in result.methods.values()
    )
    if any(r.projected_seconds is not None for r in result.methods.values()):
        curve = result.settings.get("cost_curve_file", "the recorded cost curve")
        rows += (
            f"\nProjected on the device of {curve} (decoding passes priced on its curve, plus the "
            "drafting measured here in CPU time): "
            + ", ".join(
                f"{r.method} {r.projected_seconds:.3f} s ({_num(r.projected_speedup, 'x')})"
                for r in result.methods.values()
            )
            + ".\n"
        )
    recap = [r for r in result.methods.values() if is_recap_method(r.method)]
    categories = category_table(result) + coverage_table(result) + depth_table(result) + wins_table(result)
    if not recap:
        return header + rows + categories
    sources = "\nAccepted drafted tokens by proposing memory (RECAP methods):\n\n"
    sources += "| method | " + " | ".join(RECAP_SOURCES) + " |\n|---|" + "---|" * len(RECAP_SOURCES) + "\n"
    for r in recap:
        total = sum(r.source_acceptance.values()) or 1
        cells = [
            f"{r.source_acceptance.get(s, 0)} ({100 * r.source_acceptance.get(s, 0) / total:.0f}%)"
            for s in RECAP_SOURCES
        ]
        sources += f"| {r.method} | " + " | ".join(cells) + " |\n"
    return header + rows + sources + categories


#: The coverage table's columns: (heading, count key); shares are of the group's positions.
COVERAGE_COLUMNS = (
    ("covered", "covered"),
    ("by this request", "covered_this_request"),
    ("drafted there", "drafted"),
    ("accepted", "accepted"),
)


def coverage_table(result: BenchmarkResult) -> str:
    """The coverage table at image-sensitive positions (first and later mentions); "" without a breakdown.

    Columns: the share of positions whose token a memory held (covered), held by a record of this
    request, drafted, and accepted; methods without a known coverage (AR, PLD, SuffixDecoding) show
    drafted and accepted only."""
    rows = [r for r in result.methods.values() if r.breakdown and r.method != "ar"]
    if not rows:
        return ""
    table = (
        "\nAt image-sensitive positions (first mention: the last two tokens there were never committed "
        "before in the request; covered: a memory's record there held the target's token):\n\n"
        "| method | mention | positions | " + " | ".join(h for h, _ in COVERAGE_COLUMNS) + " |\n"
        "|---|---|---|" + "---|" * len(COVERAGE_COLUMNS) + "\n"
    )
    for r in rows:
        for group in ("sensitive-first", "sensitive-later"):
            counts = r.breakdown[group]
            n = counts.get("positions", 0)
            cells = [_share(counts.get(key, 0), n, known=_known(r, key)) for _, key in COVERAGE_COLUMNS]
            table += f"| {r.method} | {group.split('-')[1]} | {n} | " + " | ".join(cells) + " |\n"
    return table


#: The method whose mix of depths the depth table weighs every method's acceptance by, when it ran.
DEPTH_REFERENCE = "tr"


def depth_cells(depths: dict[str, tuple[int, int]], reference: dict[str, tuple[int, int]]) -> list[str]:
    """One method's cells of a depth table: ``accepted% of positions`` per `DEPTH_BUCKETS` bucket (``-``
    where it has none), in all, and (with a ``reference``'s depths) at the reference's mix of depths."""
    cells = [_depth_cell(*depths[label]) if label in depths else "-" for label in DEPTH_LABELS]
    cells.append(_depth_cell(*(sum(v) for v in zip(*depths.values()))))
    if reference:
        weighed = at_depths(depths, reference)
        cells.append("n/a" if weighed is None else f"{100 * weighed:.0f}%")
    return cells


def depth_table(result: BenchmarkResult) -> str:
    """At image-sensitive positions, each method's acceptance by the depth of the state (`DEPTH_BUCKETS`),
    and, when Token Recycling ran, weighed by TR's mix of depths (`recap.bench.coverage.at_depths`);
    "" when no method has depths."""
    rows = _with_depths(result)
    if not rows:
        return ""
    reference = result.methods.get(DEPTH_REFERENCE)
    ref_depths = sensitive_depths(reference.breakdown) if reference is not None else {}
    extra = " | at TR's depths" if ref_depths else ""
    table = (
        "\nAt image-sensitive positions by the depth of the state (drafts the pass had accepted before it; "
        "0: the pass's first draft), accepted of positions"
        + (
            "; at TR's depths: each depth's acceptance weighed by Token Recycling's share of positions "
            "at that depth"
            if ref_depths
            else ""
        )
        + ":\n\n| method | "
        + " | ".join(DEPTH_LABELS)
        + " | all"
        + extra
        + " |\n"
        "|---|" + "---|" * (len(DEPTH_LABELS) + 1 + bool(ref_depths)) + "\n"
    )
    for method, depths in rows:
        table += f"| {method} | " + " | ".join(depth_cells(depths, ref_depths)) + " |\n"
    return table


def wins_table(result: BenchmarkResult) -> str:
    """Per sample, every tree method's drafts accepted at image-sensitive positions against Token
    Recycling's (`recap.bench.metrics.sample_wins`); "" when TR did not run or no sample has counts."""
    if DEPTH_REFERENCE not in result.methods:
        return ""
    rows = [
        (method, wins)
        for method in result.methods
        if method not in ("ar", DEPTH_REFERENCE)
        and (wins := sample_wins(result.samples, method, DEPTH_REFERENCE)) is not None
    ]
    if not rows:
        return ""
    table = (
        "\nPer sample with image-sensitive positions, drafts accepted there against Token Recycling's "
        "(one sample's counts are a few tokens: how often a single request goes either way):\n\n"
        "| method | samples | more than TR | as many | fewer | at least as many |\n"
        "|---|---|---|---|---|---|\n"
    )
    for method, wins in rows:
        table += (
            f"| {method} | {wins.samples} | {wins.more} | {wins.tied} | {wins.fewer} "
            f"| {_share(wins.at_least, wins.samples)} |\n"
        )
    return table


def _with_depths(result: BenchmarkResult) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """(method, its `sensitive_depths`) for every method but AR that has depths."""
    found = [(r.method, sensitive_depths(r.breakdown)) for r in result.methods.values() if r.method != "ar"]
    return [(method, depths) for method, depths in found if depths]


def _depth_cell(positions: int, accepted: int) -> str:
    return f"{100 * accepted / positions:.0f}% of {positions}"


def _known(result: MethodResult, key: str) -> bool:
    """Whether ``key`` is known for ``result``'s method (coverage is, for methods that report it)."""
    if not key.startswith("covered"):
        return True
    return any(k.startswith("covered_") and k != "covered_this_request" for g in GROUPS
               for k in result.breakdown[g])  # fmt: skip


def _share(count: int, total: int, known: bool = True) -> str:
    if not known:
        return "n/a"
    return f"{count} ({100 * count / total:.0f}%)" if total else "0"


def category_table(result: BenchmarkResult) -> str:
    """Per category: each method's MAT and speedup vs AR as ``MAT (speedup)``, AR's token count, and the
    best MAT in bold (when above AR's); "" when the samples have no categories.

    Example row: ``| summarization | 2 | 128 | 1.00 (1.00x) | **2.10** (1.30x) |``.
    """
    if not result.categories:
        return ""
    methods = list(result.methods)
    table = "\nPer category: MAT (speedup vs AR):\n\n"
    table += "| category | samples | AR tokens | " + " | ".join(methods) + " |\n"
    table += "|---|---|---|" + "---|" * len(methods) + "\n"
    for category, by_method in result.categories.items():
        best = max(by_method[m].mat for m in methods)
        cells = []
        for method in methods:
            r = by_method[method]
            mat = f"**{r.mat:.2f}**" if r.mat == best > by_method["ar"].mat else f"{r.mat:.2f}"
            cells.append(f"{mat} ({_num(r.speedup, 'x')})")
        ar = by_method["ar"]
        table += f"| {category} | {ar.samples} | {ar.tokens} | " + " | ".join(cells) + " |\n"
    return table


def _num(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def write_outputs(result: BenchmarkResult, out_dir: str | Path) -> list[Path]:
    """Write results.json, results.md and the charts (`charts`) into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n")
    settings = result.settings
    head = (
        f"# RECAP benchmark: {settings.get('model')} on {settings.get('dataset', '?')}\n\n"
        f"{settings['samples']} samples, max {settings['max_new_tokens']} new tokens, "
        f"{settings['device']} {settings['dtype']}, {settings['torch_threads']} thread(s), "
        f"{settings['date']}\n\n"
    )
    command = f"\n```\n{settings['command']}\n```\n" if settings.get("command") else ""
    (out / "results.md").write_text(head + markdown_table(result) + command)
    paths = [out / "results.json", out / "results.md"]
    if importlib.util.find_spec("plotly") is None:  # e.g. a bare GPU machine: the tables still count
        log.warning("plotly is not installed: results.json and results.md written, charts skipped")
        return paths
    for name, figure in charts(result).items():
        path = out / f"{name}.html"
        figure.write_html(path, include_plotlyjs="directory")  # one shared plotly.min.js, works offline
        paths.append(path)
    return paths


def charts(result: BenchmarkResult) -> dict[str, Any]:
    """Plotly figures: ``speedup_mat``, ``sensitivity``, ``accept_hist`` and (with a breakdown)
    ``coverage`` and ``depth``."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(result.methods)
    rows = list(result.methods.values())
    titles = ("Speedup over AR (wall clock)", "MAT (bonus incl.)")
    speed = make_subplots(rows=1, cols=2, subplot_titles=titles)
    speed.add_bar(x=names, y=[r.speedup or 0.0 for r in rows], name="speedup", row=1, col=1)
    speed.add_bar(x=names, y=[r.mat for r in rows], name="MAT", row=1, col=2)
    speed.update_layout(title=f"{result.settings.get('model')}", showlegend=False)

    sens = go.Figure()
    sens.add_bar(x=names, y=[r.accept_sensitive for r in rows], name="image-sensitive positions")
    sens.add_bar(x=names, y=[r.accept_insensitive for r in rows], name="insensitive positions")
    sens.update_layout(
        barmode="group", title="Share of tokens drafted and accepted", yaxis={"tickformat": ".0%"}
    )

    hist = go.Figure()
    for r in rows:
        total = sum(r.accepted_length_histogram) or 1
        hist.add_bar(
            x=list(range(len(r.accepted_length_histogram))),
            y=[n / total for n in r.accepted_length_histogram],
            name=r.method,
        )
    hist.update_layout(
        barmode="group",
        title="Accepted drafted tokens per decoding pass",
        xaxis_title="accepted length",
        yaxis={"title": "share of passes", "tickformat": ".0%"},
    )
    figures = {"speedup_mat": speed, "sensitivity": sens, "accept_hist": hist}
    broken = [r for r in rows if r.breakdown and r.method != "ar"]
    if broken:
        cover = make_subplots(rows=1, cols=2, subplot_titles=("first mention", "later mention"))
        for col, group in enumerate(("sensitive-first", "sensitive-later"), start=1):
            for heading, key in COVERAGE_COLUMNS:
                shares = []
                for r in broken:
                    counts = r.breakdown[group]
                    n = counts.get("positions", 0)
                    shares.append(counts.get(key, 0) / n if n and _known(r, key) else None)
                cover.add_bar(x=[r.method for r in broken], y=shares, name=heading, row=1, col=col,
                              showlegend=col == 1, legendgroup=heading)  # fmt: skip
        cover.update_layout(
            barmode="group", title="At image-sensitive positions", yaxis={"tickformat": ".0%"}
        )
        figures["coverage"] = cover
    deep = _with_depths(result)
    if deep:
        depth = go.Figure()
        for method, depths in deep:
            depth.add_bar(
                x=list(DEPTH_LABELS),
                y=[depths[b][1] / depths[b][0] if b in depths else None for b in DEPTH_LABELS],
                customdata=[depths[b][0] if b in depths else 0 for b in DEPTH_LABELS],
                hovertemplate="%{y:.0%} of %{customdata} positions",
                name=method,
            )
        depth.update_layout(
            barmode="group",
            title="Accepted at image-sensitive positions, by the depth of the state",
            xaxis={"title": "drafts the pass had accepted before the state", "type": "category"},
            yaxis={"tickformat": ".0%"},
        )
        figures["depth"] = depth
    return figures

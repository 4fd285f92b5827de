"""The README's headline results table and docs/results.md's tables, made from the runs in ``docs/results/``.

Each row is one ``results.json`` of `ROWS`: per method its MAT and a speedup over AR (measured on this
CPU, or projected on the recorded H200 curve where the run replayed one), and the share of drafts
accepted at image-sensitive tokens (in brackets RECAP's at TR's mix of tree depths). docs/results.md
holds every method of every run, the covered / drafted / accepted breakdown at image-sensitive tokens
and the same tokens by the depth of the state. ``tests/test_docs.py`` checks that
both pages hold exactly what this prints, so they cannot drift from the runs.

    python -m scripts.results_table            # print the README's table
    python -m scripts.results_table --write    # replace the tables in README.md and docs/results.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from recap.bench.coverage import DEPTH_LABELS, at_depths, sensitive_depths
from recap.bench.report import depth_cells

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
COVERAGE_ROWS = (
    "v2-scenes2-b80", "v2-rephrased-b80", "v2-detail-b80", "v1-scenes-b80", "v1-rephrased-b80",
    "v2-scenes2-h200-curve", "v2-scenes2-h200-curve-400",
)  # fmt: skip
METHODS = ("ar", "pld", "tr", "suffix", "recap")
LABELS = {"ar": "AR", "pld": "PLD", "tr": "TR", "suffix": "SuffixDecoding", "recap": "RECAP"}


@dataclass(frozen=True)
class Row:
    folder: str
    label: str
    #: "measured": wall-clock speedup on this CPU; "projected": on the replayed H200 curve.
    speed: str = "measured"


ROWS = (
    Row("v2-scenes2-b80", "v2 scenes2, 100 held-out scenes, 80 nodes"),
    Row("v2-rephrased-b80", "v2 scenes2-rephrased (questions unlike training), 100, 80 nodes"),
    Row("v2-detail-b80", "v2 scenes2-detail (detailed descriptions), 100, 80 nodes"),
    Row("v1-scenes-b80", "v1 scenes, 100 held-out scenes, 80 nodes"),
    Row("v1-rephrased-b80", "v1 scenes-rephrased, 100, 80 nodes"),
    Row("v2-scenes2-auto", "v2 scenes2, 100, budget auto (this CPU's curve)"),
    Row("v1-scenes-h200-curve", "v1 scenes, 100, budget auto on the recorded H200 curve", "projected"),
    Row("v2-scenes2-h200-curve", "v2 scenes2, 100, budget auto on v1's recorded H200 curve", "projected"),
    Row("v2-scenes2-h200-curve-400", "v2 scenes2, 400 held-out scenes, the same H200 curve", "projected"),
    Row("smollm2-mtbench-b80", "SmolLM2-135M, MT-Bench (12 questions), 80 nodes"),
    Row("smollm2-specbench-auto", "SmolLM2-135M, Spec-Bench (52 questions), budget auto"),
)


def load(row: Row) -> dict:
    return json.loads((RESULTS / row.folder / "results.json").read_text(encoding="utf-8"))


def cell(result: dict | None, speed: str) -> str:
    """``MAT (speedup)`` of one method, or ``-`` when the run did not include it."""
    if result is None:
        return "-"
    value = result.get("projected_speedup") if speed == "projected" else result.get("speedup")
    return f"{result['mat']:.2f} ({value:.2f}x)" if value is not None else f"{result['mat']:.2f}"


def sensitive(results: dict) -> str:
    """TR's and RECAP's accepted share at image-sensitive tokens, and RECAP's at TR's mix of depths
    (``-`` for text models)."""
    tr, recap = results.get("tr", {}), results.get("recap", {})
    if tr.get("accept_sensitive") is None or recap.get("accept_sensitive") is None:
        return "-"
    weighed = at_depths(sensitive_depths(recap.get("breakdown")), sensitive_depths(tr.get("breakdown")))
    matched = "" if weighed is None else f" ({100 * weighed:.0f}%)"
    return f"{100 * tr['accept_sensitive']:.0f}% / {100 * recap['accept_sensitive']:.0f}%{matched}"


def table() -> str:
    head = (
        "| run | "
        + " | ".join(LABELS[m] for m in METHODS)
        + " | accept @ image-sensitive, TR / RECAP (RECAP at TR's depths) |"
    )
    lines = [head, "|---" * (len(METHODS) + 2) + "|"]
    for row in ROWS:
        data = load(row)
        methods = data["methods"]
        link = f"[{row.label}](docs/results/{row.folder}/results.md)"
        cells = [cell(methods.get(m), row.speed) for m in METHODS]
        lines.append(f"| {link} | " + " | ".join(cells) + f" | {sensitive(methods)} |")
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def full_tables() -> str:
    """Every method of every run: MAT, speedup, nodes per pass, acceptance at sensitive and
    insensitive tokens, match with AR."""
    out = []
    for row in ROWS:
        data = load(row)
        speed = "projected speedup (H200 curve)" if row.speed == "projected" else "speedup (this CPU)"
        out.append(f"**{row.label}** ([results.md](results/{row.folder}/results.md))\n")
        columns = f"MAT | {speed} | nodes / pass | accept @ sensitive | accept @ insensitive | match"
        out.append(f"| method | {columns} |")
        out.append("|---|---|---|---|---|---|---|")
        for name, r in data["methods"].items():
            value = r.get("projected_speedup") if row.speed == "projected" else r.get("speedup")
            out.append(
                f"| {name} | {r['mat']:.2f} | {value:.2f}x | {r['nodes_per_step']:.1f} "
                f"| {_pct(r['accept_sensitive'])} | {_pct(r['accept_insensitive'])} "
                f"| {100 * r['match_rate']:.0f}% |"
            )
        out.append("")
    return "\n".join(out)


def coverage_tables() -> str:
    """At image-sensitive tokens, first and later mentions: positions, covered (by any memory; by a
    record of this request), drafted there, accepted; TR, RECAP and the paper's per-request scope."""
    out = [
        "| run | method | mention | positions | covered | by this request | drafted there | accepted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for folder in COVERAGE_ROWS:
        methods = json.loads((RESULTS / folder / "results.json").read_text(encoding="utf-8"))["methods"]
        for name in ("tr", "recap", "recap-request-context"):
            breakdown = methods.get(name, {}).get("breakdown")
            if not breakdown:
                continue
            for group in ("sensitive-first", "sensitive-later"):
                c, n = breakdown[group], breakdown[group]["positions"] or 1
                own = "-" if name == "tr" else f"{100 * c['covered_this_request'] / n:.0f}%"
                out.append(
                    f"| {folder} | {name} | {group.split('-')[1]} | {c['positions']} "
                    f"| {100 * c['covered'] / n:.0f}% | {own} | {100 * c['drafted'] / n:.0f}% "
                    f"| {100 * c['accepted'] / n:.0f}% |"
                )
    return "\n".join(out) + "\n"


def depth_tables() -> str:
    """At image-sensitive tokens, by the depth of the state: accepted of positions per depth bucket, in
    all, and at TR's mix of depths; TR, RECAP and the paper's per-request scope."""
    out = [
        "| run | method | "
        + " | ".join(f"depth {label}" for label in DEPTH_LABELS)
        + " | all | at TR's depths |",
        "|---|---|" + "---|" * (len(DEPTH_LABELS) + 2),
    ]
    for folder in COVERAGE_ROWS:
        methods = json.loads((RESULTS / folder / "results.json").read_text(encoding="utf-8"))["methods"]
        reference = sensitive_depths(methods.get("tr", {}).get("breakdown"))
        for name in ("tr", "recap", "recap-request-context"):
            found = sensitive_depths(methods.get(name, {}).get("breakdown"))
            if found:
                out.append(f"| {folder} | {name} | " + " | ".join(depth_cells(found, reference)) + " |")
    return "\n".join(out) + "\n"


BLOCKS = {"runs": full_tables, "coverage": coverage_tables, "depth": depth_tables}


def replace_block(text: str, name: str, new: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {begin} ... {end} block")
    return pattern.sub(lambda _: f"{begin}\n{new}{end}", text)


def block(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    return text[text.index(begin) + len(begin) + 1 : text.index(end)]


def replace_table(text: str, new: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{new}{END}", text)


def readme_table(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN) + 1, text.index(END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = parser.parse_args(argv)
    new = table()
    if args.write:
        README.write_text(replace_table(README.read_text(encoding="utf-8"), new), encoding="utf-8")
        page = RESULTS_PAGE.read_text(encoding="utf-8")
        for name, make in BLOCKS.items():
            page = replace_block(page, name, make())
        RESULTS_PAGE.write_text(page, encoding="utf-8")
        print("README.md and docs/results.md tables updated", file=sys.stderr)
    else:
        print(new, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

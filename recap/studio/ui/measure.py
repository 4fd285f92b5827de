"""What the Compare tab measures, and how it says so: timed phases, repeats, a GPU projection, and the
benchmark's held-out picture beside the one input.

- **Timed like the benchmark**: a run's time is the sum of its passes' draft, verify and update phases
  (`recap.trace.summarize`); display work (token texts, the fused distribution, node contributions) is
  done outside them. Each method runs `REPEATS` times, interleaved, and every repeat drafts the same
  trees; a run's time is the median of its repeats' totals (`median_total`), shown with their range,
  and a speedup is AR's median over the method's. The clock, phase by phase (`clock`, `pass_seconds`):
  drafting and updating (the drafter's propose and observe) always in the decoding thread's CPU time
  (``StepRecord.drafter_cpu_ms``: they run in that thread on every device); the target's pass in that
  thread's CPU time too on a CPU where torch computes on that thread alone (``cpu_ms`` minus the
  drafter's share), else (a GPU, several torch threads) in wall-clock time. CPU time leaves out
  whatever time the machine gave to other processes and visitors.
- **Equal budgets by default** (`EQUAL`): every tree method grows `EQUAL_NODES` nodes a pass (RECAP's
  budget, SuffixDecoding's ``max_spec_tokens``; Token Recycling's template has that many); `DEVICE`:
  as each method would choose on this device (RECAP ``auto``, TR its template, SuffixDecoding its
  authors' default). Nodes per pass is a column.
- **Projected on an H200**: each run's decoding passes priced on a cost curve recorded there
  (`recap.models.cost.projected_seconds`, the formula of the benchmark's ``--cost-curve`` projection),
  plus the drafting measured here in the decoding thread's CPU time (`StepRecord.drafting_ms`: never
  wall-clock time, which a busy machine stretches); only for models with a recorded curve, and hidden
  on a GPU, where the measured column is the real one.
- **The held-out picture**: one line from the benchmark summary that ships for the model
  (``assets/summaries/<model folder>.json``, built by ``python -m scripts.compare_summary``), naming
  only the methods this server offers (SuffixDecoding's recorded figures only where it is installed).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recap.bench.coverage import at_depths, deep_share
from recap.bench.sensitivity import token_ids
from recap.models.cost import CostModel, load_curve, projected_seconds
from recap.studio.environment import EMBEDDED_FOLDERS, ROOT, offered_methods
from recap.studio.ui.render import method_label
from recap.trace import StepRecord, summarize

log = logging.getLogger(__name__)

#: Recorded H200 cost curves, by the model folder they were recorded with.
CURVES = {"tiny-scenes-llava": ROOT / "assets" / "cost-curves" / "h200-embedded.json"}
#: Models whose curve is that of a sibling of the same architecture and size (named in the column).
CURVE_OF = {"tiny-scenes-llava-v2": "tiny-scenes-llava"}
#: Benchmark summaries shipped for the Compare tab, one per model folder.
SUMMARY_DIR = ROOT / "assets" / "summaries"
SUMMARY_COMMAND = "python -m scripts.compare_summary"

REPEATS = 3
EQUAL_NODES = 80
EQUAL = f"equal: every tree method gets {EQUAL_NODES} nodes a pass"
DEVICE = "as each method would choose on this device"
BUDGET_CHOICES = (EQUAL, DEVICE)

#: The mean number of nodes a method drafted a pass (a tree method's budget is its cap).
NODES = "nodes / pass (drafted, mean)"
HEADERS = [
    "method",
    NODES,
    "target passes",
    "tokens",
    "MAT (tokens a pass)",
    f"timed s (median of {REPEATS} repeats; in parentheses, their range)",
    "speedup vs AR (timed)",
    "projected on an H200 (speedup)",
    "identical to AR",
]


@dataclass(frozen=True)
class Projection:
    """A recorded cost curve and what to call it in the table."""

    curve: CostModel
    label: str


def projection_for(model_name: str, device_type: str) -> Projection | None:
    """The H200 curve that prices ``model_name``'s passes, or None (no recorded curve, or running on
    a GPU already, where the measured time is the real one)."""
    if device_type == "cuda":
        return None
    folder = Path(model_name).name
    source = CURVE_OF.get(folder, folder)
    path = CURVES.get(source)
    if path is None or not path.is_file():
        return None
    try:
        curve = load_curve(path)
    except ValueError as error:  # a damaged asset: no projection, said once in the log
        log.warning("no H200 projection: %s", error)
        return None
    if source == folder:
        return Projection(curve, "the H200 curve recorded with this model")
    return Projection(curve, f"the H200 curve recorded with {source} (same architecture, not this model)")


#: The clocks a Compare run can be timed with (`clock`), and how the tab names each.
CLOCKS = {
    "cpu": "in the decoding thread's CPU time, every phase (torch computes on that one thread here, so "
    "time the machine gave to other processes is left out)",
    "mixed": "drafting and updates in the decoding thread's CPU time, the target's pass in wall-clock "
    "time (it computes outside that thread here)",
}
#: The clock in a few words, for the line above the table.
CLOCK_WORDS = {
    "cpu": "in the decoding thread's CPU time",
    "mixed": "drafting in CPU time, the target's pass in wall-clock time",
}


def clock(device_type: str, threads: int) -> str:
    """``"cpu"`` on a CPU with torch on one thread (the decoding thread does all the compute), else
    ``"mixed"`` (a GPU computes outside the thread; several torch threads share the work): drafting in
    CPU time, the target's pass in wall-clock time."""
    return "cpu" if device_type == "cpu" and threads == 1 else "mixed"


def _wall_ms(step: StepRecord) -> float:
    return sum(step.timing.values())


def pass_seconds(steps: Sequence[StepRecord], which: str) -> list[float]:
    """Each pass's timed phases (the prefill's first), phase by phase in the ``which`` clock (`clock`).

    ``"cpu"``: the whole pass in the decoding thread's CPU time (``cpu_ms``: the drafter's share plus the
    target's pass). ``"mixed"``: a decoding pass's drafting in CPU time (`StepRecord.drafting_ms`) plus
    its target pass in wall-clock time (``timing["verify_ms"]``); the prefill in wall-clock time (its
    drafter work, reading the prompt, has no CPU time of its own). A record without CPU times counts in
    wall-clock time.
    """
    seconds = []
    for index, step in enumerate(steps):
        if step.cpu_ms <= 0:
            ms = _wall_ms(step)
        elif which == "cpu":
            ms = step.cpu_ms
        elif index == 0:
            ms = _wall_ms(step)
        else:
            ms = step.drafter_cpu_ms + step.timing.get("verify_ms", 0.0)
        seconds.append(ms / 1000.0)
    return seconds


def timed_seconds(steps: Sequence[StepRecord], which: str) -> float:
    """A run's timed phases by the ``which`` clock: the sum of its `pass_seconds`."""
    return sum(pass_seconds(steps, which))


def median_total(repeats: Sequence[Sequence[float]]) -> float:
    """The median of the repeats' totals (``repeats``: each repeat's `pass_seconds`); 0 without any.

    Example: ``[[1, 5], [2, 3], [4, 4]]`` -> totals 6, 5, 8 -> ``6``."""
    return float(statistics.median(sum(r) for r in repeats)) if repeats else 0.0


def projected(steps: Sequence[StepRecord], projection: Projection) -> float:
    """A run's decoding passes on the projection's device (`recap.models.cost.projected_seconds`), plus
    their drafting measured here in CPU time (`StepRecord.drafting_ms`)."""
    decoding = steps[1:]
    drafting = [s.drafting_ms for s in decoding]
    return projected_seconds(projection.curve, [len(s.nodes) for s in decoding], drafting)


def nodes_per_pass(steps: Sequence[StepRecord]) -> float:
    decoding = steps[1:]
    return sum(len(s.nodes) for s in decoding) / len(decoding) if decoding else 0.0


def rows(
    runs: Mapping[str, Sequence[StepRecord]],
    times: Mapping[str, Sequence[Sequence[float]]],
    projection: Projection | None = None,
    reference: str = "ar",
) -> list[list]:
    """One row per method (under `HEADERS`): ``runs`` (one run per method: the repeats' trees are the
    same), ``times`` (each repeat's `pass_seconds`). A timed cell is the median of the repeats' totals
    and their range; a speedup, AR's median over the method's."""
    median = {m: median_total(t) for m, t in times.items() if t}
    ref_tokens = token_ids(runs[reference]) if reference in runs else None
    ref_projected = projected(runs[reference], projection) if projection and reference in runs else None
    table = []
    for method, steps in runs.items():
        summary, seconds = summarize(steps), [sum(r) for r in times.get(method, ())]
        timed = "-"
        if len(seconds) < REPEATS and seconds:  # (a comparison still running)
            timed = f"{median[method]:.3f} ({len(seconds)} of {REPEATS} repeats so far)"
        elif seconds:
            timed = f"{median[method]:.3f} (repeats {min(seconds):.3f}-{max(seconds):.3f})"
        speedup = "-"
        if reference in median and median.get(method):
            speedup = f"{median[reference] / median[method]:.2f}x"
        gpu = "-"
        if projection is not None:
            seconds_there = projected(steps, projection)
            gpu = f"{seconds_there:.3f} s ({ref_projected / seconds_there:.2f}x)" if seconds_there else "-"
        identical = "-" if ref_tokens is None else ("yes" if token_ids(steps) == ref_tokens else "NO")
        table.append(
            [
                method_label(method),
                f"{nodes_per_pass(steps):.1f}",
                summary.passes,
                summary.tokens,
                f"{summary.mat:.2f}",
                timed,
                speedup,
                gpu,
                identical,
            ]
        )
    return table


def timing_note(
    projection: Projection | None, choice: str, which: str = "mixed", methods: Sequence[str] = ()
) -> str:
    """What the table's numbers measured, in one paragraph (``which``: the clock, `clock`; ``methods``:
    those compared, for what the equal budget means to each)."""
    note = (
        f"Timed: the draft, verify and update phases of every pass (display work excluded), "
        f"{CLOCKS[which]}, each method run {REPEATS} times, interleaved, after an untimed warm-up; a "
        "time is the median of the repeats' totals (in parentheses their range), a speedup AR's median "
        f'over the method\'s; tree budgets "{choice}".'
    )
    if choice == EQUAL and ({"suffix", "pld"} & set(methods)):
        tr = method_label("tr")
        parts = [f"RECAP fills it, and so does {tr}'s template except where repeated successors merge nodes"]
        if "suffix" in methods:
            parts.append(f"{method_label('suffix')} drafts only what its suffix trees match")
        if "pld" in methods:
            pld = method_label("pld")
            parts.append(f"{pld} drafts one chain of up to 10 tokens where the prompt matches")
        note += f" {EQUAL_NODES} nodes is each tree method's cap: {'; '.join(parts)}."
    if projection is not None:
        note += (
            f" Projected: the same passes priced on {projection.label}, at nodes + 1 tokens a pass (as "
            "`python -m recap.bench --cost-curve` prices them), plus "
            "the drafting (draft + update) measured here in the decoding thread's CPU time; a projection, "
            "not a measurement. "
            f"{device_gap(projection)}"
        )
        if choice == DEVICE:
            note += (
                " These passes are this device's choices (RECAP's auto budget keeps its trees small "
                "where a big tree costs several passes), so the projection undersells a method that "
                "would grow bigger trees there: at equal budgets every tree method may draft the same node "
                "count."
            )
    return note


def one_token_gap(projection: Projection | None, times: Mapping[str, Sequence[Sequence[float]]]) -> str:
    """A sentence where a one-token pass costs more on the projection's curve than AR's decoding passes
    took here (a tiny model on a CPU against a GPU's kernel launches), so that AR's projected seconds
    above its measured ones read as what they are; "" otherwise."""
    repeats = times.get("ar")
    if projection is None or not repeats or min(len(r) for r in repeats) < 2:
        return ""
    passes = min(len(r) for r in repeats)
    here = sum(min(r[i] for r in repeats) for i in range(1, passes)) / (passes - 1)  # decoding passes
    there = float(projection.curve.costs(np.array([1.0]))[0])
    if there <= here:
        return ""
    return (
        f" A one-token pass costs {1000 * there:.1f} ms on that curve against {1000 * here:.1f} ms for "
        "AR's passes here (so small a model is quicker on this CPU than a GPU's kernel launches): compare "
        "the speedups, not the seconds."
    )


def device_gap(projection: Projection) -> str:
    """Why a timed speedup and a projected one differ: what a pass over the curve's largest measured
    token count costs against one over a single token, on the projection's curve."""
    largest = max(tokens for tokens, _ in projection.curve.points)
    one, full = projection.curve.costs(np.array([1.0, float(largest)]))
    return (
        "The two differ by device: on this CPU a pass costs more the more nodes it verifies, so fewer "
        f"passes need not take less time; on that curve (measured up to {largest} tokens) a pass over "
        f"{largest} tokens costs {100 * (full / one - 1):.0f}% more than one over a single token."
    )


# ------------------------------------------------------------------------------ held-out summary
def summary_path(model_name: str) -> Path:
    return SUMMARY_DIR / f"{Path(model_name).name}.json"


def load_summary(model_name: str) -> dict | None:
    """The benchmark summary shipped for ``model_name`` (None: none ships, or it does not read)."""
    path = summary_path(model_name)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        log.warning("benchmark summary %s not read: %s", path.name, error)
        return None


def summary_line(summary: dict | None, offered: Sequence[str] | None = None, scenes: bool = True) -> str:
    """The held-out picture in one line (Markdown), or "" without a summary. ``offered``: the methods
    this server offers (None: all the summary holds); a method it does not offer (SuffixDecoding where
    its package is not installed) is not quoted; ``scenes``: with the scene-by-scene counts (where
    `held_out_figure` draws them, not)."""
    if not summary:
        return ""
    methods = {m: r for m, r in summary["methods"].items() if offered is None or m in offered}
    mats = ", ".join(f"{method_label(m)} {r['mat']:.2f}" for m, r in methods.items())
    sens = ", ".join(
        f"{method_label(m)} {100 * r['accept_sensitive']:.0f}% / {100 * r['accept_insensitive']:.0f}%"
        for m, r in methods.items()
        if m != "ar" and r.get("accept_sensitive") is not None
    )
    return (
        f"**Recorded beforehand, not on this input: {summary['samples']} held-out scenes** of this model "
        f"({summary['budget_note']}, whichever budgets are chosen below), decoded one after another, so "
        "each method's memories also learn from the scenes before (the comparison below starts every "
        f"input from the same warm-up instead). MAT: {mats}. Drafts accepted at "
        f"image-sensitive / insensitive tokens: {sens}.{_at_tr_depths(methods)}"
        f"{_scene_by_scene(summary) if scenes else ''}"
        f" Recorded with `{summary['command']}` in the project's repository."
    )


def _scene_by_scene(summary: dict) -> str:
    """On how many of the held-out scenes RECAP accepted more, as many or fewer drafts at image-sensitive
    tokens than Token Recycling, as a sentence ("" for a summary without those counts)."""
    counts = summary.get("sample_wins", {}).get("recap")
    if not counts:
        return ""
    more, tied, fewer = counts
    return (
        f" Scene by scene, RECAP accepted more drafts there than TR on {more} scenes, as many on {tied} and "
        f"fewer on {fewer} (of the {more + tied + fewer} with such tokens): each scene has only a few such "
        "tokens, so a single example can go either way."
    )


def _at_tr_depths(methods: dict) -> str:
    """RECAP's acceptance at image-sensitive tokens at Token Recycling's mix of depths, as a sentence
    ("" when the summary has no depths)."""
    depths = {m: methods.get(m, {}).get("sensitive_depths") for m in ("tr", "recap")}
    if not all(depths.values()):
        return ""
    recap, tr = ({b: tuple(v) for b, v in depths[m].items()} for m in ("recap", "tr"))
    weighed = at_depths(recap, tr)
    if weighed is None:
        return ""
    why = ""
    if deep_share(recap) > deep_share(tr):
        why = (
            " RECAP's longer accepted chains meet more of those tokens deep in its tree, where fewer "
            "candidates are left;"
        )
    return (
        f"{why} {'at' if why else 'At'} Token Recycling's mix of depths (each depth's acceptance weighted "
        "by TR's share of "
        f"those tokens there) RECAP accepts {100 * weighed:.0f}% of them, against TR's "
        f"{100 * methods['tr']['accept_sensitive']:.0f}%."
    )


def held_out_figure(summary: dict | None, offered: Sequence[str] | None = None) -> str:
    """The held-out distribution that leads the Compare and Sensitivity tabs (Markdown with HTML blocks),
    or "" without a summary: on how many held-out scenes RECAP accepted more, as many or fewer drafts
    than Token Recycling at image-sensitive tokens, drawn as one mark a scene, and the difference of
    their acceptance over all those tokens; then the run below as one sample of it, and `summary_line`
    (every method, the command that records it again) folded. A summary without the scene counts
    gives `summary_line` alone."""
    counts = (summary or {}).get("sample_wins", {}).get("recap")
    if not summary or not counts:
        return summary_line(summary, offered)
    more, tied, fewer = counts
    head = (
        f"**Recorded beforehand on {summary['samples']} held-out scenes, not on this input.** At their "
        f"image-sensitive tokens RECAP accepted more drafts than Token Recycling on **{more}** scenes, as "
        f"many on **{tied}**, fewer on **{fewer}** (the {more + tied + fewer} with such tokens)"
        f"{_pooled(summary['methods'])}."
    )
    bars = "".join(
        f'<div class="recap-dist-row"><span class="recap-dist-name">{name}</span>'
        f'<span class="recap-dist-bar recap-dist-{kind}">{"■" * count}</span> {count}</div>'
        for name, kind, count in (
            ("more", "more", more),
            ("as many", "tied", tied),
            ("fewer", "fewer", fewer),
        )
    )
    return (
        f'<div class="recap-held-out">\n\n{head}\n\n<div class="recap-dist">{bars}</div>\n\n'
        "The input below is one sample of this distribution: a single scene has only a few such tokens "
        "and can go either way.\n\n"
        f"<details><summary>Every method on those scenes, and the command that records them</summary>\n\n"
        f"{summary_line(summary, offered, scenes=False)}\n\n</details>\n\n</div>"
    )


def _pooled(methods: dict) -> str:
    """Over all the held-out scenes' image-sensitive tokens, RECAP's acceptance against TR's, in points
    ("" when the summary lacks one of them)."""
    tr, recap = (methods.get(m, {}).get("accept_sensitive") for m in ("tr", "recap"))
    if tr is None or recap is None:
        return ""
    points = round(100 * recap) - round(100 * tr)
    return (
        f"; over all those tokens together RECAP accepted {100 * recap:.0f}% and Token Recycling "
        f"{100 * tr:.0f}% (RECAP {points:+d} points)"
    )


def held_out_line(model_id: object) -> str:
    """The held-out figure of an offered embedded model (`held_out_figure`, by the model's id; "" for any
    other), quoting only the methods this server offers (`recap.studio.environment.offered_methods`)."""
    folder = EMBEDDED_FOLDERS.get(model_id) if isinstance(model_id, str) else None
    return held_out_figure(load_summary(str(folder)), offered_methods()) if folder is not None else ""

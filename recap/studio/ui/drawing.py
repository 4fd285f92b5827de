"""The bound on what the studio draws from a trace (a run's, a replayed file's, a step's view).

A trace within `guard.trace_files`' bounds can still name a source of its own for each of 4096 tokens, hold
8192-node trees with 1000-character texts, or sampling draws that try ~90,000 tokens; drawn as they
are, one plotly trace per source and a label and a hover per node, such a trace took minutes of the
server's CPU and a gigabyte. So every panel draws a bounded amount, decided from the trace before
anything is drawn (`SourceSeries`, `tree_subset`), and aggregates beyond it:

- a figure or a legend has at most `MAX_SERIES` series by source: the studio's own sources in the
  order of `recap.tree.SOURCE_TABLE`, then a trace's other names by how many tokens (or nodes) they
  gave; the rest are folded into one series, `OTHER_SOURCES`;
- the passes chart draws at most `MAX_BARS` bars: beyond, each bar sums `bar_width` consecutive steps
  (a studio run has at most 513 steps: one bar each);
- the candidate tree draws at most `MAX_TREE_NODES` nodes (the accepted path, then the rest in the
  order they were drafted: a parent always before its children), and its title says how many;
- a token's text is cut to `LABEL_CHARS` in a label and `TEXT_CHARS` in a hover, a sentence or a
  table; a list of names to `MAX_NAMES` (then "and N more"); sampling draws to `MAX_DRAW_ROWS`
  positions of `MAX_TRIED` children each.

`work_units` counts what the panels of one step (and the answer and chart of all steps) will hold
under these bounds, computed before drawing; `MAX_WORK_UNITS` is its bound for any trace within
`guard.trace_files`' (`tests/test_drawing.py` checks both, and what drawing the worst traces costs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from recap.trace import NodeRecord, StepRecord
from recap.tree import SOURCE_TABLE

#: Series by source a figure or legend draws; the studio's own sources (`SOURCE_TABLE`) all fit.
MAX_SERIES = 12
#: The series that sources past `MAX_SERIES` are folded into.
OTHER_SOURCES = "other sources"
#: Bars of the passes chart (a bar per step up to this many, then a bar per `bar_width` steps).
MAX_BARS = 600
#: Nodes of one step's tree drawn (a studio run drafts at most 144).
MAX_TREE_NODES = 1024
#: Characters of a token's text in a label (tree nodes, bars) and in a hover, a sentence or a table.
LABEL_CHARS = 24
TEXT_CHARS = 80
#: Names listed in a hover, a sentence or a table cell before "and N more".
MAX_NAMES = 8
#: Sampling draws shown: positions, and children tried at each.
MAX_DRAW_ROWS = 64
MAX_TRIED = 16
#: Characters a source's name keeps in a legend, a label or a list.
NAME_CHARS = 40

_KNOWN = [s.name for s in SOURCE_TABLE]
#: Characters one drawn node carries at most: its label, and a hover of its text, `MAX_NAMES` sources
#: and `MAX_NAMES` shares, with their markup.
NODE_CHARS = LABEL_CHARS + TEXT_CHARS + 2 * MAX_NAMES * (NAME_CHARS + 16) + 400
#: What `work_units` never exceeds for a trace within `guard.trace_files`' bounds (4096 tokens of at most
#: 200,000 characters of text, and the panels of one step, each bounded as above).
MAX_WORK_UNITS = 2 * 4096 + 200_000 + MAX_SERIES * MAX_BARS + MAX_TREE_NODES * (3 + NODE_CHARS) + 200_000


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last of them an ellipsis where it was longer."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def listed(names: Sequence[str], limit: int = MAX_NAMES) -> list[str]:
    """The first ``limit`` of ``names`` (each cut to `NAME_CHARS`), then "and N more" where there are more."""
    shown = [cut(name, NAME_CHARS) for name in names[:limit]]
    if len(names) > limit:
        shown.append(f"and {len(names) - limit} more")
    return shown


class SourceSeries:
    """Which sources a drawing shows as their own series (at most ``limit``), the rest folded into
    `OTHER_SOURCES`: the studio's own sources first, in `SOURCE_TABLE`'s order, then the other names
    by count (most first), then by name."""

    def __init__(self, counts: Counter, limit: int = MAX_SERIES) -> None:
        ranked = [s for s in _KNOWN if counts.get(s)]
        ranked += sorted((s for s in counts if s not in _KNOWN), key=lambda s: (-counts[s], s))
        self.folded = len(ranked) > limit
        self.shown = ranked[: limit - 1] if self.folded else ranked
        self._shown = set(self.shown)

    @classmethod
    def of_tokens(cls, steps: Iterable[StepRecord], limit: int = MAX_SERIES) -> SourceSeries:
        """The series of the committed tokens' sources."""
        return cls(Counter(source for step in steps for source in step.new_sources), limit)

    def series(self, source: str) -> str:
        """The series ``source`` is drawn in: itself, or `OTHER_SOURCES`."""
        return source if source in self._shown else OTHER_SOURCES

    @property
    def order(self) -> list[str]:
        """Every series drawn, `OTHER_SOURCES` last where sources were folded."""
        return [*self.shown, OTHER_SOURCES] if self.folded else list(self.shown)


def bar_width(steps: int) -> int:
    """Steps a bar of the passes chart sums: 1 up to `MAX_BARS` steps, then as few as keep the bars
    at most `MAX_BARS`."""
    return max(1, -(-steps // MAX_BARS))


def tree_subset(step: StepRecord, limit: int = MAX_TREE_NODES) -> list[NodeRecord]:
    """The nodes of ``step``'s tree that are drawn: all of them when they are at most ``limit``; else
    the accepted nodes with their ancestors (a trace's accepted ids need not be one path), then the
    others in the order they were drafted (a node's parent is drafted before it), ``limit`` in all:
    every drawn node's parent is drawn."""
    nodes = step.nodes
    if len(nodes) <= limit:
        return list(nodes)
    keep: set[int] = set()
    for accepted in step.accepted_ids:
        chain, at = [], accepted
        while 0 <= at < len(nodes) and at not in keep:
            chain.append(at)
            at = nodes[at].parent
        if len(keep) + len(chain) > limit:
            break
        keep.update(chain)
    for node in nodes:
        if len(keep) >= limit:
            break
        if node.parent == -1 or node.parent in keep:
            keep.add(node.id)
    return [node for node in nodes if node.id in keep]


def work_units(steps: Sequence[StepRecord], index: int | None = None) -> int:
    """What the panels will hold, counted before drawing, under the bounds above: for a replay
    (``index`` None) two units per token of the answer, one per character of its text and one per bar
    segment of the passes chart, and the last step's view; for a step's view (step ``index``) a unit
    per drawn node and edge end, per character of their labels and hovers, and per character of the
    sampling draws shown."""
    units = 0
    if index is None:
        tokens = sum(len(step.new_tokens) for step in steps)
        chars = sum(len(text) for step in steps for text in step.new_texts)
        series = len(SourceSeries.of_tokens(steps).order)
        units += 2 * tokens + chars + series * -(-len(steps) // bar_width(len(steps)))
        index = len(steps) - 1
    if not steps:
        return units
    step = steps[max(0, min(index, len(steps) - 1))]
    for node in tree_subset(step):  # a point, an edge's two ends, a label, a hover
        units += 3 + min(len(node.text), LABEL_CHARS) + min(len(node.text), TEXT_CHARS) + _names_chars(node)
    draws = step.draws or []
    tried = sum(min(len(draw.get("tried", [])), MAX_TRIED) for draw in draws[:MAX_DRAW_ROWS])
    return units + tried * (TEXT_CHARS + 40)


def _names_chars(node: NodeRecord) -> int:
    """Characters of a node's hover spent on its sources and their shares (`MAX_NAMES` of each)."""
    names = list(node.sources[:MAX_NAMES]) + list(node.contributions)[:MAX_NAMES]
    return sum(min(len(name), NAME_CHARS) + 16 for name in names)

"""Figures of one step for the studio's step panel: the candidate tree and the fused distribution.

Pure functions from a `StepRecord` to a `plotly.graph_objects.Figure`; labels go through
`recap.studio.ui.render.plot_text` / `plot_name` (escaped once: plotly reads tags in labels).
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from recap.drafters import is_recap_method
from recap.studio.ui.drawing import LABEL_CHARS, MAX_NAMES, TEXT_CHARS, SourceSeries, cut, listed, tree_subset
from recap.studio.ui.render import (
    SOURCE_COLORS,
    method_label,
    plot_name,
    plot_text,
    source_color,
    source_label,
    visible_token,
)
from recap.trace import NodeRecord, StepRecord
from recap.tree import main_source

_FADED = 0.3  # opacity of rejected nodes: visible, but clearly not on the accepted path
_TITLE_LINE = 18  # px: a line of the tree's title (font size 13)


# ------------------------------------------------------------------------------------------- tree
@dataclass(frozen=True)
class _Placed:
    """A tree node's position in the drawing: ``x`` = depth, ``y`` = row (leaves in DFS order)."""

    x: float
    y: float


def tree_layout(nodes: Sequence[NodeRecord]) -> tuple[_Placed, dict[int, _Placed]]:
    """Tidy layout: leaves take consecutive rows in depth-first order (best-scored child first),
    each inner node sits at the mean row of its children. Returns the root's and every node's place.

    Iterative (an explicit stack), so a chain thousands of nodes deep lays out like any other tree.
    Nodes not reachable from the root (``parent == -1``) get no place.
    """
    children: dict[int, list[NodeRecord]] = {}
    for node in nodes:
        children.setdefault(node.parent, []).append(node)
    for kids in children.values():
        kids.sort(key=lambda n: (not n.accepted, -n.score, n.id))
    rows: dict[int, float] = {}
    depths = {-1: 0}
    next_row = 0.0
    stack = [(-1, False)]  # (node id, children already pushed)
    while stack:
        node_id, expanded = stack.pop()
        kids = children.get(node_id, [])
        if kids and not expanded:
            stack.append((node_id, True))
            for kid in reversed(kids):  # pushed last = visited first: best child on top
                depths[kid.id] = depths[node_id] + 1
                stack.append((kid.id, False))
        elif kids:
            rows[node_id] = sum(rows[kid.id] for kid in kids) / len(kids)
        else:
            rows[node_id], next_row = next_row, next_row + 1
    places = {i: _Placed(depths[i], row) for i, row in rows.items() if i != -1}
    return _Placed(0, rows[-1]), places


def _label(text: str) -> str:
    """A token's label in the tree as a reader says it (`_bar_label`: no space markers; they and the
    token's id are in its hover); punctuation alone («.», «:», «↵») between guillemets, where a bare
    dot or colon would be a speck beside its node."""
    label = _bar_label(text)
    bare = (text.strip() or "\n" in text) and not any(c.isalnum() for c in text) and len(text) <= 3
    return f"«{label}»" if bare else label


def _visible_names(sources: Sequence[str]) -> list[str]:
    return [visible_token(s) for s in listed(sources or ["?"])]


#: Characters a line of a node's hover holds at most (about 170 px: a phone's panel has room beside a node).
HOVER_CHARS = 26


def _wrapped(parts: Sequence[str], separator: str) -> str:
    """``parts`` joined by ``separator``, HTML-escaped, a line break wherever a line would pass
    `HOVER_CHARS` (a part longer than that keeps a line of its own)."""
    lines, line = [], ""
    for part in parts:
        joined = f"{line}{separator}{part}" if line else part
        if line and len(joined) > HOVER_CHARS:
            lines.append(line + separator.rstrip())
            line = part
        else:
            line = joined
    lines.append(line)
    return "<br>".join(html.escape(text, quote=False) for text in lines)


def _node_hover(node: NodeRecord) -> str:
    """A node's hover: its text with its spaces shown (cut to `TEXT_CHARS`) and its id, at most
    `MAX_NAMES` sources and shares; short lines (`HOVER_CHARS`), so that it fits beside a node on a
    phone."""
    shares = node.contributions or {}
    total = sum(shares.values())
    shown = visible_token(cut(node.text, TEXT_CHARS), spaces=True)
    lines = [
        f"<b>{_wrapped([shown[i : i + HOVER_CHARS] for i in range(0, len(shown), HOVER_CHARS)], '')}</b>"
        f" (id {node.token})",
        f"depth {node.depth} · score {node.score:.3g}",
        _wrapped(
            [f"sources: {s}" if i == 0 else s for i, s in enumerate(_visible_names(node.sources))], ", "
        ),
    ]
    if node.this_request:
        lines.append("from this image's own records<br>(computed in this request)")
    elif any(shares.get(name, 0) > 0 for name in ("ctx3", "ctx2")):
        lines.append("records of earlier requests<br>(other images)")
    if node.fan:
        lines.append(f"offered in a fan: earlier<br>answers went on {node.fan} ways here")
    if total > 0:
        ranked = sorted(shares.items(), key=lambda kv: -kv[1])
        lines += [f"{plot_name(src)}: {100 * v / total:.0f}%" for src, v in ranked[:MAX_NAMES]]
        if len(ranked) > MAX_NAMES:
            lines.append(f"and {len(ranked) - MAX_NAMES} more")
    lines.append("accepted" if node.accepted else "rejected")
    return "<br>".join(lines)


def tree_figure(step: StepRecord, root_text: str | None = None) -> go.Figure:
    """The candidate tree of one step.

    x = depth, nodes coloured by their main source (largest contribution); a node proposed by several
    sources gets an outline in its second source's colour; the accepted path is drawn thick and its
    nodes enlarged; rejected nodes are faded; the bonus token hangs off the path as a grey diamond.
    Traces: ``edges``, ``accepted path``, ``root``, one trace per main source named after it (each
    point's ``customdata`` is its node id; past a dozen sources the rest are one trace, ``other
    sources``), and ``bonus`` when the step has a bonus token. A tree of over
    `recap.studio.ui.drawing.MAX_TREE_NODES` nodes draws that many (`tree_subset`), and its title says so.
    """
    nodes = tree_subset(step)
    root, places = tree_layout(nodes)
    figure = go.Figure()
    accepted = set(step.accepted_ids)
    _add_edges(figure, nodes, places, root, accepted)
    figure.add_scatter(
        x=[root.x],
        y=[root.y],
        mode="markers+text",
        name="root",
        marker={"size": 16, "color": "#444", "symbol": "square"},
        text=[_label(root_text) if root_text else "root"],
        textposition="top center",
        hovertext=["root: the last committed token"],
        hoverinfo="text",
        showlegend=False,
    )
    mains = [main_source(node.sources, node.contributions) for node in nodes]
    series = SourceSeries(Counter(mains))
    by_source: dict[str, list[NodeRecord]] = {}
    for node, source in zip(nodes, mains):
        by_source.setdefault(series.series(source), []).append(node)
    for source in series.order:
        figure.add_scatter(**_node_trace(source, by_source[source], places))
        figure.add_scatter(**_legend_entry(source))
    bonus = _add_bonus(figure, step, places, root)
    # every line under every marker: the bonus's dotted edge starts at its anchor's centre (the root's too)
    lines = ("edges", "accepted path", "bonus edge")
    figure.data = tuple(sorted(figure.data, key=lambda trace: trace.name not in lines))
    deepest = max((places[n.id].x for n in nodes), default=0)
    # half a column for the deepest labels (centred on their nodes), more for the bonus's (right of it)
    right = max(deepest + 0.6, bonus.x + 0.9 if bonus is not None else 0)
    bottom = max([p.y for p in places.values()] + [root.y] + ([bonus.y] if bonus is not None else []))
    title = f"step {step.step} · {len(step.nodes)} nodes drafted · {step.accepted_len} accepted"
    if len(nodes) < len(step.nodes):  # (a replayed trace's tree: a studio run drafts far fewer)
        title += f"<br>({len(nodes)} drawn: the accepted path, then the first drafted)"
    if step.step == 0:
        title = "step 0 · prefill<br>(no draft: the prompt pass gives the first token)"  # fits a phone
    elif not step.nodes:
        title = f"step {step.step} · nothing drafted<br>(one token from the target)"
    figure.update_layout(
        # the title under the panel's label, the legend under it: on a phone the legend wraps to three
        # rows, which the top margin leaves room for
        title={
            "text": title,
            "font": {"size": 13},
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            # plotly lifts a title's first line by a line per extra line: pushed down as much, so the
            # panel's label badge ("Candidate tree") covers none of them
            "pad": {"t": 36 + _TITLE_LINE * title.count("<br>")},
        },
        height=int(min(1400, max(324, 164 + 34 * (bottom + 1)))),  # ~34 px per row
        margin={"l": 10, "r": 10, "t": 124, "b": 30},
        # read by assets/static/studio.js: the plot gets at least this width, and the panel scrolls
        # sideways where it is narrower (a deep tree on a phone), so neighbouring labels stay apart
        meta={"min_width": _min_width(right)},
        # "depth 0", then bare numbers: a label per column that fits its column, never turned on its side
        xaxis={
            "tickvals": list(range(int(right) + 1)),
            "ticktext": ["depth 0", *map(str, range(1, int(right) + 1))],
            "range": [-0.8, right],
            "zeroline": False,
        },
        # explicit range with room above the top row, so its labels are not clipped
        yaxis={"visible": False, "range": [bottom + 0.7, -1.0]},
        # legend on top: below the plot it collides with the depth ticks when the figure is short
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "font": {"size": 10}},
        hovermode="closest",
        # short lines (`_node_hover`), left-aligned; studio.js keeps the label inside the tree's panel
        hoverlabel={"align": "left", "font": {"size": 11}},
        plot_bgcolor="white",
    )
    return figure


#: px per depth column the tree's labels need not to run into their neighbours' (a 9 px font; a tree
#: to depth 5 still fits a phone's 326 px panel), and
#: the widest plot the studio asks for (a chain thousands of nodes deep is scrolled, not stretched).
_COLUMN_PX, _MAX_MIN_WIDTH = 47, 2400


def _min_width(right: float) -> int:
    """The plot width at which every depth column, from the root's to ``right``, gets `_COLUMN_PX`."""
    return int(min(_MAX_MIN_WIDTH, _COLUMN_PX * (right + 0.8) + 20))


def _add_edges(figure: go.Figure, nodes, places, root: _Placed, accepted: set[int]) -> None:
    xs: list[float | None] = []
    ys: list[float | None] = []
    path_x: list[float | None] = []
    path_y: list[float | None] = []
    for node in nodes:
        parent = root if node.parent == -1 else places[node.parent]
        child = places[node.id]
        on_path = node.id in accepted
        (path_x if on_path else xs).extend([parent.x, child.x, None])
        (path_y if on_path else ys).extend([parent.y, child.y, None])
    for x, y, name, colour, width, legend in (
        (xs, ys, "edges", "#cccccc", 1, False),
        (path_x, path_y, "accepted path", "#222222", 4, bool(path_x)),
    ):
        figure.add_scatter(
            x=x,
            y=y,
            mode="lines",
            name=name,
            line={"color": colour, "width": width},
            hoverinfo="skip",
            showlegend=legend,
        )


def _node_trace(source: str, nodes: Sequence[NodeRecord], places) -> dict:
    """Keyword arguments of the scatter trace of the nodes whose main source is ``source``."""
    outlines, widths = [], []
    for node in nodes:
        others = [
            s for s in sorted(node.contributions or {}, key=lambda s: -node.contributions[s]) if s != source
        ]
        others += [s for s in node.sources if s != source and s not in others]
        outlines.append(source_color(others[0]) if others else "white")
        widths.append(3 if others else 1)
    return {
        "x": [places[n.id].x for n in nodes],
        "y": [places[n.id].y for n in nodes],
        "mode": "markers+text",
        "name": plot_name(source),  # short: the panel is narrow, and long names wrap the legend
        "customdata": [n.id for n in nodes],
        "marker": {
            "color": source_color(source),
            "size": [18 if n.accepted else 11 for n in nodes],
            "opacity": [1.0 if n.accepted else _FADED for n in nodes],
            "line": {"color": outlines, "width": widths},
        },
        "text": [_label(n.text) for n in nodes],
        "textposition": "top center",
        "textfont": {
            "size": [12 if n.accepted else 9 for n in nodes],
            "color": ["#111" if n.accepted else "#888" for n in nodes],
        },
        "hovertext": [_node_hover(n) for n in nodes],
        "hoverinfo": "text",
        "legendgroup": plot_name(source),  # escaped, like every string a figure carries
        "showlegend": False,  # the legend shows `_legend_entry`'s plain marker, not this trace's first node
    }


def _legend_entry(source: str) -> dict:
    """A legend-only trace for a source: a plotly legend draws a trace's first point's style, which
    for the node traces would be an accepted node's size or a rejected one's fade and another
    source's outline. Clicking it hides the source's nodes too (same legend group)."""
    return {
        "x": [None],
        "y": [None],
        "mode": "markers",
        "name": plot_name(source),
        "legendgroup": plot_name(source),  # escaped, like every string a figure carries
        "marker": {"color": source_color(source), "size": 11, "line": {"color": "white", "width": 1}},
        "hoverinfo": "skip",
    }


def _add_bonus(figure: go.Figure, step: StepRecord, places, root: _Placed) -> _Placed | None:
    """Hang the bonus token off the accepted path; its place (None: no bonus drawn)."""
    if step.bonus_token is None or step.step == 0 or not step.new_texts:
        return None
    anchor = places.get(step.accepted_ids[-1], root) if step.accepted_ids else root
    # the first row from the anchor's down with no node in the bonus's column or the next one (where its
    # label reaches): beside the node it follows, hiding none of the rejected children there. A node at
    # row y (a parent's is the mean of its children's) takes the whole rows in (y - 0.75, y + 0.75)
    taken: set[int] = set()
    for place in places.values():
        if place.x in (anchor.x + 1, anchor.x + 2):
            taken.update(r for r in (math.floor(place.y), math.ceil(place.y)) if abs(r - place.y) < 0.75)
    row = math.ceil(anchor.y)
    while row in taken:
        row += 1
    anchor_next = _Placed(anchor.x + 1, row)
    bonus_text = cut(step.new_texts[-1], TEXT_CHARS)
    figure.add_scatter(
        x=[anchor.x, anchor_next.x],
        y=[anchor.y, anchor_next.y],
        mode="lines",
        line={"color": SOURCE_COLORS["target"], "width": 2, "dash": "dot"},
        hoverinfo="skip",
        showlegend=False,
        name="bonus edge",
    )
    figure.add_scatter(
        x=[anchor_next.x],
        y=[anchor_next.y],
        mode="markers+text",
        name="bonus",
        marker={
            "size": 16,
            "color": SOURCE_COLORS["target"],
            "symbol": "diamond",
            "line": {"color": "#222", "width": 2},
        },
        text=[_label(step.new_texts[-1])],
        textposition="middle right",
        hovertext=[f"bonus token from the target:<br><b>{html.escape(visible_token(bonus_text, True))}</b>"],
        hoverinfo="text",
    )
    return anchor_next


# ------------------------------------------------------------------------------------ fused bars
def fused_figure(step: StepRecord, top: int = 10, target_text: str | None = None) -> go.Figure:
    """The drafter's fused distribution at the root: horizontal bars, stacked by source contribution.

    Each bar's segments are the sources' contributions (scaled to sum to the token's fused probability,
    whatever scale the record uses). A row reads as its token's text; the token id and its spaces (a
    leading space matters) are in the row's hover. The target's actual next token is marked with a star
    (in a row of its own at 0 when the drafter did not have it among its top tokens) and named in the
    title.
    """
    fused = sorted(step.fused_at_root, key=lambda f: -f.prob)[:top]
    rows = [_bar_label(f.text) for f in fused]
    hovers = [_bar_hover(f.text, f.token) for f in fused]
    target_row = None
    if step.target_token is not None:
        target_row = next((i for i, f in enumerate(fused) if f.token == step.target_token), None)
        if target_row is None:
            text = target_text if target_text is not None else _text_of(step, step.target_token)
            target_row = len(rows)
            rows.append(_bar_label(text))
            hovers.append(_bar_hover(text, step.target_token))
    target_label = rows[target_row] if target_row is not None else None
    if not fused:
        return _no_fused_figure(step, target_label)
    first = {n.token for n in step.nodes if n.parent == -1}
    faded = [1.0 if f.token in first else 0.35 for f in fused]  # not drafted under the root
    series = SourceSeries(Counter(s for f in fused for s in f.contributions))
    shares = []
    for f in fused:  # each bar's segments by series (sources past a dozen stacked as one)
        folded: dict[str, float] = {}
        for source, share in _scaled(f.prob, f.contributions).items():
            folded[series.series(source)] = folded.get(series.series(source), 0.0) + share
        shares.append(folded)
    figure = go.Figure()
    for source in series.order:
        figure.add_bar(
            y=list(range(len(fused))),
            x=[share.get(source, 0.0) for share in shares],
            orientation="h",
            name=plot_name(source_label(source)),
            marker={"color": source_color(source), "opacity": faded},
            customdata=hovers[: len(fused)],
            hovertemplate="%{customdata}: %{x:.3f} from " + plot_name(source) + "<extra></extra>",
        )
    if target_row is not None:
        prob_here = fused[target_row].prob if target_row < len(fused) else 0.0
        figure.add_scatter(
            y=[target_row],
            x=[prob_here],
            mode="markers",
            name="target's next token",
            marker={"symbol": "star", "size": 16, "color": "#111", "line": {"color": "white", "width": 1}},
            customdata=[hovers[target_row]],
            hovertemplate="the target chose %{customdata}<extra></extra>",
        )
    figure.update_layout(
        barmode="stack",
        title={"text": _fused_title(step, target_label, True, min(faded) < 1), "font": {"size": 13}},
        height=max(256, 30 * len(rows) + 126),
        margin={"l": 10, "r": 10, "t": 56, "b": 30},  # two title lines: they wrap nowhere on a phone
        xaxis={"title": "fused probability", "rangemode": "tozero"},
        # one row a token, the likeliest on top; rows are numbers, so two tokens that read alike
        # (" a" and "a") keep a row each
        yaxis={"tickmode": "array", "tickvals": list(range(len(rows))), "ticktext": rows,
               "autorange": "reversed", "automargin": True},
        legend={"orientation": "h", "y": -0.25, "font": {"size": 10}},
        plot_bgcolor="white",
    )  # fmt: skip
    return figure


def _no_fused_figure(step: StepRecord, target_label: str | None) -> go.Figure:
    """A small placeholder naming the target's token, for steps without a fused distribution."""
    figure = go.Figure()
    if target_label is not None and step.step > 0:
        figure.add_annotation(
            text=f"★ the target chose «{target_label}»",  # already escaped (a plot label)
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
            font={"size": 14},
        )
    figure.update_layout(
        title={"text": _fused_title(step, target_label, False), "font": {"size": 13}},
        height=170,
        margin={"l": 10, "r": 10, "t": 56, "b": 10},
        xaxis={"visible": False},
        yaxis={"visible": False},
        plot_bgcolor="white",
    )
    return figure


def _scaled(prob: float, contributions: Mapping[str, float]) -> dict[str, float]:
    total = sum(contributions.values())
    if total <= 0 or not math.isfinite(total):
        return {}
    return {s: prob * v / total for s, v in contributions.items()}


def _bar_label(text: str) -> str:
    """A token as a row of the distribution reads it: its text without the space markers (a token of
    spaces only shows them), cut short; the id and the spaces are in its hover (`_bar_hover`)."""
    shown = cut(text, LABEL_CHARS).strip()
    return plot_text(shown if shown else cut(text, LABEL_CHARS))


def _bar_hover(text: str, token: int) -> str:
    """A token's row hover: its text with its spaces shown, and its id."""
    return f"{plot_text(cut(text, TEXT_CHARS))} (id {token})"


def _text_of(step: StepRecord, token: int) -> str:
    for node in step.nodes:
        if node.token == token:
            return node.text
    for text, new in zip(step.new_texts, step.new_tokens):
        if new == token:
            return text
    return "?"


def _fused_title(step: StepRecord, target_label: str | None, has_bars: bool, faded: bool = False) -> str:
    if not has_bars:
        if step.step == 0:
            return "no fused distribution:<br>the prefill pass drafts nothing"
        if is_recap_method(step.method):
            return "no fused distribution at the root:<br>the memories held nothing for this context yet"
        drafter = plot_name(method_label(step.method))
        return f"no fused distribution at the root:<br>{drafter} drafts without probabilities"
    title = "fused distribution at the root" + (" (faded: not drafted)" if faded else "")
    if target_label is not None:
        chance = f" (target's own p={step.target_prob:.2f})" if step.target_prob is not None else ""
        title += f"<br>★ target chose «{target_label}»{chance}"
    return title

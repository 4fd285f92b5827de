"""Pure renderers for the studio: `StepRecord`s in, plotly figures / HTML strings / table rows out.

Nothing here decodes or touches a model or gradio; every function is a plain value transformation, so
the whole visual layer is unit-tested without a browser. The vocabulary:

- a *source* is what proposed a token (``ctx3``, ``ctx2``, ``persistent``, ``suffix``, ``template``,
  ``lookup``) or ``target`` for the bonus token the target produced itself;
- `highlighted_answer` returns the value of a ``gr.HighlightedText`` (``[(text, label), ...]``) whose
  labels are `SOURCE_LABELS` and whose colours are `highlight_color_map()`;
- figures are `plotly.graph_objects.Figure`; tables are ``list[list]`` rows under a ``*_HEADERS`` list.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from recap.drafters import is_recap_method
from recap.sensitivity import split_against_reference, token_sources
from recap.trace import NodeRecord, StepRecord, summarize
from recap.tree import SOURCE_TABLE, main_source

#: Colour of each source (from `recap.tree.SOURCE_TABLE`, the one table of sources).
SOURCE_COLORS: dict[str, str] = {s.name: s.color for s in SOURCE_TABLE}

#: The legend text of each source (what a visitor reads next to the colour).
SOURCE_LABELS: dict[str, str] = {s.name: s.meaning for s in SOURCE_TABLE}

#: Display names of the methods the studio offers.
METHOD_LABELS: dict[str, str] = {
    "recap": "RECAP",
    "tr": "Token Recycling",
    "pld": "Prompt lookup",
    "ar": "Autoregressive",
}

SENSITIVE_LABEL = "image-sensitive"
SENSITIVE_COLOR = "#EE3377"

STEP_TABLE_HEADERS = ["quantity", "value"]
COMPARE_HEADERS = ["method", "target passes", "tokens", "MAT", "wall s", "speedup vs AR", "identical to AR"]
SENSITIVITY_HEADERS = ["method", "drafted at image-sensitive", "drafted at insensitive"]

_FADED = 0.3  # opacity of rejected nodes: visible, but clearly not on the accepted path


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def source_label(source: str) -> str:
    return SOURCE_LABELS.get(source, source)


def source_color(source: str) -> str:
    return SOURCE_COLORS.get(source, SOURCE_COLORS["unknown"])


def highlight_color_map(sensitivity: bool = False) -> dict[str, str]:
    """``label -> colour`` for ``gr.HighlightedText(color_map=...)``: the sources, or the sensitive mark."""
    if sensitivity:
        return {SENSITIVE_LABEL: SENSITIVE_COLOR}
    return {SOURCE_LABELS[s]: c for s, c in SOURCE_COLORS.items() if s != "unknown"}


def visible_token(piece: str, spaces: bool = False) -> str:
    """A token piece that shows in a label: control characters as ``\\xNN``, newlines as ``↵``.

    ``spaces=True`` also shows spaces as ``␣`` (in the tree, where a leading space matters).
    """
    out = []
    for char in piece:
        if char == "\n":
            out.append("↵")
        elif char == " " and spaces:
            out.append("␣")
        elif not char.isprintable() and char != " ":
            out.append(f"\\x{ord(char):02x}" if ord(char) < 256 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out) or "∅"


def plot_text(piece: str) -> str:
    """A token piece for a plotly label: visible (spaces shown) and HTML-escaped, because plotly reads
    tags in labels (``</s>`` would vanish as a strikethrough tag)."""
    return html.escape(visible_token(piece, spaces=True), quote=False)


def plot_name(name: str, limit: int = 40) -> str:
    """A name for a plotly legend, title or hover (a source or method name, which a replayed trace
    supplies): HTML-escaped, because plotly renders tags such as ``<a href>`` there, and cut to ``limit``.
    """
    shown = visible_token(name)
    return html.escape(shown if len(shown) <= limit else shown[: limit - 1] + "…", quote=False)


# ----------------------------------------------------------------------------------------- answer
def highlighted_answer(steps: Sequence[StepRecord], upto: int | None = None) -> list[tuple[str, str | None]]:
    """The answer so far as ``gr.HighlightedText`` spans, one per token, labelled by its source.

    ``upto``: only steps ``0..upto`` (to show the answer as it stood at a step). Newlines stay real
    newlines (so paragraphs look right); other control characters are made visible.
    """
    spans: list[tuple[str, str | None]] = []
    for step in steps[: None if upto is None else upto + 1]:
        for text, source in zip(step.new_texts, step.new_sources):
            shown = "\n".join(visible_token(part) if part else "" for part in text.split("\n"))
            spans.append((shown, source_label(source)))
    return spans


def sensitivity_answer(steps: Sequence[StepRecord], flags: Sequence[bool]) -> list[tuple[str, str | None]]:
    """The answer with image-sensitive tokens labelled `SENSITIVE_LABEL` (others unlabelled)."""
    texts = [t for step in steps for t in step.new_texts]
    return [
        (
            "\n".join(visible_token(p) if p else "" for p in text.split("\n")),
            SENSITIVE_LABEL if flag else None,
        )
        for text, flag in zip(texts, flags)
    ]


# ------------------------------------------------------------------------------------------ stats
def stats_html(steps: Sequence[StepRecord], status: str = "") -> str:
    """Four headline figures as cards: target passes, tokens, mean accepted tokens per pass, tokens/s.

    Times come from the steps' own timings (draft + verify + update), so a display delay between
    streamed updates is not counted.
    """
    summary = summarize(steps)
    cards = [
        ("target passes", f"{summary.passes}"),
        ("tokens", f"{summary.tokens}"),
        ("mean accepted / pass", f"{summary.mat:.2f}"),
        ("tokens / s", f"{summary.tokens_per_s:.1f}"),
        ("draft + update ms / pass", f"{summary.draft_ms_per_step:.2f}"),
    ]
    body = "".join(
        f'<div class="recap-card"><div class="recap-card-value">{html.escape(value)}</div>'
        f'<div class="recap-card-label">{html.escape(label)}</div></div>'
        for label, value in cards
    )
    note = f'<div class="recap-card-status">{html.escape(status)}</div>' if status else ""
    return f'<div class="recap-cards">{body}</div>{note}'


def passes_figure(steps: Sequence[StepRecord]) -> go.Figure:
    """Tokens committed by each target pass, stacked by source (a live view of acceptance)."""
    figure = go.Figure()
    order = _sources_in(steps)
    x = [s.step for s in steps]
    for source in order:
        counts = [sum(1 for src in s.new_sources if src == source) for s in steps]
        figure.add_bar(x=x, y=counts, name=plot_name(source_label(source)), marker_color=source_color(source))
    figure.update_layout(
        barmode="stack",
        height=220,
        margin={"l": 40, "r": 10, "t": 10, "b": 30},
        xaxis_title="step",
        yaxis={"dtick": 1, "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.3, "font": {"size": 10}},
        showlegend=False,
    )
    return figure


def _sources_in(steps: Sequence[StepRecord]) -> list[str]:
    seen = {src for s in steps for src in s.new_sources}
    return [s for s in SOURCE_COLORS if s in seen] + sorted(seen - set(SOURCE_COLORS))


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


def _node_hover(node: NodeRecord) -> str:
    shares = node.contributions or {}
    total = sum(shares.values())
    lines = [
        f"<b>{html.escape(visible_token(node.text, spaces=True))}</b>  (id {node.token})",
        f"depth {node.depth} · score {node.score:.3g}",
        "sources: " + ", ".join(plot_name(s) for s in node.sources or ["?"]),
    ]
    if total > 0:
        lines += [
            f"{plot_name(src)}: {100 * v / total:.0f}%"
            for src, v in sorted(shares.items(), key=lambda kv: -kv[1])
        ]
    lines.append("accepted" if node.accepted else "rejected")
    return "<br>".join(lines)


def tree_figure(step: StepRecord, root_text: str | None = None) -> go.Figure:
    """The candidate tree of one step.

    x = depth, nodes coloured by their main source (largest contribution); a node proposed by several
    sources gets an outline in its second source's colour; the accepted path is drawn thick and its
    nodes enlarged; rejected nodes are faded; the bonus token hangs off the path as a grey diamond.
    Traces: ``edges``, ``accepted path``, ``root``, one trace per main source named after it (each
    point's ``customdata`` is its node id), and ``bonus`` when the step has a bonus token.
    """
    root, places = tree_layout(step.nodes)
    figure = go.Figure()
    accepted = set(step.accepted_ids)
    _add_edges(figure, step.nodes, places, root, accepted)
    figure.add_scatter(
        x=[root.x],
        y=[root.y],
        mode="markers+text",
        name="root",
        marker={"size": 16, "color": "#444", "symbol": "square"},
        text=[plot_text(root_text) if root_text else "root"],
        textposition="top center",
        hovertext=["root: the last committed token"],
        hoverinfo="text",
        showlegend=False,
    )
    by_source: dict[str, list[NodeRecord]] = {}
    for node in step.nodes:
        by_source.setdefault(main_source(node.sources, node.contributions), []).append(node)
    for source, nodes in by_source.items():
        figure.add_scatter(**_node_trace(source, nodes, places))
    _add_bonus(figure, step, places, root)
    depth = max((n.depth for n in step.nodes), default=0) + 1
    title = f"step {step.step} · {len(step.nodes)} nodes drafted · {step.accepted_len} accepted"
    if step.step == 0:
        title = "step 0 · prefill (no draft: the first token comes from the prompt pass)"
    elif not step.nodes:
        title = f"step {step.step} · nothing drafted (one token from the target)"
    figure.update_layout(
        title={"text": title, "font": {"size": 13}},
        height=int(min(1400, max(280, 120 + 34 * (_bottom_row(places, root) + 1)))),  # ~34 px per row
        margin={"l": 10, "r": 10, "t": 80, "b": 30},
        xaxis={"dtick": 1, "tickprefix": "depth ", "range": [-0.8, depth + 0.6], "zeroline": False},
        # explicit range with room above the top row, so its labels are not clipped
        yaxis={"visible": False, "range": [_bottom_row(places, root) + 0.7, -1.0]},
        # legend on top: below the plot it collides with the depth ticks when the figure is short
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "font": {"size": 10}},
        hovermode="closest",
        plot_bgcolor="white",
    )
    return figure


def _bottom_row(places: dict[int, _Placed], root: _Placed) -> float:
    """The lowest row in use, counting the bonus token's own row below the tree."""
    return max([p.y for p in places.values()] + [root.y]) + (1 if places else 0)


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
    figure.add_scatter(
        x=xs,
        y=ys,
        mode="lines",
        name="edges",
        line={"color": "#cccccc", "width": 1},
        hoverinfo="skip",
        showlegend=False,
    )
    figure.add_scatter(
        x=path_x,
        y=path_y,
        mode="lines",
        name="accepted path",
        line={"color": "#222222", "width": 4},
        hoverinfo="skip",
        showlegend=bool(path_x),
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
        "name": plot_name(
            source
        ),  # short: the panel is narrow, and long names wrap the legend over the title
        "customdata": [n.id for n in nodes],
        "marker": {
            "color": source_color(source),
            "size": [18 if n.accepted else 11 for n in nodes],
            "opacity": [1.0 if n.accepted else _FADED for n in nodes],
            "line": {"color": outlines, "width": widths},
        },
        "text": [plot_text(n.text) for n in nodes],
        "textposition": "top center",
        "textfont": {
            "size": [12 if n.accepted else 9 for n in nodes],
            "color": ["#111" if n.accepted else "#888" for n in nodes],
        },
        "hovertext": [_node_hover(n) for n in nodes],
        "hoverinfo": "text",
    }


def _add_bonus(figure: go.Figure, step: StepRecord, places, root: _Placed) -> None:
    if step.bonus_token is None or step.step == 0 or not step.new_texts:
        return
    anchor = places[step.accepted_ids[-1]] if step.accepted_ids else root
    # A row of its own below the tree: at the anchor's row it would hide the rejected siblings there.
    anchor_next = _Placed(anchor.x + 1, _bottom_row(places, root))
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
        text=[plot_text(step.new_texts[-1])],
        textposition="middle right",
        hovertext=[
            f"bonus token from the target: <b>{html.escape(visible_token(step.new_texts[-1], True))}</b>"
        ],
        hoverinfo="text",
    )


# ------------------------------------------------------------------------------------ fused bars
def fused_figure(step: StepRecord, top: int = 10, target_text: str | None = None) -> go.Figure:
    """The drafter's fused distribution at the root: horizontal bars, stacked by source contribution.

    Each bar's segments are the sources' contributions (scaled to sum to the token's fused probability,
    whatever scale the record uses). The target's actual next token is marked with a star (placed at 0
    when the drafter did not have it among its top tokens) and named in the title.
    """
    fused = sorted(step.fused_at_root, key=lambda f: -f.prob)[:top]
    figure = go.Figure()
    labels = [_bar_label(f.text, f.token) for f in fused]
    target_label = None
    if step.target_token is not None:
        known = [lbl for f, lbl in zip(fused, labels) if f.token == step.target_token]
        text = target_text if target_text is not None else _text_of(step, step.target_token)
        target_label = known[0] if known else _bar_label(text, step.target_token)
    sources = [s for s in SOURCE_COLORS if any(s in f.contributions for f in fused)]
    sources += sorted({s for f in fused for s in f.contributions} - set(sources))
    for source in sources:
        values = [_scaled(f.prob, f.contributions).get(source, 0.0) for f in fused]
        figure.add_bar(
            y=labels,
            x=values,
            orientation="h",
            name=plot_name(source_label(source)),
            marker_color=source_color(source),
            hovertemplate="%{y}: %{x:.3f} from " + plot_name(source) + "<extra></extra>",
        )
    order = list(labels)
    if not fused:
        return _no_fused_figure(step, target_label)
    if target_label is not None:
        if target_label not in order:
            order.append(target_label)
        prob_here = next((f.prob for f, lbl in zip(fused, labels) if lbl == target_label), 0.0)
        figure.add_scatter(
            y=[target_label],
            x=[prob_here],
            mode="markers",
            name="target's next token",
            marker={"symbol": "star", "size": 16, "color": "#111", "line": {"color": "white", "width": 1}},
            hovertemplate="the target chose %{y}<extra></extra>",
        )
    figure.update_layout(
        barmode="stack",
        title={"text": _fused_title(step, target_label, bool(fused)), "font": {"size": 13}},
        height=max(240, 30 * len(order) + 110),
        margin={"l": 10, "r": 10, "t": 40, "b": 30},
        xaxis={"title": "fused probability", "rangemode": "tozero"},
        yaxis={"categoryorder": "array", "categoryarray": order[::-1], "automargin": True},
        legend={"orientation": "h", "y": -0.25, "font": {"size": 10}},
        plot_bgcolor="white",
    )
    return figure


def _no_fused_figure(step: StepRecord, target_label: str | None) -> go.Figure:
    """A small placeholder naming the target's token, for steps without a fused distribution."""
    figure = go.Figure()
    if target_label is not None and step.step > 0:
        figure.add_annotation(
            text=f"★ the target chose {target_label}",  # already escaped (a plot label)
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
            font={"size": 14},
        )
    figure.update_layout(
        title={"text": _fused_title(step, target_label, False), "font": {"size": 13}},
        height=150,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
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


def _bar_label(text: str, token: int) -> str:
    return f"{plot_text(text)} [{token}]"


def _text_of(step: StepRecord, token: int) -> str:
    for node in step.nodes:
        if node.token == token:
            return node.text
    for text, new in zip(step.new_texts, step.new_tokens):
        if new == token:
            return text
    return "?"


def _fused_title(step: StepRecord, target_label: str | None, has_bars: bool) -> str:
    if not has_bars:
        if step.step == 0:
            return "fused distribution: none at the prefill pass"
        if is_recap_method(step.method):
            return "fused distribution: the memories held nothing for this context yet"
        return f"fused distribution: {plot_name(method_label(step.method))} drafts without probabilities"
    title = "fused distribution at the root"
    if target_label is not None:
        chance = f" (p={step.target_prob:.2f})" if step.target_prob is not None else ""
        title += f" · ★ target chose {target_label}{chance}"
    return title


# ---------------------------------------------------------------------------------- step table
def step_table(step: StepRecord) -> list[list]:
    """Rows ``[quantity, value]`` describing one step (under `STEP_TABLE_HEADERS`)."""
    timing = step.timing or {}
    sources = sorted({s for n in step.nodes for s in n.sources})
    return [
        ["step", step.step],
        ["method", method_label(step.method)],
        ["committed before", step.committed_len],
        ["nodes drafted", len(step.nodes)],
        ["drafting sources", ", ".join(sources) or "none"],
        ["accepted drafted tokens", step.accepted_len],
        ["tokens committed", len(step.new_tokens)],
        ["draft ms", round(timing.get("draft_ms", 0.0), 2)],
        ["verify ms", round(timing.get("verify_ms", 0.0), 2)],
        ["update ms", round(timing.get("update_ms", 0.0), 2)],
    ]


# ------------------------------------------------------------------------------------- compare
def compare_rows(
    runs: Mapping[str, Sequence[StepRecord]], wall_s: Mapping[str, float] | None = None, reference: str = "ar"
) -> list[list]:
    """One row per method (under `COMPARE_HEADERS`).

    ``wall_s``: measured wall time per method (defaults to the sum of step timings). Speedup and
    "identical" are relative to ``reference`` when it was run, else shown as ``-``.
    """
    wall_s = dict(wall_s or {})
    times = {m: wall_s.get(m, summarize(steps).seconds) for m, steps in runs.items()}
    ref_tokens = _tokens(runs[reference]) if reference in runs else None
    rows = []
    for method, steps in runs.items():
        summary = summarize(steps)
        speedup = "-"
        if reference in runs and times[method] > 0:
            speedup = f"{times[reference] / times[method]:.2f}x"
        identical = "-" if ref_tokens is None else ("yes" if _tokens(steps) == ref_tokens else "NO")
        rows.append(
            [
                method_label(method),
                summary.passes,
                summary.tokens,
                f"{summary.mat:.2f}",
                f"{times[method]:.3f}",
                speedup,
                identical,
            ]
        )
    return rows


def _tokens(steps: Sequence[StepRecord]) -> list[int]:
    return [t for s in steps for t in s.new_tokens]


def compare_strip_html(
    runs: Mapping[str, Sequence[StepRecord]], reference: str = "ar", limit: int = 400
) -> str:
    """A grid over the answer: rows = methods, columns = tokens, a cell filled with the source's
    colour where that method got the token from an accepted draft (empty: the target's own token;
    ``≠``: the method's output differs from the reference there).
    """
    if not runs:
        return (
            '<div class="recap-strip-empty">Run a comparison to see which method drafted which token.</div>'
        )
    base = reference if reference in runs else next(iter(runs))
    texts = [t for s in runs[base] for t in s.new_texts][:limit]
    ref_tokens = _tokens(runs[base])
    head = "".join(
        f'<th title="{html.escape(visible_token(t, True))}">{html.escape(visible_token(t, True))}</th>'
        for t in texts
    )
    rows = [f'<tr><th class="recap-strip-method">token</th>{head}</tr>']
    for method, steps in runs.items():
        tokens, sources = _tokens(steps), token_sources(steps)
        cells = []
        for i in range(len(texts)):
            if i >= len(tokens) or tokens[i] != ref_tokens[i]:
                cells.append('<td class="recap-strip-diff" title="differs from the reference">≠</td>')
            elif sources[i] != "target":
                color = source_color(sources[i])
                cells.append(
                    f'<td style="background:{color}" title="{html.escape(source_label(sources[i]))}"></td>'
                )
            else:
                cells.append('<td title="target (not drafted)"></td>')
        drafted = sum(1 for s in sources if s != "target")
        rows.append(
            f'<tr><th class="recap-strip-method">{html.escape(method_label(method))}'
            f" <small>{drafted}/{len(tokens)}</small></th>{''.join(cells)}</tr>"
        )
    legend = "".join(
        f'<span class="recap-chip" style="background:{source_color(s)}"></span>'
        f"{html.escape(source_label(s))} "
        for s in _sources_in([step for steps in runs.values() for step in steps])
        if s != "target"
    )
    return (
        f'<div class="recap-strip"><table>{"".join(rows)}</table></div>'
        f'<div class="recap-strip-legend">filled = drafted and accepted: {legend}</div>'
    )


# ---------------------------------------------------------------------------------- sensitivity
def sensitivity_rows(runs: Mapping[str, Sequence[StepRecord]], flags: Sequence[bool]) -> list[list]:
    """Per method: drafted/total tokens at image-sensitive and insensitive positions (not the first).

    ``flags`` mark the positions of the first run's answer (the reference the sensitivity pass
    forced); a method is counted only where its answer agrees with it (`split_against_reference`).
    """
    if not runs:
        return []
    reference = _tokens(next(iter(runs.values())))
    rows = []
    for method, steps in runs.items():
        split = split_against_reference(_tokens(steps), token_sources(steps), reference, flags)
        rows.append(
            [
                method_label(method),
                _rate(split.sensitive_drafted, split.sensitive_total),
                _rate(split.insensitive_drafted, split.insensitive_total),
            ]
        )
    return rows


def _rate(drafted: int, total: int) -> str:
    return f"{drafted}/{total} ({100 * drafted / total:.0f}%)" if total else "0/0 (-)"

"""Pure renderers for the studio: `StepRecord`s in, HTML strings / Gradio values / table rows out.

Nothing here decodes or touches a model or imports gradio, but the values are in Gradio's formats
(spans for ``gr.HighlightedText``, rows for ``gr.Dataframe``, HTML with the CSS classes of
assets/static/studio.css), which is why this lives in the studio and not in the library core. Every
function is a plain value transformation, so the visual layer is unit-tested without a browser:

- a *source* is what proposed a token (``ctx3``, ``ctx2``, ``persistent``, ``suffix``, ``template``,
  ``lookup``) or ``target`` for the bonus token the target produced itself;
- `highlighted_answer` returns the value of a ``gr.HighlightedText`` (``[(text, label), ...]``) whose
  labels are `SOURCE_LABELS` and whose colours are `highlight_color_map()`;
- the passes chart is a `plotly.graph_objects.Figure` (the step panel's are in `recap.studio.ui.figures`);
  the step table's and the sensitivity table's rows are `recap.studio.ui.tables`'.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from recap.bench.sensitivity import token_ids, token_sources, token_texts
from recap.studio.ui.drawing import (
    MAX_DRAW_ROWS,
    MAX_TRIED,
    NAME_CHARS,
    TEXT_CHARS,
    SourceSeries,
    bar_width,
    cut,
)
from recap.studio.ui.explain import explain_step
from recap.trace import StepRecord, summarize
from recap.tree import SOURCE_TABLE

#: Colour of each source (from `recap.tree.SOURCE_TABLE`, the one table of sources).
SOURCE_COLORS: dict[str, str] = {s.name: s.color for s in SOURCE_TABLE}

#: The legend text of each source (what a visitor reads next to the colour).
SOURCE_LABELS: dict[str, str] = {s.name: s.meaning for s in SOURCE_TABLE}

#: Display names of the methods the studio offers.
METHOD_LABELS: dict[str, str] = {
    "recap": "RECAP",
    "tr": "Token Recycling",
    "pld": "Prompt lookup",
    "suffix": "SuffixDecoding",
    "ar": "Autoregressive",
}

SENSITIVE_LABEL = "image-sensitive"
SENSITIVE_COLOR = "#EE3377"


#: Short names, where a phone's Compare strip has no room for the display names (studio.css).
METHOD_SHORT_LABELS = {"recap": "RECAP", "tr": "TR", "pld": "PLD", "suffix": "SuffixDec.", "ar": "AR"}


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def source_label(source: str) -> str:
    """A source's legend text: the studio's words for its own sources, another name (a replayed trace's)
    cut to `recap.studio.ui.drawing.NAME_CHARS`."""
    return SOURCE_LABELS.get(source) or cut(source, NAME_CHARS)


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


_MARKDOWN_PUNCTUATION = re.compile(r"([!-%'-/:<-@\[-`{-~])")  # ASCII punctuation except & and ;


def markdown_text(text: object, limit: int = 80) -> str:
    """``text`` (from a visitor or a trace) shown literally inside ``gr.Markdown``: one line, cut to
    ``limit`` characters, HTML-escaped and with Markdown punctuation backslash-escaped, so no tag,
    link, image or emphasis survives."""
    visible = visible_token(str(text))
    visible = visible if len(visible) <= limit else visible[: limit - 1] + "…"
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(visible, quote=False))


def token_word(piece: str) -> str:
    """A token as a reader says it, for a label on show: its leading and trailing spaces left out (a
    token of spaces only shows them as ␣), control characters visible; the spaces and ids are for
    tooltips."""
    return visible_token(piece.strip()) if piece.strip() else visible_token(piece, spaces=True)


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


# ------------------------------------------------------------------------------------------ memory
#: How a memory's starting point reads in the memory line (`recap.hotstart.Origin`).
ORIGIN_WORDS: dict[str, str] = {
    "shipped": "started from the shipped memory (warmed on training scenes)",
    "file": "started from the operator's memory file",
    "warm-up": "started from a warm-up on the examples",
    "empty": "started empty",
}


@dataclass(frozen=True)
class MemoryState:
    """What the memory line shows: the scope, tokens known of the vocabulary (None: the model is not
    loaded yet), where the memory started (`ORIGIN_WORDS`), a note (why a file did not load), and how
    many 2- and 3-token contexts the contextual memories hold (None: not counted); ``emptied``: the
    visitor emptied it before the model loaded (its first run then starts empty)."""

    scope: str
    tokens: int | None = None
    vocab: int | None = None
    origin: str = "empty"
    note: str = ""
    contexts: int | None = None
    emptied: bool = False


def memory_state_html(state: MemoryState) -> str:
    """One line about the memories RECAP's next run drafts from: warm or cold, tokens known (and
    contexts held, once runs have written some), scope and starting point. Example: ``RECAP's memory
    (per session): warm, 84 of 460 tokens known, 1,203 2- and 3-token contexts; started from the
    shipped memory (warmed on training scenes).``"""
    scope = html.escape(state.scope, quote=False)
    if state.tokens is None:
        start = "empty (you reset it)" if state.emptied else "from the model's starting memory"
        body = f"loads with the model on your first run, {start}."
    else:
        warmth = "warm" if state.tokens > 0 else "cold"
        known = (
            f"{state.tokens} of {state.vocab} tokens known" if state.vocab else f"{state.tokens} tokens known"
        )
        if state.contexts:
            known += f", {state.contexts:,} 2- and 3-token contexts"
        origin = ORIGIN_WORDS.get(state.origin, "started empty")
        body = f'<span class="recap-{warmth}">{warmth}</span>, {known}; {html.escape(origin, quote=False)}.'
    note = f" <small>({html.escape(state.note, quote=False)})</small>" if state.note else ""
    # (RECAP's: TR's matrix and SuffixDecoding's tree learn beside it; AR and prompt lookup keep none)
    return f'<div class="recap-memory"><b>RECAP\'s memory</b> ({scope}): {body}{note}</div>'


# ----------------------------------------------------------------------------------------- answer
def highlighted_answer(steps: Sequence[StepRecord], upto: int | None = None) -> list[tuple[str, str | None]]:
    """The answer so far as ``gr.HighlightedText`` spans, one per token, labelled by its source.

    ``upto``: only steps ``0..upto`` (to show the answer as it stood at a step). Newlines stay real
    newlines (so paragraphs look right); other control characters are made visible. Labels are the
    sources' series (`recap.studio.ui.drawing.SourceSeries`: past a dozen sources, the rest are one label).
    """
    shown_steps = steps[: None if upto is None else upto + 1]
    series = SourceSeries.of_tokens(shown_steps)
    spans: list[tuple[str, str | None]] = []
    for step in shown_steps:
        for text, source in zip(step.new_texts, step.new_sources):
            shown = "\n".join(visible_token(part) if part else "" for part in text.split("\n"))
            spans.append((shown, source_label(series.series(source))))
    return spans


def sensitivity_answer(steps: Sequence[StepRecord], flags: Sequence[bool]) -> list[tuple[str, str | None]]:
    """The answer with image-sensitive tokens labelled `SENSITIVE_LABEL` (others unlabelled)."""
    texts = token_texts(steps)
    return [
        (
            "\n".join(visible_token(p) if p else "" for p in text.split("\n")),
            SENSITIVE_LABEL if flag else None,
        )
        for text, flag in zip(texts, flags)
    ]


# ------------------------------------------------------------------------------------------ stats
def stats_html(steps: Sequence[StepRecord], status: str = "") -> str:
    """Five headline figures as cards: target passes, tokens, mean accepted tokens per pass, tokens/s
    and drafting ms per pass.

    Tokens/s is the wall clock of the steps' own timed phases (draft + verify + update), so a display
    delay between streamed updates is not counted, and the card says it is wall clock (what a visitor
    waits; other visitors' runs on the machine slow it too). The drafting card is the drafter's CPU
    time in the decoding thread (`recap.trace.RunSummary.draft_cpu_ms_per_step`): drafting runs there
    on every device, and its wall time would also count the moments other threads (another visitor's
    run, the server's own work) or processes held the machine. A trace that recorded no CPU times (an
    older saved run) shows the wall time, and says so.
    """
    summary = summarize(steps)
    # a run that records CPU times keeps the CPU label from its first pass on (the prefill drafts nothing),
    # and the empty page has the label every run gets
    if not steps or summary.draft_cpu_ms_per_step > 0 or any(s.cpu_ms > 0 for s in steps):
        drafting = ("draft + update ms / pass (CPU time)", summary.draft_cpu_ms_per_step)
    else:
        drafting = ("draft + update ms / pass (wall clock)", summary.draft_ms_per_step)
    cards = [
        ("target passes", f"{summary.passes}"),
        ("tokens", f"{summary.tokens}"),
        ("MAT (tokens a pass)", f"{summary.mat:.2f}"),
        ("tokens / s (wall clock)", f"{summary.tokens_per_s:.1f}"),
        (drafting[0], f"{drafting[1]:.2f}"),
    ]
    body = "".join(
        f'<div class="recap-card"><div class="recap-card-value">{html.escape(value if steps else "–")}</div>'
        f'<div class="recap-card-label">{html.escape(label)}</div></div>'
        for label, value in cards  # (no run yet: a dash, not a 0 that reads as a result)
    )
    note = f'<div class="recap-card-status">{html.escape(status)}</div>' if status else ""
    # the sources the answer's tokens came from: the answer's legend names only these (studio.css);
    # at most a dozen (`_sources_in`)
    shown = html.escape("|" + "".join(f"{source}|" for source in _sources_in(steps)))
    return f'<div class="recap-cards" data-sources="{shown}">{body}</div>{note}'


TOKENS_TITLE = {"text": "tokens", "font": {"size": 11}}


def passes_figure(steps: Sequence[StepRecord]) -> go.Figure:
    """Tokens committed by each target pass, stacked by source (a live view of acceptance): a bar series
    per source (at most a dozen: the rest stacked as one), a bar per step, or past
    `recap.studio.ui.drawing.MAX_BARS` steps a bar per `bar_width` steps (their tokens summed)."""
    figure = go.Figure()
    series = SourceSeries.of_tokens(steps)
    order = series.order
    width = bar_width(len(steps))
    x = [s.step for s in steps[::width]]
    counts = {source: [0] * len(x) for source in order}
    for i, step in enumerate(steps):
        for source in step.new_sources:
            counts[series.series(source)][i // width] += 1
    for source in order:
        figure.add_bar(
            x=x, y=counts[source], name=plot_name(source_label(source)), marker_color=source_color(source)
        )
    tallest = max((sum(bar) for bar in zip(*counts.values())), default=0)
    # a tick per token up to 6, whole numbers only beyond (a 15-token pass stacked 15 labels)
    ticks = {"dtick": 1} if tallest <= 6 else {"nticks": 6, "tickformat": "d"}
    figure.update_layout(
        barmode="stack",
        height=230,
        margin={"l": 48, "r": 10, "t": 40, "b": 30},  # (the top clear of the plot's label badge)
        xaxis_title="step (colours: the answer's legend)" if width == 1 else f"step ({width} steps a bar)",
        # the sources' colours are the answer's, whose legend sits above: no legend of its own; a little
        # room above the tallest bar, so that its tick's label is not cut by the plot's top edge
        yaxis={**ticks, "range": [0, max(tallest, 1) * 1.08], "title": TOKENS_TITLE},
        showlegend=False,
    )
    return figure


def _sources_in(steps: Sequence[StepRecord]) -> list[str]:
    """The sources of the committed tokens, the studio's own first, at most a dozen (the rest folded)."""
    return SourceSeries.of_tokens(steps).order


# ---------------------------------------------------------------------------------- step words
def step_words_html(step: StepRecord | None, token_text: Mapping[int, str] | None = None) -> str:
    """The step in plain words (`explain.explain_step`), then, for a sampled step, each verified
    position's draw: the children tried with the target's probability ``p`` of each (accepted or
    rejected), and a mark on a token drawn from the residual. All text is escaped exactly once.

    ``token_text``: texts of token ids (defaults to what the step itself names: nodes and new tokens).
    """
    if step is None:
        return '<div class="recap-words"><p>Run a generation to see each step explained here.</p></div>'
    words = f"<p>{html.escape(explain_step(step), quote=False)}</p>"
    return f'<div class="recap-words">{words}{_draws_html(step, token_text)}</div>'


def _draws_html(step: StepRecord, token_text: Mapping[int, str] | None) -> str:
    if not step.draws:
        return ""
    texts = dict(token_text or {})
    for node in step.nodes:
        texts.setdefault(node.token, node.text)
    for token, text in zip(step.new_tokens, step.new_texts):
        texts.setdefault(token, text)

    def name(token: int) -> str:
        text = cut(texts.get(token, f"[{token}]"), TEXT_CHARS)
        return html.escape(visible_token(text, spaces=True), quote=False)

    rows = []
    for position, draw in enumerate(step.draws[:MAX_DRAW_ROWS]):
        tried = []
        everything = draw.get("tried", [])
        for token, p in everything[:MAX_TRIED]:
            accepted = token == draw.get("token") and not draw.get("residual")
            mark, cls = ("✓ accepted", "recap-accepted") if accepted else ("✗ rejected", "recap-rejected")
            tried.append(f'<span class="{cls}">«{name(token)}» p={float(p):.3f} {mark}</span>')
        outcome = f"«{name(draw.get('token'))}»"
        if draw.get("residual"):  # (nothing tried: the residual is the target's whole distribution)
            source = "the residual" if tried else "the target's distribution"
            outcome += f' <span class="recap-residual">drawn from {source}</span>'
        if len(everything) > MAX_TRIED:
            tried.append(f"<span>and {len(everything) - MAX_TRIED} more</span>")
        children = "".join(tried) or "no child drafted here"
        rows.append(f"<tr><td>{position + 1}</td><td>{children}</td><td>{outcome}</td></tr>")
    head = "<tr><th>position</th><th>children tried (target's p)</th><th>committed</th></tr>"
    more = len(step.draws) - MAX_DRAW_ROWS
    tail = f'<tr><td colspan="3">and {more} more positions, not shown</td></tr>' if more > 0 else ""
    return f'<table class="recap-draws">{head}{"".join(rows)}{tail}</table>'


# ------------------------------------------------------------------------------------- compare
_DEPENDS = ' class="recap-strip-depends"'


def compare_strip_html(
    runs: Mapping[str, Sequence[StepRecord]],
    reference: str = "ar",
    limit: int = 400,
    flags: Sequence[bool] | None = None,
) -> str:
    """A grid over the answer: rows = methods, columns = tokens, a cell filled with the source's
    colour where that method got the token from an accepted draft (empty: the target's own token;
    ``≠``: the method's output differs from the reference there). ``flags``: the reference answer's
    image-dependent tokens (the story line's), underlined in the token row.
    """
    if not runs:
        return (
            '<div class="recap-strip-empty">Run a comparison to see which method drafted which token.</div>'
        )
    base = reference if reference in runs else next(iter(runs))
    texts = token_texts(runs[base])[:limit]
    ref_tokens = token_ids(runs[base])
    flags = [False, *list(flags or ())[1 : len(texts)]]  # the first token is never counted (the story's)
    flags += [False] * (len(texts) - len(flags))
    head = "".join(
        f'<th{_DEPENDS if flag else ""} title="{html.escape(visible_token(t, True))}'
        f'{" (depends on the image)" if flag else ""}">{html.escape(token_word(t))}</th>'
        for t, flag in zip(texts, flags)
    )
    rows = [f'<tr><th class="recap-strip-method">token</th>{head}</tr>']
    for method, steps in runs.items():
        tokens, sources = token_ids(steps), token_sources(steps)
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
        full = html.escape(method_label(method))
        short = html.escape(METHOD_SHORT_LABELS.get(method, method_label(method)))
        rows.append(  # the full name, or on a phone the short one (studio.css), the full one on hover
            f'<tr><th class="recap-strip-method" title="{full}: {drafted} of {len(tokens)} tokens drafted">'
            f'<span class="recap-name-full">{full}</span><span class="recap-name-short">{short}</span>'
            f" <small>{drafted}/{len(tokens)}</small></th>{''.join(cells)}</tr>"
        )
    legend = "".join(  # a chip and its label never wrap apart
        f'<span style="white-space:nowrap"><span class="recap-chip" style="background:{source_color(s)}">'
        f"</span>{html.escape(source_label(s))}</span> "
        for s in _sources_in([step for steps in runs.values() for step in steps])
        if s != "target"
    )
    depends = ""
    if any(flags):
        underlined = '<span class="recap-strip-depends">underlined</span>'
        shown = " shown" if len(ref_tokens) > len(texts) else ""
        depends = f" · {underlined} = depends on the image ({sum(flags)}{shown}; the first token not counted)"
    # shown only while the strip is wider than its box (studio.css: a scroll-driven animation, no script)
    more = '<p class="recap-strip-more recap-hint">The strip is wider than its box: scroll it sideways →</p>'
    return (
        f'<div class="recap-strip-box">{more}'
        f'<div class="recap-strip"><table>{"".join(rows)}</table></div></div>'
        f'<div class="recap-strip-legend">filled = drafted and accepted: {legend}{depends}</div>'
    )

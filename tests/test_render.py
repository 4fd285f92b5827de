"""The studio's renderers (`recap.studio.ui.render`, with its `figures` and `tables`) on hand-built step
records (no model, no browser)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recap.studio.ui import figures, render, tables
from recap.studio.ui.drawing import MAX_TREE_NODES
from recap.trace import FusedRecord, NodeRecord, StepRecord
from recap.tree import SOURCE_TABLE


def _node(id, parent, token, text, depth, sources, contributions, accepted, score=0.5):
    return NodeRecord(id, parent, token, text, depth, score, list(sources), dict(contributions), accepted)


def _steps() -> list[StepRecord]:
    """Prefill 'x', then one step: tree a->b (accepted) ->d, and c (rejected); bonus 'e'."""
    prefill = StepRecord(
        0, 4, "recap", new_tokens=[5], new_texts=["x"], new_sources=["target"], target_token=5
    )
    nodes = [
        _node(0, -1, 7, "a", 1, ["ctx3", "persistent"], {"ctx3": 0.3, "persistent": 0.1}, True, 0.4),
        _node(1, 0, 8, " b", 2, ["ctx2"], {"ctx2": 0.5}, True, 0.2),
        _node(2, -1, 9, "c", 1, ["suffix"], {"suffix": 0.2}, False, 0.2),
        _node(3, 1, 10, "d", 3, ["persistent"], {"persistent": 0.1}, False, 0.02),
    ]
    step = StepRecord(
        1,
        5,
        "recap",
        nodes=nodes,
        accepted_ids=[0, 1],
        bonus_token=11,
        new_tokens=[7, 8, 11],
        new_texts=["a", " b", "e"],
        new_sources=["ctx3", "ctx2", "target"],
        fused_at_root=[
            FusedRecord(7, "a", 0.4, {"ctx3": 0.3, "persistent": 0.1}),
            FusedRecord(9, "c", 0.2, {"suffix": 0.2}),
        ],
        target_token=7,
        target_prob=0.6,
        timing={"draft_ms": 1.0, "verify_ms": 2.0, "update_ms": 0.5},
    )
    return [prefill, step]


def _trace(figure, name):
    matches = [t for t in figure.data if t.name == name]
    assert matches, f"no trace {name!r} in {[t.name for t in figure.data]}"
    return matches[0]


def _node_traces(figure):
    return [t for t in figure.data if t.customdata is not None]


def test_tree_figure_draws_every_node_coloured_by_its_main_source():
    figure = figures.tree_figure(_steps()[1], root_text="x")
    traces = _node_traces(figure)
    assert sum(len(t.x) for t in traces) == 4
    by_source = {t.name: t for t in traces}
    # node 0: ctx3 contributes most -> ctx3 colour, outlined in persistent's colour (mixed sources)
    ctx3 = by_source["ctx3"]
    assert ctx3.marker.color == render.SOURCE_COLORS["ctx3"] and list(ctx3.customdata) == [0]
    assert ctx3.marker.line.color[0] == render.SOURCE_COLORS["persistent"] and ctx3.marker.line.width[0] == 3
    suffix = by_source["suffix"]
    assert suffix.marker.color == render.SOURCE_COLORS["suffix"]
    assert suffix.marker.opacity[0] < 1  # rejected: faded
    assert "suffix: 100%" in suffix.hovertext[0] and "rejected" in suffix.hovertext[0]
    assert not any("this image's own records" in h for t in traces for h in t.hovertext)
    assert "records of earlier requests<br>(other images)" in ctx3.hovertext[0]  # not this request's
    assert "earlier requests" not in suffix.hovertext[0]  # no contextual record proposed it
    step = _steps()[1]
    step.nodes[0].this_request = True  # a record this request wrote proposed node 0
    hover = next(t for t in _node_traces(figures.tree_figure(step)) if t.name == "ctx3").hovertext[0]
    assert "from this image's own records" in hover and "earlier requests" not in hover


def test_tree_figure_highlights_the_accepted_path_and_the_bonus_token():
    figure = figures.tree_figure(_steps()[1])
    path = _trace(figure, "accepted path")
    assert len([x for x in path.x if x is not None]) == 4  # two edges: root->a, a->b
    assert path.line.width > _trace(figure, "edges").line.width
    bonus = _trace(figure, "bonus")
    assert list(bonus.text) == ["e"] and bonus.x[0] == 3  # one past b (depth 2)
    # beside b, in the first row below it that its column (d's) and its label's leave free: c's row
    _, places = figures.tree_layout(_steps()[1].nodes)
    assert places[3].y == places[1].y and bonus.y[0] == places[1].y + 1 == places[2].y
    assert figure.layout.yaxis.range[0] == max(p.y for p in places.values()) + 0.7  # no row added for it
    # the whole tree accepted: the bonus hangs right of the deepest node, with room for its label
    step = _steps()[1]
    step.nodes = step.nodes[:3]
    whole = figures.tree_figure(step)
    assert whole.layout.xaxis.range[1] >= _trace(whole, "bonus").x[0] + 0.9
    assert _trace(whole, "bonus").y[0] == _trace(whole, "accepted path").y[-2]  # on b's row: nothing there
    # lines first, markers over them: no edge is drawn over the root's or a node's marker
    names = [t.name for t in figure.data]
    assert names.index("bonus edge") < names.index("root") and names[:2] == ["edges", "accepted path"]
    accepted_sizes = [
        s for t in _node_traces(figure) for s, n in zip(t.marker.size, t.customdata) if n in (0, 1)
    ]
    rejected_sizes = [
        s for t in _node_traces(figure) for s, n in zip(t.marker.size, t.customdata) if n in (2, 3)
    ]
    assert min(accepted_sizes) > max(rejected_sizes)


def test_tree_legend_draws_each_source_once_in_a_plain_marker():
    # the node traces stay out of the legend (it would draw their first node: size, fade, an outline
    # in another source's colour); one legend-only entry per source, in the same group
    figure = figures.tree_figure(_steps()[1])
    assert not any(t.showlegend is not False for t in _node_traces(figure))
    entries = [t for t in figure.data if t.customdata is None and t.legendgroup]
    assert sorted(t.name for t in entries) == sorted(t.name for t in _node_traces(figure))
    for entry in entries:
        assert entry.marker.size == 11 and entry.marker.line.width == 1 and entry.marker.opacity is None
        assert entry.marker.color == render.source_color(entry.name) and list(entry.x) == [None]


def test_tree_columns_ask_for_room_and_end_at_the_deepest_label():
    figure = figures.tree_figure(_steps()[1])  # nodes to depth 3, bonus at depth 3
    assert figure.layout.xaxis.range[1] < 4  # no empty column past the deepest node
    assert list(figure.layout.xaxis.ticktext)[:2] == ["depth 0", "1"]
    chain = [_node(i, i - 1, 1, "a", i + 1, ["ctx3"], {"ctx3": 0.5}, False) for i in range(12)]
    deep = figures.tree_figure(StepRecord(1, 4, "recap", nodes=chain))
    shallow = figures.tree_figure(StepRecord(1, 4, "recap", nodes=chain[:2]))
    # the script (assets/static/studio.js) gives the plot this width: ~47 px a column, so 13 columns
    # are wider than a phone's panel and 3 are not
    assert shallow.layout.meta["min_width"] < 330 < deep.layout.meta["min_width"]
    assert deep.layout.xaxis.range[1] < 12.9
    endless = [_node(i, i - 1, 1, "a", i + 1, ["ctx3"], {"ctx3": 0.5}, False) for i in range(500)]
    assert figures.tree_figure(StepRecord(1, 4, "recap", nodes=endless)).layout.meta["min_width"] <= 2400


def test_punctuation_labels_in_the_tree_are_not_specks():
    step = _steps()[1]
    step.nodes[2].text, step.nodes[3].text = ".", " b."
    labels = {
        n: t
        for tr in _node_traces(figures.tree_figure(step, root_text=":"))
        for n, t in zip(tr.customdata, tr.text)
    }
    assert labels[2] == "«.»" and labels[3] == "b." and labels[0] == "a"
    step.nodes[2].text = "\n"
    assert "«↵»" in [t for tr in _node_traces(figures.tree_figure(step)) for t in tr.text]
    assert _trace(figures.tree_figure(step, root_text=":"), "root").text == ("«:»",)


def test_tree_labels_read_as_the_tokens_read_and_the_hover_keeps_spaces_and_ids():
    # « red» reads "red" beside its node (the root and the bonus too); the hover shows «␣red» and its id
    step = _steps()[1]
    step.nodes[0].text, step.new_texts[-1] = " red", " e"
    figure = figures.tree_figure(step, root_text=" x")
    labels = [t for trace in figure.data if trace.text for t in trace.text]
    assert "red" in labels and _trace(figure, "root").text == ("x",)
    assert _trace(figure, "bonus").text == ("e",)
    assert not any("␣" in label or "id" in label for label in labels)
    hover = next(t for t in _node_traces(figure) if 0 in t.customdata).hovertext[0]
    assert hover.startswith("<b>␣red</b> (id ")


def test_tree_hover_lines_are_short_enough_for_a_phone():
    step = _steps()[1]
    step.nodes[0].this_request, step.nodes[0].fan = True, 3
    step.nodes[0].sources = ["ctx3", "ctx2", "persistent", "suffix"]
    step.nodes[0].text = " " + "w" * 60
    hover = next(t for t in _node_traces(figures.tree_figure(step)) if 0 in t.customdata).hovertext[0]
    lines = [line.replace("<b>", "").replace("</b>", "") for line in hover.split("<br>")]
    assert max(len(line) for line in lines) <= figures.HOVER_CHARS + len(" (id 123)"), lines
    assert "sources: ctx3, ctx2," in lines and "persistent, suffix" in lines


def test_tree_layout_puts_children_right_of_parents_and_rows_apart():
    root, places = figures.tree_layout(_steps()[1].nodes)
    assert root.x == 0 and [places[i].x for i in range(4)] == [1, 2, 1, 3]
    assert len({places[i].y for i in (2, 3)}) == 2


def test_prefill_and_empty_steps_still_draw_the_root():
    steps = _steps()
    figure = figures.tree_figure(steps[0])
    assert "prefill" in figure.layout.title.text and _trace(figure, "root").x == (0,)
    empty = StepRecord(2, 8, "ar", new_tokens=[3], new_texts=["z"], new_sources=["target"], bonus_token=3)
    assert "nothing drafted" in figures.tree_figure(empty).layout.title.text
    # a two-line title starts a line lower than a one-line one (the panel's label badge sits above)
    one_line = figures.tree_figure(steps[1]).layout.title.pad.t
    assert "<br>" not in figures.tree_figure(steps[1]).layout.title.text
    assert figure.layout.title.pad.t > one_line


def test_fused_figure_stacks_sources_and_marks_the_target_token():
    figure = figures.fused_figure(_steps()[1])
    bars = {t.name: list(t.x) for t in figure.data if t.type == "bar"}
    assert bars[render.source_label("ctx3")] == pytest.approx([0.3, 0.0])
    assert bars[render.source_label("persistent")] == pytest.approx([0.1, 0.0])
    assert bars[render.source_label("suffix")] == pytest.approx([0.0, 0.2])
    star = _trace(figure, "target's next token")
    rows = list(figure.layout.yaxis.ticktext)
    assert rows[star.y[0]] == "a" and star.x[0] == pytest.approx(0.4)
    assert list(star.customdata) == ["a (id 7)"]  # the id in the hover, not on the axis
    assert "target chose «a»" in figure.layout.title.text and "[" not in "".join(rows)
    # the chance in the title is the target's, not the fused bar's (which may read near 0)
    step = replace(_steps()[1], target_prob=0.97)
    assert "target chose «a» (target's own p=0.97)" in figures.fused_figure(step).layout.title.text


def test_fused_rows_read_as_the_tokens_read_and_keep_a_row_each():
    # " a" and "a" read alike on the axis: each keeps its row; the space marker is in the hover
    step = _steps()[1]
    step.fused_at_root = [FusedRecord(7, "a", 0.4, {"ctx3": 0.4}), FusedRecord(8, " a", 0.3, {"ctx2": 0.3})]
    figure = figures.fused_figure(step)
    assert list(figure.layout.yaxis.ticktext) == ["a", "a"]
    hovers = {h for t in figure.data if t.type == "bar" for h in t.customdata}
    assert hovers == {"a (id 7)", "␣a (id 8)"}


def test_fused_figure_fades_the_tokens_not_drafted_under_the_root():
    step = _steps()[1]
    step.fused_at_root.append(FusedRecord(12, "f", 0.3, {"ctx2": 0.3}))  # likelier than «c», not drafted
    figure = figures.fused_figure(step)
    rows = list(figure.layout.yaxis.ticktext)
    for bar in (t for t in figure.data if t.type == "bar"):
        opacity = {rows[y]: o for y, o in zip(bar.y, bar.marker.opacity)}
        assert opacity["a"] == opacity["c"] == 1.0 and opacity["f"] < 1.0
    assert "faded: not drafted" in figure.layout.title.text


def test_fused_figure_adds_a_row_when_the_drafter_missed_the_target_token():
    step = _steps()[1]
    step.target_token, step.new_tokens[0] = 42, 42
    step.new_texts[0] = "q"
    figure = figures.fused_figure(step)
    star = _trace(figure, "target's next token")
    rows = list(figure.layout.yaxis.ticktext)
    assert rows[star.y[0]] == "q" and star.x[0] == 0.0 and list(star.customdata) == ["q (id 42)"]
    assert star.y[0] == len(rows) - 1  # a row of its own, below the drafter's


def test_contributions_are_scaled_to_the_fused_probability():
    step = _steps()[1]
    step.fused_at_root = [FusedRecord(7, "a", 0.4, {"ctx3": 3.0, "ctx2": 1.0})]  # shares, not parts
    bars = {t.name: t.x[0] for t in figures.fused_figure(step).data if t.type == "bar"}
    assert sum(bars.values()) == pytest.approx(0.4)


def test_highlighted_answer_labels_every_token_by_source():
    spans = render.highlighted_answer(_steps())
    assert spans == [
        ("x", render.source_label("target")),
        ("a", render.source_label("ctx3")),
        (" b", render.source_label("ctx2")),
        ("e", render.source_label("target")),
    ]
    assert render.highlighted_answer(_steps(), upto=0) == spans[:1]
    assert set(render.highlight_color_map()) >= {label for _, label in spans}


@pytest.mark.parametrize(
    ("piece", "spaces", "shown"),
    [
        ("\x00", False, "\\x00"),  # control characters become visible
        ("a\nb", False, "a↵b"),
        (" cat", True, "␣cat"),  # in the tree, a leading space matters
        (" cat", False, " cat"),
        ("", False, "∅"),
    ],
)
def test_visible_token(piece, spaces, shown):
    assert render.visible_token(piece, spaces) == shown


def test_step_table_and_stats():
    rows = dict(tables.step_table(_steps()[1]))
    assert (
        rows["nodes drafted"] == 4 and rows["accepted drafted tokens"] == 2 and rows["tokens committed"] == 3
    )
    assert rows["draft ms (wall)"] == 1.0 and rows["drafting sources"] == "ctx2, ctx3, persistent, suffix"
    html = render.stats_html(_steps())
    assert ">2<" in html and ">4<" in html and ">2.00<" in html  # passes, tokens, MAT


def test_stats_time_drafting_in_cpu_time_when_recorded():
    """A pass whose drafting waited (wall 40 ms) but worked 0.3 ms of CPU shows the CPU time; a trace
    without CPU times (an older saved run) shows the wall time and says so."""
    steps = _steps()
    steps[1].timing = {"draft_ms": 30.0, "verify_ms": 2.0, "update_ms": 10.0}
    html = render.stats_html(steps)
    assert "draft + update ms / pass (wall clock)" in html and ">40.00<" in html
    steps[1].drafter_cpu_ms = 0.3
    html = render.stats_html(steps)
    assert "draft + update ms / pass (CPU time)" in html and ">0.30<" in html and ">40.00<" not in html
    assert "tokens / s (wall clock)" in html
    assert dict(tables.step_table(steps[1]))["draft + update CPU ms"] == 0.3


def test_stats_keep_the_cpu_label_while_only_the_prefill_has_run():
    """A run that records CPU times shows the CPU label from its first pass on: streamed, the card does
    not switch from wall clock to CPU time once the first drafting pass lands."""
    prefill = _steps()[:1]
    prefill[0].cpu_ms = 5.0
    assert "draft + update ms / pass (CPU time)" in render.stats_html(prefill)
    assert "draft + update ms / pass (CPU time)" in render.stats_html([])  # the empty page's cards too
    assert render.stats_html([]).count(">–<") == 5 and ">0<" not in render.stats_html([])  # no run: no 0s


def test_the_answer_legend_names_only_the_sources_of_the_answer():
    # the stats cards list the answer's sources; studio.css hides every legend item of another source
    # (gradio's legend draws the whole colour map), so a rule must exist for each colour a legend shows
    assert 'data-sources="|ctx3|ctx2|target|"' in render.stats_html(_steps())
    assert 'data-sources="|"' in render.stats_html([])
    steps = _steps()
    steps[1].new_sources = ['a"b', "ctx2", "target"]  # a replayed trace's source names: escaped
    assert 'data-sources="|ctx2|target|a&quot;b|"' in render.stats_html(steps)
    css = (Path(render.__file__).parents[3] / "assets" / "static" / "studio.css").read_text()
    for label, colour in render.highlight_color_map().items():
        source = next(s.name for s in SOURCE_TABLE if s.meaning == label)
        r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
        shown = f'#stats [data-sources*="|{source}|"]'
        rule = f'body:not(:has({shown})) #answer .legend-item[style*="rgba({r}, {g}, {b},"]'
        assert rule in css, f"no legend rule for {source}"


def _run(method, tokens, sources):
    return [
        StepRecord(
            0,
            3,
            method,
            new_tokens=list(tokens),
            new_texts=[f"t{t}" for t in tokens],
            new_sources=list(sources),
        )
    ]


def test_the_strip_s_token_row_reads_as_the_tokens_read():
    runs = {
        "ar": [StepRecord(0, 3, "ar", new_tokens=[1, 2], new_texts=[" a", " "], new_sources=["target"] * 2)]
    }
    strip = render.compare_strip_html(runs)
    assert 'title="␣a">a</th>' in strip  # the space marker in the tooltip only
    assert 'title="␣">␣</th>' in strip  # a token of spaces only shows them


def test_compare_strip():
    runs = {
        "ar": _run("ar", [1, 2, 3, 4], ["target"] * 4),
        "recap": _run("recap", [1, 2, 3, 4], ["target", "ctx3", "persistent", "target"]),
        "pld": _run("pld", [1, 2, 9, 4], ["target", "lookup", "lookup", "target"]),
    }
    strip = render.compare_strip_html(runs)
    assert strip.count("<tr>") == 4  # header + one row per method
    assert strip.count(f"background:{render.SOURCE_COLORS['ctx3']}") == 2  # a cell and the legend chip
    assert strip.count("≠") == 1  # PLD's third token differs from AR's
    assert "Prompt lookup" in strip and "2/4" in strip
    # a phone shows the short names (studio.css), the full one on hover; the hint is CSS's to show
    assert '<span class="recap-name-short">PLD</span>' in strip and 'title="Prompt lookup: 2 of 4' in strip
    assert strip.count('class="recap-strip-more') == 1
    assert "recap-strip-depends" not in strip and "depends on the image" not in strip  # no flags given
    # the story line's image-dependent tokens are underlined in the token row, and the legend says so
    marked = render.compare_strip_html(runs, flags=[True, True, False, True])
    assert marked.count('<th class="recap-strip-depends"') == 2  # the first token is not counted
    assert "underlined</span> = depends on the image (2; the first token not counted)" in marked
    cut = render.compare_strip_html(runs, limit=2, flags=[False, True, False, True])
    assert "depends on the image (1 shown;" in cut


def test_sensitivity_rows_and_answer():
    # the prefill's token, then one pass: an accepted ctx2 draft and the bonus
    runs = {"recap": [*_run("recap", [1], ["target"]), *_run("recap", [2, 3], ["ctx2", "target"])]}
    flags = [True, True, False]
    # the flagged second token came from an accepted draft at its pass's first draft
    assert tables.sensitivity_rows(runs, flags) == [["RECAP", "1/1 (100%)", "0/1 (0%)", "-", "1/1 · 0/0"]]
    deeper = {"recap": [*_run("recap", [1], ["target"]), *_run("recap", [2, 3], ["ctx2", "ctx3"])]}
    assert tables.sensitivity_rows(deeper, [False, False, True])[0][4] == "0/0 · 1/1"  # one draft deep
    from recap.bench.coverage import PositionCoverage as At

    held = {"recap": [None, At(("ctx2",), True, True, True), At((), False, True, False)]}
    assert tables.sensitivity_rows(runs, flags, held)[0][3] == "1/1 (100%); 1 from this image"
    spans = render.sensitivity_answer(runs["recap"], flags)
    assert [label for _, label in spans] == [render.SENSITIVE_LABEL, render.SENSITIVE_LABEL, None]


def test_passes_figure_stacks_tokens_by_source():
    figure = render.passes_figure(_steps())
    by_name = {t.name: list(t.y) for t in figure.data}
    assert by_name[render.source_label("target")] == [1, 1]
    assert by_name[render.source_label("ctx3")] == [0, 1]
    assert figure.layout.yaxis.dtick == 1  # short passes: a tick per token
    tokens = list(range(15))
    long = StepRecord(2, 8, "recap", new_tokens=tokens, new_texts=["x"] * 15, new_sources=["ctx3"] * 15)
    tall = render.passes_figure([*_steps(), long]).layout.yaxis
    assert tall.dtick is None and tall.nticks == 6 and tall.tickformat == "d"  # not 15 stacked labels


def test_steps_without_a_fused_distribution_name_the_target_token():
    step = _steps()[1]
    step.method, step.fused_at_root = "tr", []
    figure = figures.fused_figure(step)
    assert not [t for t in figure.data if t.type == "bar"]
    assert "Token Recycling drafts without probabilities" in figure.layout.title.text
    assert "the target chose «a»" in figure.layout.annotations[0].text


def test_plot_labels_escape_tags():
    # plotly reads HTML in labels: an end-of-sequence token "</s>" must show, not vanish as a tag
    step = _steps()[1]
    step.nodes[2].text = "</s>"
    traces = _node_traces(figures.tree_figure(step))
    suffix = next(t for t in traces if t.name == "suffix")
    assert list(suffix.text) == ["&lt;/s&gt;"]


HOSTILE = '<img src="http://127.0.0.1:9/x"><a href="http://evil">x</a>'


def _figure_strings(figure) -> list[str]:
    """Every string plotly would render from ``figure``: names, texts, hovers, templates, titles."""
    found = []

    def walk(value):
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(figure.to_plotly_json())
    return found


def test_names_from_a_trace_are_escaped_in_legends_hovers_and_titles():
    # a replayed trace can name any source or method: no tag of it may reach plotly's HTML renderer
    steps = _steps()
    step = steps[1]
    step.method = HOSTILE
    step.nodes[0].sources = [HOSTILE]
    step.nodes[0].contributions = {HOSTILE: 0.9}
    step.nodes[2].text = HOSTILE
    step.new_sources = [HOSTILE, "ctx2", "target"]
    step.fused_at_root[0].contributions = {HOSTILE: 0.4}
    step.fused_at_root[0].text = HOSTILE
    drawn = [
        figures.tree_figure(step, root_text=HOSTILE),
        figures.fused_figure(step),
        render.passes_figure(steps),
    ]
    step.fused_at_root = []
    drawn.append(figures.fused_figure(step))
    strings = [s for figure in drawn for s in _figure_strings(figure)]
    assert any("&lt;img" in s for s in strings), "the hostile names should be shown, escaped"
    assert not [s for s in strings if "<img" in s or "<a " in s]


def test_a_deep_chain_lays_out_without_recursion():
    chain = [_node(i, i - 1, 1, "a", i + 1, ["ctx3"], {"ctx3": 0.5}, i < 3) for i in range(5000)]
    root, places = figures.tree_layout(chain)
    assert len(places) == 5000 and places[4999].x == 5000 and root.y == places[4999].y == 0
    step = StepRecord(1, 4, "recap", nodes=chain, accepted_ids=[0, 1, 2])
    # a tree of over MAX_TREE_NODES nodes draws that many, the accepted path first, and says so
    drawn = figures.tree_figure(step)
    ids = sorted(i for t in _node_traces(drawn) for i in t.customdata)
    assert ids == list(range(MAX_TREE_NODES)) and f"({MAX_TREE_NODES} drawn" in drawn.layout.title.text


def test_step_words_explain_the_step_and_list_sampled_draws():
    step = _steps()[1]
    # position 1: child 7 accepted; position 2: child 8 accepted; position 3: child 10 rejected, the
    # bonus 11 drawn from the residual
    step.draws = [
        {"tried": [[7, 0.61]], "token": 7, "residual": False},
        {"tried": [[8, 0.3]], "token": 8, "residual": False},
        {"tried": [[10, 0.05]], "token": 11, "residual": True},
    ]
    shown = render.step_words_html(step)
    assert shown.startswith('<div class="recap-words"><p>Step 1: the drafter proposed 4 nodes')
    assert "«a» p=0.610 ✓ accepted" in shown and "«d» p=0.050 ✗ rejected" in shown
    assert shown.count("drawn from the residual") == 1 and "«e» <span" in shown
    # nothing drafted at a position (an autoregressive step): no child was removed from the distribution
    step.draws = [{"tried": [], "token": 11, "residual": True}]
    shown = render.step_words_html(step)
    assert "drawn from the target's distribution" in shown and "the residual" not in shown
    step.draws = None
    assert "recap-draws" not in render.step_words_html(step)


def test_step_words_escape_every_text_once():
    step = _steps()[1]
    step.nodes[0].text = "</s>"
    step.new_texts = ["</s>", " b", "<b>&"]
    step.draws = [{"tried": [[7, 0.5]], "token": 7, "residual": False}]
    shown = render.step_words_html(step)
    assert "&lt;/s&gt;" in shown and "&lt;b&gt;&amp;" in shown
    assert "<b>" not in shown and "</s>" not in shown and "&amp;lt;" not in shown


def test_the_about_tab_names_every_source_as_the_legend_does():
    from recap.studio.ui.layout import ABOUT

    about = " ".join(ABOUT.split())  # (the text wraps lines)
    labels = [label for source, label in render.SOURCE_LABELS.items() if source != "unknown"]
    missing = [label for label in labels if label not in about]
    assert not missing, f"the About tab does not name these legend entries: {missing}"


def test_a_replay_names_an_offered_model_as_the_page_does():
    from recap.studio.environment import EMBEDDED_V2_ID, model_label
    from recap.studio.ui.render import markdown_text
    from recap.studio.ui.traces import replay_status
    from recap.trace import RunTrace

    trace = RunTrace(settings={"model": EMBEDDED_V2_ID, "method": "pld"}, steps=_steps())
    shown = markdown_text(model_label(EMBEDDED_V2_ID))  # (the status is Markdown: escaped)
    assert replay_status(trace).startswith(f"Replaying a recorded Prompt lookup run of {shown} (")
    other = RunTrace(settings={"model": "someone/else", "method": "tr"}, steps=_steps())
    assert f"run of {markdown_text('someone/else')} (" in replay_status(other)  # not offered: its id

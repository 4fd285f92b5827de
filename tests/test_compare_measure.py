"""The Compare tab's numbers: timed phases, medians and ranges, the H200 projection, the summary line."""

from __future__ import annotations

import pytest

from recap.bench.metrics import SampleRun, aggregate
from recap.models.cost import CostModel, projected_seconds
from recap.studio.ui import measure
from recap.trace import NodeRecord, StepRecord


def _step(nodes: int, tokens: list[int], draft_ms: float = 1.0, verify_ms: float = 10.0) -> StepRecord:
    return StepRecord(
        1,
        3,
        "recap",
        nodes=[NodeRecord(i, -1, 5, "x", 1, 0.5, ["ctx2"], {}, False) for i in range(nodes)],
        new_tokens=tokens,
        new_texts=["t"] * len(tokens),
        new_sources=["target"] * len(tokens),
        timing={"draft_ms": draft_ms, "verify_ms": verify_ms, "update_ms": 0.5},
    )


def _run(method: str, passes: list[tuple[int, list[int]]]) -> list[StepRecord]:
    prefill = StepRecord(0, 3, method, new_tokens=[1], new_sources=["target"], timing={"verify_ms": 20.0})
    return [prefill, *(_step(n, t) for n, t in passes)]


FLAT = measure.Projection(CostModel([(1, 0.003), (64, 0.003)]), "a flat test curve")


def test_rows_show_nodes_medians_ranges_speedups_and_the_projection():
    runs = {
        "ar": _run("ar", [(0, [2]), (0, [3]), (0, [4])]),
        "recap": _run("recap", [(80, [2, 3]), (80, [4])]),
    }
    # each repeat's pass times: AR's totals 0.30, 0.30, 0.35 (median 0.30), RECAP's 0.08, 0.08, 0.06
    times = {
        "ar": [[0.10, 0.10, 0.10], [0.10, 0.05, 0.15], [0.20, 0.10, 0.05]],
        "recap": [[0.02, 0.06], [0.05, 0.03], [0.03, 0.03]],
    }
    ar, recap = measure.rows(runs, times, FLAT)
    assert recap[:5] == ["RECAP", "80.0", 3, 4, "1.33"]  # nodes per decoding pass; 4 tokens / 3 passes
    assert recap[5] == "0.080 (repeats 0.060-0.080)" and ar[5] == "0.300 (repeats 0.300-0.350)"
    assert recap[6] == "3.75x" and ar[6] == "1.00x"  # AR's median over the method's
    # projected: decoding passes at 3 ms each plus the drafting measured here (1.5 ms a pass: these
    # records hold no CPU times, so their wall-clock draft + update)
    assert recap[7] == f"0.009 s ({3 * 0.0045 / (2 * 0.0045):.2f}x)"
    assert recap[8] == ar[8] == "yes"
    # while the comparison runs, a method with fewer repeats than the header's says how many so far
    partial = measure.rows(runs, {"ar": times["ar"], "recap": times["recap"][:1]}, FLAT)[1]
    assert partial[5] == f"0.080 (1 of {measure.REPEATS} repeats so far)"


def _with_cpu(steps: list[StepRecord], drafter_ms: float, verify_ms: float) -> list[StepRecord]:
    """``steps`` as a run records them: each decoding pass's drafter and target CPU times (the prefill's
    the target's only)."""
    for index, step in enumerate(steps):
        step.drafter_cpu_ms = drafter_ms if index else 0.0
        step.cpu_ms = step.drafter_cpu_ms + verify_ms
    return steps


def test_the_projection_is_the_benchmarks_formula_on_the_same_passes_with_drafting_in_cpu_time():
    steps = _run("recap", [(80, [2, 3]), (12, [4]), (0, [5])])
    run = SampleRun.from_steps("s", steps, 1.0)
    ar = SampleRun.from_steps("s", _run("ar", [(0, [2]), (0, [3]), (0, [4]), (0, [5])]), 1.0)
    bench = aggregate("recap", [run], [ar], None, projection=FLAT.curve)
    # a record without CPU times (an old trace): its wall-clock drafting, as the benchmark reads it
    assert bench.projected_seconds == pytest.approx(measure.projected(steps, FLAT))
    assert bench.projected_seconds == pytest.approx(projected_seconds(FLAT.curve, [80, 12, 0], [1.5] * 3))
    # a run that records CPU times: the drafter's CPU time, never its wall-clock time (1.5 ms a pass,
    # which a busy machine stretches), is what the projection adds
    timed = _with_cpu(steps, drafter_ms=0.4, verify_ms=9.0)
    for step in timed[1:]:
        step.timing["draft_ms"] = 50.0  # a busy machine's wall clock: left out
    in_cpu_time = projected_seconds(FLAT.curve, [80, 12, 0], [0.4] * 3)
    assert measure.projected(timed, FLAT) == pytest.approx(in_cpu_time)
    assert [s.drafting_ms for s in timed[1:]] == [0.4] * 3


def test_no_projection_on_a_gpu_or_without_a_recorded_curve():
    assert measure.projection_for("assets/models/tiny-scenes-llava", "cuda") is None
    assert measure.projection_for("Qwen/Qwen2.5-VL-7B-Instruct", "cpu") is None
    own = measure.projection_for("assets/models/tiny-scenes-llava", "cpu")
    sibling = measure.projection_for("assets/models/tiny-scenes-llava-v2", "cpu")
    assert own is not None and "this model" in own.label
    assert sibling is not None and "not this model" in sibling.label


def test_the_timing_note_names_what_was_timed_and_what_was_projected():
    note = measure.timing_note(FLAT, measure.EQUAL)
    assert "draft, verify and update phases" in note and f"{measure.REPEATS} times" in note
    assert "a projection, not a measurement" in note and measure.EQUAL in note
    # why the timed and projected speedups differ, read off the curve's measured range: flat, then a
    # curve where 81 tokens cost three times one
    assert "(measured up to 64 tokens) a pass over 64 tokens costs 0% more than one over a single" in note
    steep = measure.Projection(CostModel([(1, 0.001), (81, 0.003)]), "a steep test curve")
    assert "a pass over 81 tokens costs 200% more" in measure.timing_note(steep, measure.EQUAL)
    assert "Projected" not in measure.timing_note(None, measure.DEVICE)
    assert "undersells" not in note  # equal budgets: every method drafts the same node count
    # this device's budgets, projected on another device's curve: the note says what that leaves out
    assert "this device's choices" in measure.timing_note(FLAT, measure.DEVICE)


def test_the_clock_is_the_decoding_threads_cpu_time_phase_by_phase():
    assert measure.clock("cpu", 1) == "cpu"
    assert measure.clock("cpu", 2) == "mixed" and measure.clock("cuda", 1) == "mixed"
    steps = _with_cpu(_run("recap", [(80, [2, 3]), (80, [4])]), drafter_ms=2.0, verify_ms=5.0)
    steps[1].timing["draft_ms"] = 40.0  # a busy machine's wall clock for the drafting
    # "cpu": every phase in CPU time (the prefill's target pass 5 ms, each pass's 2 + 5 ms)
    assert measure.pass_seconds(steps, "cpu") == pytest.approx([0.005, 0.007, 0.007])
    # "mixed": drafting in CPU time (2 ms, not the 40 ms of wall clock), the target's pass in wall-clock
    # time (10 ms), the prefill in wall-clock time (20 ms)
    assert measure.pass_seconds(steps, "mixed") == pytest.approx([0.020, 0.012, 0.012])
    assert measure.timed_seconds(steps, "cpu") == pytest.approx(0.019)
    # a record without CPU times counts in wall-clock time on either clock
    old = _run("recap", [(80, [2, 3])])
    wall = pytest.approx([0.020, 0.0115])
    assert measure.pass_seconds(old, "cpu") == measure.pass_seconds(old, "mixed") == wall


def test_a_run_counts_the_median_of_its_repeats():
    assert measure.median_total([[1.0, 5.0], [2.0, 3.0], [4.0, 4.0]]) == 6.0
    assert measure.median_total([[1.0, 5.0], [2.0]]) == 4.0  # (an even count: the mean of the middle two)
    assert measure.median_total([]) == 0.0
    assert "CPU time, every phase" in measure.timing_note(None, measure.EQUAL, "cpu")
    mixed = measure.timing_note(None, measure.EQUAL, "mixed")
    assert "drafting and updates in the decoding thread's CPU time" in mixed and "wall-clock" in mixed
    assert "median of the repeats' totals" in mixed


def test_a_one_token_pass_dearer_on_the_curve_than_here_is_said():
    # AR's decoding passes took 2 ms here (its fastest repeats), the curve's one-token pass 3 ms
    times = {"ar": [[0.02, 0.002, 0.003], [0.03, 0.003, 0.002]]}
    gap = measure.one_token_gap(FLAT, times)
    assert "costs 3.0 ms on that curve against 2.0 ms for AR's passes here" in gap
    slower_here = {"ar": [[0.02, 0.004, 0.005]]}
    assert measure.one_token_gap(FLAT, slower_here) == ""
    assert measure.one_token_gap(None, times) == "" and measure.one_token_gap(FLAT, {}) == ""


def test_the_note_says_what_the_equal_budget_is_to_the_methods_compared():
    note = measure.timing_note(None, measure.EQUAL, methods=["ar", "pld", "tr", "suffix", "recap"])
    assert (
        "cap: RECAP fills it, and so does Token Recycling's template except where repeated successors "
        "merge nodes; SuffixDecoding " in note
    )
    without = measure.timing_note(None, measure.EQUAL, methods=["ar", "pld", "tr", "recap"])
    assert "SuffixDecoding" not in without
    assert "Prompt lookup drafts one chain of up to 10 tokens where the prompt matches." in without
    assert "cap" not in measure.timing_note(None, measure.DEVICE, methods=["tr", "suffix", "recap"])


def test_a_pass_records_its_cpu_time_in_its_own_thread():
    # what the CPU clock sums: every pass's draft, verify and update in the decoding thread's CPU time
    from conftest import noise_image, tiny

    from recap.decode import generate
    from recap.runtime import Runtime

    target = tiny("llava")
    drafter = Runtime(target).drafter("recap", budget=8)
    steps = generate(target, drafter, "the cat is", [noise_image(0)], 8).steps
    assert all(s.cpu_ms > 0 for s in steps)
    assert all(s.cpu_ms >= s.drafter_cpu_ms for s in steps[1:])  # the drafter's share, in one clock


def test_the_summary_line_says_where_its_numbers_come_from():
    summary = {
        "samples": 40,
        "budget_note": "80 nodes a pass",
        "command": "python -m scripts.compare_summary --model v2 --limit 40",
        "methods": {
            "ar": {"mat": 1.0, "accept_sensitive": 0.0, "accept_insensitive": 0.0},
            "recap": {"mat": 3.75, "accept_sensitive": 0.623, "accept_insensitive": 0.831},
        },
    }
    line = measure.summary_line(summary)
    assert line.startswith("**Recorded beforehand, not on this input: 40 held-out scenes**")
    assert "RECAP 3.75" in line and "whichever budgets are chosen below" in line
    assert "RECAP 62% / 83%" in line and "Autoregressive 0%" not in line
    assert "python -m scripts.compare_summary --model v2 --limit 40" in line
    assert "also learn from the scenes before" in line  # a stream, unlike the table's warmed copies
    assert "mix of depths" not in line  # no depths in this summary
    assert measure.summary_line(None) == ""


def test_the_summary_line_quotes_only_the_methods_offered():
    summary = {
        "samples": 40,
        "budget_note": "80 nodes a pass",
        "command": "python -m scripts.compare_summary",
        "methods": {
            "ar": {"mat": 1.0, "accept_sensitive": 0.0, "accept_insensitive": 0.0},
            "suffix": {"mat": 1.42, "accept_sensitive": 0.1, "accept_insensitive": 0.3},
            "recap": {"mat": 3.75, "accept_sensitive": 0.623, "accept_insensitive": 0.831},
        },
    }
    assert "SuffixDecoding 1.42" in measure.summary_line(summary)
    without = measure.summary_line(summary, offered=("ar", "pld", "tr", "recap"))
    assert "SuffixDecoding" not in without and "RECAP 3.75" in without and "10%" not in without


def test_the_summary_line_weighs_recap_by_tr_depths_when_the_summary_has_them():
    summary = {
        "samples": 40,
        "budget_note": "80 nodes a pass",
        "command": "python -m scripts.compare_summary",
        "methods": {
            "tr": {"mat": 2.9, "accept_sensitive": 0.7, "accept_insensitive": 0.7,
                   "sensitive_depths": {"0": [30, 24], "4-7": [10, 4]}},
            "recap": {"mat": 3.8, "accept_sensitive": 0.6, "accept_insensitive": 0.8,
                      "sensitive_depths": {"0": [10, 9], "4-7": [30, 15]}},
        },
    }  # fmt: skip
    line = measure.summary_line(summary)
    assert "at Token Recycling's mix of depths" in line
    assert "RECAP accepts 80% of them, against TR's 70%." in line  # 0.75 * 0.9 + 0.25 * 0.5
    assert "longer accepted chains meet more of those tokens deep" in line  # 75% deep against 25%
    # the reason is given only where the summary shows it: RECAP meeting more of them deep
    methods = summary["methods"]
    methods["tr"]["sensitive_depths"], methods["recap"]["sensitive_depths"] = (
        methods["recap"]["sensitive_depths"],
        methods["tr"]["sensitive_depths"],
    )
    swapped = measure.summary_line(summary)
    assert "longer accepted chains" not in swapped and "At Token Recycling's mix of depths" in swapped


def test_the_summary_line_says_how_often_a_single_scene_goes_either_way():
    summary = {
        "samples": 40,
        "budget_note": "80 nodes a pass",
        "command": "python -m scripts.compare_summary",
        "methods": {"recap": {"mat": 3.8, "accept_sensitive": 0.6, "accept_insensitive": 0.8}},
        "sample_wins": {"recap": [17, 12, 9]},
    }
    line = measure.summary_line(summary)
    assert "than TR on 17 scenes, as many on 12 and fewer on 9 (of the 38 with such tokens)" in line
    assert line.endswith("Recorded with `python -m scripts.compare_summary` in the project's repository.")
    del summary["sample_wins"]  # a summary built before the counts were kept
    assert "Scene by scene" not in measure.summary_line(summary)


def _summary(methods: dict, **more) -> dict:
    """A benchmark summary as `scripts.compare_summary` writes it: 40 v2 scenes, ``methods``' figures."""
    command = "python -m scripts.compare_summary --model v2 --limit 40"
    return {"samples": 40, "budget_note": "80 nodes a pass", "command": command, "methods": methods, **more}


def test_the_held_out_figure_leads_with_the_scene_by_scene_distribution():
    tr = {"mat": 2.9, "accept_sensitive": 0.615, "accept_insensitive": 0.72}
    recap = {"mat": 4.0, "accept_sensitive": 0.675, "accept_insensitive": 0.84}
    summary = _summary({"tr": tr, "recap": recap}, sample_wins={"recap": [17, 12, 10]})
    figure = measure.held_out_figure(summary)
    head, _, folded = figure.partition("<details>")
    # the distribution first: more / as many / fewer scenes, one mark a scene, and the pooled difference
    assert "more drafts than Token Recycling on **17** scenes, as many on **12**, fewer on **10**" in head
    assert "(the 39 with such tokens)" in head and "RECAP accepted 68% and Token Recycling 62%" in head
    assert "(RECAP +6 points)" in head
    assert head.count("■") == 39 and "one sample of this distribution" in head
    # every method and the command that records it again, folded; the counts not said twice
    assert "python -m scripts.compare_summary --model v2 --limit 40" in folded
    assert "Scene by scene" not in folded
    del summary["sample_wins"]  # a summary without the counts: the line alone
    assert measure.held_out_figure(summary) == measure.summary_line(summary)
    assert measure.held_out_figure(None) == ""


def test_the_shipped_summaries_lead_both_tabs_with_their_distribution():
    for model_id in ("embedded-v2", "embedded-v1"):
        figure = measure.held_out_line(model_id)
        summary = measure.load_summary(str(measure.EMBEDDED_FOLDERS[model_id]))
        more, tied, fewer = summary["sample_wins"]["recap"]
        assert f"on **{more}** scenes, as many on **{tied}**, fewer on **{fewer}**" in figure
    assert measure.held_out_line("some/hub-model") == ""


def test_wins_against_tr_counts_every_tree_method_but_tr():
    from scripts import compare_summary

    data = {
        "samples": [
            {"sensitive_positions": 3, "sensitive_accepted": {"ar": 0, "pld": 0, "tr": 2, "recap": 3}},
            {"sensitive_positions": 2, "sensitive_accepted": {"ar": 0, "pld": 1, "tr": 1, "recap": 1}},
        ]
    }
    found = compare_summary.wins_against_tr(data, ["ar", "pld", "tr", "recap"])
    assert found == {"pld": [0, 1, 1], "recap": [1, 1, 0]}


def test_the_spread_script_reads_the_tables_speedups_and_their_deviation():
    from scripts import compare_spread

    row = ["RECAP", "80.0", 8, 29, "3.62", "0.135 (repeats 0.131-0.394)", "2.09x", "0.031 s (2.90x)", "yes"]
    ar = ["Autoregressive", "0.0", 29, 29, "1.00", "0.297 (repeats 0.274-0.491)", "1.00x", "-", "yes"]
    assert compare_spread.speedups([ar, row]) == {"Autoregressive": 1.0, "RECAP": 2.09}
    assert compare_spread.nodes({"data": [ar, row]}) == {"Autoregressive": "0.0", "RECAP": "80.0"}
    assert compare_spread.seconds([ar, row]) == {"Autoregressive": 0.297, "RECAP": 0.135}
    assert compare_spread.projected([ar, row]) == {"RECAP": 2.90}
    assert compare_spread.deviation([2.0, 2.2, 1.9, 2.0, 2.1]) == pytest.approx(10.0)
    assert compare_spread.fastest_total([[1.0, 5.0], [2.0, 3.0]]) == 4.0


def test_the_spread_script_compares_the_projection_with_the_benchmarks_on_the_same_passes():
    from scripts import compare_spread

    runs = {
        "ar": _with_cpu(_run("ar", [(0, [2]), (0, [3]), (0, [4]), (0, [5])]), drafter_ms=0.0, verify_ms=9.0),
        "recap": _with_cpu(_run("recap", [(80, [2, 3]), (80, [4, 5])]), drafter_ms=0.5, verify_ms=9.0),
    }
    tab = {method: FLAT.curve.cost(1) * 4 / measure.projected(steps, FLAT) for method, steps in runs.items()}
    # the benchmark adds the drafting's CPU time (0.5 ms a pass here, not the 1.5 ms of wall clock), as
    # the tab does: the same figure
    bench = compare_spread.bench_projection(runs, FLAT)
    assert bench["RECAP"] == pytest.approx(tab["recap"]) and bench["Autoregressive"] == pytest.approx(1.0)
    assert bench["RECAP"] != pytest.approx((4 * 0.0045) / (2 * 0.0045))  # (what wall-clock drafting gave)


def test_the_done_status_says_the_answers_first_and_folds_how_they_were_timed():
    from recap.studio.ui.compare import done_status
    from recap.trace import StepRecord

    def run(*tokens):
        return [StepRecord(step=i, committed_len=0, method="x", new_tokens=[t]) for i, t in enumerate(tokens)]

    same = done_status({"ar": run(1, 2), "tr": run(1, 2), "recap": run(1, 2)}, "Timed: the phases.")
    head, folded = same.split("\n\n", 1)
    assert head == (
        "Done: every method's answer is identical to AR's; the table compares their passes and times. "
        f"Times: the median of {measure.REPEATS} repeats, in the decoding thread's CPU time."
    )  # the clock is named above the fold
    mixed = done_status({"ar": run(1, 2)}, "", "mixed").split("\n\n", 1)[0]
    assert mixed.endswith("drafting in CPU time, the target's pass in wall-clock time.")
    assert folded == "<details><summary>What was timed, and how</summary>\n\nTimed: the phases.\n\n</details>"
    differs = done_status({"ar": run(1, 2), "tr": run(1, 2), "recap": run(1, 3)}, "")
    assert differs.startswith("Done: RECAP answered differently from AR")


def test_without_suffix_decoding_the_held_out_line_quotes_none_of_its_figures(monkeypatch):
    from recap.studio.environment import DEFAULT_MODEL_ID

    monkeypatch.setattr(measure, "offered_methods", lambda: ("ar", "pld", "tr", "suffix", "recap"))
    assert "SuffixDecoding" in measure.held_out_line(DEFAULT_MODEL_ID)  # the shipped summary holds it
    monkeypatch.setattr(measure, "offered_methods", lambda: ("ar", "pld", "tr", "recap"))
    without = measure.held_out_line(DEFAULT_MODEL_ID)
    assert "RECAP" in without and "SuffixDecoding" not in without

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


def test_rows_show_nodes_fastest_passes_ranges_speedups_and_the_projection():
    runs = {
        "ar": _run("ar", [(0, [2]), (0, [3]), (0, [4])]),
        "recap": _run("recap", [(80, [2, 3]), (80, [4])]),
    }
    # each repeat's pass times: AR's fastest passes are 0.10 + 0.05 + 0.05, RECAP's 0.02 + 0.03
    times = {
        "ar": [[0.10, 0.10, 0.10], [0.10, 0.05, 0.15], [0.20, 0.10, 0.05]],
        "recap": [[0.02, 0.06], [0.05, 0.03], [0.04, 0.04]],
    }
    ar, recap = measure.rows(runs, times, FLAT)
    assert recap[:5] == ["RECAP", "80.0", 3, 4, "1.33"]  # nodes per decoding pass; 4 tokens / 3 passes
    assert recap[5] == "0.050 (repeats 0.080-0.080)" and ar[5] == "0.200 (repeats 0.300-0.350)"
    assert recap[6] == "4.00x" and ar[6] == "1.00x"  # AR's time over the method's
    # projected: decoding passes at 3 ms each plus the drafting measured here (1.5 ms a pass)
    assert recap[7] == f"0.009 s ({3 * 0.0045 / (2 * 0.0045):.2f}x)"
    assert recap[8] == ar[8] == "yes"
    # while the comparison runs, a method with fewer repeats than the header's says how many so far
    partial = measure.rows(runs, {"ar": times["ar"], "recap": times["recap"][:1]}, FLAT)[1]
    assert partial[5] == f"0.080 (1 of {measure.REPEATS} repeats so far)"


def test_the_projection_is_the_benchmarks_on_the_same_passes():
    steps = _run("recap", [(80, [2, 3]), (12, [4]), (0, [5])])
    run = SampleRun.from_steps("s", steps, 1.0)
    ar = SampleRun.from_steps("s", _run("ar", [(0, [2]), (0, [3]), (0, [4]), (0, [5])]), 1.0)
    bench = aggregate("recap", [run], [ar], None, projection=FLAT.curve)
    assert bench.projected_seconds == pytest.approx(measure.projected(steps, FLAT))
    assert bench.projected_seconds == pytest.approx(projected_seconds(FLAT.curve, [80, 12, 0], [1.5] * 3))


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


def test_the_clock_is_the_decoding_threads_cpu_time_where_torch_computes_on_that_thread():
    assert measure.clock("cpu", 1) == "cpu"
    assert measure.clock("cpu", 2) == "wall" and measure.clock("cuda", 1) == "wall"
    steps = _run("recap", [(80, [2, 3])])
    steps[0].cpu_ms, steps[1].cpu_ms = 5.0, 7.0
    assert measure.timed_seconds(steps, "cpu") == pytest.approx(0.012)
    assert measure.timed_seconds(steps, "wall") == pytest.approx((20.0 + 11.5) / 1000)
    assert measure.pass_seconds(steps, "cpu") == pytest.approx([0.005, 0.007])
    assert sum(measure.pass_seconds(steps, "wall")) == pytest.approx(measure.timed_seconds(steps, "wall"))


def test_a_run_counts_each_pass_at_its_fastest_repeat():
    assert measure.fastest_total([[1.0, 5.0], [2.0, 3.0]]) == 4.0
    assert measure.fastest_total([[1.0, 5.0], [2.0]]) == 2.0  # pass counts differ: the fastest total
    assert measure.fastest_total([]) == 0.0
    assert "CPU time" in measure.timing_note(None, measure.EQUAL, "cpu")
    assert "wall-clock" in measure.timing_note(None, measure.EQUAL, "wall")


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
    assert "RECAP 3.75" in line and "whichever budgets are chosen above" in line
    assert "RECAP 62% / 83%" in line and "Autoregressive 0%" not in line
    assert "python -m scripts.compare_summary --model v2 --limit 40" in line
    assert "also learn from the scenes before" in line  # a stream, unlike the table's warmed copies
    assert "mix of depths" not in line  # no depths in this summary
    assert measure.summary_line(None) == ""


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
        methods["recap"]["sensitive_depths"], methods["tr"]["sensitive_depths"]
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

    row = ["RECAP", "80.0", 8, 29, "3.62", "0.131 (0.135-0.394)", "2.09x", "0.031 s (2.90x)", "yes"]
    ar = ["Autoregressive", "0.0", 29, 29, "1.00", "0.274 (0.297-0.491)", "1.00x", "-", "yes"]
    assert compare_spread.speedups([ar, row]) == {"Autoregressive": 1.0, "RECAP": 2.09}
    assert compare_spread.nodes({"data": [ar, row]}) == {"Autoregressive": "0.0", "RECAP": "80.0"}
    assert compare_spread.seconds([ar, row]) == {"Autoregressive": 0.274, "RECAP": 0.131}
    assert compare_spread.deviation([2.0, 2.2, 1.9, 2.0, 2.1]) == pytest.approx(10.0)


def test_the_done_status_says_the_answers_first_and_folds_how_they_were_timed():
    from recap.studio.ui.compare import done_status
    from recap.trace import StepRecord

    def run(*tokens):
        return [StepRecord(step=i, committed_len=0, method="x", new_tokens=[t]) for i, t in enumerate(tokens)]

    same = done_status({"ar": run(1, 2), "tr": run(1, 2), "recap": run(1, 2)}, "Timed: the phases.")
    head, folded = same.split("\n\n", 1)
    assert head == (
        "Done: every method's answer is identical to AR's; the table compares their passes and times."
    )
    assert folded == "<details><summary>What was timed, and how</summary>\n\nTimed: the phases.\n\n</details>"
    differs = done_status({"ar": run(1, 2), "tr": run(1, 2), "recap": run(1, 3)}, "")
    assert differs.startswith("Done: RECAP answered differently from AR")

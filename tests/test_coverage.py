"""The benchmark's coverage breakdown: what the memories held at each generated position."""

from __future__ import annotations

import json

import numpy as np
from test_bench import bench_dir, write_image_set  # noqa: F401  (the shared small benchmark run)

from recap.bench.coverage import (
    BASE_KEYS,
    GROUPS,
    Breakdown,
    CoverageProbe,
    PositionCoverage,
    at_depths,
    by_depth,
    depth_bucket,
)
from recap.drafters.base import Observation, RequestInfo
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter
from recap.drafters.token_recycling import SuccessorMatrix, TokenRecyclingDrafter
from recap.tree import DraftTree
from recap.verify import Acceptance


class Recorder:
    """A drafter stand-in whose memories hold token 4 everywhere (and nothing else)."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    def coverage(self, tails, tokens):
        self.asked.append(tails.tolist())
        return [(("ctx2",), True) if t == 4 else ((), False) for t in tokens.tolist()]


def test_the_probe_asks_at_every_state_along_the_accepted_path_and_marks_first_mentions():
    probe, drafter = CoverageProbe(Recorder()), None
    drafter = probe.coverage.__self__
    # context 1 2 3; tree: 4 under the root, 5 under 4, 6 under the root; accepted 4, then bonus 7
    tree = DraftTree([4, 5, 6], [-1, 0, -1], [0.5, 0.2, 0.1], [["ctx2"]] * 3, [{}] * 3)
    observation = Observation([1, 2, 3], np.array([2]), tree, acceptance=Acceptance((0,), (4, 7)))
    probe(observation)
    assert drafter.asked == [[[1, 2, 3], [2, 3, 4]]]  # the root's state, then node 0's
    first, second = probe.positions
    assert first == PositionCoverage(("ctx2",), True, drafted=True, first_mention=True, depth=0)
    # 5 was drafted there; the state comes after one accepted draft
    assert second == PositionCoverage((), False, drafted=True, first_mention=True, depth=1)
    assert probe.seconds >= 0


def test_a_state_whose_last_two_tokens_were_committed_before_is_a_later_mention():
    probe = CoverageProbe(Recorder())
    tree = DraftTree([2], [-1], [0.5], [["ctx2"]], [{}])
    probe(Observation([1, 2, 3, 1], np.array([3]), tree, acceptance=Acceptance((0,), (2, 5))))
    # the root's state ends in (3, 1), never committed before; then (1, 2), the prompt's first pair
    assert [p.first_mention for p in probe.positions] == [True, False]


def test_a_state_with_no_child_in_the_tree_is_not_drafted():
    probe = CoverageProbe(Recorder())
    probe(Observation([1, 2], np.array([1]), DraftTree(), acceptance=Acceptance((), (9,))))
    assert probe.positions == [PositionCoverage((), False, drafted=False, first_mention=True)]


def test_a_drafter_without_coverage_is_not_probed():
    assert CoverageProbe(object()).coverage is None


def test_breakdown_counts_groups_and_skips_the_first_token():
    covered = PositionCoverage(("ctx3", "persistent"), True, True, True)
    missed = PositionCoverage((), False, True, False)
    breakdown = Breakdown()
    breakdown.add([None, covered, missed], ["target", "ctx3", "target"], [True, True, True])
    counts = breakdown.to_json()
    assert list(counts) == list(GROUPS)
    assert counts["sensitive-first"] == {
        "accepted": 1, "accepted_depth_0": 1, "covered": 1, "covered_ctx3": 1, "covered_persistent": 1,
        "covered_this_request": 1, "depth_0": 1, "drafted": 1, "positions": 1,
    }  # fmt: skip
    assert counts["sensitive-later"] == {"positions": 1, "covered": 0, "covered_this_request": 0,
                                         "drafted": 1, "accepted": 0, "depth_0": 1,
                                         "accepted_depth_0": 0}  # fmt: skip
    assert counts["insensitive-first"] == dict.fromkeys(sorted(BASE_KEYS), 0)
    breakdown += breakdown
    assert breakdown.to_json()["sensitive-first"]["positions"] == 2


def test_depths_are_counted_in_buckets_and_summed_over_groups():
    assert [depth_bucket(d) for d in (0, 1, 2, 3, 4, 7, 8, 40)] == [
        "0",
        "1",
        "2-3",
        "2-3",
        "4-7",
        "4-7",
        "8+",
        "8+",
    ]
    breakdown = Breakdown()
    deep = [
        PositionCoverage((), False, True, first, depth) for first, depth in ((True, 5), (False, 6), (True, 0))
    ]
    breakdown.add([None, *deep], ["target", "ctx2", "target", "persistent"], [True] * 4)
    counts = breakdown.to_json()
    assert by_depth([counts[g] for g in GROUPS[:2]]) == {"0": (1, 1), "4-7": (2, 1)}
    assert by_depth([counts[g] for g in GROUPS[2:]]) == {}


def test_at_depths_weighs_each_depths_acceptance_by_the_references_mix():
    method = {"0": (10, 9), "4-7": (30, 15)}  # 60% over its own mix, deep
    reference = {"0": (30, 24), "4-7": (10, 4)}  # 70% over its own mix, shallow
    assert at_depths(method, reference) == 0.75 * 0.9 + 0.25 * 0.5
    assert at_depths(reference, reference) == 28 / 40  # the reference's own acceptance
    assert at_depths(method, {"1": (5, 5)}) is None  # no position of the method at that depth
    assert at_depths(method, {}) is None


def test_recap_coverage_names_the_memories_holding_the_token_and_this_requests_records():
    config = RecapConfig(k=2, budget=4, suffix=False, backoff=False)
    drafter = RecapDrafter(config)
    drafter.begin(RequestInfo((1, 2), frozenset(), 20))
    # the prefill computed position 1 (context 1 2): the target said 5 (0.7) or 6 (0.3)
    prefill = Observation([1, 2], np.array([1]), DraftTree(), np.array([[5, 6]]), np.array([[0.7, 0.3]]))
    drafter.observe(prefill)
    drafter.propose([1, 2])
    tails = np.array([[-1, 1, 2], [-1, 1, 2], [-1, 3, 2], [-1, -1, 9]])
    found = drafter.coverage(tails, np.array([6, 7, 5, 5]))
    assert found[0] == (("ctx2", "persistent"), True)  # ctx2 (1, 2) and P1 (2) hold 6, written now
    assert found[1] == ((), False)  # 7 is in no record
    assert found[2] == (("persistent",), True)  # only P1 (keyed by 2) matches the context (3, 2)
    assert found[3] == ((), False)  # nothing known after 9


def test_token_recycling_coverage_reads_the_last_tokens_row():
    matrix = SuccessorMatrix(10, 2)
    matrix.write_many(np.array([3]), np.array([[4, 5]]))
    drafter = TokenRecyclingDrafter(successors=matrix)
    drafter.begin(RequestInfo((1,), frozenset(), 10))
    found = drafter.coverage(np.array([[1, 2, 3], [1, 2, 3], [1, 2, 7]]), np.array([5, 6, 0]))
    assert found == [(("successors",), False), ((), False), ((), False)]  # row 7 was never written


def test_results_carry_the_breakdown_and_results_md_its_table(bench_dir):  # noqa: F811
    data = json.loads((bench_dir / "results.json").read_text())
    for name in ("tr", "recap"):
        breakdown = data["methods"][name]["breakdown"]
        sensitive = sum(breakdown[g]["positions"] for g in GROUPS[:2])
        assert sensitive == data["methods"][name]["sensitive_positions"]
        for counts in breakdown.values():
            # in greedy decoding a drafted token equal to the target's is accepted: accepted <= drafted
            assert counts.get("accepted", 0) <= counts.get("drafted", 0) <= counts.get("positions", 0)
            assert counts.get("covered", 0) <= counts.get("positions", 0)
        depths = by_depth([breakdown[g] for g in GROUPS[:2]])
        assert sum(n for n, _ in depths.values()) == sensitive
        assert sum(a for _, a in depths.values()) == sum(breakdown[g]["accepted"] for g in GROUPS[:2])
    page = (bench_dir / "results.md").read_text()
    assert "At image-sensitive positions" in page
    assert "| method | 0 | 1 | 2-3 | 4-7 | 8+ | all | at TR's depths |" in page
    assert (bench_dir / "coverage.html").is_file()
    assert (bench_dir / "depth.html").is_file()
    from recap.bench.metrics import BenchmarkResult, MethodResult
    from recap.bench.report import charts

    methods = {name: MethodResult(**result) for name, result in data["methods"].items()}
    figure = charts(BenchmarkResult(data["settings"], methods))["depth"]
    # the buckets are categories: a guessed axis would read "0" and "1" as numbers and drop "2-3" ...
    assert figure.layout.xaxis.type == "category"


def test_the_probe_can_be_left_out_of_a_run(tmp_path):
    from conftest import tiny

    from recap.bench.datasets import load_dataset
    from recap.bench.runner import run_benchmark
    from recap.runtime import Runtime

    samples = load_dataset(str(write_image_set(tmp_path)))[:2]
    runtime = Runtime(tiny("llava"))
    result = run_benchmark(runtime, samples, "tr", max_new_tokens=6, progress=False, coverage=False)
    counts = result.methods["tr"].breakdown
    assert all(c["positions"] == 0 for c in counts.values())  # nothing probed, nothing counted

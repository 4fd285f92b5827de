"""Fans where the image decides: the open contexts (`recap.drafters.recap.continuations`) and the search's
fans."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from test_drafters import IMAGE, VOCAB, seeded

from recap.drafters.base import RequestInfo
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.continuations import MAX_DISTINCT, Continuations
from recap.drafters.recap.drafter import RecapDrafter
from recap.memory.records import KEY_BITS
from recap.tree import ROOT

USABLE = np.ones(VOCAB + 1, dtype=bool)
USABLE[[IMAGE, VOCAB]] = False


def key(b: int, c: int) -> int:
    return (b << KEY_BITS) | c


def opened(memory: Continuations) -> dict[int, list[int]]:
    """Open context -> the tokens that followed it, in the order first seen."""
    keys, ways = memory.arrays()
    assert ways.shape == (len(keys), MAX_DISTINCT)
    return {k: [t for t in row if t >= 0] for k, row in zip(keys.tolist(), ways.tolist(), strict=True)}


def test_a_context_continued_two_ways_is_open():
    memory = Continuations()
    memory.fold(np.array([7, 1, 2, 3, 4]), 1, USABLE)  # prompt [7], answer [1, 2, 3, 4]
    assert opened(memory) == {} and len(memory) == 3  # (7 1)->2, (1 2)->3, (2 3)->4: one way each
    memory.fold(np.array([7, 1, 2, 5]), 1, USABLE)
    assert opened(memory) == {key(1, 2): [3, 5]}
    memory.fold(np.array([7, 1, 2, 5]), 1, USABLE)  # the same way again: still 2
    memory.fold(np.array([7, 1, 2, 6]), 1, USABLE)
    assert opened(memory) == {key(1, 2): [3, 5, 6]}
    keys, _ = memory.arrays()
    assert keys.dtype == np.int64 and list(keys) == sorted(keys)


def test_only_the_answer_counts_and_image_placeholders_make_no_key():
    memory = Continuations()
    memory.fold(np.array([1, 2, 3, 1, 2, 4]), 5, USABLE)  # the prompt's (1 2)->3 is not counted
    assert opened(memory) == {}
    memory.fold(np.array([IMAGE, 2, 8, IMAGE, 2, 9]), 2, USABLE)
    assert key(IMAGE, 2) not in memory._rows and opened(memory) == {}


def test_distinct_continuations_are_capped_and_the_oldest_context_goes_first():
    memory = Continuations(capacity=2)
    for token in range(3, 3 + MAX_DISTINCT + 5):
        memory.fold(np.array([1, 2, token]), 2, USABLE)
    assert opened(memory) == {key(1, 2): list(range(3, 3 + MAX_DISTINCT))}  # the first ones seen
    memory.fold(np.array([5, 6, 7]), 2, USABLE)
    memory.fold(np.array([8, 9, 10]), 2, USABLE)  # a third context: (1 2), the oldest, is dropped
    assert len(memory) == 2 and opened(memory) == {}
    memory.reset()
    assert len(memory) == 0


def test_a_copy_counts_on_its_own():
    memory = Continuations()
    memory.fold(np.array([1, 2, 3]), 2, USABLE)
    twin = copy.deepcopy(memory)
    twin.fold(np.array([1, 2, 4]), 2, USABLE)
    assert opened(twin) == {key(1, 2): [3, 4]} and opened(memory) == {}


def test_the_drafter_counts_a_request_when_the_next_one_starts():
    drafter = RecapDrafter(RecapConfig(k=4, budget=8))
    drafter.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))
    drafter.propose([IMAGE, 1, 2, 3, 4])  # the answer so far: 2 3 4
    assert drafter._fans[0].size == 0
    drafter.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))
    drafter.propose([IMAGE, 1, 2, 3, 5])  # another image: after (2 3), 5
    assert drafter._fans[0].size == 0  # the request in progress does not count yet
    drafter.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))
    keys, ways = drafter._fans
    assert keys.tolist() == [key(2, 3)] and ways[0, :3].tolist() == [4, 5, -1]
    off = RecapDrafter(RecapConfig(k=4, budget=8, fans=False), persistent=drafter.persistent)
    off.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))
    assert off._fans is None


# Root context (0, 1): its candidates 10 (0.4), 11 (0.3), 12 (0.2), 13 (0.1); after 10 a chain of sure
# tokens 20 -> 21 -> 22 ... that the best-first search prefers to the root's other candidates.
RECORDS = {1: {10: 0.4, 11: 0.3, 12: 0.2, 13: 0.1}, 10: {20: 0.95, 30: 0.05}}
RECORDS.update({t: {t + 1: 0.95, 30: 0.05} for t in range(20, 28)})


def _fans(ways: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """`Continuations.arrays` as the search reads them, from open context -> its continuations."""
    keys = sorted(ways)
    table = np.full((len(keys), MAX_DISTINCT), -1, dtype=np.int32)
    for row, k in enumerate(keys):
        table[row, : len(ways[k])] = ways[k]
    return np.array(keys, dtype=np.int64), table


def _drafter(branching: int = 8) -> RecapDrafter:
    config = RecapConfig(k=4, budget=4, branching=branching, suffix=False, use_context=False, backoff=False)
    drafter = RecapDrafter(config)
    seeded(drafter, RECORDS)
    return drafter


def _tree(ways: dict[int, list[int]] | None, branching: int = 8):
    drafter = _drafter(branching)
    if ways is not None:
        drafter._fans = _fans(ways)
    return drafter.propose([0, 1])


def test_an_open_context_gets_its_fan_before_the_chain_behind_its_best_candidate():
    plain = _tree(None)
    assert plain.tokens == [10, 20, 21, 22]  # one root candidate, then the chain
    fanned = _tree({key(0, 1): [11, 12]})  # earlier answers went on with 11 and 12 here
    assert fanned.tokens[:3] == [10, 11, 12] and fanned.parents[:3] == [ROOT] * 3
    assert fanned.tokens[3] == 20  # then the chain goes on
    # each node keeps its own path estimate: the fan changes which nodes the budget buys, not scores
    assert fanned.scores[1] == pytest.approx(plain.scores[0] * 0.3 / 0.4)
    # the fan is the continuations seen (and the best candidate), not the next best candidates
    assert _tree({key(0, 1): [13, 12]}).tokens == [10, 12, 13, 20]
    assert _tree({key(0, 1): [12, 40]}).tokens == [10, 12, 20, 21]  # 40: no memory offers it here
    assert _tree({key(5, 1): [11, 12]}).tokens == plain.tokens  # another context's fan: nothing changes


def test_a_fan_reaches_past_the_children_a_context_gets():
    assert _tree(None, branching=2).tokens == [10, 20, 21, 22]
    # 13 is the 4th candidate, beyond the 2 children a context gets: an earlier answer went on with it
    assert _tree({key(0, 1): [13, 11]}, branching=2).tokens == [10, 11, 13, 20]


def test_explain_says_which_nodes_a_fan_offered():
    drafter = _drafter()
    drafter._fans = _fans({key(0, 1): [11, 12, 13]})
    tree = drafter.propose([0, 1])
    drafter.explain(tree)
    assert tree.tokens == [10, 11, 12, 13] and tree.fans == [3] * 4  # the best one and 3 continuations
    drafter._fans = _fans({key(0, 1): [12, 13]})
    tree = drafter.propose([0, 1])
    drafter.explain(tree)
    assert tree.tokens == [10, 12, 13, 20] and tree.fans == [2, 2, 2, 0]  # 20 sits at another context


def test_a_trace_keeps_each_nodes_fan_and_the_tooltip_says_it():
    from recap.studio.guard.trace_files import check_trace_data
    from recap.studio.ui.figures import _node_hover
    from recap.trace import NodeRecord, RunTrace, StepRecord

    node = NodeRecord(0, -1, 11, "blue", 1, 0.3, ["ctx2"], {"ctx2": 0.3}, False, fan=3)
    assert "in a fan: earlier answers went on 3 ways here" in _node_hover(node).replace("<br>", " ")
    assert "fan" not in _node_hover(NodeRecord(0, -1, 11, "blue", 1, 0.3, ["ctx2"], {}, False))
    step = StepRecord(step=1, committed_len=4, method="recap", nodes=[node])
    data = json.loads(RunTrace({"method": "recap"}, [step]).to_json())
    assert RunTrace.from_json(json.dumps(data)).steps[0].nodes[0].fan == 3
    data["steps"][0]["nodes"][0]["fan"] = -2
    with pytest.raises(ValueError, match="fan"):
        check_trace_data(data)


def test_a_request_without_an_image_gets_no_fans():
    drafter = RecapDrafter(RecapConfig(k=4, budget=8))
    for answer in ([2, 3, 4], [2, 3, 5]):
        drafter.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))
        drafter.propose([IMAGE, 1, *answer])
    drafter.begin(RequestInfo((7, 1), frozenset({IMAGE}), VOCAB))  # text only: no fans ...
    assert drafter._fans is None
    drafter.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))  # ... the next image request has
    assert drafter._fans[0].tolist() == [key(2, 3)]


def test_a_full_memory_stays_a_few_megabytes_and_the_session_ledger_counts_it():
    from recap.drafters.recap.continuations import CAPACITY
    from recap.studio.guard.sessions import footprint

    memory = Continuations()
    usable = np.ones(5001, dtype=bool)
    usable[-1] = False
    rng = np.random.default_rng(0)
    while len(memory) < CAPACITY:
        memory.fold(rng.integers(0, 5000, 2000), 0, usable)
    for _ in range(5):  # full: the oldest contexts make room, the size stays
        memory.fold(rng.integers(0, 5000, 2000), 0, usable)
    assert len(memory) == CAPACITY
    assert 1e6 < footprint(memory) < 10e6

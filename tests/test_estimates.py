"""RECAP's acceptance estimates (`recap.drafters.recap.estimates`): kinds, counts, labels, their order."""

from __future__ import annotations

import numpy as np
import pytest
from test_drafters import IMAGE, PATTERN, Target, cycle_rule, seeded, simulate

from recap.drafters import make_drafter
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.estimates import (
    BUCKETS,
    CODES,
    FINE_KINDS,
    HITS,
    SEEN,
    A,
    AcceptanceModel,
    B,
    bucket,
    coarse_kind,
    fine_kind,
    source_code,
)


def test_kinds_encode_what_each_memory_says():
    assert [source_code(False, False, 0), source_code(True, False, 0), source_code(True, True, 2)] == [
        0,
        1,
        8,
    ]
    assert source_code(True, False, 7) == 4 and source_code(True, False, None) == 5  # rank 3+, absent
    assert coarse_kind((0, 0, 1), suffix=False) == 2 and coarse_kind((0, 0, 1), suffix=True) == 3
    assert coarse_kind((1, 0, 0), False) == 2 * CODES * CODES
    assert fine_kind(3, 0.5) == 3 * BUCKETS + bucket(0.5) and bucket(0.0) == 0 and bucket(1.0) == BUCKETS - 1


def test_cold_start_estimate_is_the_fused_probability_and_counts_shrink_towards_it():
    model = AcceptanceModel(strength=8.0)
    kind = fine_kind(coarse_kind((0, 0, 1), False), 0.99)
    assert model.estimate(kind, 0.99) == pytest.approx(0.99)  # no labels: behaves like the method
    model.update(np.array([kind] * 100), np.array([kind] * 40))  # 100 seen, 40 right
    coarse = (40 + 8 * 0.99) / 108
    assert model.estimate(kind, 0.99) == pytest.approx((40 + 8 * coarse) / 108)  # ~0.40, not 0.99
    other = fine_kind(coarse_kind((0, 0, 1), False), 0.5)  # same coarse kind, another bucket
    assert model.estimate(other, 0.5) == pytest.approx((40 + 8 * 0.5) / 108)
    assert len(model) == 100
    model.reset()
    assert model.estimate(kind, 0.99) == pytest.approx(0.99) and len(model) == 0


def test_old_labels_decay_once_a_kind_is_well_known():
    model = AcceptanceModel(strength=1.0, memory=10.0, decay=0.5)
    kind = fine_kind(0, 0.5)
    model.update(np.array([kind] * 12), np.array([kind] * 12))  # 12 > 10 seen: halved
    assert model.seen_fine[kind] == pytest.approx(6.0) and model.hits_fine[kind] == pytest.approx(6.0)


def test_greedy_labels_count_as_update_with_the_labels_chosen_in_numpy():
    """`update_greedy` (labels chosen and counted in one compiled call) equals `update` with the verified
    labels and the right ones picked by numpy, over passes that decay counts."""
    rng = np.random.default_rng(0)
    fused, apart = (AcceptanceModel(strength=2.0, memory=40.0, decay=0.9) for _ in range(2))
    for _ in range(30):
        labels, kept, first_row = int(rng.integers(0, 60)), int(rng.integers(0, 8)), int(rng.integers(1, 4))
        nodes = rng.integers(-1, 10, labels)
        tokens = rng.integers(0, 5, labels)
        kinds = rng.integers(0, 3 * BUCKETS, labels)  # few kinds: counts pass `memory` and decay
        greedy = rng.integers(0, 5, first_row + 10)
        fused.update_greedy(nodes, tokens, kinds, kept, first_row, greedy)
        verified = nodes < kept
        right = tokens[verified] == greedy[first_row + nodes[verified]]
        apart.update(kinds[verified], kinds[verified][right])
    for ours, theirs in zip(fused.levels(), apart.levels()):  # counts and shrinkage (not scratch)
        assert np.array_equal(ours[:, [SEEN, HITS, A, B]], theirs[:, [SEEN, HITS, A, B]])
    assert len(fused) == len(apart) > 0


@pytest.mark.parametrize(
    ("nodes", "tokens", "kinds", "message"),
    [
        ([0, 1], [5, 5], [3], "2 nodes, 2 tokens and 1 kinds"),
        ([0], [5], [-1], "label 0: fine kind -1"),
        ([0], [5], [FINE_KINDS], f"label 0: fine kind {FINE_KINDS}"),
        ([5], [5], [3], "greedy row 6"),  # a verified node beyond the 3 computed rows
    ],
)
def test_greedy_labels_out_of_range_are_refused_and_nothing_is_counted(nodes, tokens, kinds, message):
    model = AcceptanceModel()
    with pytest.raises(ValueError, match=message):
        model.update_greedy(np.array(nodes), np.array(tokens), np.array(kinds), 9, 1, np.array([5, 5, 5]))
    assert len(model) == 0


@pytest.mark.parametrize(
    ("strength", "memory", "decay"), [(0.0, 10.0, 0.5), (1.0, 0.0, 0.5), (1.0, 10.0, 0.0), (1.0, 10.0, 1.5)]
)
def test_acceptance_model_rejects_bad_settings(strength, memory, decay):
    with pytest.raises(ValueError, match="strength"):
        AcceptanceModel(strength, memory, decay)


def persistent_kind(rank: int, q: float, fresh: bool = False) -> int:
    """Fine kind of a candidate only the persistent memory proposes, at ``rank`` with probability q."""
    return fine_kind(coarse_kind((0, 0, source_code(True, fresh, rank)), False), q)


@pytest.mark.parametrize(("method", "first"), [("recap", 8), ("recap-uncalibrated", 7)])
def test_estimates_order_the_candidates(method, first):
    # P1[1] says 7 (0.9) then 8 (0.05); the acceptance model has seen that such a memory's first
    # choice is never right and its second always is: calibrated drafting tries 8 first.
    drafter = make_drafter(method, config=RecapConfig(k=3, budget=1, suffix=False, use_context=False))
    seeded(drafter, {1: {7: 0.9, 8: 0.05}})
    wrong, right = persistent_kind(0, 0.9), persistent_kind(1, 0.05)
    drafter.acceptance.update(np.array([wrong] * 50 + [right] * 50), np.array([right] * 50))
    assert drafter.propose([0, 1]).tokens == [first]


def test_every_expanded_context_teaches_the_acceptance_model():
    drafter = make_drafter("recap", config=RecapConfig(budget=8, suffix=False, use_context=False))
    simulate(drafter, [IMAGE] * 4 + PATTERN * 2, Target(cycle_rule(PATTERN)), passes=20)
    model = drafter.acceptance
    assert model is drafter.stream.acceptance and len(model) > 20 * 8  # more labels than nodes
    # A cycle: the persistent memory's first choice is always right, its second never.
    assert model.estimate(persistent_kind(0, 0.7, fresh=True), 0.7) > 0.9
    assert model.estimate(persistent_kind(1, 0.04, fresh=True), 0.04) < 0.04

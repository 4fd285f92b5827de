"""RECAP's best-first search (`recap.drafters.recap.search`, compiled in `recap.drafters.recap.kernel`)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_fusion import candidates, estimate
from test_drafters import PATTERN, Target, cycle_rule, simulate, start, step

from recap.drafters import make_drafter
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter
from recap.tree import ROOT


def reference_best_first(drafter: RecapDrafter, context, cap):
    """Plain best-first search over the same estimates: pop the best candidate, push its children."""
    heap, order, chosen = [], 0, []
    tail = tuple(context[-3:])

    def push(node, node_tail, path, depth):
        nonlocal order
        found = drafter._lookup(np.array([node_tail]))
        tokens, q, coarse, _ = candidates(found, drafter.config.k)
        backoff = drafter.stream.backoff.record() if drafter.config.backoff else None
        if backoff is not None and not found.shares.any() and drafter._usable[node_tail[2]]:
            # no memory has a record: the back-off record's tokens, of coarse kind 0
            ids, probs = backoff
            tokens, q = ids[None], np.where(ids >= 0, probs.astype(np.float64), -1.0)[None]
            coarse = np.zeros_like(tokens)
        _, estimates = estimate(drafter, coarse, q, q.copy())
        estimates = np.where(q > 0, estimates, 0.0)[0]
        for column in np.argsort(-estimates, kind="stable")[: drafter.config.branching]:
            if path * estimates[column] > 0:
                score = path * estimates[column]
                heapq.heappush(heap, (-score, depth, order, node, int(tokens[0, column]), node_tail))
                order += 1

    push(ROOT, tail, 1.0, 1)
    while heap and len(chosen) < cap:
        negative, depth, _, parent, token, parent_tail = heapq.heappop(heap)
        chosen.append((parent, token, -negative))
        if depth < drafter.config.depth:
            push(len(chosen) - 1, (parent_tail[1], parent_tail[2], token), -negative, depth + 1)
    return chosen


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), cap=st.integers(1, 40))
def test_compiled_growth_picks_what_best_first_search_over_the_numpy_reference_pops(seed, cap):
    rng = np.random.default_rng(seed)
    drafter = make_drafter("recap", config=RecapConfig(budget=cap, suffix=False, k=4, branching=3, depth=4))
    context = start(drafter, [1, 2, 3], Target(lambda c: int(rng.integers(0, 12)), k=4))
    for _ in range(4):
        step(drafter, context, Target(lambda c: int(rng.integers(0, 12)), k=4))
    tree = drafter.propose(context)
    tree.validate()
    expected = sorted(s for _, _, s in reference_best_first(drafter, context, cap))
    assert sorted(tree.scores) == pytest.approx(expected)
    assert tree.scores == sorted(tree.scores, reverse=True)


@pytest.mark.parametrize("method", ["recap", "recap-uncalibrated"])
def test_certain_records_in_every_memory_never_score_a_child_above_its_parent(method):
    # Three records of probability 1 fuse, in float32 with weights 4:2:1, to 1.0000000447: unclipped,
    # a child would outscore its parent and be placed before it (a tree the verifier misreads).
    drafter = make_drafter(method, config=RecapConfig(budget=32, suffix=False))
    simulate(drafter, PATTERN * 3, Target(cycle_rule(PATTERN), top=1.0), passes=10)
    tree = drafter.propose(PATTERN * 3)
    tree.validate()
    assert len(tree) > 1 and all(
        tree.scores[node] <= tree.scores[parent] for node, parent in enumerate(tree.parents) if parent != ROOT
    )

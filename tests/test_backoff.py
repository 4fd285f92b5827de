"""The back-off record (`recap.drafters.recap.backoff`): what it keeps, drafted where no memory knows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_drafters import Target, cycle_rule, start, step

from recap.drafters import make_drafter
from recap.drafters.recap.backoff import BackoffRecord
from recap.drafters.recap.config import RecapConfig
from recap.tree import ROOT


@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.integers(-2, 12), max_size=60), k=st.integers(1, 5))
def test_backoff_record_keeps_the_most_often_counted_tokens(tokens, k):
    record = BackoffRecord(vocab_size=11, k=k)
    for chunk in (tokens[: len(tokens) // 2], tokens[len(tokens) // 2 :]):
        record.count(chunk)
    counted = [t for t in tokens if 0 <= t < 11]
    found = record.record()
    if not counted:
        assert found is None
        return
    ids, probs = found
    counts = np.bincount(counted, minlength=11)
    kept = ids[ids >= 0]
    assert len(kept) == min(k, np.count_nonzero(counts)) and len(set(kept.tolist())) == len(kept)
    assert counts[kept].tolist() == sorted(counts[kept].tolist(), reverse=True)
    assert counts[kept].min() >= np.sort(counts)[::-1][len(kept) - 1]  # no better token left out
    assert probs[ids >= 0].tolist() == pytest.approx((counts[kept] / len(counted)).tolist())
    assert (probs[ids < 0] == 0).all()
    record.reset()
    assert record.record() is None and len(record) == 0


def test_backoff_record_hands_out_copies():
    record = BackoffRecord(vocab_size=10, k=2)
    record.count([3, 5, 3])
    ids, probs = record.record()
    ids[:], probs[:] = -1, 0.0
    again, shares = record.record()
    assert again.tolist() == [3, 5] and shares.tolist() == pytest.approx([2 / 3, 1 / 3])


@pytest.mark.parametrize("backoff", [True, False])
def test_a_context_no_memory_knows_drafts_the_backoff_record(backoff):
    drafter = make_drafter("recap", config=RecapConfig(budget=16, backoff=backoff))
    target = Target(cycle_rule([1, 2, 3]))
    context = start(drafter, [1, 2, 3], target)
    context.append(1)
    for _ in range(4):
        step(drafter, context, target)
    context.append(40)  # never computed: no record in any memory
    tree = drafter.propose(context)
    if not backoff:
        assert len(tree) == 0
        return
    ids, _ = drafter.stream.backoff.record()
    roots = [j for j in range(len(tree)) if tree.parents[j] == ROOT]
    assert sorted(tree.tokens[j] for j in roots) == sorted(ids[ids >= 0].tolist())
    assert all(tree.sources[j] == ("backoff",) for j in roots)
    assert drafter.root_candidates() == []  # the memories' fused distribution is unchanged: empty


def test_a_backoff_token_the_suffix_match_also_proposes_is_credited_to_both():
    """At a context no memory knows, the suffix-matched token is usually one of the back-off record's
    too: the node is credited to both (``backoff`` first, as the studio and the bench count it)."""
    drafter = make_drafter("recap", config=RecapConfig(budget=16))
    target = Target(cycle_rule([1, 2, 3]))
    context = start(drafter, [1, 2, 3], target)
    context.append(1)
    for _ in range(4):
        step(drafter, context, target)
    context += [1, 40, 2, 3, 1, 40]  # never computed: no record keyed by 40; "1 40" was followed by 2
    tree = drafter.propose(context)
    ids, _ = drafter.stream.backoff.record()
    assert 2 in ids.tolist()
    node = tree.child(ROOT, 2)
    assert node is not None and tree.sources[node] == ("backoff", "suffix")
    others = [j for j in range(len(tree)) if tree.parents[j] == ROOT and j != node]
    assert others and all(tree.sources[j] == ("backoff",) for j in others)

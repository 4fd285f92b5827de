"""RECAP's recycling step (`recap.drafters.recap.recycle`): one compiled call equals its parts; bad input
is refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from recap.drafters.recap.context import ContextMemory
from recap.drafters.recap.estimates import BUCKETS, HITS, SEEN, A, AcceptanceModel, B
from recap.drafters.recap.recycle import GreedyLabels, VerifiedPass, recycle, write_recycled
from recap.memory.persistent import PersistentMemory
from recap.memory.records import record_rows
from recap.memory.recycling import recycling_keys

NONE = np.zeros(0, dtype=np.int64)


def _memories(vocab: int, k: int) -> tuple[PersistentMemory, ContextMemory, ContextMemory]:
    return PersistentMemory(vocab, k), ContextMemory(2, capacity=6), ContextMemory(3, capacity=6)


def _contents(memories) -> list:
    persistent, ctx2, ctx3 = memories
    contextual = [(m.keys(), m.index.items()[1].tolist(), m.table.tolist()) for m in (ctx2, ctx3)]
    return [persistent.table.tolist(), *contextual]


@pytest.mark.parametrize("seed", range(6))
def test_recycle_equals_keys_records_and_writes_called_apart(seed):
    """`recycle` (one compiled call) leaves the memories exactly as `recycling_keys`, `record_rows` and
    `write_recycled` do, over several passes (bounded contextual memories: reuse of the oldest rows)."""
    rng = np.random.default_rng(seed)
    vocab, k = 12, 4
    apart, fused = _memories(vocab, k), _memories(vocab, k)
    context = rng.integers(0, vocab, 6).tolist()
    excluded = np.array([3], dtype=np.int64)
    for stamp in range(5):
        size = int(rng.integers(0, 7))
        parents = [int(rng.integers(-1, i)) for i in range(size)]
        tokens = rng.integers(0, vocab + 2, size).tolist()  # some outside the persistent vocabulary
        positions = np.arange(len(context) - int(rng.integers(1, 3)), len(context))
        accepted = [i for i in range(size) if rng.random() < 0.4]
        ids = rng.integers(0, vocab, (len(positions) + size, 5))
        probs = rng.dirichlet(np.ones(5), len(ids)).astype(np.float32)
        rows, keys, lengths = recycling_keys(context, positions, parents, tokens, accepted, excluded)
        write_recycled(rows, keys, lengths, record_rows(ids, probs, k, stamp), *apart)
        computed = VerifiedPass(context, positions, parents, tokens, accepted, ids, probs)
        recycle(computed, excluded, k, stamp, *fused)
        assert _contents(fused) == _contents(apart)
        context += rng.integers(0, vocab, 2).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_recycle_counts_greedy_labels_as_update_greedy_does(seed):
    """With ``labels``, `recycle` counts a pass's greedy labels in its own call: the acceptance model and
    the memories end exactly as `update_greedy` then `recycle` without labels leave them (stream-scope
    memories: room is made in the call's retry)."""
    rng = np.random.default_rng(seed)
    vocab, k = 12, 4
    apart, fused = _memories(vocab, k), _memories(vocab, k)
    models = [AcceptanceModel(strength=2.0, memory=30.0, decay=0.9) for _ in range(2)]
    context = rng.integers(0, vocab, 6).tolist()
    for stamp in range(8):
        size = int(rng.integers(1, 7))
        parents = [int(rng.integers(-1, i)) for i in range(size)]
        tokens = rng.integers(0, vocab, size).tolist()
        positions = np.arange(len(context) - 1, len(context))
        accepted = [0] if rng.random() < 0.5 else []
        ids = rng.integers(0, vocab, (len(positions) + size, k))
        probs = rng.dirichlet(np.ones(k), len(ids)).astype(np.float32)
        count = int(rng.integers(0, 40))
        nodes, label_tokens = rng.integers(-1, size, count), rng.integers(0, vocab, count)
        kinds, kept = rng.integers(0, 3 * BUCKETS, count), int(rng.integers(0, size + 1))
        models[0].update_greedy(nodes, label_tokens, kinds, kept, len(positions), ids[:, 0])
        computed = VerifiedPass(context, positions, parents, tokens, accepted, ids, probs)
        recycle(computed, NONE, k, stamp, *apart)
        labels = GreedyLabels(models[1], nodes, label_tokens, kinds, kept)
        recycle(computed, NONE, k, stamp, *fused, labels)
        assert _contents(fused) == _contents(apart)
        context += rng.integers(0, vocab, 2).tolist()
    for ours, theirs in zip(models[1].levels(), models[0].levels()):
        assert np.array_equal(ours[:, [SEEN, HITS, A, B]], theirs[:, [SEEN, HITS, A, B]])
    assert len(models[1]) == len(models[0]) > 0


def test_recycle_refuses_bad_labels_before_writing_or_counting():
    persistent, model = PersistentMemory(12, 4), AcceptanceModel()
    before = persistent.table.copy()
    ids, probs = np.tile(np.arange(4), (2, 1)), np.full((2, 4), 0.25, np.float32)
    labels = GreedyLabels(model, np.array([3]), np.array([5]), np.array([0]), 9)  # greedy row 4 of 2
    with pytest.raises(ValueError, match="greedy row 4"):
        recycle(
            VerifiedPass([1, 2, 3], np.array([2]), [-1], [4], [0], ids, probs),
            NONE,
            4,
            0,
            persistent,
            None,
            None,
            labels,
        )
    assert np.array_equal(persistent.table, before) and len(model) == 0


@pytest.mark.parametrize(
    ("rows", "parents", "accepted", "memory_k", "message"),
    [
        (2, [-1], [0], 4, "2 top-k rows for 2 positions and 1 nodes"),  # one row short
        (3, [-1], [1], 4, r"accepted nodes \[1\] outside a tree of 1 nodes"),
        (3, [-1], [0], 2, "records of width 4 for a persistent memory of k=2"),
    ],
)
def test_recycle_refuses_inconsistent_input_before_writing(rows, parents, accepted, memory_k, message):
    persistent = PersistentMemory(12, memory_k)
    before = persistent.table.copy()
    ids, probs = np.tile(np.arange(5), (rows, 1)), np.full((rows, 5), 0.2, np.float32)
    with pytest.raises(ValueError, match=message):
        recycle(
            VerifiedPass([1, 2, 3], np.array([1, 2]), parents, [4], accepted, ids, probs),
            NONE,
            4,
            0,
            persistent,
            None,
            None,
        )
    assert np.array_equal(persistent.table, before)


def test_recycle_refuses_zero_width_top_k_rows():
    persistent = PersistentMemory(12, 4)
    ids, probs = np.zeros((3, 0), dtype=np.int64), np.zeros((3, 0), dtype=np.float32)
    with pytest.raises(ValueError, match="top-k rows are empty"):
        recycle(
            VerifiedPass([1, 2, 3], np.array([1, 2]), [-1], [4], [0], ids, probs),
            NONE,
            4,
            0,
            persistent,
            None,
            None,
        )

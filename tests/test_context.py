"""The contextual memories C2/C3 (`recap.drafters.recap.context`): overwrite, the consensus fold, room."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recap.drafters.recap.context import ContextMemory, has_room
from recap.memory.records import PredictionRecord, concentration, pack_keys, record_table


def test_context_memory_overwrite_and_clear():
    memory = ContextMemory(2)
    memory.write((1, 2), PredictionRecord([5], [0.5], 1.0))
    memory.write((1, 2), PredictionRecord([6], [0.5], 1.0))
    assert memory.lookup((1, 2)).ids == [6] and len(memory) == 1  # latest wins
    memory.clear()
    assert memory.lookup((1, 2)) is None  # request-local: gone after clear


def test_fold_blends_earlier_requests_and_this_request_replaces():
    memory = ContextMemory(3)
    memory.write((1, 2, 3), PredictionRecord([7, 8], [0.6, 0.4], 0.0, 0))
    memory.fold(1, 1.0)
    assert memory.lookup((1, 2, 3)).ids == [7, 8]  # a first record is its own consensus
    memory.write((1, 2, 3), PredictionRecord([8, 9], [0.8, 0.2], 0.0, 1))
    assert memory.lookup((1, 2, 3)).ids == [8, 9]  # the request's own write wins within it
    memory.fold(2, 1.0)
    folded = memory.lookup((1, 2, 3))
    assert folded.ids == [8, 7] and folded.probs == pytest.approx([0.6, 0.3])  # (0.4 + 0.8) / 2, 0.6 / 2
    assert folded.request == 1 and folded.concentration == pytest.approx(float(concentration([0.6, 0.3])))
    memory.fold(3, 1.0)  # nothing new since request 2: the consensus still weighs two records
    memory.write((1, 2, 3), PredictionRecord([9, 8], [1.0, 0.0], 0.0, 3))
    memory.fold(4, 1.0)
    assert memory.lookup((1, 2, 3)).probs == pytest.approx([0.4, 1 / 3])  # 8: 0.6 * 2 / 3, 9: 1 / 3
    memory.clear()
    memory.write((1, 2, 3), PredictionRecord([5, 6], [0.5, 0.5], 0.0, 4))
    memory.fold(5, 1.0)
    assert memory.lookup((1, 2, 3)).ids == [5, 6]  # clear forgets the consensus too
    with pytest.raises(ValueError, match="decay"):
        memory.fold(6, 0.0)


def _reference_fold(history: list[tuple[int, int, dict[int, float]]], k: int, decay: float) -> dict:
    """Each key's expected record from ``(request, key, record)`` writes, folded at every request start."""
    consensus: dict[int, tuple[dict[int, float], float]] = {}
    latest: dict[int, dict[int, float]] = {}
    for request in [*sorted({r for r, _, _ in history}), None]:
        for key, record in latest.items():  # what the earlier requests left, folded as this one starts
            old, weight = consensus.get(key, ({}, 0.0))
            scores = {t: p for t, p in record.items()}
            for t, p in old.items():
                scores[t] = scores.get(t, 0.0) + decay * weight * p
            norm = decay * weight + 1.0
            top = sorted(scores.items(), key=lambda item: -item[1])[:k]
            consensus[key] = ({t: p / norm for t, p in top}, norm)
        latest = {}
        for r, key, record in history:
            if r == request:
                latest[key] = record
    return {key: record for key, (record, _) in consensus.items()}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.dictionaries(st.integers(0, 9), st.floats(0.05, 0.9), min_size=1, max_size=3),
        ),
        min_size=1, max_size=24,
    ),
    st.sampled_from([1.0, 0.9, 0.5]),
)  # fmt: skip
def test_fold_matches_a_reference_mean(writes, decay):
    """Requests of a few writes each, folded as each starts: every key holds the decayed mean of the
    records the requests left there (each request's last write), cut to the top k."""
    k, memory, history = 3, ContextMemory(2), []
    for request in range(0, len(writes), 3):
        memory.fold(request, decay)
        for key, dist in writes[request : request + 3]:
            ids, probs = zip(*sorted(dist.items(), key=lambda item: -item[1]))
            padded = list(ids) + [90, 91][: k - len(ids)], list(probs) + [0.0] * (k - len(ids))
            memory.write((key, key), PredictionRecord(*padded, 0.0, request))
            history.append((request, key, dict(zip(ids, probs))))
    memory.fold(len(writes) + 3, decay)
    for key, expected in _reference_fold(history, k, decay).items():
        record = memory.lookup((key, key))
        got = {t: p for t, p in zip(record.ids, record.probs) if p > 0}
        assert sorted(got.values()) == pytest.approx(sorted(expected.values()), rel=1e-5)
        ties = len(set(np.round(list(expected.values()), 5))) < len(expected)
        assert ties or got.keys() == expected.keys()  # the same tokens, unless a tie at the cut


def test_fold_keeps_the_consensus_when_the_table_grows_between_folds():
    memory = ContextMemory(2)
    memory.write((1, 1), PredictionRecord([5, 6], [0.9, 0.1], 0.0, 0))
    memory.fold(1, 1.0)
    rows = len(memory.table)
    for key in range(2, 3000):  # request 1 writes enough keys for the table to grow
        memory.write((key, key), PredictionRecord([5, 6], [0.5, 0.5], 0.0, 1))
    memory.write((1, 1), PredictionRecord([6, 5], [0.9, 0.1], 0.0, 1))
    assert len(memory.table) > rows
    memory.fold(2, 1.0)
    assert memory.lookup((1, 1)).probs == pytest.approx([0.5, 0.5])  # (0.9 + 0.1) / 2 each


def test_fold_starts_afresh_where_a_bounded_memory_reused_the_row():
    memory = ContextMemory(2, capacity=1)
    memory.write((1, 1), PredictionRecord([5, 6], [0.9, 0.1], 0.0, 0))
    memory.fold(1, 1.0)
    memory.write((2, 2), PredictionRecord([7, 8], [0.8, 0.2], 0.0, 1))  # takes the only row
    memory.fold(2, 1.0)
    assert memory.lookup((1, 1)) is None and memory.lookup((2, 2)).probs == pytest.approx([0.8, 0.2])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=60), st.integers(1, 30), st.sampled_from([None, 5, 40])
)
def test_has_room_exactly_when_reserve_changes_nothing(writes, count, capacity):
    """The compiled writers' room check (`has_room`) says yes exactly when `ContextMemory.reserve` would
    rebuild or grow nothing, and always after it, through growth, reuse of rows (bounded) and clearing."""
    memory = ContextMemory(2, capacity=capacity)
    memory.write_table(np.array([1]), record_table(np.zeros((1, 2)), np.zeros((1, 2)), [0.0], [0]))
    for step, key in enumerate(writes):
        if step % 17 == 16:
            memory.clear()
        index = memory.index
        before = (index.keys, index.owner, memory.table, len(index.keys), len(index.owner), len(memory.table))
        room = has_room(index.keys, index.owner, index.state, memory.table, count)
        memory.reserve(count, 2)
        after = (index.keys, index.owner, memory.table, len(index.keys), len(index.owner), len(memory.table))
        assert room == all(a is b if isinstance(a, np.ndarray) else a == b for a, b in zip(before, after))
        assert has_room(index.keys, index.owner, index.state, memory.table, count)  # `reserve` made room
        memory.write_table(np.array([key]), record_table(np.zeros((1, 2)), np.zeros((1, 2)), [0.0], [0]))


def test_context_memory_rows_slots_and_the_empty_record():
    memory = ContextMemory(2)
    assert memory.slots(pack_keys(np.array([[1, 2]]))).tolist() == [0]  # nothing yet: the empty row
    memory.write_rows(
        pack_keys(np.array([[1, 2], [3, 4], [1, 2]])),
        np.array([[5, 6], [7, 8], [9, 1]]),
        np.array([[0.6, 0.4]] * 3),
        np.array([0.1, 0.2, 0.3]),
        request=4,
    )
    rows = memory.slots(pack_keys(np.array([[1, 2], [3, 4], [9, 9]])))
    assert rows[2] == 0 and memory.table[0, 0] == -1  # missing key -> the empty record (id -1)
    assert memory.lookup((1, 2)) == PredictionRecord([9, 1], pytest.approx([0.6, 0.4]), pytest.approx(0.3), 4)
    assert sorted(memory.keys()) == [(1, 2), (3, 4)] and (3, 4) in memory and len(memory) == 2


def test_a_full_stream_memory_reuses_the_oldest_row():
    memory = ContextMemory(2, capacity=2)
    for key in ([1, 1], [2, 2], [3, 3]):
        memory.write_rows(pack_keys(np.array([key])), np.array([key]), np.array([[1.0, 0.0]]), np.ones(1), 0)
    assert sorted(memory.keys()) == [(2, 2), (3, 3)] and memory.lookup((3, 3)).ids == [3, 3]
    assert len(memory.table) == 3  # two rows and the empty one, never more


def test_writes_to_a_shared_context_memory_wait_for_its_lock():
    # Concurrent studio requests share a stream-scope memory: a write allocates rows under a lock.
    import threading

    memory = ContextMemory(2, capacity=4)
    done = threading.Event()

    def write():
        memory.write_rows(pack_keys(np.array([[1, 2]])), np.array([[3, 4]]), np.array([[1.0, 0.0]]), [1.0], 0)
        done.set()

    with memory._lock:
        threading.Thread(target=write).start()
        assert not done.wait(0.2) and len(memory) == 0  # blocked while another writer holds the lock
    assert done.wait(60) and memory.lookup((1, 2)).ids == [3, 4]  # 60 s: generous for a busy CPU

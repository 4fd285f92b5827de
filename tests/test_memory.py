"""Prediction records, the persistent and contextual memories, their file format, recycling keys."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recap.memory.context import ContextMemory, has_room
from recap.memory.estimates import BUCKETS, HITS, SEEN, A, AcceptanceModel, B
from recap.memory.persistent import ORPHAN_AGE_S, PersistentMemory, remove_orphans
from recap.memory.records import (
    PredictionRecord,
    concentration,
    fit_topk,
    last_occurrence,
    last_rows,
    record_rows,
    record_table,
)
from recap.memory.recycling import GreedyLabels, VerifiedPass, recycle, recycling_keys, write_recycled

NONE = np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize(
    ("probs", "expected"),
    [
        ([1.0, 0.0], 1.0),  # all mass on one token: fully concentrated
        ([0.5, 0.5], 0.0),  # uniform: no confidence
        ([0.2, 0.2], 0.0),  # renormalised first, so little top-k mass is still uniform
        ([0.8, 0.2], 1 - (0.8 * math.log(1 / 0.8) + 0.2 * math.log(1 / 0.2)) / math.log(2)),  # 0.2781
        ([0.0, 0.0], 0.0),  # empty row counts as uniform
    ],
)
def test_concentration(probs, expected):
    assert concentration(np.array([probs]))[0] == pytest.approx(expected, abs=1e-6)


def test_fit_topk_sorts_cuts_and_pads():
    ids, probs = fit_topk(np.array([[3, 4, 5]]), np.array([[0.1, 0.6, 0.3]]), 2)
    assert ids.tolist() == [[4, 5]]  # sorted by probability, then cut to k
    ids, probs = fit_topk(np.array([[3]]), np.array([[0.9]]), 3)
    assert ids.tolist() == [[3, 3, 3]] and probs.tolist()[0][1:] == [0.0, 0.0]  # padded with zero mass


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([4, 2, 4], [1, 2]),  # the later 4 wins
        ([1, 1, 1], [2]),  # only the last row survives
        ([3, 2, 1], [0, 1, 2]),  # distinct keys: everything kept, in order
    ],
)
def test_last_occurrence(keys, expected):
    assert last_occurrence(np.array(keys)).tolist() == expected
    kept = last_rows(keys)  # the list form: None when nothing is dropped
    assert (list(range(len(keys))) if kept is None else kept) == expected
    assert (kept is None) == (len(set(keys)) == len(keys))


def test_persistent_write_lookup_overwrite():
    memory = PersistentMemory(vocab_size=10, k=2)
    assert memory.lookup(3) is None  # nothing written yet
    memory.write_many(np.array([3, 3, 4]), np.array([[1, 2], [5, 6], [7, 8]]), np.array([[0.6, 0.4]] * 3))
    assert memory.lookup(3).ids == [5, 6]  # overwrite-with-latest inside one bulk write
    memory.write_many(np.array([4]), np.array([[9, 1]]), np.array([[1.0, 0.0]]))
    assert memory.lookup(4).ids == [9, 1] and memory.lookup(4).concentration == pytest.approx(1.0)
    assert memory.lookup(99) is None and len(memory) == 2  # out of vocabulary: no record
    memory.reset()
    assert len(memory) == 0 and memory.lookup(3) is None


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


# ---------------------------------------------------------------------------------------------- files
def filled_memory(vocab: int = 20, k: int = 3) -> PersistentMemory:
    memory = PersistentMemory(vocab, k)
    memory.write_many(np.array([1, 7]), np.array([[2, 3, 4], [5, 6, 0]]), np.array([[0.7, 0.2, 0.1]] * 2))
    return memory


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "p1.safetensors"
    filled_memory().save(path, "tok-abc")
    loaded = PersistentMemory.load(path, "tok-abc", 20, 3)
    assert loaded.lookup(7).ids == [5, 6, 0] and len(loaded) == 2
    assert loaded.lookup(1).concentration == pytest.approx(filled_memory().lookup(1).concentration)
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


@pytest.mark.parametrize(
    ("fingerprint", "vocab", "k", "reason"),
    [
        ("tok-other", 20, 3, "fingerprint"),  # another tokenizer
        ("tok-abc", 21, 3, "vocab_size"),  # another vocabulary size
        ("tok-abc", 20, 4, "k"),  # another record width
    ],
)
def test_mismatched_file_gives_fresh_memory(tmp_path, caplog, fingerprint, vocab, k, reason):
    path = tmp_path / "p1.safetensors"
    filled_memory().save(path, "tok-abc")
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="recap.memory.persistent"):
        loaded = PersistentMemory.load(path, fingerprint, vocab, k)
    assert len(loaded) == 0 and reason in caplog.text
    assert path.read_bytes() == before  # a failed load never touches the file


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: b"garbage" * 10,  # not safetensors at all
        lambda data: b"",  # empty file
    ],
)
def test_corrupt_file_gives_fresh_memory_and_stays_untouched(tmp_path, caplog, damage):
    path = tmp_path / "p1.safetensors"
    filled_memory().save(path, "tok-abc")
    path.write_bytes(damage(path.read_bytes()))
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="recap.memory.persistent"):
        loaded = PersistentMemory.load(path, "tok-abc", 20, 3)
    assert len(loaded) == 0 and "not loaded" in caplog.text
    assert path.read_bytes() == before


def test_missing_file_gives_fresh_memory(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="recap.memory.persistent"):
        loaded = PersistentMemory.load(tmp_path / "absent.safetensors", "tok", 20, 3)
    assert len(loaded) == 0 and "does not exist" in caplog.text
    assert not (tmp_path / "absent.safetensors").exists()


def test_wrong_format_version_is_rejected(tmp_path, monkeypatch):
    path = tmp_path / "p1.safetensors"
    monkeypatch.setattr("recap.memory.persistent.FORMAT_VERSION", "0")
    filled_memory().save(path, "tok-abc")
    monkeypatch.undo()
    assert len(PersistentMemory.load(path, "tok-abc", 20, 3)) == 0


def test_concurrent_saves_leave_a_valid_file(tmp_path):
    path = tmp_path / "p1.safetensors"
    memories = [filled_memory() for _ in range(6)]
    for i, memory in enumerate(memories):
        memory.write_many(np.array([9]), np.array([[i, i, i]]), np.array([[1.0, 0.0, 0.0]]))
    threads = [threading.Thread(target=m.save, args=(path, "tok-abc")) for m in memories for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loaded = PersistentMemory.load(path, "tok-abc", 20, 3)
    assert len(loaded) == 3 and loaded.lookup(9).ids[0] in range(6)  # one complete save won
    assert not list(tmp_path.glob("*.tmp"))


_KILLED_SAVE = """
import sys, time
import recap.memory.persistent as memory

def stuck(tensors, path, metadata=None):
    open(path, "wb").write(b"half a file")
    print("writing", flush=True)
    time.sleep(60)

memory.save_file = stuck
memory.PersistentMemory(20, 3).save(sys.argv[1], "tok-abc")
"""


@pytest.mark.parametrize("next_use", ["save", "load"])
def test_a_save_killed_midway_leaves_an_orphan_that_the_next_save_or_load_removes(tmp_path, next_use):
    path = tmp_path / "p1.safetensors"
    filled_memory().save(path, "tok-abc")
    before = path.read_bytes()
    root = Path(__file__).resolve().parent.parent
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVE, str(path)], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        writer.kill()
        writer.wait(timeout=30)
    orphans = list(tmp_path.glob(".p1.safetensors.*.tmp"))
    assert len(orphans) == 1 and path.read_bytes() == before  # the killed save never replaced the file
    if next_use == "save":
        filled_memory().save(path, "tok-abc")
    else:
        assert len(PersistentMemory.load(path, "tok-abc", 20, 3)) == len(filled_memory())
    assert not list(tmp_path.glob("*.tmp"))


def test_orphans_are_told_from_saves_in_progress(tmp_path):
    path = tmp_path / "p1.safetensors"
    dead_pid = _ended_process_id()
    in_progress = tmp_path / f".p1.safetensors.{os.getpid()}-abc.tmp"  # this process: still saving
    dead = tmp_path / f".p1.safetensors.{dead_pid}-abc.tmp"  # its writer is gone
    old = tmp_path / ".p1.safetensors.k2j3h4.tmp"  # an older name without a pid, an hour old
    other = tmp_path / ".p2.safetensors.1-abc.tmp"  # another file's sibling
    for file in (in_progress, dead, old, other):
        file.write_bytes(b"x")
    os.utime(old, (time.time() - 2 * ORPHAN_AGE_S,) * 2)
    assert sorted(remove_orphans(path)) == sorted([dead, old])
    assert in_progress.exists() and other.exists()


def _ended_process_id() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    return process.pid


# ------------------------------------------------------------------------------------- recycling keys
@pytest.mark.parametrize(
    ("context", "positions", "parents", "tokens", "accepted", "excluded", "rows", "keys", "lengths"),
    [
        # one pending position and one accepted node under the root
        ([5, 6, 7], [2], [-1], [8], [0], [], [0, 1], [[5, 6, 7], [6, 7, 8]], [3, 3]),
        # rejected node written first; a grandchild's key follows its own path
        (
            [5, 6, 7],
            [2],
            [-1, 0, -1],
            [8, 9, 4],
            [0, 1],
            [],
            [3, 0, 1, 2],
            [[6, 7, 4], [5, 6, 7], [6, 7, 8], [7, 8, 9]],
            [3, 3, 3, 3],
        ),
        # prefill positions at the start: short keys only
        ([5, 6], [0, 1], [], [], [], [], [0, 1], [[-1, -1, 5], [-1, 5, 6]], [1, 2]),
        # image token 6 inside a key cuts it; as the last token it makes the row unusable
        ([5, 6, 7], [1, 2], [-1], [8], [], [6], [2, 0, 1], [[6, 7, 8], [-1, 5, 6], [5, 6, 7]], [2, 0, 1]),
    ],
)
def test_recycling_keys(context, positions, parents, tokens, accepted, excluded, rows, keys, lengths):
    got_rows, got_keys, got_lengths = recycling_keys(
        context, np.array(positions), parents, tokens, accepted, np.array(excluded, dtype=np.int64)
    )
    assert (got_rows.tolist(), got_keys.tolist(), got_lengths.tolist()) == (rows, keys, lengths)


@pytest.mark.parametrize(
    ("ids", "probs", "k"),
    [
        ([[5, 6, 7]], [[0.5, 0.3, 0.2]], 3),  # sorted, as the target gives them
        ([[5, 6, 7]], [[0.2, 0.5, 0.3]], 3),  # unsorted: most probable first, ties stable
        ([[5, 6, 7]], [[0.4, 0.2, 0.4]], 3),
        ([[5, 6]], [[0.7, 0.3]], 4),  # narrower than k: padded with the last id, probability 0
        ([[5, 6, 7, 8]], [[0.4, 0.3, 0.2, 0.1]], 2),  # wider: cut
        ([[5, 6]], [[0.0, 0.0]], 2),  # all zero: counts as uniform (concentration 0)
        ([[9]], [[1.0]], 1),
    ],
)
def test_record_rows_equal_the_numpy_composition(ids, probs, k):
    fitted_ids, fitted_probs = fit_topk(np.array(ids), np.array(probs, dtype=np.float32), k)
    expected = record_table(fitted_ids, fitted_probs, concentration(fitted_probs), np.full(len(ids), 7))
    assert np.array_equal(record_rows(np.array(ids), np.array(probs, dtype=np.float32), k, 7), expected)


def test_record_rows_equal_the_numpy_composition_on_many_random_rows():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(8, 0.3), size=5000).astype(np.float32)
    ids = rng.integers(0, 50_000, (5000, 8))
    fitted_ids, fitted_probs = fit_topk(ids, probs, 8)
    expected = record_table(fitted_ids, fitted_probs, concentration(fitted_probs), np.full(5000, 3))
    assert np.array_equal(record_rows(ids, probs, 8, 3), expected)


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


def _guarded_memories():
    from recap.drafters.token_recycling import SuccessorMatrix
    from recap.memory.backoff import BackoffRecord

    context = ContextMemory(order=2)
    context.write((5, 6), PredictionRecord([1, 2], [0.6, 0.4], 0.5, request=3))
    persistent = PersistentMemory(vocab_size=10, k=2)
    persistent.write_many(np.array([4]), np.array([[1, 2]]), np.array([[0.7, 0.3]]), request=3)
    backoff = BackoffRecord(vocab_size=10, k=2)
    backoff.count([1, 1, 2])
    return [context, persistent, backoff, AcceptanceModel(), SuccessorMatrix(vocab_size=10, k=2)]


@pytest.mark.parametrize("index", range(5))
def test_a_guarded_memory_copies_with_a_lock_of_its_own(index):
    """`copy.deepcopy` of a memory that holds a lock (it failed: "cannot pickle '_thread.lock'") gives
    equal records, its own unlocked lock, and arrays of its own, even when copied while locked."""
    import copy

    memory = _guarded_memories()[index]
    with memory._lock:
        twin = copy.deepcopy(memory)
    assert type(twin) is type(memory) and twin._lock is not memory._lock and not twin._lock.locked()
    arrays = {k: v for k, v in vars(memory).items() if isinstance(v, np.ndarray)}
    for name, array in arrays.items():
        copied = vars(twin)[name]
        assert copied is not array and np.array_equal(copied, array), name
    with twin._lock:  # usable, and independent of the original's
        assert memory._lock.acquire(blocking=False)
        memory._lock.release()

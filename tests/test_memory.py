"""Prediction records, the persistent memory and its file format, recycling keys, guarded memories."""

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

from recap.drafters.recap.context import ContextMemory
from recap.drafters.recap.estimates import AcceptanceModel
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
from recap.memory.recycling import recycling_keys


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


def test_persistent_table_mirrors_the_arrays():
    memory = PersistentMemory(10, 2)
    memory.write_many(np.array([3]), np.array([[1, 2]]), np.array([[0.7, 0.3]]), request=5)
    table = memory.table
    assert table.shape == (11, 6) and table[3].tolist() == pytest.approx([1, 2, 0.7, 0.3, table[3, 4], 5])
    assert table[4, 0] == -1 and table[10, 0] == -1  # no record, and the empty last row
    memory.write_many(np.array([4]), np.array([[8, 9]]), np.array([[1.0, 0.0]]), request=6)
    assert memory.table[4, :2].tolist() == [8, 9] and memory.lookup(4).request == 6
    memory.reset()
    assert memory.table[3, 0] == -1


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


def _guarded_memories():
    from recap.drafters.recap.backoff import BackoffRecord
    from recap.drafters.token_recycling import SuccessorMatrix

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

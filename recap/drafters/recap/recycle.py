"""RECAP's recycling step: a verified pass written into ``P1``, ``C2`` and ``C3``, in one compiled call.

Which computed position is written under which keys is `recap.memory.recycling.recycling_keys`, shared with
Token Recycling; here the records of a pass go under those keys into the 1-token memory and RECAP's
contextual memories (`recap.drafters.recap.context`), and the pass's greedy acceptance labels are
counted into the acceptance model (`recap.drafters.recap.estimates`), in the same call
(`recap.drafters.recap.drafter.RecapDrafter.observe`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numba
import numpy as np

from recap.drafters.recap.context import has_room
from recap.drafters.recap.estimates import (
    KIND_COLUMNS,
    AcceptanceModel,
    Counting,
    count_greedy,
    greedy_label_error,
)
from recap.memory.key_index import write_slot
from recap.memory.records import KEY_BITS, record_rows_compiled, topk_rows
from recap.memory.recycling import recycling_keys_compiled

if TYPE_CHECKING:
    from recap.drafters.recap.context import ContextMemory
    from recap.memory.persistent import PersistentMemory


def write_recycled(
    rows: np.ndarray,
    keys: np.ndarray,
    lengths: np.ndarray,
    records: np.ndarray,
    persistent: PersistentMemory | None,
    ctx2: ContextMemory | None,
    ctx3: ContextMemory | None,
) -> None:
    """The writes of a pass given its keys and records (`recycle` does keys, records and writes in one
    call; this is its reference and the building block for records built elsewhere): record
    ``records[rows[i]]`` (`recap.memory.records.record_table` layout) goes under ``P1[t]``, ``C2[t-1, t]`` and
    ``C3[t-2, t-1, t]`` where the key is usable (``lengths[i]`` >= 1, 2, 3), in order, so that later rows
    win (overwrite-with-latest); a memory given as None is not written, ``P1`` ignores tokens outside
    its vocabulary."""
    if len(rows) == 0:
        return
    k = (records.shape[1] - 2) // 2
    locks = _locks(persistent, ctx2, ctx3, None)
    for lock in locks:
        lock.acquire()
    try:
        for memory in (ctx2, ctx3):
            if memory is not None:
                memory.reserve(len(rows), k)
        memories = _memory_arrays(persistent, ctx2, ctx3)
        records = np.ascontiguousarray(records, dtype=np.float32)
        _write_recycled(rows, keys, lengths, records, k, memories)
    finally:
        for lock in reversed(locks):
            lock.release()


class VerifiedPass(NamedTuple):
    """What one verification pass computed, as recycling takes it.

    The sequence ``context``, the ``positions`` of it the pass computed, the verified tree (``parents``:
    node ids, -1 the root; ``tokens``) and its ``accepted`` nodes, and the target's top-k at every
    computed row (the positions, then the nodes): ``topk_ids``, ``topk_probs``."""

    context: Sequence[int]
    positions: np.ndarray
    parents: np.ndarray
    tokens: np.ndarray
    accepted: Sequence[int]
    topk_ids: np.ndarray
    topk_probs: np.ndarray


class GreedyLabels(NamedTuple):
    """The acceptance labels of a greedy pass, for `recycle` to count in its call: the arguments of
    `recap.drafters.recap.estimates.AcceptanceModel.update_greedy` but the greedy tokens, which are the top-k
    rows' first column (``first_row``: the number of positions)."""

    model: AcceptanceModel
    nodes: np.ndarray
    tokens: np.ndarray
    kinds: np.ndarray
    kept: int


def recycle(
    computed: VerifiedPass,
    excluded: np.ndarray,
    k: int,
    stamp: int,
    persistent: PersistentMemory | None,
    ctx2: ContextMemory | None,
    ctx3: ContextMemory | None,
    labels: GreedyLabels | None = None,
) -> None:
    """RECAP's whole recycling step after a pass, in one compiled call.

    The keys (`recap.memory.recycling.recycling_keys`; ``excluded``: the image placeholders), each computed
    row's record (`recap.memory.records.record_rows` of the pass's top-k, width ``k``, stamped ``stamp``)
    and `write_recycled`, with the same results as calling the three; with ``labels``, first the greedy
    labels' counts (`recap.drafters.recap.estimates.AcceptanceModel.update_greedy`, same results).

    Checked before anything is written or counted (ValueError): one top-k row per computed position
    (the ``positions``, then the tree's nodes), ``parents`` and ``tokens`` of one length, accepted nodes
    inside the tree, ``k`` the persistent memory's width, and the labels as `update_greedy` checks them."""
    context, positions, parents, tokens, accepted, topk_ids, topk_probs = computed
    positions = _ints(positions)
    count = len(positions) + len(tokens)
    if count == 0:
        if labels is not None:
            labels.model.update_greedy(*labels[1:], 0, np.zeros(0, dtype=np.int64))
        return
    ids, probs = topk_ids, topk_probs
    ready = isinstance(ids, np.ndarray) and isinstance(probs, np.ndarray) and ids.ndim == 2
    if not (ready and ids.shape == probs.shape and ids.shape[1] >= 1):
        ids, probs = topk_rows(topk_ids, topk_probs)  # (the decode loop's rows need nothing)
    ids, probs = np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(probs, dtype=np.float32)
    if len(ids) != count or len(parents) != len(tokens):
        raise ValueError(
            f"{len(ids)} top-k rows for {len(positions)} positions and {len(tokens)} nodes "
            f"({len(parents)} parents)"
        )
    if len(accepted) and not (min(accepted) >= 0 and max(accepted) < len(tokens)):
        raise ValueError(f"accepted nodes {list(accepted)} outside a tree of {len(tokens)} nodes")
    if persistent is not None and persistent.k != k:
        raise ValueError(f"records of width {k} for a persistent memory of k={persistent.k}")
    if labels is None:
        counting, label_arrays = _NO_COUNTING, _NO_LABELS
    else:
        nodes, label_tokens, kinds = _ints(labels.nodes), _ints(labels.tokens), _ints(labels.kinds)
        if not len(nodes) == len(label_tokens) == len(kinds):
            raise ValueError(f"{len(nodes)} nodes, {len(label_tokens)} tokens and {len(kinds)} kinds")
        counting = labels.model.counting()
        label_arrays = LabelArrays(True, nodes, label_tokens, kinds, int(labels.kept))
    # The context from two tokens before the first position: every key's tokens, and the last two.
    low = max(min(positions.tolist()) - 2, 0) if len(positions) else 0
    pass_arrays = PassArrays(
        _ints(context[low:]),
        low,
        positions,
        _ints(parents),
        _ints(tokens),
        _ints(accepted),
        _ints(excluded),
        ids,
        probs,
        int(stamp),
        k,
    )
    locks = _locks(persistent, ctx2, ctx3, labels)
    for lock in locks:
        lock.acquire()
    try:
        memories = (ctx2, ctx3)
        for memory in memories:  # the first write sets a memory's width (a wrong one is refused)
            if memory is not None and memory.k != k:
                memory.reserve(count, k)
        bad = _recycle(pass_arrays, _memory_arrays(persistent, ctx2, ctx3), label_arrays, counting)
        if bad == _NEEDS_ROOM:  # (nothing written: make room, then the very same call)
            for memory in memories:
                if memory is not None:
                    memory.reserve(count, k)
            bad = _recycle(pass_arrays, _memory_arrays(persistent, ctx2, ctx3), label_arrays, counting)
            if bad == _NEEDS_ROOM:
                raise RuntimeError("a contextual memory has no room for this pass's keys after reserve")
    finally:
        for lock in reversed(locks):
            lock.release()
    if bad >= 0:
        raise greedy_label_error(bad, label_arrays.nodes, label_arrays.kinds, len(positions), len(ids))


def _ints(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """``values`` as a 1-D int64 array (itself when it is one)."""
    array = np.asarray(values, dtype=np.int64)
    return array if array.ndim == 1 else array.reshape(-1)


class PassArrays(NamedTuple):
    """A `VerifiedPass` as the compiled recycling reads it: ``segment``, the context from index ``low``
    on (to its end); ``positions``, ``parents``, ``tokens``, ``accepted`` and the ``excluded`` tokens, int64;
    the top-k rows ``ids`` (int64) and ``probs`` (float32), made records of width ``k`` stamped ``stamp``."""

    segment: np.ndarray
    low: int
    positions: np.ndarray
    parents: np.ndarray
    tokens: np.ndarray
    accepted: np.ndarray
    excluded: np.ndarray
    ids: np.ndarray
    probs: np.ndarray
    stamp: int
    k: int


class PersistentArrays(NamedTuple):
    """``P1``'s arrays as the compiled writes take them (`recap.memory.persistent.PersistentMemory`), and
    whether it is written (``on``)."""

    on: bool
    ids: np.ndarray
    probs: np.ndarray
    filled: np.ndarray
    concentrations: np.ndarray
    stamps: np.ndarray
    table: np.ndarray


class ContextArrays(NamedTuple):
    """A contextual memory's arrays as the compiled writes take them: its hash index's (``keys``, ``rows``,
    ``owner``, ``state``: `recap.memory.key_index.KeyIndex`) and its record ``table``; ``on``: written."""

    on: bool
    keys: np.ndarray
    rows: np.ndarray
    owner: np.ndarray
    state: np.ndarray
    table: np.ndarray


class WrittenMemories(NamedTuple):
    """The memories one pass writes, as arrays (`_memory_arrays`): ``P1``, ``C2``, ``C3``."""

    persistent: PersistentArrays
    ctx2: ContextArrays
    ctx3: ContextArrays


class LabelArrays(NamedTuple):
    """`GreedyLabels` as the compiled recycling counts them (``on``: there are labels to count)."""

    on: bool
    nodes: np.ndarray
    tokens: np.ndarray
    kinds: np.ndarray
    kept: int


#: `_recycle`'s answer when a contextual memory must make room (`ContextMemory.reserve`) first.
_NEEDS_ROOM = -2
_NO_INTS = np.zeros(0, dtype=np.int64)
_NO_LABELS = LabelArrays(False, _NO_INTS, _NO_INTS, _NO_INTS, 0)
_NO_COUNTING = Counting(
    np.zeros((1, KIND_COLUMNS)), np.zeros((1, KIND_COLUMNS)), np.zeros(1, np.int64), 1.0, 1.0, 1.0, 1
)
_NO_IDS, _NO_ROWS = np.zeros((1, 1), np.int32), np.zeros(1, np.int64)
_NO_TABLE = np.zeros((1, 1), np.float32)
_NO_PERSISTENT = PersistentArrays(
    False, _NO_IDS, _NO_TABLE, np.zeros(1, bool), np.zeros(1, np.float32), _NO_ROWS, _NO_TABLE
)
_NO_CONTEXT = ContextArrays(False, _NO_ROWS, _NO_ROWS, _NO_ROWS, _NO_ROWS, _NO_TABLE)


def _locks(
    persistent: PersistentMemory | None,
    ctx2: ContextMemory | None,
    ctx3: ContextMemory | None,
    labels: GreedyLabels | None,
) -> list:
    """The locks a write takes, in one order everywhere: persistent, ctx2, ctx3, then the acceptance
    model (which no holder of it waits on a memory's lock from)."""
    locks = [m.frozen() for m in (persistent, ctx2, ctx3) if m is not None]
    if labels is not None:
        locks.append(labels.model.frozen())
    return locks


def _memory_arrays(
    persistent: PersistentMemory | None, ctx2: ContextMemory | None, ctx3: ContextMemory | None
) -> WrittenMemories:
    """The memories' arrays as `_write_recycled` takes them (the caller holds every memory's `frozen`; a
    contextual one written before); a memory given as None: placeholders and its flag off."""
    if persistent is not None:
        table = persistent.table  # (built on first use: under the lock, so no writer builds another)
        p_arrays = PersistentArrays(
            True,
            persistent.ids,
            persistent.probs,
            persistent.filled,
            persistent.concentrations,
            persistent.stamps,
            table,
        )
    else:
        p_arrays = _NO_PERSISTENT
    c_arrays = [
        _NO_CONTEXT
        if memory is None
        else ContextArrays(
            True, memory.index.keys, memory.index.rows, memory.index.owner, memory.index.state, memory.table
        )
        for memory in (ctx2, ctx3)
    ]
    return WrittenMemories(p_arrays, *c_arrays)


@numba.njit(cache=True, nogil=True)
def _recycle(computed, memories, labels, counting):
    """`recycle` on arrays: ``computed`` (`PassArrays`) written into ``memories`` (`WrittenMemories`),
    ``labels`` (`LabelArrays`) counted into ``counting`` (`Counting`). Returns -1; `_NEEDS_ROOM` when a
    contextual memory must make room first (`has_room`), or the first label `count_greedy` refused: then
    nothing is counted or written."""
    segment, low, positions, parents, tokens, accepted, excluded, ids, probs, stamp, k = computed
    count = len(positions) + len(tokens)
    c2, c3 = memories.ctx2, memories.ctx3
    if c2.on and not has_room(c2.keys, c2.owner, c2.state, c2.table, count):
        return _NEEDS_ROOM
    if c3.on and not has_room(c3.keys, c3.owner, c3.state, c3.table, count):
        return _NEEDS_ROOM
    if labels.on:
        bad = count_greedy(
            labels.nodes, labels.tokens, labels.kinds, labels.kept, len(positions), ids[:, 0], counting
        )
        if bad >= 0:
            return bad
    last = segment[-1] if len(segment) >= 1 else -1
    before_last = segment[-2] if len(segment) >= 2 else -1
    rows, keys, lengths = recycling_keys_compiled(
        segment, low, positions, parents, tokens, accepted, excluded, last, before_last
    )
    records = record_rows_compiled(ids, probs, k, stamp)
    _write_recycled(rows, keys, lengths, records, k, memories)
    return -1


@numba.njit(cache=True, nogil=True)
def _write_recycled(rows, keys, lengths, records, k, memories):
    """`write_recycled` on arrays: record ``records[rows[i]]`` under the usable keys ``keys[i]`` into
    ``memories`` (`WrittenMemories`), in order."""
    p_on, p_ids, p_probs, p_filled, p_concentrations, p_stamps, p_table = memories.persistent
    c2_on, c2_keys, c2_rows, c2_owner, c2_state, c2_table = memories.ctx2
    c3_on, c3_keys, c3_rows, c3_owner, c3_state, c3_table = memories.ctx3
    vocab = len(p_ids)
    for i in range(len(rows)):
        record = records[rows[i]]
        length, token = lengths[i], keys[i, 2]
        if p_on and length >= 1 and 0 <= token < vocab:
            for j in range(k):
                p_ids[token, j] = np.int32(record[j])
                p_probs[token, j] = record[k + j]
            p_filled[token] = True
            p_concentrations[token] = record[2 * k]
            p_stamps[token] = np.int64(record[2 * k + 1])
            p_table[token, :] = record
        if c2_on and length >= 2:
            slot = write_slot(c2_keys, c2_rows, c2_owner, (keys[i, 1] << KEY_BITS) | token, c2_state)
            c2_table[slot, :] = record
        if c3_on and length == 3:
            packed = (keys[i, 0] << (2 * KEY_BITS)) | (keys[i, 1] << KEY_BITS) | token
            slot = write_slot(c3_keys, c3_rows, c3_owner, packed, c3_state)
            c3_table[slot, :] = record

"""Recycling: which computed position's prediction is written under which context keys, in which order.

After a verification pass, every position whose logits the pass computed (the pending committed
tokens and every tree node, accepted or rejected) writes its record under the 1-, 2- and 3-token keys
that end there; a tree node's key follows its own path. Token Recycling writes the 1-token keys only
(`recap.drafters.token_recycling`), RECAP all three (`recap.drafters.recap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

import numba
import numpy as np

from recap.key_index import write_slot
from recap.records import KEY_BITS, record_rows_compiled, topk_rows

if TYPE_CHECKING:
    from recap.context_memory import ContextMemory
    from recap.memory import PersistentMemory


def recycling_keys(
    context: Sequence[int],
    positions: np.ndarray,
    parents: Sequence[int],
    tokens: Sequence[int],
    accepted: Sequence[int],
    excluded: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which observation row is written under which 1/2/3-token keys, in write order.

    Rows of an observation are the ``positions`` of ``context`` first, then the tree nodes (``parents``,
    ``tokens``); node ``j`` continues ``context`` by its own path. Returns ``(rows, keys, lengths)``:
    ``rows`` (R,) indices into the observation's top-k rows, ordered rejected nodes, then positions, then
    accepted nodes, so that with overwrite-with-latest the committed sequence wins over speculation;
    ``keys`` (R, 3) the tokens ``(t-2, t-1, t)`` ending at each row's position (-1 when missing);
    ``lengths`` (R,) how many trailing key tokens are usable (0-3): a key containing an ``excluded``
    token (image placeholder) or reaching before the sequence start is never used.

    Example: context ``[5, 6, 7]``, positions ``[2]``, one node (token 8 under the root), accepted::

        rows = [0, 1];  keys = [[5, 6, 7], [6, 7, 8]];  lengths = [3, 3]
    """
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    low = max(int(positions.min()) - 2, 0) if len(positions) else 0
    last = int(context[-1]) if len(context) >= 1 else -1
    before_last = int(context[-2]) if len(context) >= 2 else -1
    return _recycling_keys(
        np.asarray(context[low:], dtype=np.int64),
        low,
        positions,
        np.asarray(parents, dtype=np.int64).reshape(-1),
        np.asarray(tokens, dtype=np.int64).reshape(-1),
        np.asarray(accepted, dtype=np.int64).reshape(-1),
        np.asarray(excluded, dtype=np.int64).reshape(-1),
        last,
        before_last,
    )


@numba.njit(cache=True, nogil=True)
def _recycling_keys(segment, low, positions, parents, tokens, accepted, excluded, last, before_last):
    """`recycling_keys` on arrays: ``segment`` is the context from index ``low`` on."""
    n_pos, n_nodes = len(positions), len(tokens)
    keys = np.full((n_pos + n_nodes, 3), -1, dtype=np.int64)
    for i in range(n_pos):
        for back in range(3):
            at = positions[i] - back
            if at >= 0:
                keys[i, 2 - back] = segment[at - low]
    for j in range(n_nodes):
        parent = parents[j]
        row = n_pos + j
        keys[row, 2] = tokens[j]
        if parent < 0:
            keys[row, 1], keys[row, 0] = last, before_last
        else:
            keys[row, 1] = tokens[parent]
            grand = parents[parent]
            keys[row, 0] = tokens[grand] if grand >= 0 else last
    lengths = np.zeros(n_pos + n_nodes, dtype=np.int64)
    for row in range(n_pos + n_nodes):
        for column in range(2, -1, -1):
            token = keys[row, column]
            usable = token >= 0
            for placeholder in excluded:
                if token == placeholder:
                    usable = False
            if not usable:
                break
            lengths[row] += 1
    is_accepted = np.zeros(n_nodes, dtype=np.bool_)
    for node in accepted:
        is_accepted[node] = True
    rows = np.empty(n_pos + n_nodes, dtype=np.int64)
    at = 0
    for j in range(n_nodes):
        if not is_accepted[j]:
            rows[at] = n_pos + j
            at += 1
    for i in range(n_pos):
        rows[at] = i
        at += 1
    for node in accepted:
        rows[at] = n_pos + node
        at += 1
    rows = rows[:at]
    return rows, keys[rows], lengths[rows]


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
    ``records[rows[i]]`` (`recap.records.record_table` layout) goes under ``P1[t]``, ``C2[t-1, t]`` and
    ``C3[t-2, t-1, t]`` where the key is usable (``lengths[i]`` >= 1, 2, 3), in order, so that later rows
    win (overwrite-with-latest); a memory given as None is not written, ``P1`` ignores tokens outside
    its vocabulary."""
    if len(rows) == 0:
        return
    k = (records.shape[1] - 2) // 2
    with ExitStack() as held:
        arrays = _held_memories(held, len(rows), k, persistent, ctx2, ctx3)
        records = np.ascontiguousarray(records, dtype=np.float32)
        _write_recycled(rows, keys, lengths, records, k, *arrays)


def recycle(
    context: Sequence[int],
    positions: np.ndarray,
    parents: np.ndarray,
    tokens: np.ndarray,
    accepted: Sequence[int],
    excluded: np.ndarray,
    topk_ids: np.ndarray,
    topk_probs: np.ndarray,
    k: int,
    stamp: int,
    persistent: PersistentMemory | None,
    ctx2: ContextMemory | None,
    ctx3: ContextMemory | None,
) -> None:
    """RECAP's whole recycling step after a pass, in one compiled call: `recycling_keys`, each computed
    row's record (`recap.records.record_rows` of the top-k ``topk_ids``/``topk_probs``, width ``k``,
    stamped ``stamp``) and `write_recycled`, with the same results as calling the three.

    Checked before anything is written (ValueError): one top-k row per computed position (the
    ``positions``, then the tree's nodes), ``parents`` and ``tokens`` of one length, accepted nodes
    inside the tree, ``k`` the persistent memory's width."""
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    count = len(positions) + len(tokens)
    if count == 0:
        return
    ids, probs = topk_ids, topk_probs
    ready = isinstance(ids, np.ndarray) and isinstance(probs, np.ndarray) and ids.ndim == 2
    if not (ready and ids.shape == probs.shape and ids.dtype == np.int64 and probs.dtype == np.float32):
        ids, probs = topk_rows(topk_ids, topk_probs)  # (the decode loop's rows need nothing)
    if len(ids) != count or len(parents) != len(tokens):
        raise ValueError(
            f"{len(ids)} top-k rows for {len(positions)} positions and {len(tokens)} nodes "
            f"({len(parents)} parents)"
        )
    if any(not 0 <= node < len(tokens) for node in accepted):
        raise ValueError(f"accepted nodes {list(accepted)} outside a tree of {len(tokens)} nodes")
    if persistent is not None and persistent.k != k:
        raise ValueError(f"records of width {k} for a persistent memory of k={persistent.k}")
    low = max(int(positions.min()) - 2, 0) if len(positions) else 0
    last = int(context[-1]) if len(context) >= 1 else -1
    before_last = int(context[-2]) if len(context) >= 2 else -1
    with ExitStack() as held:
        arrays = _held_memories(held, count, k, persistent, ctx2, ctx3)
        _recycle(
            _ints(context[low:]), low, positions, _ints(parents), _ints(tokens), _ints(accepted),
            _ints(excluded), last, before_last,
            np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(probs, dtype=np.float32),
            int(stamp), k, *arrays,
        )


def _ints(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _held_memories(
    held: ExitStack,
    count: int,
    k: int,
    persistent: PersistentMemory | None,
    ctx2: ContextMemory | None,
    ctx3: ContextMemory | None,
) -> tuple:
    """The memories' arrays as `_write_recycled` takes them, each memory frozen (in one order
    everywhere: persistent, ctx2, ctx3) and the contextual ones with room for ``count`` more keys; a
    memory given as None: placeholders and its flag off."""
    no_ids, no_rows = np.zeros((1, 1), np.int32), np.zeros(1, np.int64)
    no_table = np.zeros((1, 1), np.float32)
    if persistent is not None:
        held.enter_context(persistent.frozen())
        table = persistent.table  # (built on first use: under the lock, so no writer builds another)
        arrays: tuple = (True, persistent.ids, persistent.probs, persistent.filled, persistent.concentrations)
        arrays += (persistent.stamps, table)
    else:
        arrays = (False, no_ids, no_table, np.zeros(1, bool), np.zeros(1, np.float32), no_rows, no_table)
    for memory in (ctx2, ctx3):
        if memory is None:
            arrays += (False, no_rows, no_rows, no_rows, no_rows, no_table)
        else:
            held.enter_context(memory.frozen())
            memory.reserve(count, k)
            index = memory.index
            arrays += (True, index.keys, index.rows, index.owner, index.state, memory.table)
    return arrays


@numba.njit(cache=True, nogil=True)
def _recycle(
    segment, low, positions, parents, tokens, accepted, excluded, last, before_last, ids, probs, stamp, k,
    p_on, p_ids, p_probs, p_filled, p_concentrations, p_stamps, p_table,
    c2_on, c2_keys, c2_rows, c2_owner, c2_state, c2_table,
    c3_on, c3_keys, c3_rows, c3_owner, c3_state, c3_table,
):
    """`recycle` on arrays."""
    rows, keys, lengths = _recycling_keys(
        segment, low, positions, parents, tokens, accepted, excluded, last, before_last
    )
    records = record_rows_compiled(ids, probs, k, stamp)
    _write_recycled(
        rows, keys, lengths, records, k,
        p_on, p_ids, p_probs, p_filled, p_concentrations, p_stamps, p_table,
        c2_on, c2_keys, c2_rows, c2_owner, c2_state, c2_table,
        c3_on, c3_keys, c3_rows, c3_owner, c3_state, c3_table,
    )


@numba.njit(cache=True, nogil=True)
def _write_recycled(
    rows, keys, lengths, records, k,
    p_on, p_ids, p_probs, p_filled, p_concentrations, p_stamps, p_table,
    c2_on, c2_keys, c2_rows, c2_owner, c2_state, c2_table,
    c3_on, c3_keys, c3_rows, c3_owner, c3_state, c3_table,
):
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

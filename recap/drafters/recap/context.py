"""``C2``/``C3``: the contextual memories, ``(t-1, t) -> record`` and ``(t-2, t-1, t) -> record``.

Request-local in the paper (the drafter clears them at every request); kept for the whole stream
with ``context_scope="stream"`` (`recap.drafters.recap.stream.StreamMemory.context2` / ``context3``, bounded).
Overwrite-with-latest within a request. Across requests a stream memory can instead keep a
*consensus* (`ContextMemory.fold`, ``RecapConfig.context_consensus``): at a request's start every
record the earlier requests wrote since the last fold is blended into the decayed mean of the records
earlier requests left under its key, so a key this request has not written yet offers what most
earlier requests (images) predicted there, not only the latest one. Which keys are written is the
drafter's business (`recap.drafters.recap.recycle`).

Example::

    c2 = ContextMemory(2)
    c2.write((4, 5), PredictionRecord([6, 7], [0.7, 0.2], 0.4))
    c2.lookup((4, 5)).ids        # [6, 7]
    c2.lookup((5, 4))            # None
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numba
import numpy as np

from recap.memory.guarded import Guarded
from recap.memory.key_index import KeyIndex
from recap.memory.records import (
    KEY_BITS,
    PredictionRecord,
    fit_topk,
    last_rows,
    record_table,
    row_concentration,
)


class ContextMemory(Guarded):
    """``C2``/``C3``: ``key -> record`` (overwrite-with-latest), cleared per request by the drafter unless
    it keeps them for the whole stream (then bounded by ``capacity``: a full memory reuses the row of
    the key stored longest ago; `fold` turns the earlier requests' records into a consensus).

    Array-backed: a `recap.memory.key_index.KeyIndex` maps each packed key (`pack_keys`) to a row of
    ``table`` (`record_table` layout; row 0 is an empty record, id -1, for keys that have none), so that
    a drafter looks up and writes many contexts at once (`slots`, `write_rows`), compiled tree growth
    reads it directly, and no per-record Python object is kept. Keys are given as token tuples
    (`lookup`, `write`, `keys`) or packed (`slots`, `write_rows`).
    """

    def __init__(self, order: int, capacity: int | None = None) -> None:
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.order = order
        self.capacity = capacity
        self.k = 0  # record width, set by the first write
        self.table = np.zeros((0, 2), dtype=np.float32)
        self.index = KeyIndex(capacity)  # packed key -> row
        self._lock = threading.Lock()  # stream-scope memories are shared by concurrent requests
        # `fold`: each row's consensus (`record_table` layout, the last column its weight), the key it
        # belongs to (a bounded memory reuses rows), and the first request not folded yet.
        self._consensus = np.zeros((0, 2), dtype=np.float32)
        self._consensus_keys = np.zeros(0, dtype=np.int64)
        self._folded_from = -1

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self._row(key) > 0

    def keys(self) -> list[tuple[int, ...]]:
        """Every key that holds a record, as token tuples."""
        mask = (1 << KEY_BITS) - 1
        return [
            tuple((packed >> (KEY_BITS * (self.order - 1 - i))) & mask for i in range(self.order))
            for packed in self.index.items()[0].tolist()
        ]

    def lookup(self, key: tuple[int, ...]) -> PredictionRecord | None:
        """The record under ``key`` (a tuple of ``order`` tokens): the latest one written, or the
        consensus `fold` made of it and earlier ones; None when there is none."""
        row = self._row(key)
        if row == 0:
            return None
        k, values = self.k, self.table[row]
        return PredictionRecord(
            values[:k].astype(np.int64).tolist(),
            values[k : 2 * k].tolist(),
            float(values[2 * k]),
            int(values[-1]),
        )

    def slots(self, packed: np.ndarray) -> np.ndarray:
        """Row of each packed key in ``table``, 0 (the empty record) where there is none."""
        return self.index.find(packed)

    def write(self, key: tuple[int, ...], record: PredictionRecord) -> None:
        """Store ``record`` under ``key`` (``order`` tokens), replacing an older one."""
        self.write_many([(key, record)])

    def write_many(self, items: Iterable[tuple[tuple[int, ...], PredictionRecord]]) -> None:
        """Store ``(key, record)`` pairs in order, later ones winning (records narrower than the memory's
        width are padded with probability 0)."""
        for key, record in items:
            width = max(len(record.ids), self.k)
            ids, probs = fit_topk(np.array([record.ids]), np.array([record.probs], dtype=np.float32), width)
            self.write_rows(
                np.array([self._pack(key)]), ids, probs, np.array([record.concentration]), record.request
            )

    def write_rows(
        self, packed: np.ndarray, ids: np.ndarray, probs: np.ndarray, concentrations: np.ndarray, request: int
    ) -> None:
        """Store row ``i`` of ``ids``/``probs`` ``(R, k)`` and ``concentrations`` under the packed key
        ``packed[i]``, stamped with ``request``; a key given twice keeps its last row."""
        packed = np.asarray(packed, dtype=np.int64).reshape(-1)
        if len(packed) == 0:
            return
        ids, probs = np.asarray(ids), np.asarray(probs)
        if self.k and ids.shape[1] != self.k:
            ids, probs = fit_topk(ids, probs, self.k)
        stamps = np.full(len(ids), request)
        self.write_table(packed, record_table(ids, probs, np.asarray(concentrations), stamps))

    def write_table(self, packed: np.ndarray, rows: np.ndarray) -> None:
        """Store ``rows`` (`record_table` layout, ``(R, 2k + 2)``, k this memory's width once set) under
        the packed keys ``packed`` ``(R,)``; a key given twice keeps its last row."""
        if len(packed) == 0:
            return
        keys = np.asarray(packed, dtype=np.int64)
        keep = last_rows(keys.tolist())
        if keep is not None:
            keys, rows = keys[keep], rows[keep]
        with self._lock:
            self.reserve(len(keys), (rows.shape[1] - 2) // 2)
            self.table[self.index.write_slots(keys)] = rows

    def reserve(self, count: int, k: int) -> None:
        """Make room for ``count`` more keys with records of width ``k`` (the first write sets the
        memory's width; the caller holds `frozen` or is `write_table`)."""
        if self.k == 0:
            self.k = k
            self.table = record_table(np.full((1, k), -1), np.zeros((1, k)), [0.0], [-1])
        elif k != self.k:
            raise ValueError(f"records of width {k} for a memory of k={self.k}")
        self.index.reserve(count)
        used = self.index.rows_used
        need = min(used + count, self.capacity or used + count) + 1
        if need > len(self.table):
            grown = max(1024, 2 * len(self.table), need)
            if self.capacity is not None:
                grown = min(grown, self.capacity + 1)
            table = np.zeros((grown, self.table.shape[1]), dtype=np.float32)
            table[: len(self.table)] = self.table
            self.table = table

    def frozen(self) -> threading.Lock:
        """Hold writers off while compiled code reads ``index`` and ``table`` directly (a write may add
        keys whose rows lie beyond the table it replaces): ``with memory.frozen(): ...`` (the memory's
        lock itself, so holding it costs no more than a lock)."""
        return self._lock

    def clear(self) -> None:
        """Forget every record (start of a request), and the consensus."""
        with self._lock:
            self.index.clear()
            self._consensus_keys.fill(-1)
            self._folded_from = -1

    def fold(self, request: int, decay: float) -> None:
        """Blend the records written since the last fold by requests numbered below ``request`` into the
        consensus of their keys, and make each such row hold the consensus (call it as ``request``
        starts; with ``decay`` in (0, 1]).

        A key's consensus is the mean of the records earlier requests left there, each record's weight
        ``decay`` times that of the next one left under the key:
        ``c <- (decay * w * c + r) / (decay * w + 1)``, ``w <- decay * w + 1``, cut to the top k and its
        concentration recomputed. The row keeps the stamp of the last request that wrote it, so the
        acceptance kinds still see another request's record; this request's own writes then replace the
        row as before. Requests that run at once on one memory may see a record of theirs folded early,
        or not folded: only what is drafted changes.

        Example (k = 2, decay 1)::

            c3.write((1, 2, 3), PredictionRecord([7, 8], [0.6, 0.4], 0.0, 0))
            c3.fold(1, 1.0)
            c3.write((1, 2, 3), PredictionRecord([8, 9], [0.8, 0.2], 0.0, 1))
            c3.fold(2, 1.0)
            c3.lookup((1, 2, 3)).ids      # [8, 7]: 8 has (0.4 + 0.8) / 2, 7 has 0.6 / 2
        """
        if not (isinstance(decay, int | float) and 0.0 < decay <= 1.0):
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        with self._lock:
            if self.k == 0:
                return
            if len(self._consensus) < len(self.table):
                grown = np.zeros((len(self.table), self.table.shape[1]), dtype=np.float32)
                owners = np.full(len(self.table), -1, dtype=np.int64)
                if len(self._consensus_keys):
                    grown[: len(self._consensus)] = self._consensus
                    owners[: len(self._consensus_keys)] = self._consensus_keys
                self._consensus, self._consensus_keys = grown, owners
            _fold_rows(
                self.table, self._consensus, self._consensus_keys, self.index.owner,
                self.index.rows_used + 1, self.k, self._folded_from, request, float(decay),
            )  # fmt: skip
            self._folded_from = max(self._folded_from, request)

    def _pack(self, key: tuple[int, ...]) -> int:
        if len(key) != self.order:
            raise ValueError(f"a key of this memory has {self.order} tokens, got {key!r}")
        packed = 0
        for token in key:
            packed = (packed << KEY_BITS) | int(token)
        return packed

    def _row(self, key: tuple[int, ...]) -> int:
        return int(self.index.find(np.array([self._pack(key)]))[0])


@numba.njit(cache=True, nogil=True)
def has_room(keys, owner, state, table, count):
    """Whether a memory (its index's ``keys``, ``owner`` and ``state``, its ``table``; its width set) has
    room for ``count`` more keys: True exactly when `ContextMemory.reserve` ``(count, k)`` would change
    nothing (no index rebuild, no growth of ``owner`` or ``table``), so that compiled writers check it in
    their own call and ask for `reserve` only when it is needed."""
    next_row, capacity, taken = state[0], state[2], state[3]
    if 2 * (taken + count) > len(keys):  # `KeyIndex.reserve`: the hash slots
        return False
    need = next_row + count if capacity < 0 else min(next_row + count, capacity + 1)
    if need > len(owner):  # ... and the rows' keys
        return False
    rows = next_row - 1 + count if capacity < 0 else min(next_row - 1 + count, capacity)
    return rows + 1 <= len(table)  # `ContextMemory.reserve`: the record table


@numba.njit(cache=True, nogil=True)
def _fold_rows(table, consensus, consensus_keys, owner, used, k, since, request, decay):
    """`ContextMemory.fold` on the arrays: rows ``1..used-1`` stamped in ``[since, request)``."""
    ids = np.empty(2 * k, dtype=np.int64)
    scores = np.empty(2 * k, dtype=np.float64)
    for row in range(1, used):
        stamp = table[row, 2 * k + 1]
        if stamp < since or stamp >= request:
            continue
        weight = np.float64(consensus[row, 2 * k + 1]) if consensus_keys[row] == owner[row] else 0.0
        n = 0
        for j in range(k):  # the new record, then the consensus merged into it
            if table[row, k + j] > 0:
                ids[n], scores[n] = np.int64(table[row, j]), np.float64(table[row, k + j])
                n += 1
        for j in range(k if weight > 0 else 0):
            p = decay * weight * np.float64(consensus[row, k + j])
            if p <= 0:
                continue
            token, at = np.int64(consensus[row, j]), -1
            for i in range(n):
                if ids[i] == token:
                    at = i
                    break
            if at >= 0:
                scores[at] += p
            else:
                ids[n], scores[n] = token, p
                n += 1
        if n == 0:
            continue
        norm = decay * weight + 1.0
        order = np.argsort(-scores[:n], kind="mergesort")
        for j in range(k):
            if j < n:
                table[row, j] = np.float32(ids[order[j]])
                table[row, k + j] = np.float32(scores[order[j]] / norm)
            else:  # fewer than k tokens: the last id again, probability 0 (`fit_topk`'s padding)
                table[row, j] = table[row, n - 1]
                table[row, k + j] = 0.0
        table[row, 2 * k] = np.float32(row_concentration(table[row], k))
        consensus[row, : 2 * k + 1] = table[row, : 2 * k + 1]
        consensus[row, 2 * k + 1] = norm
        consensus_keys[row] = owner[row]

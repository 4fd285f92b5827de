"""``C2``/``C3``: the contextual memories, ``(t-1, t) -> record`` and ``(t-2, t-1, t) -> record``.

Request-local in the paper (the drafter clears them at every request); kept for the whole stream
with ``context_scope="stream"`` (`recap.memory.persistent.PersistentMemory.context2` / ``context3``, bounded).
Overwrite-with-latest. Which keys are written is the drafter's business (`recap.memory.recycling`).

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

from recap.memory.key_index import KeyIndex
from recap.memory.records import KEY_BITS, PredictionRecord, fit_topk, last_rows, record_table


class ContextMemory:
    """``C2``/``C3``: ``key -> record`` (overwrite-with-latest), cleared per request by the drafter unless
    it keeps them for the whole stream (then bounded by ``capacity``: a full memory reuses the row of
    the key stored longest ago).

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
        """The latest record under ``key`` (a tuple of ``order`` tokens), or None."""
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
        """Forget every record (start of a request)."""
        with self._lock:
            self.index.clear()

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

"""`KeyIndex`: packed context keys -> table rows, in two numpy arrays that compiled code reads directly.

The contextual memories (`recap.drafters.recap.context.ContextMemory`) map a packed 2- or 3-token key
(`recap.memory.records.pack_keys`) to a row of their record table. A Python dict would do for Python code,
but RECAP's tree growth runs compiled (`recap.drafters.recap.kernel`) and looks keys up itself, so
the map is an open-addressing hash table (linear probing, tombstones for removed keys) held in
``keys``/``rows`` arrays, with the probing functions compiled by numba and shared by both sides.

Example::

    index = KeyIndex()
    index.write_slots(np.array([7, 9])).tolist()   # [1, 2]: the rows to write the records to
    index.find(np.array([9, 8, 7])).tolist()       # [2, 0, 1]: 0 where a key is absent
"""

from __future__ import annotations

import numba
import numpy as np

#: Slot markers in `KeyIndex.keys` (packed keys are >= 0).
EMPTY, REMOVED = -1, -2

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing


@numba.njit(cache=True, nogil=True)
def home_slot(key: int, mask: int) -> int:
    """First slot probed for ``key`` in a table of ``mask + 1`` slots (a power of two)."""
    mixed = np.uint64(key) * _MULTIPLIER
    return np.int64((mixed >> np.uint64(29)) & np.uint64(mask))


@numba.njit(cache=True, nogil=True)
def find_row(keys: np.ndarray, rows: np.ndarray, key: int) -> int:
    """Row of ``key``, 0 when absent."""
    mask = len(keys) - 1
    slot = home_slot(key, mask)
    while True:
        held = keys[slot]
        if held == key:
            return rows[slot]
        if held == EMPTY:
            return 0
        slot = (slot + 1) & mask


@numba.njit(cache=True, nogil=True)
def _find_many(keys: np.ndarray, rows: np.ndarray, packed: np.ndarray) -> np.ndarray:
    found = np.zeros(len(packed), dtype=np.int64)
    for i in range(len(packed)):
        if packed[i] >= 0:
            found[i] = find_row(keys, rows, packed[i])
    return found


@numba.njit(cache=True, nogil=True)
def _put(keys: np.ndarray, rows: np.ndarray, key: int, row: int) -> int:
    """Map ``key`` to ``row``; returns 1 when it took a never-used slot (the load grew), else 0."""
    mask = len(keys) - 1
    slot = home_slot(key, mask)
    free = -1
    while True:
        held = keys[slot]
        if held == key:
            rows[slot] = row
            return 0
        if held == REMOVED and free < 0:
            free = slot
        if held == EMPTY:
            break
        slot = (slot + 1) & mask
    if free >= 0:
        keys[free], rows[free] = key, row
        return 0
    keys[slot], rows[slot] = key, row
    return 1


@numba.njit(cache=True, nogil=True)
def _remove(keys: np.ndarray, key: int) -> None:
    mask = len(keys) - 1
    slot = home_slot(key, mask)
    while True:
        held = keys[slot]
        if held == key:
            keys[slot] = REMOVED
            return
        if held == EMPTY:
            return
        slot = (slot + 1) & mask


@numba.njit(cache=True, nogil=True)
def _put_many(keys, rows, packed, targets) -> int:
    grown = 0
    for i in range(len(packed)):
        grown += _put(keys, rows, packed[i], targets[i])
    return grown


@numba.njit(cache=True, nogil=True)
def write_slot(keys, rows, owner, key, state) -> int:
    """The row to write ``key``'s record to: its row when held; else the next unused row, or (``state[2]``
    = capacity >= 0 and every row 1..capacity used) the row after the one reused last, whose key is
    forgotten. ``state``: next unused row, last reused row, capacity (-1: none), slots not EMPTY
    (updated). The caller made room (`KeyIndex.reserve`)."""
    row = find_row(keys, rows, key)
    if row == 0:
        capacity = state[2]
        if capacity >= 0 and state[0] > capacity:
            state[1] = state[1] % capacity + 1  # rows 1..capacity, round robin
            row = state[1]
            _remove(keys, owner[row])
        else:
            row = state[0]
            state[0] += 1
        owner[row] = key
        state[3] += _put(keys, rows, key, row)
    return row


@numba.njit(cache=True, nogil=True)
def _write_slots(keys, rows, owner, packed, state):
    slots = np.empty(len(packed), dtype=np.int64)
    for i in range(len(packed)):
        slots[i] = write_slot(keys, rows, owner, packed[i], state)
    return slots


class KeyIndex:
    """Packed key (int64 >= 0) -> row (>= 1) of a record table, row 0 meaning "absent"; rows are
    handed out by `write_slots` (one per key, ``1..capacity`` reused round robin when bounded).

    ``keys``/``rows``: the hash table's slots (`EMPTY`, `REMOVED` or a key, and its row), at most half
    of them used (removed ones included), rebuilt without the removed ones when a write would pass
    that. ``owner``: row -> key.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.owner = np.full(1, EMPTY, dtype=np.int64)
        self._state = np.array([1, 0, -1 if capacity is None else capacity, 0], dtype=np.int64)
        self._allocate(64)

    def __len__(self) -> int:
        return self.rows_used  # every row handed out belongs to exactly one key held

    @property
    def rows_used(self) -> int:
        """Rows handed out so far (row 0 excluded): the table needs ``rows_used + 1`` rows."""
        return int(self._state[0]) - 1

    def _allocate(self, slots: int) -> None:
        self.keys = np.full(slots, EMPTY, dtype=np.int64)
        self.rows = np.zeros(slots, dtype=np.int64)
        self._state[3] = 0

    def find(self, packed: np.ndarray) -> np.ndarray:
        """Row of each packed key, 0 where absent (negative keys are absent)."""
        return _find_many(self.keys, self.rows, np.ascontiguousarray(packed, dtype=np.int64))

    def reserve(self, count: int) -> None:
        """Make room for ``count`` more keys (hash slots and ``owner`` rows) before `write_slot` calls."""
        next_row, _, _, taken = self._state.tolist()  # (Python ints: this runs every pass)
        if 2 * (taken + count) > len(self.keys):
            self._rebuild(next_row - 1 + count)
        need = next_row + count
        if self.capacity is not None:
            need = min(need, self.capacity + 1)
        if need > len(self.owner):
            grown = np.full(max(need, 2 * len(self.owner)), EMPTY, dtype=np.int64)
            grown[: len(self.owner)] = self.owner
            self.owner = grown

    @property
    def state(self) -> np.ndarray:
        """What compiled writers update (`write_slot`): next unused row, last reused row, capacity, slots
        not EMPTY."""
        return self._state

    def write_slots(self, packed: np.ndarray) -> np.ndarray:
        """Rows for writing the keys ``packed`` in order (see `write_slot`); a row may repeat when a
        later key reuses the row of an earlier one (a bounded index that is full): the later wins."""
        packed = np.ascontiguousarray(packed, dtype=np.int64)
        self.reserve(len(packed))
        return _write_slots(self.keys, self.rows, self.owner, packed, self._state)

    def clear(self) -> None:
        self.keys.fill(EMPTY)
        self.owner.fill(EMPTY)
        self._state[0], self._state[1], self._state[3] = 1, 0, 0

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys held and their rows (in slot order)."""
        held = self.keys >= 0
        return self.keys[held], self.rows[held]

    def _rebuild(self, live: int) -> None:
        keys, rows = self.items()
        slots = len(self.keys)
        while 3 * live > slots:  # at most a third used after the rebuild
            slots *= 2
        self._allocate(slots)
        self._state[3] = _put_many(self.keys, self.rows, keys, rows)

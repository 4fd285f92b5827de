"""Where the image decides: the 2-token contexts that earlier answers continued in different ways.

A template word such as « is » or « at the » is followed by the same word whatever the image shows;
after « a » or « the red » the next word is the one this image decides (its colour, its shape). The
stream tells the two apart: every answer committed under another image is a sample of what follows
each context. `Continuations` keeps, for each 2-token context of the earlier requests' answers, the
distinct tokens committed right after it (up to `MAX_DISTINCT`). A context continued in two or more
ways is *open*: the tree search gives it a *fan* (`recap.drafters.recap.kernel`): its best candidate
and every other candidate that is one of those continuations are queued at the context's own
priority, right behind it, even beyond the ``RecapConfig.branching`` best, so where the image decides
the tree offers the words other images led to side by side instead of one candidate and a deep chain
behind it. The fused distribution, the estimates and the output are unchanged; only which nodes the
budget buys.

Only finished requests count (a request's own answer joins the memory when the next request starts):
a context is open because *other images* led the target to other words there. Kept with the persistent
memory for the stream, bounded (`CAPACITY` contexts, the oldest dropped first), not saved.

Example::

    memory = Continuations()
    usable = np.ones(100, dtype=bool)
    memory.fold(np.array([7, 1, 2, 3, 4]), 1, usable)   # prompt [7], answer [1, 2, 3, 4]
    memory.fold(np.array([7, 1, 2, 5]), 1, usable)      # (1, 2) continued by 3, then by 5
    memory.arrays()      # (keys [pack(1, 2)], ways [[3, 5, -1, ...]]): the one open context
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from recap.memory.guarded import Guarded
from recap.memory.records import KEY_BITS

#: Contexts kept (the oldest first out beyond it).
CAPACITY = 1 << 15
#: Distinct continuations kept per context (the first ones seen; a fan is at most a context's candidates).
MAX_DISTINCT = 32
#: No open context (`Continuations.arrays` of an empty memory; the search's "no fans").
NO_FANS = (np.zeros(0, dtype=np.int64), np.zeros((0, MAX_DISTINCT), dtype=np.int32))


class Continuations(Guarded):
    """The distinct tokens committed after each 2-token context of the finished requests (thread-safe).

    Array-backed: ``_rows`` maps a packed key to a row of ``_table`` (its distinct tokens, -1 after
    them), so a full memory holds a dict entry and ``MAX_DISTINCT`` int32 per context (a few MB at
    `CAPACITY`). ``pending``: the request in progress (its `recap.drafters.recap.mirror.RequestMirror`
    and prompt length), folded in when the next request starts (`fold_pending`).
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._rows: dict[int, int] = {}
        self._arrays = NO_FANS
        self._clear()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Contexts kept."""
        return len(self._rows)

    def fold(self, tokens: np.ndarray, answer_start: int, usable: np.ndarray) -> None:
        """Count one finished request: ``tokens`` its prompt and answer, the answer from ``answer_start``;
        ``usable``: token -> may appear in a key (an image placeholder never does; ``len`` vocab + 1, as
        the search reads it)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        vocab = len(usable) - 1
        with self._lock:
            for i in range(max(answer_start, 2), len(tokens)):
                b, c, nxt = int(tokens[i - 2]), int(tokens[i - 1]), int(tokens[i])
                if not (0 <= b < vocab and 0 <= c < vocab and usable[b] and usable[c] and nxt >= 0):
                    continue
                key = (b << KEY_BITS) | c
                row = self._rows.get(key)
                if row is None:
                    row = self._new_row(key)
                found = self._table[row]
                if nxt in found:
                    continue
                free = np.flatnonzero(found < 0)
                if len(free):
                    found[free[0]] = nxt
                    self._stale = True

    def _new_row(self, key: int) -> int:
        """A row for ``key``: rows are handed out in turn, so once all are taken the next one is the
        row of the key kept longest, which is dropped."""
        row = self._next % self.capacity
        self._next += 1
        if len(self._rows) >= self.capacity:
            del self._rows[int(self._keys[row])]
        elif row == len(self._table):
            size = min(2 * row, self.capacity)
            self._table = np.concatenate([self._table, np.full((size - row, MAX_DISTINCT), -1, np.int32)])
            self._keys = np.concatenate([self._keys, np.zeros(size - row, dtype=np.int64)])
        self._table[row] = -1
        self._keys[row] = key
        self._rows[key] = row
        self._stale = True
        return row

    def fold_pending(self, usable: np.ndarray) -> None:
        """Fold the request in progress that `pending` names (as the next one starts), then clear it."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        mirror, prompt = pending
        self.fold(mirror.request(), prompt, usable)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, ways)``: the open contexts' packed keys (``(b << KEY_BITS) | c``, sorted) and the distinct
        tokens that followed each (2 or more; ``(len(keys), MAX_DISTINCT)`` int32, -1 after them); what
        the search reads."""
        with self._lock:
            if self._stale:
                live = len(self._rows)  # (rows are handed out in turn: the first `live` are taken)
                open_ = self._table[:live, 1] >= 0  # (a row fills from its first slot)
                keys = self._keys[:live][open_]
                order = np.argsort(keys)
                self._arrays = (keys[order], self._table[:live][open_][order])
                self._stale = False
            return self._arrays

    def reset(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._rows.clear()
        self._table = np.full((min(self.capacity, 256), MAX_DISTINCT), -1, dtype=np.int32)
        self._keys = np.zeros(len(self._table), dtype=np.int64)  # each row's key
        self._next = 0  # the row the next new key takes (in turn)
        self._arrays, self._stale = NO_FANS, False
        self.pending: tuple[object, int] | None = None


def fan_ways(fans: tuple[np.ndarray, np.ndarray] | None, tails: np.ndarray, usable: np.ndarray) -> list[int]:
    """How many ways earlier answers went on after each context of ``tails`` ``(N, 3)`` (its last three
    tokens, -1 before the start) as ``fans`` (`Continuations.arrays`; None: off) say, 0 where they
    agreed or none was seen; for display."""
    keys, ways = fans if fans is not None else NO_FANS
    rows = [int(fan_row(keys, tail, usable)) for tail in tails]
    return [int((ways[row] >= 0).sum()) if row >= 0 else 0 for row in rows]


@numba.njit(cache=True, nogil=True)
def fan_row(keys, tail, usable):
    """The row of ``keys`` (`Continuations.arrays`) of the context ending in ``tail`` (its last three
    tokens, -1 before the start; ``usable``: token -> may appear in a key), -1 where it is not open.
    The compiled search reads it at every context it expands."""
    b, c = tail[1], tail[2]
    if len(keys) == 0 or b < 0 or c < 0 or not usable[b] or not usable[c]:
        return -1
    want = (b << KEY_BITS) | c
    at = np.searchsorted(keys, want)
    return at if at < len(keys) and keys[at] == want else -1


@numba.njit(cache=True, nogil=True)
def continued(ways, row, token):
    """Whether ``token`` is one of the continuations in row ``row`` of ``ways`` (`Continuations.arrays`)."""
    for j in range(ways.shape[1]):
        if ways[row, j] == token:
            return True
        if ways[row, j] < 0:
            return False
    return False

"""Where the image decides: the 2-token contexts that earlier answers continued in different ways.

A template word such as « is » or « at the » is followed by the same word whatever the image shows;
after « a » or « the red » the next word is the one this image decides (its colour, its shape). The
stream tells the two apart: every answer committed under another image is a sample of what follows
each context. `Continuations` keeps, for each 2-token context of the earlier requests' answers, the
distinct tokens committed right after it (up to `MAX_DISTINCT`). A context continued in two or more
ways is *open*: the tree search gives it a *fan* (`recap.drafters.recap.kernel`): as many of its
best candidates as distinct continuations were seen (at most ``RecapConfig.branching``) are queued at
the priority of its best candidate, so where the image decides the tree offers the alternatives
together instead of one candidate and a deep chain behind it. The fused distribution, the estimates
and the output are unchanged; only which nodes the budget buys.

Only finished requests count (a request's own answer joins the memory when the next request starts):
a context is open because *other images* led the target to other words there. Kept with the persistent
memory for the stream, bounded (`CAPACITY` contexts, the oldest dropped first), not saved.

Example::

    memory = Continuations()
    usable = np.ones(100, dtype=bool)
    memory.fold(np.array([7, 1, 2, 3, 4]), 1, usable)   # prompt [7], answer [1, 2, 3, 4]
    memory.fold(np.array([7, 1, 2, 5]), 1, usable)      # (1, 2) continued by 3, then by 5
    memory.arrays()      # (keys [pack(1, 2)], sizes [2]): the one open context, 2 ways
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from recap.memory.guarded import Guarded
from recap.memory.records import KEY_BITS

#: Contexts kept (the oldest first out beyond it).
CAPACITY = 1 << 15
#: Distinct continuations counted per context (a fan is at most ``RecapConfig.branching`` wide, 8 by default).
MAX_DISTINCT = 8
#: No open context (`Continuations.arrays` of an empty memory; the search's "no fans").
NO_FANS = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


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
        request = mirror.tokens[mirror.offset : mirror.offset + mirror.length]
        self.fold(request, prompt, usable)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, sizes)``: the open contexts' packed keys (``(b << KEY_BITS) | c``, sorted) and how many
        distinct tokens followed each (2 or more); what the search reads."""
        with self._lock:
            if self._stale:
                live = len(self._rows)  # (rows are handed out in turn: the first `live` are taken)
                sizes = (self._table[:live] >= 0).sum(axis=1)
                open_ = sizes > 1
                keys, sizes = self._keys[:live][open_], sizes[open_].astype(np.int64)
                order = np.argsort(keys)
                self._arrays = (keys[order], sizes[order])
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


def fan_sizes(fans: tuple[np.ndarray, np.ndarray] | None, tails: np.ndarray, usable: np.ndarray) -> list[int]:
    """`fan_size` of each context of ``tails`` ``(N, 3)`` (its last three tokens, -1 before the start)
    with ``fans`` (`Continuations.arrays`; None: off), for display."""
    keys, sizes = fans if fans is not None else NO_FANS
    return [int(fan_size(keys, sizes, tail, usable)) for tail in tails]


@numba.njit(cache=True, nogil=True)
def fan_size(keys, sizes, tail, usable):
    """How many ways earlier answers went on after the context ending in ``tail`` (its last three tokens,
    -1 before the start; ``usable``: token -> may appear in a key), as ``keys, sizes``
    (`Continuations.arrays`) say: 0 where they agreed or none was seen. The compiled search reads it at
    every context it expands; its fan is that many of the context's best candidates, at most
    ``RecapConfig.branching`` and the candidates it has."""
    b, c = tail[1], tail[2]
    if len(keys) == 0 or b < 0 or c < 0 or not usable[b] or not usable[c]:
        return 0
    want = (b << KEY_BITS) | c
    at = np.searchsorted(keys, want)
    if at < len(keys) and keys[at] == want:
        return sizes[at]
    return 0

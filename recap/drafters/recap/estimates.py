"""Acceptance estimates: how often a drafted candidate of a given *kind* is the target's greedy token.

RECAP's fused probabilities say what the memories believe; they are not chances of acceptance. A
record is the target's top-k at *another* position whose last 1-3 tokens match this one, so a record
that was certain there (0.99) is right here only as often as those few tokens decide the next one
(measured on the embedded model: about 47% for a persistent-only context, 73% when a 3-token record
agrees). This module learns, online over the stream of requests, how often candidates of each kind
are right, and turns a candidate's kind and fused probability into an estimate. The tree grows
best-first on products of these estimates and the cost-aware budget counts them as expected tokens;
the fused distribution itself is untouched (it is what the studio shows).

**Kind** of a candidate: which memories had a record at its context (``ctx3``/``ctx2``/``persistent``, a
3-bit mask), whether it continues the suffix match, its rank in its context's candidate list
(0-7; 8 = not in the fused list, a suffix-only token) and the bucket of its fused probability (`EDGES`).
The *coarse* kind drops the bucket.

**Labels.** Every verification pass computes the target's greedy token at the root and at every tree
node, so every candidate of every context the drafter expanded gets a label (its token equals that
greedy token or not), whether or not the candidate made it into the tree and whether or not its
parent was accepted: the estimate is conditional on the path so far, which is what best-first search
multiplies along a path. When sampling, a child is accepted with the target's processed probability
``p(c)`` rather than when it is the argmax, so the label is that probability (a soft label, the
expected value of the accept/reject outcome): the estimates then track sampling acceptance.

**Estimate** (two-level shrinkage towards the fused probability ``q``, so an empty model returns ``q``
and a cold start drafts exactly like the uncalibrated method)::

    coarse = (hits_coarse + m * q)      / (seen_coarse + m)
    fine   = (hits_fine   + m * coarse) / (seen_fine   + m)

Counts decay (multiplied by ``decay`` once ``seen`` reaches ``memory`` labels of a kind), so the
estimate follows a stream whose statistics drift (memories fill up as requests go by).

Example: with ``m = 8``, a coarse kind seen 100 times and right 40 times turns ``q = 0.99`` into
``(40 + 8 * 0.99) / 108 = 0.44``.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numba
import numpy as np

from recap.memory.guarded import Guarded

#: Upper edges of the fused-probability buckets (the last bucket is [0.99, 1]).
EDGES: tuple[float, ...] = (0.01, 0.03, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95, 0.99)
#: What one memory says about a candidate (`source_code`): 0 = no record at this context, else
#: 1 + 5 * (the record was written by this request) + the candidate's rank in it (0, 1, 2, 3 = 3 or
#: more, 4 = not in the record).
CODES = 11
#: Coarse kinds: the codes of ctx3, ctx2 and persistent, and whether the candidate continues the suffix.
COARSE_KINDS = CODES**3 * 2
BUCKETS = len(EDGES) + 1
FINE_KINDS = COARSE_KINDS * BUCKETS


def source_code(present: bool, fresh: bool, rank: int | None) -> int:
    """What one memory says about a candidate: no record, or (fresh or not) its rank (None: absent)."""
    if not present:
        return 0
    return 1 + 5 * int(fresh) + (4 if rank is None else min(rank, 3))


def coarse_kind(codes: tuple[int, int, int], suffix: bool) -> int:
    """Index of a coarse kind from the ctx3, ctx2 and persistent `source_code` and the suffix flag."""
    c3, c2, c1 = codes
    return ((c3 * CODES + c2) * CODES + c1) * 2 + int(suffix)


def fine_kind(coarse: int, q: float) -> int:
    """Index of a fine kind: a coarse kind and the bucket of the fused probability ``q``."""
    return coarse * BUCKETS + bucket(q)


def bucket(q: float) -> int:
    """Bucket of a fused probability (0 .. ``len(EDGES)``)."""
    for index, edge in enumerate(EDGES):
        if q < edge:
            return index
    return len(EDGES)


#: Columns of a kind's row in `AcceptanceModel`'s tables: its counts, the shrinkage ``(a, b)`` the search
#: reads (`AcceptanceModel.levels`), and `update`'s scratch (counts added, last update that touched it).
#: One row is 64 bytes (a cache line), so an update or an estimate reads one line per kind.
SEEN, HITS, A, B, ADD_SEEN, ADD_HITS, MARK = range(7)
KIND_COLUMNS = 8


class Counting(NamedTuple):
    """An acceptance model's tables as the compiled counting writes them (`AcceptanceModel.counting`):
    the ``fine`` and ``coarse`` kinds' rows, the ``updates`` counter ``(1,)``, the labels after which
    counts decay (``memory``), the ``decay``, the prior's ``strength`` and `BUCKETS`."""

    fine: np.ndarray
    coarse: np.ndarray
    updates: np.ndarray
    memory: float
    decay: float
    strength: float
    buckets: int


def _count_view(table: str, column: int) -> property:
    """A read-only property: column ``column`` (`SEEN` or `HITS`) of the count table ``table``, a view."""
    return property(lambda model: getattr(model, table)[:, column])


class AcceptanceModel(Guarded):
    """Online hit rates per candidate kind, shared by the requests of one stream (thread-safe updates).

    ``strength`` (``m``): weight of the prior, in labels. ``memory``: labels of a kind after which its
    counts decay by ``decay`` per update, so that old passes weigh less.
    """

    def __init__(self, strength: float = 8.0, memory: float = 2000.0, decay: float = 0.99) -> None:
        if not strength > 0 or not memory > 0 or not 0 < decay <= 1:
            raise ValueError(
                f"need strength > 0, memory > 0, 0 < decay <= 1; got {strength}, {memory}, {decay}"
            )
        self.strength, self.memory, self.decay = float(strength), float(memory), float(decay)
        self._fine, self._coarse = _rows(FINE_KINDS), _rows(COARSE_KINDS)
        self._lock = threading.Lock()
        self._updates = np.zeros(1, dtype=np.int64)  # updates so far, counted by the compiled counting

    def __setstate__(self, state: dict) -> None:
        """A copy's tables start on 64-byte boundaries too (`_rows`), as the original's do."""
        super().__setstate__(state)
        for name in ("_fine", "_coarse"):
            table = getattr(self, name)
            aligned = _rows(len(table))
            aligned[:] = table
            setattr(self, name, aligned)

    # Counts per kind (views of the tables; after decay, not integers).
    seen_fine = _count_view("_fine", SEEN)
    hits_fine = _count_view("_fine", HITS)
    seen_coarse = _count_view("_coarse", SEEN)
    hits_coarse = _count_view("_coarse", HITS)

    def __len__(self) -> int:
        """Labels learnt so far (after decay)."""
        return round(float(self.seen_coarse.sum()))

    def reset(self) -> None:
        with self._lock:
            self._fine[:], self._coarse[:] = _rows(1), _rows(1)

    def levels(self) -> tuple[np.ndarray, np.ndarray]:
        """The tables the compiled search reads, fine and coarse kinds' rows: columns ``A`` and ``B``
        hold each level's shrinkage ``a = hits / (seen + m)`` and ``b = m / (seen + m)``, so that
        ``estimate = (a_fine + b_fine * a_coarse) + (b_fine * b_coarse) * prior`` (the coarse row of
        fine kind ``f`` is ``f // BUCKETS``). Kept up to date by `update`, which recomputes only the
        kinds it touched; do not modify."""
        return self._fine, self._coarse

    def linear(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offset, slope)`` per fine kind: ``estimate = offset[kind] + slope[kind] * prior`` (the two
        levels composed, with the very operations the search uses). Computed for all kinds on each
        call: for references and inspection, not for drafting."""
        fine, coarse = self._fine, np.repeat(self._coarse, BUCKETS, axis=0)
        return fine[:, A] + fine[:, B] * coarse[:, A], fine[:, B] * coarse[:, B]

    def estimate(self, kind: int, q: float) -> float:
        """Estimated chance that a candidate of fine ``kind`` (`fine_kind`) with fused probability ``q``
        (or a suffix token's prior) is right."""
        a_f, b_f = self._fine[kind, A], self._fine[kind, B]
        a_c, b_c = self._coarse[kind // BUCKETS, A], self._coarse[kind // BUCKETS, B]
        return float((a_f + b_f * a_c) + (b_f * b_c) * q)

    def update(self, seen: np.ndarray, hits: np.ndarray, hit_weights: np.ndarray | None = None) -> None:
        """Count labels: ``seen`` holds the fine kind of every labelled candidate, ``hits`` those that
        were right (each also in ``seen``). ``hit_weights``: a soft label per hit in [0, 1] (under
        sampling, the chance the target commits the candidate), 1 each when None. Work is proportional
        to the labels, not to all kinds."""
        seen = np.asarray(seen, dtype=np.int64)
        if len(seen) == 0:
            return
        hits = np.asarray(hits, dtype=np.int64)
        weights = np.ones(len(hits)) if hit_weights is None else np.asarray(hit_weights, dtype=np.float64)
        if len(weights) != len(hits):
            raise ValueError(f"{len(hits)} hits but {len(weights)} hit weights")
        with self._lock:
            _count_labels(seen, hits, weights, self.counting())

    def update_greedy(
        self,
        nodes: np.ndarray,
        tokens: np.ndarray,
        kinds: np.ndarray,
        kept: int,
        first_row: int,
        greedy: np.ndarray,
    ) -> None:
        """Count the labels of a greedy pass in one compiled call: candidate ``i`` (fine kind
        ``kinds[i]``, token ``tokens[i]``) was offered at the context of tree node ``nodes[i]`` (-1: the
        root); contexts of nodes ``>= kept`` were not verified and teach nothing; the others are right
        when the token is ``greedy[first_row + node]``, the target's greedy token there (``greedy``: one
        per computed row, the root's at ``first_row - 1``). Equal to `update` with the labels chosen
        so. Out-of-range input is a ValueError (the counting is compiled and checks no bounds)."""
        nodes, tokens, kinds = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (nodes, tokens, kinds))
        greedy = np.ascontiguousarray(greedy, dtype=np.int64).reshape(-1)
        if len(kinds) == 0:
            return
        if not len(nodes) == len(tokens) == len(kinds):
            raise ValueError(f"{len(nodes)} nodes, {len(tokens)} tokens and {len(kinds)} kinds")
        with self._lock:
            bad = count_greedy(nodes, tokens, kinds, int(kept), int(first_row), greedy, self.counting())
        if bad >= 0:
            raise greedy_label_error(bad, nodes, kinds, first_row, len(greedy))

    def frozen(self) -> threading.Lock:
        """Hold other updates off while compiled code counts into the tables directly (`counting`): ``with
        model.frozen(): ...`` (the model's lock itself)."""
        return self._lock

    def counting(self) -> Counting:
        """The tables the compiled counting (`count_greedy`) writes. The caller holds `frozen` while it
        counts (as `recap.drafters.recap.recycle.recycle` does, counting a pass's labels in its own compiled
        call)."""
        return Counting(
            self._fine, self._coarse, self._updates, self.memory, self.decay, self.strength, BUCKETS
        )


def greedy_label_error(
    bad: int, nodes: np.ndarray, kinds: np.ndarray, first_row: int, rows: int
) -> ValueError:
    """The error for label ``bad``, which `count_greedy` refused (nothing was counted)."""
    return ValueError(
        f"label {bad}: fine kind {kinds[bad]} (must be in [0, {FINE_KINDS})) or greedy row "
        f"{first_row + nodes[bad]} (must be in [0, {rows})) out of range; nothing counted"
    )


def _rows(kinds: int) -> np.ndarray:
    """``kinds`` rows of a kind table with no labels (counts 0, ``(a, b) = (0, 1)``), each row starting
    on a 64-byte boundary."""
    size = kinds * KIND_COLUMNS
    raw = np.zeros(size + KIND_COLUMNS)
    skip = (-raw.ctypes.data % 64) // raw.itemsize
    rows = raw[skip : skip + size].reshape(kinds, KIND_COLUMNS)
    rows[:, B] = 1.0
    return rows


@numba.njit(cache=True, nogil=True)
def _count_labels(seen, hits, weights, counting):
    """`AcceptanceModel.update`, compiled, into ``counting`` (`Counting`): counts are added once per kind
    (labels first summed per fine kind, coarse sums from them: exact integers as counting each label
    would give), kinds over ``memory`` decay, and every touched kind gets its shrinkage ``(a, b)`` again.
    ``updates[0]``: the updates so far (this one marks the rows it touches with its number)."""
    fine, coarse, updates, memory, decay, m, buckets = counting
    updates[0] += 1
    update = updates[0]
    fine_kinds, coarse_kinds = [np.int64(0)], [np.int64(0)]
    fine_kinds.pop()
    coarse_kinds.pop()
    for kind in seen:
        if fine[kind, MARK] != update:
            fine[kind, MARK] = update
            fine_kinds.append(kind)
        fine[kind, ADD_SEEN] += 1.0
    for i in range(len(hits)):
        fine[hits[i], ADD_HITS] += weights[i]
    for kind in fine_kinds:
        c = kind // buckets
        if coarse[c, MARK] != update:
            coarse[c, MARK] = update
            coarse_kinds.append(c)
        coarse[c, ADD_SEEN] += fine[kind, ADD_SEEN]
        coarse[c, ADD_HITS] += fine[kind, ADD_HITS]
    for kinds, table in ((fine_kinds, fine), (coarse_kinds, coarse)):
        for kind in kinds:
            row = table[kind]
            row[SEEN] += row[ADD_SEEN]
            row[HITS] += row[ADD_HITS]
            row[ADD_SEEN] = 0.0
            row[ADD_HITS] = 0.0
            if row[SEEN] > memory:
                row[SEEN] *= decay
                row[HITS] *= decay
            row[A] = row[HITS] / (row[SEEN] + m)
            row[B] = m / (row[SEEN] + m)


@numba.njit(cache=True, nogil=True)
def count_greedy(nodes, tokens, kinds, kept, first_row, greedy, counting):
    """`AcceptanceModel.update_greedy` on arrays, into ``counting`` (`Counting`): the verified labels, then
    `_count_labels`. Returns -1, or the first label out of range (a kind outside the tables, a verified
    label's greedy row outside ``greedy``), in which case nothing is counted."""
    held = len(counting.fine)
    for i in range(len(kinds)):
        if not 0 <= kinds[i] < held or (nodes[i] < kept and not 0 <= first_row + nodes[i] < len(greedy)):
            return i
    seen = np.empty(len(kinds), dtype=np.int64)
    hits = np.empty(len(kinds), dtype=np.int64)
    n_seen, n_hits = 0, 0
    for i in range(len(kinds)):
        if nodes[i] < kept:
            seen[n_seen] = kinds[i]
            n_seen += 1
            if tokens[i] == greedy[first_row + nodes[i]]:
                hits[n_hits] = kinds[i]
                n_hits += 1
    weights = np.ones(n_hits)
    _count_labels(seen[:n_seen], hits[:n_hits], weights, counting)
    return -1

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

import numba
import numpy as np

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


class AcceptanceModel:
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
        self.seen_coarse = np.zeros(COARSE_KINDS)
        self.hits_coarse = np.zeros(COARSE_KINDS)
        self.seen_fine = np.zeros(FINE_KINDS)
        self.hits_fine = np.zeros(FINE_KINDS)
        self._lock = threading.Lock()
        # estimate = offset + slope * prior; with no labels, the prior itself.
        self._offset, self._slope = np.zeros(FINE_KINDS), np.ones(FINE_KINDS)
        # Scratch of `update` (zero between calls): counts added per kind, and the last update that
        # touched each kind.
        fine, coarse = np.zeros(FINE_KINDS), np.zeros(COARSE_KINDS)
        self._added = (fine, fine.copy(), coarse, coarse.copy())
        self._marks = (np.zeros(FINE_KINDS, dtype=np.int64), np.zeros(COARSE_KINDS, dtype=np.int64))
        self._updates = 0

    def __len__(self) -> int:
        """Labels learnt so far (after decay)."""
        return round(float(self.seen_coarse.sum()))

    def reset(self) -> None:
        with self._lock:
            for array in (self.seen_coarse, self.hits_coarse, self.seen_fine, self.hits_fine, self._offset):
                array.fill(0.0)
            self._slope.fill(1.0)

    def linear(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offset, slope)`` per fine kind: ``estimate = offset[kind] + slope[kind] * prior`` (the two
        shrinkage levels composed). Kept up to date by `update`, which recomputes only the kinds it
        touched; do not modify."""
        return self._offset, self._slope

    def estimate(self, kind: int, q: float) -> float:
        """Estimated chance that a candidate of fine ``kind`` (`fine_kind`) with fused probability ``q``
        (or a suffix token's prior) is right."""
        return float(self._offset[kind] + self._slope[kind] * q)

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
            self._updates += 1
            _count_labels(
                seen, hits, weights, (self.seen_fine, self.hits_fine, self.seen_coarse, self.hits_coarse),
                self._added, self._marks, self._updates, self.memory, self.decay, self.strength,
                self._offset, self._slope, BUCKETS,
            )


@numba.njit(cache=True, nogil=True)
def _count_labels(
    seen, hits, weights, counts, added, marks, update, memory, decay, m, offset, slope, buckets
):
    """`AcceptanceModel.update`, compiled: counts are added once per kind (labels first summed per
    fine kind, coarse sums from them: exact integers as counting each label would give), kinds over
    ``memory`` decay, and every fine kind of a touched coarse kind gets its ``offset``/``slope``
    again: with ``a = hits / (seen + m)`` and ``b = m / (seen + m)`` at each level,
    ``offset = a_fine + b_fine * a_coarse`` and ``slope = b_fine * b_coarse``."""
    seen_fine, hits_fine, seen_coarse, hits_coarse = counts
    add_seen_fine, add_hits_fine, add_seen_coarse, add_hits_coarse = added
    mark_fine, mark_coarse = marks
    fine_kinds, coarse_kinds = [np.int64(0)], [np.int64(0)]
    fine_kinds.pop()
    coarse_kinds.pop()
    for kind in seen:
        if mark_fine[kind] != update:
            mark_fine[kind] = update
            fine_kinds.append(kind)
        add_seen_fine[kind] += 1.0
    for i in range(len(hits)):
        add_hits_fine[hits[i]] += weights[i]
    for kind in fine_kinds:
        coarse = kind // buckets
        if mark_coarse[coarse] != update:
            mark_coarse[coarse] = update
            coarse_kinds.append(coarse)
        add_seen_coarse[coarse] += add_seen_fine[kind]
        add_hits_coarse[coarse] += add_hits_fine[kind]
    for kinds, seen_counts, hit_counts, add_seen, add_hits in (
        (fine_kinds, seen_fine, hits_fine, add_seen_fine, add_hits_fine),
        (coarse_kinds, seen_coarse, hits_coarse, add_seen_coarse, add_hits_coarse),
    ):
        for kind in kinds:
            seen_counts[kind] += add_seen[kind]
            hit_counts[kind] += add_hits[kind]
            add_seen[kind] = 0.0
            add_hits[kind] = 0.0
            if seen_counts[kind] > memory:
                seen_counts[kind] *= decay
                hit_counts[kind] *= decay
    for coarse in coarse_kinds:
        a_c = hits_coarse[coarse] / (seen_coarse[coarse] + m)
        b_c = m / (seen_coarse[coarse] + m)
        for fine in range(coarse * buckets, coarse * buckets + buckets):
            a_f = hits_fine[fine] / (seen_fine[fine] + m)
            b_f = m / (seen_fine[fine] + m)
            offset[fine] = a_f + b_f * a_c
            slope[fine] = b_f * b_c

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
        with self._lock:
            # Fine kinds counted once (one sort each for the labels and the hits); coarse counts are
            # their sums per coarse kind, exact integers, as counting the coarse labels would give.
            fine, fine_added = _counts(seen)
            right, right_added = _counts(hits, hit_weights)
            coarse, coarse_added = _sums_by_coarse(fine, fine_added)
            right_coarse, right_coarse_added = _sums_by_coarse(right, right_added)
            for seen_counts, hit_counts, kinds, added, right_kinds, right_counts in (
                (self.seen_fine, self.hits_fine, fine, fine_added, right, right_added),
                (self.seen_coarse, self.hits_coarse, coarse, coarse_added, right_coarse, right_coarse_added),
            ):
                seen_counts[kinds] += added
                hit_counts[right_kinds] += right_counts
                full = kinds[seen_counts[kinds] > self.memory]
                seen_counts[full] *= self.decay
                hit_counts[full] *= self.decay
            self._refresh(coarse)

    def _refresh(self, coarse: np.ndarray) -> None:
        """Recompute ``offset``/``slope`` of every fine kind of the given coarse kinds."""
        m = self.strength
        fine = (coarse[:, None] * BUCKETS + np.arange(BUCKETS)).reshape(-1)
        parent = fine // BUCKETS
        a_c = self.hits_coarse[parent] / (self.seen_coarse[parent] + m)
        b_c = m / (self.seen_coarse[parent] + m)
        a_f = self.hits_fine[fine] / (self.seen_fine[fine] + m)
        b_f = m / (self.seen_fine[fine] + m)
        self._offset[fine] = a_f + b_f * a_c
        self._slope[fine] = b_f * b_c


def _counts(labels: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``labels`` (ascending) and how often each occurs, or the sum of their
    ``weights`` when given (`np.unique` with counts, in fewer calls: labels come a thousand a pass)."""
    if len(labels) == 0:
        return labels, labels
    if weights is None:
        ordered = np.sort(labels)
    else:
        order = np.argsort(labels, kind="stable")
        ordered = labels[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    if weights is None:
        return ordered[starts], np.diff(np.append(starts, len(ordered)))
    return ordered[starts], np.add.reduceat(np.asarray(weights, dtype=np.float64)[order], starts)


def _sums_by_coarse(fine: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coarse kinds of the ascending distinct fine kinds ``fine`` and their ``counts`` summed per
    coarse kind (fine kinds of one coarse kind are adjacent)."""
    if len(fine) == 0:
        return fine, counts
    coarse = fine // BUCKETS
    starts = np.flatnonzero(np.concatenate(([True], coarse[1:] != coarse[:-1])))
    return coarse[starts], np.add.reduceat(counts, starts)

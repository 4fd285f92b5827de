"""Fusion: the records found for a context, weighted by specificity and confidence, as one distribution.

For a context ending in tokens ``(a, b, c)`` the memories hold up to three records: ``C3[a, b, c]``,
``C2[b, c]`` and ``P1[c]`` (`SOURCES`, most specific first). Each present record gets the weight
``w_n = s_n * max(kappa_min, concentration)`` and the fused distribution is
``q(y) = sum_n w_n * r_n.prob(y) / sum_n w_n`` (the method spec's entropy-confidence weighting).

- `fuse`: one context, from `PredictionRecord`s (the reference, and what the studio shows);
- `Lookup` + `candidates`: many contexts at once, as arrays (what RECAP's tree growth uses), with
  each candidate's coarse acceptance kind (`recap.acceptance`) and each memory's share of it;
- `fuse_rows`: the fused distribution of many contexts, best first;
- `SOURCE_NAMES`: a drafted node's sources by the code the compiled growth gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from recap.acceptance import CODES
from recap.records import PredictionRecord
from recap.tree import FusedCandidate

#: The memories, most specific first.
SOURCES = ("ctx3", "ctx2", "persistent")


class Fused(NamedTuple):
    """A fused next-token distribution: ``tokens``/``probs`` best first, and each source's share.

    ``shares``: ``(source, w_n / sum w, record)`` per present record; a token's contribution from a
    source is ``share * record.prob(token)``.
    """

    tokens: list[int]
    probs: list[float]
    shares: tuple[tuple[str, float, PredictionRecord], ...]

    def contributions(self, rank: int) -> dict[str, float]:
        """Per-source parts of ``probs[rank]`` (summing to it); sources that did not propose it are absent."""
        token, parts = self.tokens[rank], {}
        for source, share, record in self.shares:
            if token in record.ids:
                part = share * record.probs[record.ids.index(token)]
                if part > 0:
                    parts[source] = part
        return parts

    def candidates(self, limit: int) -> list[FusedCandidate]:
        return [
            FusedCandidate(self.tokens[i], self.probs[i], self.contributions(i))
            for i in range(min(limit, len(self.tokens)))
        ]


EMPTY = Fused([], [], ())


def fuse(
    records: Sequence[tuple[str, PredictionRecord]],
    specificity: dict[str, float],
    kappa_min: float,
    uniform: bool = False,
) -> Fused:
    """Entropy-confidence fusion of the records found for one context.

    ``w_n = s_n * kappa(r_n)``, ``kappa(r) = max(kappa_min, concentration(r))`` (``s_n = kappa = 1`` when
    ``uniform``), ``q(y) = sum_n w_n * r_n.prob(y) / sum_n w_n`` with raw (not renormalised) top-k
    probabilities. Ties in ``q`` keep the order of the most specific record.

    Example (k = 2): ``ctx2`` ``{5: 0.8, 6: 0.2}`` (concentration 0.278, ``w = 2 * 0.278 = 0.556``) and
    ``persistent`` ``{6: 0.5, 7: 0.5}`` (concentration 0, ``w = kappa_min = 0.05``)::

        q(5) = 0.556 * 0.8 / 0.606                = 0.734
        q(6) = (0.556 * 0.2 + 0.05 * 0.5) / 0.606 = 0.225
        q(7) = 0.05 * 0.5 / 0.606                 = 0.041
    """
    if not records:
        return EMPTY
    if uniform:
        weights = [1.0] * len(records)
    else:
        weights = [specificity[source] * max(kappa_min, record.concentration) for source, record in records]
    total = sum(weights)
    shares = tuple((source, w / total, record) for (source, record), w in zip(records, weights))
    if len(records) == 1:
        # One record: q is its own (sorted) distribution, no accumulation needed.
        record = records[0][1]
        return Fused(list(record.ids), list(record.probs), shares)
    fused: dict[int, float] = {}
    get = fused.get
    for _, share, record in shares:
        for token, prob in zip(record.ids, record.probs):
            fused[token] = get(token, 0.0) + share * prob
    # A stable sort: equal probabilities keep the most specific record's order.
    tokens = sorted(fused, key=fused.__getitem__, reverse=True)
    return Fused(tokens, [fused[t] for t in tokens], shares)


def fuse_rows(ids: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """`fuse` for many contexts at once: the ``width`` best fused candidates of each.

    ``ids`` ``(B, n)``: the records found for B contexts side by side, most specific memory first (-1 where a
    memory had none); ``values`` ``(B, n)``: each entry's ``w_n / sum w * prob``. A token's fused
    probability is the sum of its entries. Returns ``tokens`` (int64) and ``q`` (float64), both
    ``(B, width)``, best first, ties in the order of the most specific record (as `fuse`); ``q <= 0``
    marks a slot beyond a context's candidates.
    """
    rows, n = ids.shape
    same = ids[:, :, None] == ids[:, None, :]
    fused = np.einsum("bij,bj->bi", same, values)
    repeated = (same & _strictly_lower(n)).any(2)  # a token counts once, at its first (most specific) place
    fused[repeated | (ids < 0)] = -1.0
    order = np.argsort(-fused, axis=1, kind="stable")[:, :width]
    at = np.arange(rows)[:, None]
    return ids[at, order], fused[at, order]


_LOWER: dict[int, np.ndarray] = {}



def _source_names() -> tuple[tuple[str, ...], ...]:
    """`SOURCE_NAMES`, by code ``((first * 9 + second * 3 + third) * 8 + present bits) * 2 + suffix``."""
    table: list[tuple[str, ...]] = [()] * (27 * 16)
    for first in range(3):
        for second in range(3):
            for third in range(3):
                if len({first, second, third}) == 3:
                    for bits in range(8):
                        names = [SOURCES[i] for i, b in zip((first, second, third), (4, 2, 1)) if bits & b]
                        code = ((first * 9 + second * 3 + third) * 8 + bits) * 2
                        table[code], table[code + 1] = tuple(names), (*names, "suffix")
    return tuple(table)


#: A drafted node's sources by its code (`recap.drafters.growth_kernel`): the memories that proposed
#: it, the largest contributor first (ties: the more specific first), then ``suffix`` for a
#: suffix-matched token.
SOURCE_NAMES = _source_names()

#: Place values of the ctx3, ctx2, persistent codes in a coarse kind (`recap.acceptance.coarse_kind`).
_CODE_WEIGHTS = np.array([CODES * CODES, CODES, 1], dtype=np.int64)


class _Columns(NamedTuple):
    """Constant matrices of `candidates` for ``n = 3k`` record columns (cached per k)."""

    rank_weights: np.ndarray  # (n, 3): column j of memory s weighs j + 1 in column s
    after: np.ndarray  # (2, n): columns of a memory after ctx3, after ctx2
    offsets: np.ndarray  # (3,): first column of each memory, minus one
    rank_kind: np.ndarray  # (15,): 2 * place value * rank code, by (memory, min(rank + 1, 4))
    memory_rows: np.ndarray  # (3,): each memory's first entry in rank_kind


_COLUMNS: dict[int, _Columns] = {}


def _columns(k: int) -> _Columns:
    found = _COLUMNS.get(k)
    if found is None:
        n = 3 * k
        rank_weights = np.zeros((n, 3), np.float32)
        for source in range(3):
            rank_weights[source * k : source * k + k, source] = np.arange(1, k + 1)
        after = np.arange(n)[None, :] // k > np.arange(2)[:, None]
        # A memory's rank code: 0-3 for ranks 0, 1, 2, 3+ (rank + 1 = 1..4), 4 when absent (0).
        rank_code = np.array([4, 0, 1, 2, 3], dtype=np.int64)
        rank_kind = (2 * _CODE_WEIGHTS[:, None] * rank_code[None, :]).reshape(-1)
        offsets, memory_rows = np.arange(3) * k - 1, np.arange(3) * 5
        found = _COLUMNS[k] = _Columns(rank_weights, after, offsets, rank_kind, memory_rows)
    return found


def _strictly_lower(n: int) -> np.ndarray:
    """``mask[i, j] = j < i`` for ``n x n`` (cached)."""
    mask = _LOWER.get(n)
    if mask is None:
        mask = _LOWER[n] = np.tri(n, k=-1, dtype=bool)
    return mask


class Lookup(NamedTuple):
    """The records found for B contexts, side by side (`fuse_rows`): ``ids``/``values`` ``(B, 3 * k)``
    (memory ``SOURCES[s]`` in columns ``s * k .. s * k + k``; id -1 and value 0 where it has no
    record), each memory's share ``w_n / sum w`` and whether this request wrote its record, ``shares``
    and ``fresh`` ``(3, B)``."""

    ids: np.ndarray
    values: np.ndarray
    shares: np.ndarray
    fresh: np.ndarray


def candidates(found: Lookup, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate of B contexts, in the records' columns (a token counts at its first column).

    Returns ``tokens`` ``(B, n)``, fused probabilities ``q`` (-1 where the column is a repeat or
    empty), coarse acceptance kinds as ordinary candidates (what each memory says about the token:
    no record; fresh or not, its rank or absent; `recap.acceptance.coarse_kind`) and each memory's
    contribution ``(B, n, 3)``. Sums over the records' columns are matrix products with small constant
    matrices, and per-memory codes come from small tables: small arrays make numpy's per-call cost
    dominate, so the work is a few calls over whole arrays.
    """
    ids, values = found.ids, found.values
    count, n = ids.shape
    columns = _columns(k)
    # A record holds distinct ids, so the sum over its columns of (column + 1) * match is the
    # token's rank + 1 in it (0: absent). float32: numpy's float32 products are much faster.
    same = (ids[:, :, None] == ids[:, None, :]).astype(np.float32)  # (B, n, n)
    rank = (same.reshape(count * n, n) @ columns.rank_weights).astype(np.int64).reshape(count, n, 3)
    found_in = rank > 0
    # Each memory's value of the token: its column (rank + 1 clipped to k; empty columns, id -1, match
    # each other) read from the flat values; 0 where the memory does not hold it.
    where = np.minimum(rank, k) + (np.arange(count) * n)[:, None, None] + columns.offsets
    parts = values.reshape(-1)[where] * found_in  # (B, n, 3): each memory's share of q
    wide = parts.astype(np.float64)
    q = wide[:, :, 0] + wide[:, :, 1] + wide[:, :, 2]  # (what `sum` gives, without a slow reduction)
    # A token counts once, at its first (most specific) memory's column.
    repeated = (found_in[:, :, 0] & columns.after[0]) | (found_in[:, :, 1] & columns.after[1])
    q[repeated | (ids < 0)] = -1.0
    present = found.shares.T > 0  # (B, 3)
    base = (present * (1 + 5 * found.fresh.T)) @ (2 * _CODE_WEIGHTS)  # (B,): the records present, fresh
    by_rank = columns.rank_kind[np.minimum(rank, 4) + columns.memory_rows] * present[:, None, :]
    coarse = by_rank[:, :, 0] + by_rank[:, :, 1] + by_rank[:, :, 2] + base[:, None]
    return ids, q, coarse, parts


def absent_code(found: Lookup, row: int) -> int:
    """Coarse kind (non-suffix) of a token no memory proposed at context ``row``."""
    code = np.where(found.shares[:, row] > 0, 1 + 5 * found.fresh[:, row] + 4, 0)
    return int(code @ _CODE_WEIGHTS) * 2

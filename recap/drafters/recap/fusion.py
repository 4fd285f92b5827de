"""Fusion: the records found for a context, weighted by specificity and confidence, as one distribution.

For a context ending in tokens ``(a, b, c)`` the memories hold up to three records: ``C3[a, b, c]``,
``C2[b, c]`` and ``P1[c]`` (`MEMORIES`, most specific first). Each present record gets the weight
``w_n = s_n * max(kappa_min, concentration)`` and the fused distribution is
``q(y) = sum_n w_n * r_n.prob(y) / sum_n w_n`` (the method spec's entropy-confidence weighting).

- `fuse`: one context, from `PredictionRecord`s (the reference, and what the studio shows);
- `Lookup` + `fuse_rows`: the records of many contexts side by side, and their fused distributions,
  best first (the studio's root distribution; RECAP's tree search does the same arithmetic compiled,
  per context, in `recap.drafters.recap.kernel`, tested against the numpy reference of its candidates
  in `tests/reference_fusion.py`);
- `SOURCE_NAMES`: a drafted node's sources by the code the compiled growth gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from recap.memory.records import PredictionRecord
from recap.tree import FusedCandidate

#: The memories, most specific first.
MEMORIES = ("ctx3", "ctx2", "persistent")


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
    """`SOURCE_NAMES`, by code ``((first * 9 + second * 3 + third) * 8 + present bits) * 2 + suffix``;
    ``27 * 16 + suffix``: the back-off record (`recap.drafters.recap.backoff`)."""
    table: list[tuple[str, ...]] = [()] * (27 * 16 + 2)
    for first in range(3):
        for second in range(3):
            for third in range(3):
                if len({first, second, third}) == 3:
                    for bits in range(8):
                        names = [MEMORIES[i] for i, b in zip((first, second, third), (4, 2, 1)) if bits & b]
                        code = ((first * 9 + second * 3 + third) * 8 + bits) * 2
                        table[code], table[code + 1] = tuple(names), (*names, "suffix")
    table[27 * 16], table[27 * 16 + 1] = ("backoff",), ("backoff", "suffix")  # the back-off record's
    return tuple(table)


#: A drafted node's sources by its code (`recap.drafters.recap.kernel`): the memories that proposed
#: it, the largest contributor first (ties: the more specific first), then ``suffix`` for a
#: suffix-matched token.
SOURCE_NAMES = _source_names()


def _strictly_lower(n: int) -> np.ndarray:
    """``mask[i, j] = j < i`` for ``n x n`` (cached)."""
    mask = _LOWER.get(n)
    if mask is None:
        mask = _LOWER[n] = np.tri(n, k=-1, dtype=bool)
    return mask


class Lookup(NamedTuple):
    """The records found for B contexts, side by side (`fuse_rows`): ``ids``/``values`` ``(B, 3 * k)``
    (memory ``MEMORIES[s]`` in columns ``s * k .. s * k + k``; id -1 and value 0 where it has no
    record), each memory's share ``w_n / sum w`` and whether this request wrote its record, ``shares``
    and ``fresh`` ``(3, B)``."""

    ids: np.ndarray
    values: np.ndarray
    shares: np.ndarray
    fresh: np.ndarray

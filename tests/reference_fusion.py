"""The numpy reference of RECAP's per-context candidates, for testing the compiled search.

`recap.drafters.recap.kernel.grow_tree` computes, one context at a time inside its search, what
`candidates` computes for many contexts at once with numpy arrays (this was the drafter's own code
before the search was compiled). Tests compare the two through `tests/test_search.py`'s plain
best-first search.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from recap.drafters.recap.estimates import BUCKETS, CODES, EDGES
from recap.drafters.recap.fusion import Lookup

#: Place values of the ctx3, ctx2, persistent codes in a coarse kind
#: (`recap.drafters.recap.estimates.coarse_kind`).
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


def candidates(found: Lookup, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate of B contexts, in the records' columns (a token counts at its first column).

    Returns ``tokens`` ``(B, n)``, fused probabilities ``q`` (-1 where the column is a repeat or
    empty), coarse acceptance kinds as ordinary candidates (what each memory says about the token:
    no record; fresh or not, its rank or absent; `recap.drafters.recap.estimates.coarse_kind`) and each
    memory's contribution ``(B, n, 3)``. Sums over the records' columns are matrix products with small
    constant matrices, and per-memory codes come from small tables: small arrays make numpy's per-call cost
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


def estimate(drafter, coarse: np.ndarray, q: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fine kinds and acceptance estimates (clipped to [0, 1]) of candidates of kinds ``coarse`` with
    fused probability ``q`` and cold-start ``prior``, as the compiled search computes them."""
    kinds = coarse * BUCKETS + np.array(EDGES).searchsorted(q, side="right")
    if drafter.config.calibrate:
        offset, slope = drafter.acceptance.linear()
        prior = offset[kinds] + slope[kinds] * prior
    return kinds, np.minimum(np.maximum(prior, 0.0), 1.0)

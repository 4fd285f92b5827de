"""Forward-pass cost model and the cost-aware tree budget.

The engine measures the target's forward time for a few input sizes at load time (e.g. T = 1, 4, 8,
16, 32, 64 tokens) and builds a `CostModel`. A pass over more tokens never really costs less, so the
measured seconds are first made non-decreasing by isotonic regression (pooling adjacent violators:
a noisy spike is averaged with its neighbours instead of reading as a wall; on a GPU, where a pass of
64 tokens costs about what one token does, timing noise is as large as the trend). ``c(T)`` then
interpolates the fitted points linearly, is clamped below the first point and extrapolated with the
last segment's slope beyond the last one.

**Budget rule.** A tree node with path score ``s`` adds about ``s`` expected accepted tokens; every
pass also commits one bonus token. With ``T`` nodes and ``pending`` uncached input tokens (the root,
i.e. the last committed token, is one), a pass yields ``E(T) = 1 + sum(scores)`` tokens for
``c(T + pending)`` seconds. Best-first search offers candidates in decreasing score order, and the tree
keeps the prefix of them that maximises expected tokens per second, ``E(T) / c(T + pending)``. The
search gives up once ``PATIENCE`` candidates in a row have not raised the best ratio (or at the cap):
a measured cost curve is rarely convex (a step where a new kernel tile starts, then flat again), so
stopping at the first candidate that does not pay for itself would miss the cheap region behind the
step. A flat cost curve grows the tree to the cap; a steep one keeps it small.

Example (cost 1 s up to 8 tokens, then 1 s more per 8 tokens)::

    model = CostModel([(1, 1.0), (8, 1.0), (16, 2.0)])
    model.cost(4)                                   # 1.0
    auto_budget(model, [0.9, 0.5, 0.2, 0.1] * 4)    # 7: all nodes that fit in the flat part
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class CostModel:
    """Piecewise-linear ``c(T)``: seconds of one target forward over ``T`` input tokens."""

    def __init__(self, points: Iterable[tuple[int, float]]) -> None:
        pairs = sorted((int(t), float(s)) for t, s in points)
        if not pairs:
            raise ValueError("CostModel needs at least one measured (tokens, seconds) point")
        sizes = [t for t, _ in pairs]
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"CostModel points must have distinct token counts, got {sizes}")
        if any(t < 1 for t in sizes) or any(not (s > 0 and np.isfinite(s)) for _, s in pairs):
            raise ValueError(f"CostModel points need tokens >= 1 and finite seconds > 0, got {pairs}")
        self.points: tuple[tuple[int, float], ...] = tuple(pairs)  # as measured
        self._sizes = np.array(sizes, dtype=np.float64)
        self._seconds = isotonic([s for _, s in pairs])
        if len(pairs) >= 2:
            slope = (self._seconds[-1] - self._seconds[-2]) / (self._sizes[-1] - self._sizes[-2])
            self._tail_slope = max(float(slope), 0.0)
        else:
            self._tail_slope = 0.0

    @property
    def fitted(self) -> tuple[tuple[int, float], ...]:
        """The points ``c(T)`` interpolates: the measured ones made non-decreasing."""
        return tuple((int(t), float(s)) for t, s in zip(self._sizes, self._seconds, strict=True))

    def cost(self, tokens: float) -> float:
        """Interpolated seconds for a forward over ``tokens`` input tokens."""
        if tokens > self._sizes[-1]:
            return float(self._seconds[-1] + self._tail_slope * (tokens - self._sizes[-1]))
        return float(np.interp(tokens, self._sizes, self._seconds))

    def __repr__(self) -> str:
        return f"CostModel({list(self.points)!r})"


def isotonic(values: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for value in values:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return np.concatenate([np.full(int(n), m) for m, n in blocks]) if blocks else np.zeros(0)


#: Candidates in a row that may fail to raise the best tokens-per-second ratio before search stops.
PATIENCE = 8


class BestPrefix:
    """Tracks, while a tree grows, the node count with the best expected tokens per second.

    Feed it ``(nodes, expected)`` after every step of the search; `size` is the best node count so far,
    `exhausted` says the last `PATIENCE` steps brought no improvement.
    """

    def __init__(self, model: CostModel, pending: int = 1, expected: float = 1.0, nodes: int = 0) -> None:
        self.model, self.pending = model, pending
        self.size, self.best = nodes, expected / model.cost(nodes + pending)
        self._stale = 0

    def update(self, nodes: int, expected: float) -> None:
        ratio = expected / self.model.cost(nodes + self.pending)
        if ratio > self.best:
            self.size, self.best, self._stale = nodes, ratio, 0
        else:
            self._stale += 1

    @property
    def exhausted(self) -> bool:
        return self._stale >= PATIENCE


def auto_budget(model: CostModel, scores: Sequence[float], pending: int = 1, cap: int | None = None) -> int:
    """How many of ``scores`` (offered best first) the budget rule keeps; at most ``cap``."""
    limit = len(scores) if cap is None else min(cap, len(scores))
    best, expected = BestPrefix(model, pending), 1.0
    for kept in range(1, limit + 1):
        expected += scores[kept - 1]
        best.update(kept, expected)
        if best.exhausted:
            break
    return best.size

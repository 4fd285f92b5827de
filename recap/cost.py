"""Forward-pass cost model and the cost-aware tree budget.

The engine measures the target's forward time for a few input sizes at load time (e.g. T = 1, 4, 8,
16, 32, 64 tokens) and builds a `CostModel`; ``c(T)`` interpolates them linearly, is clamped below the
first point and extrapolated with the last segment's (non-negative) slope beyond the last one.

**Budget rule.** A tree node with path score ``s`` adds about ``s`` expected accepted tokens; every
pass also commits one bonus token. With ``T`` nodes and ``pending`` uncached input tokens (the root,
i.e. the last committed token, is one), a pass yields ``E = 1 + sum(scores)`` tokens for ``c(T +
pending)`` seconds. Best-first search offers candidates in decreasing score order; a candidate is
added while it *improves* tokens per second::

    (E + s) / c(T + 1 + pending)  >  E / c(T + pending)

and the search stops at the first one that does not (or at the cap). A flat cost curve therefore
grows the tree to the cap; a steep one keeps it small.

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
        self.points: tuple[tuple[int, float], ...] = tuple(pairs)
        self._sizes = np.array(sizes, dtype=np.float64)
        self._seconds = np.array([s for _, s in pairs], dtype=np.float64)
        if len(pairs) >= 2:
            slope = (self._seconds[-1] - self._seconds[-2]) / (self._sizes[-1] - self._sizes[-2])
            self._tail_slope = max(float(slope), 0.0)
        else:
            self._tail_slope = 0.0

    def cost(self, tokens: float) -> float:
        """Interpolated seconds for a forward over ``tokens`` input tokens."""
        if tokens > self._sizes[-1]:
            return float(self._seconds[-1] + self._tail_slope * (tokens - self._sizes[-1]))
        return float(np.interp(tokens, self._sizes, self._seconds))

    def improves(self, expected: float, nodes: int, score: float, pending: int = 1) -> bool:
        """Whether adding a node with ``score`` to a tree of ``nodes`` nodes raises tokens per second.

        ``expected`` is the current ``1 + sum(scores)``.
        """
        before = expected / self.cost(nodes + pending)
        after = (expected + score) / self.cost(nodes + 1 + pending)
        return after > before

    def __repr__(self) -> str:
        return f"CostModel({list(self.points)!r})"


def auto_budget(model: CostModel, scores: Sequence[float], pending: int = 1, cap: int | None = None) -> int:
    """How many of ``scores`` (offered best first) the budget rule keeps; at most ``cap``."""
    expected, kept = 1.0, 0
    limit = len(scores) if cap is None else min(cap, len(scores))
    while kept < limit and model.improves(expected, kept, scores[kept], pending):
        expected += scores[kept]
        kept += 1
    return kept

"""The budget rule in plain Python, the reference the compiled search is checked against.

`recap.drafters.recap.budget` states the rule; `recap.drafters.recap.kernel.grow_tree` applies it one
node at a time while it grows. `auto_budget` applies it to a finished list of scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from recap.drafters.recap.budget import PATIENCE
from recap.models.cost import CostModel


def auto_budget(
    model: CostModel, scores: Sequence[float], pending: int = 1, cap: int | None = None, overhead: float = 0.0
) -> int:
    """How many of ``scores`` (offered best first) the budget rule keeps; at most ``cap``.

    The prefix with the best ``E(T) / (c(T + pending) + overhead)``, searched until `PATIENCE` sizes in a
    row have not improved it. ``overhead``: seconds a pass spends besides the forward (the drafter's own
    work), which makes bigger trees relatively cheaper.

    Example: ``auto_budget(CostModel([(1, 1.0), (8, 1.0), (16, 2.0)]), [0.9, 0.5, 0.2, 0.1] * 4) == 7``
    (all nodes that fit in the flat part).
    """
    limit = len(scores) if cap is None else min(cap, len(scores))
    expected = 1.0 + np.cumsum(np.asarray(scores[:limit], dtype=np.float64))
    ratios = expected / (model.costs(np.arange(1, limit + 1) + pending) + overhead)
    best, size, stale = 1.0 / (model.cost(pending) + overhead), 0, 0
    for kept, ratio in enumerate(ratios.tolist(), start=1):
        if ratio > best:
            best, size, stale = ratio, kept, 0
        else:
            stale += 1
            if stale >= PATIENCE:
                break
    return size

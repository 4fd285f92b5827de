"""The cost-aware budget: how many nodes a RECAP tree may have in this pass.

**Budget rule.** A tree node with path score ``s`` adds about ``s`` expected accepted tokens; every
pass also commits one bonus token. With ``T`` nodes and ``pending`` uncached input tokens (the root,
i.e. the last committed token, is one), a pass yields ``E(T) = 1 + sum(scores)`` tokens for
``c(T + pending)`` seconds. Best-first search offers candidates in decreasing score order, and the tree
keeps the prefix of them that maximises expected tokens per second, ``E(T) / c(T + pending)``. The
search gives up once ``PATIENCE`` candidates in a row have not raised the best ratio (or at the cap;
the nodes of a fan, queued ahead of their own score, `recap.drafters.recap.continuations`, are not counted):
a measured cost curve is rarely convex (a step where a new kernel tile starts, then flat again), so
stopping at the first candidate that does not pay for itself would miss the cheap region behind the
step. A steep cost curve keeps the tree small.

**The cap.** A fixed ``config.budget`` is the cap. With ``"auto"`` the cap is ``config.max_budget`` or
`AUTO_CAP`, raised to the extent of a flat cost curve (`recap.models.cost.CostModel.flat_extent`: where
the whole curve is flat within its noise, a bigger tree costs nothing measurable, so the tree grows to
the cap and the cap follows the device); without a measured curve, `AUTO_FALLBACK_BUDGET`.

The rule itself runs inside the compiled search (`recap.drafters.recap.kernel.grow_tree`, one node at a
time, stopping where the rule stops looking); `Budget` hands it the curve, and a reference of the rule in
plain Python lives beside the tests (``tests/reference_budget.py``), which check the two agree.
"""

from __future__ import annotations

import numpy as np

from recap.drafters.recap.config import AUTO_CAP, AUTO_FALLBACK_BUDGET, RecapConfig
from recap.models.cost import CostModel

#: Candidates in a row that may fail to raise the best tokens-per-second ratio before search stops.
PATIENCE = 8


class Budget:
    """One drafter's budget: its `cap` per pass and, where the rule applies, the search's `stop` rule.

    ``pending``: uncached input tokens a pass feeds besides the nodes (the root).
    """

    def __init__(self, config: RecapConfig, cost_model: CostModel | None, pending: int = 1) -> None:
        self.config, self.cost_model, self.pending = config, cost_model, pending
        self._flat: int | None = None  # `flat_extent`, once known
        self._costs = np.zeros(0)  # the curve at 0 .. cap + pending tokens, once asked

    @property
    def cost_aware(self) -> bool:
        return self.config.budget == "auto" and self.cost_model is not None

    def cap(self) -> int:
        """The most nodes a tree of this pass may have."""
        config = self.config
        if config.budget != "auto":
            return config.budget
        if self.cost_model is None:
            return min(AUTO_FALLBACK_BUDGET, config.max_budget or AUTO_FALLBACK_BUDGET)
        if config.max_budget is not None:
            return config.max_budget
        return max(AUTO_CAP, self.flat_extent())

    def flat_extent(self) -> int:
        """How far the cost curve is flat within its noise (`CostModel.flat_extent`), computed once."""
        if self._flat is None:
            self._flat = self.cost_model.flat_extent() if self.cost_model is not None else 0
        return self._flat

    def stop(self, cap: int, overhead: float) -> tuple[np.ndarray, int, float] | None:
        """The search's stop rule for a tree of at most ``cap`` nodes: ``(costs, pending, overhead)``
        with ``costs[T]`` the curve at ``T`` tokens up to ``cap + pending``, and ``overhead`` the seconds
        a pass spends drafting; None where the rule does not apply (a fixed budget, no curve, or a
        curve flat up to the cap: costs differ by noise only, so the tree grows to the cap)."""
        if not self.cost_aware or self.flat_extent() >= cap + self.pending:
            return None
        if len(self._costs) <= cap + self.pending:
            self._costs = self.cost_model.costs(np.arange(cap + self.pending + 1, dtype=np.float64))
        return self._costs, self.pending, overhead

"""RECAP with drawn children: the ``min(1, p/q)`` family of exact tree sampling, as an option.

RECAP chooses its children (the best candidates) and sampling verifies them with the rule that never
divides by a draft probability (`recap.sampling.choose_among`). The other exact family draws each
position's children from the drafter's own distribution ``q`` without replacement and accepts with
``min(1, p/q)`` (`recap.sampling.choose_drawn`). ``recap-pq`` is that family on RECAP's memories:

- the tree has TR's static template shape (`TR_TEMPLATE`, as the ``recap-template`` ablation), so how
  many children a position gets depends on its place in the template, never on what was drawn there
  (a shape that depended on the draws would bias the rule);
- the children of each expanded position are drawn from its fused distribution without replacement
  (Gumbel top-k: the order of ``log q + Gumbel noise``), with the run's random generator
  (`RequestInfo.rng`), and the tree records ``q`` there (`DraftTree.drawn`).

Greedy runs (no generator) fill the template with the best candidates instead: ``recap-template``.
Drawn children cost the property that a seed gives every method AR's tokens (the distribution is
still the target's): the benchmark's match column shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from recap.config import RecapConfig
from recap.cost import CostModel
from recap.drafters.base import RequestInfo
from recap.drafters.recap import RecapDrafter, Tail
from recap.drafters.token_recycling import TR_TEMPLATE, Candidate, fill_template
from recap.memory import PersistentMemory
from recap.tree import ROOT, DraftTree


def gumbel_order(q: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """Indices of ``q`` (positive weights) in the order of a draw without replacement from ``q``.

    Sorting ``log q + Gumbel noise`` in descending order draws the first index with probability
    ``q_i / sum q``, the second from what is left, and so on (the Gumbel top-k trick).
    """
    keys = np.log(np.asarray(q, dtype=np.float64)) + rng.gumbel(size=len(q))
    return np.argsort(-keys, kind="stable")


class DrawnTemplateDrafter(RecapDrafter):
    """RECAP's memories and fusion, TR's template shape, children drawn from the fused distribution."""

    def __init__(
        self,
        config: RecapConfig | None = None,
        persistent: PersistentMemory | None = None,
        cost_model: CostModel | None = None,
        name: str = "recap-pq",
    ) -> None:
        super().__init__(replace(config or RecapConfig(), tree="template"), persistent, cost_model, name)
        self._rng: np.random.Generator | None = None

    def begin(self, request: RequestInfo) -> None:
        super().begin(request)
        self._rng = request.rng

    def _template_tree(self, tail: Tail) -> DraftTree:
        tails: dict[int, Tail] = {ROOT: tail}
        rng = self._rng

        def children(tree: DraftTree, node: int) -> list[Candidate]:
            node_tail = tails.get(node)
            if node_tail is None:
                parent_tail = tails[tree.parents[node]]
                node_tail = tails[node] = (parent_tail[1], parent_tail[2], tree.tokens[node])
            fused = self._fused(node_tail)
            if not fused.tokens:
                return []
            order = range(len(fused.tokens))
            if rng is not None:
                order = gumbel_order(fused.probs, rng).tolist()
                tree.drawn[node] = (list(fused.tokens), list(fused.probs))
            base = 1.0 if node == ROOT else tree.scores[node]
            options = []
            for rank in order:
                parts = fused.contributions(rank)
                options.append((fused.tokens[rank], base * fused.probs[rank], tuple(parts), parts))
            return options

        return fill_template(TR_TEMPLATE, children)

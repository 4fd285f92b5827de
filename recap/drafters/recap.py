"""RECAP: recycle the target's own predictions into contextual and persistent memories, fuse, search.

Per pass (see the method spec):
1. **Lookup** the records keyed by the last 3, 2 and 1 tokens of a context (``C3``, ``C2``: this
   request only; ``P1``: persistent). Keys containing an image placeholder are never looked up.
2. **Fuse** them with entropy-confidence weights (`fuse`).
3. **Grow** a best-first tree over path scores (products of fused probabilities), after inserting a
   suffix-matched continuation from the request's own tokens; the budget is fixed or cost-aware
   (`recap.cost`).
4. **Recycle** (`observe`): every computed position (pending tokens, every tree node accepted or not,
   the prefill's prompt positions) writes its top-k under the 1/2/3-token keys ending there.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from recap.config import AUTO_FALLBACK_BUDGET, RecapConfig
from recap.cost import BestPrefix, CostModel
from recap.drafters.base import Observation, RequestInfo
from recap.drafters.prompt_lookup import NgramIndex
from recap.drafters.token_recycling import TR_TEMPLATE, Candidate, fill_template
from recap.memory import (
    ContextMemory,
    PersistentMemory,
    PredictionRecord,
    concentration,
    fit_topk,
    recycling_keys,
)
from recap.tree import ROOT, DraftTree, FusedCandidate

logger = logging.getLogger(__name__)

#: How many fused candidates at the root a tree carries for display.
ROOT_CANDIDATES = 10

#: The last three tokens of a context, oldest first; None where the context is shorter.
Tail = tuple[int | None, int | None, int | None]


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


class RecapDrafter:
    """The RECAP drafter.

    Token-level memory: ``persistent`` if given (e.g. loaded from disk or shared by a studio
    session, or `recap.runtime.Runtime`'s memory of this model and method), else the drafter's own, created
    at the first `begin` and kept across requests. ``cost_model`` drives ``budget="auto"``; without
    one, auto uses `AUTO_FALLBACK_BUDGET` nodes. ``pending`` is the number of uncached tokens a
    verification pass feeds besides the tree nodes (the root).

    Example (persistent memory only: after 1 the target said ``2 (0.6), 3 (0.3)``, after 2 ``5 (0.9)``)::

        drafter.propose([0, 1])   # tokens [2, 5, 3]: scores 0.6, 0.54, 0.3 in best-first order,
                                  # parents [ROOT, 0, ROOT]
    """

    def __init__(
        self,
        config: RecapConfig | None = None,
        persistent: PersistentMemory | None = None,
        cost_model: CostModel | None = None,
        name: str = "recap",
        pending: int = 1,
    ) -> None:
        self.config = config or RecapConfig()
        if persistent is not None and persistent.k != self.config.k:
            raise ValueError(f"persistent memory has k={persistent.k}, config has k={self.config.k}")
        self.name = name
        self.record_k = self.config.k
        self.persistent = persistent
        self.cost_model = cost_model
        self.pending = pending
        self.ctx2 = ContextMemory(2)
        self.ctx3 = ContextMemory(3)
        self._index = NgramIndex(2, self.config.suffix_max_len)
        self._excluded: frozenset[int] = frozenset()
        self._excluded_array = np.zeros(0, dtype=np.int64)
        s1, s2, s3 = self.config.specificity
        self._specificity = {"persistent": s1, "ctx2": s2, "ctx3": s3}

    # ------------------------------------------------------------------------------------- protocol
    def begin(self, request: RequestInfo) -> None:
        if self.persistent is None:
            self.persistent = PersistentMemory(request.vocab_size, self.config.k)
        elif self.persistent.vocab_size < request.vocab_size:
            raise ValueError(
                f"persistent memory covers {self.persistent.vocab_size} tokens, "
                f"the request has {request.vocab_size}"
            )
        self.ctx2.clear()
        self.ctx3.clear()
        self._excluded = frozenset(int(t) for t in request.excluded_tokens)
        self._excluded_array = np.fromiter(self._excluded, dtype=np.int64, count=len(self._excluded))
        self._index.reset(self._excluded)

    def propose(self, context: Sequence[int]) -> DraftTree:
        if len(context) == 0:
            return DraftTree()
        tail = _tail(context)
        cache: dict[Tail, Fused] = {}
        root = self._fused(tail, cache)
        if self.config.tree == "template":
            tree = self._template_tree(tail, cache)
        else:
            tree = self._best_first_tree(context, tail, cache)
        tree.root_candidates = root.candidates(ROOT_CANDIDATES)
        return tree

    def observe(self, observation: Observation) -> None:
        if observation.topk_ids is None or observation.topk_probs is None or self.persistent is None:
            return
        config, tree = self.config, observation.tree
        ids, probs = fit_topk(observation.topk_ids, observation.topk_probs, config.k)
        accepted = observation.acceptance.nodes if observation.acceptance is not None else ()
        rows, keys, lengths = recycling_keys(
            observation.context,
            observation.positions,
            tree.parents,
            tree.tokens,
            accepted,
            self._excluded_array,
        )
        concentrations = concentration(probs)  # once per row, shared by all memories
        if config.use_persistent:
            usable = rows[lengths >= 1]
            self.persistent.write_many(
                keys[lengths >= 1, 2], ids[usable], probs[usable], concentrations[usable]
            )
        if config.use_context:
            self._write_context(rows, keys, lengths, ids, probs, concentrations)

    # --------------------------------------------------------------------------------------- lookup
    def _fused(self, tail: Tail, cache: dict[Tail, Fused]) -> Fused:
        """Fused distribution after a context ending in ``tail``; each tail is fused once per propose."""
        fused = cache.get(tail)
        if fused is None:
            fused = cache[tail] = fuse(
                self._records(tail), self._specificity, self.config.kappa_min, self.config.uniform_weights
            )
        return fused

    def _records(self, tail: Tail) -> list[tuple[str, PredictionRecord]]:
        """Records under the 3/2/1-token keys ending the context; keys with image placeholders are skipped."""
        a, b, c = tail
        excluded, found = self._excluded, []
        if c is None or c in excluded:
            return found
        if self.config.use_context and b is not None and b not in excluded:
            if a is not None and a not in excluded:
                record = self.ctx3.lookup((a, b, c))
                if record is not None:
                    found.append(("ctx3", record))
            record = self.ctx2.lookup((b, c))
            if record is not None:
                found.append(("ctx2", record))
        if self.config.use_persistent and self.persistent is not None:
            record = self.persistent.lookup(c)
            if record is not None:
                found.append(("persistent", record))
        return found

    # ----------------------------------------------------------------------------------------- trees
    def _budget(self) -> int:
        """Node cap: the fixed budget, the auto cap with a cost model, or the documented fallback."""
        config = self.config
        if config.budget != "auto":
            return config.budget
        if self.cost_model is None:
            return min(AUTO_FALLBACK_BUDGET, config.max_budget)
        return config.max_budget

    def _best_first_tree(self, context: Sequence[int], tail: Tail, cache: dict[Tail, Fused]) -> DraftTree:
        """Suffix chain first, then best-first growth on path score until budget, depth or floor stop it.

        Candidates sit in a max-heap as ``(parent, rank in the parent's fused list)``; popping one pushes
        its next sibling and its own best child, so each pop costs O(log n) and at most one fusion.
        """
        config, tree = self.config, DraftTree()
        cap = self._budget()
        if cap == 0:
            return tree
        tails: list[Tail] = []  # tails[node]: last three tokens of context + path(node)
        expected = 1.0  # 1 + sum of node scores: expected tokens per pass, bonus included
        if config.suffix and config.suffix_budget > 0:
            expected += self._insert_suffix(tree, context, tail, cache, tails, min(config.suffix_budget, cap))
        # Cost-aware budget: keep the prefix of best-first nodes with the best tokens per second.
        best = BestPrefix(self.cost_model, self.pending, expected, len(tree)) if self._cost_aware() else None
        heap: list[tuple[float, int, int, float, Fused, int, int]] = []
        order = 0  # tie-breaker: equal scores pop in insertion order

        def push(parent: int, fused: Fused, rank: int, parent_score: float, depth: int) -> None:
            nonlocal order
            if rank < min(config.branching, len(fused.tokens)):
                score = parent_score * fused.probs[rank]
                if score >= config.score_floor and score > 0:
                    heapq.heappush(heap, (-score, order, parent, parent_score, fused, rank, depth))
                    order += 1

        push(ROOT, self._fused(tail, cache), 0, 1.0, 1)
        while heap and len(tree) < cap and not (best is not None and best.exhausted):
            negative, _, parent, parent_score, fused, rank, depth = heapq.heappop(heap)
            score = -negative
            token = fused.tokens[rank]
            existing = tree.child(parent, token)
            push(parent, fused, rank + 1, parent_score, depth)
            contributions = fused.contributions(rank)
            before = 0.0 if existing is None else tree.scores[existing]
            node = tree.add(
                token, parent, score=score, sources=tuple(contributions), contributions=contributions
            )
            expected += tree.scores[node] - before  # a merged suffix node may gain a higher score
            if existing is None:
                parent_tail = tail if parent == ROOT else tails[parent]
                tails.append((parent_tail[1], parent_tail[2], token))
            if depth < config.depth:
                push(node, self._fused(tails[node], cache), 0, score, depth + 1)
            if best is not None:
                best.update(len(tree), expected)
        if best is not None and best.size < len(tree):
            tree = tree.truncated(best.size)
        return tree

    def _cost_aware(self) -> bool:
        return self.config.budget == "auto" and self.cost_model is not None

    def _insert_suffix(
        self,
        tree: DraftTree,
        context: Sequence[int],
        tail: Tail,
        cache: dict[Tail, Fused],
        tails: list[Tail],
        limit: int,
    ) -> float:
        """Add the suffix-matched continuation as a chain (source ``suffix``); return the scores added.

        A chain node's score is the memories' path score for it (0 when they never proposed it).
        """
        chain = self._index.continuation(context, self.config.depth)
        nodes = tree.add_chain(chain, sources=("suffix",), limit=limit)
        added, score, node_tail = 0.0, 1.0, tail
        for node in nodes:
            token = tree.tokens[node]
            fused = self._fused(node_tail, cache)
            score *= fused.probs[fused.tokens.index(token)] if token in fused.tokens else 0.0
            tree.scores[node] = score
            added += score
            node_tail = (node_tail[1], node_tail[2], token)
            tails.append(node_tail)
        return added

    def _template_tree(self, tail: Tail, cache: dict[Tail, Fused]) -> DraftTree:
        """Ablation: TR's static template filled from the fused distribution instead of best-first."""
        tails: dict[int, Tail] = {ROOT: tail}

        def children(tree: DraftTree, node: int) -> list[Candidate]:
            node_tail = tails.get(node)
            if node_tail is None:
                parent_tail = tails[tree.parents[node]]
                node_tail = tails[node] = (parent_tail[1], parent_tail[2], tree.tokens[node])
            fused = self._fused(node_tail, cache)
            base = 1.0 if node == ROOT else tree.scores[node]
            options = []
            for rank in range(len(fused.tokens)):
                contributions = fused.contributions(rank)
                options.append(
                    (fused.tokens[rank], base * fused.probs[rank], tuple(contributions), contributions)
                )
            return options

        return fill_template(TR_TEMPLATE, children)

    # -------------------------------------------------------------------------------------- recycling
    def _write_context(
        self,
        rows: np.ndarray,
        keys: np.ndarray,
        lengths: np.ndarray,
        ids: np.ndarray,
        probs: np.ndarray,
        concentrations: np.ndarray,
    ) -> None:
        """Write rows with a usable 2-token key into ``C2`` (and ``C3`` when the 3-token key is usable)."""
        usable = lengths >= 2
        if not usable.any():
            return
        chosen = rows[usable]
        records = [
            PredictionRecord(row_ids, row_probs, conc)
            for row_ids, row_probs, conc in zip(
                ids[chosen].tolist(), probs[chosen].tolist(), concentrations[chosen].tolist()
            )
        ]
        key_rows = keys[usable].tolist()
        self.ctx2.write_many(((b, c), record) for (_, b, c), record in zip(key_rows, records))
        self.ctx3.write_many(
            ((a, b, c), record)
            for (a, b, c), length, record in zip(key_rows, lengths[usable].tolist(), records)
            if length == 3
        )


def _tail(context: Sequence[int]) -> Tail:
    """The last three tokens of ``context`` as Python ints, padded with None in front."""
    last = [int(t) for t in context[-3:]]
    return tuple([None] * (3 - len(last)) + last)  # type: ignore[return-value]

"""RECAP's tree growth: the ``cap`` best candidates by path estimate, found a depth at a time.

A node's *path estimate* is its own acceptance estimate (`recap.acceptance`) times its parent's path
estimate (the root's is 1), so it never grows along a path and best-first search pops parents before
children. `grow` finds what best-first search would pop without a heap: it expands whole depths with
numpy, and once the pool holds more than ``cap`` candidates, the ``cap``-th best score so far bounds
what can still enter, so only nodes at or above it have their contexts expanded. `select` then takes
the ``cap`` best (ties: shallower, then older first) as a `DraftTree`.

The suffix-matched continuation (`recap.drafters.prompt_lookup.NgramIndex`) enters as one more
candidate of each context along its path, with the suffix flag in its acceptance kind.

This module knows nothing of memories: the drafter gives it ``lookup`` (contexts -> records,
`recap.fusion.Lookup`) and ``estimate`` (kinds and fused probabilities -> acceptance estimates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from recap.config import RecapConfig
from recap.fusion import Lookup, absent_code, candidates, node_sources
from recap.tree import ROOT, DraftTree

#: ``lookup(tails)``: the records under the keys ending each context, ``tails`` ``(B, 3)``.
LookupFn = Callable[[np.ndarray], Lookup]
#: ``estimate(coarse, q, prior) -> (fine kinds, estimates)``, all ``(B, n)``.
EstimateFn = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class Level(NamedTuple):
    """One depth of growth, for labelling: the contexts expanded (``nodes``: their pool index, -1 the
    root), their candidates ``tokens`` and fine acceptance ``kinds`` ``(F, n)`` (``offered``: a real
    candidate, the suffix token included)."""

    nodes: np.ndarray
    tokens: np.ndarray
    kinds: np.ndarray
    offered: np.ndarray


class Pool:
    """Candidates of one proposal, a depth at a time: score, token, parent (pool index, -1 the root),
    depth and each memory's contribution ``(3,)`` to the fused probability."""

    def __init__(self) -> None:
        self.size = 0
        self.chain: set[int] = set()  # pool indices of the suffix tokens drafted
        self._parts: list[tuple[np.ndarray, ...]] = []

    def add(self, scores, tokens, parents, depth: int, parts) -> int:
        """Append candidates; returns the pool index of the first."""
        start, count = self.size, len(scores)
        self._parts.append((scores, tokens, parents, np.full(count, depth), parts))
        self.size += count
        return start

    def kth_best(self, k: int) -> float:
        """The ``k``-th best score of the pool."""
        everything = np.concatenate([part[0] for part in self._parts])
        return float(np.partition(everything, self.size - k)[self.size - k])

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate(column) for column in zip(*self._parts))


class Growth(NamedTuple):
    """What `grow` found: the candidate ``pool`` and every expanded depth (``levels``)."""

    pool: Pool
    levels: list[Level]


class Selection(NamedTuple):
    """The drafted ``tree``; ``final``: pool index -> node id (-1: not drafted); ``parts``: each node's
    contribution per memory ``(N, 3)`` (display only, `recap.drafters.recap.RecapDrafter.explain`)."""

    tree: DraftTree
    final: np.ndarray
    parts: np.ndarray


def grow(
    tail: np.ndarray,
    chain: Sequence[int],
    cap: int,
    config: RecapConfig,
    lookup: LookupFn,
    estimate: EstimateFn,
) -> Growth:
    """Candidates for the ``cap`` best nodes by path estimate under the root context ``tail`` ``(3,)``
    (its last three tokens, -1 before the sequence start), down to ``config.depth`` and above
    ``config.score_floor``; ``chain``: the suffix-matched continuation (may be empty).

    At each context, every fused candidate is estimated and the ``config.branching`` best are offered.
    """
    width, floor = config.branching, config.score_floor
    pool, levels = Pool(), []
    frontier = np.array([-1], dtype=np.int64)
    frontier_tails = np.asarray(tail, dtype=np.int64).reshape(1, 3)
    frontier_scores = np.ones(1)
    chain_node = -1  # pool index of the last suffix token drafted (-1: the root; -2: chain cut)
    threshold = 0.0
    for depth in range(1, config.depth + 1):
        if len(frontier) == 0:
            break
        found = lookup(frontier_tails)
        tokens, q, coarse, parts = candidates(found, config.k)
        chain_info = None
        if depth <= len(chain) and chain_node != -2:
            at = np.flatnonzero(frontier == chain_node)
            if len(at):
                row, token = int(at[0]), chain[depth - 1]
                hit = np.flatnonzero((tokens[row] == token) & (q[row] > 0))
                if len(hit) == 0:  # not proposed by any memory: one more candidate for this context
                    kind = absent_code(found, row)
                    tokens, q, coarse, parts = _widen(tokens, q, coarse, parts, row, token, kind)
                    hit = [tokens.shape[1] - 1]
                chain_info = (row, int(hit[0]), token)
                coarse[row, hit[0]] += 1  # the suffix flag
        prior = q.copy()
        if chain_info is not None:
            row, column, _ = chain_info
            prior[row, column] = max(prior[row, column], config.suffix_prior)
        kinds, estimates = estimate(coarse, q, prior)
        offered = q > 0
        if chain_info is not None:
            offered[chain_info[0], chain_info[1]] = True
        estimates = np.where(offered, estimates, 0.0)
        levels.append(Level(frontier, tokens, kinds, offered))
        # The `branching` best candidates of each context, by estimate.
        order = np.argsort(-estimates, axis=1, kind="stable")[:, :width]
        at = np.arange(len(frontier))[:, None]
        child_scores = frontier_scores[:, None] * estimates[at, order]
        rows, columns = np.nonzero(child_scores > floor)
        new_scores = child_scores[rows, columns]
        columns = order[rows, columns]
        new_tokens = tokens[rows, columns]
        start = pool.add(new_scores, new_tokens, frontier[rows], depth, parts[rows, columns])
        if chain_info is not None:
            drafted = np.flatnonzero((rows == chain_info[0]) & (columns == chain_info[1]))
            chain_node = start + int(drafted[0]) if len(drafted) else -2
            if chain_node >= 0:
                pool.chain.add(chain_node)
        if pool.size > cap:
            threshold = max(threshold, pool.kth_best(cap))
        fresh = np.flatnonzero(new_scores >= threshold)
        frontier = start + fresh
        frontier_scores = new_scores[fresh]
        parent_tails = frontier_tails[rows[fresh]]
        frontier_tails = np.column_stack([parent_tails[:, 1], parent_tails[:, 2], new_tokens[fresh]])
    return Growth(pool, levels)


def select(pool: Pool, cap: int, keep: Callable[[np.ndarray], int] | None = None) -> Selection:
    """The ``cap`` best pool nodes, best first (then shallower, then older), as a `DraftTree`;
    ``keep(scores)``: how many of them a cost-aware budget keeps (all when None).

    A node's sources are the memories that proposed it, the largest contributor first, then
    ``suffix`` for a suffix-matched token; the contributions themselves are display-only.
    """
    scores, tokens, parents, depths, parts = pool.arrays()
    order = np.lexsort((np.arange(len(scores)), depths, -scores))[:cap]
    if keep is not None:
        order = order[: keep(scores[order])]
    final = np.full(len(scores), -1, dtype=np.int64)
    final[order] = np.arange(len(order))
    chosen_parents = np.where(parents[order] < 0, ROOT, final[np.maximum(parents[order], 0)])
    if np.any(chosen_parents >= np.arange(len(order))):  # cannot happen with estimates <= 1
        raise RuntimeError("draft tree out of order: a node precedes its parent")
    chosen_parts = parts[order]
    sources = node_sources(chosen_parts)
    for node in pool.chain:
        if final[node] >= 0:
            sources[final[node]] = (*sources[final[node]], "suffix")
    tree = DraftTree(
        tokens[order].tolist(),
        chosen_parents.tolist(),
        scores[order].tolist(),
        sources,
        [{} for _ in range(len(order))],
    )
    return Selection(tree, final, chosen_parts)


def labelled_levels(levels: Sequence[Level]) -> Level:
    """Every expanded context of ``levels`` in one `Level`, candidate arrays padded to a common width
    (padding is never offered)."""
    width = max(level.tokens.shape[1] for level in levels)
    padded = [_pad_columns(level, width) for level in levels]
    return Level(*(np.concatenate(column) for column in zip(*padded)))


def _widen(
    tokens: np.ndarray, q: np.ndarray, coarse: np.ndarray, parts: np.ndarray, row: int, token: int, kind: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The candidate arrays with one more column, holding ``token`` (fused probability 0) at ``row``."""
    tokens = np.pad(tokens, ((0, 0), (0, 1)), constant_values=-1)
    q = np.pad(q, ((0, 0), (0, 1)), constant_values=-1.0)
    coarse = np.pad(coarse, ((0, 0), (0, 1)))
    parts = np.pad(parts, ((0, 0), (0, 1), (0, 0)))
    tokens[row, -1], q[row, -1], coarse[row, -1] = token, 0.0, kind
    return tokens, q, coarse, parts


def _pad_columns(level: Level, width: int) -> Level:
    """``level`` with its candidate arrays padded to ``width`` columns (padding is never offered)."""
    extra = width - level.tokens.shape[1]
    if extra == 0:
        return level
    pad = ((0, 0), (0, extra))
    return Level(
        level.nodes,
        np.pad(level.tokens, pad, constant_values=-1),
        np.pad(level.kinds, pad),
        np.pad(level.offered, pad),
    )

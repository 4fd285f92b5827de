"""RECAP's tree growth: the ``cap`` best candidates by path estimate, found in a few vectorised rounds.

A node's *path estimate* is its own acceptance estimate (`recap.acceptance`) times its parent's path
estimate (the root's is 1), so it never grows along a path and best-first search pops parents before
children. `grow` finds what best-first search would pop without a heap: each round expands a batch of
the best unexpanded nodes with numpy (every candidate of each context is estimated, the
``branching`` best become nodes), and the ``cap``-th best score so far bounds what can still enter, so
only nodes at or above it are ever expanded. `select` then takes the ``cap`` best (ties: shallower,
then earlier in depth-at-a-time order) as a `DraftTree`.

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
    """One round of expansion, for labelling, flat: for every candidate of every context expanded, the
    context's ``node`` (pool index, -1 the root), its ``tokens`` and fine acceptance ``kinds``, and
    whether it was ``offered`` (a real candidate, the suffix token included)."""

    nodes: np.ndarray
    tokens: np.ndarray
    kinds: np.ndarray
    offered: np.ndarray


class Pool:
    """Candidates of one proposal, one row each in a preallocated float64 array ``data`` (grown by
    doubling; ids and counts are exact in float64): columns `SCORE` (path estimate), `TOKEN`, `PARENT`
    (pool index, -1 the root), `DEPTH`, `KEY` (tie order, see `grow`), `TAIL` (the last three tokens of
    the node's context) and `PARTS` (each memory's contribution to its fused probability). ``open``:
    nodes above the depth limit whose context is not expanded yet."""

    def __init__(self, capacity: int = 256) -> None:
        self.size = 0
        self.chain: set[int] = set()  # pool indices of the suffix tokens drafted
        self.data = np.zeros((capacity, COLUMNS))
        self.open = np.zeros(capacity, dtype=bool)

    def add(self, rows: np.ndarray, open_: np.ndarray) -> int:
        """Append candidate ``rows`` ``(m, COLUMNS)``; returns the pool index of the first."""
        start, end = self.size, self.size + len(rows)
        if end > len(self.data):
            capacity = max(end, 2 * len(self.data))
            self.data = np.concatenate([self.data, np.zeros((capacity - len(self.data), COLUMNS))])
            self.open = np.concatenate([self.open, np.zeros(capacity - len(self.open), dtype=bool)])
        self.data[start:end] = rows
        self.open[start:end] = open_
        self.size = end
        return start

    def column(self, index: int) -> np.ndarray:
        """Column ``index`` of the pool's rows (a view)."""
        return self.data[: self.size, index]


#: Columns of `Pool.data`.
SCORE, TOKEN, PARENT, DEPTH, KEY = 0, 1, 2, 3, 4
TAIL = slice(5, 8)
PARTS = slice(8, 11)
COLUMNS = 11

#: Row indices for gathering one entry per row of a (B, n) array (``_AT[:B]``).
_AT = np.arange(4096)[:, None]


class Growth(NamedTuple):
    """What `grow` found: the candidate ``pool``, every round's labels (``levels``) and the number of
    ``rounds`` (vectorised expansion steps)."""

    pool: Pool
    levels: list[Level]
    rounds: int


class Selection(NamedTuple):
    """The drafted ``tree``; ``final``: pool index -> node id (-1: not drafted); ``parts``: each node's
    contribution per memory ``(N, 3)`` (display only, `recap.drafters.recap.RecapDrafter.explain`)."""

    tree: DraftTree
    final: np.ndarray
    parts: np.ndarray


def round_contexts(cap: int) -> int:
    """Contexts a round of `grow` expands at most (the best unexpanded ones) for a budget of ``cap``
    nodes: fewer means more rounds (each a fixed cost of numpy calls), more means contexts expanded
    that the final tree does not use. Measured on the embedded model's scenes at budget 80: a round of
    at most 13 expands 76 contexts a pass in 7.7 rounds, an unbounded one (a whole depth) 167 in 7.5;
    the tree itself does not depend on it."""
    return max(8, cap // 6)


def grow(
    tail: np.ndarray,
    chain: Sequence[int],
    cap: int,
    config: RecapConfig,
    lookup: LookupFn,
    estimate: EstimateFn,
    limit: int | None = None,
) -> Growth:
    """Candidates for the ``cap`` best nodes by path estimate under the root context ``tail`` ``(3,)``
    (its last three tokens, -1 before the sequence start), down to ``config.depth`` and above
    ``config.score_floor``; ``chain``: the suffix-matched continuation (may be empty).

    At each context, every fused candidate is estimated and the ``config.branching`` best are offered.
    Rounds expand the best unexpanded nodes (at most ``limit``, default `round_contexts`) whose score
    reaches the ``cap``-th best score of the pool so far: path estimates never grow along a path, so a
    node below it can never have a descendant in the tree, and growth ends when no unexpanded node
    reaches it.
    Every node of the final tree (above the depth limit) is expanded, whatever the round size: the
    tree and the labels do not depend on it.

    Keys order nodes of one depth as a depth-at-a-time search inserts them (parent's key, then rank
    among its siblings): `select` breaks ties in score by depth, then by key. They are exact while
    ``branching ** depth < 2 ** 53`` (the defaults: 8 ** 8); beyond, ties may order differently.
    """
    width, floor, max_depth = config.branching, config.score_floor, config.depth
    limit = limit or round_contexts(cap)
    pool, levels = Pool(), []
    root = np.zeros((1, COLUMNS))
    root[0, SCORE], root[0, TAIL] = 1.0, tail
    chain_node = -1  # pool index of the last suffix token drafted (-1: the root; -2: chain cut)
    frontier = np.array([-1], dtype=np.int64)
    rounds = 0
    while len(frontier):
        rounds += 1
        if frontier[0] < 0:
            parents = root
        else:
            pool.open[frontier] = False
            parents = pool.data[frontier]
        scores, depths = parents[:, SCORE], parents[:, DEPTH]
        tails = parents[:, TAIL].astype(np.int64)
        found = lookup(tails)
        tokens, q, coarse, parts = candidates(found, config.k)
        chain_info = None
        if chain_node != -2 and chain_node in (expanded := frontier.tolist()):
            row = expanded.index(chain_node)
            if depths[row] < len(chain):
                token = chain[int(depths[row])]
                hit = np.flatnonzero((tokens[row] == token) & (q[row] > 0))
                if len(hit) == 0:  # not proposed by any memory: one more candidate for this context
                    kind = absent_code(found, row)
                    tokens, q, coarse, parts = _widen(tokens, q, coarse, parts, row, token, kind)
                    hit = [tokens.shape[1] - 1]
                chain_info = (row, int(hit[0]))
                coarse[chain_info] += 1  # the suffix flag
        prior = q
        if chain_info is not None:
            prior = q.copy()
            prior[chain_info] = max(prior[chain_info], config.suffix_prior)
        kinds, estimates = estimate(coarse, q, prior)
        offered = q > 0
        if chain_info is not None:
            offered[chain_info] = True
        estimates *= offered
        contexts = np.repeat(frontier, tokens.shape[1])
        levels.append(Level(contexts, tokens.ravel(), kinds.ravel(), offered.ravel()))
        # The `branching` best candidates of each context, by estimate (ties: the earlier column).
        order = np.argsort(-estimates, axis=1, kind="stable")[:, :width]
        child_scores = scores[:, None] * estimates[_AT[: len(order)], order]
        rows, ranks = np.nonzero(child_scores > floor)
        columns = order[rows, ranks]
        new_tokens = tokens[rows, columns]
        above = parents[rows]
        block = np.empty((len(rows), COLUMNS))
        block[:, SCORE] = child_scores[rows, ranks]
        block[:, TOKEN] = new_tokens
        block[:, PARENT] = frontier[rows]
        block[:, DEPTH] = above[:, DEPTH] + 1
        block[:, KEY] = above[:, KEY] * width + ranks
        block[:, 5:7] = above[:, 6:8]  # the child's tail: its parent's last two tokens, then its own
        block[:, 7] = new_tokens
        block[:, PARTS] = parts[rows, columns]
        start = pool.add(block, block[:, DEPTH] < max_depth)
        if chain_info is not None:
            drafted = np.flatnonzero((rows == chain_info[0]) & (columns == chain_info[1]))
            chain_node = start + int(drafted[0]) if len(drafted) else -2
            if chain_node >= 0:
                pool.chain.add(chain_node)
        frontier = _next_round(pool, cap, limit)
    return Growth(pool, levels, rounds)


def _next_round(pool: Pool, cap: int, limit: int) -> np.ndarray:
    """The open nodes to expand next: at or above the ``cap``-th best score so far, the ``limit`` best
    of them (ascending pool index)."""
    size = pool.size
    scores = pool.column(SCORE)
    threshold = np.partition(scores, size - cap)[size - cap] if size >= cap else 0.0
    waiting = np.flatnonzero(pool.open[:size] & (scores >= threshold))
    if len(waiting) > limit:
        best = np.argpartition(-scores[waiting], limit - 1)[:limit]
        waiting = np.sort(waiting[best])
    return waiting


def select(pool: Pool, cap: int, keep: Callable[[np.ndarray], int] | None = None) -> Selection:
    """The ``cap`` best pool nodes, best first (then shallower, then earlier by key), as a `DraftTree`;
    ``keep(scores)``: how many of them a cost-aware budget keeps (all when None).

    A node's sources are the memories that proposed it, the largest contributor first, then
    ``suffix`` for a suffix-matched token; the contributions themselves are display-only.
    """
    size = pool.size
    scores = pool.column(SCORE)
    order = np.lexsort((pool.column(KEY), pool.column(DEPTH), -scores))[:cap]
    if keep is not None:
        order = order[: keep(scores[order])]
    final = np.full(size, -1, dtype=np.int64)
    final[order] = np.arange(len(order))
    chosen = pool.data[order]
    parents = chosen[:, PARENT].astype(np.int64)
    chosen_parents = np.where(parents < 0, ROOT, final[np.maximum(parents, 0)])
    if np.any(chosen_parents >= np.arange(len(order))):  # cannot happen with estimates <= 1
        raise RuntimeError("draft tree out of order: a node precedes its parent")
    chosen_parts = chosen[:, PARTS]
    sources = node_sources(chosen_parts)
    for node in pool.chain:
        if final[node] >= 0:
            sources[final[node]] = (*sources[final[node]], "suffix")
    tree = DraftTree(
        chosen[:, TOKEN].astype(np.int64).tolist(),
        chosen_parents.tolist(),
        chosen[:, SCORE].tolist(),
        sources,
        [{} for _ in range(len(order))],
    )
    return Selection(tree, final, chosen_parts)


def labelled_levels(levels: Sequence[Level]) -> Level:
    """Every round's labels in one flat `Level`."""
    return Level(*(np.concatenate(column) for column in zip(*levels)))


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

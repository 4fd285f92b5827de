"""RECAP's tree cut to one chain, for engines that verify chains only (vLLM's speculative decoding).

A verifier that checks one path commits, on average, the sum of the path estimates along the path it
is given (the chance that every draft up to each node is accepted). `best_chain` finds, among the
root-to-node paths of a grown tree (`recap.drafters.recap.search.Growth`) no deeper than ``length``,
the one with the largest such sum; `restrict` renumbers the growth to that path, so that what the
drafter learns from the verification (recycling, acceptance labels) reads it as the tree it proposed:
the contexts off the chain were not verified and teach nothing.

Example (a root with children 0 (0.6) and 1 (0.3); node 2 (0.5) under node 1)::

    best_chain(np.array([-1, -1, 1]), np.array([0.6, 0.3, 0.5]), 4)   # [1, 2]: 0.3 + 0.5 > 0.6
"""

from __future__ import annotations

import numpy as np

from recap.drafters.recap.search import Growth


def best_chain(parents: np.ndarray, scores: np.ndarray, length: int) -> list[int]:
    """The node ids, root's child first, of the path of at most ``length`` nodes whose path estimates
    (``scores``) add up to the most; ties go to the node found earlier (the better one, best-first).
    ``parents[i] < i`` (-1: the root), as in every grown tree. Empty for an empty tree or ``length`` 0."""
    count = len(parents)
    if count == 0 or length <= 0:
        return []
    parents = np.asarray(parents, dtype=np.int64).tolist()
    scores = np.asarray(scores, dtype=np.float64).tolist()
    depth = [0] * count
    for node, parent in enumerate(parents):
        depth[node] = 1 if parent < 0 else depth[parent] + 1
    total = [0.0] * count  # the best sum of the path from each node down
    best = [-1] * count  # each node's child on that path
    root_best = -1
    for node in range(count - 1, -1, -1):  # children come after their parent: all seen before it
        if depth[node] > length:
            continue
        total[node] = scores[node] + (total[best[node]] if best[node] >= 0 else 0.0)
        parent = parents[node]
        if parent < 0:
            if root_best < 0 or total[node] >= total[root_best]:
                root_best = node
        elif best[parent] < 0 or total[node] >= total[best[parent]]:
            best[parent] = node
    chain, node = [], root_best
    while node >= 0:
        chain.append(node)
        node = best[node]
    return chain


def worth_verifying(scores: np.ndarray, draft_cost: float) -> int:
    """How many drafts of a chain (``scores``: their path estimates, root's child first) to send when
    each costs ``draft_cost`` of a pass: the prefix with the most tokens expected per unit of cost,
    ``(1 + sum of its estimates) / (1 + draft_cost * its length)`` (the whole chain when it is 0; the
    shorter prefix on a tie)."""
    if draft_cost <= 0:
        return len(scores)
    gains = 1.0 + np.concatenate([[0.0], np.cumsum(np.asarray(scores, dtype=np.float64))])
    value = gains / (1.0 + draft_cost * np.arange(len(gains)))
    return int(np.argmax(value))


def restrict(growth: Growth, chain: list[int]) -> Growth:
    """``growth`` renumbered to the nodes of ``chain`` (a root path, root's child first): node ``j`` is
    ``chain[j]``; labels offered at the root or at a chain node keep their context (renumbered), the
    others move past the kept nodes (``kept`` = the chain's length), where they teach nothing."""
    nodes = np.asarray(chain, dtype=np.int64)
    renumber = np.full(len(growth.tokens) + 1, len(nodes), dtype=np.int64)  # last entry: the root (-1)
    renumber[nodes] = np.arange(len(nodes))
    renumber[-1] = -1
    return Growth(
        growth.tokens[nodes],
        np.arange(len(nodes), dtype=growth.parents.dtype) - 1,
        growth.scores[nodes],
        growth.parts[nodes],
        growth.codes[nodes],
        growth.fanned[nodes],
        renumber[growth.label_nodes],
        growth.label_tokens,
        growth.label_kinds,
        len(nodes),
    )

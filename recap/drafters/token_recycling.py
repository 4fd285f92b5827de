"""Token Recycling (TR), the baseline RECAP extends, as its official code describes it.

One persistent ``[vocab, 8]`` matrix of token ids (no probabilities): row ``t`` holds the target's
latest top-8 next tokens after ``t``. It starts as zeros (every row proposes token 0 until written;
siblings then merge, so an unknown token drafts a single node) and is never reset between requests
(*hot start*) unless ``cold_start=True``. Each pass drafts the static 80-node tree template "2.2.2",
filled level by level: the child of rank ``r`` of a node holding ``t`` gets ``matrix[t, r]``. After every
pass, the row of every computed position (pending tokens, every tree node, the prefill's prompt
positions) is overwritten with its top-8.

The template (`TR_TEMPLATE`) is ours: the official one is not available here. It has TR's published
per-depth sizes 8, 21, 25, 15, 8, 3 (depth 6) and gives lower ranks more children, listed as
``(parent template index, child rank)`` entries in breadth-first order (-1 = the root).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from recap.drafters.base import Observation, RequestInfo
from recap.memory.guarded import Guarded
from recap.memory.records import fit_topk, last_occurrence
from recap.memory.recycling import recycling_keys
from recap.tree import ROOT, DraftTree

if TYPE_CHECKING:
    from recap.memory.persistent import PersistentMemory

# fmt: off
#: The static "2.2.2" tree: entry i = (template index of its parent or -1, rank of the child).
TR_TEMPLATE: tuple[tuple[int, int], ...] = (
    # depth 1 (8 nodes, indices 0-7): all eight successors of the root
    (-1, 0), (-1, 1), (-1, 2), (-1, 3), (-1, 4), (-1, 5), (-1, 6), (-1, 7),
    # depth 2 (21 nodes, 8-28): ranks 0..6 of depth 1 get 8, 5, 3, 2, 1, 1, 1 children
    (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7),
    (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (4, 0), (5, 0), (6, 0),
    # depth 3 (25 nodes, 29-53)
    (8, 0), (8, 1), (8, 2), (8, 3), (8, 4), (8, 5), (9, 0), (9, 1), (9, 2), (10, 0), (10, 1), (11, 0),
    (12, 0), (16, 0), (16, 1), (16, 2), (16, 3), (17, 0), (17, 1), (18, 0), (21, 0), (21, 1), (22, 0),
    (24, 0), (26, 0),
    # depth 4 (15 nodes, 54-68)
    (29, 0), (29, 1), (29, 2), (29, 3), (30, 0), (30, 1), (31, 0), (35, 0), (35, 1), (36, 0), (38, 0),
    (42, 0), (42, 1), (43, 0), (46, 0),
    # depth 5 (8 nodes, 69-76)
    (54, 0), (54, 1), (54, 2), (55, 0), (58, 0), (61, 0), (64, 0), (65, 0),
    # depth 6 (3 nodes, 77-79)
    (69, 0), (69, 1), (72, 0),
)
# fmt: on

#: ``(token, score, sources, contributions)`` of a node's candidate children, best rank first.
Candidate = tuple[int, float, tuple[str, ...], dict[str, float]]


def fill_template(
    template: Sequence[tuple[int, int]], children: Callable[[DraftTree, int], Sequence[Candidate]]
) -> DraftTree:
    """Build a tree from a static template, asking ``children(tree, node)`` for a node's candidates.

    ``node`` is ``ROOT`` or a node id of ``tree`` (the tree built so far).

    Entry ``(parent, rank)`` gets the candidate of that rank under the node its parent entry became;
    a missing rank (fewer candidates) drops the entry and its subtree. Duplicate siblings merge
    (`DraftTree.add`), so the tree may have fewer nodes than the template.

    Example: template ``[(-1, 0), (-1, 1), (0, 0)]``, root candidates ``[5, 6]``, candidates under
    the node holding 5 ``[7]``: the tree is ``root -> [5 -> [7], 6]``.
    """
    tree = DraftTree()
    placed: list[int | None] = []
    cache: dict[int, Sequence[Candidate]] = {}
    for parent_entry, rank in template:
        parent = ROOT if parent_entry < 0 else placed[parent_entry]
        if parent is None:
            placed.append(None)
            continue
        if parent not in cache:
            cache[parent] = children(tree, parent)
        options = cache[parent]
        if rank >= len(options):
            placed.append(None)
            continue
        token, score, sources, contributions = options[rank]
        placed.append(tree.add(token, parent, score=score, sources=sources, contributions=contributions))
    return tree


class SuccessorMatrix(Guarded):
    """TR's memory: ``ids`` ``(vocab, k)`` int32; row ``t`` holds the latest top-k successors of ``t``."""

    def __init__(self, vocab_size: int, k: int = 8) -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError(f"SuccessorMatrix needs vocab_size >= 1 and k >= 1, got {vocab_size}, {k}")
        self.vocab_size, self.k = int(vocab_size), int(k)
        self.ids = np.zeros((vocab_size, k), dtype=np.int32)
        self._lock = threading.Lock()

    def write_many(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Overwrite row ``keys[i]`` with ``ids[i]``; a repeated key keeps its last row."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if len(keys) == 0:
            return
        ids, _ = fit_topk(ids, np.zeros(np.shape(ids), dtype=np.float32), self.k)
        inside = (keys >= 0) & (keys < self.vocab_size)
        keys, ids = keys[inside], ids[inside]
        keep = last_occurrence(keys)
        with self._lock:
            self.ids[keys[keep]] = ids[keep]

    def reset(self) -> None:
        with self._lock:
            self.ids.fill(0)


class TokenRecyclingDrafter:
    """TR: hot-started successor matrix + static template tree. Sources: ``template``.

    The matrix: ``successors`` if given (`recap.runtime.Runtime` shares one per model), else the
    drafter's own (created at the first `begin`, kept across requests).
    """

    def __init__(
        self,
        successors: SuccessorMatrix | None = None,
        cold_start: bool = False,
        template: Sequence[tuple[int, int]] = TR_TEMPLATE,
        k: int = 8,
        name: str = "tr",
    ) -> None:
        self.name = name
        self.record_k = successors.k if successors is not None else k
        self.successors = successors
        self.cold_start = cold_start
        self.template = tuple(template)
        self._excluded = np.zeros(0, dtype=np.int64)

    def begin(self, request: RequestInfo) -> None:
        if self.successors is None:
            self.successors = SuccessorMatrix(request.vocab_size, self.record_k)
        elif self.successors.vocab_size < request.vocab_size:
            raise ValueError(
                f"successor matrix covers {self.successors.vocab_size} tokens, "
                f"the request has {request.vocab_size}"
            )
        if self.cold_start:
            self.successors.reset()
        self._excluded = np.fromiter(request.excluded_tokens, dtype=np.int64)

    def propose(self, context: Sequence[int]) -> DraftTree:
        return _fill_from_rows(self.template, self._matrix(), int(context[-1]))

    def observe(self, observation: Observation) -> None:
        if observation.topk_ids is None or self.successors is None:
            return
        tree = observation.tree
        accepted = observation.acceptance.nodes if observation.acceptance is not None else ()
        rows, keys, lengths = recycling_keys(
            observation.context, observation.positions, tree.parents, tree.tokens, accepted, self._excluded
        )
        usable = lengths >= 1
        self.successors.write_many(keys[usable, 2], np.asarray(observation.topk_ids)[rows[usable]])

    def coverage(self, tails: np.ndarray, tokens: np.ndarray) -> list[tuple[tuple[str, ...], bool]]:
        """For each state (``tails[i]``, its last three tokens) whether the matrix row of its last token
        lists ``tokens[i]`` (``("successors",)``; a row never written lists nothing). The matrix keeps
        no request, so the second field (a record of this request) is always False."""
        matrix = self._matrix()
        result = []
        for tail, token in zip(np.asarray(tails, dtype=np.int64).reshape(-1, 3).tolist(), tokens):
            row = matrix[tail[2]] if 0 <= tail[2] < len(matrix) else None
            held = row is not None and row.any() and int(token) in row.tolist()
            result.append((("successors",) if held else (), False))
        return result

    def _matrix(self) -> np.ndarray:
        if self.successors is None:
            raise RuntimeError("call begin() before propose()")
        return self.successors.ids


def _fill_from_rows(template: Sequence[tuple[int, int]], matrix: np.ndarray, root_token: int) -> DraftTree:
    """Fill ``template`` from successor rows: rank ``r`` under a node holding ``t`` is ``matrix[t, r]``."""

    def children(tree: DraftTree, node: int) -> list[Candidate]:
        token = root_token if node == ROOT else tree.tokens[node]
        if not 0 <= token < len(matrix):
            return []
        return [(t, 0.0, ("template",), {}) for t in matrix[token].tolist()]

    return fill_template(template, children)


def seed_successors(matrix: SuccessorMatrix, memory: PersistentMemory) -> int:
    """Write the ids of every record of ``memory`` into Token Recycling's ``matrix``; returns the rows set.

    TR overwrites row ``t`` with the top-k ids at every computed position ending in ``t``, and RECAP's
    1-token memory writes its records under the same keys in the same order, so after the same passes
    the two hold the same ids: the matrix starts from the same data as the memory.
    """
    tokens = [t for t in range(min(memory.vocab_size, matrix.vocab_size)) if memory.lookup(t) is not None]
    if tokens:
        rows = np.array([memory.lookup(t).ids for t in tokens], dtype=np.int64)
        matrix.write_many(np.array(tokens, dtype=np.int64), rows)
    return len(tokens)

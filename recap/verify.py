"""Greedy acceptance of a verified draft tree. Pure functions; no model, no torch.

The verification pass returns, for the root (the last committed token) and every tree node, the
target's greedy next token. Walking from the root, a child whose token equals its parent's greedy
prediction is accepted; the walk stops at the first position with no such child. The greedy token
at the last accepted position is the *bonus* token, so every pass commits at least one token and the
result equals plain greedy decoding.

Example (tree ``root -> [5 -> [7], 6]``, nodes 0:5, 1:7, 2:6)::

    greedy = [5, 7, 9, 4]   # at root, node 0, node 1, node 2
    accept_greedy(tree, greedy)  ->  Acceptance(nodes=[0, 1], tokens=[5, 7, 9])
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from recap.tree import ROOT, DraftTree


@dataclass(frozen=True)
class Acceptance:
    """Outcome of greedy verification.

    ``nodes``: accepted node ids, root's child first. ``tokens``: the committed tokens, i.e. the
    accepted nodes' tokens followed by the bonus token (so ``len(tokens) == len(nodes) + 1``, unless
    `truncate` cut it).
    """

    nodes: tuple[int, ...]
    tokens: tuple[int, ...]

    @property
    def bonus_token(self) -> int:
        return self.tokens[-1]


def accept_greedy(tree: DraftTree, greedy: Sequence[int]) -> Acceptance:
    """Accept the longest root path that agrees with the target's greedy tokens.

    ``greedy`` has ``len(tree) + 1`` entries: the target's argmax at the root, then at each node.
    """
    if len(greedy) != len(tree) + 1:
        raise ValueError(f"expected {len(tree) + 1} greedy tokens (root + nodes), got {len(greedy)}")
    nodes: list[int] = []
    position = ROOT
    while True:
        predicted = int(greedy[position + 1])
        child = tree.child(position, predicted)
        if child is None:
            return Acceptance(tuple(nodes), (*tuple(tree.tokens[n] for n in nodes), predicted))
        nodes.append(child)
        position = child


def truncate(acceptance: Acceptance, eos_ids: Collection[int], room: int) -> tuple[Acceptance, bool]:
    """Cut a step's new tokens at the first EOS (kept) or after ``room`` tokens.

    Returns the possibly shortened acceptance and whether generation is finished. Node ids are cut
    with their tokens, so ``nodes`` may then equal ``tokens`` in length (no bonus token left).
    """
    tokens = list(acceptance.tokens[: max(room, 0)])
    finished = len(tokens) < len(acceptance.tokens) or len(tokens) == room
    for i, token in enumerate(tokens):
        if token in eos_ids:
            tokens = tokens[: i + 1]
            finished = True
            break
    return Acceptance(acceptance.nodes[: len(tokens)], tuple(tokens)), finished

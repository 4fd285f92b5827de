"""Greedy acceptance and truncation, as literal tables."""

from __future__ import annotations

import pytest

from recap.tree import ROOT, DraftTree
from recap.verify import Acceptance, accept_greedy, truncate


def sample_tree() -> DraftTree:
    """root -> [5 -> [7], 6]: nodes 0:5, 1:7, 2:6."""
    tree = DraftTree()
    tree.add(5, ROOT)
    tree.add(7, 0)
    tree.add(6, ROOT)
    return tree


@pytest.mark.parametrize(
    ("greedy", "nodes", "tokens"),
    [
        ([5, 7, 9, 4], (0, 1), (5, 7, 9)),  # whole branch accepted, bonus 9
        ([6, 7, 9, 4], (2,), (6, 4)),  # second branch, bonus from node 2
        ([5, 8, 9, 4], (0,), (5, 8)),  # first node accepted, its child rejected
        ([3, 7, 9, 4], (), (3,)),  # nothing accepted: bonus only
    ],
)
def test_accept_greedy(greedy, nodes, tokens):
    assert accept_greedy(sample_tree(), greedy) == Acceptance(nodes, tokens)


def test_accept_greedy_empty_tree_and_length_check():
    assert accept_greedy(DraftTree(), [4]) == Acceptance((), (4,))  # AR step
    with pytest.raises(ValueError, match="expected 4 greedy tokens"):
        accept_greedy(sample_tree(), [5, 7])


@pytest.mark.parametrize(
    ("room", "eos", "tokens", "nodes", "finished"),
    [
        (10, set(), (5, 7, 9), (0, 1), False),  # room left, no EOS: unchanged
        (3, set(), (5, 7, 9), (0, 1), True),  # exactly fills the room
        (2, set(), (5, 7), (0, 1), True),  # cut: no bonus left
        (10, {7}, (5, 7), (0, 1), True),  # EOS kept, rest dropped
        (10, {5}, (5,), (0,), True),  # EOS at the first token
        (0, set(), (), (), True),  # no room at all
    ],
)
def test_truncate(room, eos, tokens, nodes, finished):
    result, done = truncate(Acceptance((0, 1), (5, 7, 9)), eos, room)
    assert (result.tokens, result.nodes, done) == (tokens, nodes, finished)

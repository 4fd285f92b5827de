"""DraftTree: building, merging, derived arrays, and invariants under random construction; the source
table and a node's main source."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recap.tree import ROOT, SOURCE_TABLE, SOURCES, DraftTree, main_source


def build(spec: list[tuple[int, int]]) -> DraftTree:
    """A tree from ``(token, parent)`` pairs."""
    tree = DraftTree()
    for token, parent in spec:
        tree.add(token, parent)
    return tree


@pytest.mark.parametrize(
    ("spec", "depths"),
    [
        ([], []),  # empty tree
        ([(5, ROOT)], [1]),  # one child of the root
        ([(5, ROOT), (7, 0), (9, 1)], [1, 2, 3]),  # a chain
        ([(5, ROOT), (6, ROOT), (7, 0), (8, 1)], [1, 1, 2, 2]),  # two branches
    ],
)
def test_depths(spec, depths):
    assert build(spec).depths.tolist() == depths


@pytest.mark.parametrize(
    ("spec", "mask"),
    [
        ([(5, ROOT)], [[1]]),  # a node sees itself
        ([(5, ROOT), (7, 0)], [[1, 0], [1, 1]]),  # a child sees its parent
        ([(5, ROOT), (6, ROOT), (7, 1)], [[1, 0, 0], [0, 1, 0], [0, 1, 1]]),  # siblings do not see each other
    ],
)
def test_ancestor_mask(spec, mask):
    assert build(spec).ancestor_mask().astype(int).tolist() == mask


def test_add_merges_duplicate_siblings_and_keeps_both_sources():
    tree = DraftTree()
    first = tree.add(5, ROOT, score=0.2, sources=("ctx2",), contributions={"ctx2": 0.2})
    second = tree.add(5, ROOT, score=0.5, sources=("suffix",), contributions={"persistent": 0.1})
    assert first == second == 0  # same node
    assert len(tree) == 1
    assert tree.sources[0] == ("ctx2", "suffix")  # both sources kept, in arrival order
    assert tree.scores[0] == 0.5  # the higher score wins
    assert tree.contributions[0] == {"ctx2": 0.2, "persistent": 0.1}


def test_same_token_under_different_parents_is_not_merged():
    tree = build([(5, ROOT), (6, ROOT), (7, 0), (7, 1)])
    assert len(tree) == 4  # 7 under 5 and 7 under 6 are different continuations


def test_add_chain_merges_and_respects_limit():
    tree = build([(5, ROOT), (7, 0)])
    ids = tree.add_chain([5, 7, 9, 11], sources=("suffix",), limit=1)
    assert ids == [0, 1, 2]  # two merged nodes, then one new node, then the limit stops it
    assert tree.sources[0] == ("suffix",) and tree.path(2) == [5, 7, 9]


def test_path_child_children():
    tree = build([(5, ROOT), (6, ROOT), (7, 0)])
    assert tree.path(2) == [5, 7] and tree.path_nodes(2) == [0, 2]
    assert tree.child(ROOT, 6) == 1 and tree.child(0, 6) is None
    assert tree.children(ROOT) == [0, 1]


def test_validate_rejects_broken_invariants():
    tree = build([(5, ROOT), (6, 0)])
    tree.parents[0] = 1  # a parent after its child
    with pytest.raises(ValueError, match="parents must come before"):
        tree.validate()
    twin = DraftTree(
        tokens=[5, 5], parents=[ROOT, ROOT], scores=[0, 0], sources=[(), ()], contributions=[{}, {}]
    )
    with pytest.raises(ValueError, match="appears twice"):
        twin.validate()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-1, 30)), max_size=40))
def test_random_adds_keep_invariants(pairs):
    tree = DraftTree()
    for token, parent in pairs:
        tree.add(token, parent if parent < len(tree) else ROOT)
    tree.validate()
    mask = tree.ancestor_mask()
    assert np.array_equal(mask.sum(axis=1), tree.depths)  # a node sees exactly depth ancestors (itself incl.)
    for node in range(len(tree)):
        assert len(tree.path(node)) == tree.depths[node]


# ------------------------------------------------------------------------------------------- sources
@pytest.mark.parametrize(
    ("sources", "contributions", "expected"),
    [
        (("ctx2", "persistent"), {"ctx2": 0.1, "persistent": 0.3}, "persistent"),  # largest share
        (("suffix", "ctx3"), {}, "suffix"),  # no shares: the first listed
        ((), {}, "unknown"),
    ],
)
def test_main_source(sources, contributions, expected):
    assert main_source(sources, contributions) == expected


def test_source_table_has_one_row_per_name_with_a_colour_and_a_meaning():
    names = [s.name for s in SOURCE_TABLE]
    assert len(names) == len(set(names)) and {"target", "unknown"} <= set(names)
    assert all(s.color.startswith("#") and len(s.color) == 7 and s.meaning for s in SOURCE_TABLE)
    assert set(SOURCES) == set(names) - {"target", "unknown"}

"""RECAP cut to one chain (`recap.drafters.recap.chain`, `RecapDrafter.propose_chain`) and requests that
end explicitly (`RecapDrafter.end`): what an engine verifying chains, several requests at once, needs."""

from __future__ import annotations

import numpy as np
import pytest
from test_drafters import IMAGE, VOCAB, seeded

from recap.decode import generate
from recap.drafters.base import RequestInfo
from recap.drafters.recap.chain import best_chain, restrict
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter
from recap.drafters.recap.search import Growth
from recap.drafters.recap.stream import StreamMemory
from recap.memory.persistent import PersistentMemory

EMBEDDED = "assets/models/tiny-scenes-llava-v2"


def test_the_chain_with_the_largest_sum_of_path_estimates():
    parents, scores = np.array([-1, -1, 1]), np.array([0.6, 0.3, 0.5])
    assert best_chain(parents, scores, 4) == [1, 2]  # 0.8 against 0.6
    assert best_chain(parents, scores, 1) == [0]  # one draft: the best child of the root
    assert best_chain(parents, scores, 0) == [] and best_chain(np.zeros(0), np.zeros(0), 3) == []
    # a tie goes to the node found first (best-first: the better one)
    assert best_chain(np.array([-1, -1]), np.array([0.4, 0.4]), 2) == [0]
    # a deep chain is cut at the length: 0.9 0.8 0.7 | 0.6 against a sibling 0.95 with nothing below
    parents = np.array([-1, 0, 1, 2, -1])
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.95])
    assert best_chain(parents, scores, 3) == [0, 1, 2] and best_chain(parents, scores, 1) == [4]


def test_restrict_renumbers_the_nodes_and_moves_labels_off_the_chain_past_it():
    growth = Growth(
        tokens=np.array([5, 6, 7]),
        parents=np.array([-1, -1, 1]),
        scores=np.array([0.6, 0.3, 0.5]),
        parts=np.zeros((3, 3)),
        codes=np.array([0, 1, 2]),
        fanned=np.array([False, True, False]),
        label_nodes=np.array([-1, -1, 0, 1, 2]),
        label_tokens=np.array([5, 6, 9, 7, 8]),
        label_kinds=np.array([1, 2, 3, 4, 5]),
        kept=3,
    )
    cut = restrict(growth, [1, 2])
    assert cut.tokens.tolist() == [6, 7] and cut.parents.tolist() == [-1, 0]
    assert cut.scores.tolist() == [0.3, 0.5] and cut.fanned.tolist() == [True, False]
    assert cut.label_nodes.tolist() == [-1, -1, 2, 0, 1] and cut.kept == 2  # node 0's label: unverified
    assert cut.label_tokens.tolist() == [5, 6, 9, 7, 8]


class Chained:
    """A drafter protocol object that proposes RECAP's best chain (what an engine verifying chains gets)."""

    def __init__(self, drafter: RecapDrafter, length: int) -> None:
        self.drafter, self.length = drafter, length
        self.name, self.record_k = "recap-chain", drafter.record_k
        self.trees: list = []

    def begin(self, request):
        self.drafter.begin(request)

    def propose(self, context):
        tree = self.drafter.propose_chain(context, self.length)
        self.trees.append(tree)
        return tree

    def observe(self, observation):
        self.drafter.observe(observation)


@pytest.mark.parametrize("length", [1, 4])
def test_a_chain_is_lossless_and_learns_from_what_was_verified(length):
    from recap.runtime import Runtime

    runtime = Runtime.load(EMBEDDED)
    target = runtime.target
    persistent = StreamMemory(PersistentMemory(target.vocab_size, 8))
    drafter = Chained(RecapDrafter(RecapConfig(budget=16), persistent=persistent), length)
    images = [__import__("PIL.Image").Image.open(f"assets/examples-v2/scene_{i}.png") for i in (1, 2)]
    accepted = 0
    for image in images:
        for prompt in ("Describe this scene.", "How many shapes are there?"):
            expected = generate(target, runtime.drafter("ar"), prompt, [image], 40).tokens
            result = generate(target, drafter, prompt, [image], 40)
            assert result.tokens == expected
            accepted += sum(len(step.accepted_ids) for step in result.steps)
    assert all(t.parents == list(range(-1, len(t) - 1)) and len(t) <= length for t in drafter.trees)
    assert max(len(t) for t in drafter.trees) == length
    assert accepted > 10  # the memories drafted what the target said (the second prompts above all)
    assert persistent.acceptance.levels()[0].any()  # the labels of the verified contexts were counted


def test_requests_that_end_explicitly_join_the_stream_when_they_end_not_when_another_begins():
    persistent = StreamMemory(PersistentMemory(VOCAB, 8))
    config = RecapConfig(budget=8)
    first = RecapDrafter(config, persistent=persistent, explicit_end=True)
    second = RecapDrafter(config, persistent=persistent, explicit_end=True)
    first.begin(RequestInfo((IMAGE, 1), frozenset({IMAGE}), VOCAB))
    first.propose([IMAGE, 1, 2, 3, 4])
    second.begin(RequestInfo((IMAGE, 9), frozenset({IMAGE}), VOCAB))  # while the first runs
    assert len(persistent.suffix_history) == 0 and len(persistent.continuations) == 0
    second.propose([IMAGE, 9, 2, 3, 5])
    first.end()
    assert persistent.suffix_history.tolist() == [IMAGE, 1, 2, 3, 4, -1]
    assert len(persistent.continuations) == 2  # (2 3) -> 4, (1 2) -> 3 of the first answer
    second.end()
    second.end()  # a second call adds nothing
    assert persistent.suffix_history.tolist() == [IMAGE, 1, 2, 3, 4, -1, IMAGE, 9, 2, 3, 5, -1]
    _, ways = persistent.continuations.arrays()
    assert [sorted(t for t in row if t >= 0) for row in ways.tolist()] == [[4, 5]]  # (2 3): open
    # a drafter without explicit ends still ends the previous request at its next begin, once
    sequential = RecapDrafter(config, persistent=persistent)
    seeded(sequential, {}, prompt=(IMAGE, 7))
    sequential.propose([IMAGE, 7, 8])
    sequential.end()
    seeded(sequential, {}, prompt=(IMAGE, 7))
    assert persistent.suffix_history.tolist()[-4:] == [IMAGE, 7, 8, -1]
    assert persistent.suffix_history.tolist().count(8) == 1
    sequential.propose([IMAGE, 7, 11])
    other = RecapDrafter(config, persistent=persistent)
    seeded(other, {}, prompt=(IMAGE, 5))  # ends the sequential drafter's request, as before
    sequential.end()  # too late: nothing is added twice
    assert persistent.suffix_history.tolist().count(11) == 1


def test_a_chain_is_cut_where_more_drafts_commit_less_per_unit_of_cost():
    from recap.drafters.recap.chain import worth_verifying

    scores = np.array([0.9, 0.5, 0.1, 0.05])
    assert worth_verifying(scores, 0.0) == 4  # free drafts: all of them
    assert worth_verifying(scores, 0.25) == 2  # (1 + 0.9 + 0.5) / 1.5 = 1.6 beats 1.52 and 1.45
    assert worth_verifying(np.array([0.2]), 0.25) == 0  # 1.2 / 1.25 < 1: no draft pays
    assert worth_verifying(np.zeros(0), 0.25) == 0


def test_the_template_ablation_has_no_chain_to_cut():
    drafter = RecapDrafter(RecapConfig(budget=8, tree="template"), persistent=PersistentMemory(VOCAB, 8))
    with pytest.raises(ValueError, match="best-first"):
        drafter.propose_chain([1, 2], 4)

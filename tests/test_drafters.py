"""Drafters: fusion, best-first trees, suffix drafts, recycling, TR, PLD, budgets, config, registry.

A fake target (`Target`) maps a context to a top-k; `simulate` runs the decode loop's
propose -> verify (`accept_greedy`) -> observe cycle against it, so drafters are checked end to end.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_budget import auto_budget

from recap.drafters import DEFAULT_METHOD, METHODS, is_recap_method, make_drafter
from recap.drafters.base import Drafter, Observation, RequestInfo
from recap.drafters.prompt_lookup import NgramIndex, PromptLookupDrafter, find_continuation
from recap.drafters.recap.config import ABLATIONS, AUTO_FALLBACK_BUDGET, RecapConfig, apply_ablation
from recap.drafters.recap.drafter import RecapDrafter
from recap.drafters.recap.fusion import fuse
from recap.drafters.recap.search import Memories
from recap.drafters.recap.suffix_match import suffix_chain
from recap.drafters.token_recycling import TR_TEMPLATE, SuccessorMatrix, TokenRecyclingDrafter
from recap.memory.persistent import PersistentMemory
from recap.memory.records import PredictionRecord
from recap.models.cost import CostModel, isotonic
from recap.tree import ROOT, DraftTree
from recap.verify import accept_greedy

VOCAB = 64
IMAGE = 63  # the image placeholder id of every fake request


# ---------------------------------------------------------------------------------------- fake target
class Target:
    """A deterministic fake model: greedy token = ``rule(context)``; top-k fills the rest with neighbours."""

    def __init__(self, rule: Callable[[Sequence[int]], int], k: int = 8, top: float = 0.7) -> None:
        self.rule, self.k, self.top = rule, k, top

    def topk(self, context: Sequence[int]) -> tuple[list[int], list[float]]:
        greedy = self.rule(context)
        ids = [greedy] + [(greedy + 1 + i) % (VOCAB - 1) for i in range(self.k - 1)]
        rest = (1 - self.top) / (self.k - 1)
        return ids, [self.top] + [rest * 0.9**i for i in range(self.k - 1)]

    def rows(self, contexts: list[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        pairs = [self.topk(c) for c in contexts]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def cycle_rule(pattern: Sequence[int]) -> Callable[[Sequence[int]], int]:
    """Next token = the successor of the last token in a repeating ``pattern``."""
    return lambda context: (
        pattern[(pattern.index(context[-1]) + 1) % len(pattern)] if context[-1] in pattern else pattern[0]
    )


def start(drafter: Drafter, prompt: Sequence[int], target: Target | None = None) -> list[int]:
    """Begin a request and feed the prefill observation; returns the committed context."""
    drafter.begin(RequestInfo(tuple(prompt), frozenset({IMAGE}), VOCAB))
    if target is not None and drafter.record_k:
        ids, probs = target.rows([prompt[: i + 1] for i in range(len(prompt))])
        drafter.observe(Observation(list(prompt), np.arange(len(prompt)), topk_ids=ids, topk_probs=probs))
    return list(prompt)


def step(drafter: Drafter, context: list[int], target: Target) -> tuple[DraftTree, int]:
    """One propose -> verify -> observe pass; extends ``context``; returns the tree and tokens committed."""
    tree = drafter.propose(context)
    contexts = [context] + [context + tree.path(j) for j in range(len(tree))]
    acceptance = accept_greedy(tree, [target.rule(c) for c in contexts])
    ids, probs = target.rows(contexts) if drafter.record_k else (None, None)
    drafter.observe(Observation(list(context), np.array([len(context) - 1]), tree, ids, probs, acceptance))
    context.extend(acceptance.tokens)
    return tree, len(acceptance.tokens)


def simulate(drafter: Drafter, prompt: Sequence[int], target: Target, passes: int = 30) -> float:
    """Mean accepted tokens per pass (bonus included) over ``passes`` verification passes."""
    context = start(drafter, prompt, target)
    context.append(target.rule(context))  # the prefill's own next token
    committed = 0
    for _ in range(passes):
        tree, count = step(drafter, context, target)
        tree.validate()
        committed += count
    return committed / passes


def recap(**overrides) -> RecapDrafter:
    return RecapDrafter(RecapConfig(**overrides))


def seeded(drafter: RecapDrafter, records: dict[int, dict[int, float]], prompt: Sequence[int] = (0,)) -> None:
    """Begin a request and write persistent records ``token -> {next: prob}`` directly."""
    drafter.begin(RequestInfo(tuple(prompt), frozenset({IMAGE}), VOCAB))
    k = drafter.config.k
    for token, dist in records.items():
        items = sorted(dist.items(), key=lambda kv: -kv[1]) + [(0, 0.0)] * k
        ids, probs = zip(*items[:k])
        drafter.persistent.write_many(np.array([token]), np.array([ids]), np.array([probs]))


# ---------------------------------------------------------------------------------------------- fusion
def test_fuse_two_records_by_hand():
    r2 = PredictionRecord(
        [5, 6], [0.8, 0.2], 1 - (0.8 * math.log(1 / 0.8) + 0.2 * math.log(1 / 0.2)) / math.log(2)
    )
    r1 = PredictionRecord([6, 7], [0.5, 0.5], 0.0)
    fused = fuse([("ctx2", r2), ("persistent", r1)], {"persistent": 1, "ctx2": 2, "ctx3": 4}, 0.05)
    w2, w1 = 2 * 0.278072, 0.05  # s2 * kappa(r2);  s1 * kappa_min (uniform record)
    total = w2 + w1
    assert fused.tokens == [5, 6, 7]
    assert fused.probs == pytest.approx(
        [w2 * 0.8 / total, (w2 * 0.2 + w1 * 0.5) / total, w1 * 0.5 / total], abs=1e-5
    )  # 0.734, 0.225, 0.041
    assert fused.contributions(1) == pytest.approx(
        {"ctx2": w2 * 0.2 / total, "persistent": w1 * 0.5 / total}, abs=1e-5
    )


def test_fuse_three_records_by_hand():
    r3 = PredictionRecord([5, 6], [1.0, 0.0], 1.0)  # certain: kappa 1, w = 4
    r2 = PredictionRecord([5, 6], [0.5, 0.5], 0.0)  # flat: kappa_min, w = 2 * 0.05 = 0.1
    r1 = PredictionRecord([7, 8], [0.9, 0.1], 0.531004)  # w = 1 * (1 - H(0.9, 0.1) / log 2)
    fused = fuse(
        [("ctx3", r3), ("ctx2", r2), ("persistent", r1)], {"persistent": 1, "ctx2": 2, "ctx3": 4}, 0.05
    )
    total = 4 + 0.1 + 0.531004
    expected = {5: (4 + 0.05) / total, 7: 0.531004 * 0.9 / total, 8: 0.0531004 / total, 6: 0.05 / total}
    assert dict(zip(fused.tokens, fused.probs)) == pytest.approx(expected, abs=1e-6)
    assert fused.tokens == [5, 7, 8, 6]  # 0.8745, 0.1032, 0.01147, 0.01080
    assert sum(fused.contributions(0).values()) == pytest.approx(fused.probs[0])


def test_fuse_uniform_weights_average_raw_probabilities():
    r3 = PredictionRecord([5], [1.0], 1.0)
    r1 = PredictionRecord([6], [0.4], 0.0)
    fused = fuse(
        [("ctx3", r3), ("persistent", r1)], {"persistent": 1, "ctx2": 2, "ctx3": 4}, 0.05, uniform=True
    )
    assert dict(zip(fused.tokens, fused.probs)) == pytest.approx({5: 0.5, 6: 0.2})  # plain mean, raw mass


def test_fuse_nothing_is_empty():
    assert fuse([], {}, 0.05).tokens == []


# ------------------------------------------------------------------------------------------ best-first
RECORDS = {1: {2: 0.6, 3: 0.3, 4: 0.1}, 2: {5: 0.9, 6: 0.05, 7: 0.05}, 3: {8: 0.5, 9: 0.5}}
ISOLATED = {"k": 3, "suffix": False, "use_context": False}  # persistent memory only


@pytest.mark.parametrize(
    ("overrides", "tokens", "parents"),
    [
        ({"budget": 64}, [2, 5, 3, 8, 9, 4, 6, 7], [ROOT, 0, ROOT, 2, 2, ROOT, 0, 0]),  # all, by score
        ({"budget": 3}, [2, 5, 3], [ROOT, 0, ROOT]),  # budget stops it
        ({"budget": 64, "depth": 1}, [2, 3, 4], [ROOT, ROOT, ROOT]),  # depth limit
        ({"budget": 64, "branching": 1}, [2, 5], [ROOT, 0]),  # one child per node
        ({"budget": 64, "score_floor": 0.2}, [2, 5, 3], [ROOT, 0, ROOT]),  # 0.6, 0.54, 0.3 pass the floor
    ],
)
def test_best_first_tree(overrides, tokens, parents):
    drafter = recap(**ISOLATED, **overrides)
    seeded(drafter, RECORDS)
    tree = drafter.propose([0, 1])
    tree.validate()
    assert (tree.tokens, tree.parents) == (tokens, parents)
    assert tree.scores == sorted(tree.scores, reverse=True)  # best first: nodes arrive by decreasing score
    assert all(s == ("persistent",) for s in tree.sources)


def test_best_first_scores_are_path_products_and_root_candidates_carry_shares():
    drafter = recap(**ISOLATED, budget=64)
    seeded(drafter, RECORDS)
    tree = drafter.propose([0, 1])
    assert tree.scores[1] == pytest.approx(0.6 * 0.9)  # 1 -> 2 -> 5
    believed = drafter.root_candidates()  # display only: asked for, never computed while drafting
    assert tree.root_candidates == [] and [c.token for c in believed] == [2, 3, 4]
    assert believed[0].contributions == pytest.approx({"persistent": 0.6})


def test_auto_budget_without_cost_model_uses_fallback():
    drafter = recap(k=3, suffix=False, use_context=False, depth=64, branching=1)
    seeded(drafter, {t: {t + 1: 1.0} for t in range(VOCAB - 2)})  # a certain chain 1 -> 2 -> 3 ...
    assert len(drafter.propose([0, 1])) == AUTO_FALLBACK_BUDGET


# ------------------------------------------------------------------------------------------------- suffix
@pytest.mark.parametrize(
    ("context", "chain"),
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], [4, 9, 1, 2, 3]),  # longest suffix "1 2 3", continuation to the end
        ([1, 2, 5, 1, 2, 6, 1, 2], [6, 1, 2]),  # most recent earlier occurrence of "1 2"
        ([7, 1, 2, 5, 1, 2, 6, 7, 1, 2], [5, 1, 2, 6, 7, 1, 2]),  # longer "7 1 2" beats the recent "1 2"
        ([1, 2, 3, IMAGE, 1, 2], [3]),  # the continuation stops at an image placeholder
        ([1, IMAGE, 3, 1, IMAGE], []),  # a suffix with an image placeholder is never matched
        ([1, 2, 3, 4], []),  # nothing repeats
        ([5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [5]),  # overlapping occurrence: most recent one
    ],
)
def test_suffix_chain(context, chain):
    drafter = recap(k=3, use_context=False, use_persistent=False, budget=64)
    drafter.begin(RequestInfo(tuple(context), frozenset({IMAGE}), VOCAB))
    tree = drafter.propose(context)
    assert tree.tokens == chain and tree.parents == list(range(-1, len(chain) - 1))
    assert all(s == ("suffix",) for s in tree.sources)


def test_suffix_respects_suffix_budget_and_depth():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    drafter = recap(k=3, use_context=False, use_persistent=False, budget=64, suffix_budget=2)
    drafter.begin(RequestInfo(tuple(context), frozenset(), VOCAB))
    assert drafter.propose(context).tokens == [3, 4]  # at most S new nodes
    drafter = recap(k=3, use_context=False, use_persistent=False, budget=64, depth=3)
    drafter.begin(RequestInfo(tuple(context), frozenset(), VOCAB))
    assert drafter.propose(context).tokens == [3, 4, 5]  # at most D tokens


def test_the_root_follows_the_context_given_even_without_growth():
    """The search reads the request's tokens from the drafter's mirror: a context of the same length whose
    last tokens differ (no `begin` between) still drafts under its own last token."""
    drafter = recap(k=3, use_context=False, suffix=False, budget=8)
    seeded(drafter, {2: {3: 0.8}, 5: {6: 0.9}}, prompt=[1, 2])
    assert drafter.propose([1, 2]).tokens == [3]
    assert drafter.propose([1, 5]).tokens == [6]


def test_suffix_node_merged_with_memory_node_lists_both_sources():
    drafter = recap(k=3, use_context=False, budget=64)
    seeded(drafter, {2: {3: 0.8, 9: 0.1}}, prompt=[1, 2, 3, 4, 1, 2])
    tree = drafter.propose([1, 2, 3, 4, 1, 2])
    tree.validate()
    end = tree.child(tree.child(tree.child(0, 4), 1), 2)  # the whole suffix chain 3 4 1 2 is drafted
    assert tree.child(ROOT, 3) == 0 and tree.path(end) == [3, 4, 1, 2]
    assert tree.sources[0] == ("persistent", "suffix")  # one node, both proposers, memories first
    drafter.explain(tree)  # display only: the per-memory contributions
    assert tree.contributions[0] == pytest.approx({"persistent": 0.8})
    # Cold start: the suffix token's estimate is max(fused probability, suffix_prior = 0.5) per step.
    assert [tree.scores[n] for n in tree.path_nodes(end)] == pytest.approx([0.8, 0.4, 0.2, 0.1])


# ------------------------------------------------------------------------------------------ recycling
def test_rejected_nodes_are_written_under_their_own_path_keys():
    drafter = recap(k=2, budget=0, suffix=False)
    drafter.begin(RequestInfo((1, 2, 3), frozenset({IMAGE}), VOCAB))
    tree = DraftTree()
    tree.add(4, ROOT)  # node 0
    tree.add(5, 0)  # node 1: path 3 -> 4 -> 5
    tree.add(6, ROOT)  # node 2
    rows = np.array([[10, 11], [12, 13], [14, 15], [16, 17]])  # position 2, then nodes 0, 1, 2
    probs = np.array([[0.6, 0.4]] * 4)
    drafter.observe(
        Observation([1, 2, 3], np.array([2]), tree, rows, probs, accept_greedy(tree, [9, 0, 0, 0]))
    )
    assert drafter.ctx3.lookup((2, 3, 4)).ids == [12, 13]  # rejected node 0
    assert drafter.ctx3.lookup((3, 4, 5)).ids == [14, 15]  # rejected grandchild, key from its path
    assert drafter.ctx2.lookup((3, 6)).ids == [16, 17]  # rejected sibling
    assert drafter.ctx3.lookup((1, 2, 3)).ids == [10, 11]  # the pending position
    assert drafter.persistent.lookup(5).ids == [14, 15]


def test_committed_rows_win_over_rejected_ones_with_the_same_key():
    drafter = recap(k=2, budget=0, suffix=False)
    drafter.begin(RequestInfo((1, 2), frozenset(), VOCAB))
    tree = DraftTree()
    tree.add(2, ROOT)  # node 0: accepted, token 2
    tree.add(2, 0)  # node 1: rejected, also token 2
    rows, probs = np.array([[10, 11], [12, 13], [14, 15]]), np.array([[0.6, 0.4]] * 3)
    drafter.observe(Observation([1, 2], np.array([1]), tree, rows, probs, accept_greedy(tree, [2, 7, 0])))
    assert drafter.persistent.lookup(2).ids == [12, 13]  # accepted node 0 written last


def test_keys_with_image_tokens_are_never_written_nor_looked_up():
    prompt = [IMAGE, IMAGE, 1, 2, IMAGE, 3]
    drafter = recap(k=8, budget=16)
    target = Target(cycle_rule([1, 2, 3, 4]))
    context = start(drafter, prompt, target)
    for _ in range(5):
        step(drafter, context, target)
    assert all(IMAGE not in key for key in drafter.ctx2.keys() + drafter.ctx3.keys())
    assert drafter.persistent.lookup(IMAGE) is None
    assert (2, IMAGE) not in drafter.ctx2 and (IMAGE, 3) not in drafter.ctx2
    # Records planted under keys with the placeholder are never read: token 9 (never said by the
    # target) would be drafted at the root if the contextual memories were looked up there.
    planted = PredictionRecord([9] + [0] * 7, [1.0] + [0.0] * 7, 1.0)
    drafter.ctx2.write((IMAGE, 3), planted)
    drafter.ctx3.write((2, IMAGE, 3), planted)
    assert 9 not in drafter.propose([1, 2, IMAGE, 3]).tokens
    drafter.ctx2.write((4, 3), planted)  # the same record under a usable key is read
    assert 9 in drafter.propose([1, 4, 3]).tokens
    # Even a record planted under the placeholder is never read: after it, nothing is drafted.
    drafter.persistent.write_many(np.array([IMAGE]), np.array([[7] * 8]), np.array([[1.0] + [0.0] * 7]))
    assert len(drafter.propose([*context, IMAGE])) == 0


def test_image_placeholder_context_drafts_nothing():
    drafter = make_drafter("recap", config=RecapConfig(budget=16))
    context = start(drafter, [1, 2, 3, IMAGE], Target(cycle_rule([1, 2, 3])))
    assert len(drafter.propose(context)) == 0


@pytest.mark.parametrize(
    ("scope", "contexts_kept"),
    [
        ("request", (0, 0)),  # the paper: contextual memories live for one request
        ("stream", (2, 1)),  # ours: kept across requests, as a fallback this request's writes replace
    ],
)
def test_persistent_memory_survives_begin_and_context_memories_follow_their_scope(scope, contexts_kept):
    drafter = recap(k=8, context_scope=scope)
    start(drafter, [1, 2, 3], Target(cycle_rule([1, 2, 3])))
    assert len(drafter.persistent) == 3 and (len(drafter.ctx2), len(drafter.ctx3)) == (2, 1)
    drafter.begin(RequestInfo((5,), frozenset(), VOCAB))
    assert len(drafter.persistent) == 3 and (len(drafter.ctx2), len(drafter.ctx3)) == contexts_kept


def test_stream_contexts_are_shared_and_stamped_with_the_request_that_wrote_them():
    shared = PersistentMemory(VOCAB, 8)
    first = make_drafter("recap", persistent=shared)
    start(first, [1, 2, 3], Target(cycle_rule([1, 2, 3])))
    written_by = first.ctx2.lookup((1, 2)).request
    second = make_drafter("recap", persistent=shared)  # a new drafter per request, as the studio makes
    start(second, [1, 2, 3], Target(cycle_rule([1, 2, 3])))
    assert second.ctx2 is first.ctx2 and second.ctx2.lookup((1, 2)).request == written_by + 1


@pytest.mark.parametrize(("method", "expected"), [("recap", [3, 4]), ("recap-latest-context", [4, 5])])
def test_a_stream_context_offers_the_earlier_requests_consensus(method, expected):
    """Earlier requests (images) predicted 3, 3 and then 4 after (7, 1, 2); a new request that has not
    computed that context yet drafts from all of them by default, from the latest one only in the
    ablation, under both the 2- and the 3-token key."""
    shared = PersistentMemory(VOCAB, 8)
    for greedy in (3, 3, 4):  # requests 0 and 1 predict 3, request 2 predicts 4
        drafter = make_drafter(method, persistent=shared)
        start(drafter, [7, 1, 2], Target(lambda context, greedy=greedy: greedy if context[-1] == 2 else 9))
    third = make_drafter(method, persistent=shared)
    third.begin(RequestInfo((7, 1, 2), frozenset({IMAGE}), VOCAB))
    assert third.ctx2.lookup((1, 2)).ids[:2] == expected
    assert third.ctx3.lookup((7, 1, 2)).ids[:2] == expected
    assert third.ctx2.lookup((1, 2)).request == 2  # still another request's record for the estimates


def test_shared_persistent_memory_is_used_across_drafters():
    shared = PersistentMemory(VOCAB, 8)
    start(make_drafter("recap", persistent=shared), [1, 2, 3], Target(cycle_rule([1, 2, 3])))
    other = make_drafter("recap", persistent=shared)
    other.begin(RequestInfo((9,), frozenset(), VOCAB))
    assert other.propose([9, 1]).tokens[0] == 2  # learned by the first drafter
    with pytest.raises(ValueError, match="k=8"):
        RecapDrafter(RecapConfig(k=4), persistent=shared)


# ------------------------------------------------------------------------------------------- ablations
def test_ablation_no_persistent_neither_writes_nor_reads_p1():
    drafter = make_drafter("recap-no-persistent")
    start(drafter, [1, 2, 3, 1], Target(cycle_rule([1, 2, 3])))
    assert len(drafter.persistent) == 0 and len(drafter.ctx2) == 3
    drafter.persistent.write_many(np.array([1]), np.array([[7] * 8]), np.array([[1.0] + [0.0] * 7]))
    assert all("persistent" not in s for s in drafter.propose([5, 6, 1]).sources)


def test_ablation_no_context_neither_writes_nor_reads_contexts():
    drafter = make_drafter("recap-no-context")
    start(drafter, [1, 2, 3, 1], Target(cycle_rule([1, 2, 3])))
    assert len(drafter.ctx2) == len(drafter.ctx3) == 0 and len(drafter.persistent) == 3
    tree = drafter.propose([1, 2, 3, 1])
    assert tree.tokens[0] == 2 and all(set(s) <= {"persistent", "suffix"} for s in tree.sources)


def test_ablation_no_suffix_drafts_nothing_without_memories():
    context = [1, 2, 3, 1, 2]
    with_suffix, without = make_drafter("recap"), make_drafter("recap-no-suffix")
    for drafter in (with_suffix, without):
        drafter.begin(RequestInfo(tuple(context), frozenset(), VOCAB))
    assert with_suffix.propose(context).tokens == [3, 1, 2] and len(without.propose(context)) == 0


def test_ablation_uniform_weights_ignore_specificity_and_confidence():
    drafter = make_drafter("recap-uniform", config=RecapConfig(k=2, suffix=False))
    seeded(drafter, {2: {5: 0.5, 6: 0.5}})
    drafter.ctx2.write((1, 2), PredictionRecord([6, 7], [0.9, 0.1], 0.53))
    drafter.propose([1, 2])
    fused = {c.token: c.prob for c in drafter.root_candidates()}
    assert fused == pytest.approx({6: 0.7, 5: 0.25, 7: 0.05})  # plain means of the two records


def test_ablation_template_fills_the_tr_template_from_fused_memories():
    drafter = make_drafter("recap-template", config=RecapConfig(suffix=False))
    distinct = {t: {(t * 8 + r) % (VOCAB - 1): 0.5 / (r + 1) for r in range(8)} for t in range(VOCAB)}
    seeded(drafter, distinct)
    tree = drafter.propose([0, 1])
    tree.validate()
    assert Counter(tree.depths.tolist()) == {1: 8, 2: 21, 3: 25, 4: 15, 5: 8, 6: 3}
    assert tree.scores[8] == pytest.approx(0.5 * 0.5)  # rank 0 under rank 0: product of fused probs


def test_every_ablation_disables_exactly_its_part():
    base = RecapConfig()
    changed = {
        name: {f for f in overrides if getattr(apply_ablation(base, name), f) != getattr(base, f)}
        for name, overrides in ABLATIONS.items()
    }
    assert changed == {name: set(overrides) for name, overrides in ABLATIONS.items()}


# ------------------------------------------------------------------------------------- token recycling
def test_tr_template_has_the_published_shape():
    depth: list[int] = []
    for parent, _ in TR_TEMPLATE:
        assert parent < len(depth)  # parents come first
        depth.append(1 if parent < 0 else depth[parent] + 1)
    assert len(TR_TEMPLATE) == 80 and len(set(TR_TEMPLATE)) == 80
    assert Counter(depth) == {1: 8, 2: 21, 3: 25, 4: 15, 5: 8, 6: 3}
    children = Counter(parent for parent, _ in TR_TEMPLATE)
    assert all(sorted(r for p, r in TR_TEMPLATE if p == n) == list(range(children[n])) for n in children)


def test_tr_fills_80_nodes_when_tokens_are_distinct():
    drafter = TokenRecyclingDrafter()
    drafter.begin(RequestInfo((1,), frozenset(), 1000))
    drafter.successors.ids[:] = (np.arange(1000)[:, None] * 8 + np.arange(8)) % 1000
    tree = drafter.propose([5, 1])
    tree.validate()
    assert len(tree) == 80 and Counter(tree.depths.tolist()) == {1: 8, 2: 21, 3: 25, 4: 15, 5: 8, 6: 3}
    assert tree.tokens[:8] == list(range(8, 16))  # row of the root token 1, rank order
    assert tree.tokens[8] == 64 and set(tree.sources) == {("template",)}  # matrix[8, 0]


def test_tr_zero_matrix_merges_siblings():
    drafter = TokenRecyclingDrafter()
    drafter.begin(RequestInfo((1,), frozenset(), 50))
    assert drafter.propose([1]).tokens == [0] * 6  # all-zero rows: one token 0 per depth


def test_tr_observe_overwrites_rows_of_every_position_and_node():
    drafter = TokenRecyclingDrafter()
    drafter.begin(RequestInfo((1, 2), frozenset({IMAGE}), VOCAB))
    tree = DraftTree()
    tree.add(3, ROOT)
    tree.add(IMAGE, ROOT)
    ids = np.arange(24).reshape(3, 8)
    drafter.observe(
        Observation([1, 2], np.array([1]), tree, ids, np.ones((3, 8)), accept_greedy(tree, [9, 0, 0]))
    )
    assert drafter.successors.ids[2].tolist() == list(range(8))  # pending position
    assert drafter.successors.ids[3].tolist() == list(range(8, 16))  # rejected node
    assert not drafter.successors.ids[IMAGE].any()  # image placeholder rows are not written


def test_tr_hot_start_keeps_the_matrix_and_cold_start_resets_it():
    shared = SuccessorMatrix(VOCAB)
    hot, cold = TokenRecyclingDrafter(shared), TokenRecyclingDrafter(shared, cold_start=True)
    start(hot, [1, 2, 3], Target(cycle_rule([1, 2, 3])))
    hot.begin(RequestInfo((4,), frozenset(), VOCAB))
    assert shared.ids[1, 0] == 2  # kept across requests
    cold.begin(RequestInfo((4,), frozenset(), VOCAB))
    assert not shared.ids.any()


# --------------------------------------------------------------------------------------- prompt lookup
@pytest.mark.parametrize(
    ("context", "chain"),
    [
        ([1, 2, 3, 9, 8, 1, 2, 3], [9, 8, 1, 2, 3]),  # 3-gram match
        ([1, 2, 3, 9, 8, 5, 2, 3], [9, 8, 5, 2, 3]),  # falls back to the 2-gram "2 3"
        ([4, 9, 8, 7, 6, 3, 4], [9, 8, 7, 6, 3, 4]),  # falls back to the 1-gram "4"
        ([1, 2, 3, 4], []),  # no match: empty tree
        ([*range(1, 20), 1], list(range(2, 12))),  # at most 10 tokens
        ([1, 5, 1, 6, 1], [6, 1]),  # most recent earlier occurrence
        ([7, IMAGE, 5, IMAGE], []),  # image placeholders are never matched
    ],
)
def test_prompt_lookup(context, chain):
    drafter = PromptLookupDrafter()
    drafter.begin(RequestInfo(tuple(context), frozenset({IMAGE}), VOCAB))
    tree = drafter.propose(context)
    assert tree.tokens == chain and tree.parents == list(range(-1, len(chain) - 1))
    assert drafter.record_k == 0 and all(s == ("lookup",) for s in tree.sources)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 6))
def test_ngram_index_matches_reference(tokens, growth):
    index = NgramIndex(2, 4, excluded={4})
    for end in range(1, len(tokens) + 1, growth):  # the sequence grows by several tokens per step
        assert index.continuation(tokens[:end], 5) == find_continuation(tokens[:end], 2, 4, 5, {4})


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(0, 6), st.integers(2, 5))
def test_compiled_suffix_match_matches_reference(tokens, num, max_n):
    """RECAP's compiled suffix match (`suffix_chain`, inside the search's call) is `find_continuation`:
    4 is excluded (its ``usable`` entry False); 5 lies outside the vocabulary (never excluded)."""
    usable = np.array([True, True, True, True, False, False])  # vocabulary 0-4, then "no token"
    array = np.array([*tokens, 0, 0], dtype=np.int64)  # the mirror is longer than the context
    chain = suffix_chain(array, len(tokens), usable, 2, max_n, num)
    assert chain.tolist() == find_continuation(tokens, 2, max_n, num, {4})


# ----------------------------------------------------------------------------------------------- cost
@pytest.mark.parametrize(
    ("tokens", "seconds"),
    # a measured point, the flat part, interpolated, extrapolated beyond the last point, clamped below
    [(1, 1.0), (4, 1.0), (12, 1.5), (16, 2.0), (24, 3.0), (0, 1.0)],
)
def test_cost_model_interpolates(tokens, seconds):
    assert CostModel([(1, 1.0), (8, 1.0), (16, 2.0)]).cost(tokens) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("points", "kept"),
    [
        ([(1, 1.0), (64, 1.0)], 20),  # flat curve: every node helps, up to the cap
        ([(1, 1.0), (8, 1.0), (16, 2.0)], 7),  # flat up to 8 tokens, then steep
        ([(1, 1.0), (2, 2.0)], 0),  # cost grows as fast as tokens: no draft pays off
    ],
)
def test_auto_budget(points, kept):
    assert auto_budget(CostModel(points), [0.9, 0.5, 0.2, 0.1] * 5, cap=20) == kept


@pytest.mark.parametrize(
    ("points", "size"),
    [
        ([(1, 0.01), (64, 0.01)], 32),  # flat: grows to max_budget
        ([(1, 0.01), (2, 0.02)], 0),  # steep: nothing
        ([(1, 0.01), (4, 0.0105), (8, 0.03)], 3),  # cheap up to 4 tokens (root + 3 nodes)
    ],
)
def test_drafter_budget_follows_cost_model(points, size):
    drafter = RecapDrafter(
        RecapConfig(k=3, suffix=False, use_context=False, max_budget=32), cost_model=CostModel(points)
    )
    seeded(drafter, {t: {t + 1: 0.95, t + 2: 0.04} for t in range(VOCAB - 3)})
    assert len(drafter.propose([0, 1])) == size


@pytest.mark.parametrize(
    "points",
    [
        [(1, 0.01), (4, 0.0105), (8, 0.03)],  # cheap up to 4 tokens
        [(1, 0.01), (2, 0.016), (16, 0.017), (64, 0.05)],  # a step, then flat, then steep
        [(1, 0.01), (64, 0.04)],  # a steady slope
        [(1, 0.01), (2, 0.02)],  # nothing pays
    ],
)
def test_the_search_stops_where_the_budget_rule_stops_and_keeps_the_same_tree(monkeypatch, points):
    # The reference: grow all `max_budget` nodes, then keep `auto_budget`'s prefix of them.
    import recap.drafters.recap.drafter as recap_module

    config = RecapConfig(k=4, suffix=False, use_context=False, max_budget=48)
    records = {t: {t + 1: 0.5, t + 2: 0.3, t + 3: 0.1, t + 4: 0.05} for t in range(VOCAB - 5)}
    full_grow, grown = recap_module.grow, []

    def counted(*args, **kwargs):
        growth = full_grow(*args, **kwargs)
        grown.append(len(growth.tokens))
        return growth

    monkeypatch.setattr(recap_module, "grow", counted)
    drafter = RecapDrafter(config, cost_model=CostModel(points))
    seeded(drafter, records)
    tree = drafter.propose([0, 1])
    length = drafter._seen.offset + 2  # (the mirror holds the stream's earlier tokens first)
    memories = Memories(
        None, None, drafter.persistent, drafter._request, drafter.acceptance.levels(), drafter._backoff()
    )
    full = full_grow(drafter._seen.tokens, length, 48, drafter._search, drafter._usable, memories)
    size = auto_budget(CostModel(points), full.scores, overhead=0.0)
    assert (tree.tokens, tree.parents) == (full.tokens[:size].tolist(), full.parents[:size].tolist())
    assert tree.scores == full.scores[:size].tolist()
    assert len(full.tokens) == 48 and grown[0] < 48  # the search stopped early


@pytest.mark.parametrize(
    ("tokens", "length", "backoff", "message"),
    [
        (np.arange(4), 5, None, "outside the 4 tokens"),
        (np.arange(4, dtype=np.int32), 2, None, "int64"),
        (np.arange(4), 2, (np.arange(3), np.ones(3, np.float32)), "k = 4"),
    ],
)
def test_grow_refuses_what_the_compiled_search_would_read_out_of_bounds(tokens, length, backoff, message):
    from recap.drafters.recap.search import grow, settings_of

    settings = settings_of(RecapConfig(k=4))
    usable = np.ones(VOCAB + 1, dtype=bool)
    with pytest.raises(ValueError, match=message):
        grow(tokens, length, 8, settings, usable, Memories(None, None, None, 0, None, backoff))


@pytest.mark.parametrize("scope", ["stream", "request"])
def test_the_suffix_match_continues_an_earlier_request_only_with_stream_scope(scope):
    config = RecapConfig(k=4, budget=8, use_context=False, use_persistent=False, suffix_scope=scope)
    drafter = RecapDrafter(config)
    drafter.begin(RequestInfo((1, 2, 3), frozenset({IMAGE}), VOCAB))
    drafter.propose([1, 2, 3, 7, 8, 9, 10, 11])  # the first request's answer: ... 7 8 9 10 11
    drafter.begin(RequestInfo((4, 5), frozenset({IMAGE}), VOCAB))
    tree = drafter.propose([4, 5, 7, 8])  # the second request ends as the first went on
    if scope == "stream":
        assert tree.tokens[:3] == [9, 10, 11] and tree.parents[:3] == [ROOT, 0, 1]
        # the first answer's last token: what followed it is the separator, never drafted
        assert all(0 <= t < VOCAB for t in drafter.propose([4, 5, 11]).tokens)
    else:
        assert len(tree) == 0  # nothing in this request to continue


def test_drafters_sharing_a_memory_share_the_streams_earlier_requests():
    # The studio builds one drafter per request on a session's memory: the next one still continues
    # what the previous one's request said.
    config = RecapConfig(k=4, budget=8, use_context=False, use_persistent=False)
    memory = PersistentMemory(VOCAB, 4)
    first, second = RecapDrafter(config, persistent=memory), RecapDrafter(config, persistent=memory)
    first.begin(RequestInfo((1, 2, 3), frozenset({IMAGE}), VOCAB))
    first.propose([1, 2, 3, 7, 8, 9, 10, 11])
    second.begin(RequestInfo((4, 5), frozenset({IMAGE}), VOCAB))
    assert second.propose([4, 5, 7, 8]).tokens[:3] == [9, 10, 11]
    memory.reset()  # a reset memory forgets them
    third = RecapDrafter(config, persistent=memory)
    third.begin(RequestInfo((4, 5), frozenset({IMAGE}), VOCAB))
    assert len(third.propose([4, 5, 7, 8])) == 0


@pytest.mark.parametrize(
    ("values", "fitted"),
    [
        ([1.0, 1.2, 1.0, 1.3], [1.0, 1.1, 1.1, 1.3]),  # a spike is pooled with its right neighbour
        ([3.0, 2.0, 1.0], [2.0, 2.0, 2.0]),
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),  # already non-decreasing: unchanged
        ([], []),
    ],
)
def test_isotonic(values, fitted):
    assert isotonic(values) == pytest.approx(fitted)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=12))
def test_isotonic_is_non_decreasing_and_keeps_the_total(values):
    fitted = isotonic(values)
    assert np.all(np.diff(fitted) >= -1e-12)
    assert fitted.sum() == pytest.approx(sum(values))


def test_timing_noise_does_not_stop_a_flat_curve():
    # GPU-like: every pass costs about the same, one measurement is a noisy spike.
    points = [(1, 1.0), (8, 1.0), (16, 1.3), (32, 1.0), (64, 1.0)]
    scores = [0.5, 0.3, 0.2] + [0.05] * 40
    model = CostModel(points)
    assert model.points == tuple(points) and model.fitted[2][1] == pytest.approx(1.1)
    assert auto_budget(model, scores, cap=40) == 40

    class Unsmoothed:  # what the budget rule saw before the isotonic fit
        def cost(self, tokens):
            return float(np.interp(tokens, *zip(*points)))

        def costs(self, tokens):
            return np.interp(tokens, *zip(*points))

    assert auto_budget(Unsmoothed(), scores, cap=40) < 10


@pytest.mark.parametrize(
    "points",
    [[], [(1, 1.0), (1, 2.0)], [(0, 1.0)], [(4, -1.0)]],  # none, duplicate, zero tokens, negative time
)
def test_cost_model_rejects_bad_points(points):
    with pytest.raises(ValueError):
        CostModel(points)


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"k": 0}, "k must be"),
        ({"budget": -1}, "budget must be"),
        ({"budget": "big"}, "budget must be"),
        ({"max_budget": 0}, "max_budget"),
        ({"depth": 0}, "depth"),
        ({"branching": 0}, "branching"),
        ({"score_floor": 1.5}, "score_floor"),
        ({"specificity": (1.0, -2.0, 4.0)}, "specificity"),
        ({"specificity": (1.0, 2.0)}, "specificity"),
        ({"kappa_min": 0.0}, "kappa_min"),
        ({"suffix_max_len": 1}, "suffix_max_len"),
        ({"tree": "beam"}, "tree must be"),
        ({"use_persistent": False, "use_context": False, "suffix": False}, "at least one"),
        ({"depth": True}, "depth"),  # a bool is not an int here
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        RecapConfig(**overrides)


def test_unknown_ablation():
    with pytest.raises(ValueError, match="unknown ablation"):
        apply_ablation(RecapConfig(), "recap-nothing")


# ---------------------------------------------------------------------------------------------- registry
def test_registry_names_and_options():
    assert DEFAULT_METHOD == "recap"
    assert {"recap", "tr", "pld", "ar", "suffix", *ABLATIONS} == set(METHODS)
    options = {"config": RecapConfig(budget=8), "cost_model": None, "persistent": None, "unused": 1}
    for method in METHODS:
        drafter = make_drafter(method, **options)  # the same options for every method
        assert isinstance(drafter, Drafter) and drafter.name == method
    assert make_drafter("recap-no-suffix", config=RecapConfig(budget=8)).config.budget == 8
    with pytest.raises(ValueError, match="unknown method"):
        make_drafter("medusa")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("recap", True),
        ("recap-no-suffix", True),
        ("recap-template", True),
        ("tr", False),
        ("pld", False),
        ("ar", False),
        ("recapitulate", False),
    ],
)
def test_is_recap_method(name, expected):
    assert is_recap_method(name) is expected


def test_every_recap_method_is_recognised():
    assert [m for m in METHODS if is_recap_method(m)] == [m for m in METHODS if m.startswith("recap")]


# ------------------------------------------------------------------------------------ end-to-end loops
PATTERN = [3, 14, 15, 9, 26, 5, 35]


@pytest.mark.parametrize("method", ["recap", "tr", "pld", *ABLATIONS])
def test_drafters_accept_several_tokens_on_a_repetitive_stream(method):
    mat = simulate(make_drafter(method), [IMAGE] * 4 + PATTERN * 2, Target(cycle_rule(PATTERN)))
    assert mat > 3.0


def test_ar_accepts_exactly_one_token_per_pass():
    assert simulate(make_drafter("ar"), PATTERN, Target(cycle_rule(PATTERN)), passes=5) == 1.0


def test_context_memory_resolves_what_one_token_cannot():
    # "1 2" is followed by 3 or by 4 depending on the token before: only 3-token keys tell them apart.
    stream = [7, 1, 2, 3, 8, 1, 2, 4] * 2
    successor = {7: 1, 1: 2, 3: 8, 8: 1, 4: 7}

    def rule(context):
        if len(context) >= 3 and context[-2:] == [1, 2]:
            return 3 if context[-3] == 7 else 4
        return successor.get(context[-1], 7)

    full = simulate(make_drafter("recap", config=RecapConfig(suffix=False)), stream, Target(rule), passes=40)
    token_only = simulate(
        make_drafter("recap-no-context", config=RecapConfig(suffix=False)), stream, Target(rule), passes=40
    )
    assert full > token_only


# ------------------------------------------------------------------------------------- property tests
@settings(max_examples=40, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 12), min_size=1, max_size=30),
    budget=st.integers(0, 24),
    depth=st.integers(1, 5),
    branching=st.integers(1, 4),
    method=st.sampled_from(["recap", "tr", "pld", *ABLATIONS]),
    seed=st.integers(0, 2**16),
)
def test_random_streams_always_give_valid_trees(prompt, budget, depth, branching, method, seed):
    rng = np.random.default_rng(seed)
    prompt = [IMAGE if t == 12 else t for t in prompt]  # some image placeholders
    config = RecapConfig(budget=budget, depth=depth, branching=branching, suffix_budget=3)
    drafter = make_drafter(method, config=config)

    def random_rule(context):
        return int(rng.integers(0, 12))

    target = Target(random_rule)
    context = start(drafter, prompt, target)
    for _ in range(6):
        tree, _ = step(drafter, context, target)
        tree.validate()
        if method.startswith("recap") and method != "recap-template":
            assert len(tree) <= budget
            assert len(tree) == 0 or tree.depths.max() <= depth
            kids = Counter(tree.parents)
            assert all(count <= branching + 1 for count in kids.values())  # + the merged suffix child
    if isinstance(drafter, RecapDrafter):
        assert all(IMAGE not in key for key in drafter.ctx2.keys() + drafter.ctx3.keys())
        assert drafter.persistent.lookup(IMAGE) is None

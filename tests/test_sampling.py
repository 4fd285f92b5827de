"""Sampling: transformers-exact logit processing, and the tree acceptance rule's exactness."""

from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import tiny
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from recap.decode import generate
from recap.memory.persistent import PersistentMemory
from recap.runtime import Runtime
from recap.sampling import SamplingSettings, accept_sampled, choose_among, processed_probs
from recap.state import DrafterState
from recap.tree import DraftTree


def _transformers_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return torch.softmax(warpers(None, logits.float()).double(), dim=-1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [
        (1.0, 0, 1.0),  # plain softmax
        (0.7, 0, 1.0),  # temperature only
        (0.7, 5, 1.0),  # + top-k
        (1.3, 0, 0.8),  # + top-p
        (0.5, 3, 0.9),  # all three, in transformers' order
        (1.0, 1, 1.0),  # top-1 = greedy by sampling
        (2.0, 0, 0.01),  # top-p so small that only the best token survives
    ],
)
def test_processed_probs_equal_transformers_warpers(temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=generator) * 3
    logits[0, :4] = 2.5  # ties at the top-k boundary are kept by both
    settings = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p)
    ours = processed_probs(logits, settings)
    theirs = _transformers_probs(logits, temperature, top_k, top_p)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.allclose(ours.sum(-1), torch.ones(6, dtype=torch.float64))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": "0.7"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"seed": -3}, "seed"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_absurd_settings_are_refused_with_their_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**kwargs)


def test_temperature_zero_is_greedy_and_has_no_distribution():
    assert SamplingSettings().greedy and SamplingSettings().generate_kwargs() == {"do_sample": False}
    with pytest.raises(ValueError, match="greedy"):
        processed_probs(torch.zeros(1, 4), SamplingSettings())


def _bound(p: np.ndarray, n: int) -> np.ndarray:
    """5 standard deviations of an empirical frequency over n draws (plus a floor for p near 0)."""
    return 5 * np.sqrt(p * (1 - p) / n) + 1e-4


@pytest.mark.parametrize("case", range(6))
def test_one_step_rule_commits_tokens_distributed_as_p(case):
    # Random p over 7 tokens and a random ordered child set (0 to 4 children, any tokens).
    setup = np.random.default_rng(100 + case)
    p = setup.dirichlet(np.full(7, 0.6))
    children = list(setup.permutation(7)[: setup.integers(0, 5)])
    rng = np.random.default_rng(case)
    n = 40_000
    counts = np.zeros(7)
    accepted_children = 0
    for _ in range(n):
        chosen, token, draw = choose_among(p, children, float(rng.random()))
        counts[token] += 1
        accepted_children += chosen is not None
        assert draw.residual == (chosen is None) and draw.token == token
        assert chosen is None or children[chosen] == token
        assert draw.residual or token in children
    assert np.all(np.abs(counts / n - p) <= _bound(p, n))
    # A child is accepted exactly when the drawn token is a child: probability sum of p over them.
    child_mass = float(p[children].sum()) if children else 0.0
    assert abs(accepted_children / n - child_mass) <= _bound(np.array(child_mass), n)


def test_residual_draw_never_returns_a_rejected_child():
    p = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(0)
    for _ in range(2000):
        chosen, token, draw = choose_among(p, [1, 2], float(rng.random()))
        if chosen is None:
            assert token == 0 and draw.tried == ((1, 0.3), (2, 0.2))


def test_a_child_with_zero_probability_is_never_accepted():
    p = np.array([0.0, 1.0])
    rng = np.random.default_rng(1)
    for _ in range(500):
        chosen, token, _ = choose_among(p, [0], float(rng.random()))
        assert chosen is None and token == 1


def test_tree_acceptance_reproduces_the_targets_joint_distribution():
    # Tree: root -> [a=2 -> [c=1, d=3], b=0 -> [e=2]]. Rows: root, then nodes a, c, d, b, e.
    tree = DraftTree()
    a = tree.add(2)
    tree.add(1, a)
    tree.add(3, a)
    b = tree.add(0)
    tree.add(2, b)
    setup = np.random.default_rng(7)
    rows = setup.dirichlet(np.ones(4), size=len(tree) + 1)
    node_of_row = {2: a + 1, 0: b + 1}  # first token -> the row of the node holding it
    rng = np.random.default_rng(3)
    n = 40_000
    pairs: Counter = Counter()
    for _ in range(n):
        acceptance = accept_sampled(tree, lambda row: rows[row], rng)
        assert len(acceptance.tokens) == len(acceptance.nodes) + 1 == len(acceptance.draws)
        tokens = acceptance.tokens
        if tokens[0] in node_of_row:  # an accepted first node: a second token was drawn after it
            pairs[tokens[0], tokens[1]] += 1
        else:
            pairs[tokens[0], None] += 1
    for first in range(4):
        if first in node_of_row:
            for second in range(4):
                expected = rows[0][first] * rows[node_of_row[first]][second]
                assert abs(pairs[first, second] / n - expected) <= _bound(np.array(expected), n)
        else:
            expected = rows[0][first]
            assert abs(pairs[first, None] / n - expected) <= _bound(np.array(expected), n)


def test_seeded_runs_are_reproducible():
    tree = DraftTree()
    tree.add(1, tree.add(0))
    rows = np.random.default_rng(0).dirichlet(np.ones(3), size=3)
    first = [accept_sampled(tree, lambda r: rows[r], SamplingSettings(0.7, seed=5).generator()) for _ in "ab"]
    assert first[0] == first[1]


# ------------------------------------------------------------------------------------ end to end
@functools.cache
def _exact_joint(settings: SamplingSettings, prompt: str) -> dict[tuple[int, int], float]:
    """P(first two tokens) of the tiny text model under ``settings``, from its logits (no sampling)."""
    target = tiny("llama")
    inputs = target.prepare([], prompt)
    with torch.inference_mode():
        first = processed_probs(target.model(**inputs).logits[0, -1:], settings)[0]
        joint = {}
        for t1 in torch.nonzero(first).flatten().tolist():
            ids = torch.cat([inputs["input_ids"], torch.tensor([[t1]])], 1)
            second = processed_probs(target.model(input_ids=ids).logits[0, -1:], settings)[0]
            for t2 in torch.nonzero(second).flatten().tolist():
                joint[t1, t2] = float(first[t1] * second[t2])
    return joint


def _within_bound(counts: Counter, exact: dict, n: int) -> list:
    """Cells whose empirical frequency is more than 5 standard deviations from the exact one."""
    bad = [
        (cell, counts[cell] / n, p) for cell, p in exact.items() if abs(counts[cell] / n - p) > _bound(p, n)
    ]
    bad += [(cell, counts[cell] / n, 0.0) for cell in counts if cell not in exact]
    return bad


@pytest.mark.slow
def test_speculative_sampling_draws_the_first_tokens_like_generate():
    settings = SamplingSettings(temperature=0.9, top_k=4, top_p=0.95)
    prompt = "the cat sat on the mat and"
    exact = _exact_joint(settings, prompt)
    target = tiny("llama")
    runtime = Runtime(target)
    persistent = PersistentMemory(target.vocab_size)  # shared across runs, so drafts get accepted
    n = 2500
    ours: Counter = Counter()
    drafted = 0
    for seed in range(n):
        run = SamplingSettings(settings.temperature, settings.top_k, settings.top_p, seed=seed)
        result = generate(
            target,
            runtime.drafter("recap", budget=8, state=DrafterState.given(target.vocab_size, persistent)),
            prompt,
            [],
            2,
            sampling=run,
        )
        ours[tuple(result.tokens)] += 1
        drafted += sum(s.accepted_len for s in result.steps)
    assert not _within_bound(ours, exact, n)
    assert drafted > n // 4  # the tree really served tokens, not only the residual
    # transformers' own sampler agrees with the same exact distribution (same settings, thousands of seeds).
    inputs = target.prepare([], prompt)
    theirs: Counter = Counter()
    with torch.inference_mode():
        for seed in range(n):
            torch.manual_seed(seed)
            out = target.model.generate(
                **inputs, max_new_tokens=2, min_new_tokens=2, pad_token_id=0, **settings.generate_kwargs()
            )
            theirs[tuple(out[0, -2:].tolist())] += 1
    assert not _within_bound(theirs, exact, n)


@pytest.mark.parametrize("method", ["pld", "tr", "recap", "recap-no-context", "suffix"])
def test_a_seed_gives_every_drafter_the_same_tokens_as_autoregressive_sampling(method):
    # One uniform draw per committed position, through the target's distribution: the tree decides
    # how many passes it takes, never which tokens come out.
    target = tiny("llama")
    runtime = Runtime(target)
    persistent = PersistentMemory(target.vocab_size)
    for seed, prompt in [(3, "the cat is"), (4, "the cat is"), (5, "the dog and the cat")]:
        sampling = SamplingSettings(temperature=0.8, top_p=0.9, seed=seed)
        drafter = runtime.drafter(method, state=DrafterState.given(runtime.target.vocab_size, persistent))
        ours = generate(target, drafter, prompt, [], 24, sampling=sampling).tokens
        assert ours == generate(target, runtime.drafter("ar"), prompt, [], 24, sampling=sampling).tokens


def test_seeds_differ():
    target = tiny("llama")
    runs = {
        tuple(
            generate(
                target,
                Runtime(target).drafter("ar"),
                "the cat is",
                [],
                12,
                sampling=SamplingSettings(temperature=1.0, seed=seed),
            ).tokens
        )
        for seed in range(4)
    }
    assert len(runs) > 1


def test_a_uniform_draw_commits_the_same_token_whatever_the_children():
    p = np.random.default_rng(9).dirichlet(np.ones(6))
    for u in np.linspace(0, 0.999, 41):
        tokens = {choose_among(p, children, float(u))[1] for children in ([], [2], [5, 0, 3], [1, 2, 3, 4])}
        assert len(tokens) == 1


def test_sampling_records_each_positions_draw():
    target = tiny("llama")
    sampling = SamplingSettings(temperature=1.0, seed=0)
    steps = generate(target, Runtime(target).drafter("tr"), "the cat is", [], 16, sampling=sampling).steps
    for step in steps[1:]:
        assert step.draws and len(step.draws) >= step.accepted_len
        for draw in step.draws:
            assert all(0.0 <= p <= 1.0 for _, p in draw["tried"])
        last = step.draws[-1]
        if step.bonus_token is not None:
            assert last["token"] == step.bonus_token and last["residual"]


# ------------------------------------------------------------------ acceptance estimates when sampling
def _learnt(commit: str) -> tuple[np.ndarray, np.ndarray]:
    """RECAP's acceptance counts (seen, hits per coarse kind) after one verified pass whose target
    commits: ``greedy`` (the argmax), ``one-hot`` (sampling that puts all mass on the argmax),
    ``none`` (sampling with no mass on the top-k) or ``spread`` (the top-k probabilities)."""
    from recap.drafters.base import Observation, RequestInfo
    from recap.drafters.recap.config import RecapConfig
    from recap.drafters.recap.drafter import RecapDrafter
    from recap.verify import accept_greedy

    drafter = RecapDrafter(RecapConfig(k=2, budget=4, suffix=False))
    drafter.begin(RequestInfo((1, 2, 3), frozenset(), 50))
    ids, probs = np.array([[2, 5], [3, 6], [4, 7]]), np.array([[0.7, 0.3]] * 3)
    drafter.observe(Observation([1, 2, 3], np.arange(3), topk_ids=ids, topk_probs=probs))
    tree = drafter.propose([1, 2, 3])
    assert len(tree)  # the records proposed a tree
    rows = np.array([[4, 9]] + [[8, 9]] * len(tree))  # the target: 4 after 3, then 8
    probs = np.array([[0.6, 0.4]] * (len(tree) + 1))
    commit_probs = {
        "greedy": None,
        "one-hot": np.array([[1.0, 0.0]] * len(rows)),
        "none": np.zeros((len(rows), 2)),
        "spread": probs,
    }[commit]
    acceptance = accept_greedy(tree, rows[:, 0].tolist())
    drafter.observe(Observation([1, 2, 3], np.array([2]), tree, rows, probs, acceptance, commit_probs))
    return drafter.acceptance.seen_coarse.copy(), drafter.acceptance.hits_coarse.copy()


@pytest.mark.parametrize(
    ("commit", "hits_vs_greedy"),
    [
        ("one-hot", 1.0),  # all mass on the argmax: the soft labels are the greedy labels
        ("none", 0.0),  # no candidate can be committed: nothing is right
        ("spread", 0.6),  # the argmax candidates count 0.6 each; the 0.4 token (9) was not offered
    ],
)
def test_sampling_labels_are_the_chance_the_target_commits_the_candidate(commit, hits_vs_greedy):
    seen, hits = _learnt(commit)
    greedy_seen, greedy_hits = _learnt("greedy")
    assert np.array_equal(seen, greedy_seen) and greedy_hits.sum() > 0
    assert np.allclose(hits, hits_vs_greedy * greedy_hits)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_decode_loop_hands_drafters_commit_probabilities_only_when_sampling(temperature):
    target = tiny("llama")
    drafter = Runtime(target).drafter("recap", budget=8)
    seen = []
    observe = drafter.observe
    drafter.observe = lambda observation: (seen.append(observation), observe(observation))
    sampling = SamplingSettings(temperature, seed=0)
    generate(target, drafter, "the cat is", [], 12, sampling=sampling)
    decoding = [o for o in seen if o.acceptance is not None]
    assert decoding and all(o.topk_ids is not None for o in decoding)
    if temperature == 0.0:  # greedy: labels stay "is the argmax"
        assert all(o.commit_probs is None for o in seen)
        return
    for observation in decoding:
        commit = observation.commit_probs
        assert commit.shape == observation.topk_ids.shape
        # The processed distribution is sharper than softmax at T = 1: the argmax gains.
        assert np.all(commit[:, 0] >= observation.topk_probs[:, 0] - 1e-6)
        assert np.all(commit.sum(1) <= 1 + 1e-9)


class _ChainDrafter:
    """Drafts the next ``width`` tokens of a known answer as one chain (every draft accepted)."""

    name, record_k = "chain", 0

    def __init__(self, answer: list[int], width: int) -> None:
        self.answer, self.width, self.prompt_len = answer, width, 0

    def begin(self, request) -> None:
        self.prompt_len = len(request.prompt_tokens)

    def propose(self, context) -> DraftTree:
        done = len(context) - self.prompt_len
        chain = self.answer[done : done + self.width]
        n = len(chain)
        return DraftTree(chain, list(range(-1, n - 1)), [1.0] * n, [("ctx3",)] * n, [{} for _ in chain])

    def observe(self, observation) -> None:
        del observation


def test_a_pass_cut_at_the_token_limit_keeps_one_draw_per_committed_token():
    # A pass that accepts 8 drafts and its bonus token, cut to the 5 tokens the limit leaves: the step
    # shows a draw for each of the 5, none for the tokens it did not commit.
    target = tiny("llama")
    sampling = SamplingSettings(temperature=1.0, seed=3)
    reference = generate(target, Runtime(target).drafter("ar"), "the cat is", [], 16, sampling=sampling)
    answer = [t for step in reference.steps for t in step.new_tokens]
    steps = generate(target, _ChainDrafter(answer, 8), "the cat is", [], 6, sampling=sampling).steps
    assert [t for step in steps for t in step.new_tokens] == answer[:6]
    assert steps[1].accepted_len == 5 and len(steps[1].new_tokens) == 5  # the limit cut the pass
    for step in steps[1:]:
        assert len(step.draws) == len(step.new_tokens)
        assert [d["token"] for d in step.draws] == list(step.new_tokens)

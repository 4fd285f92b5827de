"""`recap.vllm.cost`: the step cost learnt from engine steps and the batch-wide cut it sets."""

from __future__ import annotations

import numpy as np
import pytest

from recap.vllm.cost import LEAST_STEPS, LEAST_WEIGHT, OUTLIER, PassCost, StepCost, batch_lengths


def steps(rng, count, fixed, drafting, per_token, rows=8, noise=0.0):
    """``count`` verification steps of ``rows`` requests with 0-4 drafts each, timed on that cost."""
    for _ in range(count):
        drafts = int(rng.integers(0, 4 * rows + 1)) if rng.random() < 0.8 else 0
        seconds = fixed + (drafting if drafts else 0.0) + per_token * (rows + drafts)
        yield rows + drafts, drafts, seconds + rng.normal(0, noise)


def test_the_cost_is_read_from_steps_of_different_sizes_and_follows_a_change():
    cost, rng = PassCost(), np.random.default_rng(0)
    for _ in range(LEAST_STEPS - 1):
        cost.add(8, 0, 0.06)
    assert cost.fit() is None  # too few steps
    cost.add(8, 0, 0.06)
    assert cost.fit() is None  # as many steps as it needs, but every one of 8 tokens: no slope
    for step in steps(rng, 400, 0.05, 0.01, 0.002, noise=0.002):
        cost.add(*step)
    fixed, drafting, per_token = cost.fit()
    assert fixed == pytest.approx(0.05, abs=0.004) and drafting == pytest.approx(0.01, abs=0.004)
    assert per_token == pytest.approx(0.002, abs=0.0003)
    for step in steps(rng, 2000, 0.10, 0.02, 0.004):  # the machine got twice as slow: old steps forgotten
        cost.add(*step)
    assert cost.fit() == pytest.approx((0.10, 0.02, 0.004), rel=0.02)


def test_what_drafting_costs_is_read_only_beside_enough_steps_without_drafts():
    cost = PassCost()
    for tokens in [9, 12, 16, 20] * 8:  # every step verifies drafts
        cost.add(tokens, tokens - 8, 0.05 + 0.01 + 0.002 * tokens)
    fixed, drafting, per_token = cost.fit()
    assert drafting == 0 and fixed == pytest.approx(0.06) and per_token == pytest.approx(0.002)
    for _ in range(int(LEAST_WEIGHT) + 1):
        cost.add(8, 0, 0.05 + 0.002 * 8)
    assert cost.without_drafts() >= LEAST_WEIGHT
    assert cost.fit() == pytest.approx((0.05, 0.01, 0.002), rel=0.01)


def test_steps_that_are_not_steps_of_the_batch_are_left_out():
    cost = PassCost()
    for tokens in [4, 8, 12, 16] * 8:
        cost.add(tokens, tokens - 3, 0.05 + 0.01 * tokens)
    fit, count = cost.fit(), cost.steps
    for step in ((0, 0, 0.1), (8, 5, 0.0), (8, 5, -1.0), (8, 5, float("inf")), (8, 5, OUTLIER * 0.13 * 1.01)):
        cost.add(*step)
    assert cost.steps == count and cost.fit() == fit
    cost.add(8, 5, OUTLIER * 0.13 * 0.99)  # slow, but within reach of a busy machine
    assert cost.steps == count + 1


def test_a_fit_through_the_origin_keeps_a_positive_fixed_part():
    cost = PassCost(least=2)
    for tokens in (10, 20, 30, 40):
        cost.add(tokens, 2, 0.001 * tokens - 0.005)
    fixed, _, per_token = cost.fit()
    assert fixed > 0 and per_token > 0


def test_the_cut_sends_the_drafts_that_raise_tokens_per_second_or_none():
    chains = [np.array([0.9, 0.8, 0.5, 0.1])] * 4
    assert batch_lengths(chains, StepCost(0.060, 0.0, 0.003)) == [3, 3, 3, 3]
    assert batch_lengths(chains, StepCost(0.060, 0.0, 0.0)) == [4, 4, 4, 4]  # free drafts: chains whole
    assert batch_lengths(chains, StepCost(0.060, 0.0, 1.0)) == [0, 0, 0, 0]  # dearer than a pass: none
    assert batch_lengths(chains, StepCost(0.060, 0.2, 0.003)) == [0, 0, 0, 0]  # drafting dearer than gains
    assert batch_lengths(chains, StepCost(0.060, 0.02, 0.003)) == [3, 3, 3, 3]  # worth it all the same
    # A weak request gives way to strong ones; a chain whose estimate rises is read as a prefix.
    chains = [np.array([0.95, 0.9, 0.85]), np.array([0.2, 0.6, 0.6]), np.array([])]
    assert batch_lengths(chains, StepCost(0.05, 0.0, 0.01)) == [3, 0, 0]
    assert batch_lengths([], StepCost(0.05, 0.0, 0.01)) == []


@pytest.mark.parametrize("seed", range(20))
def test_the_cut_is_the_best_prefix_of_every_chain_on_small_batches(seed):
    rng = np.random.default_rng(seed)
    chains = [np.sort(rng.random(int(rng.integers(0, 4))))[::-1] for _ in range(3)]
    cost = StepCost(0.05, float(rng.choice([0.0, 0.01, 0.05])), float(rng.choice([0.001, 0.005, 0.02])))
    rows = len(chains)

    def rate(lengths):
        tokens = rows + sum(float(chain[:n].sum()) for chain, n in zip(chains, lengths))
        return tokens / cost.seconds(rows + sum(lengths), sum(lengths))

    best = max(rate((a, b, c)) for a in range(len(chains[0]) + 1) for b in range(len(chains[1]) + 1)
               for c in range(len(chains[2]) + 1))  # fmt: skip
    assert rate(batch_lengths(chains, cost)) == pytest.approx(best)

"""`recap.vllm.cost`: the pass-cost line learnt from engine steps and the batch-wide cut it sets."""

from __future__ import annotations

import numpy as np
import pytest

from recap.vllm.cost import LEAST_STEPS, OUTLIER, PassCost, batch_lengths


def test_the_line_is_read_from_steps_of_different_sizes_and_follows_a_change():
    cost = PassCost()
    rng = np.random.default_rng(0)
    for _ in range(LEAST_STEPS - 1):
        cost.add(8, 0.06)
    assert cost.line() is None  # too few steps
    cost.add(8, 0.06)
    assert cost.line() is None  # as many steps as it needs, but every one of 8 tokens: no slope
    for _ in range(400):
        tokens = int(rng.choice([8, 16, 24, 40]))
        cost.add(tokens, 0.05 + 0.002 * tokens + rng.normal(0, 0.002))
    fixed, per_token = cost.line()
    assert fixed == pytest.approx(0.05, abs=0.005) and per_token == pytest.approx(0.002, abs=0.0003)
    for _ in range(2000):  # the machine got twice as slow: old steps are forgotten
        tokens = int(rng.choice([8, 16, 24, 40]))
        cost.add(tokens, 0.10 + 0.004 * tokens)
    fixed, per_token = cost.line()
    assert fixed == pytest.approx(0.10, rel=0.02) and per_token == pytest.approx(0.004, rel=0.02)


def test_steps_that_are_not_steps_of_the_batch_are_left_out():
    cost = PassCost()
    for tokens in [4, 8, 12, 16] * 8:
        cost.add(tokens, 0.05 + 0.01 * tokens)
    line, steps = cost.line(), cost.steps
    for tokens, seconds in ((0, 0.1), (8, 0.0), (8, -1.0), (8, float("inf")), (8, OUTLIER * 0.13 * 1.01)):
        cost.add(tokens, seconds)
    assert cost.steps == steps and cost.line() == line
    cost.add(8, OUTLIER * 0.13 * 0.99)  # slow, but within reach of a busy machine
    assert cost.steps == steps + 1


def test_a_line_through_the_origin_keeps_a_positive_fixed_part():
    cost = PassCost(least=2)
    for tokens in (10, 20, 30, 40):
        cost.add(tokens, 0.001 * tokens - 0.005)
    fixed, per_token = cost.line()
    assert fixed > 0 and per_token > 0


def test_the_cut_sends_the_drafts_that_raise_tokens_per_second():
    chains = [np.array([0.9, 0.8, 0.5, 0.1])] * 4
    assert batch_lengths(chains, 0.060, 0.003) == [3, 3, 3, 3]
    assert batch_lengths(chains, 0.060, 0.0) == [4, 4, 4, 4]  # free drafts: every chain whole
    assert batch_lengths(chains, 0.060, 1.0) == [0, 0, 0, 0]  # drafts dearer than a pass: none
    # A weak request gives way to strong ones; a chain whose estimate rises is read as a prefix.
    chains = [np.array([0.95, 0.9, 0.85]), np.array([0.2, 0.6, 0.6]), np.array([])]
    assert batch_lengths(chains, 0.05, 0.01) == [3, 0, 0]
    assert batch_lengths([], 0.05, 0.01) == []


@pytest.mark.parametrize("seed", range(20))
def test_the_cut_is_the_best_prefix_of_every_chain_on_small_batches(seed):
    rng = np.random.default_rng(seed)
    chains = [np.sort(rng.random(int(rng.integers(0, 4))))[::-1] for _ in range(3)]
    fixed, per_token = 0.05, float(rng.choice([0.001, 0.005, 0.02]))
    rows = len(chains)

    def rate(lengths):
        tokens = rows + sum(float(chain[:n].sum()) for chain, n in zip(chains, lengths))
        return tokens / (fixed + per_token * (rows + sum(lengths)))

    best = max(rate((a, b, c)) for a in range(len(chains[0]) + 1) for b in range(len(chains[1]) + 1)
               for c in range(len(chains[2]) + 1))  # fmt: skip
    assert rate(batch_lengths(chains, fixed, per_token)) == pytest.approx(best)

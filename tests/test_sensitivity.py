"""The image-sensitivity split, on hand-checked cases."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from conftest import images_for, noise_image, reference_greedy, tiny

from recap.bench.sensitivity import acceptance_split, mark_steps, sensitive_flags, split_against_reference
from recap.trace import StepRecord


@pytest.mark.parametrize(
    ("sources", "flags", "expected"),
    [
        # the first token (prefill) is never counted; ctx2 at a sensitive position, ctx3 at an insensitive one
        (["target", "ctx2", "ctx3"], [False, True, False], (1, 1, 1, 1)),
        # bonus tokens are not drafted
        (["target", "target", "persistent", "target"], [True, True, False, False], (0, 1, 1, 2)),
        # nothing sensitive: the sensitive rate is undefined
        (["target", "suffix"], [False, False], (0, 0, 1, 1)),
    ],
)
def test_acceptance_split_counts(sources, flags, expected):
    split = acceptance_split(sources, flags)
    # (sensitive drafted, sensitive total, insensitive drafted, insensitive total), in field order
    assert astuple(split) == expected


def test_rates_and_sum():
    a = acceptance_split(["target", "ctx2", "target"], [False, True, True])
    assert a.sensitive_rate == 0.5 and a.insensitive_rate is None
    total = a + acceptance_split(["target", "ctx3"], [True, False])
    assert (total.insensitive_drafted, total.insensitive_total) == (1, 1)


def test_mark_steps_slices_flags_per_step():
    steps = [StepRecord(0, 3, "ar", new_tokens=[1]), StepRecord(1, 4, "ar", new_tokens=[2, 3, 4])]
    mark_steps(steps, [True, False, True, False])
    assert steps[0].image_sensitive == [True] and steps[1].image_sensitive == [False, True, False]


def test_same_image_is_never_sensitive():
    target = tiny("llava")
    images = images_for(target)
    answer = reference_greedy(target, "the cat is", images, 10)
    assert sensitive_flags(target, images, "the cat is", answer) == [False] * len(answer)
    assert len(sensitive_flags(target, [noise_image(9)], "the cat is", answer)) == len(answer)


@pytest.mark.parametrize(
    ("tokens", "sources", "expected"),
    [
        # agrees with the reference: every position but the first counts
        ([5, 8, 2], ["target", "ctx2", "ctx3"], (1, 1, 1, 1)),
        # differs at the third token: that position is not the reference's, so it is left out
        ([5, 8, 3], ["target", "ctx2", "ctx3"], (1, 1, 0, 0)),
        # longer than the reference: clipped to it
        ([5, 8, 2, 9], ["target", "target", "ctx3", "ctx3"], (0, 1, 1, 1)),
    ],
)
def test_split_against_reference_counts_only_where_the_outputs_agree(tokens, sources, expected):
    split = split_against_reference(tokens, sources, [5, 8, 2], [False, True, False])
    # (sensitive drafted, sensitive total, insensitive drafted, insensitive total), in field order
    assert astuple(split) == expected

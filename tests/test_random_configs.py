"""Lossless across configurations: random configurations of every family, drawn from fixed seeds.

For each (family, seed) `random_models.random_case` draws a model (layers, heads, kv heads, head_dim,
rope theta and scaling, sliding windows shorter than the context in the family's own style, vision
input sizes, several odd-sized images per request) and two requests. Every drafter must reproduce
transformers' greedy ``generate()`` token for token in fp32 on both requests (the second drafts from
memories the first filled); for a sample, every tree node's logits must equal an ordinary forward over
the node's path. The seeds beyond the first ones are marked ``slow`` (they still run in CI).
"""

from __future__ import annotations

import functools

import pytest
from conftest import check_tree_logits, reference_greedy
from random_models import FAMILIES, Case, random_case
from tiny_models import VISION_ARCHITECTURES, build

from recap.decode import generate
from recap.drafters import METHODS
from recap.drafters.token_recycling import SuccessorMatrix
from recap.memory.persistent import PersistentMemory
from recap.runtime import Runtime
from recap.state import DrafterState

FAST_SEEDS = (0, 1)
SLOW_SEEDS = (2, 3, 4)
#: Families whose draws include sliding windows (in their own config style).
WINDOWED = ("qwen2", "gemma3_text", "mistral", "phi3", "gemma2", "qwen3", "smollm3", "qwen2_vl", "qwen2_5_vl")


def _cases(seeds: tuple[int, ...], slow: bool) -> list:
    marks = [pytest.mark.slow] if slow else []
    return [pytest.param(arch, seed, marks=marks, id=f"{arch}-{seed}") for arch in FAMILIES for seed in seeds]


@functools.cache
def _case(arch: str, seed: int) -> tuple[Case, Runtime]:
    case = random_case(arch, seed)
    return case, Runtime(build(arch, seed=seed, draw=case.draw))


def _context_length(target, request) -> int:
    return int(target.prepare(request.images, request.prompt)["input_ids"].shape[1])


@pytest.mark.parametrize(("arch", "seed"), _cases(FAST_SEEDS, False) + _cases(SLOW_SEEDS, True))
def test_every_drafter_equals_generate(arch, seed):
    case, runtime = _case(arch, seed)
    target = runtime.target
    truths = [reference_greedy(target, r.prompt, r.images, r.max_new_tokens) for r in case.requests]
    mismatches = []
    for method in METHODS:
        # Fresh shared state per method, carried across the two requests.
        persistent, successors = PersistentMemory(target.vocab_size), SuccessorMatrix(target.vocab_size)
        for index, (request, truth) in enumerate(zip(case.requests, truths)):
            drafter = runtime.drafter(
                method, state=DrafterState.given(runtime.target.vocab_size, persistent, successors)
            )
            tokens = generate(target, drafter, request.prompt, request.images, request.max_new_tokens).tokens
            if tokens != truth:
                first = next((i for i, (a, b) in enumerate(zip(tokens, truth)) if a != b), len(truth))
                mismatches.append(f"{method} request {index}: first difference at token {first}")
    assert not mismatches, f"{case.describe()}\n" + "\n".join(mismatches)


@pytest.mark.parametrize(("arch", "seed"), _cases(FAST_SEEDS[:1], False) + _cases(FAST_SEEDS[1:], True))
def test_tree_node_logits_equal_sequential_decoding(arch, seed):
    case, runtime = _case(arch, seed)
    request = case.requests[0]
    check_tree_logits(runtime.target, request.prompt, request.images)


def test_the_draws_cover_what_they_promise():
    # The suite is only as good as its draws: windows shorter than the context in every windowed
    # family, text backbones with windows inside LLaVA, requests with several images and with none.
    seeds = FAST_SEEDS + SLOW_SEEDS
    windows: dict[str, list[int]] = {}
    for arch in FAMILIES:
        for seed in seeds:
            case, runtime = _case(arch, seed)
            window = runtime.target.attention.window
            if window is not None:
                windows.setdefault(arch, []).append(window)
                assert all(_context_length(runtime.target, r) > window for r in case.requests)
    assert set(WINDOWED) <= set(windows), sorted(set(WINDOWED) - set(windows))
    assert any(_case("llava", s)[0].draw.backbone == "mistral" for s in seeds)
    image_counts = {
        len(r.images) for arch in VISION_ARCHITECTURES for s in seeds for r in _case(arch, s)[0].requests
    }
    assert {0, 2, 3} <= image_counts
    # The drafters really draft: the recap runs propose trees (it is not AR in disguise).
    case, runtime = _case("mistral", 0)
    request = case.requests[1]
    drafter = runtime.drafter(
        "recap",
        state=DrafterState.given(runtime.target.vocab_size, PersistentMemory(runtime.target.vocab_size)),
    )
    steps = generate(runtime.target, drafter, request.prompt, request.images, request.max_new_tokens).steps
    assert sum(len(s.nodes) for s in steps) > 0

"""Lossless for every drafter on every architecture: fp32 output equals transformers' greedy generate().

Each case runs two requests in a row (different prompts, and different images for vision models), so
the second one drafts from memories the first one filled (persistent memory, TR's matrix).
"""

from __future__ import annotations

import functools

import pytest
from conftest import noise_image, reference_greedy, tiny
from tiny_models import ARCHITECTURES

from recap.decode import generate
from recap.drafters import METHODS
from recap.drafters.token_recycling import SuccessorMatrix
from recap.memory import PersistentMemory
from recap.runtime import Runtime

REQUESTS = [("the cat is black and the dog is", 0), ("describe the image. what colour is the square?", 1)]


@functools.cache
def runtime(arch: str) -> Runtime:
    return Runtime(tiny(arch))


@functools.cache
def truth(arch: str, prompt: str, seed: int) -> tuple[int, ...]:
    target = tiny(arch)
    images = [] if target.family == "text" else [noise_image(seed)]
    return tuple(reference_greedy(target, prompt, images, 32))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_drafter_is_lossless(arch, method):
    rt = runtime(arch)
    vocab = rt.target.vocab_size
    # Fresh shared state per case, carried across the two requests.
    persistent, successors = PersistentMemory(vocab), SuccessorMatrix(vocab)
    for prompt, seed in REQUESTS:
        images = [] if rt.target.family == "text" else [noise_image(seed)]
        drafter = rt.drafter(method, persistent=persistent, successors=successors)
        result = generate(rt.target, drafter, prompt, images, 32)
        assert tuple(result.tokens) == truth(arch, prompt, seed), (arch, method, prompt)

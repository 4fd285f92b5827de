"""Shared fixtures: tiny models of every architecture (cached per session), images, the oracle drafter."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)  # faster than 2 threads on this shared 2-core machine, and deterministic

from tiny_models import build  # noqa: E402


@functools.cache
def tiny(arch: str, attn: str = "sdpa"):
    """A cached tiny model (building one costs ~0.1 s; tests must not mutate it)."""
    return build(arch, attn)


def noise_image(seed: int, size: tuple[int, int] = (40, 52)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def images_for(target, seed: int = 0) -> list[Image.Image]:
    return [] if target.family == "text" else [noise_image(seed)]


def reference_greedy(target, prompt: str, images, max_new_tokens: int, eos_ids=None) -> list[int]:
    """transformers' own greedy decoding: the ground truth every drafter must reproduce."""
    inputs = target.prepare(images, prompt)
    eos = sorted(eos_ids if eos_ids is not None else target.eos_ids)
    with torch.inference_mode():
        out = target.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
            min_new_tokens=0,
        )
    return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture
def tiny_model():
    return tiny

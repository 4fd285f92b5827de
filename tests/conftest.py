"""Shared helpers: tiny models of every architecture (cached per session), images, transformers' greedy
reference, and the tree-logits check (every node against an ordinary forward over its path)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sys
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)  # faster than 2 threads on this shared 2-core machine, and deterministic

from tiny_models import build  # noqa: E402

from recap.tree import DraftTree  # noqa: E402


@functools.cache
def tiny(arch: str, attn: str = "sdpa"):
    """A cached tiny model (building one costs ~0.1 s; tests must not mutate it)."""
    return build(arch, attn)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a test's own studio server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def hard_timeout(seconds: int):
    """Raise ``TimeoutError`` in the main thread if the body runs over ``seconds`` (a hang fails the test
    instead of stalling the suite); for a test file's autouse fixture."""

    def expired(signum, frame):
        raise TimeoutError(f"hard timeout: the test ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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


def random_tree(
    rng: np.random.Generator,
    vocab: int,
    size: int,
    max_children: int = 3,
    exclude: frozenset[int] = frozenset(),
) -> DraftTree:
    """A random tree of ``size`` nodes (random parents, random tokens not in ``exclude``, unique siblings)."""
    tree = DraftTree()
    while len(tree) < size:
        parent = int(rng.integers(-1, len(tree))) if len(tree) else -1
        token = int(rng.integers(0, vocab))
        if len(tree.children(parent)) < max_children and token not in exclude:
            tree.add(token, parent)
    return tree


def full_forward_last_logits(target, prompt: str, images, continuation: Sequence[int]) -> torch.Tensor:
    """Logits after ``prompt + continuation`` by one ordinary forward without any cache or tree."""
    inputs = target.prepare(images, prompt)
    extra = torch.tensor([list(continuation)], dtype=torch.long, device=inputs["input_ids"].device)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
    for key in ("attention_mask", "mm_token_type_ids"):
        if key in inputs:
            inputs[key] = torch.cat([inputs[key], torch.full_like(extra, int(key == "attention_mask"))], 1)
    with torch.inference_mode():
        return target.model(**inputs).logits[0, -1].float()


def check_tree_logits(target, prompt: str, images, atol: float = 1e-4) -> None:
    """Every node of three random trees (with commits of random paths in between) has the logits of a
    plain full forward over its path; so does the root (the last pending token)."""
    rng = np.random.default_rng(len(prompt))
    inputs = target.prepare(images, prompt)
    state, logits = target.prefill(inputs, [inputs["input_ids"].shape[1] - 1])
    committed = [int(logits[-1].argmax())]
    pending = [committed[0]]
    # Three rounds: verify a random tree, check every node, then commit a random path of it so the
    # next round runs after a gather + crop of the cache.
    for size in (9, 16, 5):
        # Image placeholder tokens are left out: the reference forward would look for their images.
        tree = random_tree(rng, target.vocab_size, size, exclude=target.excluded_ids)
        tree_logits = target.forward_tree(state, pending, tree).float()
        for node in range(len(tree)):
            expected = full_forward_last_logits(target, prompt, images, committed + tree.path(node))
            assert torch.allclose(tree_logits[len(pending) + node], expected, atol=atol), (target.name, node)
        root = full_forward_last_logits(target, prompt, images, committed)
        assert torch.allclose(tree_logits[len(pending) - 1], root, atol=atol)
        leaf = int(rng.integers(0, len(tree)))
        accepted = tree.path_nodes(leaf)
        target.commit(state, len(tree), accepted)
        bonus = int(rng.choice(sorted(set(range(target.vocab_size)) - target.excluded_ids)))
        committed += [*tree.path(leaf), bonus]
        pending = [bonus]


@pytest.fixture
def tiny_model():
    return tiny


#: v2's tree-cost curve (T nodes, ms a pass) recorded on an idle 2-core CPU
#: (docs/results/v2-scenes2-auto/results.json, ``settings.cost_curve_ms.measured``).
IDLE_CPU_CURVE_MS = (
    (1, 2.063), (2, 2.167), (3, 2.185), (4, 1.947), (6, 2.31), (8, 2.355), (12, 2.8), (16, 2.986),
    (24, 3.894), (32, 4.588), (48, 6.181), (64, 7.584),
)  # fmt: skip


@pytest.fixture
def idle_cost_curve(monkeypatch):
    """Every runtime's tree-cost curve is `IDLE_CPU_CURVE_MS` instead of one measured now.

    The auto budget sizes trees from the device's measured curve, and a curve measured beside other
    CPU-bound work can say that no node pays for itself, so a first click would draft nothing. Tests of
    the page and the drafter (not of the machine's load) pin the idle curve with this fixture."""
    from recap.models.cost import CostModel
    from recap.runtime import Runtime

    curve = CostModel((t, ms / 1e3) for t, ms in IDLE_CPU_CURVE_MS)
    monkeypatch.setattr(Runtime, "cost_model", lambda self: curve)
    return curve

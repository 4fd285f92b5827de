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
from recap.memory.persistent import PersistentMemory
from recap.runtime import Runtime
from recap.state import DrafterState

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
        drafter = rt.drafter(method, state=DrafterState.given(rt.target.vocab_size, persistent, successors))
        result = generate(rt.target, drafter, prompt, images, 32)
        assert tuple(result.tokens) == truth(arch, prompt, seed), (arch, method, prompt)


@pytest.mark.parametrize("method", ["ar", "pld", "tr", "recap"])
@pytest.mark.parametrize("arch", ["mistral", "phi3"])
def test_sliding_window_without_layer_types(arch, method):
    # Issue 10's reproducer: windows of 8 tokens declared only by config.sliding_window; 40 new
    # tokens run far past the window, so a tree mask without it changes the output.
    rt = runtime(arch)
    assert rt.target.attention.window == 8 and rt.target.attention.layer_types is None
    prompt = "the cat sat on the mat and looked at the dog"
    expected = reference_greedy(rt.target, prompt, [], 40)
    result = generate(
        rt.target,
        rt.drafter(
            method, state=DrafterState.given(rt.target.vocab_size, PersistentMemory(rt.target.vocab_size))
        ),
        prompt,
        [],
        40,
    )
    assert result.tokens == expected


@pytest.mark.parametrize("method", ["ar", "recap"])
@pytest.mark.parametrize(("arch", "prompt"), [("llama", "def f(x):\n"), ("llava", "the cat is\n")])
def test_prompt_is_used_exactly_as_given(arch, prompt, method):
    # A prompt ending in a newline (code prompts do) must give generate()'s output on that exact text;
    # for these cases the stripped text gives another one, so stripping would fail here.
    rt = runtime(arch)
    images = [] if rt.target.family == "text" else [noise_image(0)]
    expected = reference_greedy(rt.target, prompt, images, 16)
    assert expected != reference_greedy(rt.target, prompt.strip(), images, 16)
    drafter = rt.drafter(
        method, state=DrafterState.given(rt.target.vocab_size, PersistentMemory(rt.target.vocab_size))
    )
    assert generate(rt.target, drafter, prompt, images, 16).tokens == expected


@functools.cache
def saved(arch: str, folder: str) -> str:
    target = tiny(arch)
    target.model.save_pretrained(folder)
    target.processor.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "placement",
    [
        {"device_map": "auto"},  # one device: accelerate places everything on it
        # Offloaded: weights live on disk and accelerate's hooks bring them in for every pass.
        {"device_map": "auto", "max_memory": {"cpu": "100KB"}, "offload": True},
    ],
    ids=["auto", "auto-disk-offload"],
)
@pytest.mark.parametrize("arch", ["llava", "mistral"])
def test_device_map_auto_is_lossless(arch, placement, tmp_path_factory):
    from conftest import check_tree_logits

    from recap.models import TargetModel

    folder = saved(arch, str(tmp_path_factory.mktemp(arch)))
    options = {k: v for k, v in placement.items() if k != "offload"}
    if placement.get("offload"):
        options["offload_folder"] = str(tmp_path_factory.mktemp("offload"))
    target = TargetModel.load(folder, dtype="float32", **options)
    offloaded = "disk" in getattr(target.model, "hf_device_map", {}).values()
    assert offloaded == bool(placement.get("offload"))
    if offloaded and arch == "llava":  # its embedding went to disk: inputs go where accelerate runs it
        assert target.model.get_input_embeddings().weight.device.type == "meta"
    assert target.device.type == "cpu"
    images = [] if target.family == "text" else [noise_image(0)]
    prompt = "the cat sat on the mat and looked at the dog"
    expected = reference_greedy(tiny(arch), prompt, images, 32)
    rt = Runtime(target)
    for method in ("ar", "pld", "tr", "recap"):
        drafter = rt.drafter(
            method, state=DrafterState.given(target.vocab_size, PersistentMemory(target.vocab_size))
        )
        assert generate(target, drafter, prompt, images, 32).tokens == expected, method
    check_tree_logits(target, prompt, images)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device_map": "balanced"}, "device_map must be 'auto'"),
        ({"device_map": "auto", "device": "cpu"}, "either a device or device_map"),
    ],
)
def test_device_map_refuses_what_it_does_not_support(options, message, tmp_path):
    from recap.models import TargetModel

    with pytest.raises(ValueError, match=message):
        TargetModel.load(str(tmp_path), **options)

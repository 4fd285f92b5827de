"""GPU twins of the CPU invariants (skipped without CUDA): the same code on a CUDA device.

CPU twins: `test_decode.py::test_tree_logits_match_sequential_decoding`,
`test_lossless.py::test_every_drafter_is_lossless` and the embedded-model lossless tests run the same
checks on the CPU. Run them with ``python -m pytest -m gpu`` on a machine with CUDA.
"""

from __future__ import annotations

import pytest
import torch
from conftest import images_for, reference_greedy
from test_decode import PROMPTS, check_tree_logits
from tiny_models import ARCHITECTURES, VISION_ARCHITECTURES, build

from recap.decode import generate
from recap.drafters import METHODS
from recap.models import TargetModel
from recap.runtime import EMBEDDED_MODEL_V1, Runtime

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def on_cuda(arch: str, dtype: torch.dtype):
    target = build(arch)
    target.model.to(device="cuda", dtype=dtype)
    target.device, target.dtype = torch.device("cuda"), dtype
    return target


@pytest.mark.parametrize("arch", VISION_ARCHITECTURES)
@pytest.mark.parametrize("method", ["ar", "pld", "tr", "recap"])
def test_lossless_fp32_on_cuda(arch, method):
    target = on_cuda(arch, torch.float32)
    images = images_for(target)
    truth = reference_greedy(target, "the cat is", images, 32)
    result = generate(target, Runtime(target).drafter(method), "the cat is", images, 32)
    assert result.tokens == truth


@pytest.mark.parametrize("arch", ["llava", "qwen2_5_vl"])
def test_bf16_match_rate_is_high(arch):
    # bf16 kernels for T tokens and 1 token round differently: a few argmax flips are expected.
    target = on_cuda(arch, torch.bfloat16)
    images = images_for(target)
    truth = reference_greedy(target, "the cat is", images, 48)
    tokens = generate(target, Runtime(target).drafter("recap"), "the cat is", images, 48).tokens
    first_difference = next((i for i, (a, b) in enumerate(zip(tokens, truth)) if a != b), len(truth))
    assert first_difference >= 8


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tree_logits_match_sequential_decoding_on_cuda(arch):
    target = on_cuda(arch, torch.float32)
    check_tree_logits(target, PROMPTS["long"], images_for(target), atol=1e-4)


@pytest.fixture(scope="module")
def embedded_on_cuda():
    return TargetModel.load(str(EMBEDDED_MODEL_V1), device="cuda", dtype="float32")  # v1, on v1's scenes


@pytest.mark.parametrize("method", METHODS)
def test_embedded_model_is_lossless_on_cuda(embedded_on_cuda, method):
    from recap.drafters.suffix_decoding import suffix_decoding_available
    from recap.embedded import scenes

    if method == "suffix" and not suffix_decoding_available():
        pytest.skip("arctic-inference is not installed (the GPU machine has no registry to build it)")

    target = embedded_on_cuda
    runtime = Runtime(target)
    for seed in range(3):  # a few requests in a row: memories carry over between them
        item = scenes.heldout_set(seed=seed, n_per_type=1)[seed]
        truth = reference_greedy(target, item["prompt"], [item["image"]], 48)
        result = generate(target, runtime.drafter(method), item["prompt"], [item["image"]], 48)
        assert result.tokens == truth, (method, seed)

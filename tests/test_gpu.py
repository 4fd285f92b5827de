"""GPU twins of the CPU invariants (skipped without CUDA): the same code on a CUDA device.

CPU twins: `test_engine.py::test_tree_logits_match_sequential_decoding` and
`test_lossless.py::test_every_drafter_is_lossless` run the same checks on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from conftest import images_for, reference_greedy
from tiny_models import VISION_ARCHITECTURES, build

from recap.decode import generate
from recap.runtime import Runtime

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

"""The decode loop's cache (`recap.models.kv_cache`) and the direct decoder pass (`Family.direct_decoder`):
both must give exactly what transformers' own `DynamicCache` and model forward give."""

from __future__ import annotations

import pytest
import torch
from conftest import images_for, tiny
from tiny_models import ARCHITECTURES
from transformers import DynamicCache

from recap.models.families import FAMILIES
from recap.models.kv_cache import SPARE, GrowingCache
from recap.tree import DraftTree

HEADS, HEAD_DIM = 2, 4

# Each case: a sequence of operations on a one-layer cache: ("update", T new entries) or ("crop", -n).
CASES = {
    "one pass": [("update", 5)],
    "token by token": [("update", 3)] + [("update", 1)] * 6,
    "tree passes with crops": [("update", 4), ("update", 7), ("crop", -5), ("update", 3), ("crop", -1)],
    "grows past its spare room": [("update", 10), ("update", SPARE - 3), ("update", 9), ("update", 1)],
    "grows twice": [("update", 2), ("update", SPARE + 1), ("update", 2 * SPARE + 8)],
    "crop to nothing, then refill": [("update", 6), ("crop", -6), ("update", 2)],
    "crop of zero": [("update", 3), ("crop", 0), ("update", 1)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_growing_cache_holds_what_a_dynamic_cache_holds(case):
    generator = torch.Generator().manual_seed(len(case))
    growing, dynamic = GrowingCache(), DynamicCache()
    for op, count in CASES[case]:
        if op == "update":
            keys, values = (torch.randn(1, HEADS, count, HEAD_DIM, generator=generator) for _ in range(2))
            got = growing.update(keys, values, 0)
            want = dynamic.update(keys, values, 0)
            assert all(torch.equal(g, w) for g, w in zip(got, want))
        else:
            growing.crop(count)
            dynamic.crop(count)
        assert growing.get_seq_length() == dynamic.get_seq_length()
        assert torch.equal(growing.layers[0].keys, dynamic.layers[0].keys)
        assert torch.equal(growing.layers[0].values, dynamic.layers[0].values)


def test_growing_cache_refuses_a_positive_crop_and_beam_reordering():
    cache = GrowingCache()
    cache.update(torch.zeros(1, HEADS, 3, HEAD_DIM), torch.zeros(1, HEADS, 3, HEAD_DIM), 0)
    with pytest.raises(ValueError, match="negative"):
        cache.crop(2)
    with pytest.raises(NotImplementedError):
        cache.layers[0].batch_select_indices(torch.tensor([0]))


def test_writes_into_the_views_land_in_the_cache():
    """`TargetModel.commit` moves accepted entries by writing into ``keys`` / ``values`` in place."""
    cache = GrowingCache()
    keys = torch.arange(4.0).reshape(1, 1, 4, 1)
    cache.update(keys, keys.clone(), 0)
    layer = cache.layers[0]
    layer.keys[:, :, 1:2] = layer.keys.index_select(2, torch.tensor([3]))
    cache.crop(-2)
    cache.update(torch.full((1, 1, 1, 1), 9.0), torch.full((1, 1, 1, 1), 9.0), 0)
    assert layer.keys.flatten().tolist() == [0.0, 3.0, 9.0]


# Which families may skip the wrapper: LLaVA's logits are lm_head(decoder(embed(ids))); Gemma2/3 soft-cap,
# mRoPE and Idefics3 wrappers are left alone.
DIRECT = {
    "llava": True,
    "llava_next": True,
    "qwen2_vl": False,
    "idefics3": False,
    "gemma2": False,
    "llama": False,
}


@pytest.mark.parametrize("model_type", list(DIRECT))
def test_direct_decoder_families(model_type):
    assert FAMILIES[model_type].direct_decoder is DIRECT[model_type]


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if FAMILIES[a].direct_decoder])
def test_direct_decoder_pass_equals_the_model_forward(arch, monkeypatch):
    """A decode pass straight through the decoder gives bit for bit the logits of the same pass through
    the model's forward, for a plain step and for a tree, and leaves the same cache."""
    target = tiny(arch)
    assert target._decoder is not None
    inputs = target.prepare(images_for(target), "describe the image. what colour is the square?")
    last = [inputs["input_ids"].shape[1] - 1]
    for tree in (DraftTree(), DraftTree([5, 9, 7], [-1, 0, -1])):
        direct, logits = target.prefill(inputs, last)
        through_model, _ = target.prefill(inputs, last)
        pending = [int(logits[-1].argmax())]
        got = target.forward_tree(direct, pending, tree)
        with monkeypatch.context() as patch:
            patch.setattr(target, "_decoder", None)  # the model's own forward
            want = target.forward_tree(through_model, pending, tree)
        assert torch.equal(got, want), (arch, len(tree))
        for mine, theirs in zip(direct.cache.layers, through_model.cache.layers):
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)

"""training.grow: a grown embedded model computes what the original did, and its new parts learn."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForImageTextToText

from recap.runtime import EMBEDDED_MODEL_V2
from training import grow


@pytest.fixture(scope="module")
def original():
    return AutoModelForImageTextToText.from_pretrained(EMBEDDED_MODEL_V2).eval()


def _inputs(model, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    image_token = config.image_token_id
    side = config.vision_config.image_size
    patches = (side // config.vision_config.patch_size) ** 2
    text = torch.randint(3, 200, (1, 12), generator=generator)
    ids = torch.cat([text[:, :2], torch.full((1, patches), image_token), text[:, 2:]], dim=1)
    pixels = torch.rand((1, 3, side, side), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


@pytest.mark.parametrize(
    "options",
    [
        {"heads": 8},
        {"heads": 8, "share_kv": True},
        {"mlp": 704},
        {"new": 1, "at": 2},
        {"new": 2, "at": 4},
        {"new": 1, "at": 0, "mlp": 672},
    ],
    ids=["heads", "query-heads", "mlp", "layer-inside", "layers-appended", "layer-and-mlp"],
)
def test_the_grown_model_gives_the_original_logits(original, tmp_path, options):
    out = grow.grow(EMBEDDED_MODEL_V2, tmp_path / "grown", **options)
    grown = AutoModelForImageTextToText.from_pretrained(out).eval()
    text = json.loads((out / grow.CONFIG).read_text())["text_config"]
    assert text["num_hidden_layers"] == 4 + options.get("new", 0)
    assert text["num_attention_heads"] == options.get("heads", 4)
    assert text["num_key_value_heads"] == (4 if options.get("share_kv") else options.get("heads", 4))
    assert text["intermediate_size"] == options.get("mlp", 640)
    assert sum(p.numel() for p in grown.parameters()) > sum(p.numel() for p in original.parameters())
    inputs = _inputs(original)
    with torch.no_grad():
        ours, theirs = grown(**inputs).logits, original(**inputs).logits
    # Zero weights add exact zeros, but a longer sum (a wider projection) rounds in another order.
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_the_new_parts_get_gradients(tmp_path):
    out = grow.grow(EMBEDDED_MODEL_V2, tmp_path / "grown", heads=8, mlp=672, new=1, at=4)
    model = AutoModelForImageTextToText.from_pretrained(out)
    inputs = _inputs(model, seed=1)
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    layers = model.model.language_model.layers
    assert layers[4].self_attn.o_proj.weight.grad.abs().sum() > 0  # the new layer's zero output weights
    assert layers[4].mlp.down_proj.weight.grad.abs().sum() > 0
    assert layers[0].self_attn.o_proj.weight.grad[:, 256:].abs().sum() > 0  # the new heads' columns
    assert layers[0].mlp.down_proj.weight.grad[:, 640:].abs().sum() > 0  # the new units' columns


def test_query_heads_keep_the_key_value_projections_and_sit_after_their_head(tmp_path):
    out = grow.grow(EMBEDDED_MODEL_V2, tmp_path / "grown", heads=8, share_kv=True)
    before = AutoModelForImageTextToText.from_pretrained(EMBEDDED_MODEL_V2).model.language_model.layers[1]
    after = AutoModelForImageTextToText.from_pretrained(out).model.language_model.layers[1].self_attn
    assert torch.equal(after.k_proj.weight, before.self_attn.k_proj.weight)
    assert torch.equal(after.v_proj.weight, before.self_attn.v_proj.weight)
    old_q, new_q = before.self_attn.q_proj.weight.chunk(4), after.q_proj.weight.chunk(8)
    old_o, new_o = before.self_attn.o_proj.weight.T.chunk(4), after.o_proj.weight.T.chunk(8)
    for head in range(4):  # head h at 2h (its key/value head is 2h // 2), its new query head at 2h + 1
        assert torch.equal(new_q[2 * head], old_q[head]) and torch.equal(new_o[2 * head], old_o[head])
        assert not torch.equal(new_q[2 * head + 1], old_q[head]) and not new_o[2 * head + 1].any()
    with pytest.raises(ValueError, match="multiple of 4"):
        grow.widen_weights({}, heads=4, new_heads=2, mlp=640, new_mlp=0, share_kv=True)


def test_what_cannot_grow_is_refused(tmp_path):
    with pytest.raises(ValueError, match="nothing to grow"):
        grow.grow(EMBEDDED_MODEL_V2, tmp_path / "a")
    with pytest.raises(ValueError, match="only grow"):
        grow.grow(EMBEDDED_MODEL_V2, tmp_path / "b", mlp=512)
    with pytest.raises(ValueError, match=r"--at must be within \[0, 4\]"):
        grow.grow(EMBEDDED_MODEL_V2, tmp_path / "c", new=1, at=7)
    with pytest.raises(FileNotFoundError):
        grow.grow(tmp_path, tmp_path / "d", heads=8)
    with pytest.raises(SystemExit):  # the CLI says what is wrong instead of a traceback
        grow.main(["--model", str(EMBEDDED_MODEL_V2), "--out", str(tmp_path / "e")])
    assert not (tmp_path / "a").exists() and not (tmp_path / "e").exists()

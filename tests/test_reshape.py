"""training.reshape: split heads keep rotary pairs and the values' layout; pruning drops the unused units."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageTextToText

from recap.runtime import EMBEDDED_MODEL_V2
from tests.test_grow import _inputs
from training import grow, reshape
from training.soup import WEIGHTS


@pytest.fixture(scope="module")
def original():
    return AutoModelForImageTextToText.from_pretrained(EMBEDDED_MODEL_V2).eval()


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("factor", [2, 4])
def test_split_order_deals_whole_rotary_pairs_to_each_new_head(factor):
    heads, head_dim = 3, 16
    order = reshape.split_order(heads, head_dim, factor)
    assert sorted(order) == list(range(heads * head_dim))  # every row once
    small, half = head_dim // factor, head_dim // 2
    for new in range(heads * factor):
        rows = order[new * small : (new + 1) * small]
        assert {row // head_dim for row in rows} == {new // factor}  # from one old head
        for j in range(small // 2):  # the new pair (j, j + small/2) is an old pair (i, i + half)
            assert rows[j + small // 2] - rows[j] == half
            assert rows[j] % head_dim == new % factor + factor * j  # frequency r + F*j of the old head


def test_split_order_refuses_a_split_that_breaks_rotary_pairs():
    with pytest.raises(ValueError, match="cannot be split 3 ways"):
        reshape.split_order(4, 64, 3)


def test_split_heads_keep_the_values_layout(original, tmp_path):
    # With zero queries every head attends uniformly, whatever its keys: then the split model must give
    # the original's logits exactly when values and output columns moved together.
    source = Path(shutil.copytree(EMBEDDED_MODEL_V2, tmp_path / "flat"))
    weights = load_file(str(source / WEIGHTS))
    for name in weights:
        if "language_model" in name and name.endswith("self_attn.q_proj.weight"):
            weights[name] = torch.zeros_like(weights[name])
    save_file(weights, str(source / WEIGHTS), metadata={"format": "pt"})
    out = reshape.reshape(source, tmp_path / "split", split=2)
    text = json.loads((out / grow.CONFIG).read_text())["text_config"]
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (8, 8, 32)
    flat = AutoModelForImageTextToText.from_pretrained(source).eval()
    split = AutoModelForImageTextToText.from_pretrained(out).eval()
    inputs = _inputs(original)
    torch.testing.assert_close(_logits(split, inputs), _logits(flat, inputs), rtol=1e-5, atol=1e-5)
    # ... and real queries do change it (the split is not a no-op, hence the fine-tune).
    real = AutoModelForImageTextToText.from_pretrained(reshape.reshape(EMBEDDED_MODEL_V2, tmp_path / "s2", 2))
    assert not torch.allclose(_logits(real.eval(), inputs), _logits(original, inputs), atol=1e-3)


def test_pruning_drops_the_units_growth_added_first(original, tmp_path):
    grown = grow.grow(EMBEDDED_MODEL_V2, tmp_path / "grown", mlp=768)
    out = reshape.reshape(grown, tmp_path / "pruned", mlp=640)
    assert json.loads((out / grow.CONFIG).read_text())["text_config"]["intermediate_size"] == 640
    pruned = AutoModelForImageTextToText.from_pretrained(out).eval()
    inputs = _inputs(original, seed=2)
    torch.testing.assert_close(_logits(pruned, inputs), _logits(original, inputs), rtol=1e-5, atol=1e-5)
    weights = load_file(str(out / WEIGHTS))
    before = load_file(str(EMBEDDED_MODEL_V2 / WEIGHTS))
    assert all(torch.equal(weights[name], before[name]) for name in before if "mlp" in name)


@pytest.mark.parametrize(
    "options, message",
    [({}, "nothing to reshape"), ({"mlp": 640}, "fewer units"), ({"split": 0}, "at least 2")],
)
def test_bad_reshapes_are_refused(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        reshape.reshape(EMBEDDED_MODEL_V2, tmp_path / "out", **options)


def test_the_command_line_reports_errors_without_a_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        reshape.main(["--model", str(tmp_path), "--mlp", "10", "--out", str(tmp_path / "o")])
    assert stop.value.code == 2
    assert "no model.safetensors" in capsys.readouterr().err

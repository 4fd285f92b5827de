"""The measurement tools run end to end on a CPU (their GPU runs use the same code)."""

from __future__ import annotations

import json

from scripts import tree_cost


def test_tree_cost_measures_a_curve_and_writes_json(tmp_path):
    out = tmp_path / "cost.json"
    args = ["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--context", "16", "32"]
    result = tree_cost.main([*args, "--sizes", "1", "4", "8", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["preset"] == "tiny" and result["parameters"] > 0 and result["device"] == "cpu"
    for context in ("16", "32"):
        curve = result["curves"][context]
        assert [p["T"] for p in curve] == [1, 4, 8]
        assert all(p["ms"] > 0 for p in curve)
        # "relative" is each pass's time over the one-token pass's, as the tool's docstring promises.
        for point in curve:
            assert abs(point["relative"] - point["ms"] / curve[0]["ms"]) <= 0.01 * point["relative"] + 1e-3


def test_tree_cost_presets_have_the_published_backbone_sizes():
    from transformers import AutoConfig

    # Parameter counts of the text backbones (embeddings included), from their dimensions alone.
    expected = {"qwen2.5-vl-7b-lm": 7.6e9, "llava-1.6-7b-lm": 6.7e9}
    for name, params in expected.items():
        spec = dict(tree_cost.PRESETS[name])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        h, i, n, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
        kv = h * config.num_key_value_heads // config.num_attention_heads
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
        total = n * per_layer + 2 * v * h  # untied input and output embeddings
        assert abs(total - params) / params < 0.02, (name, total)


def test_calibration_bins_node_scores_against_acceptance():
    # Two passes: scores 0.02 (rejected), 0.5 (accepted, depth 1), 0.45 (rejected, depth 2), 1.0 (accepted).
    from types import SimpleNamespace as Node

    from scripts.calibration import calibration

    steps = [
        Node(nodes=[]),  # prefill
        Node(nodes=[Node(score=0.02, accepted=False, depth=1), Node(score=0.5, accepted=True, depth=1)]),
        Node(nodes=[Node(score=0.45, accepted=False, depth=2), Node(score=1.0, accepted=True, depth=1)]),
    ]
    bins, by_depth = calibration([steps])
    assert [(b["upper"], b["nodes"], b["accepted"]) for b in bins] == [
        (0.05, 1, 0.0),
        (0.5, 1, 0.0),
        (0.6, 1, 1.0),
        (1.0, 1, 1.0),
    ]
    assert bins[1]["mean_score"] == 0.45
    assert by_depth == {1: 1.0, 2: 0.0}


def test_depth_calibration_compares_path_scores_with_acceptance_by_depth():
    from types import SimpleNamespace as Node

    from scripts.calibration import depth_calibration

    steps = [
        Node(nodes=[]),  # prefill
        Node(nodes=[Node(score=0.6, accepted=True, depth=1), Node(score=0.2, accepted=False, depth=1)]),
        Node(nodes=[Node(score=0.1, accepted=True, depth=5), Node(score=0.05, accepted=False, depth=12)]),
    ]
    rows = depth_calibration([steps])
    table = [(r["depths"], r["nodes"], r["accepted"]) for r in rows]
    assert table == [("0", 2, 0.5), ("4-7", 1, 1.0), ("8+", 1, 0.0)]  # (depths of the states drafted at)
    assert abs(rows[0]["mean_score"] - 0.4) < 1e-12

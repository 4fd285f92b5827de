"""The benchmark: a small real run on a tiny model, the metric definitions on hand-checked cases, the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import noise_image, tiny

from recap.bench import (
    SampleRun,
    aggregate,
    common_prefix,
    main,
    normalize_methods,
    other_images,
    run_benchmark,
    split_for,
    write_outputs,
)
from recap.datasets import Sample, load_dataset
from recap.runtime import Runtime

METHOD_FIELDS = {
    "mat",
    "mat_no_bonus",
    "speedup",
    "tokens_per_s",
    "draft_ms_per_step",
    "match_rate",
    "accept_sensitive",
    "accept_insensitive",
    "accepted_length_histogram",
    "source_acceptance",
    "passes",
    "tokens",
    "seconds",
}
SETTINGS_FIELDS = {
    "model",
    "dtype",
    "device",
    "torch",
    "transformers",
    "python",
    "date",
    "command",
    "samples",
}
PROMPT = "describe the image. what colour is the square?"


def write_image_set(tmp_path, n=3):
    lines = []
    for i in range(n):
        noise_image(i).save(tmp_path / f"img{i}.png")
        lines.append(json.dumps({"image": f"img{i}.png", "prompt": PROMPT}))
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    """One small benchmark of every method on three images, written to disk."""
    tmp = tmp_path_factory.mktemp("bench")
    samples = load_dataset(str(write_image_set(tmp)))
    result = run_benchmark(
        Runtime(tiny("llava")),
        samples,
        "pld,tr,recap",
        max_new_tokens=12,
        warmup=1,
        progress=False,
        settings={"command": "test", "dataset": "set.jsonl"},
    )
    write_outputs(result, tmp / "out")
    return tmp / "out"


def test_results_json_has_every_field(bench_dir):
    data = json.loads((bench_dir / "results.json").read_text())
    assert set(data["settings"]) >= SETTINGS_FIELDS
    assert list(data["methods"]) == ["ar", "pld", "tr", "recap"]  # ar added, first
    for name, result in data["methods"].items():
        assert set(result) >= METHOD_FIELDS, name
        assert result["match_rate"] == 1.0, name  # lossless in fp32
        assert result["mat"] >= 1.0 and result["speedup"] > 0, name
        assert sum(result["accepted_length_histogram"]) == result["passes"] - 3  # prefill passes excluded
        # every generated token but each sample's first is at a sensitive or an insensitive position
        assert result["sensitive_positions"] + result["insensitive_positions"] == result["tokens"] - 3
    ar = data["methods"]["ar"]
    assert (ar["mat"], ar["mat_no_bonus"], ar["speedup"], ar["accept_sensitive"]) == (1.0, 0.0, 1.0, 0.0)
    assert len(data["samples"]) == 3 and data["samples"][0]["images"] == 1
    # recap's auto budget measured the tree-cost curve: it is recorded, as measured and as fitted
    curve = data["settings"]["cost_curve_ms"]
    assert [t for t, _ in curve["measured"]] == [t for t, _ in curve["fitted"]] == [1, 4, 8, 16, 32, 64]
    assert all(a[1] <= b[1] for a, b in zip(curve["fitted"], curve["fitted"][1:], strict=False))


def test_markdown_and_charts_are_written(bench_dir):
    table = (bench_dir / "results.md").read_text()
    assert "| recap |" in table and "speedup vs AR" in table and "```\ntest\n```" in table
    for chart in ("speedup_mat", "sensitivity", "accept_hist"):
        assert (bench_dir / f"{chart}.html").stat().st_size > 1000
    assert (bench_dir / "plotly.min.js").is_file()  # shared by the charts, so they work offline


def test_text_model_has_no_sensitivity_split():
    samples = [Sample("the cat is", [], "a"), Sample("the dog is", [], "b")]
    runtime = Runtime(tiny("llama"))
    shared = runtime.persistent_memory()  # process-wide: other tests may have filled it already
    before = shared.filled.copy()
    result = run_benchmark(runtime, samples, ["recap", "tr"], max_new_tokens=8, warmup=1, progress=False)
    assert result.methods["recap"].accept_sensitive is None and result.methods["recap"].match_rate == 1.0
    assert result.methods["ar"].accept_insensitive is None
    # the run used fresh memories of its own: the runtime's process-wide ones were never written
    assert (shared.filled == before).all() and not runtime.successor_matrix().ids.any()


@pytest.mark.parametrize(
    ("methods", "expected"),
    [
        ("recap,tr", ["ar", "recap", "tr"]),  # ar is always run, first
        ("tr, ar ,tr", ["ar", "tr"]),  # duplicates dropped
        (["pld"], ["ar", "pld"]),
    ],
)
def test_normalize_methods(methods, expected):
    assert normalize_methods(methods) == expected


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown method"):
        normalize_methods("recap,eagle")


def run(tokens, sources, accepted=(), seconds=1.0):
    return SampleRun("s", list(tokens), list(sources), list(accepted), [0.5] * len(accepted), 0.0, seconds)


@pytest.mark.parametrize(
    ("tokens", "sources", "flags", "expected"),
    [
        # same answer as AR [5, 8, 2, 7]: the first token never counts; ctx2 at the sensitive 8
        ([5, 8, 2, 7], ["target", "ctx2", "target", "suffix"], [False, True, False, False], (1, 1, 1, 2)),
        # the output leaves AR's after 2 tokens: only positions that agree are counted
        ([5, 8, 9, 9], ["target", "ctx3", "ctx3", "ctx3"], [False, False, True, True], (0, 0, 1, 1)),
    ],
)
def test_split_counts_agreeing_positions(tokens, sources, flags, expected):
    split = split_for(run(tokens, sources), [5, 8, 2, 7], flags)
    got = (split.sensitive_drafted, split.sensitive_total, split.insensitive_drafted, split.insensitive_total)
    assert got == expected


def test_aggregate_on_a_hand_checked_case():
    # AR: 4 tokens in 4 passes, 2 s. Method: prefill + 2 decoding passes accepting 2 and 0 drafts, 1 s.
    ar = run([1, 2, 3, 4], ["target"] * 4, [0, 0, 0], seconds=2.0)
    method = run([1, 2, 3, 4], ["target", "ctx2", "suffix", "target"], [2, 0], seconds=1.0)
    result = aggregate("recap", [method], [ar], None)
    assert (result.passes, result.tokens) == (3, 4)
    assert result.mat == pytest.approx(4 / 3) and result.mat_no_bonus == pytest.approx(1.0)
    assert result.speedup == pytest.approx(2.0) and result.match_rate == 1.0
    assert result.accepted_length_histogram == [1, 0, 1]
    assert result.source_acceptance == {"ctx2": 1, "suffix": 1}
    assert result.accept_sensitive is None
    assert aggregate("x", [run([1, 9], ["target"] * 2)], [ar], None).match_rate == pytest.approx(1 / 4)


def test_common_prefix_and_other_images():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert (common_prefix([], [1]), common_prefix([1], [1, 2])) == (0, 1)
    a, b = noise_image(0), noise_image(1)
    samples = [Sample("p", [a]), Sample("p", []), Sample("p", [b])]
    assert other_images(samples, 0) == [b] and other_images(samples, 2) == [a]  # next with an image, cyclic
    assert other_images(samples[:1], 0) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "recap,eagle"], "unknown method"),
        (["--limit", "0"], "limit must be a positive"),
        (["--budget", "lots"], "budget must be 'auto'"),
        (["--max-new-tokens", "0"], "max_new_tokens must be"),
        (["--dataset", "nowhere.jsonl"], "dataset file not found"),
        (["--warmup", "-1"], "warmup must be"),
    ],
)
def test_cli_argument_errors(tmp_path, capsys, args, message):
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_requires_out(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--dataset", "scenes"])
    assert exit_info.value.code == 2


def test_cli_end_to_end_on_a_saved_tiny_model(tmp_path, capsys):
    target = tiny("llava")
    target.model.save_pretrained(tmp_path / "model")
    target.processor.save_pretrained(tmp_path / "model")
    dataset = write_image_set(tmp_path, n=2)
    args = [
        "--model",
        str(tmp_path / "model"),
        "--dataset",
        str(dataset),
        "--methods",
        "recap",
        "--max-new-tokens",
        "6",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(args) == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["settings"]["command"].startswith("python -m recap.bench --model ")
    assert data["methods"]["recap"]["match_rate"] == 1.0
    assert "| recap |" in capsys.readouterr().out

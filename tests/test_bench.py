"""The benchmark: a small real run on a tiny model, the metric definitions on hand-checked cases, the CLI."""

from __future__ import annotations

import json
import math

import pytest
from conftest import images_for, noise_image, tiny
from test_cost import H200

from recap.bench import (
    SampleRun,
    aggregate,
    main,
    normalize_methods,
    other_images,
    per_category,
    run_benchmark,
    sample_category,
    write_outputs,
)
from recap.bench.datasets import Sample, load_dataset
from recap.bench.metrics import SampleWins, sample_wins
from recap.bench.runner import StreamSettings
from recap.bench.sensitivity import common_prefix, split_against_reference
from recap.decode import generate
from recap.drafters.recap.config import RecapConfig
from recap.drafters.suffix_decoding import SuffixConfig
from recap.memory.fingerprint import model_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.models.cost import COST_SIZES, load_curve
from recap.runtime import EMBEDDED_MODEL_V1, Runtime
from recap.sampling import SamplingSettings
from recap.state import DrafterState

METHOD_FIELDS = {
    "mat",
    "mat_no_bonus",
    "speedup",
    "tokens_per_s",
    "draft_ms_per_step",
    "draft_cpu_ms_per_step",
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
        # each figure is a sum of clock differences: finite and never negative. The two clocks are not
        # compared (read at different moments, CPU time can exceed wall time on a busy machine).
        wall, cpu = result["draft_ms_per_step"], result["draft_cpu_ms_per_step"]
        assert math.isfinite(wall) and math.isfinite(cpu) and wall >= 0 and cpu >= 0, name
        if name != "ar":  # a drafter that drafts spends time on it: both clocks count some
            assert wall > 0 and cpu > 0, name
    ar = data["methods"]["ar"]
    assert (ar["mat"], ar["mat_no_bonus"], ar["speedup"], ar["accept_sensitive"]) == (1.0, 0.0, 1.0, 0.0)
    assert len(data["samples"]) == 3 and data["samples"][0]["images"] == 1
    # recap's auto budget measured the tree-cost curve: it is recorded, as measured and as fitted
    curve = data["settings"]["cost_curve_ms"]
    assert [t for t, _ in curve["measured"]] == [t for t, _ in curve["fitted"]] == list(COST_SIZES)
    assert all(a[1] <= b[1] for a, b in zip(curve["fitted"], curve["fitted"][1:], strict=False))


def test_per_sample_accepted_drafts_sum_to_each_methods_totals(bench_dir):
    """Every sample records each method's drafts accepted at its image-sensitive positions; summed over
    the samples they are the method's own share (accept_sensitive x sensitive_positions)."""
    data = json.loads((bench_dir / "results.json").read_text())
    for name, result in data["methods"].items():
        total = sum(sample["sensitive_accepted"][name] for sample in data["samples"])
        assert total == round(result["accept_sensitive"] * result["sensitive_positions"]), name
    assert all(s["sensitive_accepted"]["ar"] == 0 for s in data["samples"])  # AR drafts nothing
    wins = sample_wins(data["samples"], "recap", "tr")
    with_positions = [s for s in data["samples"] if s["sensitive_positions"]]
    assert wins is not None and wins.samples == len(with_positions)
    row = f"| recap | {wins.samples} | {wins.more} | {wins.tied} | {wins.fewer} |"
    assert row in (bench_dir / "results.md").read_text()


def test_sample_wins_on_a_hand_checked_case():
    samples = [
        {"sensitive_positions": 4, "sensitive_accepted": {"tr": 3, "recap": 5}},
        {"sensitive_positions": 2, "sensitive_accepted": {"tr": 2, "recap": 2}},
        {"sensitive_positions": 5, "sensitive_accepted": {"tr": 4, "recap": 1}},
        {"sensitive_positions": 0, "sensitive_accepted": {"tr": 0, "recap": 0}},  # nothing to compare
        {"sensitive_positions": None, "sensitive_accepted": {}},  # a text sample
        {"sensitive_positions": 3, "passes": {}},  # written before the counts were recorded
    ]
    wins = sample_wins(samples, "recap", "tr")
    assert wins == SampleWins(more=1, tied=1, fewer=1) and (wins.at_least, wins.samples) == (2, 3)
    assert sample_wins(samples, "tr", "recap") == SampleWins(more=1, tied=1, fewer=1)
    assert sample_wins(samples, "recap", "pld") is None and sample_wins([], "recap", "tr") is None


def test_markdown_and_charts_are_written(bench_dir):
    table = (bench_dir / "results.md").read_text()
    assert "| recap |" in table and "speedup vs AR" in table and "```\ntest\n```" in table
    for chart in ("speedup_mat", "sensitivity", "accept_hist"):
        assert (bench_dir / f"{chart}.html").stat().st_size > 1000
    assert (bench_dir / "plotly.min.js").is_file()  # shared by the charts, so they work offline


def test_text_model_has_no_sensitivity_split():
    samples = [Sample("the cat is", [], "a"), Sample("the dog is", [], "b")]
    runtime = Runtime(tiny("llama"))
    shared = runtime.state.persistent()  # process-wide: other tests may have filled it already
    before = shared.filled.copy()
    result = run_benchmark(runtime, samples, ["recap", "tr"], max_new_tokens=8, warmup=1, progress=False)
    assert result.methods["recap"].accept_sensitive is None and result.methods["recap"].match_rate == 1.0
    assert result.methods["ar"].accept_insensitive is None
    # the run used fresh memories of its own: the runtime's process-wide ones were never written
    assert (shared.filled == before).all() and not runtime.state.successors().ids.any()


def test_warm_up_requests_never_touch_the_measured_memories():
    # The same prompt twice: a method whose memories the warm-up had filled would draft more.
    samples = [Sample("the cat is", [], "a"), Sample("the cat is", [], "b")]
    runtime = Runtime(tiny("llama"))
    kwargs = {"max_new_tokens": 12, "setup": StreamSettings(8), "progress": False}  # a fixed budget: untimed
    cold_start = run_benchmark(runtime, samples, "recap,tr,suffix", warmup=0, **kwargs)
    warmed = run_benchmark(runtime, samples, "recap,tr,suffix", warmup=2, **kwargs)
    for method in ("recap", "tr", "suffix"):
        before, after = cold_start.methods[method], warmed.methods[method]
        assert after.accepted_length_histogram == before.accepted_length_histogram, method
        assert after.source_acceptance == before.source_acceptance, method


# ------------------------------------------------------------------------- --memory: a warm start
def _saved_memory(target, prompt: str, path, fingerprint: str | None = None) -> PersistentMemory:
    """A persistent memory that decoded ``prompt`` once, saved to ``path`` (tagged for ``target``)."""
    memory = PersistentMemory(target.vocab_size, 8)
    drafter = Runtime(target).drafter(
        "recap", config=RecapConfig(budget=8), state=DrafterState.given(target.vocab_size, memory)
    )
    generate(target, drafter, prompt, [], 12)
    memory.save(path, fingerprint or model_fingerprint(target))
    return memory


def test_a_saved_memory_starts_recap_and_tr_warm_and_is_never_written(tmp_path):
    target = tiny("llama")
    start = _saved_memory(target, "the cat is", tmp_path / "m.safetensors")
    rows = start.ids.copy()
    samples = [Sample("the cat is", [], "a")]
    kwargs = {"max_new_tokens": 12, "warmup": 0, "progress": False}
    cold = run_benchmark(Runtime(target), samples, "recap,tr,suffix", setup=StreamSettings(8), **kwargs)
    warm = run_benchmark(
        Runtime(target), samples, "recap,tr,suffix", setup=StreamSettings(8, start=start), **kwargs
    )
    for method in ("recap", "tr"):  # the memory knows this answer: fewer passes
        assert warm.methods[method].passes < cold.methods[method].passes, method
        assert warm.methods[method].match_rate == 1.0
    assert warm.methods["suffix"].passes == cold.methods["suffix"].passes  # its tree is not in the file
    assert (start.ids == rows).all() and warm.settings["start_memory_tokens"] == len(start) > 0
    assert cold.settings["start_memory_tokens"] == 0
    # --cold with a memory: every sample starts from the file again, so two equal samples run alike
    twice = run_benchmark(
        Runtime(target), samples * 2, "recap", setup=StreamSettings(8, start=start, cold=True), **kwargs
    )
    assert twice.methods["recap"].passes == 2 * warm.methods["recap"].passes
    other = PersistentMemory(target.vocab_size, 4)
    with pytest.raises(ValueError, match="k=4"):
        run_benchmark(Runtime(target), samples, "recap", setup=StreamSettings(8, start=other), **kwargs)


def _saved_text_model(tmp_path):
    target = tiny("llama")
    target.model.save_pretrained(tmp_path / "model")
    target.tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "the cat is"}) + "\n")
    return Runtime.load(str(tmp_path / "model")).target


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "memory file not found: "),
        ("corrupt", "not loaded"),
        ("other model", "fingerprint"),
        ("ok", None),
    ],
)
def test_cli_memory_file(tmp_path, capsys, case, message):
    target = _saved_text_model(tmp_path)
    memory = tmp_path / "memory.safetensors"
    if case == "corrupt":
        memory.write_bytes(b"not a safetensors file")
    elif case == "other model":
        _saved_memory(target, "the cat is", memory, fingerprint="another model")
    elif case == "ok":
        _saved_memory(target, "the cat is", memory)
    args = ["--model", str(tmp_path / "model"), "--dataset", str(tmp_path / "prompts.jsonl"), "--methods"]
    args += ["recap", "--max-new-tokens", "6", "--warmup", "0", "--no-progress", "--memory", str(memory)]
    capsys.readouterr()  # the model's saving progress bars
    code = main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0
        settings = json.loads((tmp_path / "out" / "results.json").read_text())["settings"]
        assert settings["memory_file"] == "memory.safetensors" and settings["start_memory_tokens"] > 0
    else:
        assert code == 2 and message in err and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("error: ")  # after the model's loading bar
        assert not (tmp_path / "out").exists()


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
    split = split_against_reference(tokens, sources, [5, 8, 2, 7], flags)
    got = (split.sensitive_drafted, split.sensitive_total, split.insensitive_drafted, split.insensitive_total)
    assert got == expected


def test_sampled_benchmark_gives_every_method_ars_tokens():
    # Sample i is drawn with seed + i for every method: the trees change the passes, not the tokens.
    runtime = Runtime(tiny("llava"))
    samples = [
        Sample(p, [noise_image(i)], id=str(i)) for i, p in enumerate(["the cat is", "a dog", "the cat"])
    ]
    sampling = SamplingSettings(temperature=0.5, top_k=3, top_p=0.95, seed=3)
    setup = StreamSettings(sampling=sampling)
    result = run_benchmark(runtime, samples, "ar,tr,recap", 16, progress=False, setup=setup)
    assert all(r.match_rate == 1.0 for r in result.methods.values())
    assert result.methods["tr"].mat > 1.0
    assert result.settings["sampling"] == {"temperature": 0.5, "top_k": 3, "top_p": 0.95, "seed": 3}


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
        (["--threads", "0"], "--threads must be at least 1"),
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


@pytest.mark.skipif(not (EMBEDDED_MODEL_V1 / "config.json").is_file(), reason="no embedded v1 in assets")
def test_a_defaulted_dataset_is_written_into_the_recorded_command(tmp_path):
    # The default follows the model (and may change); the recorded command must reproduce this run.
    out = tmp_path / "out"
    args = ["--model", str(EMBEDDED_MODEL_V1), "--methods", "ar", "--limit", "1", "--max-new-tokens", "2"]
    assert main([*args, "--warmup", "0", "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["dataset"] == "scenes" and settings["command"].endswith(" --dataset scenes")


# --------------------------------------------------------------------------- suffix and categories
def categorized(prompts_and_categories):
    return [Sample(p, [], f"s{i}", {"category": c}) for i, (p, c) in enumerate(prompts_and_categories)]


def test_per_category_on_a_hand_checked_case():
    samples = categorized([("p", "x"), ("p", "y"), ("p", "x")])
    ar = [run([1, 2], ["target"] * 2, [0], seconds=2.0) for _ in samples]
    method = [
        run([1, 2], ["target"] * 2, [0], seconds=1.0),  # x: 2 tokens, 2 passes, 1 s
        run([1, 2, 3], ["target", "ctx2", "target"], [1], seconds=4.0),  # y: 3 tokens, 2 passes
        run([1, 2, 3, 4], ["target", "ctx2", "ctx3", "target"], [2], seconds=1.0),  # x: 4 tokens, 2 passes
    ]
    categories = per_category(samples, {"ar": ar, "recap": method})
    assert list(categories) == ["x", "y"]  # in order of first appearance
    x = categories["x"]["recap"]
    assert (x.samples, x.tokens, x.passes) == (2, 6, 4)
    assert x.mat == pytest.approx(1.5) and x.mat_no_bonus == pytest.approx(1.0) and x.speedup == 2.0
    assert categories["y"]["recap"].speedup == pytest.approx(0.5)
    assert categories["y"]["ar"].mat == 1.0
    assert per_category([Sample("p", [], "a")], {"ar": ar[:1]}) == {}  # no categories, no table


@pytest.mark.parametrize(
    ("meta", "category"),
    [({"category": "rag"}, "rag"), ({"qtype": "count"}, "count"), ({}, None), ({"category": ""}, None)],
)
def test_sample_category(meta, category):
    assert sample_category(Sample("p", [], "a", meta)) == category


def test_suffix_and_categories_in_a_text_run(tmp_path):
    # the same prompt in two categories: the second answer is drafted from the first in the global tree
    samples = categorized([("the cat is", "copy"), ("the dog is", "other"), ("the cat is", "copy")])
    runtime = Runtime(tiny("llama"))
    kwargs = {"max_new_tokens": 16, "warmup": 1, "progress": False}
    warm = run_benchmark(runtime, samples, "suffix,pld", **kwargs)
    cold = run_benchmark(runtime, samples, "suffix", setup=StreamSettings(cold=True), **kwargs)
    suffix = warm.methods["suffix"]
    assert suffix.match_rate == 1.0 and suffix.source_acceptance.get("suffix tree", 0) > 0
    assert set(suffix.source_acceptance) <= {"suffix tree"}
    # --cold empties the global tree before every sample: fewer tokens drafted
    assert cold.methods["suffix"].mat < suffix.mat
    assert list(warm.categories) == ["copy", "other"]
    assert list(warm.categories["copy"]) == ["ar", "suffix", "pld"]
    assert sum(c["suffix"].tokens for c in warm.categories.values()) == suffix.tokens
    assert warm.settings["suffix_config"]["max_spec_tokens"] == 16
    write_outputs(warm, tmp_path)
    table = (tmp_path / "results.md").read_text()
    assert "Per category: MAT (speedup vs AR)" in table and "| copy | 2 |" in table
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["categories"]["copy"]["suffix"]["samples"] == 2


def test_suffix_settings_reach_the_drafter():
    samples = categorized([("the cat is", "a"), ("the cat is", "a")])
    config = SuffixConfig(max_spec_tokens=2)
    result = run_benchmark(
        Runtime(tiny("llama")),
        samples,
        "suffix",
        max_new_tokens=16,
        progress=False,
        setup=StreamSettings(suffix_config=config),
    )
    assert 0 < result.methods["suffix"].nodes_per_step <= 2
    assert result.settings["suffix_config"]["max_spec_tokens"] == 2


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--dataset", "specbench"], None, "--data-file FILE (or set RECAP_SPECBENCH=FILE)"),
        (["--dataset", "specbench"], "nowhere.jsonl", "specbench question file not found"),
        (["--dataset", "scenes", "--data-file", "q.jsonl"], None, "a data file is read only by"),
        (["--methods", "suffix", "--suffix-max-spec-tokens", "0"], None, "max_spec_tokens must be from 1"),
        (["--methods", "suffix", "--suffix-min-token-prob", "2"], None, "min_token_prob"),
    ],
)
def test_cli_specbench_and_suffix_errors(tmp_path, capsys, monkeypatch, args, env, message):
    if env is None:
        monkeypatch.delenv("RECAP_SPECBENCH", raising=False)
    else:
        monkeypatch.setenv("RECAP_SPECBENCH", env)
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_specbench_from_the_environment_on_a_saved_text_model(tmp_path, capsys, monkeypatch):
    target = tiny("llama")
    target.model.save_pretrained(tmp_path / "model")
    target.processor.save_pretrained(tmp_path / "model")
    questions = tmp_path / "question.jsonl"
    records = [
        {"question_id": 1, "category": "qa", "turns": ["the cat is"]},
        {"question_id": 2, "category": "rag", "turns": ["the dog is"]},
    ]
    questions.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setenv("RECAP_SPECBENCH", str(questions))
    args = ["--model", str(tmp_path / "model"), "--dataset", "specbench", "--methods", "suffix"]
    args += ["--max-new-tokens", "6", "--warmup", "0", "--no-progress", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["settings"]["data_file"] == "question.jsonl"  # the name only, never the machine path
    assert data["settings"]["command"].endswith(" --data-file question.jsonl")  # read from RECAP_SPECBENCH
    assert str(questions) not in (tmp_path / "out" / "results.json").read_text()
    assert list(data["categories"]) == ["qa", "rag"] and data["methods"]["suffix"]["match_rate"] == 1.0
    assert "| suffix |" in capsys.readouterr().out
    # the peer baseline has its row, its per-category column and its bar in the report
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| category | samples | AR tokens | ar | suffix |" in table
    assert "\n| qa | 1 | " in table and "\n| rag | 1 | " in table
    assert '"suffix"' in (tmp_path / "out" / "speedup_mat.html").read_text()


def test_without_plotly_the_tables_are_still_written(tmp_path, monkeypatch, caplog):
    """A bare GPU machine lacked plotly: the bench must keep its results and skip only the charts."""
    from recap.bench import report

    samples = load_dataset(str(write_image_set(tmp_path)))
    result = run_benchmark(Runtime(tiny("llava")), samples, "tr", max_new_tokens=4, warmup=0, progress=False)
    real = report.importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "plotly" else real(name, *args)

    monkeypatch.setattr(report.importlib.util, "find_spec", find_spec)
    paths = write_outputs(result, tmp_path / "out")
    assert [p.name for p in paths] == ["results.json", "results.md"]
    assert not list((tmp_path / "out").glob("*.html"))
    assert "plotly is not installed" in caplog.text


def test_the_projection_adds_drafting_in_cpu_time_not_wall_clock():
    # a busy machine stretches the wall clock of drafting (a 1.444 s TR projection on a loaded CPU):
    # the projection adds the decoding thread's CPU time, and wall-clock time only for old records
    from recap.bench.metrics import SampleRun, aggregate
    from recap.models.cost import CostModel
    from recap.trace import StepRecord

    flat = CostModel([(1, 0.003), (128, 0.003)])

    def run(wall_ms, cpu_ms, recorded_cpu=True):
        steps = [StepRecord(step=0, committed_len=5, method="tr", new_tokens=[1])]
        for i in (1, 2):
            step = StepRecord(step=i, committed_len=5 + i, method="tr", new_tokens=[i + 1])
            step.timing = {"draft_ms": wall_ms, "update_ms": 0.0}
            step.drafter_cpu_ms, step.cpu_ms = cpu_ms, (cpu_ms + 9.0 if recorded_cpu else 0.0)
            steps.append(step)
        return SampleRun.from_steps("s", steps, 1.0)

    ar = [run(0.0, 0.0)]
    busy = aggregate("tr", [run(500.0, 1.0)], ar, None, projection=flat)
    assert busy.projected_seconds == pytest.approx(2 * 0.003 + 0.002)
    old = aggregate("tr", [run(5.0, 0.0, recorded_cpu=False)], ar, None, projection=flat)  # saved before
    assert old.projected_seconds == pytest.approx(2 * 0.003 + 0.010)


def test_bench_replays_a_recorded_curve(tmp_path):
    from recap.bench import run_benchmark
    from recap.bench.datasets import Sample

    target = tiny("llava")
    runtime = Runtime(target)
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps([[t, ms] for t, ms in H200]))
    runtime.use_cost_model(load_curve(curve))
    samples = [Sample("describe the image.", images_for(target, i)) for i in range(2)]
    result = run_benchmark(runtime, samples, "recap", max_new_tokens=8, warmup=0, progress=False)
    assert result.settings["cost_curve_ms"]["measured"] == [[t, ms] for t, ms in H200]
    assert result.methods["recap"].match_rate == 1.0


def test_bench_cli_refuses_a_bad_cost_curve_before_loading_a_model(tmp_path, capsys):
    from recap.bench import main

    assert main(["--cost-curve", str(tmp_path / "absent.json"), "--out", str(tmp_path / "out")]) == 2
    assert "cost curve file not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

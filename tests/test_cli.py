"""The command line: a real run on a model saved to disk, and clean one-line errors for bad input."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import noise_image, tiny

from recap.__main__ import main
from recap.trace import RunTrace


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llava")
    target = tiny("llava")
    target.model.save_pretrained(path)
    target.processor.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "scene.png"
    noise_image(4).save(path)
    return path


def run(capsys, *args):
    code = main(["generate", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_prints_answer_and_summary_and_writes_trace(capsys, model_dir, image_file, tmp_path):
    trace_file = tmp_path / "runs" / "new" / "run.json"  # folders that do not exist yet are created
    code, out, err = run(
        capsys,
        "--model",
        model_dir,
        "--image",
        image_file,
        "--prompt",
        "the cat is",
        "--max-new-tokens",
        12,
        "--json",
        trace_file,
    )
    assert code == 0
    assert "target passes" in err and "accepted tokens/pass" in err and "tokens/s" in err
    trace = RunTrace.load(trace_file)
    assert trace.settings["method"] == "recap"
    assert len(trace.tokens) == 12 and trace.steps[0].step == 0
    assert out == trace.text + "\n"  # the answer, exactly, and nothing else on stdout


def test_seeded_sampling_is_reproducible_and_recorded(capsys, model_dir, image_file, tmp_path):
    args = ["--model", model_dir, "--image", image_file, "--prompt", "the cat is", "--max-new-tokens", 16]
    sampled = [*args, "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--method", "tr"]
    first = run(capsys, *sampled, "--json", tmp_path / "a.json")
    second = run(capsys, *sampled)
    assert first[0] == second[0] == 0 and first[1] == second[1]
    settings = RunTrace.load(tmp_path / "a.json").settings
    assert (settings["temperature"], settings["top_p"], settings["seed"]) == (0.8, 0.9, 7)
    greedy = run(capsys, *args, "--method", "tr")
    assert greedy[1] == run(capsys, *args, "--method", "ar")[1]  # temperature 0 stays greedy


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--temperature", "-1", "--temperature"),
        ("--temperature", "nan", "--temperature"),
        ("--top-p", "0", "--top-p"),
        ("--top-k", "-2", "--top-k"),
        ("--seed", "-5", "--seed"),
        ("--threads", "0", "--threads"),
    ],
)
def test_absurd_sampling_and_model_options_are_one_line_errors(capsys, model_dir, option, value, message):
    code, out, err = run(capsys, "--model", model_dir, "--prompt", "hi", option, value)
    assert code == 2 and out == "" and err.startswith(f"error: {message}") and err.count("\n") == 1


def test_memory_file_is_saved_and_reused(capsys, model_dir, image_file, tmp_path):
    memory = tmp_path / "memory.safetensors"
    args = (
        "--model",
        model_dir,
        "--image",
        image_file,
        "--prompt",
        "the cat is",
        "--max-new-tokens",
        10,
        "--memory",
        memory,
    )
    assert run(capsys, *args)[0] == 0 and memory.exists()
    assert run(capsys, *args)[0] == 0


def _another_models_memory(path):
    from recap.memory.persistent import PersistentMemory

    memory = PersistentMemory(vocab_size=20, k=8)
    memory.write_many(np.array([3]), np.array([[1, 2]]), np.array([[0.7, 0.2]]))
    memory.save(path, "another-tokenizer")


@pytest.mark.parametrize(
    "make",
    [
        lambda path: path.write_bytes(b"not a safetensors file"),  # corrupt
        _another_models_memory,  # saved for another model (tokenizer, vocabulary)
    ],
    ids=["corrupt", "another-model"],
)
@pytest.mark.parametrize("method", ["recap", "tr"])
def test_memory_file_that_does_not_load_is_never_overwritten(
    capsys, caplog, model_dir, image_file, tmp_path, make, method
):
    memory = tmp_path / "memory.safetensors"
    make(memory)
    before = memory.read_bytes()
    with caplog.at_level(logging.WARNING):
        code, out, err = run(
            capsys,
            *("--model", model_dir, "--image", image_file, "--prompt", "hi"),
            *("--max-new-tokens", 4, "--method", method, "--memory", memory),
        )
    assert code == 0 and out.strip()
    assert memory.read_bytes() == before
    assert f"memory: empty ({memory} did not load)" in err, err  # not called a new memory
    assert any("not be overwritten" in r.getMessage() for r in caplog.records)


def _read_only_folder(tmp_path):
    """A folder no file can be created in: a chmod-ed one, or (as root, who ignores modes) /sys."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except PermissionError:
        return folder
    (folder / "probe").unlink()
    return Path("/sys")  # sysfs refuses new files even to root


@pytest.mark.parametrize(
    ("where", "flag", "message"),
    [
        ("folder", "--memory", "is a folder, not a file"),
        ("read-only", "--memory", "cannot save the persistent memory"),
        ("folder", "--json", "cannot write the trace"),
        ("read-only", "--json", "cannot write the trace"),
    ],
)
def test_unwritable_output_prints_the_answer_then_one_error_line(
    capsys, model_dir, image_file, tmp_path, where, flag, message
):
    target = tmp_path / "existing-folder" if where == "folder" else _read_only_folder(tmp_path) / "out.bin"
    if where == "folder":
        target.mkdir()
    code, out, err = run(
        capsys,
        *("--model", model_dir, "--image", image_file, "--prompt", "hi", "--max-new-tokens", 4),
        *(flag, target),
    )
    assert code == 2
    assert out.strip(), "the answer must be printed before the error"
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1]
    assert "Traceback" not in err and "target passes" in err  # the summary line came first
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_memory_that_is_not_a_regular_file_is_named_for_what_it_is(
    capsys, model_dir, image_file, tmp_path, kind
):
    # /dev/null or a FIFO is neither loaded (a FIFO would block the read) nor called "a folder"
    target = Path("/dev/null")
    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    code, out, err = run(
        capsys,
        *("--model", model_dir, "--image", image_file, "--prompt", "hi", "--max-new-tokens", 4),
        *("--memory", target),
    )
    assert code == 2 and out.strip()
    last = err.strip().splitlines()[-1]
    assert "not a regular file (a device, FIFO, socket)" in last and "folder" not in last, last
    # the summary line before it does not call the refused file a new memory
    summary = next(line for line in err.splitlines() if "target passes" in line)
    assert f"memory: empty ({target} not used)" in summary and "(new)" not in summary, summary


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--image", "missing.png", "--prompt", "hi"], "image file not found"),
        (["--image", "NOTIMAGE", "--prompt", "hi"], "not a readable image"),
        (["--prompt", "   "], "prompt is empty"),
        (["--prompt", "hi \ud800"], "not valid Unicode"),  # a lone surrogate (e.g. undecodable argv bytes)
        (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt", "hi", "--budget", "lots"], "budget"),
        (["--prompt", "hi", "--dtype", "float8"], "dtype"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, model_dir, tmp_path, extra, message):
    not_image = tmp_path / "notes.png"
    not_image.write_text(json.dumps({"hello": "world"}))
    extra = [str(not_image) if a == "NOTIMAGE" else a for a in extra]
    code, _, err = run(capsys, "--model", model_dir, *extra)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert err.startswith("error: ")


def test_a_prompt_over_the_models_positions_exits_2_with_both_numbers(capsys, model_dir, image_file):
    # The tiny LLaVA embeds 512 positions; 300 repeats of "the cat is" make some 900 tokens.
    prompt = "the cat is " * 300
    args = ("--model", model_dir, "--image", image_file, "--prompt", prompt, "--max-new-tokens", 8)
    code, out, err = run(capsys, *args)
    last = err.strip().splitlines()[-1]  # (after the model's loading messages)
    assert code == 2 and out == "" and "Traceback" not in err
    assert last.startswith("error: the prompt is ") and "over this model's maximum of 512" in last, err


def test_missing_model_directory(capsys):
    code, _, err = run(capsys, "--model", "./no/such/model", "--prompt", "hi")
    assert code == 2 and "model directory not found" in err


def test_a_vision_model_without_an_image_answers_the_text_with_a_warning(
    capsys, caplog, model_dir, image_file
):
    # `--image` may be omitted (a text prompt), but a vision model is then told so: the studio refuses it
    with caplog.at_level(logging.WARNING):
        code, out, _ = run(capsys, "--model", model_dir, "--prompt", "the cat is", "--max-new-tokens", 4)
    assert code == 0 and out.strip()
    assert any("no --image: this is a vision model" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        args = ("--model", model_dir, "--image", image_file, "--prompt", "the cat is", "--max-new-tokens", 4)
        assert run(capsys, *args)[0] == 0
    assert not any("no --image" in r.getMessage() for r in caplog.records)

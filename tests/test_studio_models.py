"""The embedded models in the studio: v2 (the default) and v1 offered side by side, each with its own
examples, replacement scenes, shipped memory and per-session memories; and the first click on v2.

The first-click test drives the built demo's own handlers (Run's, then the model dropdown's) with the
page's default values, which is what a visitor's browser sends: no numbers are written here that a
retrained v2 or a rebuilt memory (``python -m scripts.build_memory --model v2``) would change, except
the issue's goals (a tree at step 1, at least 1.5 tokens per pass).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from recap.embedded import embedded_world, scenes2, training_requests
from recap.hotstart import shipped_memory_for, starting_memory
from recap.memory.fingerprint import model_fingerprint
from recap.runtime import EMBEDDED_MODEL, EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2, Runtime
from recap.studio import environment
from recap.studio.environment import (
    DEFAULT_MODEL_ID,
    EMBEDDED_V1_ID,
    EMBEDDED_V2_ID,
    SESSION_SCOPE,
    default_runtime_factory,
    offered_models,
)
from recap.studio.serving import RuntimeCache, Studio
from recap.studio.ui.examples import (
    BLANK_IMAGE,
    EXAMPLES_V1_DIR,
    EXAMPLES_V2_DIR,
    OTHER_SET,
    example_sets,
    examples,
    other_image,
    other_image_choices,
    swap_to,
)
from recap.trace import RunTrace, summarize

BOTH = (EMBEDDED_MODEL_V1 / "config.json").is_file() and (EMBEDDED_MODEL_V2 / "config.json").is_file()
needs_both = pytest.mark.skipif(not BOTH, reason="the embedded models are not both in assets/models")


# ------------------------------------------------------------------------------------ offered
def test_v2_is_the_default_model_everywhere():
    assert EMBEDDED_MODEL == EMBEDDED_MODEL_V2 and EMBEDDED_MODEL_V2.name == "tiny-scenes-llava-v2"
    assert EMBEDDED_MODEL_V1.name == "tiny-scenes-llava"
    assert DEFAULT_MODEL_ID == EMBEDDED_V2_ID
    assert environment.EMBEDDED_FOLDERS[DEFAULT_MODEL_ID] == EMBEDDED_MODEL


def test_the_old_id_embedded_names_the_default_with_a_warning(monkeypatch, caplog):
    """``embedded`` meant v1 until v2 became the default: it is still accepted (an API client's run, an
    operator's RECAP_MODELS) as the default, and the operator is told what it means now."""
    from recap.studio.guard.validation import check_model, parse_settings

    values = ["embedded", "recap", "auto", 8, 8, 8, True, True, True, 8, "per session", 0.0, 0, 1.0, None]
    assert parse_settings(values, [EMBEDDED_V2_ID], ("per session",)).model == EMBEDDED_V2_ID
    with pytest.raises(ValueError, match="unknown model"):  # an alias of a model not offered: refused
        parse_settings(values, [EMBEDDED_V1_ID], ("per session",))
    assert check_model("embedded", [EMBEDDED_V2_ID]) == EMBEDDED_V2_ID  # (the resets' check too)
    monkeypatch.delenv("RECAP_MODEL", raising=False)
    monkeypatch.setenv("RECAP_MODELS", "embedded")
    with caplog.at_level("WARNING"):
        models = offered_models()
    assert "embedded" not in models and models[0] == EMBEDDED_V2_ID
    assert "alias" in caplog.text and EMBEDDED_V1_ID in caplog.text


def test_the_resets_accept_the_old_id_as_runs_do():
    import app

    def unloadable(model_id):
        raise ValueError(f"cannot load model {model_id!r}")

    demo = app.build_demo(runtime_factory=unloadable, models=[EMBEDDED_V2_ID])
    reset = next(fn.fn for fn in demo.fns.values() if fn.api_name == "reset_empty")
    memories, line = reset("embedded", "per session", {})
    assert list(memories) == [EMBEDDED_V2_ID] and "on your first run, empty (you reset it)" in line


@pytest.mark.parametrize(
    "recap_model, first_two",
    [
        (None, [EMBEDDED_V2_ID, EMBEDDED_V1_ID]),  # the studio opens on v2
        (EMBEDDED_V1_ID, [EMBEDDED_V1_ID, EMBEDDED_V2_ID]),  # the operator makes v1 the default
        ("embedded", [EMBEDDED_V2_ID, EMBEDDED_V1_ID]),  # "embedded" names the default embedded model
        (" embedded-v2 ", [EMBEDDED_V2_ID, EMBEDDED_V1_ID]),
    ],
)
def test_both_embedded_models_are_offered_the_default_first(monkeypatch, recap_model, first_two):
    monkeypatch.delenv("RECAP_MODEL", raising=False)
    monkeypatch.delenv("RECAP_MODELS", raising=False)
    if recap_model is not None:
        monkeypatch.setenv("RECAP_MODEL", recap_model)
    models = offered_models()
    assert models[:2] == first_two and "embedded" not in models
    assert environment.model_label(EMBEDDED_V2_ID) == "Embedded VLM v2 (wider world)"
    assert environment.model_label(EMBEDDED_V1_ID) == "Embedded VLM v1 (small world)"


@pytest.mark.parametrize(
    "model_id, command",
    [
        (EMBEDDED_V1_ID, "python -m training.train)"),
        (EMBEDDED_V2_ID, "python -m training.train --world v2)"),
    ],
)
def test_a_missing_embedded_folder_is_a_clear_error_without_a_path(monkeypatch, tmp_path, model_id, command):
    missing = {**environment.EMBEDDED_FOLDERS, model_id: tmp_path / "absent-model"}
    monkeypatch.setattr(environment, "EMBEDDED_FOLDERS", missing)
    with pytest.raises(ValueError) as error:
        default_runtime_factory(model_id)
    assert str(error.value).endswith(command) and str(tmp_path) not in str(error.value)


@needs_both
def test_each_embedded_id_loads_its_own_folder_and_world():
    for model_id, folder, world, size in (
        (EMBEDDED_V2_ID, EMBEDDED_MODEL_V2, "recap.embedded.scenes2", 96),
        (EMBEDDED_V1_ID, EMBEDDED_MODEL_V1, "recap.embedded.scenes", 64),
    ):
        runtime = default_runtime_factory(model_id)
        assert Path(runtime.target.name).resolve() == folder.resolve()
        assert embedded_world(runtime.target.name).__name__ == world
        assert examples(model_id) and all(_size(path) == (size, size) for path, _ in examples(model_id))
    assert embedded_world("Qwen/Qwen2.5-VL-7B-Instruct") is None


def _size(path: str) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as image:
        return image.size


# ----------------------------------------------------------------------------------- examples
def test_examples_and_replacement_scenes_come_from_the_chosen_models_folder():
    v2_rows = examples(EMBEDDED_V2_ID)
    assert v2_rows, "assets/examples-v2 holds no examples"
    listed = json.loads((EXAMPLES_V2_DIR / "prompts.json").read_text(encoding="utf-8"))
    assert [(Path(p).parent, Path(p).name, q) for p, q in v2_rows] == [
        (EXAMPLES_V2_DIR, e["image"], e["prompt"]) for e in listed
    ]
    assert examples() == v2_rows  # the default model's
    v1_rows = examples(EMBEDDED_V1_ID) + examples("some/hub-model")
    assert all(Path(p).parent == EXAMPLES_V1_DIR for p, _ in v1_rows)
    choice = Path(v2_rows[0][0]).name
    assert choice in other_image_choices() and other_image_choices()[0] == BLANK_IMAGE
    assert other_image(choice, None, EMBEDDED_V2_ID).size == (96, 96)  # v2's scene, not v1's namesake
    assert other_image(choice, None, EMBEDDED_V1_ID).size == (64, 64)
    assert other_image(BLANK_IMAGE, other_image(choice, None, EMBEDDED_V2_ID)).size == (96, 96)


def test_example_sets_follow_the_offered_models():
    sets = example_sets([EMBEDDED_V2_ID, EMBEDDED_V1_ID])
    assert list(sets) == [EMBEDDED_V2_ID, EMBEDDED_V1_ID]  # the default model's set first
    assert sets[EMBEDDED_V2_ID] == examples(EMBEDDED_V2_ID)
    assert list(example_sets([EMBEDDED_V1_ID, "org/hub-model", "org/other"])) == [EMBEDDED_V1_ID, OTHER_SET]


SETS = {
    EMBEDDED_V1_ID: [["/a/scene_1.png", "Where is the star?"], ["/a/scene_2.png", "What colour is it?"]],
    EMBEDDED_V2_ID: [["/b/scene_1.png", "Describe this scene."], ["/b/scene_2.png", "How many?"]],
}


@pytest.mark.parametrize(
    "model_id, image, prompt, swap",
    [
        # another model's example is replaced by the chosen model's first example
        (EMBEDDED_V2_ID, {"path": "/upload/x/scene_1.png", "orig_name": "scene_1.png"},
         "Where is the star?", EMBEDDED_V2_ID),
        (EMBEDDED_V1_ID, {"path": "/c/scene_2.png"}, "How many?", EMBEDDED_V1_ID),
        # an empty image slot is filled
        (EMBEDDED_V2_ID, None, "", EMBEDDED_V2_ID),
        # the chosen model's own example, a visitor's image or prompt: kept
        (EMBEDDED_V2_ID, {"orig_name": "scene_2.png"}, "How many?", None),
        (EMBEDDED_V2_ID, {"orig_name": "cat.png"}, "Where is the star?", None),
        (EMBEDDED_V2_ID, {"orig_name": "scene_1.png"}, "Where is the cat?", None),
        # a model without a set of its own, or a hostile value: nothing happens
        ("org/hub-model", None, "", None),
        ({"not": "a model"}, None, "", None),
        (EMBEDDED_V2_ID, 42, ["not", "text"], None),
    ],
)  # fmt: skip
def test_choosing_a_model_swaps_in_its_first_example_only_over_another_example(model_id, image, prompt, swap):
    assert swap_to(model_id, image, prompt, SETS) == swap


# ----------------------------------------------------------------------------------- memories
@needs_both
def test_v2s_shipped_memory_matches_its_model_and_build_record():
    target = Runtime.load(str(EMBEDDED_MODEL_V2)).target
    path = shipped_memory_for(target)
    assert path is not None and path.name == "tiny-scenes-llava-v2.safetensors", (
        "no shipped v2 memory: run python -m scripts.build_memory --model v2"
    )
    start = starting_memory(target, path, "shipped")
    assert start.origin == "shipped" and start.warm, "rebuild it: python -m scripts.build_memory --model v2"
    record = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    assert record["fingerprint"] == model_fingerprint(target) and record["world"] == "scenes2"
    assert record["tokens_known"] == start.tokens and record["vocab_size"] == target.vocab_size
    assert record["scene_seeds"][1] < scenes2.HELDOUT_SEED_START  # training scenes only
    assert "--model v2" in record["command"] and path.stat().st_size == record["bytes"] < 1 << 20


def test_v2_training_requests_never_draw_held_out_scenes_or_phrasings():
    requests = training_requests(scenes2, 12)
    seeds = [int(r.label.split()[2]) for r in requests]
    held_out = {e["seed"] for e in json.loads((EXAMPLES_V2_DIR / "prompts.json").read_text())}
    assert seeds == list(range(12)) and not held_out & set(seeds)
    assert [r.label.split("(")[1].rstrip(")") for r in requests[:6]] == list(scenes2.QUESTION_TYPES)
    training = {q for qs in scenes2.TRAINING_QUESTIONS.values() for q in qs}
    rephrased = {q for qs in scenes2.REPHRASED_QUESTIONS.values() for q in qs}
    # the prompts are training templates filled in, never a held-out phrasing
    assert all(r.prompt not in rephrased for r in requests)
    assert all(any(_fills(t, r.prompt) for t in training) for r in requests)
    assert all(r.images[0].size == (scenes2.IMAGE_SIZE,) * 2 for r in requests)
    with pytest.raises(ValueError, match="training scene seeds"):
        training_requests(scenes2, 2, first_seed=scenes2.HELDOUT_SEED_START - 1)


def _fills(template: str, prompt: str) -> bool:
    import re

    pattern = re.escape(template).replace(r"\{kind\}", r"\w+").replace(r"\{other\}", r"\w+")
    return re.fullmatch(pattern, prompt) is not None


@needs_both
def test_switching_models_keeps_each_models_own_session_memories():
    studio = Studio(default_runtime_factory, [EMBEDDED_V1_ID, EMBEDDED_V2_ID], cache=RuntimeCache())
    demo_session: dict = {}
    from recap.decode import generate
    from recap.drafters.recap.config import RecapConfig
    from recap.inputs import load_image
    from recap.studio.guard.validation import RunSettings
    from recap.studio.serving import drafter_for

    sizes = {}
    for model_id in (EMBEDDED_V1_ID, EMBEDDED_V2_ID, EMBEDDED_V1_ID):
        runtime = studio.runtime(model_id)
        settings = RunSettings(model_id, "recap", "fixed", 8, 8, 8, True, True, True, 12, SESSION_SCOPE)
        before = {m: len(v.persistent("recap", 8)) for m, v in demo_session.items()}
        drafter = drafter_for(runtime, settings, "recap", RecapConfig(budget=8), demo_session, studio.cache)
        image, prompt = examples(model_id)[0]
        generate(runtime.target, drafter, prompt, [load_image(image)], 12)
        state = demo_session[model_id]
        # each model's memory has its own vocabulary and started from its own shipped file
        assert state.persistent("recap", 8).vocab_size == runtime.target.vocab_size
        assert state.successors().vocab_size == runtime.target.vocab_size
        assert state.origin("recap", 8) == "shipped"
        # the other model's memory was not touched by this run
        assert {m: len(v.persistent("recap", 8)) for m, v in demo_session.items() if m != model_id} == {
            m: n for m, n in before.items() if m != model_id
        }
        sizes[model_id] = runtime.target.vocab_size
    assert sizes[EMBEDDED_V1_ID] != sizes[EMBEDDED_V2_ID]  # different tokenizers, never mixed
    assert studio.cache.start(EMBEDDED_V1_ID).path != studio.cache.start(EMBEDDED_V2_ID).path


# ------------------------------------------------------------------------- the first click (v2)
async def _updates(stream) -> list:
    """Every update of an async handler's stream (the Run handler's)."""
    return [update async for update in stream]


def _handler(demo, name: str):
    """The function the browser calls for an event, by its name (the demo's own closure)."""
    return next(fn for fn in demo.fns.values() if fn.fn is not None and fn.fn.__name__ == name)


@needs_both
def test_the_first_click_opens_on_v2_and_drafts_at_step_one(monkeypatch, idle_cost_curve):
    import app

    monkeypatch.delenv("RECAP_MODEL", raising=False)
    monkeypatch.delenv("RECAP_MODELS", raising=False)
    # (`idle_cost_curve`: the auto budget sizes trees from a curve recorded on an idle CPU, see conftest)
    demo = app.build_demo(cache=RuntimeCache())  # a fresh server offering the studio's own models
    run = _handler(demo, "run")
    follow = _handler(demo, "follow")
    page = {block: getattr(block, "value", None) for block in run.inputs}  # what the page shows at first
    image_box, prompt_box, model_box = run.inputs[0], run.inputs[1], run.inputs[2]
    # the page opens on v2 with v2's first example pre-filled
    first_image, first_prompt = examples(EMBEDDED_V2_ID)[0]
    assert page[model_box] == EMBEDDED_V2_ID
    assert page[image_box]["orig_name"] == Path(first_image).name and page[prompt_box] == first_prompt
    # choosing v1 (still offered) swaps in v1's first example; choosing v2 again brings v2's back
    updates = follow.fn(EMBEDDED_V1_ID, page[image_box], page[prompt_box])
    v1_image, v1_prompt = examples(EMBEDDED_V1_ID)[0]
    assert updates[image_box]["value"]["orig_name"] == Path(v1_image).name
    assert updates[prompt_box]["value"] == v1_prompt
    back = follow.fn(EMBEDDED_V2_ID, updates[image_box]["value"], v1_prompt)
    assert back[prompt_box]["value"] == first_prompt
    assert follow.fn("not-offered", None, "") == {} and follow.fn(["hostile"], None, "") == {}
    page[run.inputs[-2]] = 0  # no display delay (it only spaces out what the page shows)
    *_, final = asyncio.run(_updates(run.fn(*(page[block] for block in run.inputs[:-1]), {})))
    trace = next(v["trace"] for v in final.values() if isinstance(v, dict) and "trace" in v)
    assert isinstance(trace, RunTrace) and trace.settings["budget_mode"] == "auto"
    assert trace.settings["model"] == EMBEDDED_V2_ID
    assert len(trace.steps[1].nodes) >= 1, "v2's first click drafted nothing at step 1"
    mat = summarize(trace.steps).mat  # the page's "MAT (tokens a pass)" card
    assert mat >= 1.5, f"v2's first click: {mat:.2f} tokens per pass"
    session = next(v for v in final.values() if isinstance(v, dict) and EMBEDDED_V2_ID in v)
    assert session[EMBEDDED_V2_ID].origin("recap", 8) == "shipped"


@needs_both
def test_compare_warms_each_embedded_model_on_its_own_worlds_training_scenes():
    studio = Studio(default_runtime_factory, [EMBEDDED_V2_ID, EMBEDDED_V1_ID], cache=RuntimeCache())
    for model_id, size, qtypes in ((EMBEDDED_V2_ID, 96, 6), (EMBEDDED_V1_ID, 64, 4)):
        runtime = studio.runtime(model_id)
        requests = studio.warmup_requests(runtime)
        assert studio.warmup_source(runtime) == "training scenes"
        assert {r.images[0].size for r in requests} == {(size, size)}
        assert len({r.label.split("(")[1] for r in requests}) == qtypes  # every question type of its world

"""Hot start: the shipped memory, the files memories start from, every scope's own copy, the memory line,
the two resets, the CLI's default, the fair Compare warm-up and the story line above the strip.

The shipped memory's numbers are read from the file and its build record, never written here: the
embedded models will be retrained, and rebuilding the memory (``python -m scripts.build_memory --model
v1`` / ``v2``) must be all it takes. v1's shipped memory is checked here, v2's in test_studio_models.py;
the CLI's default (v2) starts from v2's.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import noise_image, tiny

from recap.decode import generate
from recap.drafters.recap.config import RecapConfig
from recap.drafters.token_recycling import SuccessorMatrix, TokenRecyclingDrafter, seed_successors
from recap.embedded import scenes, training_requests
from recap.hotstart import (
    EMPTY_START,
    SHIPPED_K,
    StartingMemory,
    shipped_memory_for,
    starting_memory,
    warm_up,
)
from recap.memory.fingerprint import model_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.memory.records import PredictionRecord
from recap.runtime import EMBEDDED_MODEL, EMBEDDED_MODEL_V1, Runtime
from recap.state import DrafterState
from recap.studio.environment import SESSION_SCOPE, SHARED_SCOPE, MemoryPlan, memory_plan
from recap.studio.serving import RuntimeCache, Studio, session_memories
from recap.studio.ui import render, story
from recap.trace import NodeRecord, StepRecord

EMBEDDED = (EMBEDDED_MODEL / "config.json").is_file() and (EMBEDDED_MODEL_V1 / "config.json").is_file()
needs_embedded = pytest.mark.skipif(not EMBEDDED, reason="the embedded models are not in assets/ yet")


@pytest.fixture(scope="module")
def embedded_v1():
    if not EMBEDDED:
        pytest.skip("the embedded models are not in assets/ yet")
    return Runtime.load(str(EMBEDDED_MODEL_V1))


@pytest.fixture(scope="module")
def tiny_memory_file(tmp_path_factory) -> Path:
    """A memory of the tiny LLaVA warmed on three requests, saved with its fingerprint."""
    target = tiny("llava")
    memory = PersistentMemory(target.vocab_size, SHIPPED_K)
    drafter = Runtime(target).drafter(
        "recap", config=RecapConfig(budget=8), state=DrafterState.given(target.vocab_size, memory)
    )
    for seed, prompt in enumerate(("the cat is", "a red square", "the cat is black")):
        generate(target, drafter, prompt, [noise_image(seed)], 12)
    path = tmp_path_factory.mktemp("memory") / "tiny.safetensors"
    memory.save(path, model_fingerprint(target))
    return path


def _rows(memory: PersistentMemory) -> dict[int, list[int]]:
    return {t: list(memory.lookup(t).ids) for t in range(memory.vocab_size) if memory.lookup(t) is not None}


# --------------------------------------------------------------------------------- the shipped memory
@needs_embedded
def test_v1s_shipped_memory_loads_for_it_and_matches_its_build_record(embedded_v1):
    path = shipped_memory_for(embedded_v1.target)
    assert path is not None and path.name == "tiny-scenes-llava.safetensors", (
        "no shipped v1 memory: run python -m scripts.build_memory --model v1"
    )
    start = starting_memory(embedded_v1.target, path, "shipped")
    assert start.origin == "shipped" and start.warm, "the shipped memory no longer matches the model"
    record = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    assert record["tokens_known"] == start.tokens == len(start.fresh(embedded_v1.target.vocab_size))
    assert record["fingerprint"] == model_fingerprint(embedded_v1.target)
    assert record["scene_seeds"][1] < scenes.HELDOUT_SEED_START  # training scenes only
    assert "--model v1" in record["command"]
    assert path.stat().st_size == record["bytes"] < 1 << 20  # small enough to ship


def test_training_requests_come_from_training_scenes_and_templates():
    requests = training_requests(scenes, 8)
    examples = json.loads((Path(__file__).parents[1] / "assets/examples/prompts.json").read_text())
    held_out = {e["seed"] for e in examples} | set(scenes.heldout_seeds(0, 200))
    seeds = [int(r.label.split()[2]) for r in requests]
    assert seeds == list(range(8)) and not held_out & set(seeds)
    # question types in turn, phrased like the training data (never the rephrased set)
    assert [r.label.split("(")[1].rstrip(")") for r in requests[:4]] == list(scenes.QUESTION_TYPES)
    rephrased = {q for qs in scenes.REPHRASED_QUESTIONS.values() for q in qs}
    assert all(r.prompt not in rephrased and len(r.images) == 1 for r in requests)
    with pytest.raises(ValueError, match="training scene seeds"):
        training_requests(scenes, 2, first_seed=scenes.HELDOUT_SEED_START - 1)


@needs_embedded
def test_build_memory_writes_a_loadable_memory_of_the_default_model_and_its_record(tmp_path):
    from scripts.build_memory import build

    out = tmp_path / "memory.safetensors"
    record = build(out=out, requests=3, budget=4, max_new_tokens=8)  # the default model: v2
    assert record["model"] == EMBEDDED_MODEL.name == "tiny-scenes-llava-v2" and record["world"] == "scenes2"
    target = Runtime.load(str(EMBEDDED_MODEL)).target
    start = starting_memory(target, out, "file")
    assert start.warm and start.tokens == record["tokens_known"] > 0
    assert record["scene_seeds"] == [0, 2] and record["bytes"] == out.stat().st_size
    assert json.loads(out.with_suffix(".json").read_text()) == record


def test_averaged_records_average_committed_positions_only():
    from recap.drafters.autoregressive import AutoregressiveDrafter
    from recap.drafters.base import Observation, RequestInfo
    from recap.hotstart import AveragedRecords
    from recap.tree import DraftTree
    from recap.verify import Acceptance

    averaged = AveragedRecords(AutoregressiveDrafter(), vocab_size=10, k=2)
    averaged.begin(RequestInfo((5,), frozenset(), 10))
    # after 5 the target said {7: 1.0} (the prefill's prompt position)
    averaged.observe(
        Observation([5], np.array([0]), topk_ids=np.array([[7, 1]]), topk_probs=np.array([[1.0, 0.0]]))
    )
    # a pass over [5, 7, 5]: its pending token (after 5: {8: 0.6, 7: 0.4}), an accepted node 9
    # (after 9: {3: 1.0}) and a rejected node 4 (after 4: {2: 1.0}, never committed: left out)
    tree = DraftTree()
    tree.add(9, -1)
    tree.add(4, -1)
    rows_ids = np.array([[8, 7], [3, 0], [2, 0]])
    rows_probs = np.array([[0.6, 0.4], [1.0, 0.0], [1.0, 0.0]])
    averaged.observe(
        Observation([5, 7, 5], np.array([2]), tree, rows_ids, rows_probs, Acceptance((0,), (9, 3)))
    )
    memory = averaged.memory()
    record = memory.lookup(5)
    assert list(record.ids) == [7, 8] and np.allclose(record.probs, [0.7, 0.3])
    assert list(memory.lookup(9).ids)[:1] == [3] and memory.lookup(4) is None
    assert averaged.record_k == 2 and len(memory) == 2


# ------------------------------------------------------------------------- files that do not load
def _another_models(path: Path) -> None:
    target = tiny("llava")
    PersistentMemory(target.vocab_size, SHIPPED_K).save(path, "llava:another-model")


def _other_k(path: Path) -> None:
    target = tiny("llava")
    PersistentMemory(target.vocab_size, 4).save(path, model_fingerprint(target))


@pytest.mark.parametrize(
    ("make", "note"),
    [
        (None, "missing"),  # no file at all
        (lambda path: path.write_bytes(b"\x00garbage"), "does not match this model or is damaged"),
        (_another_models, "does not match this model or is damaged"),
        (_other_k, "does not match this model or is damaged"),
    ],
    ids=["missing", "corrupt", "another-model", "other-k"],
)
def test_a_file_that_does_not_load_gives_a_cold_start_with_a_log_line(tmp_path, caplog, make, note):
    path = tmp_path / "memory.safetensors"
    if make is not None:
        make(path)
    before = path.read_bytes() if path.exists() else None
    with caplog.at_level(logging.WARNING, logger="recap"):
        start = starting_memory(tiny("llava"), path, "shipped")
    assert start.origin == "empty" and not start.warm and note in start.note and "cold start" in start.note
    assert any("empty memory" in r.getMessage() for r in caplog.records)
    assert (path.read_bytes() if path.exists() else None) == before  # never modified
    assert str(tmp_path) not in start.note  # what visitors read holds no server path


def test_a_retrained_model_does_not_load_the_old_models_memory(tmp_path, tiny_memory_file):
    import torch

    folders = []
    for shift in (0.0, 0.01):  # the same tokenizer and architecture, other weights
        target = tiny("llava")
        folder = tmp_path / f"model-{shift}"
        state = {k: v + shift for k, v in target.model.state_dict().items()}
        target.model.save_pretrained(folder, state_dict=state)
        target.processor.save_pretrained(folder)
        folders.append(folder)
    first, second = (Runtime.load(str(f), dtype=torch.float32).target for f in folders)
    assert first.fingerprint() == second.fingerprint()  # the tokenizer alone cannot tell them apart
    PersistentMemory(first.vocab_size, SHIPPED_K).save(tmp_path / "m.safetensors", model_fingerprint(first))
    assert starting_memory(first, tmp_path / "m.safetensors", "file").origin == "file"
    assert starting_memory(second, tmp_path / "m.safetensors", "file").origin == "empty"


# -------------------------------------------------------------------------- every scope, its own copy
def _studio(plan: MemoryPlan, model_id: str = "tiny-hot", scopes=(SESSION_SCOPE, SHARED_SCOPE)) -> Studio:
    return Studio(
        lambda _: Runtime(tiny("llava")), [model_id], cache=RuntimeCache(), scopes=scopes, plan=plan
    )


def test_every_scope_starts_from_its_own_copy_of_the_starting_memory(tiny_memory_file):
    studio = _studio(MemoryPlan(files={"tiny-hot": tiny_memory_file}))
    runtime = studio.runtime("tiny-hot")
    start = studio.cache.start("tiny-hot")
    saved = _rows(
        PersistentMemory.read(tiny_memory_file, model_fingerprint(runtime.target), runtime.target.vocab_size)
    )
    assert start.origin == "file" and start.tokens == len(saved) > 0
    vocab = runtime.target.vocab_size
    alice = session_memories({}, "tiny-hot", vocab, start)
    bob = session_memories({}, "tiny-hot", vocab, start)
    shared = studio.cache.shared_memories("tiny-hot", vocab)
    for state in (alice, bob, shared):
        assert _rows(state.persistent("recap", 8)) == saved and state.origin("recap", 8) == "file"
        # Token Recycling's matrix starts from the same records
        assert {t: state.successors().ids[t].tolist() for t in saved} == saved
    alice.persistent("recap", 8).write_many(np.array([0]), np.array([[5] * 8]), np.full((1, 8), 0.1))
    assert _rows(bob.persistent("recap", 8)) == saved and _rows(shared.persistent("recap", 8)) == saved
    # another k cannot use the file: an empty memory, and the memory line says why
    other = session_memories({}, "tiny-hot", vocab, start)
    assert len(other.persistent("recap", 4)) == 0 and other.origin("recap", 4) == "empty"


def test_tr_matrix_after_the_same_passes_holds_the_ids_of_recaps_records():
    # the claim seed_successors rests on: one stream of passes seen by RECAP and by TR
    target = tiny("llava")
    memory = PersistentMemory(target.vocab_size, 8)
    recap = Runtime(target).drafter(
        "recap", config=RecapConfig(budget=8), state=DrafterState.given(target.vocab_size, memory)
    )
    watched = TokenRecyclingDrafter(successors=SuccessorMatrix(target.vocab_size))

    class Both:
        name, record_k = "recap", 8

        def begin(self, request):
            recap.begin(request)
            watched.begin(request)

        def propose(self, context):
            return recap.propose(context)

        def observe(self, observation):
            recap.observe(observation)
            watched.observe(observation)

    for seed, prompt in enumerate(("the cat is", "what colour is the square?")):
        generate(target, Both(), prompt, [noise_image(seed)], 16)
    seeded = SuccessorMatrix(target.vocab_size)
    assert seed_successors(seeded, memory) == len(memory) > 0
    assert np.array_equal(seeded.ids, watched.successors.ids)


# ------------------------------------------------------------------------------ the memory line
@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (render.MemoryState("per session"), "loads with the model on your first run"),
        (
            render.MemoryState("per session", 84, 460, "shipped"),
            "warm</span>, 84 of 460 tokens known; started from the shipped memory",
        ),
        (
            render.MemoryState("process-wide", 0, 460, "empty"),
            '(process-wide): <span class="recap-cold">cold',
        ),
        (render.MemoryState("per session", 3, 460, "warm-up"), "started from a warm-up on the examples"),
        (
            render.MemoryState("per session", 84, 460, "shipped", contexts=1203),
            "84 of 460 tokens known, 1,203 2- and 3-token contexts; started",
        ),
        (render.MemoryState("per session", 0, 9, "empty", "a <b> note"), "<small>(a &lt;b&gt; note)</small>"),
    ],
)
def test_memory_line(state, expected):
    assert expected in render.memory_state_html(state)


def _reset(studio: Studio, name: str):
    """The handler of reset button ``name``, as `wire_reset` registers it."""
    from recap.studio.ui import handlers

    captured: dict = {}
    register = SimpleNamespace(click=lambda fn, *a, **k: captured.setdefault(k["api_name"], fn))
    ui = {**{n: register for n in handlers.RESETS}, "model": None, "scope": None, "memory": None}
    handlers.wire_reset(studio, ui, None)
    return captured[name]


def test_memory_state_and_the_two_resets(tiny_memory_file, monkeypatch):
    import gradio as gr

    from recap.studio.ui.handlers import memory_state

    told: list[str] = []
    monkeypatch.setattr(gr, "Info", told.append)
    studio = _studio(MemoryPlan(files={"tiny-hot": tiny_memory_file}))
    assert memory_state(studio, "tiny-hot", SESSION_SCOPE, {}).tokens is None  # not loaded yet
    runtime = studio.runtime("tiny-hot")
    vocab, start = runtime.target.vocab_size, studio.cache.start("tiny-hot")
    session: dict = {}
    state = memory_state(studio, "tiny-hot", SESSION_SCOPE, session)
    assert (state.tokens, state.vocab, state.origin) == (start.tokens, vocab, "file")
    memory = session_memories(session, "tiny-hot", vocab, start).persistent("recap", 8)
    memory.write_many(np.array([vocab - 1]), np.array([[1] * 8]), np.full((1, 8), 0.5))
    assert memory_state(studio, "tiny-hot", SESSION_SCOPE, session).tokens == start.tokens + 1
    before = memory_state(studio, "tiny-hot", SESSION_SCOPE, session).contexts
    session_memories(session, "tiny-hot", vocab, start).stream("recap", 8).context2.write(
        (1, 2), PredictionRecord([3], [0.9], 0.5)
    )
    assert memory_state(studio, "tiny-hot", SESSION_SCOPE, session).contexts == before + 1

    session, line = _reset(studio, "reset_empty")("tiny-hot", SESSION_SCOPE, session)
    assert memory_state(studio, "tiny-hot", SESSION_SCOPE, session).tokens == 0 and "cold" in line
    assert len(session_memories(session, "tiny-hot", vocab, start).persistent("recap", 8)) == 0

    session, line = _reset(studio, "reset")("tiny-hot", SESSION_SCOPE, session)
    assert f"{start.tokens} of {vocab} tokens known" in line
    assert told[:2] == [
        "This session's memories are empty (a cold start).",
        "This session's memories are back to the model's starting memory.",
    ]
    assert len(session_memories(session, "tiny-hot", vocab, start).persistent("recap", 8)) == start.tokens
    # the process-wide memory is never reset from a session, and its line shows its own count
    shared = studio.cache.shared_memories("tiny-hot", vocab).persistent("recap", 8)
    _reset(studio, "reset_empty")("tiny-hot", SHARED_SCOPE, session)
    assert memory_state(studio, "tiny-hot", SHARED_SCOPE, session).tokens == len(shared) > 0


def test_an_operator_file_that_does_not_load_shows_as_cold_with_the_reason(tmp_path):
    from recap.studio.ui.handlers import memory_state

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a memory")
    studio = _studio(MemoryPlan(files={"tiny-hot": bad}))
    studio.runtime("tiny-hot")
    state = memory_state(studio, "tiny-hot", SESSION_SCOPE, {})
    assert state.tokens == 0 and state.origin == "empty" and "damaged" in state.note


def test_hub_models_warm_up_on_the_examples_within_the_time_given():
    studio = _studio(MemoryPlan(warmup_s=600))
    studio.runtime("tiny-hot")
    start = studio.cache.start("tiny-hot")
    assert start.origin == "warm-up" and start.warm and "example request" in start.note
    # and the bound holds: a clock that advances 1 s per reading stops after the first pass
    target = tiny("llava")
    ticks = iter(range(1000))
    report = warm_up(
        target, Runtime(target).drafter("ar"), training_requests(scenes, 4), 8, 1.5, lambda: next(ticks)
    )
    assert report.started == 1 and report.tokens == 1


@pytest.mark.parametrize(
    ("env", "files", "warmup_s"),
    [
        ({}, {}, 0.0),  # a CPU: no warm-up by default
        ({"RECAP_MEMORY": "/data/m.safetensors"}, {"first": Path("/data/m.safetensors")}, 0.0),
        ({"RECAP_WARMUP_S": "30"}, {}, 30.0),
    ],
)
def test_memory_plan_from_the_environment(monkeypatch, env, files, warmup_s):
    monkeypatch.delenv("RECAP_MEMORY", raising=False)
    monkeypatch.delenv("RECAP_WARMUP_S", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plan = memory_plan(["first", "second"])
    assert plan.files == files and plan.warmup_s == warmup_s


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_warmup_setting_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("RECAP_WARMUP_S", value)
    with pytest.raises(ValueError, match="RECAP_WARMUP_S must be"):
        memory_plan(["first"])


def test_empty_start_is_cold():
    assert not EMPTY_START.warm and len(EMPTY_START.fresh(10)) == 0
    assert StartingMemory("file", Path("x"), 0).warm is False


# ----------------------------------------------------------------------------------------- the CLI
def _cli(capsys, *args):
    from recap.__main__ import main

    code = main(["generate", *map(str, args)])
    return code, capsys.readouterr().err


@needs_embedded
def test_cli_starts_from_the_default_models_shipped_memory_and_never_writes_it(capsys, tmp_path):
    path = EMBEDDED_MODEL.parents[1] / "memory" / "tiny-scenes-llava-v2.safetensors"  # v2, the default
    before = path.read_bytes()
    tokens = json.loads(path.with_suffix(".json").read_text())["tokens_known"]
    image = EMBEDDED_MODEL.parents[1] / "examples-v2" / "scene_1.png"
    common = ("--image", image, "--prompt", "What is in this picture?", "--max-new-tokens", 8)
    for method in ("recap", "tr"):
        code, err = _cli(capsys, *common, "--method", method)
        assert code == 0 and f"memory: shipped, {tokens} tokens known" in err
    code, err = _cli(capsys, *common, "--cold-start")
    assert code == 0 and "memory: empty (cold start)" in err
    code, err = _cli(capsys, *common, "--method", "ar")
    assert code == 0 and "memory:" not in err  # AR keeps no memory
    own = tmp_path / "mine.safetensors"
    code, err = _cli(capsys, *common, "--memory", own)
    assert code == 0 and "(new)" in err and own.exists()
    code, err = _cli(capsys, *common, "--memory", own, "--cold-start")
    assert code == 2 and "either --memory FILE or --cold-start" in err
    assert path.read_bytes() == before


# ------------------------------------------------------------------------------- the fair Compare
class RecordingRuntime(Runtime):
    """A runtime whose drafters log the prompt of every request they begin, by method."""

    def __init__(self, target) -> None:
        super().__init__(target)
        self.log: list[tuple[str, tuple[int, ...]]] = []

    def drafter(self, method="recap", **options):
        return Recorded(super().drafter(method, **options), method, self.log)


class Recorded:
    """A drafter that logs the prompt of every request it begins; copied whole, as the Compare tab copies a
    warmed drafter."""

    def __init__(self, inner, method: str, log: list) -> None:
        self.inner, self.method, self.log = inner, method, log
        self.name, self.record_k = inner.name, inner.record_k

    def begin(self, request):
        self.log.append((self.method, request.prompt_tokens))
        self.inner.begin(request)

    def propose(self, context):
        return self.inner.propose(context)

    def observe(self, observation):
        self.inner.observe(observation)

    def __deepcopy__(self, memo):
        return Recorded(copy.deepcopy(self.inner, memo), self.method, self.log)  # one log for all


def test_compare_warms_every_method_with_memories_on_the_same_requests(tmp_path):
    import app
    from recap.studio.serving import COMPARE_WARMUP
    from recap.studio.ui.examples import EXAMPLES_V1_DIR, OTHER_SET, examples
    from recap.studio.ui.measure import DEVICE, EQUAL, REPEATS

    runtime = RecordingRuntime(tiny("llava"))
    demo = app.build_demo(runtime_factory=lambda _: runtime, models=["tiny-recorded"], cache=RuntimeCache())
    compare = next(fn.fn for fn in demo.fns.values() if fn.api_name == "compare")
    rows = examples(OTHER_SET)  # the examples a model that is not embedded is shown (v1's scenes)
    image, prompt = rows[0] if rows else (None, "the cat is")
    settings = [
        "tiny-recorded",
        "recap",
        "fixed",
        8,
        8,
        8,
        True,
        True,
        True,
        6,
        SESSION_SCOPE,
        0.0,
        0,
        1.0,
        None,
    ]
    *_, final = compare({"path": image} if image else None, prompt, *settings, EQUAL)
    state = next(v for v in final.values() if isinstance(v, dict) and "runs" in v)
    assert image is None or Path(image).is_relative_to(EXAMPLES_V1_DIR)
    seen: dict[str, list] = {}
    for method, tokens in runtime.log:
        seen.setdefault(method, []).append(tokens)
    timed = seen["ar"][-1]  # every method's last request is the compared input
    # every method with memories: one warm-up on the same requests, then the compared input once per
    # repeat, each repeat from a copy of the warmed drafter
    count = len(state["warmup"])
    assert 0 < count <= COMPARE_WARMUP
    warm_up = seen["recap"][:count]
    for method in [m for m in ("tr", "suffix", "recap") if m in seen]:
        assert seen[method] == warm_up + [timed] * REPEATS, method
    assert image is None or f"example {Path(image).name}" not in state["warmup"]  # never this input
    assert seen["pld"] == [timed] * REPEATS  # no warm-up for a method without memories
    assert seen["ar"] == [timed] * (REPEATS + 1)  # AR's one short untimed run first
    status = next(v for v in final.values() if isinstance(v, str) and v.startswith("Done"))
    assert "warmed on the same" in status and "not this input" in status
    # a second click with the same settings copies the kept warmed drafters: no warm-up, same trees
    runtime.log.clear()
    *_, again = compare({"path": image} if image else None, prompt, *settings, EQUAL)
    second = next(v for v in again.values() if isinstance(v, dict) and "runs" in v)
    seen = {}
    for method, tokens in runtime.log:
        seen.setdefault(method, []).append(tokens)
    assert all(requests == [timed] * REPEATS for m, requests in seen.items() if m != "ar"), seen
    for method, steps in state["runs"].items():
        assert [s.new_tokens for s in second["runs"][method]] == [s.new_tokens for s in steps]
        assert [len(s.nodes) for s in second["runs"][method]] == [len(s.nodes) for s in steps], method
    # another budget choice is another warm-up
    runtime.log.clear()
    for _ in compare({"path": image} if image else None, prompt, *settings, DEVICE):
        pass
    assert [tokens for m, tokens in runtime.log if m == "recap"][:count] == warm_up


def test_kept_warm_drafters_are_bounded_and_least_recently_used_go_first():
    from recap.studio.ui import compare

    runtime = Runtime(tiny("llava"))
    for index in range(compare.WARMED_KEPT + 2):
        compare.keep_warm(runtime, ("tr", index), f"drafter {index}")
    assert compare.kept_warm(runtime, ("tr", 0)) is None and compare.kept_warm(runtime, ("tr", 1)) is None
    assert compare.kept_warm(runtime, ("tr", 2)) == "drafter 2"  # used: now the most recent
    compare.keep_warm(runtime, ("tr", "new"), "drafter new")
    assert compare.kept_warm(runtime, ("tr", 2)) == "drafter 2"
    assert compare.kept_warm(runtime, ("tr", 3)) is None
    assert compare.kept_warm(Runtime(tiny("llava")), ("tr", 2)) is None  # another model's runtime


def test_kept_warm_drafters_go_with_their_models_runtime():
    # a kept drafter must not hold its runtime (RECAP's auto budget keeps the device's cost model): an
    # evicted model would stay in memory through it
    import gc
    import weakref

    from recap.drafters.recap.config import RecapConfig
    from recap.studio.serving import fresh_drafter
    from recap.studio.ui import compare

    runtime = Runtime(tiny("llava"))
    for method, budget in (("recap", "auto"), ("tr", 80)):
        compare.keep_warm(runtime, (method,), fresh_drafter(runtime, method, RecapConfig(budget=budget)))
    assert compare.kept_warm(runtime, ("recap",)) is not None
    alive = weakref.ref(runtime)
    del runtime
    gc.collect()
    assert alive() is None


def test_kept_warm_drafters_never_hold_the_visitors_input():
    import app
    from recap.drafters.suffix_decoding import suffix_decoding_available
    from recap.studio.ui import compare
    from recap.studio.ui.examples import OTHER_SET, examples
    from recap.studio.ui.measure import EQUAL

    runtime = Runtime(tiny("llava"))
    demo = app.build_demo(runtime_factory=lambda _: runtime, models=["tiny-kept"], cache=RuntimeCache())
    demo.studio.compare_warmup = 2
    handler = next(fn.fn for fn in demo.fns.values() if fn.api_name == "compare")
    prompt = "zebra quokka narwhal"
    settings = ["tiny-kept", "recap", "fixed", 8, 8, 8, True, True, True, 4, SESSION_SCOPE, 0.0, 0, 1.0, None]
    *_, final = handler({"path": str(examples(OTHER_SET)[0][0])}, prompt, *settings, EQUAL)
    run = next(v for v in final.values() if isinstance(v, dict) and "runs" in v)
    assert "zebra" in run["prompt"]  # the input did run, on copies
    kept = {key[0]: drafter for key, drafter in compare._WARMED[runtime].items()}
    assert kept["recap"].persistent.next_request() == 2  # it numbered the 2 warm-up requests only
    assert kept["tr"].successors.ids.any()  # warmed
    if suffix_decoding_available():
        log = kept["suffix"].cache._log
        prompts = [runtime.target.decode(tokens) for call, _, tokens in log if call == "start"]
        assert len(prompts) == 2 and not any("zebra" in text for text in prompts)  # the warm-up's


@pytest.mark.parametrize("method", ["tr", "suffix", "recap"])
def test_a_copied_warm_drafter_drafts_the_same_trees_and_learns_on_its_own(method):
    """The Compare tab warms every method once and starts every repeat from a copy of the warmed drafter
    (`fresh_drafter`: SuffixDecoding's cache replayable): each copy must draft exactly the trees the
    warmed drafter would, and what one learns must not reach another."""
    from recap.decode import generate
    from recap.drafters.recap.config import RecapConfig
    from recap.drafters.suffix_decoding import suffix_decoding_available
    from recap.studio.serving import fresh_drafter

    if method == "suffix" and not suffix_decoding_available():
        pytest.skip("SuffixDecoding's package is not installed (scripts/install_suffix.sh)")
    target = tiny("llava")
    drafter = fresh_drafter(Runtime(target), method, RecapConfig(budget=16))
    images = [noise_image(1)]
    for prompt in ("the cat is", "a dog and a cat", "the cat is on the"):  # the warm-up
        generate(target, drafter, prompt, images, 10)
    first, second = copy.deepcopy(drafter), copy.deepcopy(drafter)
    memory = {"tr": "successors", "suffix": "cache", "recap": "persistent"}[method]
    owned = [id(getattr(d, memory)) for d in (drafter, first, second)]
    assert len(set(owned)) == 3

    def trees(d, prompt):
        steps = generate(target, d, prompt, images, 10).steps
        return [(s.new_tokens, [n.token for n in s.nodes]) for s in steps]

    shown = trees(drafter, "the cat is on")  # what the warmed drafter drafts (and it learns from it)
    trees(drafter, "a dog on the cat")  # the original learns something else
    assert trees(first, "the cat is on") == shown
    assert trees(second, "the cat is on") == shown  # nor did the first copy's request reach it


def test_a_copied_recap_drafter_does_not_compile_the_search_again():
    # the search's settings hold read-only arrays: a writable copy is another type to numba, and the
    # first pass of a copy in a fresh server paid seconds of compiling inside a timed repeat
    from recap.decode import generate
    from recap.drafters.recap.config import RecapConfig
    from recap.drafters.recap.kernel import grow_tree
    from recap.studio.serving import fresh_drafter

    target = tiny("llava")
    drafter = fresh_drafter(Runtime(target), "recap", RecapConfig(budget=16))
    generate(target, drafter, "the cat is", [noise_image(1)], 6)
    compiled = list(grow_tree.signatures)
    twin = copy.deepcopy(drafter)
    generate(target, twin, "the cat is", [noise_image(1)], 6)
    assert twin._search is drafter._search and list(grow_tree.signatures) == compiled
    with pytest.raises(TypeError, match=r"use copy\.deepcopy"):
        copy.copy(drafter.persistent)  # a shallow copy would share its records under another lock


def test_the_compare_warm_up_is_as_long_as_the_studio_says():
    # scripts.compare_story --warmup N sets it: the story's counts move with the warm-up (docs/studio.md)
    import app
    from recap.studio.ui.measure import EQUAL

    runtime = RecordingRuntime(tiny("llava"))
    demo = app.build_demo(runtime_factory=lambda _: runtime, models=["tiny-recorded"], cache=RuntimeCache())
    demo.studio.compare_warmup = 2
    compare = next(fn.fn for fn in demo.fns.values() if fn.api_name == "compare")
    settings = ["tiny-recorded", "recap", "fixed", 8, 8, 8, True, True, True, 2, SESSION_SCOPE, 0.0, 0, 1.0]
    from recap.studio.ui.examples import OTHER_SET, examples

    image, prompt = examples(OTHER_SET)[0]
    *_, final = compare({"path": image}, prompt, *settings, None, EQUAL)
    state = next(v for v in final.values() if isinstance(v, dict) and "runs" in v)
    assert len(state["warmup"]) == 2


# ------------------------------------------------------------------------------------- the story line
def _node(i, parent, token, text, sources=("template",), accepted=False):
    return NodeRecord(i, parent, token, text, 1 if parent < 0 else 2, 0.5, list(sources), {}, accepted)


def _step(step, tokens, texts, sources, nodes=(), accepted=()):
    return StepRecord(
        step, 0, "x", nodes=list(nodes), accepted_ids=list(accepted), new_tokens=list(tokens),
        new_texts=list(texts), new_sources=list(sources), bonus_token=tokens[-1],
    )  # fmt: skip


#: The answer « The» « red» « circle» « here»; AR: one token per pass.
TEXTS = [" The", " red", " circle", " here"]
AR = [_step(i, [i + 1], [TEXTS[i]], ["target"]) for i in range(4)]
#: TR: step 1 drafted « blue» under the root (rejected: « red» is the bonus), step 2 drafted « circle»
#: (accepted) then « here» is the bonus under a leaf (nothing drafted there).
TR = [
    _step(0, [1], [" The"], ["target"]),
    _step(1, [2], [" red"], ["target"], [_node(0, -1, 9, " blue")]),
    _step(2, [3, 4], [" circle", " here"], ["template", "target"], [_node(0, -1, 3, " circle")], [0]),
]
#: RECAP: step 1 drafted « red» (ctx2, accepted) and « circle» (ctx3, accepted), bonus « here».
RECAP = [
    _step(0, [1], [" The"], ["target"]),
    _step(
        1,
        [2, 3, 4],
        [" red", " circle", " here"],
        ["ctx2", "ctx3", "target"],
        [_node(0, -1, 2, " red", ("ctx2", "persistent")), _node(1, 0, 3, " circle", ("ctx3",))],
        [0, 1],
    ),
]
LABELS = {"ar": "AR", "tr": "TR", "recap": "RECAP"}


@pytest.mark.parametrize(
    ("steps", "outcomes"),
    [
        (AR, ["none"] * 4),
        (TR, ["none", "rejected", "accepted", "none"]),
        (RECAP, ["none", "accepted", "accepted", "none"]),
    ],
    ids=["ar", "tr", "recap"],
)
def test_token_drafts(steps, outcomes):
    assert [d.outcome for d in story.token_drafts(steps)] == outcomes


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # « red» and « circle» depend on the image: TR had one accepted draft there (« circle») and
        # drafted at both; RECAP both; TR's « blue» was rejected where RECAP's ctx2 « red» was accepted
        (
            [False, True, True, False],
            "At the 2 tokens of this answer that depend on the image, RECAP accepted more drafts than TR "
            "(2 against 1). At «red», TR looked up the last token «The» alone and drafted «blue»; RECAP's "
            "draft came from its 2-token key.\n\n"
            "2 of the 3 tokens after the first depend on the image (the greedy token changes when the "
            "image is replaced by a blank one). Accepted drafts there (drafted there): "
            "TR 1 (2), RECAP 2 (2). Accepted there "
            "at a pass's first draft, where a tree offers its widest fan: TR 1 of 2, RECAP 1 of 1; after "
            "accepted drafts of the same pass, deeper in the tree: TR none met there, RECAP 1 of 1. "
            "RECAP's draft was accepted where TR's was not at «red» (from its contextual memory: «red»).",
        ),
        # only « circle»: both accepted a draft, so no token is named
        (
            [False, False, True, False],
            "At the one token of this answer that depends on the image, RECAP and TR accepted as many "
            "drafts (1).\n\n"
            "1 of the 3 tokens after the first depend on the image (the greedy token changes when the "
            "image is replaced by a blank one). Accepted drafts there (drafted there): "
            "TR 1 (1), RECAP 1 (1). Accepted there "
            "at a pass's first draft, where a tree offers its widest fan: TR 1 of 1, RECAP none met there; "
            "after accepted drafts of the same pass, deeper in the tree: TR none met there, RECAP 1 of 1. "
            "TR and RECAP accepted drafts at the same ones.",
        ),
        # the first token never counts
        (
            [True, False, False, False],
            "0 of the 3 tokens after the first depend on the image (the greedy token changes when the "
            "image is replaced by a blank one). So no drafter can be told apart by the image here: try "
            "another example.",
        ),
    ],
)
def test_story_line_on_hand_checked_runs(flags, expected):
    assert story.story_line({"ar": AR, "tr": TR, "recap": RECAP}, flags, LABELS) == expected


@pytest.mark.parametrize(
    ("steps", "depths"),
    [(AR, [0, 0, 0, 0]), (TR, [0, 0, 0, 1]), (RECAP, [0, 0, 1, 2])],
    ids=["ar", "tr", "recap"],
)
def test_token_depths_count_the_drafts_the_pass_accepted_before(steps, depths):
    assert story.token_depths(steps) == depths


def test_story_line_says_whether_the_memories_held_the_image_dependent_tokens():
    from recap.bench.coverage import PositionCoverage as At

    coverage = {
        "tr": [None, At(("successors",), False, True, True), At((), False, True, False), None],
        "recap": [None, At(("ctx2",), True, True, True), At(("ctx3", "ctx2"), False, True, False), None],
    }
    line = story.story_line({"ar": AR, "tr": TR, "recap": RECAP}, [False, True, True, False], LABELS,
                            coverage=coverage)  # fmt: skip
    assert (
        "A memory already held the token there: TR 1 of 2, RECAP 2 of 2 (1 from this image's own records); "
        "1 of 2 were first mentions (the answer had not yet said the two tokens before it)" in line
    )
    one = story.story_line({"ar": AR, "tr": TR, "recap": RECAP}, [False, True, False, False], LABELS,
                           coverage=coverage)  # fmt: skip
    assert "TR 1 of 1, RECAP 1 of 1 (1 from this image's own records); that token was a first mention" in one


#: RECAP loses « circle»: it accepted ctx2's « red», then its « square» was rejected (« circle» the bonus).
RECAP_LOSES = [
    _step(0, [1], [" The"], ["target"]),
    _step(
        1, [2, 3], [" red", " circle"], ["ctx2", "target"],
        [_node(0, -1, 2, " red", ("ctx2",)), _node(1, 0, 8, " square", ("ctx3",))], [0],
    ),
    _step(2, [4], [" here"], ["target"]),
]  # fmt: skip


def test_story_line_says_who_won_on_this_input_and_names_both_sides():
    line = story.story_line({"ar": AR, "tr": TR, "recap": RECAP_LOSES}, [False, True, True, False], LABELS)
    assert line.startswith("At the 2 tokens of this answer that depend on the image, RECAP and TR accepted "
                           "as many drafts (1).")  # fmt: skip
    assert "TR 1 (2), RECAP 1 (2). Accepted there" in line
    assert line.endswith(  # 1 won and 1 lost: as many
        "RECAP's draft was accepted where TR's was not at «red» (from its contextual memory: «red»); "
        "TR's draft was accepted where RECAP's was not at «circle»."
    )
    runs = {"ar": AR, "tr": TR, "recap": RECAP_LOSES}
    only_tr = story.story_line(runs, [False, False, True, False], LABELS)
    assert "that depends on the image, TR accepted more drafts than RECAP (1 against 0)." in only_tr
    assert only_tr.endswith("deeper in the tree: TR none met there, RECAP 0 of 1. TR's draft was "
                            "accepted where RECAP's was not at «circle».")  # fmt: skip
    neither = story.story_line(runs, [False, False, False, True], LABELS)
    assert neither.endswith("Neither TR nor RECAP accepted a draft at any of them.")


def test_story_html_escapes_once():
    assert story.story_html("a <b> & «x»") == '<p class="recap-story">a &lt;b&gt; &amp; «x»</p>'

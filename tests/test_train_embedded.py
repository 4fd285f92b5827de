"""The training pipeline of the embedded model: packed sequences, patch and binding targets, the losses,
and a few real training steps that save a folder plain transformers loads."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recap.embedded import scenes, scenes2
from training import data as ed
from training import evaluate as ee
from training import train as te
from training.phrasings import EXTRA_TRAINING_QUESTIONS

NUM_IMAGE_TOKENS = ed.WORLDS["v1"].num_image_tokens
MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-scenes-llava"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(MODEL_DIR)


def test_first_turn_is_exactly_the_inference_prompt(processor):
    builder = ed.SequenceBuilder(processor.tokenizer)
    question, answer = "What colour is the star?", "The star is red."
    ids, labels, _ = builder.build([(question, answer)])
    image = scenes.render_scene(scenes.scene_from_seed(3))
    prompt = processor(images=image, text=ee.prompt_text(processor, question), return_tensors="pt")
    prompt_ids = prompt["input_ids"][0].tolist()
    assert ids[: len(prompt_ids)] == prompt_ids
    assert processor.tokenizer.decode(ids[len(prompt_ids) :]) == " " + answer + ed.EOS
    assert all(lab == -100 for lab in labels[: len(prompt_ids)])
    assert labels[len(prompt_ids) :] == ids[len(prompt_ids) :]
    assert (
        ids[builder.image_offset : builder.image_offset + NUM_IMAGE_TOKENS]
        == [processor.tokenizer.convert_tokens_to_ids(ed.IMAGE)] * NUM_IMAGE_TOKENS
    )
    assert ids[builder.image_offset - 1] != ids[builder.image_offset]


def test_focus_marks_the_positions_that_predict_answer_tokens_about_a_shape(tokenizer):
    builder = ed.SequenceBuilder(tokenizer)
    rng = np.random.default_rng(0)
    scene = scenes.scene_from_seed(2)
    assert scene.count == 3
    qtypes = ("colour", "count", "position", "describe")
    turns = [scenes.make_question(scene, q, rng) for q in qtypes]
    spans = [ed.binding_spans(scene, q, question, a, "mentions") for q, (question, a) in zip(qtypes, turns)]
    ids, labels, focus = builder.build(turns, spans)
    assert len(ids) == len(labels) == len(focus)
    predicts_answer = [t for t in range(len(ids) - 1) if labels[t + 1] != -100]
    assert set(t for t, f in enumerate(focus) if f) <= set(predicts_answer)
    # Split the answer-predicting positions by turn: each turn's run ends with the one predicting eos.
    runs, run = [], []
    for t in predicts_answer:
        run.append(t)
        if ids[t + 1] == tokenizer.eos_token_id:
            runs.append(run)
            run = []
    assert len(runs) == len(turns)
    kinds = [s.kind for s in scene.shapes]
    for qtype, (question, answer), positions in zip(qtypes, turns, runs):
        assert tokenizer.decode([ids[t + 1] for t in positions]) == " " + answer + ed.EOS
        if qtype in ("colour", "position"):  # every token, eos included, is about the asked shape
            asked = kinds.index(scenes.question_target(question)) + 1
            assert [focus[t] for t in positions] == [asked] * len(positions)
        else:  # each shape phrase is about its shape, the rest about none
            for shape_id, shape in enumerate(scene.shapes, start=1):
                words = tokenizer.decode([ids[t + 1] for t in positions if focus[t] == shape_id])
                assert shape.colour in words and shape.kind in words
                if qtype == "describe":
                    assert shape.position in words
            assert focus[positions[0]] == 0 and focus[positions[-1]] == 0
    asked_only = [ed.binding_spans(scene, q, question, a, "asked") for q, (question, a) in zip(qtypes, turns)]
    assert asked_only[1] == asked_only[3] == []
    assert builder.build(turns, asked_only)[:2] == (ids, labels)
    assert not any(builder.build(turns)[2])
    with pytest.raises(ValueError, match="attn_scope"):
        ed.binding_spans(scene, "count", *turns[1], "everything")


def test_patch_targets_follow_the_drawn_shapes():
    scene = scenes.scene_from_seed(5)
    targets = ed.patch_targets(scene)
    index = scenes.shape_index_map(scene)
    assert set(targets) == {"shape", "colour", "kind", "size", "cell"}
    for patch in range(NUM_IMAGE_TOKENS):
        row, col = divmod(patch, scenes.IMAGE_SIZE // 8)
        block = index[row * 8 : row * 8 + 8, col * 8 : col * 8 + 8]
        shape = targets["shape"][patch]
        if shape == 0:
            assert targets["colour"][patch] == 0
            continue
        assert (block == shape).sum() >= 6
        s = scene.shapes[shape - 1]
        assert targets["colour"][patch] == list(scenes.COLOURS).index(s.colour) + 1
        assert targets["kind"][patch] == scenes.KINDS.index(s.kind) + 1
        assert targets["cell"][patch] == s.cell + 1
    assert set(np.unique(targets["shape"])) == set(range(scene.count + 1))


def test_binding_targets_point_at_the_asked_shape(tokenizer):
    builder = ed.SequenceBuilder(tokenizer)
    batch = ed.sample_batch(np.random.default_rng(1), builder, 16)
    n, length = batch["input_ids"].shape
    assert batch["attn_target"].shape == (n, length, NUM_IMAGE_TOKENS)
    rows = batch["attn_target"].any(-1)
    assert rows.any()
    labels = batch["labels"]
    for i in range(n):
        text = tokenizer.decode(batch["input_ids"][i][batch["attention_mask"][i].bool()])
        for t in rows[i].nonzero().flatten().tolist():
            assert labels[i, t + 1] != -100  # only positions that predict an answer token
        # The supervised answers ask about one shape: its kind names the cells the target marks.
        for t in rows[i].nonzero().flatten().tolist()[:1]:
            patches = batch["attn_target"][i, t].nonzero().flatten()
            kinds = batch["aux"]["kind"][i, patches].unique().tolist()
            assert len(kinds) == 1 and kinds[0] > 0
            assert scenes.KINDS[kinds[0] - 1] in text
    # Describe and count answers are not supervised: every supervised answer names a colour or a place.
    assert rows.sum() < (labels != -100).sum()


def test_attention_loss_rewards_attending_to_the_target():
    n, length, offset = 2, 80, 3
    target = torch.zeros(n, length, NUM_IMAGE_TOKENS, dtype=torch.bool)
    target[0, 70, [5, 6]] = True
    target[1, 75, [40]] = True

    def attentions(on_target: bool):
        weights = torch.full((n, 4, length, length), 1.0 / length)
        if on_target:
            weights = torch.zeros(n, 4, length, length)
            weights[..., 0] = 1.0  # rows without a target: anywhere
            for b, t in target.any(-1).nonzero().tolist():
                weights[b, 0, t, :] = 0.0
                weights[b, 0, t, offset : offset + NUM_IMAGE_TOKENS] = target[b, t] / target[b, t].sum()
        return tuple(weights for _ in range(4))

    good = te.attention_loss(attentions(True), (1, 2), target, offset)
    uniform = te.attention_loss(attentions(False), (1, 2), target, offset)
    assert good.item() < 1e-4
    expected = -(np.log(2 / length) + np.log(1 / length)) / 2
    assert uniform.item() == pytest.approx(expected, rel=1e-4)
    empty = te.attention_loss(attentions(False), (1,), torch.zeros_like(target), offset)
    assert empty.item() == 0.0


def test_the_lead_weight_counts_the_first_tokens_of_every_answer_more():
    # Two answers in one row (5 tokens + eos, then 2 + eos), one in the next; -100 elsewhere.
    labels = torch.tensor(
        [
            [-100, -100, 5, 6, 7, 8, 9, 2, -100, -100, 9, 10, 2],
            [-100, 4, 4, 2, -100, -100, -100, -100, -100, -100, -100, -100, -100],
        ]
    )
    lead = te.lead_mask(labels, 3)
    assert lead[0].nonzero().flatten().tolist() == [2, 3, 4, 10, 11, 12]
    assert lead[1].nonzero().flatten().tolist() == [1, 2, 3]
    assert not (lead & (labels == -100)).any()
    torch.manual_seed(0)
    logits = torch.randn(labels.numel(), 16)
    flat = labels.flatten()
    plain = te.answer_loss(logits, labels, te.TrainConfig())
    assert plain.item() == pytest.approx(torch.nn.functional.cross_entropy(logits, flat).item())
    per_token = torch.nn.functional.cross_entropy(logits, flat, reduction="none")
    answer, lead_flat = flat != -100, lead.flatten()
    expected = (per_token[answer].sum() + 2.0 * per_token[lead_flat].sum()) / answer.sum()
    weighted = te.answer_loss(logits, labels, te.TrainConfig(lead_weight=3.0, lead_tokens=3))
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-6)
    assert weighted.item() != pytest.approx(plain.item())


def test_a_few_training_steps_save_a_plain_llava(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    cfg = te.TrainConfig(steps=3, batch=4, warmup=1, attn_weight=1.0, threads=1)
    te.train(tmp_path, cfg)
    processor = AutoProcessor.from_pretrained(tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert model.config.text_config._attn_implementation != "eager"
    assert not any("head" in name and "lm_head" not in name for name, _ in model.named_parameters())
    image = scenes.render_scene(scenes.scene_from_seed(1))
    answers = ee.generate_answers(processor, model, [image], ["Describe the image."], max_new_tokens=4)
    assert len(answers) == 1


def test_training_is_reproducible(tmp_path):
    """Same config and seed give bit-identical weights (what lets the model card's command reproduce the
    shipped model); another seed gives other weights."""
    from safetensors.torch import load_file

    weights = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        cfg = te.TrainConfig(steps=2, batch=3, warmup=1, attn_weight=1.0, attn_scope="mentions", seed=seed)
        te.train(tmp_path / name, cfg)
        weights.append(load_file(tmp_path / name / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


# -------------------------------------------------------------------------------------------- world v2
V2 = ed.WORLDS["v2"]


@pytest.fixture(scope="module")
def v2_tokenizer():
    return ed.build_tokenizer(V2)


#: The comparison, run in a fresh interpreter (as a training run is): if anything stalls, faulthandler
#: prints every thread's stack and exits, so a failure says where instead of only timing out.
WORKERS_SCRIPT = """
import faulthandler
faulthandler.dump_traceback_later(150, exit=True)
import numpy as np
from training import data as ed
from training.batch_stream import BatchStream
from training.phrasings import EXTRA_TRAINING_QUESTIONS
V2 = ed.WORLDS["v2"]
builder = ed.SequenceBuilder(ed.build_tokenizer(V2), V2.num_image_tokens)
world = V2.with_extra_questions(EXTRA_TRAINING_QUESTIONS, 0.5)  # the workers get the extras too
streams = [BatchStream(np.random.default_rng(5), world, builder, 4, "mentions", workers=w) for w in (0, 2)]
try:
    for _ in range(3):
        a, b = (next(s) for s in streams)
        for key in ("input_ids", "labels", "attention_mask", "pixels", "attn_target"):
            assert np.array_equal(a[key], b[key]), key
        assert all(np.array_equal(a["aux"][k], b["aux"][k]) for k in a["aux"])
    print("same batches", flush=True)
    streams[1].workers[0][0].kill()  # a worker dies: the stream raises instead of waiting forever
    try:
        for _ in range(streams[1].prefetch + 1):  # batches it finished before dying may still arrive
            next(streams[1])
    except RuntimeError as error:
        print("raised:", error, flush=True)
finally:
    for s in streams:
        s.close()
"""


def test_batches_built_by_workers_equal_batches_built_in_process():
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", WORKERS_SCRIPT], cwd=root, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "same batches"
    assert lines[1].startswith("raised: a batch worker died (exit code -9)"), result.stdout


def test_v2_binding_targets_point_at_the_shape_the_answer_names(v2_tokenizer):
    builder = ed.SequenceBuilder(v2_tokenizer, V2.num_image_tokens)
    batch = ed.sample_batch(np.random.default_rng(2), builder, 12, "mentions", V2)
    assert batch["pixel_values"].shape[-2:] == (96, 96)
    assert batch["attn_target"].shape[-1] == V2.num_image_tokens == 64
    rows = batch["attn_target"].any(-1)
    labels = batch["labels"]
    assert rows.any() and rows.sum() < (labels != -100).sum()
    for i in range(len(labels)):
        text = v2_tokenizer.decode(batch["input_ids"][i][batch["attention_mask"][i].bool()])
        for t in rows[i].nonzero().flatten().tolist():
            assert labels[i, t + 1] != -100  # only positions that predict an answer token
            patches = batch["attn_target"][i, t].nonzero().flatten()
            kinds = batch["aux"]["kind"][i, patches].unique().tolist()
            assert len(kinds) == 1 and kinds[0] > 0
            assert scenes2.KINDS[kinds[0] - 1] in text


@pytest.mark.parametrize(
    ("world", "size", "extra"),
    [("v1", 64, {}), ("v2", 96, {"hidden": 64, "mlp": 128, "vision_hidden": 32, "workers": 1})],
)
def test_a_few_steps_of_each_world_save_a_plain_llava(tmp_path, world, size, extra):
    cfg = te.TrainConfig(
        world=world, steps=2, batch=3, warmup=1, attn_weight=1.0, attn_scope="mentions", **extra
    )
    summary = te.train(tmp_path, cfg)
    assert summary["steps_done"] == 2 and set(summary["losses"]) == {"lm", "aux", "attn"}
    processor, model = ee.load(tmp_path)
    assert model.config.vision_config.image_size == size and ee.world_of(model).name == world
    assert model.config.text_config._attn_implementation == "sdpa"
    assert not any("heads." in name for name, _ in model.named_parameters())
    image = ed.WORLDS[world].scenes.render_scene(ed.WORLDS[world].scenes.scene_from_seed(1))
    inference_pixels = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    assert torch.allclose(ed.pixel_values([image]), inference_pixels, atol=1e-6)  # training sees the same
    assert len(ee.generate_answers(processor, model, [image], ["Describe the image."], max_new_tokens=3)) == 1


def test_a_clock_limit_stops_the_run_annealed():
    cfg = te.TrainConfig(steps=1000, warmup=10, time_limit_s=100.0)
    assert te.lr_at(5, cfg, 99.0) == pytest.approx(cfg.lr * 6 / 10)  # warmup is by steps
    assert te.lr_at(20, cfg, 0.0) == pytest.approx(te.lr_at(20, te.TrainConfig(steps=1000, warmup=10)))
    assert te.lr_at(20, cfg, 100.0) == pytest.approx(cfg.lr * cfg.min_lr_ratio)  # the clock ran out
    assert te.lr_at(20, cfg, 50.0) < te.lr_at(20, cfg, 10.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"world": "v3"}, "world must be one of"),
        ({"attn_scope": "all"}, "attn_scope"),
        ({"layers": 2}, "binding layers"),
        ({"hidden": 30}, "divisible"),
        ({"world": "v2", "extra_phrasing_share": 1.5}, "in \\[0, 1\\]"),
        ({"world": "v1", "extra_phrasing_share": 0.5}, "world v2 only"),
        ({"world": "v2", "phrasings": "sentences"}, "phrasings must be one of"),
        ({"init": "/nonexistent/model"}, "folder with a saved model"),
        ({"lead_weight": 0.0}, "lead_weight > 0"),
        ({"lead_tokens": 0}, "lead_tokens >= 1"),
    ],
)
def test_bad_training_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        te.TrainConfig(**fields)


def test_the_cli_refuses_cuda_without_a_gpu(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit):
        te.main(["--world", "v2", "--out", str(tmp_path), "--device", "cuda"])
    assert "CUDA is not available" in capsys.readouterr().err


def test_summary_page_reports_runs_and_missing_ones(tmp_path):
    import json

    from training import summary as embedded_summary

    report = {
        "world": "v2", "n_per_type": 10, "heldout_seed": 0, "folder_mb": 14.9,
        "real": {"count": 1.0, "detail": 0.9}, "shuffled": {"count": 0.2, "detail": 0.0},
        "rephrased": {"count": 0.95, "detail": 0.8}, "tokens_per_s_1_thread": 320.0,
        "failures": {"rephrased/detail": [{"q": "Describe it fully.", "expected": "x", "got": "y"}]},
    }  # fmt: skip
    (tmp_path / "a.eval.json").write_text(json.dumps(report, indent=2))
    (tmp_path / "a.train.json").write_text(
        '{"steps_done": 5, "steps": 9, "losses": {"lm": 0.1}, "seconds": 3}\n'
    )
    (tmp_path / "a.args").write_text("--seed 1")
    page = embedded_summary.summary_markdown(tmp_path, ["a", "b"])
    assert "| detail | 0.90 | 0.80 | 0.00 |" in page
    assert "trained 5 of 9 steps" in page and "`--seed 1`" in page
    assert "every type >= 0.9 (held-out phrasings): NO" in page and "size <= 20.0 MB: yes" in page
    assert "Describe it fully." in page
    assert "## b" in page and "training did not finish" in page and "no evaluation" in page


# ------------------------------------------------------------------- extra relation phrasings, fine-tuning
def _words(template: str) -> list[str]:
    return re.findall(r"\{kind\}|\{other\}|[a-z']+", template.lower())


def _trigrams(template: str) -> set[tuple[str, ...]]:
    w = _words(template)
    return {tuple(w[i : i + 3]) for i in range(len(w) - 2)}


def test_extra_phrasings_borrow_nothing_from_the_heldout_ones():
    """The generated phrasings keep the held-out test honest: none equals, contains or is contained in a
    held-out phrasing (of any type), none uses a word that only held-out phrasings use, and any word
    triple they share with a held-out phrasing was in the original training phrasings already."""
    assert set(EXTRA_TRAINING_QUESTIONS) == set(scenes2.QUESTION_TYPES)
    train = [t for ts in scenes2.TRAINING_QUESTIONS.values() for t in ts]
    held = [t for ts in scenes2.REPHRASED_QUESTIONS.values() for t in ts]
    held_only_words = {w for t in held for w in _words(t)} - {w for t in train for w in _words(t)}
    train_trigrams = set().union(*map(_trigrams, train))
    held_trigrams = set().union(*map(_trigrams, held))
    for qtype, extra in EXTRA_TRAINING_QUESTIONS.items():
        assert len(extra) >= 8 and len(set(extra)) == len(extra) and not set(extra) & set(train)
        needs = {"colour": 1, "position": 1, "relation": 2}.get(qtype, 0)
        assert all(
            t.count("{kind}") == min(needs, 1) and t.count("{other}") == max(needs - 1, 0) for t in extra
        )
        for t in extra:
            low = t.lower()
            assert not any(low == h.lower() or low in h.lower() or h.lower() in low for h in held), t
            assert not set(_words(t)) & held_only_words, t
            assert _trigrams(t) & held_trigrams <= train_trigrams, t
    relation = EXTRA_TRAINING_QUESTIONS["relation"]
    assert len(relation) >= 100 and any(t.index("{other}") < t.index("{kind}") for t in relation)


def test_position_phrasings_are_the_relation_frames_without_the_reference():
    from training import phrasings as ep

    relation, position = EXTRA_TRAINING_QUESTIONS["relation"], EXTRA_TRAINING_QUESTIONS["position"]
    assert "Where does the {kind} lie?" in position
    assert "Where does the {kind} lie versus the {other}?" in relation
    for frame in ep.SUBJECT_FIRST_FRAMES:
        alone, related = (
            frame.format(kind="{kind}", ref=""),
            frame.format(kind="{kind}", ref=" versus the {other}"),
        )
        assert alone in position or alone in scenes2.TRAINING_QUESTIONS["position"]
        assert related in relation


@pytest.mark.parametrize(
    ("template", "question"),
    [
        # subject first / subject last: the answer is about {kind} either way
        ("Where is the {kind} versus the {other}?", "Where is the {a} versus the {b}?"),
        ("Seen from the {other}, where is the {kind}?", "Seen from the {b}, where is the {a}?"),
    ],
)
def test_extra_phrasings_ask_about_the_subject_whatever_the_order(template, question):
    scene = scenes2.scene_from_seed(1)
    assert scene.count == 3
    world = V2.with_extra_questions({"relation": (template,)}, 1.0)
    for seed in range(5):
        asked, answer, spans = world.question(scene, "relation", np.random.default_rng(seed), "mentions")
        subject = answer.split()[1]  # "The <kind> is ..."
        other = next(k for k in scenes2.question_targets(asked) if k != subject)
        assert asked == question.format(a=subject, b=other)
        assert (answer, spans) == scenes2.answer_with_spans(scene, "relation", (subject, other))


def test_without_extras_a_world_keeps_its_questions(v2_tokenizer):
    builder = ed.SequenceBuilder(v2_tokenizer, V2.num_image_tokens)
    seeds = ed.draw_seeds(np.random.default_rng(8), 6)
    plain = ed.batch_from_seeds(seeds, V2, builder, "mentions")
    none_asked = ed.batch_from_seeds(seeds, V2.with_extra_questions(EXTRA_TRAINING_QUESTIONS, 0.0), builder)
    assert np.array_equal(plain["input_ids"], none_asked["input_ids"])
    always = V2.with_extra_questions(EXTRA_TRAINING_QUESTIONS, 1.0)
    scene = scenes2.scene_from_seed(1)
    for qtype, seed in itertools.product(("relation", "position", "count", "detail"), range(5)):
        asked, _, _ = always.question(scene, qtype, np.random.default_rng(seed), "mentions")
        assert not any(_matches_template(t, asked) for t in scenes2.TRAINING_QUESTIONS[qtype])
        assert any(_matches_template(t, asked) for t in EXTRA_TRAINING_QUESTIONS[qtype])
    asked, _, _ = always.question(scene, "colour", np.random.default_rng(0), "mentions")
    assert any(_matches_template(t, asked) for t in EXTRA_TRAINING_QUESTIONS["colour"])
    only_relation = V2.with_extra_questions({"relation": EXTRA_TRAINING_QUESTIONS["relation"]}, 1.0)
    asked, _, _ = only_relation.question(scene, "colour", np.random.default_rng(0), "mentions")
    assert any(_matches_template(t, asked) for t in scenes2.TRAINING_QUESTIONS["colour"])
    with pytest.raises(ValueError, match="only v2"):
        ed.WORLDS["v1"].with_extra_questions(EXTRA_TRAINING_QUESTIONS, 0.5)


def _matches_template(template: str, question: str) -> bool:
    pattern = re.escape(template).replace(r"\{kind\}", r"\w+").replace(r"\{other\}", r"\w+")
    return re.fullmatch(pattern, question) is not None


def test_fine_tuning_with_frozen_vision_changes_only_the_language_side(tmp_path):
    from safetensors.torch import load_file

    tiny = {"world": "v2", "hidden": 64, "mlp": 128, "vision_hidden": 32, "warmup": 1, "batch": 3}
    te.train(tmp_path / "base", te.TrainConfig(steps=1, **tiny))
    cfg = te.TrainConfig(
        steps=2, init=str(tmp_path / "base"), freeze_vision=True, extra_phrasing_share=1.0, lr=1e-2, **tiny
    )
    summary = te.train(tmp_path / "tuned", cfg)
    assert summary["losses"]["aux"] == 0.0  # no per-patch loss on a frozen vision side
    before, after = (load_file(tmp_path / name / "model.safetensors") for name in ("base", "tuned"))
    assert before.keys() == after.keys()
    frozen = [k for k in before if "vision_tower" in k or "multi_modal_projector" in k]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert not all(torch.equal(before[k], after[k]) for k in before if k not in frozen)
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / "tuned" / name).read_text() == (tmp_path / "base" / name).read_text()
    with pytest.raises(ValueError, match="not v1"):
        te.train(tmp_path / "wrong", te.TrainConfig(steps=1, init=str(tmp_path / "base")))

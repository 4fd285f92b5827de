"""The phrasing families of the v2 questions (training/phrasing_families.py) and their held-out
evaluation (training/evaluate_families.py): the generator's parts, the split of whole families, the
training families' distance from the older held-out phrasings, and answers that never relate a shape
to itself. No model runs here except one small check of the evaluation on the shipped model."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from recap.embedded import scenes2
from training import data as ed
from training import evaluate_families as ef
from training import phrasing_extra as px
from training import phrasing_families as pf
from training.evaluate import self_relations
from training.phrasings import EXTRA_TRAINING_QUESTIONS, ask_in_extra_phrasing

V2 = ed.WORLDS["v2"]
MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-scenes-llava-v2"
NEEDS = {"colour": (1, 0), "position": (1, 0), "relation": (1, 1)}  # named ({kind}, {other}) or not
#: Every family training may ask (``--phrasings mixed-plus`` adds `EXTRA_FAMILIES`, ``mixed-roles`` also
#: `ROLE_FAMILIES`), every family evaluation asks (the held-out and the probe families), and every family.
TRAINING = pf.TRAINING_FAMILIES + px.EXTRA_FAMILIES + px.ROLE_FAMILIES
HELD = pf.HELDOUT_FAMILIES + px.PROBE_FAMILIES
EVERY = pf.FAMILIES + px.EXTRA_FAMILIES + px.ROLE_FAMILIES + px.PROBE_FAMILIES


def _words(text: str) -> list[str]:
    return re.findall(r"\{kind\}|\{other\}|[a-z']+", text.lower())


def _trigrams(text: str) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i : i + 3]) for i in range(len(w) - 2)}


def _frame_key(core: str) -> tuple[str, ...]:
    """A core's words with every synonym mapped to its slot name: the frame it was made from."""
    slot_of = {w: name for name, alts in pf.SLOTS.items() for w in alts.split("|")}
    return tuple(slot_of.get(w, w) for w in _words(core))


def test_expand_crosses_alternatives_and_slots():
    assert pf.expand("Where (is|'s) the {kind}( drawn|)?") == (
        "Where is the {kind} drawn?",
        "Where is the {kind}?",
        "Where's the {kind} drawn?",
        "Where's the {kind}?",
    )
    assert pf.expand("a (b (c|d)|e) f") == ("a b c f", "a b d f", "a e f")
    assert pf.expand("the <colour>") == ("the colour", "the color")
    for bad in ("a (b|c", "a b|c", "a b)"):
        with pytest.raises(ValueError, match="unbalanced"):
            pf.expand(bad)


def test_registers_wrap_questions_and_commands_that_fit():
    casual, polite, first = (
        next(r for r in pf.REGISTERS if r.name == n) for n in ("casual", "polite", "first-person")
    )
    assert "Hey, where is the {kind}?" in casual.wrap("Where is the {kind}?")
    assert "where is the {kind}" in casual.wrap("Where is the {kind}?")
    assert "Could you kindly count the shapes?" in polite.wrap("Count the shapes.")
    several = polite.wrap("Leave nothing out: describe the image.")
    assert several and not any(w.endswith("?") for w in several)  # a command of two sentences stays one
    assert not any(w.count("please") > 1 for w in polite.wrap("Direction and size, please."))
    assert "I'd like to know: I see what?" in first.wrap("I see what?")  # "I" keeps its capital
    assert first.heldout and not casual.heldout and not polite.heldout


def test_every_family_asks_its_type_about_the_right_shapes():
    names = [f.name for f in EVERY]
    assert len(set(names)) == len(names)
    words_outside = re.compile(rf"\b({'|'.join((*scenes2.KINDS, *scenes2.COLOURS))})s?\b")
    assert not any(f.heldout for f in px.EXTRA_FAMILIES + px.ROLE_FAMILIES)
    assert all(f.heldout for f in px.PROBE_FAMILIES)
    for family in EVERY:
        assert family.qtype in scenes2.QUESTION_TYPES and family.name.startswith(family.qtype + "/")
        assert set(family.facts) <= set(scenes2.QUESTION_TYPES)
        kinds, others = NEEDS.get(family.qtype, (0, 0))
        for p in family.phrasings():
            assert min(p.count("{kind}"), 1) == kinds and min(p.count("{other}"), 1) == others, p
            assert not words_outside.search(p.replace("{kind}", "").replace("{other}", "")), p
            assert p.format(kind="star", other="ring")  # nothing else to fill
    for qtype in scenes2.QUESTION_TYPES:
        assert sum(f.qtype == qtype for f in pf.TRAINING_FAMILIES) >= 4, qtype
        assert sum(f.qtype == qtype for f in pf.HELDOUT_FAMILIES) >= 3, qtype
    relation = [p for f in pf.TRAINING_FAMILIES if f.qtype == "relation" for p in f.phrasings()]
    assert any(p.index("{other}") < p.index("{kind}") for p in relation)  # the subject named last, too
    assert sum(len(f.phrasings()) for f in pf.TRAINING_FAMILIES) >= 10 * sum(
        map(len, EXTRA_TRAINING_QUESTIONS.values())
    )


def test_heldout_families_share_no_frame_with_the_training_families():
    """Whole families are held out: no held-out frame (synonyms mapped back to their slots) is a training
    frame, no held-out phrasing is or contains a training phrasing (TRAINING_QUESTIONS, training.phrasings
    and the training families, unwrapped), and the held-out register wraps held-out families only."""
    train_cores = {c for f in TRAINING for c in f.cores()}
    train_cores |= {t for ts in scenes2.TRAINING_QUESTIONS.values() for t in ts}
    train_cores |= {t for ts in EXTRA_TRAINING_QUESTIONS.values() for t in ts}
    held_cores = {c for f in HELD for c in f.cores()}
    assert not {_frame_key(c) for c in held_cores} & {_frame_key(c) for c in train_cores}
    lowered = [t.lower() for t in train_cores]
    for core in held_cores:
        low = core.lower()
        assert not any(t in low for t in lowered), core
    train_phrasings = {p for f in pf.TRAINING_FAMILIES for p in f.phrasings()}
    held_phrasings = {p for f in HELD for p in f.phrasings()}
    assert not {p for f in TRAINING for p in f.phrasings()} & held_phrasings
    for family in TRAINING:
        assert not any(r.heldout for r in family.registers())
    assert all(any(r.heldout for r in f.registers()) for f in HELD)
    grouped = {p for gs in pf.training_groups().values() for g in gs for p in g}
    assert grouped == train_phrasings


def test_the_mixed_generator_is_the_families_plus_the_frames_as_one_more_group():
    """``--phrasings mixed``: every training family's groups, and per type the frames' phrasings as one
    extra group; no held-out family's phrasing among them."""
    from training.config import PHRASINGS

    families, mixed = pf.training_groups(), PHRASINGS["mixed"]()
    assert set(mixed) == set(families) | set(EXTRA_TRAINING_QUESTIONS)
    for qtype, groups in mixed.items():
        frames = EXTRA_TRAINING_QUESTIONS.get(qtype)
        expected = (*families.get(qtype, ()), *((tuple(frames),) if frames else ()))
        assert groups == expected, qtype
    held = {p for f in pf.HELDOUT_FAMILIES for p in f.phrasings()}
    assert not held & {p for gs in mixed.values() for g in gs for p in g}
    world = V2.with_extra_questions(mixed, 0.5)  # a world asks with it as with the families
    assert world.extra_questions["relation"][-1] == tuple(EXTRA_TRAINING_QUESTIONS["relation"])


def test_mixed_plus_adds_the_extra_families_after_the_relation_families_and_leaves_mixed_as_it_was():
    """``--phrasings mixed-plus``: mixed's groups with the extra families' groups after the other relation
    families (before the frames' group); ``mixed`` and ``families`` never see the extra families."""
    from training.config import PHRASINGS

    plus, mixed = PHRASINGS["mixed-plus"](), PHRASINGS["mixed"]()
    extra = pf.training_groups(px.EXTRA_FAMILIES)
    assert set(extra) == {"relation"} and set(plus) == set(mixed)
    assert plus["relation"] == (*mixed["relation"][:-1], *extra["relation"], mixed["relation"][-1])
    assert all(plus[q] == mixed[q] for q in mixed if q != "relation")
    added = {p for g in extra["relation"] for p in g}
    assert not added & {p for gs in mixed.values() for g in gs for p in g}
    assert not added & {p for gs in PHRASINGS["families"]().values() for g in gs for p in g}


def test_mixed_roles_adds_the_role_families_to_mixed_plus():
    """``--phrasings mixed-roles``: mixed-plus's groups with the role families' after the extra ones; the
    role families' lead-in verb slot takes many verbs, and every one of them names both shapes."""
    from training.config import PHRASINGS

    roles, plus = PHRASINGS["mixed-roles"](), PHRASINGS["mixed-plus"]()
    added = pf.training_groups(px.ROLE_FAMILIES)["relation"]
    assert roles["relation"] == (*plus["relation"][:-1], *added, plus["relation"][-1])
    assert all(roles[q] == plus[q] for q in plus if q != "relation")
    phrasings = [p for f in px.ROLE_FAMILIES for p in f.phrasings()]
    assert len({p.split(" ", 1)[0] for p in phrasings}) >= 20  # many first words: no verb tells the role
    assert any(p.index("{other}") < p.index("{kind}") for p in phrasings)  # reference named first
    assert any(p.index("{kind}") < p.index("{other}") for p in phrasings)  # and last
    # mixed-from: the same without the family whose subject follows "to".
    kept = pf.training_groups(px.FROM_FAMILIES)["relation"]
    assert PHRASINGS["mixed-from"]()["relation"] == (*plus["relation"][:-1], *kept, plus["relation"][-1])
    names = [f.name for f in px.ROLE_FAMILIES]
    assert [f.name for f in px.FROM_FAMILIES] == [n for n in names if n != "relation/to-subject"]


def test_the_extra_families_use_no_word_only_the_heldout_families_use():
    """`EXTRA_FAMILIES` and `ROLE_FAMILIES` were written after the held-out families: none of their words
    is one that only a held-out or probe family (not a training family or training question) says, such
    as "contrast", "sits" or "imagine"."""

    def words(phrasings):
        return {w for p in phrasings for w in _words(p)}

    seen = words(p for f in pf.TRAINING_FAMILIES for p in f.phrasings())
    seen |= words(t for ts in scenes2.TRAINING_QUESTIONS.values() for t in ts)
    seen |= words(t for ts in EXTRA_TRAINING_QUESTIONS.values() for t in ts)
    held_only = words(p for f in pf.HELDOUT_FAMILIES for p in f.phrasings()) - seen
    assert {"contrast", "sits"} <= held_only
    extra = words(p for f in px.EXTRA_FAMILIES for p in f.phrasings())
    assert not extra & held_only
    # The role families were written with the probe families, after the extra ones.
    held_only = words(p for f in HELD for p in f.phrasings()) - seen - extra
    assert {"contrast", "imagine"} <= held_only
    assert not words(p for f in px.ROLE_FAMILIES for p in f.phrasings()) & held_only


#: Words that carry no wording of their own: a word triple of these (and the placeholders) alone, such
#: as "the {kind} and", is not a phrasing borrowed from the held-out set.
FUNCTION_WORDS = {"the", "a", "an", "and", "of", "to", "is", "it", "in", "on", "with", "or", "this", "are"}


def test_training_families_borrow_nothing_from_the_older_heldout_phrasings():
    """`REPHRASED_QUESTIONS` stays a test of unseen wording: no training-family phrasing has the words of
    a held-out phrasing, or has its words inside one, or contains one; none uses a word only held-out
    phrasings use; and any word triple it shares with a held-out phrasing, unless made of function words
    and placeholders only, was in the original training phrasings already."""
    train = [t for ts in scenes2.TRAINING_QUESTIONS.values() for t in ts]
    held = [t for ts in scenes2.REPHRASED_QUESTIONS.values() for t in ts]
    held_only_words = {w for t in held for w in _words(t)} - {w for t in train for w in _words(t)}
    train_trigrams = set().union(*map(_trigrams, train))
    held_trigrams = set().union(*map(_trigrams, held))
    held_seqs = [" " + " ".join(_words(h)) + " " for h in held]
    for family in TRAINING:
        for p in family.phrasings():
            seq = " " + " ".join(_words(p)) + " "
            assert not any(seq in h or h in seq for h in held_seqs), p
            assert not set(_words(p)) & held_only_words, p
            borrowed = {
                t for t in _trigrams(p) & held_trigrams - train_trigrams
                if not all(w in FUNCTION_WORDS or w.startswith("{") for w in t)
            }  # fmt: skip
            assert not borrowed, (p, borrowed)


def test_asked_shapes_are_two_different_shapes_and_the_answer_is_about_the_subject():
    scene = scenes2.scene_from_seed(1)
    groups = (("Seen from the {other}, where is the {kind}?",), ("Compare the {kind} and the {other}.",))
    for seed in range(40):
        question, answer, spans = pf.ask_in_family(
            scenes2, scene, "relation", groups, np.random.default_rng(seed)
        )
        named = scenes2.question_targets(question)
        assert len(named) == 2 and named[0] != named[1]
        subject = named[1] if question.startswith("Seen") else named[0]
        other = next(k for k in named if k != subject)
        assert (answer, spans) == scenes2.answer_with_spans(scene, "relation", (subject, other))
        assert answer.startswith(f"The {subject} is ") and self_relations(answer) == 0


def test_one_group_keeps_the_random_stream_of_the_older_phrasings():
    """`training.phrasings` asks through `ask_in_family` now: the stage-2 command draws what it drew."""
    scene = scenes2.scene_from_seed(4)
    for qtype, seed in itertools.product(("relation", "position", "count"), range(5)):
        extra = EXTRA_TRAINING_QUESTIONS[qtype]
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        assert pf.ask_in_family(scenes2, scene, qtype, (extra,), a) == ask_in_extra_phrasing(
            scenes2, scene, qtype, extra, b
        )
        assert a.random() == b.random()
    world = V2.with_extra_questions(EXTRA_TRAINING_QUESTIONS, 0.5)
    assert all(len(gs) == 1 for gs in world.extra_questions.values())
    with pytest.raises(ValueError, match="empty"):
        V2.with_extra_questions({"count": ((), ("How many?",))}, 0.5)


def test_training_answers_never_relate_a_shape_to_itself():
    """Every relation and detailed answer training asks for, with every training family, relates two
    different shapes (and the checker does find a shape related to itself)."""
    world = V2.with_extra_questions(pf.training_groups(), 1.0)
    plain = V2
    relations = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        scene = scenes2.sample_scene(rng, min_shapes=2)
        for w, qtype in itertools.product((world, plain), ("relation", "detail")):
            _, answer, _ = w.question(scene, qtype, rng, "mentions")
            assert self_relations(answer) == 0, answer
            relations += answer.count(" is ")
    assert relations > 1000
    assert (
        self_relations("The star is left of the star and above it. The red star is larger than the red star.")
        == 2
    )
    assert self_relations("The red star is right of the blue ring, below it and larger.") == 0


@pytest.mark.parametrize("split", ["heldout", "probe"])
def test_family_items_are_heldout_scenes_asked_in_their_family(split):
    families = ef.SPLITS[split]
    items = ef.family_items(families, 4, 3)
    assert len(items) == 3 * len(families)
    again = ef.family_items(families, 4, 3)
    assert [(it["prompt"], it["seed"]) for it in items] == [(it["prompt"], it["seed"]) for it in again]
    assert min(it["seed"] for it in items) >= scenes2.HELDOUT_SEED_START + 4 * scenes2.HELDOUT_STRIDE
    held_phrasings = {f.name: set(f.phrasings()) for f in families}
    for it in items:
        targets = it["targets"]
        assert len(set(targets)) == len(targets) == (2 if it["qtype"] == "relation" else 1)
        template = it["prompt"]
        if it["qtype"] in NEEDS:
            for kind, slot in zip(targets, ("{kind}", "{other}")):
                template = re.sub(rf"\b{kind}\b", slot, template)
        assert template in held_phrasings[it["family"]], it["prompt"]
        assert ef.is_right(it, it["answer"])  # the reference answer is right
    other_set = ef.family_items(families, 5, 3)
    assert not {it["seed"] for it in items} & {it["seed"] for it in other_set}


def test_a_combined_request_needs_every_fact():
    family = next(f for f in pf.HELDOUT_FAMILIES if f.facts == ("colour", "position"))
    item = next(it for it in ef.family_items((family,), 4, 10) if it["scene"].count >= 2)
    scene, kind = item["scene"], item["targets"][0]
    shape = scene.shape_of_kind(kind)
    other = next(s for s in scene.shapes if s.kind != kind)
    assert ef.is_right(item, scenes2.reference_answer(scene, "position", kind))  # either format states both
    assert ef.is_right(item, scenes2.reference_answer(scene, "colour", kind))
    wrong_place = f"The {kind} is {shape.colour}. It is in the {other.position} of the image."
    wrong_colour = f"The {kind} is in the {shape.position} of the image. It is {other.colour}."
    assert not ef.is_right(item, wrong_place) and not ef.is_right(item, wrong_colour)


def test_a_relation_is_judged_about_the_subject_whatever_the_order():
    family = next(f for f in pf.HELDOUT_FAMILIES if f.name == "relation/direction-from")
    item = ef.family_items((family,), 4, 1)[0]
    subject, other = item["targets"]
    assert item["prompt"].index(other) < item["prompt"].index(subject)  # the subject is named last
    assert ef.is_right(item, item["answer"])
    swapped = scenes2.reference_answer(item["scene"], "relation", (other, subject))
    assert not ef.is_right(item, swapped)


def test_summary_counts_types_families_and_self_relations():
    items = ef.family_items(pf.HELDOUT_FAMILIES[:2], 4, 2)
    judged = [(it, it["answer"], True) for it in items[:3]] + [
        (items[3], "The star is left of the star and above it.", False)
    ]
    report = ef.summarise(judged, failures=1)
    assert report["n"] == 4 and report["self_relations"] == 1
    assert report["by_family"] == {pf.HELDOUT_FAMILIES[0].name: 1.0, pf.HELDOUT_FAMILIES[1].name: 0.5}
    assert report["failures"][pf.HELDOUT_FAMILIES[1].name][0]["got"].startswith("The star")


def test_a_relation_answered_about_the_reference_is_wrong_and_counted_as_swapped():
    family = next(f for f in pf.HELDOUT_FAMILIES if f.name == "relation/direction-from")
    right, swapped, other = ef.family_items((family,), 4, 3)
    subject, reference = swapped["targets"]
    flipped = scenes2.reference_answer(swapped["scene"], "relation", (reference, subject))
    assert ef.roles_swapped(swapped, flipped) and not ef.roles_swapped(right, right["answer"])
    self_relating = f"The {subject} is left of the {subject} and above it."
    assert not ef.roles_swapped(other, self_relating)
    judged = [(right, right["answer"], True), (swapped, flipped, False), (other, self_relating, False)]
    report = ef.summarise(judged)
    assert report["by_type"] == {"relation": 1 / 3} and report["roles_swapped"] == {"relation": 1}


@pytest.mark.slow
def test_the_family_evaluation_runs_on_the_shipped_model():
    report = ef.evaluate_families(MODEL_DIR, (4,), 1)
    result = report["sets"]["4"]
    assert result["n"] == len(pf.HELDOUT_FAMILIES)
    assert set(result["by_type"]) == set(scenes2.QUESTION_TYPES)
    assert set(result["by_family"]) == {f.name for f in pf.HELDOUT_FAMILIES}


def test_training_with_the_families_builds_the_same_batches_in_workers(tmp_path):
    """``--phrasings families`` trains (a tiny model, two steps), and batch workers get the groups."""
    from training import train as te
    from training.batch_stream import BatchStream

    world = V2.with_extra_questions(pf.training_groups(), 0.6)
    builder = ed.SequenceBuilder(ed.build_tokenizer(V2), V2.num_image_tokens)
    streams = [
        BatchStream(np.random.default_rng(3), world, builder, 3, "mentions", workers=w) for w in (0, 1)
    ]
    try:
        a, b = (next(s) for s in streams)
        assert np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(a["labels"], b["labels"])
    finally:
        for s in streams:
            s.close()
    tiny = {"world": "v2", "hidden": 64, "mlp": 128, "vision_hidden": 32, "warmup": 1, "batch": 3}
    cfg = te.TrainConfig(steps=2, extra_phrasing_share=1.0, phrasings="families", **tiny)
    assert te.train(tmp_path, cfg)["steps_done"] == 2


def test_noise_inserts_one_or_two_words_and_keeps_every_other():
    question = "Where is the star relative to the ring?"
    inserted = 0
    for seed in range(200):
        noisy = pf.add_noise(question, np.random.default_rng(seed))
        words, original = noisy.split(" "), question.split(" ")
        extra = len(words) - len(original)
        assert extra in (1, 2)
        rest = list(words)
        for w in original:  # the original words, in order, once the inserted ones are left out
            rest = rest[rest.index(w) + 1 :]
        assert scenes2.question_targets(noisy) == ("star", "ring")
        assert (
            scenes2.extract_fact("colour", noisy) is None and scenes2.extract_fact("position", noisy) is None
        )
        inserted += extra
    assert inserted > 250
    made_up = {pf.made_up_word(np.random.default_rng(s)) for s in range(300)}
    assert len(made_up) > 250 and all(4 <= len(w) <= 9 and w.isalpha() for w in made_up)


def test_a_mix_and_noise_change_the_questions_only_as_asked():
    seeds = ed.draw_seeds(np.random.default_rng(8), 6)
    builder = ed.SequenceBuilder(ed.build_tokenizer(V2), V2.num_image_tokens)
    plain = ed.batch_from_seeds(seeds, V2, builder, "mentions")
    same = ed.batch_from_seeds(seeds, V2.with_training_mix(None, 0.0), builder, "mentions")
    assert np.array_equal(plain["input_ids"], same["input_ids"])  # neither given: the same stream
    noisy = V2.with_training_mix(None, 1.0)
    scene = scenes2.scene_from_seed(1)
    for seed in range(10):
        asked, answer, spans = noisy.question(scene, "relation", np.random.default_rng(seed), "mentions")
        assert len(asked.split()) > 6 and (answer, spans) == scenes2.answer_with_spans(
            scene, "relation", scenes2.question_targets(asked)
        )
    only_relation = V2.with_training_mix({q: 1.0 if q == "relation" else 1e-9 for q in V2.qtype_weights})
    assert list(only_relation.qtype_weights) == list(V2.qtype_weights)
    assert abs(sum(only_relation.qtype_weights.values()) - 1) < 1e-9
    batch = ed.batch_from_seeds(
        ed.draw_seeds(np.random.default_rng(2), 8), only_relation, builder, "mentions"
    )
    text = builder.tok.decode(batch["input_ids"][0])
    assert " is " in text and any(k in text for k in scenes2.KINDS)
    for bad in ({"relation": 1.0}, {**V2.qtype_weights, "relation": 0.0}):
        with pytest.raises(ValueError, match="positive weight"):
            V2.with_training_mix(bad)
    with pytest.raises(ValueError, match="noise"):
        V2.with_training_mix(None, 1.5)
    from training import train as te

    assert te.parse_weights("relation=0.3, detail=0.2") == {"relation": 0.3, "detail": 0.2}
    for fields, message in (
        ({"world": "v2", "qtype_weights": "relation"}, "type=weight"),
        ({"world": "v2", "qtype_weights": "relation=1"}, "positive weight"),
        ({"world": "v1", "question_noise": 0.2}, "v2 only"),
        ({"world": "v2", "question_noise": 2.0}, "noise"),
    ):
        with pytest.raises(ValueError, match=message):
            te.TrainConfig(**fields)

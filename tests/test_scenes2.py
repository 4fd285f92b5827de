"""The scene world v2 (recap.embedded.scenes2): distinguishable colours and kinds, counts, relations that
follow
the drawn coordinates, phrasings kept out of training, detailed descriptions of 60-150 tokens, and the
fact checkers on hand-written right and wrong answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from recap.embedded import scenes2 as s2
from recap.embedded.scenes2_draw import _JITTER, _RADIUS

SEEDS = range(300)


def one_shape(kind: str, size: str = "small", cell: int = 4, dx: int = 0, dy: int = 0, colour: str = "red"):
    return s2.Scene((s2.Shape(kind, colour, size, cell, dx, dy),))


def mask(scene: s2.Scene, i: int = 0) -> np.ndarray:
    return s2.shape_index_map(scene) == i + 1


def test_the_world_is_wide_enough():
    assert len(s2.COLOURS) >= 12 and len(s2.KINDS) >= 8 and s2.MAX_SHAPES >= 5
    counts = {s2.scene_from_seed(seed).count for seed in SEEDS}
    assert counts == set(range(1, s2.MAX_SHAPES + 1))


def test_colours_are_far_apart_and_far_from_the_background():
    palette = [np.array(c, dtype=float) for c in [*s2.COLOURS.values(), s2.BACKGROUND]]
    closest = min(np.linalg.norm(a - b) for a, b in itertools.combinations(palette, 2))
    assert closest >= 60  # RGB distance; the nearest pair (brown/black-like) is ~ 70


@pytest.mark.parametrize("size", s2.SIZES)
def test_kinds_have_distinct_silhouettes_at_every_size(size):
    masks = {kind: mask(one_shape(kind, size)) for kind in s2.KINDS}
    for a, b in itertools.combinations(s2.KINDS, 2):
        assert (masks[a] ^ masks[b]).sum() >= 12, (a, b, size)  # pixels that tell them apart
    areas = [masks[k].sum() for k in s2.KINDS]
    assert min(areas) >= 25  # even the smallest thin shape covers a few patches' worth of pixels


def test_renders_use_only_palette_colours_and_are_deterministic():
    allowed = {tuple(c) for c in s2.COLOURS.values()} | {s2.BACKGROUND}
    for seed in range(20):
        image = np.asarray(s2.render_scene(s2.scene_from_seed(seed)))
        assert image.shape == (s2.IMAGE_SIZE, s2.IMAGE_SIZE, 3)
        assert {tuple(p) for p in image.reshape(-1, 3)} <= allowed  # no anti-aliasing blends
    assert (
        s2.render_scene(s2.scene_from_seed(7)).tobytes() == s2.render_scene(s2.scene_from_seed(7)).tobytes()
    )


@pytest.mark.parametrize("kind", s2.KINDS)
def test_every_shape_stays_inside_its_cell_whatever_the_jitter(kind):
    for size, cell in itertools.product(s2.SIZES, range(9)):
        j = _JITTER[size]
        for dx, dy in itertools.product((-j, j), repeat=2):
            drawn = np.argwhere(mask(one_shape(kind, size, cell, dx, dy)))
            row, col = divmod(cell, s2.GRID)
            assert drawn[:, 0].min() >= row * s2.CELL and drawn[:, 0].max() < (row + 1) * s2.CELL
            assert drawn[:, 1].min() >= col * s2.CELL and drawn[:, 1].max() < (col + 1) * s2.CELL
    assert _RADIUS["small"] < _RADIUS["medium"] < _RADIUS["large"]


def test_scenes_have_distinct_kinds_colours_and_cells_in_reading_order():
    for seed in SEEDS:
        scene = s2.scene_from_seed(seed)
        for attribute in ("kind", "colour", "cell"):
            values = [getattr(s, attribute) for s in scene.shapes]
            assert len(set(values)) == len(values)
        assert [s.cell for s in scene.shapes] == sorted(s.cell for s in scene.shapes)
        assert sorted(np.unique(s2.shape_index_map(scene))) == list(range(scene.count + 1))


def test_relations_follow_the_drawn_pixels():
    checked = 0
    for seed in SEEDS:
        scene = s2.scene_from_seed(seed)
        index = s2.shape_index_map(scene)
        centroids = [np.argwhere(index == i + 1).mean(0) for i in range(scene.count)]  # (y, x)
        extents = [np.ptp(np.argwhere(index == i + 1), axis=0).max() for i in range(scene.count)]
        for (i, a), (j, b) in itertools.permutations(enumerate(scene.shapes), 2):
            (ya, xa), (yb, xb) = centroids[i], centroids[j]
            horizontal = s2.horizontal_relation(a, b)
            assert horizontal == (
                "left of" if xa < xb - 16 else "right of" if xa > xb + 16 else "in the same column as"
            )
            vertical = s2.vertical_relation(a, b)
            assert vertical == (
                "above" if ya < yb - 16 else "below" if ya > yb + 16 else "in the same row as"
            )
            size = s2.size_relation(a, b)  # whatever the kinds, a larger shape spans more pixels
            if size != "the same size as":
                assert (size == "larger than") == (extents[i] > extents[j]), (a, b, extents[i], extents[j])
                checked += 1
    assert checked > 500


def test_heldout_phrasings_never_occur_in_training():
    for qtype in s2.QUESTION_TYPES:
        train = [t.lower() for t in s2.TRAINING_QUESTIONS[qtype]]
        held = [t.lower() for t in s2.REPHRASED_QUESTIONS[qtype]]
        assert len(train) >= 8 and len(held) >= 4 and len(set(train)) == len(train)
        for t, h in itertools.product(train, held):
            assert t != h and t not in h and h not in t, (t, h)
        needs = {"colour": 1, "position": 1, "relation": 2}.get(qtype, 0)
        for template in train + held:
            assert template.count("{kind}") == min(needs, 1) and template.count("{other}") == max(
                needs - 1, 0
            )


def test_heldout_seeds_and_sets():
    from training.data import draw_seeds

    assert min(s2.heldout_seeds(0, 1000)) >= s2.HELDOUT_SEED_START
    assert max(draw_seeds(np.random.default_rng(0), 10_000)) < s2.HELDOUT_SEED_START
    items = s2.heldout_set(seed=2, n_per_type=3, rephrased=True)
    assert [it["qtype"] for it in items] == [q for q in s2.QUESTION_TYPES for _ in range(3)]
    assert all(it["scene"].count >= 2 for it in items if it["qtype"] == "relation")
    rephrased = {
        t.format(kind="{kind}", other="{other}") for ts in s2.REPHRASED_QUESTIONS.values() for t in ts
    }
    assert all(any(_matches(t, it["prompt"]) for t in rephrased) for it in items)
    again = s2.heldout_set(seed=2, n_per_type=3, rephrased=True)
    assert [it["prompt"] for it in again] == [it["prompt"] for it in items]


def _matches(template: str, prompt: str) -> bool:
    return any(template.format(kind=k, other=o) == prompt for k, o in itertools.product(s2.KINDS, repeat=2))


@pytest.mark.parametrize("rephrased", [False, True])
@pytest.mark.parametrize("qtype", s2.QUESTION_TYPES)
def test_reference_answers_pass_their_own_checker(qtype, rephrased):
    rng = np.random.default_rng(1)
    for seed in range(60):
        scene = s2.scene_from_seed(seed, min_shapes=2 if qtype == "relation" else 1)
        question, answer = s2.make_question(scene, qtype, rng, rephrased)
        assert s2.answer_is_correct(qtype, scene, answer, question), (question, answer)
        assert s2.answer_is_correct(qtype, scene, answer), answer  # asked kinds read from the answer


def test_relation_questions_need_two_shapes():
    with pytest.raises(ValueError, match="2 shapes"):
        s2.make_question(one_shape("star"), "relation", np.random.default_rng(0))


def test_detailed_descriptions_are_long_and_repeat_each_shape():
    from training.data import WORLDS, build_tokenizer

    tokenizer = build_tokenizer(WORLDS["v2"])
    lengths: dict[int, list[int]] = {}
    for seed in SEEDS:
        scene = s2.scene_from_seed(seed)
        answer = s2.reference_answer(scene, "detail")
        lengths.setdefault(scene.count, []).append(
            len(tokenizer.encode(" " + answer, add_special_tokens=False))
        )
        for shape in scene.shapes:
            assert answer.count(shape.name) >= 2  # colour and kind recur within the answer
    assert set(lengths) == set(range(1, s2.MAX_SHAPES + 1))
    assert min(map(min, lengths.values())) >= 60 and max(map(max, lengths.values())) <= 150


def test_answer_spans_name_their_shape():
    rng = np.random.default_rng(3)
    for seed in range(40):
        scene = s2.scene_from_seed(seed, min_shapes=2)
        for qtype in ("describe", "count", "relation", "detail"):
            _, answer, spans = s2.make_question_with_spans(scene, qtype, rng)
            assert spans
            for start, end, shape_id in spans:
                text, shape = answer[start:end], scene.shapes[shape_id - 1]
                names_it = shape.kind in text
                refers_back = text.startswith((" is ", "above", "below", "in the same row"))
                assert names_it or refers_back, (qtype, text, shape)


# Hand-written answers about one scene: a large red circle top left, a small blue star center, a medium
# green heart bottom right.
SCENE = s2.Scene(
    (
        s2.Shape("circle", "red", "large", 0),
        s2.Shape("star", "blue", "small", 4),
        s2.Shape("heart", "green", "medium", 8),
    )
)
DETAIL = (
    "The image shows three shapes on a white background. There is a large red circle in the top left. "
    "There is a small blue star in the center. The blue star is right of the red circle, below it and "
    "smaller. There is a medium green heart in the bottom right. The green heart is right of the blue star, "
    "below it and larger. In total there are three shapes: a red circle, a blue star and a green heart."
)


@pytest.mark.parametrize(
    ("qtype", "question", "answer", "right"),
    [
        ("colour", "What colour is the star?", "The star is blue.", True),
        ("colour", "What colour is the star?", "The star is red. It is a large red circle.", False),
        ("colour", "What colour is the heart?", "It is green.", True),
        ("count", "How many shapes are there?", "There are three shapes in the image.", True),
        ("count", "How many shapes are there?", "There are four shapes.", False),
        ("position", "Tell me where the heart is.", "The heart is in the bottom right of the image.", True),
        ("position", "Where is the heart?", "The heart is in the bottom center.", False),
        ("position", "Where is the square?", "The square is in the top left.", False),  # no square
        ("describe", None, "Three shapes: a red circle, a blue star and a green heart.", True),
        ("describe", None, "Three shapes: a red circle, a blue star and a green square.", False),
        ("relation", "Where is the star relative to the circle?",
         "The star is right of the circle and below it. The blue star is smaller than the red circle.", True),
        ("relation", "Where is the star relative to the circle?",
         "The star is left of the circle and below it. The blue star is smaller than the red circle.", False),
        ("relation", "Where is the circle relative to the heart?",
         "The circle is left of the heart and above it. The red circle is larger than the heart.", True),
        ("relation", "Where is the circle relative to the heart?",
         "The circle is left of the heart and above it. The red circle is smaller than it.", False),
        ("relation", "Where is the circle relative to the heart?", "The circle is left of the heart.", False),
        ("detail", None, DETAIL, True),
        ("detail", None, DETAIL.replace("star in the center", "star in the top center"), False),
        ("detail", None, DETAIL.replace("below it and larger", "below it and smaller"), False),
        ("detail", None, DETAIL.replace("a large red circle in", "a medium red circle in"), False),
        ("detail", None, DETAIL.replace("three shapes on", "four shapes on"), False),
        ("detail", None, DETAIL.replace(" and a green heart.", ", a green heart and a pink ring."), False),
        ("detail", None, DETAIL.split(" There is a medium green heart")[0], False),  # stops early
    ],
)  # fmt: skip
def test_fact_checker_on_hand_written_answers(qtype, question, answer, right):
    assert s2.answer_is_correct(qtype, SCENE, answer, question) is right


def test_the_hand_written_detail_is_the_reference():
    assert s2.reference_answer(SCENE, "detail") == DETAIL

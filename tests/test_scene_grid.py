"""The scene grid shared by worlds v1 (recap.embedded.scenes) and v2 (recap.embedded.scenes2).

The embedded models were trained on these worlds, so each world's scenes, questions, answers and pixels
are pinned here: a change to the shared code that moves either world fails. The shared pieces are then
checked against their contracts on small tables."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from recap.embedded import grid as scene_grid
from recap.embedded import scenes, scenes2


def world_digests(world) -> tuple[str, str]:
    """Digests of a world's text (held-out sets 0 and 1 rephrased, training scenes 0-29) and pixels."""
    text, pixels = hashlib.sha256(), hashlib.sha256()
    for item in world.heldout_set(0, 4) + world.heldout_set(1, 4, rephrased=True):
        scene = item["scene"]
        text.update(repr((item["seed"], item["qtype"], item["prompt"], item["answer"], scene)).encode())
        pixels.update(item["image"].tobytes() + world.shape_index_map(scene).tobytes())
    for seed in range(30):
        text.update(repr(world.scene_from_seed(seed)).encode())
    return text.hexdigest()[:16], pixels.hexdigest()[:16]


# digests of the worlds as the models were trained on them (computed before the grid was shared)
@pytest.mark.parametrize(
    "world, text, pixels",
    [
        (scenes, "9a62a0a40ecf2ceb", "8d6fc29c524be569"),
        (scenes2, "c69277c6095063a1", "295b7c2da11c287f"),
    ],
)
def test_each_world_draws_what_its_model_was_trained_on(world, text, pixels):
    assert world_digests(world) == (text, pixels)


@pytest.mark.parametrize(
    "shape, centre, row, column, name",
    [
        (scenes.Shape("circle", "red", "small", 0), (11, 11), 0, 0, "red circle"),  # v1: 64 px
        (scenes.Shape("star", "blue", "large", 5, 1, -2), (54, 30), 1, 2, "blue star"),
        (scenes2.Shape("ring", "grey", "medium", 0), (16, 16), 0, 0, "grey ring"),  # v2: 96 px
        (scenes2.Shape("heart", "pink", "small", 7, -3, 2), (45, 82), 2, 1, "pink heart"),
    ],
)
def test_a_shape_sits_at_its_worlds_cell_centre(shape, centre, row, column, name):
    assert (shape.centre, shape.row, shape.column, shape.name) == (centre, row, column, name)
    assert shape.position == scene_grid.POSITIONS[shape.cell]


def test_shapes_of_two_worlds_never_compare_equal():
    assert scenes.Shape("circle", "red", "small", 4) != scenes2.Shape("circle", "red", "small", 4)
    assert scenes.Shape("circle", "red", "small", 4) == scenes.Shape("circle", "red", "small", 4)


@pytest.mark.parametrize("n_shapes", [(1, 1), (2, 3), (4, 4)])
def test_sampled_scenes_have_distinct_kinds_colours_and_cells_in_reading_order(n_shapes):
    for seed in range(30):
        scene = scene_grid.sample_shapes(
            np.random.default_rng(seed), scenes.Shape, n_shapes, scenes.KINDS, list(scenes.COLOURS),
            scenes.SIZES, {"small": 2, "large": 0},
        )  # fmt: skip
        assert n_shapes[0] <= scene.count <= n_shapes[1]
        for attribute in ("kind", "colour", "cell"):
            values = [getattr(s, attribute) for s in scene.shapes]
            assert len(set(values)) == len(values)
        assert [s.cell for s in scene.shapes] == sorted(s.cell for s in scene.shapes)
        assert all(abs(s.dx) <= 2 and abs(s.dy) <= 2 for s in scene.shapes if s.size == "small")


def first_word(qtype: str, text: str) -> str | None:
    return text.split()[0] if text else None


def asked_word(qtype: str, scene, question: str | None) -> str:
    if not question:
        raise ValueError("no question")
    return question.split()[-1]


SCENE = scenes.Scene((scenes.Shape("circle", "red", "small", 4),))


@pytest.mark.parametrize(
    "qtype, text, question, correct",
    [
        ("colour", "red", "is it red", True),  # the question gives the expected fact
        ("colour", "blue", "is it red", False),
        ("colour", "red red", None, True),  # an asking type without a question: the answer stands in
        ("count", "red", None, False),  # not an asking type: no question, ValueError, judged wrong
        ("count", "", "x", False),  # nothing extracted
    ],
)
def test_an_answer_is_judged_by_its_facts(qtype, text, question, correct):
    judged = scene_grid.answer_is_correct(qtype, SCENE, text, question, ("colour",), first_word, asked_word)
    assert judged is correct


@pytest.mark.parametrize(
    "seed, n, expected",
    [
        (0, 3, [10**9, 10**9 + 1, 10**9 + 2]),
        (2, 1, [10**9 + 200_000]),
        (1, 0, []),
    ],
)
def test_heldout_seeds_lie_above_every_training_seed(seed, n, expected):
    assert scene_grid.heldout_seeds(seed, n) == expected


@pytest.mark.parametrize("seed, n", [(-1, 3), (0, -1), (0, scene_grid.HELDOUT_STRIDE + 1)])
def test_heldout_seeds_refuse_what_would_overlap(seed, n):
    with pytest.raises(ValueError, match="need seed >= 0"):
        scene_grid.heldout_seeds(seed, n)


def test_a_subset_of_question_types_draws_the_same_examples_as_the_full_set():
    def ask(qtype, rng):
        scene = scenes.sample_scene(rng)
        return scene, *scenes.make_question(scene, qtype, rng)

    types = scenes.QUESTION_TYPES
    full = scene_grid.heldout_examples(3, 2, types, types, ask, scenes.render_scene)
    subset = scene_grid.heldout_examples(3, 2, types, ("position", "colour"), ask, scenes.render_scene)
    key = [(e["seed"], e["qtype"], e["prompt"], e["answer"]) for e in full]
    assert [(e["seed"], e["qtype"], e["prompt"], e["answer"]) for e in subset] == key[6:8] + key[2:4]
    assert [e["qtype"] for e in full] == [t for t in types for _ in range(2)]

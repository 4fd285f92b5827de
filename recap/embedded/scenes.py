"""Synthetic shape scenes: the data of the embedded default model.

A scene is 1-3 shapes of distinct kinds and distinct colours, each in its own cell of a 3x3 grid, drawn on
a white 64x64 RGB canvas. Everything is deterministic given a ``numpy.random.Generator`` (or a seed);
only PIL and numpy are used, no torch.

Answers mix image-independent phrasing ("The image shows ... on a white background.") with
image-dependent words (colours, kinds, counts, positions). Each answer carries one canonical,
machine-checkable fact per question type:

========== ========================================== ==========================================
qtype      example question                           canonical fact
========== ========================================== ==========================================
describe   "Describe the image."                      the set of (colour, kind) pairs mentioned
colour     "What colour is the circle?"               the first colour word
count      "How many shapes are there?"               the first count word ("one", "two", ...)
position   "Where is the star?"                       the first position phrase ("top left", ...)
========== ========================================== ==========================================

Public API::

    Scene, Shape                                        # frozen dataclasses
    sample_scene(rng: np.random.Generator) -> Scene
    scene_from_seed(seed: int) -> Scene
    render_scene(scene: Scene) -> PIL.Image.Image       # 64x64 RGB
    shape_index_map(scene: Scene) -> np.ndarray         # (64, 64) int, 0 = background, i+1 = shape i
    QUESTION_TYPES = ("describe", "colour", "count", "position")
#: Question types about two shapes (none in this world; v2 asks relations).
TWO_SHAPE_TYPES: tuple[str, ...] = ()
    make_question(scene, qtype, rng, rephrased=False) -> tuple[str, str]  # (question, reference answer)
    reference_answer(scene, qtype, target=None) -> str
    question_target(question) -> str | None             # the shape kind a question asks about
    extract_fact(qtype, text) -> str | None
    expected_fact(qtype, scene, question=None) -> str
    answer_is_correct(qtype, scene, generated_text, question=None) -> bool
    heldout_set(seed=0, n_per_type=50, rephrased=False) -> list[dict]  # image, prompt, answer, qtype, ...

Seeds: training scenes use ``scene_from_seed(s)`` with ``0 <= s < HELDOUT_SEED_START`` (10**9);
held-out scenes use seeds ``HELDOUT_SEED_START + seed * HELDOUT_STRIDE + i`` (never below 10**9), so
the two seed ranges are disjoint. (Two different seeds can still draw the same scene content by chance.)

The grid, the scene objects, sampling, painting, held-out sets and answer judging are shared with the
world v2 in `recap.embedded.grid`; this module holds v1's vocabulary, drawing and question/answer text.
"""

from __future__ import annotations

import re
from functools import partial

import numpy as np
from PIL import ImageDraw

from recap.embedded import grid

# `X as X`: re-exported, part of this module's public API since before the grid was shared.
from recap.embedded.grid import BACKGROUND as BACKGROUND
from recap.embedded.grid import GRID as GRID
from recap.embedded.grid import HELDOUT_SEED_START as HELDOUT_SEED_START
from recap.embedded.grid import HELDOUT_STRIDE as HELDOUT_STRIDE
from recap.embedded.grid import POSITIONS, Fill, GridShape, Scene
from recap.embedded.grid import heldout_seeds as heldout_seeds

IMAGE_SIZE = 64

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 25, 30),
    "green": (20, 165, 45),
    "blue": (30, 70, 235),
    "yellow": (245, 215, 0),
    "purple": (145, 40, 200),
    "black": (20, 20, 20),
}
KINDS = ("circle", "square", "triangle", "star")
SIZES = ("small", "large")
COUNT_WORDS = ("zero", "one", "two", "three", "four", "five")
QUESTION_TYPES = ("describe", "colour", "count", "position")
#: Question types about two shapes (none in this world; v2 asks relations).
TWO_SHAPE_TYPES: tuple[str, ...] = ()
MAX_SHAPES = 3

_RADIUS = {"small": 7, "large": 10}
_JITTER = {"small": 2, "large": 0}

#: The question phrasings the embedded model v1 was trained on (``{kind}``: the asked shape's kind).
TRAINING_QUESTIONS: dict[str, tuple[str, ...]] = {
    "describe": (
        "Describe the image.",
        "What do you see?",
        "What is in this picture?",
        "Describe this scene.",
        "What does the image show?",
    ),
    "colour": (
        "What colour is the {kind}?",
        "What color is the {kind}?",
        "Which colour does the {kind} have?",
        "Tell me the colour of the {kind}.",
    ),
    "count": (
        "How many shapes are there?",
        "How many shapes are in the image?",
        "Count the shapes.",
        "How many objects can you see?",
    ),
    "position": (
        "Where is the {kind}?",
        "Where is the {kind} located?",
        "In which part of the image is the {kind}?",
        "Where can you find the {kind}?",
    ),
}

#: World v1's questions phrased unlike every training template (``heldout_set(..., rephrased=True)``,
#: the benchmark's ``scenes-rephrased``): for checking that a drafter generalises to a user who does
#: not ask the way the training data did. The name is the `recap.embedded.World` interface's, so each
#: world has its own; world v2's (`recap.embedded.scenes2_questions`) is these and its own additions.
REPHRASED_QUESTIONS: dict[str, tuple[str, ...]] = {
    "describe": (
        "Can you tell me what this picture contains?",
        "Please give a short description of the picture.",
        "What objects are drawn here?",
        "Explain what is shown in this image.",
    ),
    "colour": (
        "Which color has the {kind} got?",
        "Can you name the colour of the {kind}?",
        "I wonder what colour the {kind} is.",
        "The {kind} in this picture: what colour is it?",
    ),
    "count": (
        "What is the number of shapes in this picture?",
        "Can you count how many shapes are drawn?",
        "How many things are drawn here?",
        "Tell me the number of objects.",
    ),
    "position": (
        "In what part of the picture is the {kind}?",
        "Can you tell me where the {kind} is?",
        "Where exactly is the {kind} placed?",
        "Which region of the image contains the {kind}?",
    ),
}


class Shape(GridShape):
    """A shape of world v1 (fields: see `GridShape`), its cell centres at 11, 32 and 53 px."""

    CELL_CENTRES = (11, 32, 53)


def sample_scene(rng: np.random.Generator, min_shapes: int = 1) -> Scene:
    """Draw a scene of ``min_shapes``..MAX_SHAPES shapes with distinct kinds, colours and cells."""
    return grid.sample_shapes(rng, Shape, (min_shapes, MAX_SHAPES), KINDS, list(COLOURS), SIZES, _JITTER)


def scene_from_seed(seed: int) -> Scene:
    """The scene drawn by ``sample_scene(np.random.default_rng(seed))``."""
    return sample_scene(np.random.default_rng(seed))


def _polygon(shape: Shape) -> list[tuple[float, float]] | None:
    """Vertices of a polygonal kind (None for a circle)."""
    cx, cy = shape.centre
    r = _RADIUS[shape.size]
    if shape.kind == "square":
        h = r * 0.85
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape.kind == "triangle":
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    if shape.kind == "star":
        return grid.star_points(cx, cy, r)
    return None


def _draw(draw: ImageDraw.ImageDraw, shape: Shape, fill: Fill, background: Fill) -> None:
    """Draw ``shape`` with ``fill`` (no kind of v1 has a hole, so ``background`` is not used)."""
    poly = _polygon(shape)
    if poly is None:
        cx, cy = shape.centre
        r = _RADIUS[shape.size]
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon(poly, fill=fill)


#: How this world draws its scenes (its size, colours, shapes) and tells them from other images.
DRAWING = grid.SceneDrawing(IMAGE_SIZE, COLOURS, _draw, 2 * max(_RADIUS.values()) + 1, MAX_SHAPES)
render_scene = DRAWING.render  # a 64x64 RGB image of a scene
shape_index_map = DRAWING.index_map  # (64, 64) uint8: 0 background, i + 1 where shape i is drawn
looks_like_scene = DRAWING.looks_like  # whether an image looks like a scene of this world (its pixels)


def _noun_phrase(shape: Shape, with_size: bool = True) -> str:
    size = f"{shape.size} " if with_size else ""
    return f"a {size}{shape.colour} {shape.kind}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _there_are(n: int) -> str:
    noun = "shape" if n == 1 else "shapes"
    verb = "is" if n == 1 else "are"
    return f"{verb} {COUNT_WORDS[n]} {noun}"


def reference_answer(scene: Scene, qtype: str, target: str | None = None) -> str:
    """The reference answer to a ``qtype`` question; ``target`` is the asked kind (colour/position)."""
    if qtype == "describe":
        parts = [f"{_noun_phrase(s)} in the {s.position}" for s in scene.shapes]
        return (
            f"The image shows {COUNT_WORDS[scene.count]} {'shape' if scene.count == 1 else 'shapes'} "
            f"on a white background: {_join(parts)}."
        )
    if qtype == "count":
        parts = [_noun_phrase(s, with_size=False) for s in scene.shapes]
        return f"There {_there_are(scene.count)} in the image: {_join(parts)} on a white background."
    shape = scene.shape_of_kind(target or "")
    if shape is None:
        raise ValueError(f"scene has no {target!r}")
    if qtype == "colour":
        return (
            f"The {shape.kind} is {shape.colour}. It is a {shape.size} {shape.colour} {shape.kind} "
            f"in the {shape.position} of the image, on a white background."
        )
    if qtype == "position":
        return (
            f"The {shape.kind} is in the {shape.position} of the image. It is "
            f"{_noun_phrase(shape)} on a white background."
        )
    raise ValueError(f"unknown question type {qtype!r}")


def make_question(
    scene: Scene, qtype: str, rng: np.random.Generator, rephrased: bool = False
) -> tuple[str, str]:
    """A (question, reference answer) pair; phrasing and asked shape are drawn from ``rng``
    (from `REPHRASED_QUESTIONS` instead of the training templates when ``rephrased``)."""
    templates = (REPHRASED_QUESTIONS if rephrased else TRAINING_QUESTIONS)[qtype]
    template = templates[int(rng.integers(len(templates)))]
    target = scene.shapes[int(rng.integers(scene.count))].kind
    return template.format(kind=target), reference_answer(scene, qtype, target)


_KIND_RE = re.compile(r"\b(" + "|".join(KINDS) + r")s?\b")
_COLOUR_RE = re.compile(r"\b(" + "|".join(COLOURS) + r")\b")
_COUNT_RE = re.compile(r"\b(" + "|".join(COUNT_WORDS) + r")\b")
_POSITION_RE = re.compile(r"\b(" + "|".join(sorted(POSITIONS, key=len, reverse=True)) + r")\b")
_MENTION_RE = re.compile(r"\b(" + "|".join(COLOURS) + r") (" + "|".join(KINDS) + r")\b")


def question_target(question: str) -> str | None:
    """The first shape kind named in ``question`` (None if it names none)."""
    m = _KIND_RE.search(question.lower())
    return m.group(1) if m else None


def extract_fact(qtype: str, text: str) -> str | None:
    """The canonical fact stated by ``text`` for ``qtype``, or None if it states none.

    describe: the sorted, ``;``-joined "colour kind" mentions; colour/count/position: the first
    colour word / count word / position phrase.
    """
    text = text.lower()
    if qtype == "describe":
        mentions = sorted({f"{c} {k}" for c, k in _MENTION_RE.findall(text)})
        return ";".join(mentions) or None
    pattern = {"colour": _COLOUR_RE, "count": _COUNT_RE, "position": _POSITION_RE}[qtype]
    m = pattern.search(text)
    return m.group(1) if m else None


def expected_fact(qtype: str, scene: Scene, question: str | None = None) -> str:
    """The true canonical fact; colour/position need the asked kind (from ``question``)."""
    if qtype == "describe":
        return ";".join(sorted(f"{s.colour} {s.kind}" for s in scene.shapes))
    if qtype == "count":
        return COUNT_WORDS[scene.count]
    kind = question_target(question or "")
    shape = scene.shape_of_kind(kind or "")
    if shape is None:
        raise ValueError(f"question {question!r} names no shape of the scene")
    return shape.colour if qtype == "colour" else shape.position


def answer_is_correct(qtype: str, scene: Scene, generated_text: str, question: str | None = None) -> bool:
    """Whether ``generated_text`` states the true canonical fact of ``scene`` for ``qtype``.

    For colour/position, the asked kind comes from ``question``; without it, from the first kind the
    answer names (so "The circle is red." is judged against the scene's circle).
    """
    return grid.answer_is_correct(
        qtype, scene, generated_text, question, ("colour", "position"), extract_fact, expected_fact
    )


def _ask(qtype: str, rng: np.random.Generator, rephrased: bool) -> tuple[Scene, str, str]:
    scene = sample_scene(rng)
    return scene, *make_question(scene, qtype, rng, rephrased)


def heldout_set(
    seed: int = 0, n_per_type: int = 50, rephrased: bool = False, qtypes: tuple[str, ...] = QUESTION_TYPES
) -> list[dict]:
    """Held-out examples, ``n_per_type`` per question type, grouped by type in ``qtypes`` order.

    Each dict has ``image`` (PIL), ``prompt``, ``answer``, ``qtype``, ``scene`` and ``seed`` (the scene
    seed, disjoint from training seeds). The question phrasing is drawn from the scene seed too, from
    `REPHRASED_QUESTIONS` when ``rephrased``.
    """
    ask = partial(_ask, rephrased=rephrased)
    return grid.heldout_examples(seed, n_per_type, QUESTION_TYPES, qtypes, ask, render_scene)

"""Synthetic shape scenes v2: questions, reference answers and fact checkers of the embedded model v2.

Scenes (1-5 shapes, 12 colours, 8 kinds, 3 sizes, a 3x3 grid, 96x96 pixels) come from
`recap.embedded.scenes2_draw` (on the grid of `recap.embedded.grid`, shared with world v1), whose public
names this
module re-exports. Every answer carries machine-checkable
facts; ``answer_is_correct`` judges a generated answer by them:

========== ============================================= ===============================================
qtype      example question                              facts checked
========== ============================================= ===============================================
describe   "Describe the image."                         the set of (colour, kind) pairs mentioned
colour     "What colour is the circle?"                  the first colour word
count      "How many shapes are there?"                  the first count word
position   "Where is the star?"                          the first position phrase
relation   "Where is the star relative to the circle?"   left/right/same column, above/below/same row
                                                         and larger/smaller/same size, all three
detail     "Describe the image in detail."               every fact: the count, each shape's size,
                                                         colour, kind and cell, each relation sentence,
                                                         and no (colour, kind) pair outside the scene
========== ============================================= ===============================================

Detailed descriptions run 60-150 tokens: a sentence per shape, a sentence relating each shape to the one
before it, and a closing list, so each shape's colour and kind recur within the answer.

Training uses the phrasings of ``TRAINING_QUESTIONS``; ``REPHRASED_QUESTIONS`` are kept out of training
(no string in common) to test how a model generalises to other phrasings. Both live in
`recap.embedded.scenes2_questions` and are re-exported here.

Seeds: training scenes use seeds in ``[0, HELDOUT_SEED_START)``; held-out set ``s`` uses
``HELDOUT_SEED_START + s * HELDOUT_STRIDE + i``, so the two ranges are disjoint.
"""

from __future__ import annotations

import re
from functools import partial

import numpy as np

from recap.embedded import grid
from recap.embedded.grid import (
    BACKGROUND,
    GRID,
    HELDOUT_SEED_START,
    HELDOUT_STRIDE,
    POSITIONS,
    Scene,
    heldout_seeds,
)
from recap.embedded.scenes2_draw import (
    CELL,
    COLOURS,
    IMAGE_SIZE,
    KINDS,
    MAX_SHAPES,
    SIZES,
    Shape,
    horizontal_relation,
    looks_like_scene,
    render_scene,
    sample_scene,
    scene_from_seed,
    shape_index_map,
    size_relation,
    vertical_relation,
)
from recap.embedded.scenes2_questions import REPHRASED_QUESTIONS, TRAINING_QUESTIONS

__all__ = [
    "BACKGROUND",
    "CELL",
    "COLOURS",
    "COUNT_WORDS",
    "GRID",
    "HELDOUT_SEED_START",
    "HELDOUT_STRIDE",
    "IMAGE_SIZE",
    "KINDS",
    "MAX_SHAPES",
    "POSITIONS",
    "QUESTION_TYPES",
    "REPHRASED_QUESTIONS",
    "SIZES",
    "TRAINING_QUESTIONS",
    "Scene",
    "Shape",
    "answer_is_correct",
    "answer_with_spans",
    "expected_fact",
    "extract_fact",
    "heldout_seeds",
    "heldout_set",
    "horizontal_relation",
    "looks_like_scene",
    "make_question",
    "question_targets",
    "reference_answer",
    "render_scene",
    "sample_scene",
    "scene_from_seed",
    "shape_index_map",
    "size_relation",
    "vertical_relation",
]

COUNT_WORDS = ("zero", "one", "two", "three", "four", "five", "six")
QUESTION_TYPES = ("describe", "colour", "count", "position", "relation", "detail")
#: Question types that name one shape ({kind}) or two ({kind}, {other}).
ONE_SHAPE_TYPES = ("colour", "position")
TWO_SHAPE_TYPES = ("relation",)


# ------------------------------------------------------------------------------------------ answers
class _AnswerWriter:
    """Builds an answer piece by piece, recording which characters are about which shape."""

    def __init__(self, scene: Scene):
        self.index = {s: i + 1 for i, s in enumerate(scene.shapes)}
        self.text = ""
        self.spans: list[tuple[int, int, int]] = []

    def add(self, text: str, shape: Shape | None = None) -> None:
        if shape is not None:
            self.spans.append((len(self.text), len(self.text) + len(text), self.index[shape]))
        self.text += text


def _shapes_word(n: int) -> str:
    return f"{COUNT_WORDS[n]} {'shape' if n == 1 else 'shapes'}"


def _write_list(w: _AnswerWriter, shapes: tuple[Shape, ...], phrase) -> None:
    for i, shape in enumerate(shapes):
        if i:
            w.add(" and " if i == len(shapes) - 1 else ", ")
        w.add(phrase(shape), shape)


# Relation words of a detailed description ("..., below it and larger."), shorter than a relation answer's.
_DETAIL_VERTICAL = {"above": "above it", "below": "below it", "in the same row as": "in the same row"}
_DETAIL_SIZE = {"larger than": "larger", "smaller than": "smaller", "the same size as": "the same size"}


#: The answers about one asked shape ``s``.
_ONE_SHAPE_ANSWERS = {
    "colour": (
        "The {s.kind} is {s.colour}. It is a {s.size} {s.name} in the {s.position} of the image, "
        "on a white background."
    ),
    "position": (
        "The {s.kind} is in the {s.position} of the image. It is a {s.size} {s.name} on a white background."
    ),
}


def _write_detail(w: _AnswerWriter, scene: Scene) -> None:
    w.add(f"The image shows {_shapes_word(scene.count)} on a white background.")
    previous = None
    for shape in scene.shapes:
        w.add(" ")
        w.add(f"There is a {shape.size} {shape.name} in the {shape.position}.", shape)
        if previous is not None:
            w.add(" ")
            w.add(f"The {shape.name}", shape)
            w.add(f" is {horizontal_relation(shape, previous)} the {previous.name}, ", previous)
            w.add(
                f"{_DETAIL_VERTICAL[vertical_relation(shape, previous)]} and "
                f"{_DETAIL_SIZE[size_relation(shape, previous)]}.",
                previous,
            )
        previous = shape
    if scene.count == 1:
        only = scene.shapes[0]
        w.add(" ")
        w.add(
            f"The {only.name} is the only shape, so nothing is left of it, right of it, "
            "above it or below it.",
            only,
        )
    if scene.count <= 2:
        w.add(" The rest of the picture is empty white background.")
    if scene.count == MAX_SHAPES:  # keeps the longest answers within 150 tokens
        return
    w.add(f" In total there {'is' if scene.count == 1 else 'are'} {_shapes_word(scene.count)}: ")
    _write_list(w, scene.shapes, lambda s: f"a {s.name}")
    w.add(".")


def answer_with_spans(
    scene: Scene, qtype: str, targets: tuple[str, ...] = ()
) -> tuple[str, list[tuple[int, int, int]]]:
    """The reference answer and its shape spans ``(start, end, shape_index + 1)``: the characters that
    are about one shape (what a training-only binding loss may supervise). ``targets`` are the asked
    kinds (one for colour/position, two for relation). For colour and position the whole answer, and the
    eos after it (``end = len(answer) + 1``), is about the asked shape."""
    w = _AnswerWriter(scene)
    asked = [scene.shape_of_kind(k) for k in targets]
    needed = 1 if qtype in ONE_SHAPE_TYPES else 2 if qtype in TWO_SHAPE_TYPES else 0
    if len(asked) < needed or None in asked[:needed]:
        raise ValueError(f"a {qtype!r} answer needs {needed} kinds of the scene, got {targets!r}")
    if qtype == "describe":
        w.add(f"The image shows {_shapes_word(scene.count)} on a white background: ")
        _write_list(w, scene.shapes, lambda s: f"a {s.size} {s.name} in the {s.position}")
        w.add(".")
    elif qtype == "count":
        w.add(f"There {'is' if scene.count == 1 else 'are'} {_shapes_word(scene.count)} in the image: ")
        _write_list(w, scene.shapes, lambda s: f"a {s.name}")
        w.add(" on a white background.")
    elif qtype in ONE_SHAPE_TYPES:
        w.add(_ONE_SHAPE_ANSWERS[qtype].format(s=asked[0]))
        w.spans.append((0, len(w.text) + 1, w.index[asked[0]]))
    elif qtype == "relation":
        a, b = asked[:2]
        w.add(f"The {a.kind}", a)
        w.add(f" is {horizontal_relation(a, b)} the {b.kind} and {vertical_relation(a, b)} it.", b)
        w.add(" ")
        w.add(f"The {a.name}", a)
        w.add(f" is {size_relation(a, b)} the {b.name}.", b)
    elif qtype == "detail":
        _write_detail(w, scene)
    else:
        raise ValueError(f"unknown question type {qtype!r}")
    return w.text, w.spans


def reference_answer(scene: Scene, qtype: str, targets: tuple[str, ...] | str = ()) -> str:
    """The reference answer to a ``qtype`` question about the asked kinds ``targets``."""
    return answer_with_spans(scene, qtype, (targets,) if isinstance(targets, str) else tuple(targets))[0]


def _questions(rephrased: bool) -> dict[str, tuple[str, ...]]:
    return REPHRASED_QUESTIONS if rephrased else TRAINING_QUESTIONS


def make_question(
    scene: Scene, qtype: str, rng: np.random.Generator, rephrased: bool = False
) -> tuple[str, str]:
    """A (question, reference answer) pair; phrasing and asked shapes are drawn from ``rng`` (from
    `REPHRASED_QUESTIONS` when ``rephrased``). Relation questions need a scene of 2+ shapes."""
    question, answer, _ = make_question_with_spans(scene, qtype, rng, rephrased)
    return question, answer


def make_question_with_spans(
    scene: Scene, qtype: str, rng: np.random.Generator, rephrased: bool = False
) -> tuple[str, str, list[tuple[int, int, int]]]:
    """`make_question` plus the answer's shape spans (see `answer_with_spans`)."""
    if qtype not in QUESTION_TYPES:
        raise ValueError(f"unknown question type {qtype!r}")
    templates = _questions(rephrased)[qtype]
    template = templates[int(rng.integers(len(templates)))]
    n_asked = 2 if qtype in TWO_SHAPE_TYPES else 1
    if scene.count < n_asked:
        raise ValueError(f"a {qtype!r} question needs {n_asked} shapes, the scene has {scene.count}")
    picked = rng.choice(scene.count, size=n_asked, replace=False)
    targets = tuple(scene.shapes[int(i)].kind for i in picked)
    question = template.format(kind=targets[0], other=targets[-1])
    answer, spans = answer_with_spans(scene, qtype, targets)
    return question, answer, spans


# ------------------------------------------------------------------------------------------ facts
def _alternation(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_COLOUR, _KIND = _alternation(COLOURS), _alternation(KINDS)
_POSITION, _SIZE = _alternation(POSITIONS), _alternation(SIZES)
_HORIZONTAL = _alternation(("left of", "right of", "in the same column as"))
_VERTICAL = _alternation(("above", "below", "in the same row as"))
_SIZE_REL = _alternation(("larger than", "smaller than", "the same size as"))
_KIND_RE = re.compile(rf"\b({_KIND})s?\b")
_COLOUR_RE = re.compile(rf"\b({_COLOUR})\b")
_COUNT_RE = re.compile(r"\b(" + "|".join(COUNT_WORDS) + r")\b")
_POSITION_RE = re.compile(rf"\b({_POSITION})\b")
_MENTION_RE = re.compile(rf"\b({_COLOUR}) ({_KIND})\b")
_HORIZONTAL_RE = re.compile(rf"\b({_HORIZONTAL})\b")
_VERTICAL_RE = re.compile(rf"\b({_VERTICAL})\b")
_SIZE_REL_RE = re.compile(rf"\b({_SIZE_REL})\b")
_SHAPE_SENTENCE_RE = re.compile(rf"\bthere is an? ({_SIZE}) ({_COLOUR}) ({_KIND}) in the ({_POSITION})\b")
_RELATION_SENTENCE_RE = re.compile(
    rf"\bthe ({_COLOUR}) ({_KIND}) is ({_HORIZONTAL}) the ({_COLOUR}) ({_KIND}), "
    rf"({_alternation(_DETAIL_VERTICAL.values())}) and ({_alternation(_DETAIL_SIZE.values())})\."
)


def question_targets(question: str) -> tuple[str, ...]:
    """The shape kinds named in ``question``, in order, without repeats."""
    found = _KIND_RE.findall(question.lower())
    return tuple(dict.fromkeys(found))


def extract_fact(qtype: str, text: str) -> str | None:
    """The facts ``text`` states for ``qtype`` as one canonical string, or None if it states none.

    describe: sorted ``;``-joined "colour kind" mentions; colour/count/position: the first colour word /
    count word / position phrase; relation: "horizontal|vertical|size", the first phrase of each;
    detail: "count|shape statements|relation statements|mentions", each part sorted and ``;``-joined.
    """
    text = text.lower()
    if qtype == "describe":
        return ";".join(sorted({" ".join(m) for m in _MENTION_RE.findall(text)})) or None
    if qtype in ("colour", "count", "position"):
        pattern = {"colour": _COLOUR_RE, "count": _COUNT_RE, "position": _POSITION_RE}[qtype]
        m = pattern.search(text)
        return m.group(1) if m else None
    if qtype == "relation":
        found = [p.search(text) for p in (_HORIZONTAL_RE, _VERTICAL_RE, _SIZE_REL_RE)]
        return "|".join(m.group(1) for m in found) if all(found) else None
    if qtype == "detail":
        count = _COUNT_RE.search(text)
        if count is None:
            return None
        shapes = sorted({" ".join(m) for m in _SHAPE_SENTENCE_RE.findall(text)})
        relations = sorted({" ".join(m) for m in _RELATION_SENTENCE_RE.findall(text)})
        mentions = sorted({" ".join(m) for m in _MENTION_RE.findall(text)})
        return "|".join([count.group(1), ";".join(shapes), ";".join(relations), ";".join(mentions)])
    raise ValueError(f"unknown question type {qtype!r}")


def expected_fact(qtype: str, scene: Scene, question: str | None = None) -> str:
    """The true facts in `extract_fact`'s form; colour/position/relation need the asked kinds, read
    from ``question``. Raises ValueError when the question names no (or too few) shapes of the scene."""
    if qtype in ONE_SHAPE_TYPES + TWO_SHAPE_TYPES:
        targets = question_targets(question or "")
        needed = 2 if qtype in TWO_SHAPE_TYPES else 1
        shapes = [scene.shape_of_kind(k) for k in targets[:needed]]
        if len(shapes) < needed or None in shapes:
            raise ValueError(f"question {question!r} names no {needed} shapes of the scene")
        if qtype == "colour":
            return shapes[0].colour
        if qtype == "position":
            return shapes[0].position
        a, b = shapes
        return "|".join((horizontal_relation(a, b), vertical_relation(a, b), size_relation(a, b)))
    if qtype == "count":
        return COUNT_WORDS[scene.count]
    if qtype == "describe":
        return ";".join(sorted(s.name for s in scene.shapes))
    if qtype == "detail":
        fact = extract_fact("detail", reference_answer(scene, "detail"))
        assert fact is not None
        return fact
    raise ValueError(f"unknown question type {qtype!r}")


def answer_is_correct(qtype: str, scene: Scene, generated_text: str, question: str | None = None) -> bool:
    """Whether ``generated_text`` states exactly the true facts of ``scene`` for ``qtype``.

    For colour/position/relation the asked kinds come from ``question``; without it, from the kinds the
    answer names first ("The circle is red." is judged against the scene's circle). For detail every
    statement of the reference must be there and right, and no colour-kind pair outside the scene named.
    """
    asking = ONE_SHAPE_TYPES + TWO_SHAPE_TYPES
    return grid.answer_is_correct(qtype, scene, generated_text, question, asking, extract_fact, expected_fact)


# ------------------------------------------------------------------------------------------ held-out
def _ask(qtype: str, rng: np.random.Generator, rephrased: bool) -> tuple[Scene, str, str]:
    scene = sample_scene(rng, min_shapes=2 if qtype in TWO_SHAPE_TYPES else 1)
    return scene, *make_question(scene, qtype, rng, rephrased)


def heldout_set(
    seed: int = 0, n_per_type: int = 50, rephrased: bool = False, qtypes: tuple[str, ...] = QUESTION_TYPES
) -> list[dict]:
    """Held-out examples, ``n_per_type`` per question type, grouped by type in ``qtypes`` order.

    Each dict has ``image`` (PIL), ``prompt``, ``answer``, ``qtype``, ``scene`` and ``seed`` (the scene
    seed, disjoint from training seeds). Scene and phrasing are drawn from the scene seed (relation
    scenes have 2+ shapes), the phrasing from `REPHRASED_QUESTIONS` when ``rephrased``.
    """
    ask = partial(_ask, rephrased=rephrased)
    return grid.heldout_examples(seed, n_per_type, QUESTION_TYPES, qtypes, ask, render_scene)

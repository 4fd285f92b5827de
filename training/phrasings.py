"""Extra training phrasings of the v2 questions, generated from parts (training data only).

The embedded model v2 learned relation questions from the eight phrasings of
`recap.embedded.scenes2_questions.TRAINING_QUESTIONS` and generalised poorly to phrasings it never saw.
This module
composes many more from the question's meaning, "where is X relative to Y": question frames that name
the subject (``{kind}``) first or last, crossed with words that mark the reference shape (``{other}``).
The answer is always about ``{kind}``, whichever order the question names the two shapes in. The same
frames without the reference shape are position questions, and the other four types get a few new
phrasings each: fine-tuned with new relation phrasings alone, the model took any unfamiliar "where"
question for a relation question (held-out position fell from 1.00 to 0.11), and with new relation and
position phrasings alone, unfamiliar count and detail questions got relation answers (see the model
card's runs).

These phrasings were written from the questions' meaning, not from the held-out phrasings
(`REPHRASED_QUESTIONS`), and reworded where this check flagged an overlap: tests/test_train_embedded.py
checks that none of them equals, contains or is contained in a held-out
phrasing, that they use no word only the held-out phrasings use, and that every three-word sequence they
share with a held-out phrasing is one the original training phrasings already had. Only training data
generation (`training.data`, ``--extra-phrasing-share``) uses them; the bench's datasets and
held-out sets never do.
"""

from __future__ import annotations

from itertools import product
from types import ModuleType

import numpy as np

from recap.embedded.scenes2_questions import TRAINING_QUESTIONS

#: Words after which the reference shape follows ("... the {kind} <cue> the {other}").
REFERENCE_CUES = (
    "relative to",
    "compared with",
    "compared to",
    "with respect to",
    "in comparison with",
    "in comparison to",
    "as seen from",
    "with reference to",
    "measured against",
    "versus",
    "when compared with",
    "in respect to",
)

#: Frames that name the subject first. ``{ref}`` is the reference clause: " <cue> the {other}" in a
#: relation question, nothing in a position question. The same frames ask both questions, so only the
#: second shape and its cue tell a relation question from a position question, never the wording.
SUBJECT_FIRST_FRAMES = (
    "Where is the {kind}{ref}?",
    "Where does the {kind} lie{ref}?",
    "Where does the {kind} stand{ref}?",
    "Where is the {kind} drawn{ref}?",
    "Where is the {kind} placed{ref}?",
    "How is the {kind} arranged{ref}?",
    "What is the location of the {kind}{ref}?",
    "State the location of the {kind}{ref}.",
    "Describe the placement of the {kind}{ref}.",
    "Give the placement of the {kind}{ref}.",
    "Explain the location of the {kind}{ref}.",
    "Where do we find the {kind}{ref}?",
    "How is the {kind} laid out{ref}, and how big is it?",
    "Report the {kind}'s place and size{ref}.",
)

#: Position questions only (one shape).
POSITION_QUESTIONS = (
    "Which cell of the grid holds the {kind}?",
    "In which area does the {kind} appear?",
    "Where on the canvas is the {kind} drawn?",
    "Give the grid cell of the {kind}.",
    "Is the {kind} near the top, the middle or the bottom, and on which side?",
)

#: Subject-last frames: the reference shape is named first, the answer is still about ``{kind}``.
SUBJECT_LAST_FRAMES = (
    "Relative to the {other}, where is the {kind}?",
    "Compared with the {other}, where is the {kind}?",
    "Taking the {other} as reference, where is the {kind}?",
    "Seen from the {other}, where is the {kind}?",
    "With the {other} as the reference, describe the location of the {kind}.",
    "Using the {other} as a landmark, locate the {kind}.",
    "Measured from the {other}, where does the {kind} lie?",
    "Start at the {other}: where is the {kind} from there?",
)

#: Whole questions that need no cue.
WHOLE_QUESTIONS = (
    "Is the {kind} to the left or to the right of the {other}, higher or lower, and larger or smaller?",
    "Which way from the {other} is the {kind}? Which of the two is bigger?",
    "Left or right, above or below, bigger or smaller: the {kind} versus the {other}?",
    "Going from the {other} to the {kind}, which way do you move?",
    "Which is further left, which is higher and which is larger: the {kind} or the {other}?",
    "Give the direction from the {other} to the {kind}, then compare their sizes.",
)


def relation_phrasings() -> tuple[str, ...]:
    """Every generated relation phrasing (templates with ``{kind}`` = subject, ``{other}`` = reference),
    without repeats and without the `TRAINING_QUESTIONS` phrasings it recomposes, in a fixed order."""
    composed = [
        frame.format(kind="{kind}", ref=f" {cue} the {{other}}")
        for frame, cue in product(SUBJECT_FIRST_FRAMES, REFERENCE_CUES)
    ]
    return _new("relation", [*composed, *SUBJECT_LAST_FRAMES, *WHOLE_QUESTIONS])


def position_phrasings() -> tuple[str, ...]:
    """Every generated position phrasing: `SUBJECT_FIRST_FRAMES` without a reference clause, and
    `POSITION_QUESTIONS`."""
    return _new(
        "position", [*(f.format(kind="{kind}", ref="") for f in SUBJECT_FIRST_FRAMES), *POSITION_QUESTIONS]
    )


def _new(qtype: str, templates: list[str]) -> tuple[str, ...]:
    original = set(TRAINING_QUESTIONS[qtype])
    return tuple(t for t in dict.fromkeys(templates) if t not in original)


#: Phrasings of the other four types, so that no type is the only one asked in unfamiliar words (with
#: relation and position phrasings alone, held-out count and detail questions got relation answers).
OTHER_QUESTIONS: dict[str, tuple[str, ...]] = {
    "describe": (
        "Give a brief description of the image.",
        "Sum up the picture.",
        "What does this scene contain?",
        "Describe the picture briefly.",
        "Give an overview of the image.",
        "List the shapes you see.",
        "What is drawn on the canvas?",
        "In a sentence, what does the picture show?",
    ),
    "colour": (
        "Say the colour of the {kind}.",
        "What colour was the {kind} painted?",
        "In what colour is the {kind} drawn?",
        "Give the colour of the {kind}.",
        "State the {kind}'s colour.",
        "What shade is the {kind}?",
        "Report the color of the {kind}.",
        "Which colour was used for the {kind}?",
    ),
    "count": (
        "How many shapes can be seen?",
        "What number of shapes is drawn?",
        "Give the count of the shapes.",
        "Count everything that is drawn.",
        "How many shapes appear in the picture?",
        "How many items are there?",
        "How many figures does the picture hold?",
        "State how many shapes there are.",
        "What is the total number of shapes?",
    ),
    "detail": (
        "Describe the picture in full detail.",
        "Go through the image shape by shape and describe each one in detail.",
        "Give a thorough description of the image.",
        "Describe all the shapes and their relations in detail.",
        "Write a long, detailed description of the picture.",
        "Describe the image thoroughly.",
        "Provide a detailed description of the scene.",
        "Walk me through the image in detail.",
    ),
}


#: Extra training phrasings per question type.
EXTRA_TRAINING_QUESTIONS: dict[str, tuple[str, ...]] = {
    "relation": relation_phrasings(),
    "position": position_phrasings(),
    **{qtype: _new(qtype, list(qs)) for qtype, qs in OTHER_QUESTIONS.items()},
}


def ask_in_extra_phrasing(
    scenes: ModuleType, scene, qtype: str, templates: tuple[str, ...], rng: np.random.Generator
) -> tuple[str, str, list[tuple[int, int, int]]]:
    """Like ``scenes.make_question_with_spans`` (v2) with a phrasing drawn from ``templates``: (question,
    reference answer, its shape spans). ``{kind}`` is the first asked shape, the answer's subject,
    wherever the template names it; ``{other}`` the second (relation)."""
    template = templates[int(rng.integers(len(templates)))]
    n_asked = 2 if qtype in scenes.TWO_SHAPE_TYPES else 1
    picked = rng.choice(scene.count, size=n_asked, replace=False)
    targets = tuple(scene.shapes[int(i)].kind for i in picked)
    answer, spans = scenes.answer_with_spans(scene, qtype, targets)
    return template.format(kind=targets[0], other=targets[-1]), answer, spans

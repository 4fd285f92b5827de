"""Extra training phrasings of the v2 relation question, generated from parts (training data only).

The embedded model v2 learned relation questions from the eight phrasings of
`recap.scene2_questions.TRAINING_QUESTIONS` and generalised poorly to phrasings it never saw. This module
composes many more from the question's meaning, "where is X relative to Y": question frames that name
the subject (``{kind}``) first or last, crossed with words that mark the reference shape (``{other}``).
The answer is always about ``{kind}``, whichever order the question names the two shapes in.

These phrasings were written without the held-out phrasings (`REPHRASED_QUESTIONS`) as a source;
tests/test_train_embedded.py checks that none of them equals, contains or is contained in a held-out
phrasing, that they use no word only the held-out phrasings use, and that every three-word sequence they
share with a held-out phrasing is one the original training phrasings already had. Only training data
generation (`tools.embedded_data`, ``--extra-relation-share``) uses them; the bench's datasets and
held-out sets never do.
"""

from __future__ import annotations

from itertools import product

from recap.scene2_questions import TRAINING_QUESTIONS

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

#: Subject-first frames: ``{cue}`` is one of `REFERENCE_CUES`.
SUBJECT_FIRST_FRAMES = (
    "Where is the {kind} {cue} the {other}?",
    "Where does the {kind} lie {cue} the {other}?",
    "Where does the {kind} stand {cue} the {other}?",
    "Where is the {kind} drawn {cue} the {other}?",
    "Where is the {kind} placed {cue} the {other}?",
    "How is the {kind} arranged {cue} the {other}?",
    "What is the location of the {kind} {cue} the {other}?",
    "State the location of the {kind} {cue} the {other}.",
    "Describe the placement of the {kind} {cue} the {other}.",
    "Give the placement of the {kind} {cue} the {other}.",
    "Explain the location of the {kind} {cue} the {other}.",
    "Where do we find the {kind} {cue} the {other}?",
    "How is the {kind} laid out {cue} the {other}, and how big is it?",
    "Report the {kind}'s place and size {cue} the {other}.",
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
        frame.format(kind="{kind}", other="{other}", cue=cue)
        for frame, cue in product(SUBJECT_FIRST_FRAMES, REFERENCE_CUES)
    ]
    original = set(TRAINING_QUESTIONS["relation"])
    return tuple(
        t for t in dict.fromkeys([*composed, *SUBJECT_LAST_FRAMES, *WHOLE_QUESTIONS]) if t not in original
    )


#: Extra training phrasings per question type (only relation has any).
EXTRA_TRAINING_QUESTIONS: dict[str, tuple[str, ...]] = {"relation": relation_phrasings()}

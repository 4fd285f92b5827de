"""The phrasings of the embedded model v2's questions: those used in training and those kept out of it.

``{kind}`` (and ``{other}`` for relations) stand for the asked shapes' kinds. No phrasing of
``REPHRASED_QUESTIONS`` equals or contains a training phrasing, or is contained in one
(tests/test_scenes2.py), so a model is tested on phrasings it never saw. Re-exported by
`recap.embedded.scenes2`.
"""

from __future__ import annotations

from recap.embedded.scenes import REPHRASED_QUESTIONS as _V1_REPHRASED
from recap.embedded.scenes import TRAINING_QUESTIONS as _V1_TRAINING

#: The phrasings the embedded model v2 was trained on: world v1's (`recap.embedded.scenes.TRAINING_QUESTIONS`)
#: first, then v2's own, and the relation and detail types.
TRAINING_QUESTIONS: dict[str, tuple[str, ...]] = {
    "describe": (
        *_V1_TRAINING["describe"],
        "Briefly describe the picture.",
        "What is shown here?",
        "Summarize the image.",
        "What can you see in the image?",
        "Give a short summary of the scene.",
    ),
    "colour": (
        *_V1_TRAINING["colour"],
        "What is the colour of the {kind}?",
        "What color is the {kind} in the image?",
        "The {kind} is which colour?",
        "Which color is the {kind}?",
        "What is the color of the {kind} in this picture?",
    ),
    "count": (
        *_V1_TRAINING["count"],
        "How many shapes do you see?",
        "Count the objects in the picture.",
        "How many shapes does the image contain?",
        "How many figures are drawn?",
        "Give the number of shapes in the image.",
    ),
    "position": (
        *_V1_TRAINING["position"],
        "Where is the {kind} in the image?",
        "What is the position of the {kind}?",
        "Which part of the picture shows the {kind}?",
        "Locate the {kind}.",
        "Where does the {kind} appear?",
    ),
    "relation": (
        "Where is the {kind} relative to the {other}?",
        "How is the {kind} placed compared with the {other}?",
        "Describe the position of the {kind} relative to the {other}.",
        "Where is the {kind} compared to the {other}?",
        "Compare the {kind} with the {other}.",
        "How does the {kind} relate to the {other} in position and size?",
        "Where is the {kind} with respect to the {other}?",
        "Is the {kind} left or right of the {other}, above or below it, and is it bigger?",
    ),
    "detail": (
        "Describe the image in detail.",
        "Give a detailed description of the image.",
        "Describe everything you see in detail.",
        "Tell me everything about this picture.",
        "Write a detailed description of the scene.",
        "Describe each shape in the image and how they are placed.",
        "Explain the picture in detail.",
        "What is in the image? Please be detailed.",
        "Give a full and detailed account of the image.",
        "Describe the scene in detail, shape by shape.",
    ),
}

#: World v2's phrasings never used in training (``heldout_set(..., rephrased=True)``, the benchmark's
#: ``scenes2-rephrased``): world v1's held-out phrasings (`recap.embedded.scenes.REPHRASED_QUESTIONS`,
#: the same name since it is the `recap.embedded.World` interface's), one more position phrasing, and
#: the relation and detail types.
REPHRASED_QUESTIONS: dict[str, tuple[str, ...]] = {
    **_V1_REPHRASED,
    "position": (*_V1_REPHRASED["position"], "Tell me where the {kind} is."),
    "relation": (
        "Where does the {kind} sit in relation to the {other}?",
        "Can you compare the {kind} and the {other}?",
        "Tell me how the {kind} is positioned next to the {other}.",
        "What is the position and size of the {kind} relative to the {other}?",
    ),
    "detail": (
        "Can you give me a detailed description of this picture?",
        "I would like a detailed account of everything in this image.",
        "Describe the picture fully, with every detail.",
        "Please tell me everything this image contains, in detail.",
    ),
}

"""The Run tab's note when an embedded model is given an image that is not a scene of its world.

An embedded model knows nothing but drawn scenes of coloured shapes: asked about a photo it answers as
if the photo were such a scene, fluently and wrongly. Whether the image looks like a scene is decided
from its pixels (`recap.embedded.World.looks_like_scene`), never from its file name; when it does not,
the run's status carries `scene_note` from the first step on, beside "Generating…", "Done" and
"Stopped". The run itself is unchanged (it decodes as ever: the note only says what to expect), and the
note names the model to pick for photos where this server offers one, or says that it offers none.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from recap.embedded import embedded_world
from recap.studio.environment import CPU_HUB_MODEL, EMBEDDED_FOLDERS, PAPER_MODELS, model_label
from recap.studio.ui.render import markdown_text


def knows_photos(model_id: str) -> bool:
    """Whether ``model_id`` is not an embedded model (of a world of drawn scenes)."""
    return embedded_world(EMBEDDED_FOLDERS.get(model_id, Path(model_id))) is None


def photo_advice(offered: Sequence[str]) -> str:
    """Which model of ``offered`` to pick for photos: the paper's first real VLM offered, else the other
    models offered (the CPU hub model among them), else that this server offers none (the paper's models
    need a GPU, the CPU hub model the hub)."""
    others = [m for m in offered if knows_photos(m)]
    real = [m for m in PAPER_MODELS if m in others]
    if real:
        return f"For photos, pick {markdown_text(real[0])} in Model: a real VLM."
    if others:
        names = ", ".join(markdown_text(model_label(m)) for m in others)
        return f"For photos, pick another model in Model ({names})."
    return (
        f"For photos you need a real VLM: the studio offers {markdown_text(PAPER_MODELS[0])} on a server "
        f"with a GPU and {markdown_text(model_label(CPU_HUB_MODEL))} on one that reaches the "
        "Hugging Face hub; this server offers none."
    )


def scene_note(model_id: str, image: Image.Image | None, offered: Sequence[str]) -> str | None:
    """The note for a run of ``model_id`` on ``image`` (the image as the model receives it), or None:
    None for a model that is not embedded, for no image, and for an image that looks like a scene of the
    model's world."""
    world = embedded_world(EMBEDDED_FOLDERS.get(model_id, Path(model_id)))
    if world is None or image is None or world.looks_like_scene(image):
        return None
    label = markdown_text(model_label(model_id))
    return (
        "**Note: this image does not look like a drawn scene of coloured shapes**, the only thing "
        f"{label} knows: it will answer as if it were one. {photo_advice(offered)}"
    )


def with_note(status: str, note: str | None) -> str:
    """``status`` (Markdown) with ``note``, if any, as its own paragraph after it, just above the answer."""
    return f"{status}\n\n{note}" if note else status

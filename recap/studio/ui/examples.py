"""The studio's example inputs, the sensitivity tab's replacement images, and examples that follow the
chosen model.

Each embedded model has its own held-out scenes: assets/examples-v2/prompts.json for v2 (``embedded-v2``,
the default), assets/examples/prompts.json for v1 (``embedded-v1``); any other model (a real VLM) is shown
the photos of assets/examples-photos (public-domain photos with the benchmark's prompts,
`recap.bench.datasets.PHOTO_PROMPTS`), then v1's scenes.
The Run tab shows the example set of the chosen model only (`wire_examples`), and the sensitivity
tab's replacement scenes come from the same folder as the run's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from recap.hotstart import WarmupRequest
from recap.inputs import check_choice, load_image
from recap.studio.environment import DEFAULT_MODEL_ID, EMBEDDED_V1_ID, EMBEDDED_V2_ID, ROOT

EXAMPLES_V1_DIR = ROOT / "assets" / "examples"
EXAMPLES_V2_DIR = EXAMPLES_V1_DIR.with_name("examples-v2")
#: The photos for real VLMs (CC0 and public-domain photos of scikit-image's data; README.md there).
PHOTOS_DIR = EXAMPLES_V1_DIR.with_name("examples-photos")
#: Each embedded model's example scenes (held-out scenes of its own world); other models use v1's.
EXAMPLE_DIRS = {EMBEDDED_V2_ID: EXAMPLES_V2_DIR, EMBEDDED_V1_ID: EXAMPLES_V1_DIR}
#: Every folder an example image may come from (the studio reads images from these and its uploads).
EXAMPLE_ROOTS = (*EXAMPLE_DIRS.values(), PHOTOS_DIR)
#: The example set of models that are not embedded: the photos, then v1's scenes.
OTHER_SET = "other"
BLANK_IMAGE = "blank (grey)"


def examples_dir(model_id: object = DEFAULT_MODEL_ID) -> Path:
    """The folder of ``model_id``'s example scenes (v1's for any model that is not embedded)."""
    return EXAMPLE_DIRS.get(model_id, EXAMPLES_V1_DIR) if isinstance(model_id, str) else EXAMPLES_V1_DIR


def examples(model_id: object = DEFAULT_MODEL_ID) -> list[list[str]]:
    """``[image path, prompt]`` rows of ``model_id``'s examples (`examples_dir`; empty if its
    prompts.json is not there yet)."""
    return _listed(examples_dir(model_id))


def _listed(folder: Path) -> list[list[str]]:
    """``[image path, prompt]`` rows of ``folder``'s prompts.json whose image is there (none without it)."""
    try:
        entries = json.loads((folder / "prompts.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [[str(folder / e["image"]), e["prompt"]] for e in entries if (folder / e["image"]).is_file()]


def example_set(model_id: str) -> str:
    """The example set shown with ``model_id``: its own id for an embedded model, else `OTHER_SET`."""
    return model_id if model_id in EXAMPLE_DIRS else OTHER_SET


def example_sets(models: list[str]) -> dict[str, list[list[str]]]:
    """The example rows of every set the offered ``models`` need, in the order of ``models`` (so the
    first set is the default model's): each embedded model's scenes; for the other models v1's scenes
    and the photos."""
    sets: dict[str, list[list[str]]] = {}
    for model_id in models:
        key = example_set(model_id)
        if key not in sets:
            sets[key] = (photo_examples() if key == OTHER_SET else []) + examples(model_id)
    return sets


def photo_examples() -> list[list[str]]:
    """``[image path, prompt]`` rows of the photos for real VLMs (assets/examples-photos)."""
    return _listed(PHOTOS_DIR)


def example_requests(
    rows: list[list[str]], exclude: tuple[str | None, str] | None = None
) -> list[WarmupRequest]:
    """Warm-up requests from example ``rows`` (``[image path, prompt]``), the photos first (a warm-up
    may run out of time after a few requests, and photos are what a real VLM's visitors send), leaving
    out the one whose image file and prompt are ``exclude`` (the request being measured must not be
    learnt beforehand)."""
    requests = []
    photos_first = sorted(rows, key=lambda row: Path(row[0]).parent != PHOTOS_DIR)  # (a stable sort)
    for path, prompt in photos_first:
        if exclude is not None and (Path(path).name, prompt) == (
            Path(exclude[0]).name if exclude[0] else None,
            exclude[1],
        ):
            continue
        requests.append(WarmupRequest(prompt, (load_image(path),), f"example {Path(path).name}"))
    return requests


def other_image_choices() -> list[str]:
    """The sensitivity tab's choices: a blank image, and the example scenes by file name (the embedded
    models' folders use the same names; the run's model decides which folder's scene is used)."""
    names = {Path(row[0]).name for model_id in EXAMPLE_DIRS for row in examples(model_id)}
    return [BLANK_IMAGE, *sorted(names)]


def other_image(choice: str, like: Image.Image | None, model_id: object = DEFAULT_MODEL_ID) -> Image.Image:
    """The replacement image of the sensitivity pass: the example scene ``choice`` of ``model_id``'s
    folder (`examples_dir`; v2's scenes for v2), or a blank grey image of ``like``'s size."""
    folder = examples_dir(model_id)
    if choice != BLANK_IMAGE and (folder / choice).is_file():
        return load_image(folder / choice)
    return Image.new("RGB", like.size if like is not None else (64, 64), (128, 128, 128))


def check_other_image(choice: object) -> str:
    """The sensitivity tab's replacement image choice, if it is one the dropdown offers."""
    return check_choice("replacement image", choice, other_image_choices())


# ------------------------------------------------------------------------------ following the model
def _image_name(value: object) -> str | None:
    """The file name of an image value as the browser sends it (its original name, else its path's)."""
    if isinstance(value, dict):
        name = value.get("orig_name") or value.get("path")
        return Path(name).name if isinstance(name, str) else None
    return Path(value).name if isinstance(value, str) else None


def swap_to(model_id: object, image: object, prompt: object, sets: dict[str, list[list[str]]]) -> str | None:
    """The example set whose first example should replace the input when ``model_id`` is chosen: the
    model's own set, when the input is empty or is an example of another set (a visitor's own image
    or prompt is never replaced); None to keep the input.

    Example: v2's first example loaded, then ``embedded-v1`` chosen -> ``"embedded-v1"``.
    """
    if not isinstance(model_id, str) or example_set(model_id) not in sets:
        return None
    key = example_set(model_id)
    if not sets[key]:
        return None
    if image is None:
        return key
    shown_row = (_image_name(image), prompt)
    if any(shown_row == (Path(p).name, q) for p, q in sets[key]):
        return None  # already one of this model's examples
    others = (row for other, rows in sets.items() if other != key for row in rows)
    return key if any(shown_row == (Path(p).name, q) for p, q in others) else None


def wire_examples(ui: dict[str, Any]) -> None:
    """Choosing a model shows its example set only (``ui["example_groups"]``), and replaces an input
    that is another set's example by the chosen model's first example (so Run works at once)."""
    groups, sets = ui["example_groups"], ui["example_sets"]
    firsts = {key: _first_value(ui["image"], rows) for key, rows in sets.items() if rows}

    def follow(model_id, image, prompt):
        key = example_set(model_id) if isinstance(model_id, str) else None
        if key not in groups:  # not an offered model (a hostile value): change nothing
            return {}
        updates: dict = {group: gr.update(visible=name == key) for name, group in groups.items()}
        swap = swap_to(model_id, image, prompt, sets)
        if swap is not None:
            updates[ui["image"]] = gr.update(value=firsts[swap])
            updates[ui["prompt"]] = gr.update(value=sets[swap][0][1])
        return updates

    ui["model"].change(
        follow,
        [ui["model"], ui["image"], ui["prompt"]],
        [*groups.values(), ui["image"], ui["prompt"]],
        show_progress="hidden",
        preprocess=False,  # raw values: the image as the browser holds it (never read here)
        postprocess=False,  # the image value is the one gradio's examples already cached at build
        api_visibility="private",
        queue=False,
    )


def _first_value(component: gr.Image, rows: list[list[str]]) -> dict:
    """The first row's image as the browser's value, copied into gradio's cache now (as gr.Examples does
    at build time: a handler's output may not name a file outside the cache once the server runs)."""
    from gradio import processing_utils

    value = component.postprocess(rows[0][0])
    value = value.model_dump() if hasattr(value, "model_dump") else value
    return processing_utils.move_files_to_cache(value, component, postprocess=True)

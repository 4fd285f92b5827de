"""The studio's example inputs and the sensitivity tab's replacement images.

Scene examples come from assets/examples/prompts.json (the embedded model's kind of question); photo
examples for real models are the first of `recap.datasets.PHOTO_PROMPTS` (the benchmark's photos).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from PIL import Image

from recap.datasets import PHOTO_PROMPTS
from recap.hotstart import WarmupRequest
from recap.inputs import check_choice, load_image

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "assets" / "examples"
BLANK_IMAGE = "blank (grey)"
#: How many of the benchmark's photos the Run tab offers as examples (when a real model is offered).
PHOTO_EXAMPLES = 3


def examples() -> list[list[str]]:
    """``[image path, prompt]`` rows from assets/examples/prompts.json (empty if it is not there yet)."""
    try:
        entries = json.loads((EXAMPLES_DIR / "prompts.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [
        [str(EXAMPLES_DIR / e["image"]), e["prompt"]]
        for e in entries
        if (EXAMPLES_DIR / e["image"]).is_file()
    ]


def photo_examples() -> list[list[str]]:
    """A few real photos (scikit-image's public-domain data) for real models; empty without skimage."""
    try:
        from skimage import data
    except ImportError:
        return []
    folder = Path(tempfile.gettempdir()) / "recap-studio-photos"
    folder.mkdir(exist_ok=True)
    rows = []
    for name, prompt in PHOTO_PROMPTS[:PHOTO_EXAMPLES]:
        path = folder / f"{name}.png"
        if not path.is_file():
            Image.fromarray(getattr(data, name)()).save(path)
        rows.append([str(path), prompt])
    return rows


def example_requests(
    rows: list[list[str]], exclude: tuple[str | None, str] | None = None
) -> list[WarmupRequest]:
    """Warm-up requests from example ``rows`` (``[image path, prompt]``), leaving out the one whose
    image file and prompt are ``exclude`` (the request being measured must not be learnt beforehand)."""
    requests = []
    for path, prompt in rows:
        if exclude is not None and (Path(path).name, prompt) == (
            Path(exclude[0]).name if exclude[0] else None,
            exclude[1],
        ):
            continue
        requests.append(WarmupRequest(prompt, (load_image(path),), f"example {Path(path).name}"))
    return requests


def other_image_choices() -> list[str]:
    return [BLANK_IMAGE] + [Path(row[0]).name for row in examples()]


def other_image(choice: str, like: Image.Image | None) -> Image.Image:
    """The replacement image of the sensitivity pass: an example scene, or a blank grey image."""
    if choice != BLANK_IMAGE and (EXAMPLES_DIR / choice).is_file():
        return load_image(EXAMPLES_DIR / choice)
    return Image.new("RGB", like.size if like is not None else (64, 64), (128, 128, 128))


def check_other_image(choice: object) -> str:
    """The sensitivity tab's replacement image choice, if it is one the dropdown offers."""
    return check_choice("replacement image", choice, other_image_choices())

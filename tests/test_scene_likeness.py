"""Telling a scene of an embedded world from any other image (`recap.embedded.grid.SceneDrawing`): every
shipped example and held-out scene is one, also as the studio or a visitor may have resized or compressed
it; photos, drawings across the image and blank images are not."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from recap.embedded import load_world

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {1: ROOT / "assets" / "examples", 2: ROOT / "assets" / "examples-v2"}
#: Photos of every kind scikit-image ships (animals, people, objects, textures, microscopy, the sky, text).
PHOTOS = (
    "astronaut", "brick", "camera", "cat", "cell", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
    "horse", "hubble_deep_field", "immunohistochemistry", "logo", "microaneurysms", "moon", "page",
    "retina", "rocket", "text",
)  # fmt: skip


def _jpeg(image: Image.Image, quality: int = 75) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return Image.open(buffer).convert("RGB")


def _copies(image: Image.Image) -> dict[str, Image.Image]:
    """``image`` as a scene may reach the model: itself, enlarged (by each filter, to odd sizes, to a
    rectangle), and JPEG-compressed."""
    w = image.width
    bicubic, bilinear, lanczos = (
        Image.Resampling.BICUBIC,
        Image.Resampling.BILINEAR,
        Image.Resampling.LANCZOS,
    )
    return {
        "itself": image,
        "bicubic x1.5": image.resize((w * 3 // 2,) * 2, bicubic),
        "bilinear x2": image.resize((w * 2,) * 2, bilinear),
        "lanczos x3.3": image.resize((int(w * 3.3),) * 2, lanczos),
        "bicubic 336": image.resize((336, 336), bicubic),
        "bicubic x8": image.resize((w * 8,) * 2, bicubic),
        "rectangle": image.resize((w * 3, w * 2), bicubic),
        "jpeg": _jpeg(image),
        "jpeg x3": _jpeg(image.resize((w * 3,) * 2, bicubic), 90),
    }


@pytest.mark.parametrize("version", [1, 2])
def test_every_shipped_example_looks_like_a_scene_of_its_world_however_resized(version):
    world = load_world(version)
    paths = sorted(EXAMPLES[version].glob("*.png"))
    assert len(paths) >= 6
    missed = [
        (path.name, name)
        for path in paths
        for name, copy in _copies(Image.open(path).convert("RGB")).items()
        if not world.looks_like_scene(copy)
    ]
    assert missed == []


@pytest.mark.parametrize("version", [1, 2])
def test_held_out_scenes_look_like_scenes_however_resized(version):
    world = load_world(version)
    scenes = [
        world.render_scene(world.sample_scene(np.random.default_rng(s))) for s in world.heldout_seeds(3, 60)
    ]
    missed = [
        (i, name) for i, scene in enumerate(scenes) for name, copy in _copies(scene).items()
        if not world.looks_like_scene(copy)
    ]  # fmt: skip
    assert missed == []


@pytest.mark.parametrize("name", PHOTOS)
def test_photos_are_not_scenes(name):
    data = pytest.importorskip("skimage.data", reason="scikit-image (requirements-dev.txt) holds the photos")
    array = getattr(data, name)()
    if array.dtype == bool:  # (the horse: a black silhouette on white, drawn across the image)
        array = array.astype(np.uint8) * 255
    photo = Image.fromarray(array).convert("RGB")
    for version in (1, 2):
        assert not load_world(version).looks_like_scene(photo), (name, version)
        assert not load_world(version).looks_like_scene(photo.resize((96, 96), Image.Resampling.BICUBIC))


def _drawing(*boxes: tuple[str, list[int], object]) -> Image.Image:
    """A white 200x200 image with ``(kind, box, fill)`` drawn on it (kind: ellipse or rectangle)."""
    image = Image.new("RGB", (200, 200), "white")
    draw = ImageDraw.Draw(image)
    for kind, box, fill in boxes:
        getattr(draw, kind)(box, fill=fill)
    return image


RED, BLUE = (220, 30, 30), (30, 70, 230)
NOT_SCENES = {
    "blank white": Image.new("RGB", (96, 96), "white"),
    "blank grey": Image.new("RGB", (96, 96), (128, 128, 128)),  # the sensitivity tab's replacement
    "black": Image.new("RGB", (64, 64), "black"),
    "noise": Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)),
    "one red disc across the image": _drawing(("ellipse", [20, 20, 180, 180], RED)),
    "black lines of text": _drawing(
        *(("rectangle", [10, y, 190, y + 6], "black") for y in range(20, 180, 20))
    ),
    "one colour in two cells": _drawing(
        ("rectangle", [10, 10, 40, 40], BLUE), ("ellipse", [150, 150, 180, 180], BLUE)
    ),
}


@pytest.mark.parametrize("name", NOT_SCENES)
def test_blank_images_noise_and_drawings_across_the_image_are_not_scenes(name):
    for version in (1, 2):
        assert not load_world(version).looks_like_scene(NOT_SCENES[name]), (name, version)


def test_a_scene_drawn_by_hand_in_the_worlds_colours_is_one():
    """The decision is the pixels', not the file's: a hand-made drawing like a scene counts as one."""
    image = _drawing(("ellipse", [20, 20, 50, 50], RED), ("rectangle", [120, 80, 150, 110], BLUE))
    assert load_world(1).looks_like_scene(image) and load_world(2).looks_like_scene(image)

"""Scenes of the embedded model v2: what a scene is, how it is drawn, and the relations between shapes.

A scene is 1-5 shapes on a white 96x96 RGB canvas. Within a scene kinds, colours and grid cells are
pairwise distinct, so "the circle" or "the red shape" names one shape. Each shape sits in its own cell of
a 3x3 grid (32 px cells) with a small jitter that never leaves the cell, so the relations "left of" and
"above" follow the cells: a shape in a column further left has a smaller centre x, whatever the jitter.
Sizes are ordered (small < medium < large), which defines "larger than".

The question/answer text and the fact checkers live in `recap.embedded.scenes2`, which re-exports this
module's
public names. The grid, the scene objects, sampling and painting are shared with world v1 in
`recap.embedded.grid`. Only PIL and numpy are used, no torch; everything is deterministic given a
``numpy.random.Generator``.
"""

from __future__ import annotations

import numpy as np
from PIL import ImageDraw

from recap.embedded import grid
from recap.embedded.grid import GRID, Fill, GridShape, Scene

IMAGE_SIZE = 96
CELL = IMAGE_SIZE // GRID

#: Twelve colours, far apart in RGB and named by the words a person would use.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 135, 0),
    "yellow": (235, 205, 0),
    "lime": (140, 225, 50),
    "green": (20, 130, 40),
    "cyan": (0, 190, 215),
    "blue": (30, 70, 230),
    "purple": (130, 40, 190),
    "pink": (245, 120, 190),
    "brown": (120, 65, 20),
    "grey": (135, 135, 135),
    "black": (20, 20, 20),
}
#: Eight kinds whose silhouettes differ even at the smallest size (radius 7 px).
KINDS = ("circle", "square", "triangle", "star", "diamond", "cross", "ring", "heart")
SIZES = ("small", "medium", "large")  # ordered: index = rank for "larger than"
MAX_SHAPES = 5

_RADIUS = {"small": 7, "medium": 10, "large": 13}
_JITTER = {"small": 3, "medium": 2, "large": 1}  # radius + jitter <= 14 < CELL / 2: shapes stay in their cell


class Shape(GridShape):
    """A shape of world v2 (fields: see `GridShape`), its cell centres in the middle of 32 px cells."""

    CELL_CENTRES = tuple(CELL // 2 + CELL * i for i in range(GRID))


def sample_scene(rng: np.random.Generator, min_shapes: int = 1) -> Scene:
    """Draw a scene of ``min_shapes``..MAX_SHAPES shapes (uniform) with distinct kinds, colours, cells."""
    return grid.sample_shapes(rng, Shape, (min_shapes, MAX_SHAPES), KINDS, list(COLOURS), SIZES, _JITTER)


def scene_from_seed(seed: int, min_shapes: int = 1) -> Scene:
    """The scene drawn by ``sample_scene(np.random.default_rng(seed), min_shapes)``."""
    return sample_scene(np.random.default_rng(seed), min_shapes)


# ---------------------------------------------------------------------------------------- relations
def horizontal_relation(a: Shape, b: Shape) -> str:
    """Where ``a`` is across from ``b``: "left of", "right of" or "in the same column as"."""
    if a.column == b.column:
        return "in the same column as"
    return "left of" if a.column < b.column else "right of"


def vertical_relation(a: Shape, b: Shape) -> str:
    """Where ``a`` is up/down from ``b``: "above", "below" or "in the same row as"."""
    if a.row == b.row:
        return "in the same row as"
    return "above" if a.row < b.row else "below"


def size_relation(a: Shape, b: Shape) -> str:
    """ "larger than", "smaller than" or "the same size as"."""
    ra, rb = SIZES.index(a.size), SIZES.index(b.size)
    if ra == rb:
        return "the same size as"
    return "larger than" if ra > rb else "smaller than"


# ---------------------------------------------------------------------------------------- drawing
def _draw(draw: ImageDraw.ImageDraw, shape: Shape, fill: Fill, background: Fill) -> None:
    """Draw ``shape`` with ``fill``; ``background`` fills the holes (the ring's centre)."""
    cx, cy = shape.centre
    r = _RADIUS[shape.size]
    if shape.kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape.kind == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        h = r * 0.5
        draw.ellipse([cx - h, cy - h, cx + h, cy + h], fill=background)
    elif shape.kind == "square":
        h = r * 0.85
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif shape.kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    elif shape.kind == "star":
        draw.polygon(grid.star_points(cx, cy, r), fill=fill)
    elif shape.kind == "diamond":
        draw.polygon([(cx, cy - r), (cx + r * 0.7, cy), (cx, cy + r), (cx - r * 0.7, cy)], fill=fill)
    elif shape.kind == "cross":
        w = r * 0.35
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    elif shape.kind == "heart":
        h = r * 0.5
        for sx in (-1, 1):
            lx = cx + sx * h
            draw.ellipse([lx - h, cy - r * 0.75, lx + h, cy - r * 0.75 + 2 * h], fill=fill)
        draw.polygon([(cx - r, cy - r * 0.2), (cx + r, cy - r * 0.2), (cx, cy + r)], fill=fill)
    else:
        raise ValueError(f"unknown kind {shape.kind!r}")


#: How this world draws its scenes (its size, colours, shapes) and tells them from other images.
DRAWING = grid.SceneDrawing(IMAGE_SIZE, COLOURS, _draw, 2 * max(_RADIUS.values()) + 1, MAX_SHAPES)
render_scene = DRAWING.render  # a 96x96 RGB image of a scene
shape_index_map = DRAWING.index_map  # (96, 96) uint8: 0 background, i + 1 where shape i is drawn
looks_like_scene = DRAWING.looks_like  # whether an image looks like a scene of this world (its pixels)

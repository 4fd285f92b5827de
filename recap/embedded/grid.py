"""Scenes of shapes on a 3x3 grid: what the worlds v1 (`recap.embedded.scenes`) and v2
(`recap.embedded.scenes2`) share.

A world brings its vocabulary (kinds, colours, sizes, jitter, image size, how a kind is drawn) and its
question/answer text; this module holds the rest, once: the shape and scene value objects, sampling a
scene from a ``numpy.random.Generator``, painting it (an RGB image or a map of shape indices), the
held-out seed ranges and the held-out example sets, judging an answer by its facts, and telling a scene
from any other image (`SceneDrawing`). Only PIL and numpy are used, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from PIL import Image, ImageDraw

GRID = 3
BACKGROUND = (255, 255, 255)
POSITIONS = (
    "top left",
    "top center",
    "top right",
    "middle left",
    "center",
    "middle right",
    "bottom left",
    "bottom center",
    "bottom right",
)  # row-major over the 3x3 grid

#: Training scenes use seeds in ``[0, HELDOUT_SEED_START)``; held-out set ``s`` uses
#: ``HELDOUT_SEED_START + s * HELDOUT_STRIDE + i``, so the two ranges are disjoint.
HELDOUT_SEED_START = 10**9
HELDOUT_STRIDE = 100_000


@dataclass(frozen=True)
class GridShape:
    """One shape: kind, colour name, size name, grid cell (index into POSITIONS) and jitter in px.

    Each world subclasses it with its own ``CELL_CENTRES`` (pixel centres of the grid's columns and
    rows), adding no field, so that the dataclass methods here serve it.
    """

    CELL_CENTRES: ClassVar[tuple[int, ...]]

    kind: str
    colour: str
    size: str
    cell: int
    dx: int = 0
    dy: int = 0

    @property
    def position(self) -> str:
        return POSITIONS[self.cell]

    @property
    def row(self) -> int:
        return self.cell // GRID

    @property
    def column(self) -> int:
        return self.cell % GRID

    @property
    def centre(self) -> tuple[int, int]:
        return self.CELL_CENTRES[self.column] + self.dx, self.CELL_CENTRES[self.row] + self.dy

    @property
    def name(self) -> str:
        """ "red circle": colour and kind, unique within a scene."""
        return f"{self.colour} {self.kind}"


@dataclass(frozen=True)
class Scene:
    """Shapes sorted row-major by cell; kinds, colours and cells are pairwise distinct."""

    shapes: tuple[GridShape, ...]

    @property
    def count(self) -> int:
        return len(self.shapes)

    def shape_of_kind(self, kind: str) -> GridShape | None:
        return next((s for s in self.shapes if s.kind == kind), None)


def sample_shapes(
    rng: np.random.Generator,
    shape: type[GridShape],
    n_shapes: tuple[int, int],
    kinds: Sequence[str],
    colours: Sequence[str],
    sizes: Sequence[str],
    jitter: Mapping[str, int],
) -> Scene:
    """Draw a scene of ``n_shapes[0]..n_shapes[1]`` shapes (uniform) with distinct kinds, colours and cells,
    each of a uniform size and jittered by up to ``jitter[size]`` px per axis."""
    n = int(rng.integers(n_shapes[0], n_shapes[1] + 1))
    kind_ids = rng.choice(len(kinds), size=n, replace=False)
    colour_ids = rng.choice(len(colours), size=n, replace=False)
    cells = rng.choice(GRID * GRID, size=n, replace=False)
    shapes = []
    for kind, colour, cell in zip(kind_ids, colour_ids, cells, strict=True):
        size = sizes[int(rng.integers(len(sizes)))]
        j = jitter[size]
        dx, dy = (int(v) for v in rng.integers(-j, j + 1, size=2))
        shapes.append(shape(kinds[kind], colours[colour], size, int(cell), dx, dy))
    return Scene(tuple(sorted(shapes, key=lambda s: s.cell)))


# ---------------------------------------------------------------------------------------- drawing
#: An RGB colour, or a value of a one-channel image.
Fill = tuple[int, int, int] | int
#: Draws one shape: ``(draw, shape, fill, background)``; ``background`` fills a kind's holes.
DrawShape = Callable[[ImageDraw.ImageDraw, GridShape, Fill, Fill], None]


def star_points(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The ten vertices of a five-pointed star of outer radius ``r``, the first one on top."""
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else r * 0.45
        ang = -np.pi / 2 + k * np.pi / 5
        pts.append((cx + rad * np.cos(ang), cy + rad * np.sin(ang)))
    return pts


# ---------------------------------------------------------------------------------------- likeness
#: How far (RGB distance) a pixel may lie from a drawing colour and still count as drawn in it: half the
#: smallest gap between two colours of world v2, so a resized or re-compressed scene keeps its colours.
COLOUR_TOLERANCE = 35
#: The least share of a scene's pixels that are drawn colours (the background or a shape's colour); the
#: rest are the blends a resize or a lossy compression makes at the shapes' edges.
MIN_DRAWN_SHARE = 0.8
#: The least share of background in a scene (the largest shapes of a full v2 scene cover under a third).
MIN_BACKGROUND_SHARE = 0.5
#: The fewest inner pixels of a colour that count as a shape (a lone pixel is a speck of edge blends).
MIN_SHAPE_PIXELS = 2


@dataclass(frozen=True)
class SceneDrawing:
    """How a world draws its scenes, and how its scenes are told from other images (`looks_like`).

    A world's `render_scene`, `shape_index_map` and `looks_like_scene` are its drawing's `render`,
    `index_map` and `looks_like`."""

    image_size: int
    colours: Mapping[str, tuple[int, int, int]]  # the shapes' colours by name (the background: BACKGROUND)
    draw_shape: DrawShape
    #: The widest a shape is drawn, in px of ``image_size`` (twice the largest radius, plus one).
    shape_extent: int
    max_shapes: int

    def render(self, scene: Scene) -> Image.Image:
        """``scene`` as an ``image_size`` square RGB image on a white background (no anti-aliasing)."""
        img = Image.new("RGB", (self.image_size, self.image_size), BACKGROUND)
        draw = ImageDraw.Draw(img)
        for shape in scene.shapes:
            self.draw_shape(draw, shape, self.colours[shape.colour], BACKGROUND)
        return img

    def index_map(self, scene: Scene) -> np.ndarray:
        """``(image_size, image_size)`` uint8 map: 0 for background, i + 1 where ``scene.shapes[i]`` is
        drawn."""
        img = Image.new("L", (self.image_size, self.image_size), 0)
        draw = ImageDraw.Draw(img)
        for i, shape in enumerate(scene.shapes):
            self.draw_shape(draw, shape, i + 1, 0)
        return np.asarray(img, dtype=np.uint8)

    def looks_like(self, image: Image.Image) -> bool:
        """Whether ``image`` looks like a scene of this world, decided from its pixels only.

        The image is sampled at the world's size (nearest pixel: a scene keeps its flat colours, however it
        was resized on the way) and each pixel is given its nearest drawing colour when it lies within
        `COLOUR_TOLERANCE`. A scene is mostly drawn colours (`MIN_DRAWN_SHARE`), mostly background
        (`MIN_BACKGROUND_SHARE`), and holds 1 to ``max_shapes`` shape colours, each one shape: its inner
        pixels (whose four neighbours share its colour: the blends at shapes' edges and specks do not
        count) fit in a box of ``shape_extent`` (with a pixel of slack). A photo fails the colours; a
        drawing in one colour across the image (text, a silhouette, a logo) fails the box; a blank image
        has no shape. A scene shrunk below its drawn size may fail (its edges blend more than they keep).
        """
        size = self.image_size
        pixels = np.asarray(image.convert("RGB").resize((size, size), Image.Resampling.NEAREST), np.int32)
        palette = np.array([BACKGROUND, *self.colours.values()], dtype=np.int32)
        distance = ((pixels[:, :, None, :] - palette[None, None]) ** 2).sum(axis=-1)
        label = np.where(distance.min(axis=-1) <= COLOUR_TOLERANCE**2, distance.argmin(axis=-1), -1)
        if (label >= 0).mean() < MIN_DRAWN_SHARE or (label == 0).mean() < MIN_BACKGROUND_SHARE:
            return False
        inner = label[1:-1, 1:-1]
        same = (
            (inner == label[:-2, 1:-1])
            & (inner == label[2:, 1:-1])
            & (inner == label[1:-1, :-2])
            & (inner == label[1:-1, 2:])
        )
        shapes = 0
        for colour in range(1, len(palette)):
            rows, columns = np.nonzero(same & (inner == colour))
            if rows.size < MIN_SHAPE_PIXELS:  # none, or a speck of edge blends
                continue
            if max(np.ptp(rows), np.ptp(columns)) + 1 > self.shape_extent + 1:
                return False
            shapes += 1
        return 1 <= shapes <= self.max_shapes


# ---------------------------------------------------------------------------------------- answers
def answer_is_correct(
    qtype: str,
    scene: Scene,
    generated_text: str,
    question: str | None,
    asking_types: Sequence[str],
    extract_fact: Callable[[str, str], str | None],
    expected_fact: Callable[[str, Scene, str | None], str],
) -> bool:
    """Whether ``extract_fact(qtype, generated_text)`` is ``expected_fact(qtype, scene, question)``.

    For the ``asking_types`` (questions about named shapes) without a ``question``, the kinds the answer
    names first stand for the asked ones ("The circle is red." is judged against the scene's circle). An
    answer is wrong where ``expected_fact`` raises ValueError (the question names no shape of the scene).
    """
    if qtype in asking_types and question is None:
        question = generated_text
    try:
        return extract_fact(qtype, generated_text) == expected_fact(qtype, scene, question)
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------- held-out
def heldout_seeds(seed: int = 0, n: int = 200) -> list[int]:
    """The ``n`` scene seeds of held-out set ``seed`` (all >= HELDOUT_SEED_START)."""
    if not 0 <= n <= HELDOUT_STRIDE or seed < 0:
        raise ValueError("need seed >= 0 and 0 <= n <= HELDOUT_STRIDE")
    base = HELDOUT_SEED_START + seed * HELDOUT_STRIDE
    return [base + i for i in range(n)]


def heldout_examples(
    seed: int,
    n_per_type: int,
    question_types: Sequence[str],
    qtypes: Sequence[str],
    ask: Callable[[str, np.random.Generator], tuple[Scene, str, str]],
    render: Callable[[Scene], Image.Image],
) -> list[dict]:
    """Held-out examples, ``n_per_type`` per question type, grouped by type in ``qtypes`` order.

    Type ``t`` of the world's ``question_types`` owns seeds ``t * n_per_type ..`` of held-out set
    ``seed``, so a subset of types draws the same examples as the full set. ``ask(qtype, rng)`` draws
    the scene and its (question, answer) from the scene seed's generator. Each dict has ``image`` (PIL),
    ``prompt``, ``answer``, ``qtype``, ``scene`` and ``seed`` (the scene seed).
    """
    seeds = heldout_seeds(seed, n_per_type * len(question_types))
    items = []
    for qtype in qtypes:
        t = question_types.index(qtype)
        for scene_seed in seeds[t * n_per_type : (t + 1) * n_per_type]:
            scene, prompt, answer = ask(qtype, np.random.default_rng(scene_seed))
            items.append(
                {
                    "image": render(scene),
                    "prompt": prompt,
                    "answer": answer,
                    "qtype": qtype,
                    "scene": scene,
                    "seed": scene_seed,
                }
            )
    return items

"""`recap.embedded`: the synthetic scene worlds the embedded models were trained on (demo data only).

The library never needs them: the engine, the models, the memories and the drafters import nothing
from here. The benchmark's scene datasets, the studio's examples and the hot start of an embedded
model use them through one interface, `World`, which each world module satisfies:

- `scenes` (world v1): 1-3 shapes on a 3x3 grid, four question types; the embedded model v1.
- `scenes2` (world v2): up to 5 shapes, detailed descriptions and relations; the embedded model v2.
- `grid`: what both share (the grid, sampling, held-out seeds, fact checking).

Example::

    world = load_world(2)                      # the module recap.embedded.scenes2
    scene = world.sample_scene(np.random.default_rng(0))
    prompt, answer = world.make_question(scene, "count", np.random.default_rng(0))
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from recap.hotstart import WarmupRequest

#: World version -> its module.
WORLDS = {1: "recap.embedded.scenes", 2: "recap.embedded.scenes2"}


class World(Protocol):
    """What a scene world offers (each world module has these names; v2 adds more)."""

    #: Scene seeds from here on are held out (benchmark, studio examples); training seeds lie below.
    HELDOUT_SEED_START: int
    QUESTION_TYPES: tuple[str, ...]
    #: Question types that need a scene of at least two shapes.
    TWO_SHAPE_TYPES: tuple[str, ...]
    IMAGE_SIZE: int
    #: Question phrasings kept out of training (qtype -> templates).
    REPHRASED_QUESTIONS: dict[str, tuple[str, ...]]

    def sample_scene(self, rng: np.random.Generator, min_shapes: int = 1) -> Any: ...

    def render_scene(self, scene: Any) -> Image.Image: ...

    def make_question(
        self, scene: Any, qtype: str, rng: np.random.Generator, rephrased: bool = False
    ) -> tuple[str, str]: ...

    def heldout_set(
        self, seed: int = 0, n_per_type: int = 50, rephrased: bool = False, qtypes: tuple[str, ...] = ...
    ) -> list[dict]: ...

    def answer_is_correct(
        self, qtype: str, scene: Any, generated_text: str, question: str | None = None
    ) -> bool: ...

    def looks_like_scene(self, image: Image.Image) -> bool:
        """Whether ``image`` looks like one of this world's scenes, from its pixels (`grid.SceneDrawing`):
        the studio warns that a photo, say, gets a scene-style answer from a model of this world."""
        ...


def load_world(version: int) -> World:
    """The scene world ``version`` (1 or 2); ValueError for any other."""
    if version not in WORLDS:
        raise ValueError(f"no scene world {version!r}: the worlds are {sorted(WORLDS)}")
    return importlib.import_module(WORLDS[version])  # a module satisfies the protocol


def embedded_world(name_or_path: str | Path) -> World | None:
    """The scene world an embedded model was trained on (v1's `scenes`, v2's `scenes2`), by its
    folder; None for any other model. Its training scenes warm the model's memories."""
    from recap.runtime import EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2

    folder = Path(name_or_path)
    if not folder.is_dir():
        return None
    versions = {EMBEDDED_MODEL_V1.resolve(): 1, EMBEDDED_MODEL_V2.resolve(): 2}
    version = versions.get(folder.resolve())
    return None if version is None else load_world(version)


def training_requests(world: World, n: int, first_seed: int = 0) -> list[WarmupRequest]:
    """``n`` requests about training scenes of ``world`` (`recap.embedded.scenes` for the embedded model v1,
    `recap.embedded.scenes2` for v2): scene seeds ``first_seed .. first_seed + n - 1`` (all below the world's
    ``HELDOUT_SEED_START``), its question types in turn, its training question templates. A question
    about two shapes (v2's relation) draws a scene of at least two shapes from the same seed.

    Example: ``training_requests(load_world(1), 2)[1].label == "training scene 1 (colour)"``.
    """
    if n < 0 or first_seed < 0 or first_seed + n > world.HELDOUT_SEED_START:
        raise ValueError(
            f"training scene seeds must lie in [0, {world.HELDOUT_SEED_START}), got {first_seed}+{n}"
        )
    from recap.hotstart import WarmupRequest

    requests = []
    for i in range(n):
        seed = first_seed + i
        qtype = world.QUESTION_TYPES[i % len(world.QUESTION_TYPES)]
        rng = np.random.default_rng(seed)
        scene = world.sample_scene(rng, 2 if qtype in world.TWO_SHAPE_TYPES else 1)
        prompt, _ = world.make_question(scene, qtype, rng)
        requests.append(
            WarmupRequest(prompt, (world.render_scene(scene),), f"training scene {seed} ({qtype})")
        )
    return requests

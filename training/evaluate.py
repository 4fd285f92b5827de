"""Evaluate the embedded model: exact facts of greedy answers on held-out scenes, with training and
held-out phrasings and a shuffled-image control, generation speed on one CPU thread, folder size.

The world (v1 or v2 scenes) of a saved model is read from its config (the image size), so one command
evaluates either.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch

from recap.embedded import scenes2
from training.data import WORLDS, World

#: Generation length per question type. Detailed descriptions run up to 150 tokens; a short description
#: gets as many, so an answer given in the detailed style (to a held-out phrasing) is judged on its facts
#: once finished rather than counted wrong for being cut off. The other answers are short (<= 40 tokens).
MAX_NEW_TOKENS = {"detail": 200, "describe": 200}
DEFAULT_MAX_NEW_TOKENS = 80


def _alternation(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


#: A statement relating two shapes in a v2 answer: "the (colour) kind is <relation> the (colour) kind".
_RELATION_WORDS = (
    "left of", "right of", "in the same column as", "above", "below", "in the same row as",
    "larger than", "smaller than", "the same size as",
)  # fmt: skip
_SHAPE = rf"the (?:(?:{_alternation(scenes2.COLOURS)}) )?({_alternation(scenes2.KINDS)})"
_RELATION_RE = re.compile(rf"\b{_SHAPE} is (?:{_alternation(_RELATION_WORDS)}) {_SHAPE}\b")


def self_relations(answer: str) -> int:
    """How many statements of ``answer`` relate a shape to itself ("The star is left of the star", "the
    red star is the same size as the red star"): the same kind on both sides, and kinds are distinct
    within a scene."""
    return sum(m.group(1) == m.group(2) for m in _RELATION_RE.finditer(answer.lower()))


def folder_size(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def load(model_dir: Path, device: str = "cpu"):
    """(processor, model) loaded offline from ``model_dir``, the model in eval mode on ``device``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval().to(device)
    return processor, model


def world_of(model) -> World:
    """The scene world a model was trained on, from its vision config's image size."""
    size = model.config.vision_config.image_size
    for world in WORLDS.values():
        if world.image_size == size:
            return world
    raise ValueError(f"no scene world has {size}x{size} images")


def prompt_text(processor, question: str) -> str:
    """The single-turn chat prompt for one image and ``question``."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)


@torch.inference_mode()
def generate_answers(
    processor, model, images: list, questions: list[str], max_new_tokens: int = 60, batch_size: int = 50
) -> list[str]:
    """Greedy answers (decoded, special tokens skipped), batched with left padding on the model's device."""
    answers = []
    for start in range(0, len(images), batch_size):
        texts = [prompt_text(processor, q) for q in questions[start : start + batch_size]]
        inputs = processor(
            images=images[start : start + batch_size], text=texts, return_tensors="pt", padding=True
        ).to(model.device)
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[:, inputs["input_ids"].shape[1] :]
        answers += processor.batch_decode(new, skip_special_tokens=True)
    return answers


def shuffled_images(items: list[dict]) -> list:
    """Each item's image replaced by the image of the next item of the same question type."""
    images = [it["image"] for it in items]
    by_type: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_type.setdefault(it["qtype"], []).append(i)
    for idx in by_type.values():
        for a, b in zip(idx, idx[1:] + idx[:1], strict=True):
            images[a] = items[b]["image"]
    return images


def judge(
    processor,
    model,
    items: list[dict],
    shuffle_images: bool = False,
    batch_size: int = 50,
    world: World | None = None,
    max_new_tokens: int | None = None,
) -> list[tuple[dict, str, bool]]:
    """(item, greedy answer, correct?) per item; with ``shuffle_images`` each question gets another
    scene's image (see `shuffled_images`). ``max_new_tokens`` overrides the per-type lengths."""
    world = world or world_of(model)
    images = shuffled_images(items) if shuffle_images else [it["image"] for it in items]
    answers: list[str | None] = [None] * len(items)
    for qtype in dict.fromkeys(it["qtype"] for it in items):
        idx = [i for i, it in enumerate(items) if it["qtype"] == qtype]
        limit = max_new_tokens or MAX_NEW_TOKENS.get(qtype, DEFAULT_MAX_NEW_TOKENS)
        got = generate_answers(
            processor, model, [images[i] for i in idx], [items[i]["prompt"] for i in idx], limit, batch_size
        )
        for i, answer in zip(idx, got, strict=True):
            answers[i] = answer
    return [
        (it, ans, world.scenes.answer_is_correct(it["qtype"], it["scene"], ans, it["prompt"]))
        for it, ans in zip(items, answers, strict=True)
    ]


def accuracy_by_type(
    processor,
    model,
    items: list[dict],
    shuffle_images: bool = False,
    batch_size: int = 50,
    max_new_tokens: int | None = None,
) -> dict[str, float]:
    """Fraction of answers with exactly the true facts, per question type."""
    result: dict[str, list[bool]] = {}
    for it, _, ok in judge(processor, model, items, shuffle_images, batch_size, None, max_new_tokens):
        result.setdefault(it["qtype"], []).append(ok)
    return {k: float(np.mean(v)) for k, v in result.items()}


@torch.inference_mode()
def tokens_per_second(
    processor, model, image, question: str = "Describe the image.", max_new_tokens: int = 60, repeats: int = 3
) -> float:
    """Greedy single-sequence generation speed (new tokens / s) on the current thread setting."""
    inputs = processor(images=image, text=prompt_text(processor, question), return_tensors="pt").to(
        model.device
    )
    model.generate(**inputs, max_new_tokens=4, do_sample=False)  # warm-up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        n = out.shape[1] - inputs["input_ids"].shape[1]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def evaluate(
    model_dir: Path, n_per_type: int = 50, seed: int = 0, device: str = "cpu", failures: int = 0
) -> dict:
    """Held-out accuracy per question type with training phrasings (``real``), held-out phrasings
    (``rephrased``, v2 only) and shuffled images; greedy tokens/s on one CPU thread (a 60-token short
    description and, v2, a detailed one); folder size; ``self_relations``: per set (shuffled images
    aside), the answers that relate a shape to itself. ``failures`` wrong answers per type are kept."""
    if device == "cpu":
        torch.set_num_threads(1)
    processor, model = load(model_dir, device)
    world = world_of(model)
    batch_size = 50 if device == "cpu" else 400
    items = world.scenes.heldout_set(seed=seed, n_per_type=n_per_type)
    report: dict = {"world": world.name, "n_per_type": n_per_type, "heldout_seed": seed}
    sets = {"real": (items, False), "shuffled": (items, True)}
    if world.name != "v1":  # the rephrased set uses other scene seeds (another held-out set)
        sets["rephrased"] = (
            world.scenes.heldout_set(seed=seed + 1, n_per_type=n_per_type, rephrased=True),
            False,
        )
    wrong: dict[str, list] = {}
    report["self_relations"] = {}
    for name, (its, shuffle) in sets.items():
        judged = judge(processor, model, its, shuffle, batch_size, world)
        if not shuffle:
            report["self_relations"][name] = sum(self_relations(ans) > 0 for _, ans, _ in judged)
        by_type: dict[str, list[bool]] = {}
        for it, ans, ok in judged:
            by_type.setdefault(it["qtype"], []).append(ok)
            if not ok and not shuffle and len(wrong.setdefault(f"{name}/{it['qtype']}", [])) < failures:
                wrong[f"{name}/{it['qtype']}"].append(
                    {"q": it["prompt"], "expected": it["answer"], "got": ans}
                )
        report[name] = {k: float(np.mean(v)) for k, v in by_type.items()}
    cpu_model = model.to("cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    report["tokens_per_s_1_thread"] = tokens_per_second(processor, cpu_model, items[0]["image"])
    if "detail" in world.scenes.QUESTION_TYPES:
        q = world.scenes.TRAINING_QUESTIONS["detail"][0]
        report["tokens_per_s_1_thread_detail"] = tokens_per_second(
            processor, cpu_model, items[0]["image"], q, 150
        )
    torch.set_num_threads(threads)
    report["folder_mb"] = folder_size(model_dir) / 1e6
    if failures:
        report["failures"] = wrong
    return report


def write_examples(out_dir: Path, n: int = 6, seed: int = 7, world: World = WORLDS["v1"]) -> list[dict]:
    """Save ``n`` held-out scenes as ``scene_<i>.png`` plus ``prompts.json`` ([{"image", "prompt"}])."""
    out_dir.mkdir(parents=True, exist_ok=True)
    qtypes = world.scenes.QUESTION_TYPES
    per_type = math.ceil(n / len(qtypes))
    items = world.scenes.heldout_set(seed=seed, n_per_type=per_type)  # grouped by question type
    chosen = [items[t * per_type + j] for j in range(per_type) for t in range(len(qtypes))][:n]  # alternate
    prompts = []
    for i, it in enumerate(chosen, start=1):
        name = f"scene_{i}.png"
        it["image"].save(out_dir / name)
        prompts.append({"image": name, "prompt": it["prompt"], "qtype": it["qtype"], "seed": it["seed"]})
    (out_dir / "prompts.json").write_text(json.dumps(prompts, indent=2) + "\n")
    return prompts

"""Held-out evaluation of the embedded model v2 by phrasing family: exact facts per question type and per
family, on held-out scenes, and how many answers relate a shape to itself.

    python -m training.evaluate_families --model assets/models/tiny-scenes-llava-v2 --seeds 4 5
    python -m training.evaluate_families --model DIR --split training --seeds 4   # the training families
    python -m training.evaluate_families --model DIR --split probe --seeds 4 5    # the probe families

Each family of the split (by default the held-out ones of `training.phrasing_families`; ``probe``: the
probe families of `training.phrasing_extra`; neither ever trained on) is asked
``n_per_family`` times per held-out scene set: scene ``i`` of family ``j`` is held-out seed
``j * n_per_family + i`` of set ``s`` (`recap.embedded.grid.heldout_seeds`), and that seed's generator
draws the scene (2+ shapes for a relation), the register, the phrasing and the asked shapes (two
different ones for a relation). Sets 0-3 are what ``python -m training.train --eval`` uses, so the
default sets here, 4 and 5, are scenes no other evaluation asks about.

An answer is right when every fact its family asks for is right (`recap.embedded.scenes2.
answer_is_correct`, with the asked shapes in subject-reference order, whatever order the phrasing names
them in): a combined colour-and-position request needs both. `self_relations` counts answers, of any
type, that state a relation between a shape and itself ("The star is left of the star ...").
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import torch

from recap.embedded import scenes2
from recap.embedded.grid import heldout_seeds
from training.evaluate import DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS, generate_answers, load, self_relations
from training.phrasing_extra import PROBE_FAMILIES
from training.phrasing_families import HELDOUT_FAMILIES, TRAINING_FAMILIES, Family

logger = logging.getLogger(__name__)

#: The held-out scene sets of the family evaluation (sets 0-3 are `training.evaluate`'s).
FAMILY_SEEDS = (4, 5)
N_PER_FAMILY = 30
SPLITS = {"heldout": HELDOUT_FAMILIES, "probe": PROBE_FAMILIES, "training": TRAINING_FAMILIES}


def family_items(families: tuple[Family, ...], seed: int, n_per_family: int) -> list[dict]:
    """``n_per_family`` held-out questions per family (see the module docstring), grouped by family:
    dicts with ``image``, ``prompt``, ``answer`` (the reference), ``qtype``, ``family``, ``facts``,
    ``targets`` (subject first), ``scene`` and ``seed``."""
    seeds = heldout_seeds(seed, len(families) * n_per_family)
    items = []
    for j, family in enumerate(families):
        groups = list(family.by_register().values())
        n_asked = 2 if family.qtype in scenes2.TWO_SHAPE_TYPES else 1
        for scene_seed in seeds[j * n_per_family : (j + 1) * n_per_family]:
            rng = np.random.default_rng(scene_seed)
            scene = scenes2.sample_scene(rng, min_shapes=n_asked)
            group = groups[int(rng.integers(len(groups)))]
            template = group[int(rng.integers(len(group)))]
            picked = rng.choice(scene.count, size=n_asked, replace=False)
            targets = tuple(scene.shapes[int(i)].kind for i in picked)
            items.append({
                "image": scenes2.render_scene(scene),
                "prompt": template.format(kind=targets[0], other=targets[-1]),
                "answer": scenes2.reference_answer(scene, family.qtype, targets),
                "qtype": family.qtype,
                "family": family.name,
                "facts": family.facts,
                "targets": targets,
                "scene": scene,
                "seed": scene_seed,
            })  # fmt: skip
    return items


def is_right(item: dict, answer: str) -> bool:
    """Whether ``answer`` states every fact ``item`` asks for, about its asked shapes in order."""
    asked = " ".join(f"the {kind}" for kind in item["targets"])  # the kinds, subject first
    return all(scenes2.answer_is_correct(f, item["scene"], answer, asked) for f in item["facts"])


def judge_items(processor, model, items: list[dict], batch_size: int = 50) -> list[tuple[dict, str, bool]]:
    """(item, greedy answer, right?) per item, each family's answers as long as its longest fact type's."""
    answers: list[str | None] = [None] * len(items)
    limits = [max(MAX_NEW_TOKENS.get(f, DEFAULT_MAX_NEW_TOKENS) for f in it["facts"]) for it in items]
    for limit in dict.fromkeys(limits):
        idx = [i for i, n in enumerate(limits) if n == limit]
        got = generate_answers(
            processor,
            model,
            [items[i]["image"] for i in idx],
            [items[i]["prompt"] for i in idx],
            limit,
            batch_size,
        )
        for i, answer in zip(idx, got, strict=True):
            answers[i] = answer
    return [(it, ans, is_right(it, ans)) for it, ans in zip(items, answers, strict=True)]


def roles_swapped(item: dict, answer: str) -> bool:
    """Whether a wrong ``answer`` to a two-shape question states its facts with the roles swapped: about
    the reference shape, relative to the asked subject ("The Y is right of the X" for "where is the X
    from the Y"). Still wrong (the question named the subject); counted to tell such answers apart."""
    targets = item["targets"]
    return len(targets) == 2 and is_right({**item, "targets": targets[::-1]}, answer)


def summarise(judged: list[tuple[dict, str, bool]], failures: int = 0) -> dict:
    """Accuracy per question type and per family, the self-relation count, the wrong answers per type
    that only swapped the subject and the reference (`roles_swapped`) and up to ``failures`` wrong
    answers per family."""
    by_type: dict[str, list[bool]] = {}
    by_family: dict[str, list[bool]] = {}
    wrong: dict[str, list[dict]] = {}
    swapped: dict[str, int] = {}
    selfish = []
    for it, ans, ok in judged:
        by_type.setdefault(it["qtype"], []).append(ok)
        by_family.setdefault(it["family"], []).append(ok)
        if not ok and roles_swapped(it, ans):
            swapped[it["qtype"]] = swapped.get(it["qtype"], 0) + 1
        if self_relations(ans):
            selfish.append({"q": it["prompt"], "got": ans})
        if not ok and len(wrong.setdefault(it["family"], [])) < failures:
            wrong[it["family"]].append({"q": it["prompt"], "expected": it["answer"], "got": ans})
    report = {
        "n": len(judged),
        "by_type": {k: float(np.mean(v)) for k, v in by_type.items()},
        "by_family": {k: float(np.mean(v)) for k, v in by_family.items()},
        "self_relations": len(selfish),
        "roles_swapped": swapped,
    }
    if failures:
        report["failures"] = {k: v for k, v in wrong.items() if v}
        report["self_relation_answers"] = selfish[:failures]
    return report


def evaluate_families(
    model_dir: Path,
    seeds: tuple[int, ...] = FAMILY_SEEDS,
    n_per_family: int = N_PER_FAMILY,
    split: str = "heldout",
    failures: int = 0,
    device: str = "cpu",
) -> dict:
    """`summarise` of the model's answers to ``split``'s families, per held-out scene set in ``seeds``."""
    if device == "cpu":
        torch.set_num_threads(1)
    processor, model = load(model_dir, device)
    families = SPLITS[split]
    report: dict = {"model": str(model_dir), "split": split, "n_per_family": n_per_family, "sets": {}}
    for seed in seeds:
        judged = judge_items(processor, model, family_items(families, seed, n_per_family))
        report["sets"][str(seed)] = summarise(judged, failures)
        result = report["sets"][str(seed)]
        logger.info("set %d: %s; roles swapped: %s", seed, result["by_type"], result["roles_swapped"])
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.evaluate_families", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", type=Path, required=True, help="the saved model to evaluate")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=list(FAMILY_SEEDS), help="held-out scene sets"
    )
    parser.add_argument("--n-per-family", type=int, default=N_PER_FAMILY)
    parser.add_argument("--split", choices=sorted(SPLITS), default="heldout", help="which families to ask")
    parser.add_argument("--failures", type=int, default=0, help="wrong answers per family to show")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="also write the report (JSON) here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    report = evaluate_families(
        args.model, tuple(args.seeds), args.n_per_family, args.split, args.failures, args.device
    )
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()

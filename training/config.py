"""The training run's settings (`TrainConfig`, checked on creation) and the generators of extra
training phrasings (``--phrasings``): what `training.train` runs and its command line sets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.data import ATTN_SCOPES, WORLDS
from training.phrasing_extra import EXTRA_FAMILIES, FROM_FAMILIES, ROLE_FAMILIES
from training.phrasing_families import TRAINING_FAMILIES, Family, training_groups
from training.phrasings import EXTRA_TRAINING_QUESTIONS


def parse_weights(text: str) -> dict[str, float]:
    """``"relation=0.3,detail=0.2,..."`` as a dict; ValueError if malformed."""
    weights = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"question weights are type=weight pairs, not {part!r}")
        weights[name.strip()] = float(value)
    return weights


def mixed_groups(families: tuple[Family, ...] = TRAINING_FAMILIES) -> dict[str, tuple[tuple[str, ...], ...]]:
    """The training families' groups plus, per type, the frames' phrasings as one more group: a
    fine-tuning on the families that keeps asking what the shipped weights learnt from the frames."""
    groups = dict(training_groups(families))
    for qtype, phrasings in EXTRA_TRAINING_QUESTIONS.items():
        groups[qtype] = (*groups.get(qtype, ()), tuple(phrasings))
    return groups


#: The generators of extra training phrasings (``--phrasings``).
PHRASINGS = {
    "frames": lambda: EXTRA_TRAINING_QUESTIONS,
    "families": training_groups,
    "mixed": mixed_groups,
    "mixed-plus": lambda: mixed_groups(TRAINING_FAMILIES + EXTRA_FAMILIES),
    "mixed-roles": lambda: mixed_groups(TRAINING_FAMILIES + EXTRA_FAMILIES + ROLE_FAMILIES),
    "mixed-from": lambda: mixed_groups(TRAINING_FAMILIES + EXTRA_FAMILIES + FROM_FAMILIES),
}


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (all step counts; ``time_limit_s`` is only a safety stop)."""

    world: str = "v1"
    steps: int = 1800
    batch: int = 32
    lr: float = 2e-3
    warmup: int = 100
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    aux_weight: float = 0.5
    attn_weight: float = 0.0
    attn_layers: tuple[int, ...] = (1, 2)
    attn_scope: str = "asked"  # see ATTN_SCOPES
    hidden: int = 192  # language model width
    layers: int = 4
    mlp: int = 512
    vision_hidden: int = 128
    vision_layers: int = 2
    seed: int = 0
    threads: int = 1
    bf16: bool = True
    device: str = "cpu"
    workers: int = 0  # processes building batches (0 = in the training process)
    # > 0: seconds of training loop after which the run saves and stops; the learning-rate decay then
    # follows the clock too (see lr_at). Logged; a clock-bound run is not step-reproducible.
    time_limit_s: float = 0.0
    log_every: int = 100
    # Fine-tuning: start from the model saved in this folder (its sizes and tokenizer; the size fields
    # above are then ignored) instead of a random initialisation. The per-patch head starts afresh.
    init: str = ""
    # Share of each type's questions asked with a generated phrasing instead of a TRAINING_QUESTIONS
    # one, v2 only; ``phrasings`` says which generator: "frames" (training.phrasings, 230 phrasings) or
    # "families" (the training families of training.phrasing_families), "mixed" (both),
    # "mixed-plus" (mixed and `EXTRA_FAMILIES`), "mixed-roles" (mixed-plus and `ROLE_FAMILIES`) or
    # "mixed-from" (mixed-plus and `FROM_FAMILIES`).
    extra_phrasing_share: float = 0.0
    phrasings: str = "frames"
    # Share of training questions with filler or made-up words inserted (v2 only; 0 = none).
    question_noise: float = 0.0
    # "type=weight,..." for every question type: how often each is asked ("" = the world's mix).
    qtype_weights: str = ""
    # Keep the vision tower and projector as they are (train the language model only); the per-patch
    # loss, which only trains the vision side, is then skipped.
    freeze_vision: bool = False
    # Weight of the language-model loss on the first ``lead_tokens`` tokens of every answer (1 = the
    # plain mean over answer tokens). The lead is where an answer picks its type and its subject ("The
    # square is ..." or "The heart is ..."), which is what fails on unseen wording.
    lead_weight: float = 1.0
    lead_tokens: int = 3

    def __post_init__(self):
        if self.world not in WORLDS:
            raise ValueError(f"world must be one of {sorted(WORLDS)}, not {self.world!r}")
        if self.attn_scope not in ATTN_SCOPES:
            raise ValueError(f"attn_scope must be one of {ATTN_SCOPES}, not {self.attn_scope!r}")
        if self.steps < 1 or self.batch < 1 or self.hidden % 4 or self.vision_hidden % 4:
            raise ValueError("need steps >= 1, batch >= 1 and widths divisible by 4 heads")
        if max(self.attn_layers) >= self.layers:
            raise ValueError(f"binding layers {self.attn_layers} need more than {self.layers} layers")
        if not 0.0 <= self.extra_phrasing_share <= 1.0:
            raise ValueError(f"extra_phrasing_share must be in [0, 1], not {self.extra_phrasing_share}")
        if self.phrasings not in PHRASINGS:
            raise ValueError(f"phrasings must be one of {sorted(PHRASINGS)}, not {self.phrasings!r}")
        if (self.question_noise > 0 or self.qtype_weights) and self.world != "v2":
            raise ValueError("question noise and a question mix are for world v2 only")
        if self.question_noise > 0 or self.qtype_weights:  # raises ValueError if out of range
            weights = parse_weights(self.qtype_weights) if self.qtype_weights else None
            WORLDS[self.world].with_training_mix(weights, self.question_noise)
        if self.extra_phrasing_share > 0 and self.world != "v2":
            raise ValueError("extra phrasings exist for world v2 only")
        if self.lead_weight <= 0 or self.lead_tokens < 1:
            raise ValueError("need lead_weight > 0 and lead_tokens >= 1")
        if self.init and not (Path(self.init) / "config.json").is_file():
            raise ValueError(f"init must be a folder with a saved model (config.json): {self.init!r}")

    @property
    def uses_patch_loss(self) -> bool:
        return self.aux_weight > 0 and not self.freeze_vision

"""`RecapConfig`: every knob of the RECAP drafter in one validated, frozen dataclass.

Choices the method spec marks *(ours)* are parameters here, and each has an ablation in
`ABLATIONS` (a named set of overrides applied with `apply_ablation`).

Example::

    config = RecapConfig(budget=32)
    apply_ablation(config, "recap-no-suffix").suffix     # False
    RecapConfig(k=0)                                     # ValueError: k must be ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

#: Node budget used by ``budget="auto"`` when no cost model was measured (a CPU-friendly size).
AUTO_FALLBACK_BUDGET = 16
#: The cap of ``budget="auto"`` (``max_budget=None``) unless the device's cost curve is flat further.
AUTO_CAP = 64


@dataclass(frozen=True)
class RecapConfig:
    """Parameters of fusion, tree construction and the memories.

    ``k``: top-k kept per prediction record. ``budget``: tree nodes per pass, or ``"auto"`` to grow the
    tree while expected tokens per unit of forward cost improve (see `recap.models.cost`), capped at
    ``max_budget``. ``depth``/``branching``: maximum depth and children per expanded node.
    ``score_floor``: candidates whose path score falls below it are dropped. ``specificity``: priors
    ``(s1, s2, s3)`` of the 1/2/3-token memories. ``kappa_min``: lower clamp of a record's concentration.
    ``suffix*``: suffix-matched continuations (longest suffix up to ``suffix_max_len`` tokens, at most
    ``suffix_budget`` new nodes). ``use_persistent``/``use_context``: which memories are consulted.
    ``uniform_weights``: ``s_n = 1, kappa = 1`` (ablation). ``tree``: best-first search or the static
    Token Recycling template filled from the fused distribution.

    Ours, beyond the paper (docs/method.md, "The paper's method and ours"): ``calibrate``: order growth
    and count expected tokens by acceptance estimates learnt online (`recap.drafters.recap.estimates`) instead
    of raw fused probabilities; ``suffix_prior``: the cold-start estimate of a suffix-matched token the
    memories do not back; ``context_scope``: ``"request"`` clears the contextual memories per request
    (the paper), ``"stream"`` keeps the earlier requests' records as a fallback that this request's
    writes replace (the acceptance estimates tell the two apart); ``context_consensus``: with
    ``"stream"``, the decay of the consensus a key keeps of the earlier requests' records
    (`recap.drafters.recap.context.ContextMemory.fold`: a key this request has not written offers the decayed
    mean of what earlier requests predicted there), 0 keeps the latest request's record only;
    ``fans``: in a request with an image, where earlier answers (other images) continued a context in
    different ways (`recap.drafters.recap.continuations`), queue its best candidate and every candidate that
    is one of those continuations at the context's own priority, so the tree offers the alternatives
    where the image decides;
    ``backoff``: where no memory has a record, draft the stream's most often committed tokens
    (`recap.drafters.recap.backoff`) instead of nothing; ``suffix_scope``: ``"stream"`` lets the suffix match
    also continue the stream's earlier requests (their last `recap.drafters.recap.mirror.STREAM_SUFFIX_TOKENS`
    tokens), ``"request"`` only this request's.
    """

    k: int = 8
    budget: int | Literal["auto"] = "auto"
    max_budget: int | None = None
    depth: int = 16
    branching: int = 8
    score_floor: float = 0.0
    specificity: tuple[float, float, float] = (1.0, 2.0, 4.0)
    kappa_min: float = 0.05
    suffix: bool = True
    suffix_max_len: int = 8
    suffix_budget: int = 16
    use_persistent: bool = True
    use_context: bool = True
    uniform_weights: bool = False
    tree: Literal["best_first", "template"] = "best_first"
    calibrate: bool = True
    suffix_prior: float = 0.5
    context_scope: Literal["request", "stream"] = "stream"
    context_consensus: float = 0.9
    suffix_scope: Literal["request", "stream"] = "stream"
    backoff: bool = True
    fans: bool = True

    @property
    def memory_priors(self) -> tuple[float, float, float]:
        """The specificity priors in the memories' order (ctx3, ctx2, persistent:
        `recap.drafters.recap.fusion.MEMORIES`); ``specificity`` lists them by key length (s1, s2, s3)."""
        s1, s2, s3 = self.specificity
        return s3, s2, s1

    def __post_init__(self) -> None:
        _check_int("k", self.k, 1, 1024)
        if self.budget != "auto":
            _check_int("budget", self.budget, 0, 4096, hint='or the string "auto"')
        if self.max_budget is not None:
            _check_int("max_budget", self.max_budget, 1, 4096)
        _check_int("depth", self.depth, 1, 256)
        _check_int("branching", self.branching, 1, 1024)
        _check_int("suffix_max_len", self.suffix_max_len, 2, 256)
        _check_int("suffix_budget", self.suffix_budget, 0, 4096)
        if not (isinstance(self.score_floor, int | float) and 0.0 <= self.score_floor < 1.0):
            raise ValueError(f"score_floor must be a number in [0, 1), got {self.score_floor!r}")
        if not (isinstance(self.kappa_min, int | float) and 0.0 < self.kappa_min <= 1.0):
            raise ValueError(f"kappa_min must be a number in (0, 1], got {self.kappa_min!r}")
        spec = tuple(self.specificity)
        if len(spec) != 3 or not all(isinstance(s, int | float) and math.isfinite(s) and s > 0 for s in spec):
            raise ValueError(f"specificity must be three positive finite numbers (s1, s2, s3), got {spec!r}")
        object.__setattr__(self, "specificity", tuple(float(s) for s in spec))
        if self.tree not in ("best_first", "template"):
            raise ValueError(f'tree must be "best_first" or "template", got {self.tree!r}')
        if not (isinstance(self.suffix_prior, int | float) and 0.0 <= self.suffix_prior <= 1.0):
            raise ValueError(f"suffix_prior must be a number in [0, 1], got {self.suffix_prior!r}")
        if self.context_scope not in ("request", "stream"):
            raise ValueError(f'context_scope must be "request" or "stream", got {self.context_scope!r}')
        if not (
            isinstance(self.context_consensus, int | float)
            and not isinstance(self.context_consensus, bool)
            and 0.0 <= self.context_consensus <= 1.0
        ):
            raise ValueError(f"context_consensus must be a number in [0, 1], got {self.context_consensus!r}")
        if self.suffix_scope not in ("request", "stream"):
            raise ValueError(f'suffix_scope must be "request" or "stream", got {self.suffix_scope!r}')
        if not (self.use_persistent or self.use_context or self.suffix):
            raise ValueError("at least one of use_persistent, use_context, suffix must be enabled")


def _check_int(name: str, value: Any, low: int, high: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        extra = f" {hint}" if hint else ""
        raise ValueError(f"{name} must be an integer in [{low}, {high}]{extra}, got {value!r}")


#: Named ablations of the method: overrides applied on top of a base config.
ABLATIONS: Mapping[str, Mapping[str, Any]] = {
    "recap-no-persistent": {"use_persistent": False},
    "recap-no-context": {"use_context": False},
    "recap-no-suffix": {"suffix": False},
    "recap-uniform": {"uniform_weights": True},
    "recap-template": {"tree": "template"},
    "recap-uncalibrated": {"calibrate": False},
    "recap-request-context": {"context_scope": "request"},
    "recap-latest-context": {"context_consensus": 0.0},
    "recap-no-backoff": {"backoff": False},
    "recap-no-fans": {"fans": False},
    "recap-request-suffix": {"suffix_scope": "request"},
}

#: Named presets: the full method with device-appropriate budgets.
PRESETS: Mapping[str, RecapConfig] = {
    "default": RecapConfig(),
    "gpu": RecapConfig(budget=64),
    "cpu": RecapConfig(budget="auto", max_budget=16),
}


def apply_ablation(config: RecapConfig, name: str) -> RecapConfig:
    """``config`` with the overrides of ablation ``name`` (one of `ABLATIONS`, or ``"recap"``: unchanged)."""
    if name == "recap":
        return config
    try:
        return replace(config, **ABLATIONS[name])
    except KeyError:
        raise ValueError(f"unknown ablation {name!r}; choose one of: {', '.join(ABLATIONS)}") from None

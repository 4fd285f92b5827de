"""Lossless sampling with a draft tree: the target's processed distribution, and tree acceptance.

Two pieces, both independent of how the tree was drafted:

- `SamplingSettings` + `processed_probs`: temperature, top-k and top-p applied to the target's logits
  exactly as transformers' ``generate(do_sample=True)`` applies them (temperature, then top-k, then
  top-p, each keeping at least one token; top-k keeps ties with the k-th logit).
- `accept_sampled`: verification of a tree whose nodes are *chosen* tokens (a drafter's best
  guesses), not tokens drawn from a draft distribution. At a position with processed distribution
  ``p`` and children ``c1, c2, ...`` (in tree order) the rule is: accept ``c1`` with probability
  ``p(c1)``; on rejection remove ``c1`` from ``p`` and renormalise; try ``c2`` against the
  renormalised ``p``; and so on. If no child is accepted, the bonus token is drawn from what is left
  of ``p`` (the *residual*). The token committed at each position is therefore distributed exactly as
  ``p`` whatever the children are: it is the same as drawing one token from ``p`` and looking it up
  among the children. So the output distribution equals the target's, for any drafter. We implement
it that way round (one uniform draw per committed position, turned into a token through ``p``'s
cumulative distribution, then looked up among the children), which adds a property the sequential
form lacks: a seeded run commits the same tokens whichever drafter ran, autoregressive included.

Temperature 0 means greedy: callers keep the greedy path (`recap.verify.accept_greedy`) for it.

Worked example (one position, ``p = [0.5, 0.3, 0.2]`` over tokens 0, 1, 2; children 1 then 2):
child 1 is accepted with probability 0.3; otherwise (0.7) ``p`` becomes ``[0.5, -, 0.2] / 0.7`` and
child 2 is accepted with probability ``0.2 / 0.7``; otherwise the residual is token 0. Overall:
token 1 with 0.3, token 2 with ``0.7 * 0.2 / 0.7 = 0.2``, token 0 with 0.5, i.e. exactly ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recap.tree import ROOT, DraftTree
from recap.verify import Acceptance

#: The most tokens a `top_k` may keep (larger values are refused as absurd, not clipped silently).
MAX_TOP_K = 1_000_000


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingSettings:
    """How the target's next token is chosen. ``temperature == 0`` is greedy decoding.

    ``top_k``: keep the k most likely tokens (0 = off). ``top_p``: keep the smallest set of most likely
    tokens whose mass reaches ``top_p`` (1.0 = off). ``seed``: seeds the run's random generator, so a
    seeded run is reproducible; ``None`` draws fresh entropy.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise ValueError(f"temperature must be a number, got {temperature!r}")
        if not math.isfinite(temperature) or not 0.0 <= temperature <= 100.0:
            raise ValueError(f"temperature must be from 0 (greedy) to 100, got {temperature!r}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an integer from 0 (off) to {MAX_TOP_K}, got {self.top_k!r}")
        top_p = self.top_p
        if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not math.isfinite(top_p):
            raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
        seed = self.seed
        if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> np.random.Generator:
        """The run's random generator (one per request; every draw of the run comes from it)."""
        return np.random.default_rng(self.seed)

    def generate_kwargs(self) -> dict:
        """The same settings as keyword arguments of transformers' ``generate()``."""
        if self.greedy:
            return {"do_sample": False}
        return {
            "do_sample": True,
            "temperature": float(self.temperature),
            "top_k": self.top_k or None,
            "top_p": float(self.top_p),
        }


GREEDY = SamplingSettings()


def processed_probs(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Next-token distributions ``(rows, vocab)`` float64 after temperature, top-k and top-p.

    Mirrors transformers' ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` -> ``TopPLogitsWarper``
    (``min_tokens_to_keep = 1``), then a softmax. Not for ``temperature == 0`` (greedy has no ``p``).
    """
    if settings.greedy:
        raise ValueError("temperature 0 is greedy decoding: it has no sampling distribution")
    scores = logits.float()
    if settings.temperature != 1.0:
        scores = scores / settings.temperature
    if settings.top_k:
        kth = torch.topk(scores, min(settings.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if settings.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - settings.top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(-1, order, remove), -math.inf)
    return torch.softmax(scores.double(), dim=-1)


@dataclass(frozen=True)
class PositionDraw:
    """What happened at one verified position (for display): each child tried, then the outcome.

    ``tried``: ``(token, p)`` of every child tried in order, with ``p`` the target's processed
    probability of it (before any renormalisation). ``token``: the committed token; ``residual``: it
    was drawn from the residual because no child was accepted.
    """

    tried: tuple[tuple[int, float], ...]
    token: int
    residual: bool


@dataclass(frozen=True)
class SampledAcceptance(Acceptance):
    """An `Acceptance` plus, per verified position (root first), how its token was chosen."""

    draws: tuple[PositionDraw, ...] = field(default=())


def choose_among(p: np.ndarray, children: Sequence[int], u: float) -> tuple[int | None, int, PositionDraw]:
    """The one-step rule at a position with distribution ``p`` (1-D) and child tokens, given ``u``.

    ``u`` is one uniform draw in [0, 1). The committed token is the one whose interval of the
    cumulative distribution (in vocabulary order) contains ``u``: a draw from ``p`` that does not
    depend on the children. It is then looked up among them. Seen from the children this is the
    sequential rule of the module docstring: ``c1`` is accepted with probability ``p(c1)``, ``c2``
    (given ``c1`` was rejected) with ``p(c2) / (1 - p(c1))``, ..., else the token comes from the
    residual. Because the token does not depend on the tree, a seeded run commits the same tokens
    whatever the drafter proposed (the same as autoregressive sampling with that seed).

    Returns ``(index of the accepted child or None, committed token, PositionDraw)``.
    """
    cumulative = np.cumsum(p, dtype=np.float64)
    token = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    token = min(token, len(p) - 1)
    tried = tuple((int(c), float(p[c])) for c in children)
    for index, child in enumerate(children):
        if int(child) == token:
            return index, token, PositionDraw(tried[: index + 1], token, residual=False)
    return None, token, PositionDraw(tried, token, residual=True)


def accept_sampled(
    tree: DraftTree, distribution: Callable[[int], np.ndarray], rng: np.random.Generator
) -> SampledAcceptance:
    """Sampling verification of ``tree``: walk from the root applying `choose_among` at each position.

    ``distribution(row)`` gives the processed distribution (1-D, over the vocabulary) at the root
    (row 0) or at node ``row - 1``; it is asked only for the rows the walk visits (at most depth + 1),
    so a caller never materialises ``len(tree) + 1`` full-vocabulary rows. The committed tokens are
    the accepted nodes' tokens plus the last visited position's token (drawn from its residual).
    Each visited position consumes exactly one uniform draw from ``rng`` and commits one token, so
    the committed tokens depend on the seed and the target alone, never on the tree.
    """
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    nodes: list[int] = []
    draws: list[PositionDraw] = []
    position = ROOT
    while True:
        kids = children.get(position, [])
        p = distribution(position + 1)
        chosen, token, draw = choose_among(p, [tree.tokens[c] for c in kids], float(rng.random()))
        draws.append(draw)
        if chosen is None:
            tokens = (*(tree.tokens[n] for n in nodes), token)
            return SampledAcceptance(tuple(nodes), tokens, tuple(draws))
        position = kids[chosen]
        nodes.append(position)

"""What a verification pass costs, learnt from the engine's own steps, and the batch-wide cut it sets.

In a batch every request's drafts are verified in one pass, so a draft costs every request its time.
`PassCost` fits the wall-clock time of an engine step to what it computed, ``fixed + drafting (when any
draft is verified) + per_token * tokens`` (`StepCost`), from the verification steps the proposer sees,
forgetting old ones, so that a machine that gets busier or a batch that grows moves the fit.
``drafting`` is what the engine's speculative path costs a step whatever the number of drafts (on vLLM's
CPU build about a fifth of a plain step at 8 requests). `batch_lengths` then sends, across the batch,
the drafts that raise the tokens committed per second, or none: a request commits its pending token
plus, on average, the path estimates of the drafts it sends (`recap.drafters.recap.chain`).

Example: four requests whose chains' path estimates are ``[0.9, 0.8, 0.5, 0.1]`` each, on ``fixed =
60 ms``, ``per_token = 3 ms`` and no drafting cost: every request sends its first three drafts (the
four 0.1 drafts would commit 0.4 tokens for 12 ms, while the batch commits about 0.12 tokens a ms
without them)::

    batch_lengths([np.array([0.9, 0.8, 0.5, 0.1])] * 4, StepCost(0.060, 0.0, 0.003))   # [3, 3, 3, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

#: Steps a fit needs before it is trusted (until then every chain goes whole).
LEAST_STEPS = 16
#: How much of its weight a step keeps at each later step (an effective window of ~200 steps).
FORGET = 0.995
#: The weight of steps without drafts (and of steps with drafts) below which ``drafting`` is not read
#: from them (it is taken as 0 until then).
LEAST_WEIGHT = 4.0
#: A step that took this many times what the fit says is not a step of the batch (the engine waited
#: for requests, or the machine stalled): left out of the fit.
OUTLIER = 8.0


class StepCost(NamedTuple):
    """Seconds an engine step takes: ``fixed``, plus ``drafting`` when it verifies any draft, plus
    ``per_token`` for each token it computes (pending tokens and drafts)."""

    fixed: float
    drafting: float
    per_token: float

    def seconds(self, tokens: float, drafts: float) -> float:
        """A step of ``tokens`` tokens, of which ``drafts`` are drafts."""
        return self.fixed + (self.drafting if drafts > 0 else 0.0) + self.per_token * tokens


class PassCost:
    """An online least-squares fit of an engine step's wall-clock seconds (`StepCost`)."""

    def __init__(self, forget: float = FORGET, least: int = LEAST_STEPS) -> None:
        self.forget, self.least = forget, least
        self.steps = 0
        # Weighted sums x x^T and x y over the steps, x = (1, verifies drafts, tokens), y = seconds.
        self._xx = np.zeros((3, 3))
        self._xy = np.zeros(3)
        self._fit: StepCost | None = None  # solved once a step, in `add`

    def add(self, tokens: int, drafts: int, seconds: float) -> None:
        """One verification step: the tokens it computed (``drafts`` of them drafts) and the seconds it
        took. Ignored when ``tokens`` or ``seconds`` is not positive, or when the step took `OUTLIER`
        times what the fit says."""
        if tokens <= 0 or not 0 < seconds < float("inf"):
            return
        if self._fit is not None and seconds > OUTLIER * self._fit.seconds(tokens, drafts):
            return
        x = np.array([1.0, 1.0 if drafts > 0 else 0.0, float(tokens)])
        self._xx = self.forget * self._xx + np.outer(x, x)
        self._xy = self.forget * self._xy + x * float(seconds)
        self.steps += 1
        self._fit = self._solved()

    def without_drafts(self) -> float:
        """The weight of the steps without drafts in the fit (a step weighs 1, less as it ages)."""
        return float(self._xx[0, 0] - self._xx[1, 1])

    def fit(self) -> StepCost | None:
        """The `StepCost` of the steps so far, or None before `least` steps or while every step had
        about as many tokens (no slope to read). ``drafting`` is 0 until there is `LEAST_WEIGHT` of
        steps with drafts and without; no part is negative, ``fixed`` is more than 0."""
        return self._fit

    def _solved(self) -> StepCost | None:
        if self.steps < self.least:
            return None
        both = self._xx[1, 1] >= LEAST_WEIGHT and self.without_drafts() >= LEAST_WEIGHT
        used = [0, 1, 2] if both else [0, 2]
        xx, xy = self._xx[np.ix_(used, used)], self._xy[used]
        if np.linalg.cond(xx) > 1e12:
            return None
        solved = dict(zip(used, np.linalg.solve(xx, xy)))
        fixed, drafting, per_token = solved[0], max(0.0, solved.get(1, 0.0)), max(0.0, solved[2])
        if fixed <= 0:  # all the time is the tokens': a fit through the origin
            fixed = 1e-9
        return StepCost(float(fixed), float(drafting), float(per_token))


def batch_lengths(chains: Sequence[np.ndarray], cost: StepCost) -> list[int]:
    """How many drafts each request sends, from its chain's path estimates (``chains``: one array a
    request, root's child first), so that the batch commits the most tokens per second of a step that
    takes ``cost.seconds(tokens, drafts)``, a request's pending token counted. Drafts go in the order of
    their estimates (each chain's made non-increasing, so a request sends a prefix of its chain); none
    when that commits more per second; every chain whole when drafts cost nothing."""
    if cost.per_token <= 0 and cost.drafting <= 0:
        return [len(chain) for chain in chains]
    rows = len(chains)
    owners, values = [], []
    for row, chain in enumerate(chains):
        capped = np.minimum.accumulate(np.asarray(chain, dtype=np.float64)) if len(chain) else np.zeros(0)
        owners.append(np.full(len(capped), row))
        values.append(capped)
    if not rows or not sum(len(v) for v in values):
        return [0] * rows
    owner, value = np.concatenate(owners), np.concatenate(values)
    order = np.argsort(-value, kind="stable")  # a chain's earlier drafts first on ties
    sent = np.arange(len(order) + 1)
    committed = rows + np.concatenate([[0.0], np.cumsum(value[order])])
    seconds = cost.fixed + np.where(sent > 0, cost.drafting, 0.0) + cost.per_token * (rows + sent)
    best = int(np.argmax(committed / seconds))  # the fewest drafts on a tie
    return np.bincount(owner[order[:best]], minlength=rows).tolist()

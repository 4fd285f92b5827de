"""What a verification pass costs, learnt from the engine's own steps, and the batch-wide cut it sets.

In a batch every request's drafts are verified in one pass, so a draft costs every request its time.
`PassCost` fits the wall-clock time of an engine step to the tokens it computed, ``fixed + per_token *
tokens``, from the steps the proposer sees (forgetting old ones, so a machine that gets busier or a
batch that grows moves the line). `batch_lengths` then sends, across the batch, the drafts that raise
the tokens committed per second: a request commits its pending token plus, on average, the path
estimates of the drafts it sends (`recap.drafters.recap.chain`), and a pass of ``n`` tokens costs
``fixed + per_token * n``.

Example: four requests whose chains' path estimates are ``[0.9, 0.8, 0.5, 0.1]`` each, on a line of
``fixed = 60 ms`` and ``per_token = 3 ms``: every request sends its first three drafts (the four 0.1
drafts would commit 0.4 tokens for 12 ms, while the batch commits about 0.12 tokens a ms without them):

    batch_lengths([np.array([0.9, 0.8, 0.5, 0.1])] * 4, 0.060, 0.003)   # [3, 3, 3, 3]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Steps a line needs before it is trusted (until then every chain goes whole).
LEAST_STEPS = 16
#: How much of its weight a step keeps at each later step (an effective window of ~200 steps).
FORGET = 0.995
#: A step that took this many times the line's time is not a step of the batch (the engine waited for
#: requests, or the machine stalled): left out of the fit.
OUTLIER = 8.0


class PassCost:
    """An online least-squares line of an engine step's wall-clock seconds against its tokens."""

    def __init__(self, forget: float = FORGET, least: int = LEAST_STEPS) -> None:
        self.forget, self.least = forget, least
        self.steps = 0
        # Weighted sums of 1, x, y, x*x and x*y (x: tokens, y: seconds).
        self._sums = np.zeros(5)

    def add(self, tokens: int, seconds: float) -> None:
        """One engine step: the tokens it computed and the seconds it took (ignored when either is not
        positive, or when the step took `OUTLIER` times what the line says)."""
        if tokens <= 0 or not 0 < seconds < float("inf"):
            return
        line = self.line()
        if line is not None and seconds > OUTLIER * (line[0] + line[1] * tokens):
            return
        x, y = float(tokens), float(seconds)
        self._sums = self.forget * self._sums + np.array([1.0, x, y, x * x, x * y])
        self.steps += 1

    def line(self) -> tuple[float, float] | None:
        """``(fixed, per_token)`` seconds, or None before `least` steps or while every step had about as
        many tokens (no slope to read). ``per_token`` is at least 0 and ``fixed`` more than 0."""
        if self.steps < self.least:
            return None
        weight, sx, sy, sxx, sxy = self._sums
        spread = weight * sxx - sx * sx
        if spread <= 1e-9 * max(weight * sxx, 1e-12):
            return None
        per_token = max(0.0, (weight * sxy - sx * sy) / spread)
        fixed = (sy - per_token * sx) / weight
        if fixed <= 0:  # all the time is the tokens': a line through the origin
            per_token, fixed = sxy / sxx, 1e-9
        return float(fixed), float(per_token)


def batch_lengths(chains: Sequence[np.ndarray], fixed: float, per_token: float) -> list[int]:
    """How many drafts each request sends, from its chain's path estimates (``chains``: one array a
    request, root's child first), so that the batch commits the most tokens per second of a pass of
    ``fixed + per_token * tokens`` seconds, a request's pending token counted. Drafts go in the order
    of their estimates (each chain's made non-increasing, so a request sends a prefix of its chain);
    every chain goes whole when ``per_token`` is 0."""
    if per_token <= 0:
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
    committed = rows + np.concatenate([[0.0], np.cumsum(value[order])])
    seconds = fixed + per_token * (rows + np.arange(len(order) + 1))
    sent = int(np.argmax(committed / seconds))  # the fewest drafts on a tie
    return np.bincount(owner[order[:sent]], minlength=rows).tolist()

"""Draft overhead of a drafter without a model: simulated observations, timed propose + observe.

The target is replaced by a cheap stand-in whose top-k after a context depends on its last two tokens
and is a Zipf-like draw (a few frequent tokens, a long tail), so the memories fill and hit as on text.
Only the drafter's own work is timed, not the stand-in. ``python -m recap.overhead`` prints the numbers.

Example::

    measure_overhead(vocab_size=152_064, budget=64, steps=200)
    # {'median_ms': ..., 'p90_ms': ..., 'mean_nodes': ..., 'steps': 200, ...}
"""

from __future__ import annotations

import logging
import time

import numpy as np

from recap.config import RecapConfig
from recap.drafters import make_drafter
from recap.drafters.base import Observation, RequestInfo
from recap.verify import accept_greedy

logger = logging.getLogger(__name__)


class _StandIn:
    """A fake target: the top-k after a context depends on its last two tokens (Zipf-like ids, sorted
    probabilities), so contexts recur and all three memories hit as on text. Cached per key."""

    def __init__(self, vocab_size: int, k: int, rng: np.random.Generator) -> None:
        self.vocab_size, self.k, self.rng = vocab_size, k, rng
        self._rows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def _draw(self) -> tuple[np.ndarray, np.ndarray]:
        ids = list(
            dict.fromkeys(((self.rng.zipf(1.3, size=4 * self.k) - 1) % (self.vocab_size - 1)).tolist())
        )
        ids += [t for t in self.rng.integers(0, self.vocab_size - 1, size=self.k).tolist() if t not in ids]
        logits = self.rng.standard_normal(self.k) * 2.0
        probs = np.exp(logits) / np.exp(logits).sum() * self.rng.uniform(0.5, 1.0)
        return np.array(ids[: self.k]), -np.sort(-probs)

    def rows(self, contexts: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ``(len(contexts), k)`` ids and probs after contexts ending in the given two tokens."""
        for key in contexts:
            if key not in self._rows:
                self._rows[key] = self._draw()
        return (
            np.stack([self._rows[key][0] for key in contexts]),
            np.stack([self._rows[key][1] for key in contexts]),
        )

    def random_token(self) -> int:
        return int((self.rng.zipf(1.3) - 1) % (self.vocab_size - 1))


def measure_overhead(
    vocab_size: int = 152_064,
    budget: int = 64,
    steps: int = 200,
    seed: int = 0,
    method: str = "recap",
    prompt_length: int = 600,
    config: RecapConfig | None = None,
) -> dict[str, float]:
    """Median and p90 milliseconds of ``propose + observe`` per step over ``steps`` simulated passes.

    Acceptance follows `recap.verify.accept_greedy` against the stand-in's greedy tokens; a third of
    the bonus tokens are replaced by random ones so the stream does not fall into a loop. ``config``
    overrides the default ``RecapConfig(budget=budget)``.
    """
    rng = np.random.default_rng(seed)
    target = _StandIn(vocab_size, 8, rng)
    config = config or RecapConfig(budget=budget, max_budget=max(budget, 1))
    drafter = make_drafter(method, config=config)
    image = vocab_size - 1
    prompt = [image] * 64 + [target.random_token() for _ in range(prompt_length)]
    drafter.begin(RequestInfo(tuple(prompt), frozenset({image}), vocab_size))
    ids, probs = target.rows([(prompt[i - 1], prompt[i]) for i in range(len(prompt))])
    drafter.observe(Observation(list(prompt), np.arange(len(prompt)), topk_ids=ids, topk_probs=probs))
    context = [*prompt, int(ids[-1, 0])]
    timings, nodes, accepted = [], [], []
    for _ in range(steps):
        started = time.perf_counter()
        tree = drafter.propose(context)
        drafted = time.perf_counter()
        paths = [context[-2:]] + [(context + tree.path(j))[-2:] for j in range(len(tree))]
        ids, probs = target.rows([tuple(p) for p in paths])
        acceptance = accept_greedy(tree, ids[:, 0].tolist())
        observation = Observation(context, np.array([len(context) - 1]), tree, ids, probs, acceptance)
        resumed = time.perf_counter()
        drafter.observe(observation)
        finished = time.perf_counter()
        timings.append((drafted - started + finished - resumed) * 1e3)
        nodes.append(len(tree))
        accepted.append(len(acceptance.tokens))
        committed = list(acceptance.tokens)
        if rng.random() < 1 / 3:
            committed[-1] = target.random_token()
        context = context + committed
    array = np.array(timings)
    return {
        "median_ms": float(np.median(array)),
        "p90_ms": float(np.percentile(array, 90)),
        "mean_nodes": float(np.mean(nodes)),
        "mat": float(np.mean(accepted)),
        "steps": steps,
        "vocab_size": vocab_size,
        "budget": budget,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    logger.info("%s", measure_overhead())

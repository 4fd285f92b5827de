"""Where drafting wins or loses at each generated position: covered, drafted, accepted.

At every state a verification pass reaches along its accepted path (the root, then each accepted
node), before the drafter learns from the pass, `CoverageProbe` asks the drafter whether its memories
held the token the target then committed there (*covered*, and by which memory; whether a record of
this request held it), whether the tree offered any candidate at that state (*drafted*), and whether
the committed token was a drafted one (*accepted*: in greedy decoding a drafted token equal to the
target's is always accepted). It also marks the state's *first mention*: the last two tokens there
never occurred earlier in this request's committed tokens (prompt and answer), so no record written
from this request's own text can exist for that context yet.

`Breakdown` counts these at image-sensitive and insensitive positions (`recap.bench.sensitivity`),
split into first and later mentions. Not covered is a loss of information (no memory knew the
token); covered but not accepted is a loss of allocation (the tree left the known token out).
It also counts positions and acceptances by the state's *depth*: how many drafts the pass had
accepted before it (0: the pass's first draft, where a tree offers its widest fan), in
`DEPTH_BUCKETS`. A method whose passes accept long chains reaches more of its positions deep in its
tree, where few candidates are left; `at_depths` weighs a method's acceptance at each depth by
another method's mix of depths, which compares the two at the same depths.

Example: a state whose last two tokens are ``(7, 9)``, first seen there, where RECAP's ``ctx2`` record
of this request lists the target's token 4 and the tree drafted 4: covered (ctx2, this request),
drafted, accepted, first mention.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recap.decode import StepObserver
from recap.drafters.base import Covers, Drafter, Observation

#: The breakdown's groups: image-sensitive or not, first or later mention.
GROUPS = ("sensitive-first", "sensitive-later", "insensitive-first", "insensitive-later")
#: What every group counts (``covered_<memory>`` keys are added for the memories that held tokens,
#: ``depth_<bucket>`` and ``accepted_depth_<bucket>`` for the depths that occurred).
BASE_KEYS = ("positions", "covered", "covered_this_request", "drafted", "accepted")
#: Depth buckets of a state: (label, lowest depth, highest depth or None).
DEPTH_BUCKETS = (("0", 0, 0), ("1", 1, 1), ("2-3", 2, 3), ("4-7", 4, 7), ("8+", 8, None))
DEPTH_LABELS = tuple(label for label, _, _ in DEPTH_BUCKETS)


def depth_bucket(depth: int) -> str:
    """The `DEPTH_BUCKETS` label of a depth: ``depth_bucket(5) == "4-7"``."""
    for label, low, high in DEPTH_BUCKETS:
        if depth >= low and (high is None or depth <= high):
            return label
    raise ValueError(f"a depth is a count of accepted drafts (>= 0), got {depth}")


def by_depth(counts: Sequence[dict[str, int]]) -> dict[str, tuple[int, int]]:
    """Bucket label -> (positions, accepted) summed over ``counts`` (groups of a method's breakdown,
    as `Breakdown.to_json` writes them), for the buckets that have positions."""
    found = {}
    for label in DEPTH_LABELS:
        positions = sum(c.get(f"depth_{label}", 0) for c in counts)
        if positions:
            found[label] = (positions, sum(c.get(f"accepted_depth_{label}", 0) for c in counts))
    return found


def sensitive_depths(breakdown: dict[str, dict[str, int]] | None) -> dict[str, tuple[int, int]]:
    """`by_depth` over the image-sensitive groups of a method's breakdown (`Breakdown.to_json`; {} for
    None: a method without one)."""
    return by_depth([breakdown[g] for g in GROUPS[:2]]) if breakdown else {}


def deep_share(depths: dict[str, tuple[int, int]]) -> float:
    """The share of `by_depth`'s positions met after 2 or more accepted drafts of the same pass."""
    total = sum(n for n, _ in depths.values())
    return sum(n for label, (n, _) in depths.items() if label not in ("0", "1")) / total if total else 0.0


def at_depths(method: dict[str, tuple[int, int]], reference: dict[str, tuple[int, int]]) -> float | None:
    """``method``'s acceptance at each depth (`by_depth`), weighted by ``reference``'s share of positions
    at that depth: what ``method`` would accept at ``reference``'s mix of depths. None when
    ``method`` has no position at a depth where ``reference`` has some (or ``reference`` has none).

    Example: method ``{"0": (10, 9), "4-7": (30, 15)}``, reference ``{"0": (30, 24), "4-7": (10, 4)}``:
    ``0.75 * 0.9 + 0.25 * 0.5 = 0.8`` (the method's own mix gives 0.6, the reference's 0.7).
    """
    total = sum(n for n, _ in reference.values())
    if not total or any(method.get(label, (0, 0))[0] == 0 for label in reference):
        return None
    return sum(n / total * method[label][1] / method[label][0] for label, (n, _) in reference.items())


@dataclass(frozen=True)
class PositionCoverage:
    """One generated position: the memories that held its token (empty: none), whether a record of
    this request held it, whether the tree drafted at that state, whether it is a first mention, and
    the state's depth (drafts its pass accepted before it)."""

    sources: tuple[str, ...]
    this_request: bool
    drafted: bool
    first_mention: bool
    depth: int = 0


class CoverageProbe(StepObserver):
    """Records `PositionCoverage` for every token committed by a verification pass (one probe per
    request): a `recap.decode.StepObserver`, or called with each pass's observation. ``coverage`` is
    None for a drafter that does not `Covers` (AR, PLD, SuffixDecoding): its coverage is not known."""

    def __init__(self, drafter: object) -> None:
        self.coverage = drafter.coverage if isinstance(drafter, Covers) else None
        self.positions: list[PositionCoverage] = []
        self._pairs: set[tuple[int, int]] = set()
        self._seen = 0  # committed tokens whose pairs are in `_pairs`
        #: Wall-clock seconds spent probing (the benchmark takes them out of a run's time).
        self.seconds = 0.0

    def verified(self, drafter: Drafter, observation: Observation, root_logits: torch.Tensor) -> None:
        self(observation)

    def __call__(self, observation: Observation) -> None:
        start = time.perf_counter()
        try:
            self._probe(observation)
        finally:
            self.seconds += time.perf_counter() - start

    def _probe(self, observation: Observation) -> None:
        acceptance = observation.acceptance
        if acceptance is None or not acceptance.tokens:
            return
        context, tree = list(observation.context), observation.tree
        self._learn(context)
        path = [*context]
        states, drafted = [], []
        parents = np.asarray(tree.parents, dtype=np.int64)
        for i, token in enumerate(acceptance.tokens):
            node = acceptance.nodes[i - 1] if i > 0 else -1
            drafted.append(bool(len(parents)) and bool((parents == node).any()))
            states.append(path[-3:])
            path.append(int(token))
        tails = np.array([[-1] * (3 - len(s)) + s for s in states], dtype=np.int64)
        covered = (
            self.coverage(tails, np.asarray(acceptance.tokens, dtype=np.int64))
            if self.coverage is not None
            else [((), False)] * len(states)
        )
        pairs = set()
        for i, ((sources, fresh), was_drafted) in enumerate(zip(covered, drafted)):
            pair = (int(tails[i, 1]), int(tails[i, 2]))
            first = pair not in self._pairs and pair not in pairs
            pairs.add(pair)
            self.positions.append(PositionCoverage(tuple(sources), bool(fresh), was_drafted, first, i))

    def _learn(self, context: Sequence[int]) -> None:
        """Add the pairs of committed tokens that end before the context's last token (the pair ending
        there is the first state's own; the context only grows within a request)."""
        for i in range(max(1, self._seen), len(context) - 1):
            self._pairs.add((int(context[i - 1]), int(context[i])))
        self._seen = max(self._seen, len(context) - 1)


@dataclass
class Breakdown:
    """Counts per group (`GROUPS`): positions, covered (by any memory, by each, by a record of this
    request), drafted and accepted, and positions and acceptances by depth."""

    counts: dict[str, Counter] = field(default_factory=lambda: {g: Counter() for g in GROUPS})

    def add(
        self, coverage: Sequence[PositionCoverage | None], sources: Sequence[str], flags: Sequence[bool]
    ) -> None:
        """Count positions where the method's output agrees with the reference (``flags`` its
        sensitivity flags; the first token, from the prefill pass, never counts: ``coverage[0]`` is None)."""
        for position, source, sensitive in zip(coverage, sources, flags):
            if position is None:
                continue
            mention = "-first" if position.first_mention else "-later"
            group = ("sensitive" if sensitive else "insensitive") + mention
            count = self.counts[group]
            count["positions"] += 1
            count["covered"] += bool(position.sources)
            count["covered_this_request"] += position.this_request
            count["drafted"] += position.drafted
            count["accepted"] += source != "target"
            bucket = depth_bucket(position.depth)
            count[f"depth_{bucket}"] += 1
            count[f"accepted_depth_{bucket}"] += source != "target"
            for name in position.sources:
                count[f"covered_{name}"] += 1

    def __iadd__(self, other: Breakdown) -> Breakdown:
        for group in GROUPS:
            self.counts[group].update(other.counts[group])
        return self

    def to_json(self) -> dict[str, dict[str, int]]:
        return {
            group: dict(sorted({**dict.fromkeys(BASE_KEYS, 0), **self.counts[group]}.items()))
            for group in GROUPS
        }

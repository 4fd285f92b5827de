"""The drafter contract: begin a request, propose a tree, observe the verified outcome.

A drafter never sees the model. The decode loop (`recap.decode`) gives it the request's tokens, asks
it for a `DraftTree` whose root is the last committed token, runs the target over that tree, and
hands back an `Observation`: the target's top-k predictions at every position the pass computed
(pending committed tokens and every tree node, accepted or rejected). That is all a recycling
drafter learns from.

Two optional capabilities, declared here and looked up with ``isinstance``: a drafter that `Explains`
fills a proposed tree's display-only fields (the studio's "what the drafter believed"), one that
`Covers` says what its memories hold at given states (the benchmark's coverage probe). Both are
asked between `propose` and `observe`, outside the timed phases, and never change what is drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from recap.tree import DraftTree
from recap.verify import Acceptance


@dataclass(frozen=True)
class RequestInfo:
    """What a drafter may know about a new request.

    ``prompt_tokens``: the full prefilled input ids (image placeholders included).
    ``excluded_tokens``: image-placeholder / vision special ids; keys containing them are never used.
    """

    prompt_tokens: tuple[int, ...]
    excluded_tokens: frozenset[int]
    vocab_size: int
    eos_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Observation:
    """What one target pass computed, for recycling.

    ``context``: every token committed before the pass (prompt + generated, pending ones included).
    ``positions``: indices into ``context`` whose next-token predictions the pass computed, shape (P,).
    ``tree``: the verified tree (empty after prefill); its node ``j`` continues ``context`` by
    ``tree.path(j)``.
    ``topk_ids`` / ``topk_probs``: shape (P + N, k) — rows for ``positions`` first, then the N nodes;
    probabilities are softmax values, sorted descending. ``None`` when the drafter asked for k = 0.
    ``acceptance``: what was accepted (None for the prefill pass).
    ``commit_probs``: shape (P + N, k), when sampling: the probability that the target *commits*
    each of ``topk_ids`` at each row (its processed distribution: temperature, top-k, top-p), which is
    a drafted child's chance of acceptance there. ``None`` when greedy (the argmax is committed).
    """

    context: Sequence[int]
    positions: np.ndarray
    tree: DraftTree = field(default_factory=DraftTree)
    topk_ids: np.ndarray | None = None
    topk_probs: np.ndarray | None = None
    acceptance: Acceptance | None = None
    commit_probs: np.ndarray | None = None


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft trees and learns from verification. ``record_k``: top-k it wants observed (0 = none)."""

    name: str
    record_k: int

    def begin(self, request: RequestInfo) -> None:
        """Start a new request (request-local state is reset here; persistent state is kept)."""

    def propose(self, context: Sequence[int]) -> DraftTree:
        """A tree under ``context[-1]`` (the last committed token, whose logits are not computed yet)."""

    def observe(self, observation: Observation) -> None:
        """Learn from a verification (or prefill) pass."""


@runtime_checkable
class Explains(Protocol):
    """A drafter that can explain its last proposed tree (display only)."""

    def explain(self, tree: DraftTree) -> None:
        """Fill ``tree``'s display-only fields (``root_candidates``, node ``contributions``,
        ``this_request``, ``fans``); called after `propose` and before `observe`."""


@runtime_checkable
class Covers(Protocol):
    """A drafter that can say whether its memories hold a token at a state (a diagnostic)."""

    def coverage(self, tails: np.ndarray, tokens: np.ndarray) -> list[tuple[tuple[str, ...], bool]]:
        """For each state (``tails[i]``: its last three tokens, -1 before the start): the memories
        holding ``tokens[i]`` there, and whether a record of this request does; called after `propose`
        and before `observe`."""

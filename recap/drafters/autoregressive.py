"""The autoregressive baseline: never drafts, so every target pass commits exactly one token."""

from __future__ import annotations

from collections.abc import Sequence

from recap.drafters.base import Observation, RequestInfo
from recap.tree import DraftTree


class AutoregressiveDrafter:
    """Always proposes the empty tree; the decode loop then is plain greedy decoding."""

    name = "ar"
    record_k = 0

    def begin(self, request: RequestInfo) -> None:
        del request

    def propose(self, context: Sequence[int]) -> DraftTree:
        del context
        return DraftTree()

    def observe(self, observation: Observation) -> None:
        del observation

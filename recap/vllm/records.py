"""What vLLM's model runner hands RECAP's proposer each step: `Pass` (a request's verified pass) and
`Row` (a request at drafting time), and `Recorder`, what a proposer does with them.

`recap.vllm.internals` builds these from the runner's batch and logits; `recap.vllm.proposer` reads
them. Neither imports the other's side through here, and nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

#: Top-k of the target's prediction recorded at every verified position (RECAP's record width).
RECORD_K = 8


@dataclass(frozen=True)
class Pass:
    """One request's part of a verification pass: the ``drafts`` it verified (in order: a chain) and
    the target's top-k at the pending token and after each draft, ``(len(drafts) + 1, k)``, best first."""

    req_id: str
    drafts: tuple[int, ...]
    topk_ids: np.ndarray
    topk_probs: np.ndarray


@dataclass(frozen=True)
class Row:
    """One request at drafting time: its committed tokens (``context``, the prompt's first), what this
    step committed (``sampled``; empty for a prefill that is not finished), its prompt length and how
    many drafts it may take (``room``: vLLM's k, less near the model's length limit)."""

    req_id: str
    context: np.ndarray
    sampled: Sequence[int]
    prompt_length: int
    room: int


@runtime_checkable
class Recorder(Protocol):
    """A proposer the runner hooks serve: it hears when each engine step starts and how many tokens it
    computes, records verified passes, drafts for rows, and forgets finished requests
    (`recap.vllm.proposer.RecapProposer`)."""

    k: int
    max_model_len: int
    vocab_size: int

    def step(self, tokens: int) -> None: ...

    def record(self, passes: Iterable[Pass]) -> None: ...

    def draft(self, rows: Sequence[Row]) -> list[list[int]]: ...

    def finish(self, req_ids: Iterable[str]) -> None: ...

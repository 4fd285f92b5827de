"""`StreamMemory`: everything one RECAP stream keeps across its requests, in one owner.

A *stream* is the requests that share what RECAP learns (a `recap.state.DrafterState` keeps one per
method and k: the CLI's, a studio session's, a benchmark stream's; the vLLM proposer keeps one for all
its requests). It keeps:

- ``tokens``: ``P1``, the 1-token memory (`recap.memory.persistent.PersistentMemory`), the only part
  saved to and loaded from files;
- ``context2`` / ``context3``: the contextual memories kept across requests (``context_scope="stream"``;
  `recap.drafters.recap.context.ContextMemory`, bounded);
- ``backoff``: the most often committed tokens (`recap.drafters.recap.backoff.BackoffRecord`);
- ``continuations``: the contexts earlier answers continued in different ways, where the search fans
  (`recap.drafters.recap.continuations.Continuations`);
- ``acceptance``: what the stream's drafters learnt about their candidates' acceptance
  (`recap.drafters.recap.estimates.AcceptanceModel`, made on first use);
- ``suffix_history`` / ``suffix_request``: the earlier requests' tokens the suffix match also searches
  (``suffix_scope="stream"``) and the request in progress (its `recap.drafters.recap.mirror.RequestMirror`),
  which the next request appends. Requests run at once on one stream may each miss the other's
  tokens: only what is drafted changes.

Only ``tokens`` is saved. Drafters given a bare 1-token memory share the stream it belongs to
(`StreamMemory.of`), so that whoever shares a memory shares what was learnt about it.

Example::

    stream = StreamMemory(PersistentMemory(vocab_size=100, k=2))
    StreamMemory.of(stream.tokens) is stream     # True
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from recap.drafters.recap.backoff import BackoffRecord
from recap.drafters.recap.context import ContextMemory
from recap.drafters.recap.continuations import Continuations
from recap.drafters.recap.estimates import AcceptanceModel
from recap.memory.guarded import Guarded
from recap.memory.persistent import PersistentMemory

#: Records a stream-scope contextual memory keeps (the oldest keys are dropped beyond it).
STREAM_CONTEXT_CAPACITY = 1 << 17

_OWNING = threading.RLock()  # (two drafters given one bare memory at once get one stream)


class StreamMemory(Guarded):
    """What one RECAP stream keeps (see the module docstring); ``tokens`` is its 1-token memory."""

    def __init__(self, tokens: PersistentMemory) -> None:
        self.tokens = tokens
        self.context2 = ContextMemory(2, capacity=STREAM_CONTEXT_CAPACITY)
        self.context3 = ContextMemory(3, capacity=STREAM_CONTEXT_CAPACITY)
        self.backoff = BackoffRecord(tokens.vocab_size, tokens.k)
        self.continuations = Continuations()
        self.suffix_history = np.zeros(0, dtype=np.int64)
        self.suffix_request: Any = None
        self._acceptance: AcceptanceModel | None = None  # `acceptance`, made on first use (~2 MB)
        self._lock = threading.Lock()
        tokens.owner = self

    @classmethod
    def of(cls, tokens: PersistentMemory) -> StreamMemory:
        """The stream that holds ``tokens`` (its ``owner``), else a new one."""
        with _OWNING:
            stream = tokens.owner
            if isinstance(stream, cls) and stream.tokens is tokens:
                return stream
            return cls(tokens)

    @property
    def acceptance(self) -> AcceptanceModel:
        """What the stream's drafters learnt about their candidates' acceptance (not saved); made on
        first use, so a stream only read stays small."""
        if self._acceptance is None:
            with self._lock:
                if self._acceptance is None:
                    self._acceptance = AcceptanceModel()
        return self._acceptance

    def __len__(self) -> int:
        """Tokens with a record in the 1-token memory."""
        return len(self.tokens)

    def reset(self) -> None:
        """Forget everything: the 1-token records and what the stream learnt besides."""
        self.tokens.reset()
        self.context2.clear()
        self.context3.clear()
        if self._acceptance is not None:
            self._acceptance.reset()
        self.backoff.reset()
        self.continuations.reset()
        self.suffix_history, self.suffix_request = np.zeros(0, dtype=np.int64), None

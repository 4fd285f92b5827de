"""The back-off record: what RECAP drafts at a context no memory has a record for.

A context whose last token has never been computed (a word piece the stream has not seen) has no
``P1`` record, so neither ``C2`` nor ``C3`` has one either, and without a fallback the drafter proposes
nothing there: the pass verifies no tree and commits one token. The back-off record is the n-gram
back-off's last level, the memory keyed by *no* token: the ``k`` tokens the stream committed most
often, each with its share of every committed token (its unigram probability). The tree search
offers them at such contexts only (`recap.drafters.growth_kernel`), as candidates of their own
acceptance kind, so the acceptance estimates learn how often they are right; the fused distribution
of the memories is unchanged (an unknown context still fuses to nothing).

Example::

    record = BackoffRecord(vocab_size=10, k=2)
    record.count([3, 5, 3, 3])
    record.record()    # (array([3, 5]), array([0.75, 0.25], dtype=float32))
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np


class BackoffRecord:
    """The stream's ``k`` most often committed tokens and their unigram probabilities (thread-safe).

    Counts only grow, so the top ``k`` is kept exactly by letting a counted token replace the last of
    them when it overtakes it.
    """

    def __init__(self, vocab_size: int, k: int = 8) -> None:
        self.vocab_size, self.k = int(vocab_size), int(k)
        self._counts = np.zeros(self.vocab_size, dtype=np.int64)
        self._top = np.full(self.k, -1, dtype=np.int64)  # best first; -1: not filled yet
        self._total = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Tokens counted so far."""
        return self._total

    def count(self, tokens: Iterable[int]) -> None:
        """Count committed ``tokens`` (ids outside the vocabulary are ignored)."""
        with self._lock:
            counts, top = self._counts, self._top
            for token in tokens:
                token = int(token)
                if not 0 <= token < self.vocab_size:
                    continue
                counts[token] += 1
                self._total += 1
                place = np.flatnonzero(top == token)
                if len(place):
                    at = int(place[0])
                elif top[-1] < 0 or counts[token] > counts[top[-1]]:
                    at = self.k - 1
                    top[at] = token
                else:
                    continue
                while at > 0 and (top[at - 1] < 0 or counts[top[at - 1]] < counts[token]):
                    top[at - 1], top[at] = token, top[at - 1]
                    at -= 1

    def record(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(ids, probs)``: the top ``k`` tokens best first (-1 where fewer were seen) and their shares
        of all counted tokens (float32); None before anything was counted. Copies."""
        with self._lock:
            if self._total == 0:
                return None
            ids = self._top.copy()
            probs = np.where(ids >= 0, self._counts[np.maximum(ids, 0)] / self._total, 0.0)
        return ids, probs.astype(np.float32)

    def reset(self) -> None:
        with self._lock:
            self._counts.fill(0)
            self._top.fill(-1)
            self._total = 0

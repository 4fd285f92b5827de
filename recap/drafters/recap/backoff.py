"""The back-off record: what RECAP drafts at a context no memory has a record for.

A context whose last token has never been computed (a word piece the stream has not seen) has no
``P1`` record, so neither ``C2`` nor ``C3`` has one either, and without a fallback the drafter proposes
nothing there: the pass verifies no tree and commits one token. The back-off record is the n-gram
back-off's last level, the memory keyed by *no* token: the ``k`` tokens the stream committed most
often, each with its share of every committed token (its unigram probability). The tree search
offers them at such contexts only (`recap.drafters.recap.kernel`), as candidates of their own
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

import numba
import numpy as np

from recap.memory.guarded import Guarded


class BackoffRecord(Guarded):
    """The stream's ``k`` most often committed tokens and their unigram probabilities (thread-safe).

    Counts only grow, so the top ``k`` is kept exactly by letting a counted token replace the last of
    them when it overtakes it. Counting runs compiled (`_count`, a few microseconds a pass: it runs
    after every decoding pass), and the probabilities the search reads are kept up to date with it.
    """

    def __init__(self, vocab_size: int, k: int = 8) -> None:
        self.vocab_size, self.k = int(vocab_size), int(k)
        self._counts = np.zeros(self.vocab_size, dtype=np.int64)
        self._top = np.full(self.k, -1, dtype=np.int64)  # best first; -1: not filled yet
        self._probs = np.zeros(self.k, dtype=np.float32)  # the top tokens' shares of all counted
        self._total = np.zeros(1, dtype=np.int64)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Tokens counted so far."""
        return int(self._total[0])

    def count(self, tokens: Iterable[int]) -> None:
        """Count committed ``tokens`` (ids outside the vocabulary are ignored)."""
        tokens = np.fromiter(tokens, dtype=np.int64) if not isinstance(tokens, np.ndarray) else tokens
        with self._lock:
            _count(self._counts, self._top, self._probs, self._total, tokens.astype(np.int64, copy=False))

    def record(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(ids, probs)``: the top ``k`` tokens best first (-1 where fewer were seen) and their shares
        of all counted tokens (float32); None before anything was counted. Copies, taken under the
        lock (mid-count, the top list can hold a token twice while it moves up)."""
        with self._lock:
            return (self._top.copy(), self._probs.copy()) if self._total[0] else None

    def reset(self) -> None:
        with self._lock:
            self._counts.fill(0)
            self._top.fill(-1)
            self._probs.fill(0)
            self._total[0] = 0


@numba.njit(cache=True, nogil=True)
def _count(counts, top, probs, total, tokens):
    """`BackoffRecord.count`'s work: count ``tokens``, keep ``top`` (best first) and ``probs``."""
    vocab, k = len(counts), len(top)
    for i in range(len(tokens)):
        token = tokens[i]
        if token < 0 or token >= vocab:
            continue
        counts[token] += 1
        total[0] += 1
        at = -1
        for j in range(k):
            if top[j] == token:
                at = j
                break
        if at < 0:
            if top[k - 1] < 0 or counts[token] > counts[top[k - 1]]:
                at = k - 1
                top[at] = token
            else:
                continue
        while at > 0 and (top[at - 1] < 0 or counts[top[at - 1]] < counts[token]):
            top[at - 1], top[at] = token, top[at - 1]
            at -= 1
    for j in range(k):
        probs[j] = np.float32(counts[top[j]] / total[0]) if top[j] >= 0 else np.float32(0.0)

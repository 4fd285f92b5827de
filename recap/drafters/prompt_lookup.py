"""Prompt lookup decoding (PLD) and the n-gram suffix index it shares with RECAP's suffix drafts.

PLD proposes a single chain: it finds the last ``n`` committed tokens (``n = max_ngram`` down to 1)
earlier in the request's tokens and proposes the ``num_tokens`` tokens that followed their most recent
earlier occurrence. Keys and continuations never contain image placeholders (``excluded`` tokens).

`find_continuation` is the reference algorithm (pure, O(length x n)); `NgramIndex` gives the same
answers incrementally in O(new tokens x n) per step, which is what the drafters use.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from recap.drafters.base import Observation, RequestInfo
from recap.tree import DraftTree


def find_continuation(
    tokens: Sequence[int], min_n: int, max_n: int, num_tokens: int, excluded: Collection[int] = ()
) -> list[int]:
    """Continuation of the longest suffix of ``tokens`` (``max_n`` down to ``min_n`` tokens) seen before.

    The suffix must match an earlier occurrence (one that ends before the last position); the most
    recent such occurrence wins; up to ``num_tokens`` following tokens are returned, cut before the
    first excluded token. Suffixes containing an excluded token are not searched.

    Example::

        tokens = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
        find_continuation(tokens, 1, 3, 2)    # [7, 1]: "1 2 3" last seen before ending at index 6
        find_continuation([4, 5, 6], 1, 3, 2) # []: no suffix occurred before
    """
    excluded = set(excluded)
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = list(tokens[length - n :])
        if excluded.intersection(suffix):
            continue
        for end in range(length - 2, n - 2, -1):
            if list(tokens[end - n + 1 : end + 1]) == suffix:
                return _cut(tokens[end + 1 : end + 1 + num_tokens], excluded)
    return []


def _cut(tokens: Sequence[int], excluded: Collection[int]) -> list[int]:
    """``tokens`` up to (not including) the first excluded one."""
    out = []
    for token in tokens:
        if token in excluded:
            break
        out.append(int(token))
    return out


class NgramIndex:
    """Most recent end position of every n-gram (``min_n <= n <= max_n``) of a growing token sequence.

    `continuation(tokens, num)` equals ``find_continuation(tokens, min_n, max_n, num, excluded)`` as long
    as successive calls see the same sequence growing at its end (a shorter one re-indexes it).
    """

    def __init__(self, min_n: int, max_n: int, excluded: Collection[int] = ()) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.reset(excluded)

    def reset(self, excluded: Collection[int] | None = None) -> None:
        """Forget the indexed sequence (a new request), optionally with new excluded tokens."""
        if excluded is not None:
            self.excluded = frozenset(int(t) for t in excluded)
        self._tokens: list[int] = []
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_n, self.max_n + 1)}
        self._indexed = 0  # n-grams ending before this position are in `_ends`
        self._last_excluded = -1  # position of the latest excluded token among those indexed

    def _sync(self, tokens: Sequence[int]) -> None:
        """Mirror ``tokens`` and index every n-gram ending before its last position."""
        if len(tokens) < len(self._tokens):
            self.reset()
        if len(tokens) > len(self._tokens):
            self._tokens.extend(int(t) for t in tokens[len(self._tokens) :])
        mirror, excluded = self._tokens, self.excluded
        for end in range(self._indexed, len(mirror) - 1):
            if mirror[end] in excluded:
                self._last_excluded = end
                continue
            for n, ends in self._ends.items():
                start = end - n + 1
                if start <= self._last_excluded:
                    break  # longer n-grams reach the excluded token too
                ends[tuple(mirror[start : end + 1])] = end
        self._indexed = max(self._indexed, len(mirror) - 1)

    def match(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """``(n, end)`` of the longest suffix of ``tokens`` seen earlier (most recent), or None."""
        self._sync(tokens)
        mirror, length = self._tokens, len(self._tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = tuple(mirror[length - n :])
            if self.excluded.intersection(suffix):
                continue
            end = self._ends[n].get(suffix)
            if end is not None:
                return n, end
        return None

    def continuation(self, tokens: Sequence[int], num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` tokens that followed the longest earlier match of the suffix."""
        found = self.match(tokens)
        if found is None:
            return []
        end = found[1]
        return _cut(self._tokens[end + 1 : end + 1 + num_tokens], self.excluded)


class PromptLookupDrafter:
    """PLD: a single chain copied from the request's own tokens; learns nothing from the target."""

    record_k = 0

    def __init__(self, max_ngram: int = 3, num_tokens: int = 10, name: str = "pld") -> None:
        if max_ngram < 1 or num_tokens < 1:
            raise ValueError(f"need max_ngram >= 1 and num_tokens >= 1, got {max_ngram}, {num_tokens}")
        self.name = name
        self.num_tokens = num_tokens
        self._index = NgramIndex(1, max_ngram)

    def begin(self, request: RequestInfo) -> None:
        self._index.reset(request.excluded_tokens)

    def propose(self, context: Sequence[int]) -> DraftTree:
        tree = DraftTree()
        chain = self._index.continuation(context, self.num_tokens)
        tree.add_chain(chain, sources=("lookup",), score=1.0)
        return tree

    def observe(self, observation: Observation) -> None:
        del observation  # the index follows the committed context given to `propose`

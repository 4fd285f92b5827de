"""What RECAP's compiled search reads of the text: the request's tokens, after the stream's earlier ones.

`RequestMirror` keeps a request's context in an int64 array that grows at its end (a decode loop's
context only grows, so each pass copies what is new), so that the search (`recap.drafters.recap.kernel`)
reads the root's last three tokens and runs the suffix match without converting the context each pass.
With ``suffix_scope="stream"`` the stream's earlier requests come first (their last
`STREAM_SUFFIX_TOKENS` tokens, each closed by a separator, -1, which no key and no match crosses: the
search reads it as "before the sequence start"), so the suffix match also continues what earlier
answers said, as SuffixDecoding's global tree does. They are kept by the stream
(`recap.drafters.recap.stream.StreamMemory.suffix_history`), so the drafters that share it (a studio
session's, one per request) share them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from recap.drafters.recap.stream import StreamMemory

#: Earlier requests' tokens the suffix match also searches with ``suffix_scope="stream"`` (the latest).
STREAM_SUFFIX_TOKENS = 4096


class RequestMirror:
    """``tokens[:offset]``: the stream's earlier tokens; ``tokens[offset : offset + length]``: this
    request's."""

    def __init__(self) -> None:
        self.tokens, self.offset, self.length = np.zeros(1024, dtype=np.int64), 0, 0

    def start(self, stream_memory: StreamMemory | None, stream: bool, register: bool = True) -> None:
        """A new request: the earlier requests' tokens first when ``stream`` (the previous request's, as
        its drafter mirrored it, are appended to the memory's history here). ``register``: name this
        request as the one in progress, which the next `start` closes; otherwise whoever runs it calls
        `close` when it ends."""
        history = np.zeros(0, dtype=np.int64)
        if stream and stream_memory is not None:
            last = stream_memory.suffix_request
            if last is not None:  # the previous request's mirror, as it was left
                last.close(stream_memory)
            history = stream_memory.suffix_history
        self.offset = len(history)
        self.tokens = np.zeros(self.offset + 1024, dtype=np.int64)
        self.tokens[: self.offset] = history
        self.length = 0
        if stream and stream_memory is not None and register:
            stream_memory.suffix_request = self  # the next request's mirror appends what this one holds

    def request(self) -> np.ndarray:
        """This request's tokens (a view)."""
        return self.tokens[self.offset : self.offset + self.length]

    def close(self, stream: StreamMemory) -> None:
        """Append this request's tokens to the stream's history (``stream.suffix_history``, closed by a
        separator, the latest `STREAM_SUFFIX_TOKENS` kept); the stream no longer names it as the request
        in progress."""
        history = np.concatenate([stream.suffix_history, self.request(), [-1]])
        stream.suffix_history = history[-STREAM_SUFFIX_TOKENS:].astype(np.int64)
        if stream.suffix_request is self:
            stream.suffix_request = None

    def update(self, context: Sequence[int]) -> int:
        """Copy what is new in ``context`` and return the length the search reads (``offset`` + the
        context's): a request's context grows at its end (as `recap.drafters.prompt_lookup.NgramIndex`
        assumes), a shorter one is copied anew, and the last three tokens (the root's context) are copied
        every time."""
        length, offset = len(context), self.offset
        known = min(self.length if length >= self.length else 0, max(length - 3, 0))
        if length > known:
            if offset + length > len(self.tokens):
                grown = np.zeros(max(offset + length, 2 * len(self.tokens)), dtype=np.int64)
                grown[: offset + known] = self.tokens[: offset + known]
                self.tokens = grown
            self.tokens[offset + known : offset + length] = context[known:length]
        self.length = length
        return offset + length

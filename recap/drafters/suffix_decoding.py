"""SuffixDecoding as a peer baseline, run from its authors' own implementation.

SuffixDecoding (Oliaro et al., NeurIPS 2025) drafts from suffix trees: one per request over its prompt
and its output so far, and one global tree over every earlier response. Both trees count how often
each continuation followed, so a draft carries frequency-estimated probabilities; the better-scoring
tree's draft is a token tree (best-first over those probabilities). Its authors ship the trees as a
C++ extension in the ``arctic-inference`` package (`arctic_inference.suffix_decoding`): this module
calls their `SuffixDecodingCache` and does not reimplement it. It needs no model and no torch.

How one request maps onto their API (`SuffixDecodingDrafter`):

- `begin`: ``start_request(id, prompt)`` (image placeholder / vision special ids left out; a request the
  same drafter left open, e.g. a cancelled stream, is stopped first);
- `propose`: every newly committed token goes in with ``add_active_response``, then
  ``speculate(id, context, max_spec_tokens=..., use_tree_spec=True, ...)``; the draft's ``token_ids``,
  ``parents`` and ``probs`` become the `DraftTree` as they are (node ``i`` = draft token ``i``, source
  `SOURCE`), so our verifier checks it like any other tree and the output stays lossless;
- `observe`: the tokens a pass committed go in at once (so the last pass's tokens reach the global
  tree too); at an EOS the request is stopped. A request ended by the length limit (the drafter does
  not see it) is stopped at the drafter's next `begin` or when the drafter is garbage-collected.

Responses stay in the global tree across requests (FIFO eviction after ``max_cached_requests``).
`SuffixTreeCache` holds one `SuffixDecodingCache` behind a lock; `recap.runtime.Runtime` keeps one per
model, as it keeps Token Recycling's matrix.

Without the package, `SuffixTreeCache` raises a ``ValueError`` naming `INSTALL_COMMAND`.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import itertools
import threading
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from recap.drafters.base import Observation, RequestInfo
from recap.tree import ROOT, DraftTree, FusedCandidate

#: The source name every SuffixDecoding node carries (in step records, the studio and the benchmark).
SOURCE = "suffix tree"
#: The authors' package and the version this project was built and tested against.
PACKAGE = "arctic-inference"
PACKAGE_VERSION = "0.3.0"
#: Installs it (from the repository root): the registry has only its source archive, which must be
#: built against this Python (see the script and requirements-suffix.txt).
INSTALL_COMMAND = "bash scripts/install_suffix.sh"
_MODULE = "arctic_inference.suffix_decoding"


@dataclass(frozen=True)
class SuffixConfig:
    """SuffixDecoding's settings; the defaults are those of its authors' vLLM integration
    (``ArcticSpeculativeConfig`` in arctic-inference 0.3.0).

    - ``max_spec_tokens``: most draft tokens (tree nodes) per pass (vLLM: 16 when unset);
    - ``max_spec_factor``, ``max_spec_offset``: a draft drawn from a context match of ``m`` tokens holds
      at most ``max_spec_factor * m + max_spec_offset`` tokens;
    - ``min_token_prob``: a node is drafted only if its estimated path probability reaches this;
    - ``max_tree_depth``: depth of the suffix trees, also the longest context matched (vLLM: 64);
    - ``max_cached_requests``: responses kept in the global tree, oldest evicted first (vLLM: 100000).
    """

    max_spec_tokens: int = 16
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_tree_depth: int = 64
    max_cached_requests: int = 100_000

    def __post_init__(self) -> None:
        if isinstance(self.max_spec_tokens, bool) or not isinstance(self.max_spec_tokens, int):
            raise ValueError(f"max_spec_tokens must be a whole number, got {self.max_spec_tokens!r}")
        if not 1 <= self.max_spec_tokens <= 256:
            raise ValueError(f"max_spec_tokens must be from 1 to 256, got {self.max_spec_tokens}")
        if not 0.0 <= self.max_spec_factor <= 64.0:
            raise ValueError(f"max_spec_factor must be from 0 to 64, got {self.max_spec_factor}")
        if not -256.0 <= self.max_spec_offset <= 256.0:
            raise ValueError(f"max_spec_offset must be from -256 to 256, got {self.max_spec_offset}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be from 0 to 1, got {self.min_token_prob}")
        if not 1 <= self.max_tree_depth <= 4096:
            raise ValueError(f"max_tree_depth must be from 1 to 4096, got {self.max_tree_depth}")
        if self.max_cached_requests == 0 or not -1 <= self.max_cached_requests <= 2**31 - 1:
            raise ValueError(
                "max_cached_requests must be -1 (unlimited) or from 1 to 2^31-1, "
                f"got {self.max_cached_requests}"
            )


def suffix_decoding_available() -> bool:
    """Whether the authors' package is installed (checked without importing it)."""
    try:
        return importlib.util.find_spec(_MODULE) is not None
    except ModuleNotFoundError:  # the parent package `arctic_inference` is missing
        return False


def _authors_cache_class() -> Any:
    """``arctic_inference.suffix_decoding.SuffixDecodingCache``, or a ValueError saying how to install it."""
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as error:
        raise ValueError(
            f"the suffix method runs SuffixDecoding from its authors' package {PACKAGE} "
            f"({PACKAGE_VERSION}), which is not installed ({error.msg}): run `{INSTALL_COMMAND}` "
            "from the repository root"
        ) from None
    return module.SuffixDecodingCache


class SuffixTreeCache:
    """The authors' `SuffixDecodingCache` (global tree + one tree per active request), thread-safe.

    Requests get process-unique integer ids, so any number of drafters may share one cache. Methods on
    a request that is not active (stopped, or dropped by `reset`) do nothing: `speculate` then returns
    None, `stop` is idempotent.

    The authors' trees cannot be copied. A cache made with ``replayable=True`` keeps the calls that
    changed it (the prompts and answers it learnt), and `copy.deepcopy` builds a new cache by making them
    again: the same trees, since the authors' cache is deterministic. The Compare tab warms its private
    caches this way, once for all clicks with the same settings (a shared cache keeps no log: it would
    grow with every request).
    """

    _ids = itertools.count()

    def __init__(
        self, max_tree_depth: int = 64, max_cached_requests: int = 100_000, replayable: bool = False
    ) -> None:
        SuffixConfig(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)  # validate
        self._cache_class = _authors_cache_class()
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        # Re-entrant: a garbage-collected drafter's finalizer may stop its request from inside a call.
        self._lock = threading.RLock()
        self._cache = self._cache_class(max_tree_depth, max_cached_requests)
        #: With ``replayable``: (call, request, tokens) of every change, in order (`__deepcopy__`).
        self._log: list[tuple[str, int, tuple[int, ...]]] | None = [] if replayable else None

    @classmethod
    def for_config(cls, config: SuffixConfig, replayable: bool = False) -> SuffixTreeCache:
        return cls(config.max_tree_depth, config.max_cached_requests, replayable)

    def __deepcopy__(self, memo: dict) -> SuffixTreeCache:
        if self._log is None:
            raise TypeError(
                "this SuffixDecoding cache keeps no log of what it learnt, so it cannot be copied "
                "(SuffixTreeCache(replayable=True) can)"
            )
        twin = SuffixTreeCache(self.max_tree_depth, self.max_cached_requests, replayable=True)
        with self._lock:
            log = list(self._log)
        for call, request, tokens in log:  # the same calls with the same request ids
            twin._apply(call, request, tokens)
        memo[id(self)] = twin
        return twin

    def _apply(self, call: str, request: int, tokens: tuple[int, ...]) -> None:
        with self._lock:
            if call == "start":
                self._cache.start_request(request, list(tokens))
            elif request not in self._cache.active_requests:
                return
            elif call == "extend":
                self._cache.add_active_response(request, list(tokens))
            else:
                self._cache.stop_request(request)
            if self._log is not None:
                self._log.append((call, request, tokens))

    def start(self, prompt: Sequence[int]) -> int:
        """Start a request over ``prompt`` (its local tree) and return its id."""
        request = next(self._ids)
        self._apply("start", request, tuple(int(t) for t in prompt))
        return request

    def extend(self, request: int, tokens: Sequence[int]) -> None:
        """Append committed tokens to the request's response (its local tree and the global tree)."""
        if tokens:
            self._apply("extend", request, tuple(int(t) for t in tokens))

    def speculate(self, request: int | None, context: Sequence[int], config: SuffixConfig) -> Any | None:
        """The authors' tree draft (``token_ids``, ``parents``, ``probs``) continuing ``context``, or None
        when ``request`` is not active."""
        context = [int(t) for t in context[-self.max_tree_depth :]]
        with self._lock:
            if request is None or request not in self._cache.active_requests:
                return None
            return self._cache.speculate(
                request,
                context,
                max_spec_tokens=config.max_spec_tokens,
                max_spec_factor=config.max_spec_factor,
                max_spec_offset=config.max_spec_offset,
                min_token_prob=config.min_token_prob,
                use_tree_spec=True,
            )

    def stop(self, request: int) -> None:
        """End a request: its local tree is dropped, its response stays in the global tree."""
        self._apply("stop", request, ())

    def reset(self) -> None:
        """Forget everything (global tree and requests in flight, whose drafts then stay empty)."""
        with self._lock:
            self._cache = self._cache_class(self.max_tree_depth, self.max_cached_requests)
            if self._log is not None:
                self._log.clear()

    @property
    def active_requests(self) -> int:
        with self._lock:
            return len(self._cache.active_requests)

    @property
    def cached_requests(self) -> int:
        """Responses held by the global tree."""
        with self._lock:
            return len(self._cache.cached_requests)


def draft_tree(
    token_ids: Sequence[int],
    parents: Sequence[int],
    probs: Sequence[float],
    vocab_size: int,
    excluded: Collection[int] = (),
) -> DraftTree:
    """A SuffixDecoding draft as a `DraftTree`: node ``i`` holds ``token_ids[i]`` under ``parents[i]``
    (-1 = the root) with score ``probs[i]`` and source `SOURCE`.

    A valid draft (parents before children, distinct siblings, every token a vocabulary id) maps one to
    one. A token outside ``[0, vocab_size)`` or in ``excluded`` is dropped with its subtree; so is a node
    whose parent comes after it. The root candidates are the depth-1 nodes with their probabilities.

    Example: ``draft_tree([4, 6, 5], [-1, -1, 0], [0.5, 0.5, 0.5], 10)`` is ``root -> [4 -> [5], 6]``.
    """
    tree = DraftTree()
    excluded = frozenset(excluded)
    placed: list[int | None] = []  # draft index -> node id (None: dropped)
    for index, (token, parent, prob) in enumerate(zip(token_ids, parents, probs)):
        token, parent = int(token), int(parent)
        anchor = ROOT if parent == ROOT else (placed[parent] if 0 <= parent < index else None)
        if anchor is None or not 0 <= token < vocab_size or token in excluded:
            placed.append(None)
            continue
        placed.append(tree.add(token, anchor, score=float(prob), sources=(SOURCE,)))
    tree.root_candidates = [
        FusedCandidate(tree.tokens[n], tree.scores[n], {SOURCE: tree.scores[n]}) for n in tree.children(ROOT)
    ]
    return tree


class _OpenRequest:
    """The request a drafter has open in a shared cache; `close` stops it (also run by a finalizer)."""

    def __init__(self, cache: SuffixTreeCache) -> None:
        self.cache = cache
        self.id: int | None = None

    def close(self) -> None:
        if self.id is not None:
            self.cache.stop(self.id)
            self.id = None


class SuffixDecodingDrafter:
    """SuffixDecoding through its authors' cache. Source: ``suffix tree``; learns from committed
    tokens only (``record_k = 0``).

    ``cache``: a shared `SuffixTreeCache` (`recap.runtime.Runtime` keeps one per model), else the
    drafter's own, built from ``config``.
    """

    record_k = 0

    def __init__(
        self, cache: SuffixTreeCache | None = None, config: SuffixConfig | None = None, name: str = "suffix"
    ) -> None:
        self.name = name
        self.config = config or SuffixConfig()
        self.cache = cache if cache is not None else SuffixTreeCache.for_config(self.config)
        self._open = _OpenRequest(self.cache)
        # A drafter dropped mid-request (a cancelled stream) must not leave its request open.
        weakref.finalize(self, self._open.close)
        self._begun = False
        self._vocab_size = 0
        self._excluded: frozenset[int] = frozenset()
        self._eos: frozenset[int] = frozenset()
        self._text: list[int] = []  # the request's tokens without excluded ids, as the trees hold them
        self._seen = 0  # tokens of the request (excluded ids included) already added

    def __deepcopy__(self, memo: dict) -> SuffixDecodingDrafter:
        """A drafter over a copy of its cache (`SuffixTreeCache.__deepcopy__`: only a replayable one),
        with the same open request and its own finalizer."""
        twin = object.__new__(type(self))
        memo[id(self)] = twin
        twin.__dict__.update(copy.deepcopy(self.__dict__, memo))
        weakref.finalize(twin, twin._open.close)
        return twin

    def begin(self, request: RequestInfo) -> None:
        self._open.close()
        self._vocab_size = request.vocab_size
        self._excluded = frozenset(request.excluded_tokens)
        self._eos = frozenset(request.eos_ids)
        self._text = [t for t in request.prompt_tokens if t not in self._excluded]
        self._seen = len(request.prompt_tokens)
        self._open.id = self.cache.start(self._text)
        self._begun = True

    def propose(self, context: Sequence[int]) -> DraftTree:
        if not self._begun:
            raise RuntimeError("call begin() before propose()")
        self._add(context[self._seen :])
        draft = self.cache.speculate(self._open.id, self._text, self.config)
        if draft is None:  # the request was stopped (EOS, `close`) or dropped by a cache reset
            return DraftTree()
        return draft_tree(draft.token_ids, draft.parents, draft.probs, self._vocab_size, self._excluded)

    def observe(self, observation: Observation) -> None:
        if observation.acceptance is None or self._open.id is None:
            return
        committed = [*observation.context[self._seen :], *observation.acceptance.tokens]
        self._add(committed)
        if committed and committed[-1] in self._eos:
            self._open.close()

    def close(self) -> None:
        """Stop the open request now (its response stays in the global tree)."""
        self._open.close()

    @property
    def request_id(self) -> int | None:
        """The id of the open request in `cache`, or None."""
        return self._open.id

    def _add(self, tokens: Sequence[int]) -> None:
        self._seen += len(tokens)
        text = [int(t) for t in tokens if t not in self._excluded]
        if text and self._open.id is not None:
            self._text.extend(text)
            self.cache.extend(self._open.id, text)

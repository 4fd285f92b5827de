"""`DrafterState`: what one scope's drafters share across requests, in one shape.

A *scope* is whoever shares what the drafters learn: a `recap.runtime.Runtime` (the CLI, a script),
one studio session or the studio's process-wide scope, one method's stream in the benchmark. Its
state, each part created on first use:

- RECAP's stream (`recap.drafters.recap.stream.StreamMemory`: the 1-token memory, the contextual
  records, acceptance estimates, back-off record and suffix history), one per method and k, so an
  ablation never learns from another method's trees;
- Token Recycling's successor matrix (`recap.drafters.token_recycling.SuccessorMatrix`);
- SuffixDecoding's global tree (`recap.drafters.suffix_decoding.SuffixTreeCache`).

Every part starts from the scope's ``start`` (`recap.hotstart.StartingMemory`: a saved memory, or
nothing; or the records of a memory already read, e.g. the benchmark's ``--memory FILE``): the
persistent memory as a copy of the start's records, the matrix seeded with their ids. `reset` returns
every part, in place (drafters already built keep working), to that start or to empty.

`build_drafter(method, state, config)` is the one place a drafter is built from a scope: the parts
``method`` declares (`recap.drafters.shared_state`), nothing else. `DrafterState.given` is a scope made of
parts a caller already holds (a tool's memory file, a test's shared memory).

Example::

    state = DrafterState(vocab_size=500)                  # a cold scope
    drafter = build_drafter("recap", state, RecapConfig(budget=8))
    state.persistent("recap", 8) is drafter.persistent    # True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from recap.drafters import Drafter, make_drafter, shared_state
from recap.drafters.recap.stream import StreamMemory
from recap.drafters.token_recycling import SuccessorMatrix, seed_successors
from recap.hotstart import EMPTY_START, Origin, StartingMemory
from recap.memory.persistent import PersistentMemory

if TYPE_CHECKING:
    from recap.drafters.recap.config import RecapConfig
    from recap.drafters.suffix_decoding import SuffixConfig, SuffixTreeCache
    from recap.models.cost import CostModel


class DrafterState:
    """One scope's shared drafting state (see the module docstring); thread-safe.

    ``cleared``: the scope was emptied on purpose (the studio's "Reset: empty"), so that an empty memory
    is not reported as a start that failed to load.
    """

    def __init__(
        self,
        vocab_size: int,
        start: StartingMemory | PersistentMemory = EMPTY_START,
        suffix_config: SuffixConfig | None = None,
        cleared: bool = False,
    ) -> None:
        if vocab_size < 1:
            raise ValueError(f"DrafterState needs vocab_size >= 1, got {vocab_size}")
        records = start if isinstance(start, PersistentMemory) else None
        if records is not None:
            start = StartingMemory("file", tokens=len(records), k=records.k)
        self.vocab_size, self.start, self.cleared = int(vocab_size), start, cleared
        #: Why this scope started over, for whoever shows its memory (the studio: a session dropped
        #: while idle to keep the server within its memory budget); "" when it did not.
        self.note = ""
        self.suffix_config = suffix_config
        self._memories: dict[tuple[str, int], StreamMemory] = {}
        self._origins: dict[tuple[str, int], Origin] = {}
        self._latest: dict[str, int] = {}  # method -> the k its memory was last asked for with
        self._successors: SuccessorMatrix | None = None
        self._suffix_cache: SuffixTreeCache | None = None
        self._start_records = records  # the start's records (read once, when first needed)
        self._given: StreamMemory | None = None  # (`given`: the stream every RECAP method drafts on)
        self._lock = threading.RLock()

    @classmethod
    def given(
        cls,
        vocab_size: int,
        persistent: StreamMemory | PersistentMemory | None = None,
        successors: SuccessorMatrix | None = None,
        suffix_cache: SuffixTreeCache | None = None,
        suffix_config: SuffixConfig | None = None,
    ) -> DrafterState:
        """A scope of parts the caller holds: ``persistent`` (a stream, or a bare 1-token memory: its
        stream) for every RECAP method, ``successors`` for TR, ``suffix_cache`` for SuffixDecoding (with
        ``suffix_config``'s per-pass settings); the parts not given are made on first use, empty."""
        state = cls(vocab_size, suffix_config=suffix_config)
        if persistent is not None:
            state._given = persistent if isinstance(persistent, StreamMemory) else StreamMemory.of(persistent)
        state._successors, state._suffix_cache = successors, suffix_cache
        return state

    # --------------------------------------------------------------------------------------- parts
    def stream(self, method: str = "recap", k: int = 8) -> StreamMemory:
        """``method``'s stream of width ``k``, its 1-token memory a copy of the start's records when it
        has k."""
        if self._given is not None:
            return self._given
        with self._lock:
            self._latest[method] = k
            stream = self._memories.get((method, k))
            if stream is None:
                stream = StreamMemory(PersistentMemory(self.vocab_size, k))
                self._fill(stream.tokens)
                self._memories[(method, k)] = stream
                self._origins[(method, k)] = self.start.origin if len(stream) else "empty"
            return stream

    def persistent(self, method: str = "recap", k: int = 8) -> PersistentMemory:
        """``method``'s 1-token memory of width ``k`` (its stream's, `stream`)."""
        return self.stream(method, k).tokens

    def peek(self, method: str = "recap", k: int = 8) -> PersistentMemory | None:
        """``method``'s 1-token memory of width ``k`` if it was created already (never creates it)."""
        with self._lock:
            stream = self._memories.get((method, k))
            return None if stream is None else stream.tokens

    def latest(self, method: str = "recap") -> tuple[StreamMemory, Origin] | None:
        """``method``'s stream last asked for (the k of its last run) and its origin; None before any."""
        with self._lock:
            k = self._latest.get(method)
            return None if k is None else (self._memories[(method, k)], self._origins[(method, k)])

    def memories(self) -> dict[tuple[str, int], StreamMemory]:
        """The streams created so far, by ``(method, k)``."""
        with self._lock:
            return dict(self._memories)

    def origin(self, method: str = "recap", k: int = 8) -> Origin:
        """Where ``method``'s memory of width ``k`` started: the start's origin, or ``"empty"``."""
        with self._lock:
            return self._origins.get((method, k), "empty")

    def replace(self, memory: PersistentMemory, method: str = "recap", origin: Origin = "file") -> None:
        """Use ``memory`` (e.g. loaded from a file) as ``method``'s 1-token memory of its width, in a
        new stream (or the one that holds it already)."""
        with self._lock:
            self._memories[(method, memory.k)] = StreamMemory.of(memory)
            self._origins[(method, memory.k)] = origin
            self._latest[method] = memory.k

    def successors(self) -> SuccessorMatrix:
        """Token Recycling's matrix (seeded with the ids of the start's records)."""
        with self._lock:
            if self._successors is None:
                self._successors = SuccessorMatrix(self.vocab_size)
                records = self._records()
                if records is not None:
                    seed_successors(self._successors, records)
            return self._successors

    def suffix_cache(self) -> SuffixTreeCache:
        """SuffixDecoding's global tree (``suffix_config``'s depth and size). Raises ValueError naming
        the install command without ``arctic-inference``."""
        from recap.drafters.suffix_decoding import SuffixConfig, SuffixTreeCache

        with self._lock:
            if self._suffix_cache is None:
                self._suffix_cache = SuffixTreeCache.for_config(self.suffix_config or SuffixConfig())
            return self._suffix_cache

    # ---------------------------------------------------------------------------------------- reset
    def reset(self, empty: bool = False) -> None:
        """Every part back to the start (``empty``: to nothing, from now on), in place."""
        with self._lock:
            if empty:
                self.start, self.cleared, self._start_records = EMPTY_START, True, None
            for key, stream in self._memories.items():
                stream.reset()
                self._fill(stream.tokens)
                self._origins[key] = self.start.origin if len(stream) else "empty"
            if self._successors is not None:
                self._successors.reset()
                records = self._records()
                if records is not None:
                    seed_successors(self._successors, records)
            if self._suffix_cache is not None:
                self._suffix_cache.reset()

    # ------------------------------------------------------------------------------------- helpers
    def _records(self) -> PersistentMemory | None:
        """The start's records (read once; None when the start is empty or no longer loads)."""
        if self._start_records is None and self.start.warm:  # (a file not read yet)
            records = self.start.fresh(self.vocab_size, self.start.k)
            self._start_records = records if len(records) else None
        return self._start_records

    def _fill(self, memory: PersistentMemory) -> None:
        """Copy the start's records into ``memory`` when it has the start's k."""
        records = self._records()
        if records is not None and memory.k == records.k:
            copy_records(records, memory)


def copy_records(source: PersistentMemory, memory: PersistentMemory) -> int:
    """Write every record of ``source`` into ``memory`` (same vocabulary and k); returns how many."""
    keys = np.flatnonzero(source.filled)
    memory.write_many(keys, source.ids[keys], source.probs[keys])
    return len(keys)


def build_drafter(
    method: str, state: DrafterState, config: RecapConfig, cost_model: Callable[[], CostModel] | None = None
) -> Drafter:
    """The drafter ``method`` with ``config`` on ``state``'s parts (only those it declares,
    `recap.drafters.shared_state`, created on first use) and ``state``'s SuffixDecoding settings;
    ``cost_model()`` gives the device's tree-cost curve when the budget is ``"auto"`` (None: none, the
    budget's fallback)."""
    needs = shared_state(method, config)
    options: dict[str, Any] = {}
    if "persistent" in needs:
        options["persistent"] = state.stream(method, config.k)
    if "successors" in needs:
        options["successors"] = state.successors()
    if "suffix_cache" in needs:
        options["suffix_cache"] = state.suffix_cache()
    if "cost_model" in needs and cost_model is not None:
        options["cost_model"] = cost_model()
    return make_drafter(method, config=config, suffix_config=state.suffix_config, **options)

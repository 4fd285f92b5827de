"""RECAP's tree: the ``cap`` best candidates by path estimate, found by best-first search.

A node's *path estimate* is its own acceptance estimate (`recap.drafters.recap.estimates`) times its
parent's path estimate (the root's is 1), so it never grows along a path and best-first search pops parents
before children. At each context every fused candidate is estimated and the ``config.branching`` best (above
``config.score_floor``) become nodes; the suffix-matched continuation (the context's longest suffix
seen earlier in it, what followed: `recap.drafters.recap.suffix_match.suffix_chain`, as
`recap.drafters.prompt_lookup.find_continuation` finds it) enters as one more candidate of each context
along its path, with the suffix flag in its acceptance kind; where no memory has a record, the
back-off record's tokens (`recap.drafters.recap.backoff`) are the candidates. The search itself runs compiled
(`recap.drafters.recap.kernel.grow_tree`); `grow` hands it the memories' arrays, and `select` makes
what it found a `DraftTree` (ties: shallower, then earlier in depth-at-a-time order).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from recap.drafters.recap.budget import PATIENCE
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.context import ContextMemory
from recap.drafters.recap.continuations import NO_FANS
from recap.drafters.recap.estimates import BUCKETS, EDGES, KIND_COLUMNS
from recap.drafters.recap.fusion import SOURCE_NAMES
from recap.drafters.recap.kernel import SearchMemories, SearchSettings, StopRule, grow_tree
from recap.drafters.recap.recycle import VerifiedPass, recycle
from recap.drafters.recap.stream import StreamMemory
from recap.memory.persistent import PersistentMemory
from recap.memory.records import pack_keys, record_table
from recap.tree import DraftTree

_EDGES = np.array(EDGES, dtype=np.float64)
_NO_STOP = StopRule(np.zeros(0), 0, 0.0)
_NO_SLOTS = np.full(1, -1, dtype=np.int64)
_NO_LEVELS = np.zeros((1, KIND_COLUMNS))
_NO_TABLE = np.zeros((1, 2), dtype=np.float32)
#: `SOURCE_NAMES` as an array (a tree's sources in one lookup).
_SOURCE_NAMES = np.empty(len(SOURCE_NAMES), dtype=object)
_SOURCE_NAMES[:] = [*SOURCE_NAMES]
#: The shortest suffix the suffix match takes (`recap.drafters.recap.suffix_match.suffix_chain`; the longest:
#: ``config.suffix_max_len``).
SUFFIX_MIN_LEN = 2


class Growth(NamedTuple):
    """What `grow` found: the tree of the ``cap`` best nodes and the labels of what it offered.

    The nodes, best first (a fan's nodes with their context's best one; then shallower, then earlier
    in depth-at-a-time order): ``tokens``, ``parents`` (node ids, -1 the root), ``scores`` (path
    estimates), ``parts`` (each memory's contribution to a node's fused probability ``(N, 3)``, display
    only), ``codes`` (sources, `recap.drafters.recap.fusion.SOURCE_NAMES`), ``fanned`` (queued in a fan,
    `recap.drafters.recap.continuations`). The labels of every candidate offered at every context expanded:
    ``label_nodes`` (the context's node id, -1 the root), ``label_tokens``, ``label_kinds`` (fine
    acceptance kinds). ``kept``: how many of the best nodes the cost-aware budget keeps (the budget
    rule, `recap.drafters.recap.budget`, applied by the search; all of them without a stop rule)."""

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    parts: np.ndarray
    codes: np.ndarray
    fanned: np.ndarray
    label_nodes: np.ndarray
    label_tokens: np.ndarray
    label_kinds: np.ndarray
    kept: int


class Memories(NamedTuple):
    """What one search reads besides the context, as the drafter holds it (`SearchMemories` is its
    compiled form): the memories ``ctx3``, ``ctx2``, ``persistent`` (None: off); ``request``, this
    request's stamp (its records are fresh); ``levels``, the acceptance model's shrinkage levels
    (`recap.drafters.recap.estimates.AcceptanceModel.levels`; None: uncalibrated, the estimate is the fused
    probability itself); ``backoff``, the back-off record's ``(ids, probs)``
    (`recap.drafters.recap.backoff.BackoffRecord.record`), offered where no memory has a record (None: off);
    ``fans``, the open contexts' sorted packed keys and the tokens that followed each
    (`recap.drafters.recap.continuations.Continuations.arrays`; None: no fans)."""

    ctx3: ContextMemory | None
    ctx2: ContextMemory | None
    persistent: PersistentMemory | None
    request: int
    levels: tuple[np.ndarray, np.ndarray] | None
    backoff: tuple[np.ndarray, np.ndarray] | None = None
    fans: tuple[np.ndarray, np.ndarray] | None = None


def _context_arrays(memory: ContextMemory | None) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """A contextual memory as the kernel reads it: on, hash slots, rows, record table (an empty memory
    reads as one that is off: no key finds a row)."""
    if memory is None or memory.k == 0:  # (never written: no table yet)
        return False, _NO_SLOTS, _NO_SLOTS, _NO_TABLE
    index = memory.index
    return True, index.keys, index.rows, memory.table


def grow(
    tokens: np.ndarray,
    length: int,
    cap: int,
    settings: SearchSettings,
    usable: np.ndarray,
    memories: Memories,
    stop: tuple[np.ndarray, int, float] | None = None,
) -> Growth:
    """The best-first search for ``cap`` nodes under the context ``tokens[:length]``.

    ``tokens``: int64, C-contiguous (the root is ``tokens[length - 1]``); ``settings``: `settings_of` a
    config (the depth, the suffix-matched continuation, the weights); ``usable``: token -> may appear in
    a key; ``memories``: what the search reads (`Memories`); ``stop``: the cost-aware budget's ``(costs,
    pending, overhead)`` (``costs[T]``: `recap.models.cost.CostModel.costs` of ``T`` tokens, up to ``cap +
    pending``), so that the search grows no further than the budget rule (`recap.drafters.recap.budget`)
    looks (the nodes it keeps are the same); None: grow to ``cap``.
    """
    ctx3, ctx2, persistent, request, levels, backoff, fans = memories
    rule = _NO_STOP if stop is None else StopRule(stop[0], int(stop[1]), float(stop[2]))
    if len(rule.costs) and len(rule.costs) <= cap + rule.pending:
        need = cap + rule.pending
        raise ValueError(f"stop costs cover {len(rule.costs) - 1} tokens, the search needs {need}")
    k = settings.k
    if persistent is not None:
        p_on, p_table = True, persistent.table
    else:
        p_on, p_table = False, _no_records(k)
    fine, coarse = levels if levels is not None else (_NO_LEVELS, _NO_LEVELS)
    if not (isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and tokens.flags.c_contiguous):
        raise ValueError("tokens must be a C-contiguous int64 array")
    if not 0 <= length <= len(tokens):
        raise ValueError(f"length {length} is outside the {len(tokens)} tokens given")
    if backoff is not None and not (len(backoff[0]) == len(backoff[1]) == k):
        raise ValueError(f"the back-off record must hold k = {k} ids and probabilities")
    if backoff is None:
        backoff_arrays = (False, np.full(k, -1, dtype=np.int64), np.zeros(k, dtype=np.float32))
    else:
        ids, probs = (np.ascontiguousarray(a, dtype=t) for a, t in zip(backoff, (np.int64, np.float32)))
        backoff_arrays = (True, ids, probs)
    # The contextual memories are frozen (a write may reallocate their tables), in the order writers
    # take them (`recap.drafters.recap.recycle.recycle`: persistent, ctx2, ctx3). The persistent table is read
    # unlocked: a concurrent write can only make a record newer (drafting, never the output, changes).
    locks = [m.frozen() for m in (ctx2, ctx3) if m is not None]
    for lock in locks:
        lock.acquire()
    try:
        arrays = SearchMemories(
            *_context_arrays(ctx3),
            *_context_arrays(ctx2),
            p_on,
            p_table,
            int(request),
            levels is not None,
            fine,
            coarse,
            *backoff_arrays,
            *(fans or NO_FANS),
        )
        found = grow_tree(tokens, int(length), int(cap), usable, arrays, settings, rule)
    finally:
        for lock in reversed(locks):
            lock.release()
    return Growth(*found)


def settings_of(config: RecapConfig) -> SearchSettings:
    """The search's settings from ``config`` (a drafter takes them once): every `SearchSettings` field
    named as a config field is copied by name and cast to its declared type, so a new knob is a config
    field and a settings field of the same name; the others are derived here."""
    suffix = int(min(config.depth, config.suffix_budget)) if config.suffix and config.suffix_budget > 0 else 0
    derived = {
        "suffix_min": SUFFIX_MIN_LEN,
        "suffix_num": suffix,
        "memory_priors": _specificity(config.memory_priors),
        "edges": _EDGES,
        "buckets": BUCKETS,
        "patience": PATIENCE,
    }
    copied = {name: _SETTING_TYPES[name](getattr(config, name)) for name in _COPIED}
    return SearchSettings(**copied, **derived)


#: The declared type of each `SearchSettings` field, and the fields copied from the config by name.
_SETTING_TYPES = typing.get_type_hints(SearchSettings)
_COPIED = tuple(set(SearchSettings._fields) & {field.name for field in dataclasses.fields(RecapConfig)})


@functools.lru_cache(maxsize=8)
def _no_records(k: int) -> np.ndarray:
    """A one-row record table holding the empty record (what the search reads for a memory that is off)."""
    return record_table(np.full((1, k), -1), np.zeros((1, k)), [0.0], [-1])


@functools.lru_cache(maxsize=8)
def _specificity(priors: tuple[float, float, float]) -> np.ndarray:
    """``config.memory_priors`` as the search's array (read-only; one array per setting)."""
    array = np.array(priors, dtype=float)
    array.flags.writeable = False
    return array


def select(growth: Growth, keep: Callable[[np.ndarray], int] | None = None) -> DraftTree:
    """The grown tree as a `DraftTree`; ``keep(scores)``: how many of its best nodes a cost-aware
    budget keeps (all when None; a prefix of a best-first order is a tree)."""
    size = len(growth.tokens) if keep is None else keep(growth.scores)
    return DraftTree(
        growth.tokens[:size].tolist(),
        growth.parents[:size].tolist(),
        growth.scores[:size].tolist(),
        _SOURCE_NAMES[growth.codes[:size]].tolist(),
        [{} for _ in range(size)],
    )


@functools.cache
def compile_kernels() -> None:
    """Compile RECAP's compiled parts once per process (`numba`: about 15 s the first time on a machine,
    then loaded from numba's on-disk cache in about a second): the search, the key index, the
    recycling (keys, records, writes), the acceptance counts and the back-off counts. Every
    `recap.drafters.recap.drafter.RecapDrafter` calls it when created, so no timed pass pays for it; a server
    may call it at start-up."""
    config = RecapConfig(budget=4)
    k = config.k
    row = record_table(np.arange(k)[None], np.full((1, k), 1.0 / k), [0.0], [0])
    memories = ContextMemory(3), ContextMemory(2)
    for order, memory in enumerate(memories):
        memory.write_table(pack_keys(np.arange(3 - order)[None]), row)
        memory.slots(np.array([0], dtype=np.int64))
        memory.index.reserve(len(memory.index.keys))  # a rebuild (its re-insertion is compiled too)
    usable = np.ones(k + 1, dtype=bool)
    usable[-1] = False
    grow(np.array([0, 1, 2, 0, 1, 2]), 6, 4, settings_of(config), usable, Memories(*memories, None, 0, None))
    stream = StreamMemory(PersistentMemory(k + 1, k))
    no_nodes, top = np.zeros(0, dtype=np.int64), np.tile(np.arange(k), (3, 1))
    uniform = np.full((3, k), 1 / k, np.float32)
    computed = VerifiedPass([0, 1, 2], np.arange(3), no_nodes, no_nodes, [], top, uniform)
    recycle(computed, no_nodes, k, 0, stream.tokens, *memories[::-1])
    stream.acceptance.update(np.array([0, 1]), np.array([1]))
    stream.backoff.count([0])
    stream.acceptance.update_greedy(np.array([-1]), np.array([0]), np.array([0]), 1, 1, np.array([0, 0]))

"""Sessions bounded: what the server keeps for its visitors stays within a memory budget.

Every browser tab and every API client is a gradio session, and each keeps its ``gr.State`` values on
the server: its memories (`recap.state.DrafterState`, one per model: a persistent memory, Token
Recycling's matrix, SuffixDecoding's tree), its last run or replay (a trace and the image), its last
comparison. `SessionLedger` estimates what each session holds (`footprint`) and, when the sessions hold
more than ``budget`` bytes together or there are more than ``max_sessions`` of them, drops the least
recently used ones whole (gradio's own state holder, the way gradio drops sessions beyond its capacity),
never the session being served and never one with a run in flight. A dropped session's next run starts
again from the model's starting memory, and its status and memory line say so (`restarted`).
`ClientLedger`, the studio's, drops first the sessions of the client (an address) that holds the most.

The estimate counts the arrays of the memories, the images, and a measured cost per step, drafted
node and token of a trace (`STEP_BYTES`, `NODE_BYTES`, ...) with its texts and what its records hold
beyond a drafter's few entries (a replayed trace's may hold thousands), plus `SESSION_BYTES` for
gradio's own copy of the page per session; SuffixDecoding's tree (C++) is counted as `SUFFIX_TREE_BYTES`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from recap.trace import StepRecord

log = logging.getLogger("recap.studio")

#: What gradio keeps per session whatever it holds (its copy of the page's component configs; measured
#: ~0.19 MB for the studio's page).
SESSION_BYTES = 200_000
#: A trace's Python objects, measured: per step, per drafted node or fused entry, per committed token,
#: per sampling draw's tried pair (`tests/test_space_limits.py` checks that a recorded trace's estimate
#: is not below what reading it allocates).
STEP_BYTES, NODE_BYTES, TOKEN_BYTES, PAIR_BYTES = 1_200, 700, 150, 150
#: And what a record holds beyond a drafter's few entries: per entry of a node's or a fused entry's
#: ``sources`` and ``contributions`` past the first `BASE_ENTRIES` (a replayed trace may hold thousands,
#: each a string of its own: ~56 MB in a trace within the limits), plus every text's own size.
ENTRY_BYTES, BASE_ENTRIES = 70, 4
#: SuffixDecoding's global tree lives in C++ and is not measured: this much is assumed.
SUFFIX_TREE_BYTES = 4 << 20
#: How many dropped sessions are remembered (to tell them on their next run), at ~100 bytes each.
REMEMBERED = 20_000
#: The least time between two full sweeps (a sweep estimates every session: ~1 ms per 10 sessions).
SWEEP_INTERVAL_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Collect garbage and give the allocator's free pages back to the system (glibc keeps what a
    replay or a dropped session freed otherwise, and the server's RSS would only grow)."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def footprint(value: Any, seen: set[int] | None = None) -> int:
    """Estimated bytes of ``value`` (a state's value: dicts, lists, traces, memories, images), each
    object counted once in ``seen``."""
    seen = set() if seen is None else seen
    if value is None or isinstance(value, bool | int | float):
        return 0
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, str | bytes):
        return sys.getsizeof(value)
    if isinstance(value, StepRecord):
        return _step_bytes(value)
    if isinstance(value, Image.Image):
        return value.width * value.height * max(1, len(value.getbands()))
    if isinstance(value, dict):
        items = list(value.items())
        return sys.getsizeof(value) + sum(footprint(k, seen) + footprint(v, seen) for k, v in items)
    if isinstance(value, list | tuple | set | frozenset):
        return sys.getsizeof(value) + sum(footprint(v, seen) for v in list(value))
    kind = type(value)
    if kind.__name__ == "SuffixTreeCache":
        return SUFFIX_TREE_BYTES
    if kind.__module__.startswith("recap."):  # a memory, a trace, a drafting state: its attributes
        fields = getattr(value, "__dict__", None)
        if fields is None:
            fields = {name: getattr(value, name, None) for name in getattr(kind, "__slots__", ())}
        return sys.getsizeof(value) + sum(footprint(v, seen) for v in list(fields.values()))
    return sys.getsizeof(value)


def _step_bytes(step: StepRecord) -> int:
    pairs = sum(len(d.get("tried", ())) for d in step.draws) if step.draws else 0
    nodes = len(step.nodes) + len(step.fused_at_root) + (len(step.draws) if step.draws else 0)
    held = sum(map(sys.getsizeof, step.new_texts))
    for record in (*step.nodes, *step.fused_at_root):  # (a sweep's nodes are bounded by the budget)
        entries = len(getattr(record, "sources", ())) + len(record.contributions)
        held += ENTRY_BYTES * max(0, entries - BASE_ENTRIES) + sys.getsizeof(record.text)
    return STEP_BYTES + NODE_BYTES * nodes + TOKEN_BYTES * len(step.new_tokens) + PAIR_BYTES * pairs + held


class SessionLedger:
    """Keeps the sessions of one demo within ``budget`` bytes and ``max_sessions`` (see the module
    docstring). `attach` names the demo and the ``gr.State`` that holds each session's memories;
    ``busy(session)`` says whether a session has a run in flight (it is never dropped then)."""

    def __init__(self, budget: int, max_sessions: int, busy: Callable[[str], bool] = lambda s: False) -> None:
        if budget < 1 or max_sessions < 1:
            raise ValueError(f"need budget >= 1 and max_sessions >= 1, got {budget}, {max_sessions}")
        self.budget, self.max_sessions, self.busy = budget, max_sessions, busy
        self._demo: Any = None
        self._memories_id: int | None = None
        self._lock = threading.Lock()
        self._dropped: OrderedDict[str, None] = OrderedDict()
        self._last_sweep = -float("inf")
        self.total = 0  # bytes held at the last sweep
        self.sessions = 0  # sessions at the last sweep
        self.evictions = 0

    def attach(self, demo: Any, memories_state: Any) -> None:
        self._demo, self._memories_id = demo, memories_state._id

    def _holder(self) -> Any:
        return getattr(self._demo, "state_holder", None)

    # ------------------------------------------------------------------------------------ queries
    def restarted(self, session: str | None) -> bool:
        """Whether ``session`` was dropped since its last run (asked once: the flag is cleared)."""
        if session is None:
            return False
        with self._lock:
            return self._dropped.pop(session, 0) is None

    def sizes(self) -> list[tuple[str, int]]:
        """``(session, estimated bytes)`` of every session gradio holds, least recently used first."""
        holder = self._holder()
        if holder is None:
            return []
        with holder.lock:
            sessions = list(holder.session_data.items())
        seen: set[int] = set()  # (an object shared by sessions, e.g. a starting memory, counts once)
        return [
            (sid, SESSION_BYTES + sum(footprint(v, seen) for v in list(state.state_data.values())))
            for sid, state in sessions
        ]

    # ---------------------------------------------------------------------------------- eviction
    def sweep(self, serving: str | None = None, force: bool = False) -> int:
        """Drop least recently used sessions until the rest fit the budget and the count (never
        ``serving``, never a busy one); at most once per `SWEEP_INTERVAL_S` unless ``force``. Returns
        how many were dropped."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_sweep < SWEEP_INTERVAL_S:
                return 0
            self._last_sweep = now
        sizes = self.sizes()
        total, count, dropped = sum(size for _, size in sizes), len(sizes), 0
        for session, size in sizes:
            if total <= self.budget and count <= self.max_sessions:
                break
            if session == serving or self.busy(session):
                continue
            if self._drop(session):
                total, count, dropped = total - size, count - 1, dropped + 1
        self.total, self.sessions = total, count
        if dropped:
            self.evictions += dropped
            release_memory()
            log.info(
                "dropped %d idle sessions to stay within %d MB and %d sessions (now %.0f MB in %d)",
                dropped, self.budget >> 20, self.max_sessions, total / 2**20, count,
            )  # fmt: skip
        return dropped

    def _drop(self, session: str) -> bool:
        holder = self._holder()
        state = holder.session_data.get(session) if holder is not None else None
        if state is None:
            return False
        memories = state.state_data.get(self._memories_id)
        held = isinstance(memories, dict) and any(not isinstance(v, str) for v in memories.values())
        try:
            holder.delete_state(session)  # the states' delete callbacks (a session's downloads go)
        except Exception:  # a callback failed: the session still goes
            log.warning("a delete callback failed while dropping a session", exc_info=True)
        with holder.lock:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)
        if held:
            with self._lock:
                self._dropped[session] = None
                while len(self._dropped) > REMEMBERED:
                    self._dropped.popitem(last=False)
        return True


class ClientLedger(SessionLedger):
    """`SessionLedger` whose sweeps drop the sessions of the client holding the most first: a client
    (`recap.studio.guard.clients.client_key`) that opened many sessions loses them before a visitor with one
    loses theirs. `sizes` lists the sessions of the client holding the most bytes first, each client's
    least recently used first; a session whose client is unknown (it never decoded) counts as a client
    of its own. ``owner(session)``: the session's client, or None (`Studio.owner`)."""

    def __init__(
        self, budget: int, max_sessions: int, busy: Callable[[str], bool], owner: Callable[[str], str | None]
    ) -> None:
        super().__init__(budget, max_sessions, busy=busy)
        self.owner = owner

    def sizes(self) -> list[tuple[str, int]]:
        sizes = super().sizes()  # least recently used first
        owners = [self.owner(session) or ("session", session) for session, _ in sizes]
        held: dict = {}
        for owner, (_, size) in zip(owners, sizes):
            held[owner] = held.get(owner, 0) + size
        order = sorted(range(len(sizes)), key=lambda i: -held[owners[i]])  # (stable: LRU within a client)
        return [sizes[i] for i in order]

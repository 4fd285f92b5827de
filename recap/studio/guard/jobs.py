"""Decoding work and its display: jobs, one job per session, and a display paced outside the slots.

- `DecodeJob`: one piece of work, produced in a slot of the decode line
  (`recap.studio.guard.decode_line`: a worker thread puts its items) and consumed by its event's
  handler: an async one (`next`, `outcome`; a run paces its steps out to the visitor with `paced` after
  the slot is free) or a sync one in a thread of its own (`take`, `values`).
- `SessionJobs`: a session has at most one job queued or running per event: a newer one replaces it
  (the older one stops at its next step and ends with a message saying so).
- `paced`: when a run's display updates: step ``i`` is shown ``min(i * delay, cap)`` seconds after the
  first (never before it arrives), at most one update per ``interval``, the last one always, each in
  its turn of the displays' `recap.studio.guard.tickets.RenderBudget`.
- **Heartbeats** (`HEARTBEAT_S`): gradio stops an event whose client is gone (a closed tab) only when
  its handler next yields, and a handler waiting in the line for a slot yields nothing. So `paced` and
  `DecodeJob.values` also come back after ``heartbeat_s`` without news (an idle `Update`, a None), the
  handler yields (the line's length while it waits), and work whose visitor left leaves the line within
  a heartbeat of gradio noticing, instead of keeping its place, and its client's share, until a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from recap.studio.guard.clients import NO_CLIENT
from recap.studio.guard.tickets import RenderBudget

log = logging.getLogger("recap.studio")

#: What a worker puts for its handler: ``("status", text)``, ``("step", record)``, ``("error", exception)``;
#: ``("cancelled", reason)`` once cancelled; ``("end", None)`` always comes last.
Item = tuple[str, Any]
#: Seconds a handler waits for its job's news before it yields anyway (see the module docstring).
HEARTBEAT_S = 5.0


class Cancelled(Exception):
    """Raised in a worker at its next step once its job is cancelled (replaced, stopped, disconnected)."""


class DecodeJob:
    """One piece of decoding work: its worker thread `put`s items, its handler awaits them (`next`) or,
    without an event loop (a sync handler in a thread), takes them (`take`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, client: str = NO_CLIENT) -> None:
        self._loop = loop
        self._items: asyncio.Queue[Item] | queue.SimpleQueue[Item] = (
            asyncio.Queue() if loop is not None else queue.SimpleQueue()
        )
        self._cancelled = threading.Event()
        self._withdraw: Callable[[], None] | None = None  # gives a waiting job's place back (the slots')
        self._entry: Any = None  # the job in the line's care (`recap.studio.guard.decode_line`)
        self.client = client
        self.reason = ""
        self.result: Any = None  # what the work returned
        self.started = threading.Event()  # the job has had a slot
        self.ended = threading.Event()  # the job gave its slot back for good
        self.stopped = threading.Event()  # its visitor pressed Stop: the handler shows nothing more

    # ----------------------------------------------------------------------------- worker side
    def put(self, kind: str, value: Any = None) -> None:
        """Hand an item to the handler (from the worker thread)."""
        if self._loop is None:
            self._items.put_nowait((kind, value))
            return
        with contextlib.suppress(RuntimeError):  # a closed loop (the server stopped): nobody listens
            self._loop.call_soon_threadsafe(self._items.put_nowait, (kind, value))

    def check(self) -> None:
        """Raise `Cancelled` if the job was cancelled (a worker calls this between steps)."""
        if self._cancelled.is_set():
            raise Cancelled(self.reason)

    # ---------------------------------------------------------------------------- handler side
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, reason: str = "stopped") -> None:
        """Stop the work at its next step; a job still waiting for a slot leaves the line at once (its
        place and its client's count go back). The first reason is kept."""
        if not self._cancelled.is_set():
            self.reason = reason
            self._cancelled.set()
            self.put("cancelled", reason)
            if self._withdraw is not None:
                self._withdraw()

    async def next(self, timeout: float | None = None) -> Item | None:
        """The next item, or None after ``timeout`` seconds (an async handler)."""
        if timeout is not None and timeout <= 0:
            return self._items.get_nowait() if not self._items.empty() else None
        try:
            return await asyncio.wait_for(self._items.get(), timeout)
        except TimeoutError:
            return None

    def take(self, timeout: float | None = None) -> Item | None:
        """The next item, or None after ``timeout`` seconds (a sync handler, in its own thread)."""
        try:
            return self._items.get(timeout=timeout)
        except queue.Empty:
            return None

    async def outcome(self) -> Any:
        """Wait for the work to end (an async handler) and return what it returned; a worker's error is
        raised, a cancelled job raises `Cancelled` with its reason."""
        async for _ in self.waits():
            pass
        return self.result

    async def waits(self, heartbeat_s: float | None = None) -> AsyncIterator[None]:
        """Wait for the work to end (an async handler; its return value is then ``result``), with a None
        after every ``heartbeat_s`` seconds without news (so that the handler yields); a worker's error
        is raised, a cancelled job raises `Cancelled` with its reason."""
        while True:
            item = await self.next(heartbeat_s)
            if item is None:
                yield None
                continue
            kind, _ = _raised(*item)
            if kind == "end":
                return

    @property
    def waiting(self) -> bool:
        """The job waits for its first slot (it has not started and is not cancelled)."""
        return not self.started.is_set() and not self._cancelled.is_set()

    def values(self, heartbeat_s: float | None = None) -> Iterator[Any]:
        """The ``("step", value)`` items' values as they come (a sync handler), until the work ends; a
        worker's error is raised, a cancelled job raises `Cancelled` with its reason. ``heartbeat_s``:
        also a None after that many seconds without an item (so that the handler yields)."""
        while True:
            item = self.take(heartbeat_s)
            if item is None:
                yield None
                continue
            kind, value = item
            _raised(kind, value)
            if kind == "step":
                yield value
            elif kind == "end":
                return


def _raised(kind: str, value: Any) -> Item:
    """Raise what an ``error`` or ``cancelled`` item carries; other items are returned."""
    if kind == "error":
        raise value
    if kind == "cancelled":
        raise Cancelled(value)
    return kind, value


class SessionJobs:
    """The run each session has queued or running, per event: a newer one replaces the older."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], DecodeJob] = {}

    def replace(self, session: str | None, event: str, job: DecodeJob) -> None:
        """Make ``job`` the session's run of ``event``, cancelling the one it had (``session`` None: an
        anonymous caller, whose every request is its own session)."""
        if session is None:
            return
        with self._lock:
            older = self._jobs.get((session, event))
            self._jobs[(session, event)] = job
        if older is not None and older is not job:
            older.cancel("replaced")

    def current(self, session: str | None, event: str) -> DecodeJob | None:
        """The session's job of ``event`` now (the one a new job would replace)."""
        if session is None:
            return None
        with self._lock:
            return self._jobs.get((session, event))

    def finish(self, session: str | None, event: str, job: DecodeJob) -> None:
        with self._lock:
            if self._jobs.get((session, event)) is job:
                del self._jobs[(session, event)]

    def active(self, session: str) -> bool:
        """Whether ``session`` has a run queued or running (of any event)."""
        with self._lock:
            return any(s == session for s, _ in self._jobs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)


@dataclass
class Update:
    """What `paced` asks its handler to show: the first ``shown`` steps, or a status line only."""

    shown: int = 0
    status: str | None = None
    final: bool = False
    idle: bool = False  # a heartbeat: nothing new for ``heartbeat_s`` seconds


async def paced(
    job: DecodeJob,
    steps: list,
    delay_s: float,
    cap_s: float,
    interval_s: float,
    budget: RenderBudget | None = None,
    heartbeat_s: float | None = None,
) -> AsyncIterator[Update]:
    """Receive ``job``'s steps into ``steps`` and say when to show how many of them.

    Step ``i`` is due ``min(i * delay_s, cap_s)`` seconds after step 0 arrived, or when it arrives if
    that is later; an update shows every step due, at most one per ``interval_s``, the first step at
    once. With a delay, an update also waits for its turn of the shared ``budget``; without one it does
    not (a live display lasts while its run decodes in a slot, and the slots bound those). The last
    update (``final``) comes when the job is done and every step was shown. ``heartbeat_s``: an
    ``idle`` update after that many seconds without news (see the module docstring). A worker's error
    is raised here; a cancelled job raises `Cancelled` with its reason.
    """
    first: float | None = None
    shown, done, last_update = 0, False, -math.inf
    while True:
        now = time.monotonic()
        due = len(steps) if first is None or delay_s <= 0 else _due(len(steps), now - first, delay_s, cap_s)
        if due > shown and (shown == 0 or now - last_update >= interval_s or (done and due == len(steps))):
            if budget is not None and shown > 0 and delay_s > 0:  # a paced update
                await budget.take()
                now = time.monotonic()
                due = len(steps) if delay_s <= 0 else _due(len(steps), now - first, delay_s, cap_s)
            shown, last_update = due, now
            yield Update(shown, final=done and shown == len(steps))
            if done and shown == len(steps):
                return
            continue
        if done and shown == len(steps):  # nothing left to show (a run of no step)
            yield Update(shown, final=True)
            return
        timeout = None
        if due > shown:  # waiting for the update interval
            timeout = last_update + interval_s - now
        elif shown < len(steps):  # waiting for the next step to be due
            timeout = first + min(shown * delay_s, cap_s) - now
        beat = heartbeat_s is not None and (timeout is None or timeout > heartbeat_s)
        if beat:
            timeout = heartbeat_s
        item = await job.next(max(timeout, 0.001) if timeout is not None else None)
        if item is None:
            if beat:
                yield Update(shown, idle=True)
            continue
        kind, value = item
        if kind == "step":
            steps.append(value)
            if first is None:
                first = time.monotonic()
        elif kind == "status":
            yield Update(shown, status=value)
        elif kind == "error":
            raise value
        elif kind == "cancelled":
            raise Cancelled(value)
        elif kind == "end":
            done = True


def _due(received: int, elapsed: float, delay_s: float, cap_s: float) -> int:
    """How many of ``received`` steps are due ``elapsed`` seconds after the first arrived."""
    if elapsed >= cap_s:
        return received
    return min(received, int(elapsed / delay_s) + 1)

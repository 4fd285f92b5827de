"""Fair use of the decode slots: a bounded line of runs, one run per session, and a display paced outside
the slots.

- `DecodeSlots`: at most ``slots`` decodes at once (worker threads, first come first served) and at
  most ``waiting`` more in line; a run beyond that is refused with a message ("the studio is busy").
  A slot holds a run while it loads, checks and decodes its input at full speed, nothing longer.
- `DecodeJob`: one run's decode, produced in a slot (a worker thread puts its steps) and consumed by its
  event's async handler, which paces the steps out to the visitor (`paced`) after the slot is free.
- `SessionJobs`: a session has at most one run queued or running per event: a newer one replaces it
  (the older one stops at its next step and ends with a message saying so).
- `RenderBudget`: the paced displays of every run in the process share a part of one CPU (each update
  renders plotly figures, tens of ms), so a crowd of slow displays cannot starve the decodes; a live
  display (no delay: it lasts while its run decodes in a slot) is bounded by the slots themselves.
- `paced`: when a run's display updates: step ``i`` is shown ``min(i * delay, cap)`` seconds after the
  first (never before it arrives), at most one update per ``interval``, the last one always.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("recap.studio")

#: What a worker puts for its handler: ``("status", text)``, ``("step", record)``, ``("error", exception)``;
#: ``("cancelled", reason)`` once cancelled; ``("end", None)`` always comes last.
Item = tuple[str, Any]


class Cancelled(Exception):
    """Raised in a worker at its next step once its job is cancelled (replaced, stopped, disconnected)."""


class DecodeJob:
    """One run's decode: its worker thread `put`s items, its handler awaits them (`next`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: asyncio.Queue[Item] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.reason = ""
        self.result: Any = None  # what the work returned
        self.started = threading.Event()  # the job has its slot
        self.ended = threading.Event()  # the job gave its slot back

    # ----------------------------------------------------------------------------- worker side
    def put(self, kind: str, value: Any = None) -> None:
        """Hand an item to the handler (from the worker thread)."""
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
        """Stop the decode at its next step (or before it starts); the first reason is kept."""
        if not self._cancelled.is_set():
            self.reason = reason
            self._cancelled.set()
            self.put("cancelled", reason)

    async def next(self, timeout: float | None = None) -> Item | None:
        """The next item, or None after ``timeout`` seconds."""
        if timeout is not None and timeout <= 0:
            return self._items.get_nowait() if not self._items.empty() else None
        try:
            return await asyncio.wait_for(self._items.get(), timeout)
        except TimeoutError:
            return None


class DecodeSlots:
    """At most ``slots`` decodes at once, at most ``waiting`` more queued (first come, first served)."""

    def __init__(self, slots: int, waiting: int) -> None:
        if slots < 1 or waiting < 0:
            raise ValueError(f"need slots >= 1 and waiting >= 0, got {slots}, {waiting}")
        self.slots, self.waiting = slots, waiting
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="recap-decode")
        self._lock = threading.Lock()
        self._pending = 0  # queued + running
        self._running = 0

    def counts(self) -> tuple[int, int]:
        """``(running, waiting)`` now."""
        with self._lock:
            return self._running, self._pending - self._running

    def submit(self, work: Callable[[DecodeJob], Any]) -> DecodeJob:
        """Queue ``work(job)`` for a slot (called from the event loop); its return value becomes
        ``job.result``, an exception an ``("error", exception)`` item. Raises `Busy` when the line is
        full. ``work`` runs in a copy of the caller's context (gradio's request, for ``gr.Warning``)."""
        with self._lock:
            if self._pending >= self.slots + self.waiting:
                raise Busy(self._pending)
            self._pending += 1
        job = DecodeJob(asyncio.get_running_loop())
        context = contextvars.copy_context()

        def task() -> None:
            with self._lock:
                self._running += 1
            job.started.set()
            try:
                job.check()
                job.result = context.run(work, job)
            except Cancelled:
                pass
            except BaseException as error:  # handed to the handler, which words it
                job.put("error", error)
            finally:
                with self._lock:
                    self._running -= 1
                    self._pending -= 1
                job.ended.set()
                job.put("end")

        try:
            self._executor.submit(task)
        except RuntimeError:  # shut down
            with self._lock:
                self._pending -= 1
            raise
        return job

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class Busy(Exception):
    """The line of waiting runs is full."""

    def __init__(self, pending: int) -> None:
        super().__init__(f"{pending} runs are decoding or waiting")
        self.pending = pending


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


class RenderBudget:
    """The paced displays of every run share ``share`` of one CPU for their updates, first come first
    served: an update's turn comes ``cost / share`` seconds after the previous one's, ``cost`` being
    what an update has taken to render lately (`spent`), so the rate follows the machine and the size
    of what is drawn."""

    def __init__(self, share: float, cost_s: float = 0.05) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.share, self.cost_s = share, cost_s
        self._next = 0.0
        self._lock = threading.Lock()

    async def take(self) -> None:
        """Wait for this update's turn."""
        with self._lock:
            now = time.monotonic()
            turn = max(now, self._next)
            self._next = turn + self.cost_s / self.share
        if turn > now:
            await asyncio.sleep(turn - now)

    def spent(self, seconds: float) -> None:
        """An update took ``seconds`` to render (a moving average of the last ~10 sets the cost)."""
        with self._lock:
            self.cost_s += 0.1 * (min(seconds, 1.0) - self.cost_s)


@dataclass
class Update:
    """What `paced` asks its handler to show: the first ``shown`` steps, or a status line only."""

    shown: int = 0
    status: str | None = None
    final: bool = False


async def paced(
    job: DecodeJob,
    steps: list,
    delay_s: float,
    cap_s: float,
    interval_s: float,
    budget: RenderBudget | None = None,
) -> AsyncIterator[Update]:
    """Receive ``job``'s steps into ``steps`` and say when to show how many of them.

    Step ``i`` is due ``min(i * delay_s, cap_s)`` seconds after step 0 arrived, or when it arrives if
    that is later; an update shows every step due, at most one per ``interval_s``, the first step at
    once. With a delay, an update also waits for its turn of the shared ``budget``; without one it does
    not (a live display lasts while its run decodes in a slot, and the slots bound those). The last
    update (``final``) comes when the job is done and every step was shown. A worker's error is raised
    here; a cancelled job raises `Cancelled` with its reason.
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
        item = await job.next(max(timeout, 0.001) if timeout is not None else None)
        if item is None:
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

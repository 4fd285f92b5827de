"""The decode line: a bounded line of decoding work, served in turns across clients.

`DecodeSlots`: at most ``slots`` pieces of decoding work at once (fixed worker threads) and at most
``waiting`` more in line; beyond that, work is refused with a message ("the studio is busy"). The line
is fair across clients (`client_key`: a visitor's address, not their session): each client has its own
first-come-first-served queue, and a free slot goes to the waiting client whose work started least
recently, so a client's first run waits for the work already running and at most one piece of each
other waiting client's. A client holds at most ``per_client`` pieces queued or running across all its
sessions (`ClientBusy` beyond). Runs, comparisons and sensitivity passes all go through it. A slot
holds a run while it loads, checks and decodes its input at full speed, nothing longer. Work that is a
generator (a run yields between two of its passes, a comparison between its methods) is served in
turns of at least ``turn_s`` seconds: at its first ``yield`` after that, if another client waits, the
slot goes to that client and the work waits at the head of its own client's queue. A short run ends
within its turn; a costly one shares the slot, so nobody waits for the whole of someone else's. The
jobs themselves and their display: `recap.studio.guard.jobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from recap.studio.guard.clients import NO_CLIENT, key_hash
from recap.studio.guard.jobs import Cancelled, DecodeJob

log = logging.getLogger("recap.studio")


@dataclass(eq=False)
class _Entry:
    """A job in the slots' care: its work, the caller's context, its client and place in the line."""

    job: DecodeJob
    work: Callable[[DecodeJob], Any]
    context: contextvars.Context
    client: str
    seq: int
    steps: Iterator[Any] | None = None  # a generator's work, between two of its turns
    state: str = "waiting"  # "waiting", "running", "done"


class DecodeSlots:
    """At most ``slots`` pieces of work at once, at most ``waiting`` more queued, at most
    ``per_client`` queued or running per client (None: no such bound); waiting work is served in turns
    across clients, a generator's work in turns of at least ``turn_s`` seconds (see the module
    docstring)."""

    #: Clients whose last turn is remembered beyond those with work in the line (the oldest go first).
    REMEMBERED = 4096

    def __init__(self, slots: int, waiting: int, per_client: int | None = None, turn_s: float = 0.0) -> None:
        if slots < 1 or waiting < 0 or (per_client is not None and per_client < 1) or not turn_s >= 0:
            raise ValueError(
                "need slots >= 1, waiting >= 0, per_client >= 1 and turn_s >= 0, "
                f"got {slots}, {waiting}, {per_client}, {turn_s}"
            )
        self.slots, self.waiting, self.per_client, self.turn_s = slots, waiting, per_client, turn_s
        self._lock = threading.Condition()
        self._queues: dict[str, deque[_Entry]] = {}  # each client's waiting work, first come first
        self._held: dict[str, int] = {}  # each client's work queued or running
        self._turns: dict[str, int] = {}  # when each client's work last started (a turn number)
        self._turn = 0
        self._seq = 0
        self._pending = 0  # queued + running
        self._running = 0
        self._workers: list[threading.Thread] = []
        self._closed = False

    def counts(self) -> tuple[int, int]:
        """``(running, waiting)`` now."""
        with self._lock:
            return self._running, self._pending - self._running

    def held(self, client: str) -> int:
        """Work of ``client`` queued or running now."""
        with self._lock:
            return self._held.get(client, 0)

    def submit(
        self,
        work: Callable[[DecodeJob], Any],
        client: str = NO_CLIENT,
        replacing: DecodeJob | None = None,
    ) -> DecodeJob:
        """Queue ``work(job)`` for a slot; its return value becomes ``job.result``, an exception an
        ``("error", exception)`` item. Work that returns a generator runs it in turns: between two of
        its items the slot goes to another client's waiting work, if any, and the generator waits in
        its client's queue (at its head) for its next turn; its return value is the result.

        Raises `Busy` when the line is full and `ClientBusy` when ``client`` already holds
        ``per_client`` pieces (``replacing``: a job of the same client that this one replaces, which
        is not counted). ``work`` runs in a copy of the caller's context (gradio's request, for
        ``gr.Warning``). Called from an event loop, the job's items are awaited (`DecodeJob.next`);
        from a thread without one, taken (`DecodeJob.take`)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        job = DecodeJob(loop, client)
        with self._lock:
            if self._closed:
                raise RuntimeError("the decode slots are shut down")
            older = replacing._entry if replacing is not None else None
            counted = older is not None and older.client == client and older.state != "done"
            pending = self._pending - counted
            if pending >= self.slots + self.waiting:
                raise Busy(pending)
            held = self._held.get(client, 0) - counted
            if self.per_client is not None and held >= self.per_client:
                log.debug("client %s holds %d pieces of work: refused", key_hash(client), held)
                raise ClientBusy(held, self.per_client)
            self._seq += 1
            entry = _Entry(job, work, contextvars.copy_context(), client, self._seq)
            self._pending += 1
            self._held[client] = self._held.get(client, 0) + 1
            self._queues.setdefault(client, deque()).append(entry)
            if len(self._workers) < self.slots:  # started on first use, then kept
                for _ in range(self.slots - len(self._workers)):
                    worker = threading.Thread(
                        target=self._serve, name=f"recap-decode-{len(self._workers)}", daemon=True
                    )
                    self._workers.append(worker)
                    worker.start()
            self._lock.notify()
            job._entry = entry
        job._withdraw = lambda: self._withdraw(entry)
        return job

    def shutdown(self) -> None:
        """Stop the workers once their work is done; waiting work is cancelled and ends."""
        with self._lock:
            self._closed = True
            left = [entry for entries in self._queues.values() for entry in entries]
            self._queues.clear()
            for entry in left:
                self._release(entry)
            self._lock.notify_all()
        for entry in left:
            entry.job.cancel("shutdown")
            self._ended(entry)

    # ------------------------------------------------------------------------------- the line
    def _serve(self) -> None:
        """A worker: take the next turn, run it, until shut down."""
        while True:
            with self._lock:
                while not self._queues and not self._closed:
                    self._lock.wait()
                if not self._queues:  # closed, nothing left
                    return
                entry = self._next_turn()
            self._run(entry)

    def _next_turn(self) -> _Entry:
        """The head of the waiting client whose work started least recently (then: who came first);
        it is running from now on (called with the lock held, some work waiting)."""
        client = min(self._queues, key=lambda c: (self._turns.get(c, 0), self._queues[c][0].seq))
        entries = self._queues[client]
        entry = entries.popleft()
        if not entries:
            del self._queues[client]
        self._turn += 1
        self._turns[client] = self._turn
        if len(self._turns) > self.REMEMBERED + len(self._held):  # forget the idle half, oldest first
            idle = sorted((t, c) for c, t in self._turns.items() if c not in self._held)
            for _, old in idle[: len(idle) // 2 + 1]:
                del self._turns[old]
        entry.state = "running"
        self._running += 1
        return entry

    def _run(self, entry: _Entry) -> None:
        """One turn of ``entry`` in this worker's slot."""
        job, done = entry.job, True
        job.started.set()
        try:
            job.check()
            if entry.steps is None:
                result = entry.context.run(entry.work, job)
                if inspect.isgenerator(result):
                    entry.steps = result
                else:
                    job.result = result
            if entry.steps is not None:
                done = self._turns_of(entry)
        except Cancelled:
            pass
        except BaseException as error:  # handed to the handler, which words it
            job.put("error", error)
        finally:
            if done:
                with self._lock:
                    self._release(entry)
                    self._lock.notify()
                self._ended(entry)

    def _turns_of(self, entry: _Entry) -> bool:
        """Advance a generator's work until it ends (True) or, its turn over, gives its slot to another
        client's waiting work (False: it waits at the head of its client's queue)."""
        steps, turn_ends = entry.steps, time.monotonic() + self.turn_s
        while True:
            entry.job.check()
            try:
                entry.context.run(next, steps)
            except StopIteration as stop:
                entry.job.result = stop.value
                return True
            if time.monotonic() < turn_ends:
                continue
            with self._lock:
                if any(client != entry.client for client in self._queues) and not self._closed:
                    entry.state = "waiting"
                    self._running -= 1
                    self._queues.setdefault(entry.client, deque()).appendleft(entry)
                    self._lock.notify()
                    return False

    def _withdraw(self, entry: _Entry) -> None:
        """A cancelled job that still waits leaves the line at once (a running one stops at its next
        step)."""
        with self._lock:
            entries = self._queues.get(entry.client)
            if entry.state != "waiting" or entries is None or entry not in entries:
                return
            entries.remove(entry)
            if not entries:
                del self._queues[entry.client]
            self._release(entry)
            self._lock.notify()
        self._ended(entry)

    def _release(self, entry: _Entry) -> None:
        """``entry`` is done: its place and its client's count go back (called with the lock held)."""
        if entry.state == "running":
            self._running -= 1
        entry.state = "done"
        self._pending -= 1
        held = self._held[entry.client] - 1
        if held:
            self._held[entry.client] = held
        else:
            del self._held[entry.client]

    @staticmethod
    def _ended(entry: _Entry) -> None:
        """Tell the handler (outside the lock); a generator's work left between turns is closed."""
        if entry.steps is not None:
            with contextlib.suppress(Exception):
                entry.steps.close()
        entry.job.ended.set()
        entry.job.put("end")


class Busy(Exception):
    """The line of waiting work is full."""

    def __init__(self, pending: int) -> None:
        super().__init__(f"{pending} runs are decoding or waiting")
        self.pending = pending

    @property
    def message(self) -> str:
        """What the visitor is told."""
        return f"The studio is busy ({self.pending} runs are decoding or waiting): try again in a minute."


class ClientBusy(Busy):
    """A client already holds its share of the line (``cap`` pieces queued or running)."""

    def __init__(self, held: int, cap: int) -> None:
        super().__init__(held)
        self.cap = cap

    @property
    def message(self) -> str:
        runs = "1 run" if self.cap == 1 else f"{self.cap} runs"
        return f"You already have {runs} decoding or waiting: wait for one to finish or press Stop."


class WaitingLine:
    """What a handler's status line says at its heartbeats while its job waits for a slot: ``describe()``
    (the line's length; None once the job has its slot), then "Starting…" once, at the first heartbeat
    after the job got its slot, unless the handler showed another update since (`shown_other`): a
    waiting line never outlives the wait."""

    STARTING = "Starting…"

    def __init__(self, describe: Callable[[], str | None]) -> None:
        self.describe, self._waiting_shown = describe, False

    def status(self) -> str | None:
        """The status to show now, or None: nothing new."""
        line = self.describe()
        if line is not None:
            self._waiting_shown = True
            return line
        if self._waiting_shown:
            self._waiting_shown = False
            return self.STARTING
        return None

    def shown_other(self) -> None:
        """The handler showed another update (the waiting line is gone from the page)."""
        self._waiting_shown = False

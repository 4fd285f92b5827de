"""Fair use of the decode slots: a bounded line of decoding work served in turns across clients, one
run per session, and a display paced outside the slots.

- `DecodeSlots`: at most ``slots`` pieces of decoding work at once (fixed worker threads) and at most
  ``waiting`` more in line; beyond that, work is refused with a message ("the studio is busy"). The
  line is fair across clients (`client_key`: a visitor's address, not their session): each client has
  its own first-come-first-served queue, and a free slot goes to the waiting client whose work started
  least recently, so a client's first run waits for the work already running and at most one piece
  of each other waiting client's. A client holds at most ``per_client`` pieces queued or running across
  all its sessions (`ClientBusy` beyond). Runs, comparisons and sensitivity passes all go through it.
  A slot holds a run while it loads, checks and decodes its input at full speed, nothing longer; a
  comparison gives its slot back between its methods when another client waits (its work is a
  generator: each ``yield`` is such a point).
- `DecodeJob`: one piece of work, produced in a slot (a worker thread puts its items) and consumed by
  its event's handler: an async one (`next`, `outcome`; a run paces its steps out to the visitor with
  `paced` after the slot is free) or a sync one in a thread of its own (`take`, `values`).
- `SessionJobs`: a session has at most one job queued or running per event: a newer one replaces it
  (the older one stops at its next step and ends with a message saying so).
- `Tickets`: a fixed number of paced displays at once (a run's handler lives as long as its display).
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
import hashlib
import inspect
import ipaddress
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("recap.studio")

#: What a worker puts for its handler: ``("status", text)``, ``("step", record)``, ``("error", exception)``;
#: ``("cancelled", reason)`` once cancelled; ``("end", None)`` always comes last.
Item = tuple[str, Any]
#: The client of work submitted without one (a caller outside any request).
NO_CLIENT = "-"


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
        self._entry: _Entry | None = None  # the job in the slots' care
        self.client = client
        self.reason = ""
        self.result: Any = None  # what the work returned
        self.started = threading.Event()  # the job has had a slot
        self.ended = threading.Event()  # the job gave its slot back for good

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
        while True:
            kind, _ = _raised(*await self.next())
            if kind == "end":
                return self.result

    def values(self) -> Iterator[Any]:
        """The ``("step", value)`` items' values as they come (a sync handler), until the work ends; a
        worker's error is raised, a cancelled job raises `Cancelled` with its reason."""
        while True:
            kind, value = self.take()
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


def client_key(request: Any, hops: int = 0) -> str:
    """Who sent ``request`` (a ``gr.Request``), for the per-client bounds: its peer address, or behind
    ``hops`` trusted reverse proxies the ``hops``-th address from the right of ``X-Forwarded-For`` (the
    one the outermost trusted proxy appended, which a client cannot forge: whatever it sends itself
    stays to the left); the peer address when the header has fewer entries. An IPv6 address counts by
    its /64 network (one host is given a whole /64). Never shown, never logged in clear (`key_hash`)."""
    if request is None:
        return NO_CLIENT
    host = ""
    with contextlib.suppress(Exception):  # a request without a peer (a test client, a closed socket)
        host = str(request.client.host or "")
    if hops > 0:
        entries = [entry.strip() for entry in _forwarded_for(request)]
        if len(entries) >= hops and entries[-hops]:
            host = entries[-hops]
    if not host:
        return NO_CLIENT
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host.strip("[]"))
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:
                return str(address.ipv4_mapped)
            return str(ipaddress.IPv6Network((address, 64), strict=False))
        return str(address)
    return host


def _forwarded_for(request: Any) -> list[str]:
    """Every ``X-Forwarded-For`` entry of ``request``, left to right (several header lines joined)."""
    try:
        headers = request.headers
    except Exception:  # no headers at all
        return []
    if headers is None:
        return []
    if hasattr(headers, "getlist"):  # starlette's headers: one value per header line
        lines = headers.getlist("x-forwarded-for")
    else:  # a plain mapping (gradio's copy of a request)
        lines = [value for name, value in dict(headers).items() if str(name).lower() == "x-forwarded-for"]
    return [entry for line in lines for entry in str(line).split(",")]


def key_hash(client: str) -> str:
    """A short hash of a client key, for logs."""
    return hashlib.sha256(client.encode("utf-8", "replace")).hexdigest()[:10]


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
    across clients (see the module docstring)."""

    #: Clients whose last turn is remembered beyond those with work in the line (the oldest go first).
    REMEMBERED = 4096

    def __init__(self, slots: int, waiting: int, per_client: int | None = None) -> None:
        if slots < 1 or waiting < 0 or (per_client is not None and per_client < 1):
            raise ValueError(
                f"need slots >= 1, waiting >= 0 and per_client >= 1, got {slots}, {waiting}, {per_client}"
            )
        self.slots, self.waiting, self.per_client = slots, waiting, per_client
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
        """Advance a generator's work until it ends (True) or gives its slot to another client's
        waiting work (False: it waits at the head of its client's queue)."""
        steps = entry.steps
        while True:
            entry.job.check()
            try:
                entry.context.run(next, steps)
            except StopIteration as stop:
                entry.job.result = stop.value
                return True
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


class Tickets:
    """At most ``count`` of something at once, never waited for: `take` says whether one was free."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._lock = threading.Lock()
        self._taken = 0

    def take(self) -> bool:
        with self._lock:
            if self._taken >= self.count:
                return False
            self._taken += 1
            return True

    def give(self) -> None:
        with self._lock:
            self._taken = max(0, self._taken - 1)

    @property
    def taken(self) -> int:
        with self._lock:
            return self._taken


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

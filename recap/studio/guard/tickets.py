"""Tickets: how many of one kind of work run at once, in all and per client, with a rest per client.

- `Tickets`: the paced displays (a display lasts after its run's slot is free, so the decode line's own
  bounds do not count it; beyond its tickets a run is shown as it decodes), and drawing from stored
  traces (a replay, read and drawn, is refused at once beyond them; a step's view waits a few seconds
  for its turn, `Tickets.wait_take`), each client resting after a costly drawing.
- `RenderBudget`: the paced displays of every run in the process share a part of one CPU (each update
  renders plotly figures, tens of ms), so a crowd of slow displays cannot starve the decodes.
"""

from __future__ import annotations

import asyncio
import threading
import time


class Tickets:
    """At most ``total`` of something at once, at most ``per_client`` of them per client (None: no
    such bound): paced displays (a run without a ticket is shown without the delay) and replays being
    read (a replay without one is refused). `take` never waits. With a ``share``, a client whose work
    took ``t`` seconds rests ``t / share - t`` seconds before its next ticket (`give`'s ``seconds``), so
    one client's work back to back uses at most that share of the server's time."""

    def __init__(self, total: int, per_client: int | None = None, share: float | None = None) -> None:
        bad_share = share is not None and not 0 < share <= 1
        if total < 1 or (per_client is not None and per_client < 1) or bad_share:
            raise ValueError(f"need total, per_client >= 1, 0 < share <= 1: {total}, {per_client}, {share}")
        self.total, self.per_client, self.share = total, per_client, share
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # each client's tickets
        self._rest: dict[str, float] = {}  # each resting client's time (monotonic) of its next ticket
        self._waiting: set[str] = set()  # clients with a `wait_take` waiting (one each)

    def take(self, client: str) -> bool:
        """A ticket for one of ``client``'s displays, if both bounds allow it (then `give` it back)."""
        with self._lock:
            held = self._held.get(client, 0)
            if self._rest.get(client, 0.0) > time.monotonic():
                return False
            if sum(self._held.values()) >= self.total:
                return False
            if self.per_client is not None and held >= self.per_client:
                return False
            self._held[client] = held + 1
            return True

    def give(self, client: str, seconds: float = 0.0) -> None:
        """``client``'s display has ended: its ticket goes back (after the rest its ``seconds`` earn)."""
        with self._lock:
            held = self._held.get(client, 0)
            if held <= 0:
                raise RuntimeError("a display ticket was given back that was never taken")
            if held == 1:
                del self._held[client]
            else:
                self._held[client] = held - 1
            if self.share is not None and seconds > 0:
                now = time.monotonic()
                if len(self._rest) > 10_000:  # forget the clients that rest no more
                    self._rest = {c: t for c, t in self._rest.items() if t > now}
                self._rest[client] = now + seconds * (1 / self.share - 1)

    async def wait_take(self, client: str, patience_s: float, poll_s: float = 0.05) -> str | None:
        """`take` a ticket for ``client``, waiting up to ``patience_s`` seconds for its rest to end, its
        own ticket to come back or another client's to free (polled every ``poll_s``; nothing else is
        held meanwhile): None once taken, else why not: ``"waiting"`` (the client already has a
        call waiting here: one at a time, so its calls cannot fill the event's workers), ``"resting"``
        (its rest outlasts the patience), ``"busy"`` (no ticket came free in time)."""
        with self._lock:
            if client in self._waiting:
                return "waiting"
            self._waiting.add(client)
        try:
            deadline = time.monotonic() + patience_s
            while not self.take(client):
                rest = self.resting(client)
                if time.monotonic() + rest > deadline:
                    return "resting" if rest > 0 else "busy"
                await asyncio.sleep(max(min(rest, 1.0), poll_s))
            return None
        finally:
            with self._lock:
                self._waiting.discard(client)

    def resting(self, client: str) -> float:
        """Seconds before ``client`` may take a ticket again after its last work (0: now)."""
        with self._lock:
            return max(0.0, self._rest.get(client, 0.0) - time.monotonic())

    def held(self, client: str | None = None) -> int:
        """Tickets held now: by ``client``, or in all."""
        with self._lock:
            return self._held.get(client, 0) if client is not None else sum(self._held.values())


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

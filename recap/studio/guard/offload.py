"""Drawing from stored traces in a worker process, at a low priority.

Reading, parsing and drawing an uploaded trace, or one step of a stored one, is CPU work in Python:
in the server's interpreter it held the interpreter lock against a visitor's decoding (a 32-token run
took two to three times as long beside a replay's drawing, though the drawing waited for running
decodes first). `DrawingWorker` does such work (an `Offscreen`: a module-level function and its
arguments, which pickle) in one worker process under ``os.nice``, so the server's interpreter only
passes bytes: the arguments in, the drawn values (HTML, figures' JSON, bounded by
`recap.studio.ui.drawing`) out. The worker is a fresh interpreter (``spawn``: no copy of the
server's threads), gives its freed memory back after each piece of work, is replaced if it dies (that
drawing is refused, never redone in the server), and ends when the server does; its queue is bounded
by the drawing tickets (`recap.studio.guard.tickets`, `Studio.replays`), which admit a few pieces at
once. With ``processes=0`` the work runs in the caller's thread (what the tests that patch a drawing
function, or measure a drawing's memory, use).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from recap.studio.guard.sessions import release_memory

log = logging.getLogger(__name__)

#: How much lower the worker's priority is than the server's (``os.nice``): a visitor's decoding on
#: the same cores goes first.
WORKER_NICENESS = 10


#: What a drawing whose worker died is told (the worker is replaced for the next one).
WORKER_LOST = "The studio's drawing worker stopped while drawing this: try again."


class WorkerLost(Exception):
    """The drawing worker died while it drew (killed, out of memory)."""


@dataclass(frozen=True)
class Offscreen:
    """Work a worker process can do: ``function(*args)``, both picklable (a module-level function).
    ``release``: give the memory it allocated back to the system after it (a replay's parsing)."""

    function: Callable[..., Any]
    args: tuple = ()
    release: bool = False

    def __call__(self) -> Any:
        return _done(self)


def _done(work: Offscreen) -> Any:
    """``work`` done here (in the worker, or in the caller's thread without one)."""
    try:
        return work.function(*work.args)
    finally:
        if work.release:
            release_memory()


def _timed(work: Callable[[], Any]) -> tuple[Any, float]:
    """``work()`` and the CPU seconds this thread spent on it (waiting for the CPU not counted)."""
    start = time.thread_time()
    result = work()
    return result, time.thread_time() - start


def _started(niceness: int, modules: Sequence[str], server: int) -> None:
    """The worker's start: a lower priority, one thread for torch, the drawing modules imported, and a
    watch that ends it once the ``server`` process is gone (a killed server leaves no worker)."""
    os.nice(niceness)
    threading.Thread(target=_watch, args=(server,), name="server-watch", daemon=True).start()
    import torch

    torch.set_num_threads(1)
    for name in modules:
        importlib.import_module(name)


def _watch(server: int, every_s: float = 1.0) -> None:
    """End this process once ``server`` is gone (checked every ``every_s`` seconds)."""
    while True:
        time.sleep(every_s)
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # (a process of another user took its number: the server is gone)
            os._exit(0)


@dataclass
class DrawingWorker:
    """One worker process for `Offscreen` work (``processes=0``: none, the work runs in the caller's
    thread). The process starts on the first piece of work, or at `start`."""

    processes: int = 1
    niceness: int = WORKER_NICENESS
    modules: tuple[str, ...] = ()  #: imported as the worker starts (the drawing code)
    _pool: ProcessPoolExecutor | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def start(self) -> None:
        """Start the worker now (it imports `modules`), so that the first drawing does not wait. A
        worker that cannot start is logged, and the drawings are done in the server instead."""
        if self.processes <= 0:
            return
        try:
            self._executor().submit(int).result()
        except Exception:  # (BrokenProcessPool, OSError: no process can be started here)
            log.exception("the drawing worker did not start: drawings are done in the server's threads")
            self.shutdown()
            self.processes = 0

    def run(self, work: Callable[[], Any]) -> Any:
        """``work()``: in the worker if it is `Offscreen` and there is one, else in this thread.
        Raises `WorkerLost` if the worker died meanwhile (the next piece of work starts another)."""
        return self.timed(work)[0]

    def timed(self, work: Callable[[], Any]) -> tuple[Any, float]:
        """`run`, with the CPU seconds the work took where it ran: what it cost the server, whatever
        the time it waited for a CPU beside other processes (the worker runs at a low priority)."""
        if not isinstance(work, Offscreen) or self.processes <= 0:
            return _timed(work)
        try:
            return self._executor().submit(_timed, work).result()
        except BrokenProcessPool:
            log.warning("the drawing worker died while drawing: the next drawing starts a new one")
            self.shutdown()
            raise WorkerLost(WORKER_LOST) from None

    def shutdown(self) -> None:
        """Stop the worker (a later piece of work starts another)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                spawn = multiprocessing.get_context("spawn")  # (a fresh interpreter: no server threads)
                self._pool = ProcessPoolExecutor(
                    self.processes,
                    mp_context=spawn,
                    initializer=_started,
                    initargs=(self.niceness, self.modules, os.getpid()),
                )
            return self._pool

"""`Guard`: the public Space's guard, applied once around each of the studio's plain handlers.

The teaching UI's handlers (`recap.studio.ui`) are plain functions and generators over step records:
they admit checked values, decode, and draw. `Guard.wrap(handler, kind)` is the one place where, at
wiring time, a handler gets what a public Space needs around it, by its kind:

- ``"run"``: the Run button. The settings are checked, then the display delay and the input; the
  session's memories are swept into the budget; the handler's decoding is queued in the decode line
  (fair across clients, bounded per client, one job per session and event) and checked for Stop
  between its items; its steps are paced out under a display ticket and the shared render budget.
- ``"compare"``: the Compare button, queued and stopped the same way; its updates show as they come.
- ``"view"``: a drawing from a stored trace (a step's view, a download), under a drawing ticket of its
  client, after any running decode.
- ``"replay"``: an uploaded trace, read and checked in full under a replay ticket, then drawn.
  Drawing from a trace (a replay, a step's view) is done in the studio's drawing worker, a process
  at a low priority (`recap.studio.guard.offload`), so that it does not hold the interpreter lock
  against a visitor's decoding.
- ``"upload"``: an image dropped in the Image box, refused as it lands if it is not usable.
- ``"checked"``: any other handler: a ``ValueError`` it raises becomes a refusal.

In every kind a ``ValueError`` raised while admitting untrusted values is a one-line refusal. The guard
imports nothing of the UI: what it shows comes from the handler (`PacedHandler`, `StreamedHandler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import gradio as gr

from recap.studio.environment import REPLAY_CONCURRENCY
from recap.studio.guard.decode_line import WaitingLine
from recap.studio.guard.jobs import HEARTBEAT_S, Cancelled, DecodeJob, paced
from recap.studio.guard.offload import Offscreen, WorkerLost
from recap.studio.guard.trace_files import read_trace
from recap.studio.guard.validation import (
    MAX_TOTAL_DELAY_S,
    RunSettings,
    display_delay_s,
    refusal,
    toast_text,
    upload_problem,
    with_settings_api,
)

Kind = Literal["run", "compare", "view", "replay", "upload", "checked"]

#: Minimum seconds between two streamed updates of a run (all runs together also share `Studio.updates`).
MIN_UPDATE_INTERVAL = 0.1
#: Seconds a step's view waits for its drawing ticket (its client's rest after its last drawing, or
#: another client's drawing) before it is refused; a drawing is bounded (`recap.studio.ui.drawing`).
VIEW_PATIENCE_S = 10.0
#: Why a step's view was refused, by `recap.studio.guard.tickets.Tickets.wait_take`'s answer.
VIEW_REFUSED = {
    "waiting": "Your previous step view is still being drawn: wait for it to show.",
    "resting": "Your last replay or step view took a while to draw: wait a few seconds before the next.",
    "busy": "The studio is drawing as many replays and steps as it draws at once: try again in a moment.",
}
#: A replay refused for want of a ticket (`Studio.replays`): every reader is busy, or this client's is.
REPLAYS_BUSY = (
    f"The studio is reading {REPLAY_CONCURRENCY} replays, as many as it reads at once: try again in a "
    "few seconds."
)
REPLAY_HELD = "Your previous replay is still being read: wait for it to show before sending another."


@dataclass(frozen=True)
class Checked:
    """A decoding request's values after the guard's checks: the input, its settings, the image's path
    on the server (None without one), whether the session's memories had been dropped while idle, and
    the display delay asked (as sent; a paced kind only)."""

    image: object
    prompt: str
    settings: RunSettings
    path: Path | None
    restarted: bool
    delay_ms: object = 0


class PacedHandler(Protocol):
    """A decoding handler whose steps are paced out to its visitor (the Run button)."""

    event: str  #: the session's job this replaces (one per session and event)
    replaced: str  #: the refusal of a request replaced by a newer one of its session
    extras: tuple[tuple[str, object], ...]  #: API parameters after the delay, as ``(name, default)``

    def admit(self, checked: Checked, *extras) -> Any:
        """The admitted request (its ``steps`` list receives the records); ValueError: refused."""

    def work(self, admitted) -> Generator[Any, None, Any]:
        """In a decode slot: status lines (str) and step records; returns the result."""

    def started(self, admitted) -> dict: ...
    def status(self, admitted, line) -> dict: ...
    def progress(self, admitted, shown: int) -> dict: ...
    def ended(self, admitted, result, stopped: bool, hurried: str) -> dict: ...


class StreamedHandler(Protocol):
    """A decoding handler whose updates show as its work makes them (the Compare button)."""

    event: str
    replaced: str
    extras: tuple[tuple[str, object], ...]

    def admit(self, checked: Checked, *extras) -> Any: ...
    def work(self, admitted, check: Callable[[], None]) -> Generator[Any, None, Any]: ...
    def started(self, admitted, line: str) -> dict: ...
    def status(self, admitted, line: str | None) -> dict: ...


class Guard:
    """The guard of one studio (`recap.studio.serving.Studio`: its decode line, jobs, tickets and
    sessions), applied around handlers at wiring time by `wrap`."""

    def __init__(self, studio) -> None:
        self.studio = studio

    def wrap(self, handler, kind: Kind) -> Callable:
        """``handler`` as gradio calls it, with the guard of its ``kind`` around it (module docstring)."""
        wrappers = {
            "run": self._paced,
            "compare": self._streamed,
            "view": self._view,
            "replay": self._replay,
            "upload": self._upload,
            "checked": self._checked,
        }
        return wrappers[kind](handler)

    def stop(self, event: str) -> Callable:
        """A Stop button's handler: the session's job of ``event`` (if any) is marked stopped and
        cancelled (its worker stops at its next step, or it leaves the line)."""

        def stop(request: gr.Request):
            if (job := self.studio.in_flight(request, event)) is not None:
                job.stopped.set()
                job.cancel("stopped")

        return stop

    # ------------------------------------------------------------------------------- decoding
    def _admitted(
        self, handler, image, prompt, settings: RunSettings, extras: tuple, request, delay_ms: object = 0
    ) -> Any:
        """The input checked against ``settings`` (a bad value is a refusal before anything waits in
        line), then admitted by ``handler`` with its ``extras`` (a ValueError: a refusal)."""
        studio = self.studio
        path, _, _ = studio.check_request(image, prompt, settings)
        session = request.session_hash if request is not None else None
        checked = Checked(image, prompt, settings, path, studio.sessions.restarted(session), delay_ms)
        try:
            return handler.admit(checked, *extras)
        except ValueError as error:
            raise refusal(str(error)) from None

    def _submit(self, request, event: str, items: Callable[[DecodeJob], Iterator]) -> DecodeJob:
        """Queue the handler's work in the decode line as the session's job of ``event``."""
        return self.studio.submit(request, event, lambda job: _pumped(job, items(job)))

    def _paced(self, handler: PacedHandler) -> Callable:
        guard, studio = self, self.studio

        async def run(image, prompt, *rest, request: gr.Request = None):
            values, extras = _split(rest, len(handler.extras))
            *values, delay_ms = values
            settings = studio.settings(values)  # (refused first, then the delay, then the input)
            try:
                delay_s = display_delay_s(delay_ms)
            except ValueError as error:
                raise refusal(str(error)) from None
            admitted = guard._admitted(handler, image, prompt, settings, extras, request, delay_ms)
            await asyncio.to_thread(studio.sessions.sweep, request.session_hash if request else None)
            job = guard._submit(request, handler.event, lambda job: handler.work(admitted))
            # a paced display outlives its slot: at most `Studio.displays` at once, in all and per
            # client; the others show at once
            slowed = delay_s > 0 and studio.displays.take(job.client)
            try:
                with studio.awaiting(request, handler.event, job, handler.replaced):
                    async for shown in guard._display(handler, admitted, job, delay_s if slowed else 0.0):
                        yield shown
            except Cancelled as stop:  # Stop cancelled the job: the handler's last update says so
                if stop.args[:1] != ("stopped",):
                    raise
            finally:
                if slowed:
                    studio.displays.give(job.client)
            hurried = ""
            if delay_s > 0 and not slowed:
                hurried = (
                    " Shown without the display delay: the studio is pacing as many displays as it can"
                    f" ({studio.displays.per_client} a visitor)."
                )
            stopped = job.stopped.is_set()
            yield await asyncio.to_thread(handler.ended, admitted, job.result, stopped, hurried)

        run.__doc__ = _api_doc(handler)
        return with_settings_api(run, ("delay_ms", 0), *handler.extras)

    async def _display(self, handler: PacedHandler, admitted, job: DecodeJob, delay_s: float):
        """A run's updates while it decodes: the handler's first update, then the waiting line's
        status, then the steps as `paced` lets them show (each drawn in a thread, its time counted
        against the shared render budget); nothing more once its visitor pressed Stop."""
        yield handler.started(admitted)
        waiting, steps = self.studio.waiting_line(job), admitted.steps
        if line := waiting.status():
            yield handler.status(admitted, line)
        budget = self.studio.updates
        async for due in paced(
            job, steps, delay_s, MAX_TOTAL_DELAY_S, MIN_UPDATE_INTERVAL, budget, HEARTBEAT_S
        ):
            if due.idle:  # a yield, so that gradio can stop the event if its visitor left
                yield handler.status(admitted, waiting.status() or gr.skip())
                continue
            waiting.shown_other()
            if job.stopped.is_set():  # (an update after Stop's status would overwrite it)
                return
            if due.status is not None:
                yield handler.status(admitted, due.status)
            elif not due.final:
                begun = time.monotonic()
                view = await asyncio.to_thread(handler.progress, admitted, due.shown)
                budget.spent(time.monotonic() - begun)
                if job.stopped.is_set():
                    return
                yield view

    def _streamed(self, handler: StreamedHandler) -> Callable:
        guard, studio = self, self.studio

        def compare(image, prompt, *rest, request: gr.Request = None):
            values, extras = _split(rest, len(handler.extras))
            admitted = guard._admitted(handler, image, prompt, studio.settings(values), extras, request)
            job = guard._submit(request, handler.event, lambda job: handler.work(admitted, job.check))
            try:
                with studio.awaiting(request, handler.event, job, handler.replaced):
                    waiting = studio.waiting_line(job)
                    yield handler.started(admitted, waiting.status() or WaitingLine.STARTING)
                    for update in job.values(HEARTBEAT_S):
                        if update is None:  # a yield, so that gradio can stop the event if its visitor left
                            yield handler.status(admitted, waiting.status())
                        else:
                            waiting.shown_other()
                            yield update
            except Cancelled as stop:  # Stop: its own status says so
                if stop.args[:1] != ("stopped",):
                    raise

        compare.__doc__ = _api_doc(handler)
        return with_settings_api(compare, *handler.extras)

    # -------------------------------------------------------------------------------- drawing
    async def drawn(self, request, work: Callable[[], Any]) -> Any:
        """``work()`` (drawing or writing from a stored trace) under a drawing ticket of ``request``'s
        client (`Studio.replays`: it waits up to `VIEW_PATIENCE_S` for it, else a refusal saying
        why), in a thread, after any running decode (`Studio.give_way`); the client then rests as long
        as the drawing cost the server (`charged`)."""
        studio = self.studio
        client = studio.client(request)
        refused = await studio.replays.wait_take(client, VIEW_PATIENCE_S)
        if refused is not None:
            raise refusal(VIEW_REFUSED[refused])

        def ticketed():
            start, spent = time.monotonic(), None
            try:
                studio.give_way()
                drawn, spent = studio.drawing.timed(work)  # (an `Offscreen` drawing: in the drawing worker)
                return drawn
            except WorkerLost as lost:
                raise refusal(str(lost)) from None
            finally:  # (here, not in the handler: a cancelled call's thread works on to its end)
                studio.replays.give(client, charged(spent, start))

        return await asyncio.to_thread(ticketed)

    def _view(self, handler: Callable) -> Callable:
        """``handler(*inputs)`` returns the drawing to do (a refusal: ValueError); it is done `drawn`."""
        parameters = inspect.signature(handler).parameters
        takes_request, count = "request" in parameters, len(parameters) - ("request" in parameters)

        async def view(*inputs, request: gr.Request = None):
            if len(inputs) > count:  # (gradio passes the request after the inputs)
                inputs, request = inputs[:count], inputs[count]
            try:
                work = handler(*inputs, request=request) if takes_request else handler(*inputs)
            except ValueError as error:
                raise refusal(str(error)) from None
            return await self.drawn(request, work)

        return _signed(view, handler)

    def _replay_refused(self, client: str) -> str:
        """Why ``client``'s replay gets no ticket: its previous one is being read, it rests after one,
        or every reader is busy."""
        replays = self.studio.replays
        if replays.held(client):
            return REPLAY_HELD
        rest = replays.resting(client)
        if rest > 0:
            return f"Your last replay took a while to read: wait {math.ceil(rest)} s before the next one."
        return REPLAYS_BUSY

    def _replay(self, handler: Replay) -> Callable:
        """``handler.draw`` of a trace read and checked in full, in the drawing worker, under one
        replay ticket of its client, after any running decode (its rest counts reading and drawing);
        then ``handler.show`` of what it drew (of None without a file)."""
        studio = self.studio

        def replay(path, request: gr.Request = None):
            if not path:
                return handler.show(None)
            client = studio.client(request)
            if not studio.replays.take(client):
                raise refusal(self._replay_refused(client))
            start, spent = time.monotonic(), None
            try:
                studio.give_way()
                # what parsing and drawing allocated goes back to the system, refused or not
                work = Offscreen(_read_and_drawn, (path, handler.draw), release=True)
                drawn, spent = studio.drawing.timed(work)
            except WorkerLost as lost:
                raise refusal(str(lost)) from None
            finally:
                studio.replays.give(client, charged(spent, start))
            if isinstance(drawn, Unreadable):
                raise refusal(f"Cannot replay this file: {drawn.reason}")
            studio.sessions.sweep(request.session_hash if request is not None else None)
            return handler.show(drawn)

        return _signed(replay, handler.show)

    # ------------------------------------------------------------------------------- checking
    def _upload(self, handler: Callable) -> Callable:
        """An uploaded file that is not a usable image is refused as it lands: a warning, the box
        emptied; a usable one goes to ``handler``."""

        def check(value):
            problem = upload_problem(value, self.studio.upload_roots)
            if problem is None:
                return handler(value)
            gr.Warning(toast_text(problem))
            return None

        return check

    def _checked(self, handler: Callable) -> Callable:
        """``handler`` with a ``ValueError`` it raises turned into a refusal."""

        def checked(*inputs):
            try:
                return handler(*inputs)
            except ValueError as error:
                raise refusal(str(error)) from None

        checked.__signature__ = inspect.signature(handler)
        checked.__doc__, checked.__name__ = handler.__doc__, handler.__name__
        return checked


@dataclass(frozen=True)
class Replay:
    """A replay's handler, in two parts: ``draw(trace)``, a module-level function whose values pickle
    (it runs in the drawing worker), and ``show(drawn)``, the update showing them (None: no file)."""

    draw: Callable[[Any], Any]
    show: Callable[[Any], dict]


@dataclass(frozen=True)
class Unreadable:
    """An uploaded trace that `read_trace` refused, and why."""

    reason: str


def charged(spent: float | None, start: float) -> float:
    """The seconds a client's drawing is charged for its rest: the CPU time it cost the server
    (``spent``), not the time it waited beside decodes and other processes, so that a busy machine does
    not make a visitor wait longer between a replay and its first step view; the wall-clock time since
    ``start`` where the drawing failed before saying."""
    return spent if spent is not None else time.monotonic() - start


def _read_and_drawn(path: str, draw: Callable[[Any], Any]) -> Any:
    """``draw`` of the trace at ``path`` read and checked in full, or `Unreadable` (in the drawing
    worker: only the path goes in, only what ``draw`` returns comes back)."""
    try:
        trace = read_trace(path)
    except ValueError as error:
        return Unreadable(str(error))
    return draw(trace)


def _pumped(job: DecodeJob, items: Iterator) -> Generator[None, None, Any]:
    """A handler's decoding ``items`` handed to its job: a status line (str) at once, a step or an
    update (anything else) followed by a turn point (the slot may go to another client's waiting work,
    as after a None); Stop is checked after every item. Returns what the items returned."""
    with contextlib.closing(items):  # (a cancelled job closes the handler's decoding at once)
        while True:
            try:
                item = next(items)
            except StopIteration as end:
                return end.value
            job.check()
            if isinstance(item, str):
                job.put("status", item)
                continue
            if item is not None:
                job.put("step", item)
            yield


def _api_doc(handler) -> str:
    """What the API page says of a decoding handler: its docstring's first paragraph."""
    return inspect.cleandoc(handler.__doc__ or "").split("\n\n")[0]


def _split(values: tuple, count: int) -> tuple[list, tuple]:
    """``values`` as the settings' values and the last ``count`` (a handler's extras)."""
    cut = len(values) - count
    return list(values[:cut]), tuple(values[cut:])


def _signed(wrapper: Callable, handler: Callable) -> Callable:
    """``wrapper`` declared with ``handler``'s parameters and gradio's request last (how gradio
    counts the inputs and finds where to pass the request)."""
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [p for name, p in inspect.signature(handler).parameters.items() if name != "request"]
    request = inspect.Parameter("request", keyword, default=None, annotation=gr.Request)
    wrapper.__signature__ = inspect.Signature([*parameters, request])
    wrapper.__annotations__ = {"request": gr.Request}
    wrapper.__doc__, wrapper.__name__ = handler.__doc__, handler.__name__
    return wrapper

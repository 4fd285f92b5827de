"""The Run tab's traces: Download writes the last run's trace for the browser to fetch, and a trace file
dropped on *Replay a run* fills the answer and the step panel again, with no model (`recap.trace`,
`recap.studio.exports`). Wired like `recap.studio.handlers`' events, whose panels they fill."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import replace

import gradio as gr

from recap.studio import render
from recap.studio.environment import REPLAY_CONCURRENCY, REPLAY_EVENTS, model_label
from recap.studio.exports import TraceExports, read_trace
from recap.studio.handlers import (
    NO_RUN_YET,
    RESULT_OUTPUTS,
    VIEW_PATIENCE_S,
    VIEW_REFUSED,
    panels,
    serialized,
)
from recap.studio.serving import Studio
from recap.studio.sessions import release_memory
from recap.studio.validation import markdown_text, refusal
from recap.trace import PackedSteps, RunTrace

#: Run in the browser after the Download click's handler: fetch the file it wrote, as a download.
_DOWNLOAD_JS = """
(file) => {
  if (file && file.url) {
    const link = document.createElement("a");
    link.href = file.url;
    link.download = file.orig_name || "recap-run.json";
    document.body.appendChild(link);
    link.click();
    link.remove();
  }
  return [];
}
"""


def wire_download(studio: Studio, ui: dict, run_state, exports: TraceExports) -> None:
    # Holds the session's id after a download; gradio deletes it max_age_s after the last one
    # and calls back, so the exports of a session that never closes a tab (an API client) go too.
    owner = gr.State(None, time_to_live=exports.max_age_s, delete_callback=exports.remove_session)

    async def download(state, request: gr.Request):
        """Write the last run's trace for this session (it is removed when the session ends): a replayed
        trace's JSON can be megabytes, so it is written under a drawing ticket, as a step's view."""
        if not isinstance(state, dict) or not state["trace"].steps:
            raise refusal(NO_RUN_YET)
        session = request.session_hash or "no-session"
        client = studio.client(request)
        refused = await studio.replays.wait_take(client, VIEW_PATIENCE_S)
        if refused is not None:
            raise refusal(VIEW_REFUSED[refused])

        def write() -> str:
            start = time.monotonic()
            try:
                return str(exports.write(session, state["trace"]))
            finally:
                studio.replays.give(client, time.monotonic() - start)

        return await asyncio.to_thread(write), session

    ui["download"].click(
        download,
        [run_state],
        [ui["download_file"], owner],
        api_name="download",
        concurrency_limit=REPLAY_EVENTS,
        concurrency_id="replay",
    ).then(None, [ui["download_file"]], None, js=_DOWNLOAD_JS)


def forget_exports(exports: TraceExports) -> Callable[[gr.Request], None]:
    def forget(request: gr.Request) -> None:
        """The tab closed: its downloaded traces (they hold its prompts) go now."""
        if request is not None and request.session_hash:
            exports.remove(request.session_hash)

    return forget


def replay_status(trace: RunTrace) -> str:
    """The status line of a replayed trace (its method and model are the uploader's text: escaped)."""
    method = render.method_label(str(trace.settings.get("method", "?")))
    model = model_label(str(trace.settings.get("model", "?")))  # (an offered model by its shown name)
    return (
        f"Replaying a recorded {markdown_text(method, 40)} run of {markdown_text(model)} "
        f"({len(trace.steps)} steps): scrub its steps with the step slider."
    )


#: A replay refused for want of a ticket (`Studio.replays`): every reader is busy, or this client's is.
REPLAYS_BUSY = (
    f"The studio is reading {REPLAY_CONCURRENCY} replays, as many as it reads at once: try again in a "
    "few seconds."
)
REPLAY_HELD = "Your previous replay is still being read: wait for it to show before sending another."


def _replay_refused(studio: Studio, client: str) -> str:
    """Why ``client``'s replay gets no ticket: its previous one is being read, it rests after one, or
    every reader is busy."""
    if studio.replays.held(client):
        return REPLAY_HELD
    rest = studio.replays.resting(client)
    if rest > 0:
        return f"Your last replay took a while to read: wait {math.ceil(rest)} s before the next one."
    return REPLAYS_BUSY


def wire_replay(studio: Studio, ui: dict, run_state) -> None:
    def replay(path, request: gr.Request = None):
        """Show a downloaded run (its JSON trace) without a model: the answer, stats and last step. The
        file is read and drawn (the figures serialized too) under one ticket of its client: its rest
        counts both (`recap.studio.drawing` bounds the drawing)."""
        if not path:
            return {run_state: gr.skip()}
        client = studio.client(request)
        if not studio.replays.take(client):
            raise refusal(_replay_refused(studio, client))
        start = time.monotonic()
        try:
            studio.give_way()
            try:
                trace = read_trace(path)
            except ValueError as error:
                raise refusal(f"Cannot replay this file: {error}") from None
            studio.give_way()
            drawn = serialized(panels(ui, trace.steps, scrubbable=True))
            # kept for scrubbing as long as the session lives: compressed, so that no large replay keeps
            # the server grown (the records are freed below)
            trace = replace(trace, steps=PackedSteps(trace.steps))
        finally:
            spent = time.monotonic() - start
            release_memory()  # what parsing and drawing allocated goes back to the system, refused or not
            studio.replays.give(client, spent)
        prompt = str(trace.settings.get("prompt", ""))
        studio.sessions.sweep(request.session_hash if request is not None else None)
        return {
            **drawn,
            ui["status"]: replay_status(trace),
            run_state: {"trace": trace, "image": None, "prompt": prompt, "model": None, "ended": True},
            # the trace holds no pixels: clear the image so it does not pose as the replayed run's input
            ui["image"]: None,
            ui["prompt"]: prompt,
        }

    names = (*RESULT_OUTPUTS, "image", "prompt", "words")
    ui["replay"].upload(
        replay,
        [ui["replay"]],
        [*(ui[n] for n in names), run_state],
        api_name="replay",
        show_progress="hidden",
        # above the tickets, so that the replays refused are answered at once, not queued behind them
        concurrency_limit=REPLAY_EVENTS,
        concurrency_id="replay",
    ).failure(  # a refused file leaves the box, so that the next one can be dropped at once
        lambda: None, None, [ui["replay"]], api_visibility="private", show_progress="hidden", queue=False
    )

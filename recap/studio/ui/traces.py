"""A run's trace file, both ways: Download writes the last run's trace for the browser to fetch, and a
trace file dropped on *Replay a run* fills the answer and the step panel again, with no model.

A trace holds the visitor's prompt, so it is written only when Download is clicked (`TraceExports`),
in an unguessable folder of that session, and removed when the session ends. An uploaded trace is
read and checked in full by the guard around the replay (`Guard.wrap`, kind ``"replay"``) before the
handler shows it; what is drawn from it is bounded by `recap.studio.ui.drawing`. Wired like
`recap.studio.ui.handlers`' events, whose panels they fill.
"""

from __future__ import annotations

import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gradio as gr

from recap.studio.environment import REPLAY_EVENTS, model_label
from recap.studio.guard.wrapper import Guard, Replay
from recap.studio.serving import Studio
from recap.studio.ui import render
from recap.studio.ui.handlers import NO_RUN_YET, RESULT_OUTPUTS, panel_values, placed, plotted
from recap.trace import PackedSteps, RunTrace

#: Exported traces older than this are deleted at the next export, for sessions that never end
#: cleanly (API clients); a browser session's exports go when its tab closes.
TRACE_MAX_AGE_S = 3600


class TraceExports:
    """Trace files written for the Download button: one unguessable folder per session under ``root``.

    A trace holds the visitor's prompt, so it is written only when Download is clicked (`write`), and
    its folder goes when the session ends (`remove`, called by ``demo.unload`` when the tab closes), or
    `TRACE_MAX_AGE_S` after the session's last download (a ``gr.State`` expiring calls `remove_session`;
    `prune` at each export does the same for any session the state missed).
    """

    def __init__(self, root: Path, max_age_s: float = TRACE_MAX_AGE_S) -> None:
        self.root = Path(root)
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._folders: dict[str, tuple[Path, float]] = {}  # session -> (folder, time of the last export)

    def write(self, session: str, trace: RunTrace) -> Path:
        """Write ``trace`` for ``session`` (replacing its earlier export of the same method)."""
        self.prune()
        with self._lock:
            folder = self._folders.get(session, (self.root / secrets.token_hex(16), 0.0))[0]
            self._folders[session] = (folder, time.time())
        folder.mkdir(parents=True, exist_ok=True)
        method = re.sub(r"[^a-z0-9-]", "", str(trace.settings.get("method", "")))[:20] or "run"
        path = folder / f"recap-run-{method}.json"
        trace.save(path)
        return path

    def remove(self, session: str) -> None:
        """Delete ``session``'s exports (nothing if it has none)."""
        with self._lock:
            folder = self._folders.pop(session, (None, 0.0))[0]
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def remove_session(self, session: object) -> None:
        """`remove`, as a ``gr.State`` delete callback (its value: a session id, or None)."""
        if isinstance(session, str):
            self.remove(session)

    def prune(self) -> None:
        """Delete the exports of sessions whose last export is older than ``max_age_s``."""
        now = time.time()
        with self._lock:
            old = [s for s, (_, at) in self._folders.items() if now - at > self.max_age_s]
        for session in old:
            self.remove(session)

    def sessions(self) -> list[str]:
        """Sessions that have exports on disk."""
        with self._lock:
            return list(self._folders)

    def folder(self, session: str) -> Path | None:
        """The folder of ``session``'s exports, if it has any."""
        with self._lock:
            return self._folders[session][0] if session in self._folders else None


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


def wire_download(
    studio: Studio, ui: dict, run_state, exports: TraceExports, guard: Guard | None = None
) -> None:
    # Holds the session's id after a download; gradio deletes it max_age_s after the last one
    # and calls back, so the exports of a session that never closes a tab (an API client) go too.
    owner = gr.State(None, time_to_live=exports.max_age_s, delete_callback=exports.remove_session)

    def download(state, request: gr.Request):
        """Write the last run's trace for this session (it is removed when the session ends): a replayed
        trace's JSON can be megabytes, so it is written as a step's view is drawn (the guard's kind
        ``"view"``)."""
        if not isinstance(state, dict) or not state["trace"].steps:
            raise ValueError(NO_RUN_YET)
        session = request.session_hash or "no-session"
        return lambda: (str(exports.write(session, state["trace"])), session)

    ui["download"].click(
        (guard or Guard(studio)).wrap(download, "view"),
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
        f"Replaying a recorded {render.markdown_text(method, 40)} run of {render.markdown_text(model)} "
        f"({len(trace.steps)} steps): scrub its steps with the step slider."
    )


def replay_drawn(trace: RunTrace) -> tuple[tuple, RunTrace]:
    """What a replay shows of ``trace`` (`panel_values`, figures `plotted`), and the trace kept for
    scrubbing as long as the session lives: compressed, so that no large replay keeps the server
    grown. Module-level, and both picklable: the guard runs it in the drawing worker."""
    return panel_values(trace.steps, plotted), replace(trace, steps=PackedSteps(trace.steps))


def wire_replay(studio: Studio, ui: dict, run_state, guard: Guard | None = None) -> None:
    def show(drawn: tuple[tuple, RunTrace] | None) -> dict:
        """Show a downloaded run (its JSON trace) without a model: the answer, stats and last step. The
        guard (kind ``"replay"``) reads and checks the file first and draws it (`replay_drawn`), and
        bounds the time spent on both (`recap.studio.ui.drawing` bounds the drawing)."""
        if drawn is None:  # (no file)
            return {run_state: gr.skip()}
        values, trace = drawn
        prompt = str(trace.settings.get("prompt", ""))
        return {
            **placed(ui, values, len(trace.steps), scrubbable=True),
            ui["status"]: replay_status(trace),
            run_state: {"trace": trace, "image": None, "prompt": prompt, "model": None, "ended": True},
            # the trace holds no pixels: clear the image so it does not pose as the replayed run's input
            ui["image"]: None,
            ui["prompt"]: prompt,
        }

    names = (*RESULT_OUTPUTS, "image", "prompt", "words")
    ui["replay"].upload(
        (guard or Guard(studio)).wrap(Replay(replay_drawn, show), "replay"),
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

"""Run traces for the Download button and from the Replay upload.

A trace holds the visitor's prompt, so it is written only when Download is clicked (`TraceExports`),
in an unguessable folder of that session, and removed when the session ends. An uploaded trace is
read and checked in full (`read_trace`) before anything shows it.
"""

from __future__ import annotations

import re
import secrets
import shutil
import threading
import time
from pathlib import Path

from recap.trace import RunTrace

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


def read_trace(path: str | Path) -> RunTrace:
    """An uploaded trace, or a ``ValueError`` saying why it cannot be replayed (no server path in it)."""
    try:
        trace = RunTrace.load(path)
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    except OSError:
        raise ValueError("it cannot be read") from None
    if not trace.steps:
        raise ValueError("it has no steps")
    return trace

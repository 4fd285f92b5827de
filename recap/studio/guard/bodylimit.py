"""Bounds on what one HTTP request may make the server read and keep: `BodyLimit`, an ASGI middleware.

gradio reads a request's whole JSON body into memory before any studio check runs (and queues an event
whose prompt is 300 MB as readily as one of 30 characters): one client posting bodies of a few hundred
megabytes at a time could take the server's memory from every visitor. No studio request needs more
than a few hundred kilobytes (a prompt is at most 8000 characters; images and traces come as uploads),
so a body over `MAX_BODY_BYTES` is answered 413 before it is read (its ``Content-Length``) or as soon as
it passes the bound (a body sent in chunks, without one). `StudioBlocks.launch` installs the middleware,
so every server the studio starts has it.

Uploads (POSTs to a path ending in ``/upload``) are what fills the server's disk (gradio keeps them for
a day), so they are bounded before a byte is read, by what they declare: an upload must say its
``Content-Length`` (411 otherwise; browsers and HTTP clients do), at most `MAX_UPLOAD_BYTES` (413;
gradio's own ``max_file_size``, 50 MB, refuses a file before that); a client may upload at most
`UPLOAD_BUDGET_BYTES` in any `UPLOAD_WINDOW_S` seconds, counted as each upload starts, so uploads sent
at once cannot pass it together (429, with a message); and no upload is taken while the upload
folder's disk has less than `MIN_FREE_BYTES` free (503: runs on the examples and on files already
uploaded go on). An upload is never cut short here (gradio would keep the part it had written); one
its client breaks off leaves gradio a temporary file, which `sweep_stale_uploads` deletes once an hour
old.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from gradio.utils import get_upload_folder
from starlette.requests import Request

from recap.studio.environment import proxy_hops
from recap.studio.guard.clients import client_key

#: The largest request body read for any path but an upload's (a studio request is a few kilobytes).
MAX_BODY_BYTES = 1 << 20
#: The largest upload body taken (gradio's ``max_file_size``, 50 MB, refuses a file before this).
MAX_UPLOAD_BYTES = 64 << 20
#: What one client may upload in any `UPLOAD_WINDOW_S` seconds (an image is a few MB at most).
UPLOAD_BUDGET_BYTES = 256 << 20
UPLOAD_WINDOW_S = 600.0
#: No upload is taken while the upload folder's disk has less free than this.
MIN_FREE_BYTES = 512 << 20
#: gradio's temporary files of uploads broken off are deleted once this old (seconds), checked at most
#: once per `SWEEP_EVERY_S` as uploads come.
STALE_UPLOAD_S = 3600.0
SWEEP_EVERY_S = 600.0
#: What a refused request is told.
TOO_LARGE = "This request is too large for the studio (at most {limit} MiB)."
LENGTH_REQUIRED = "An upload must say its size (a Content-Length header)."
UPLOADED_TOO_MUCH = (
    "You have uploaded {used} MiB in the last {minutes} minutes, and this upload ({size} MiB) would pass"
    " the {budget} MiB a visitor may upload in that time: wait a few minutes before the next upload (the"
    " examples need none)."
)
DISK_FULL = (
    "The studio's disk is nearly full, so it takes no upload for now: try again later (the examples"
    " need none)."
)


class UploadLedger:
    """Bytes each client uploaded in the last ``window_s`` seconds (thread-safe): a running total per
    client, its entries dropped as they leave the window, every client's at least once a window."""

    def __init__(self, window_s: float = UPLOAD_WINDOW_S, clock=time.monotonic) -> None:
        self.window_s, self.clock = window_s, clock
        self._entries: dict[str, deque[tuple[float, int]]] = {}
        self._totals: dict[str, int] = {}
        self._swept = clock()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Clients with an upload in the window (after the last sweep)."""
        return len(self._entries)

    def used(self, client: str) -> int:
        with self._lock:
            self._expire(client)
            return self._totals.get(client, 0)

    def reserve(self, client: str, size: int, budget: int) -> int | None:
        """Count ``size`` bytes for ``client`` now if its window stays within ``budget`` (None), else
        count nothing and return what it used."""
        with self._lock:
            self._sweep()
            self._expire(client)
            used = self._totals.get(client, 0)
            if used + size > budget:
                return used
            if size > 0:
                self._entries.setdefault(client, deque()).append((self.clock(), size))
                self._totals[client] = used + size
            return None

    def _expire(self, client: str) -> None:
        entries = self._entries.get(client)
        if entries is None:
            return
        cutoff = self.clock() - self.window_s
        while entries and entries[0][0] < cutoff:
            self._totals[client] -= entries.popleft()[1]
        if not entries:
            del self._entries[client], self._totals[client]

    def _sweep(self) -> None:
        """Forget every client whose uploads all left the window (at most once a window)."""
        if self.clock() - self._swept < self.window_s:
            return
        self._swept = self.clock()
        for client in list(self._entries):
            self._expire(client)


def disk_free(folder: str) -> int:
    """Free bytes on the disk that holds ``folder`` (or the nearest existing folder above it)."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def sweep_stale_uploads(folder: str | Path, older_than_s: float = STALE_UPLOAD_S) -> int:
    """Delete gradio's temporary upload files (``tmp*``, directly in its upload folder) last written
    over ``older_than_s`` seconds ago: what uploads broken off leave (a finished upload's file is moved
    into a folder of its own). Returns how many were deleted."""
    deleted, cutoff = 0, time.time() - older_than_s
    with contextlib.suppress(OSError):
        for path in Path(folder).glob("tmp*"):
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime < cutoff:
                    path.unlink()
                    deleted += 1
    return deleted


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over its path's bound gets 413 with a one-line
    message, and the app never sees it; an upload without a declared size 411, one over its client's
    budget 429, one while the disk is nearly full 503 (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.uploads = UploadLedger()
        self.hops = proxy_hops()
        self._swept = -float("inf")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if scope.get("method") == "POST" and scope.get("path", "").rstrip("/").endswith("/upload"):
            if (refusal := self._upload_refusal(scope, declared)) is not None:
                await _refuse(send, *refusal)
                return
            await self.app(scope, receive, send)  # (uvicorn reads no more than the declared length)
            return
        if declared is not None and declared > MAX_BODY_BYTES:
            await _refuse(send, 413, TOO_LARGE.format(limit=MAX_BODY_BYTES >> 20))
            return
        received, started, refused = 0, False, False

        async def bounded_receive() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:  # answered here; the app is told the client left
                    refused = True
                    if not started:
                        await _refuse(send, 413, TOO_LARGE.format(limit=MAX_BODY_BYTES >> 20))
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: dict) -> None:
            nonlocal started
            if refused:  # (what the app says after its client "left" goes nowhere)
                return
            started = started or message.get("type") == "http.response.start"
            await send(message)

        await self.app(scope, bounded_receive, watched_send)

    def _upload_refusal(self, scope: dict, declared: int | None) -> tuple[int, str] | None:
        """Why an upload is refused before it is read (status, message), or None: it is counted."""
        folder = get_upload_folder()
        if time.monotonic() - self._swept >= SWEEP_EVERY_S:
            self._swept = time.monotonic()
            sweep_stale_uploads(folder)
        if declared is None:
            return 411, LENGTH_REQUIRED
        if declared > MAX_UPLOAD_BYTES:
            return 413, TOO_LARGE.format(limit=MAX_UPLOAD_BYTES >> 20)
        if disk_free(folder) < MIN_FREE_BYTES:
            return 503, DISK_FULL
        client = client_key(Request(scope), self.hops)
        used = self.uploads.reserve(client, declared, UPLOAD_BUDGET_BYTES)
        if used is None:
            return None
        minutes, budget = round(self.uploads.window_s / 60), UPLOAD_BUDGET_BYTES >> 20
        used_mib, size_mib = f"{used / (1 << 20):.1f}", f"{declared / (1 << 20):.1f}"
        return 429, UPLOADED_TOO_MUCH.format(used=used_mib, minutes=minutes, size=size_mib, budget=budget)


def _content_length(scope: dict) -> int | None:
    """The request's declared body length (None: not declared, or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
            return length if length >= 0 else None
    return None


async def _refuse(send: Any, status: int, message: str) -> None:
    """Answer ``status`` with ``message`` as plain text (gradio's page shows an upload's refusal as
    ``HTTP <status>: <body>``)."""
    body = message.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

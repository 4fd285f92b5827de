"""A bound on what one HTTP request may make the server read: `BodyLimit`, an ASGI middleware.

gradio reads a request's whole JSON body into memory before any studio check runs (and queues an event
whose prompt is 300 MB as readily as one of 30 characters): one client posting bodies of a few hundred
megabytes at a time could take the server's memory from every visitor. No studio request needs more
than a few hundred kilobytes (a prompt is at most 8000 characters; images and traces come as uploads),
so a body over `MAX_BODY_BYTES` is answered 413 before it is read (its ``Content-Length``) or as soon as
it passes the bound (a body sent in chunks, without one). Uploads (paths ending in ``/upload``) have
gradio's own bound, ``launch(max_file_size=...)``; they get `MAX_UPLOAD_BYTES`, above it, as a second
bound. `StudioBlocks.launch` installs the middleware, so every server the studio starts has it.

Uploads are also what fills the server's disk (gradio keeps them for a day): a client may upload at
most `UPLOAD_BUDGET_BYTES` in any `UPLOAD_WINDOW_S` seconds (429 beyond, with a message), and no upload
is taken while the upload folder's disk has less than `MIN_FREE_BYTES` free (503: runs on the examples
and on files already uploaded go on).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from gradio.utils import get_upload_folder
from starlette.requests import Request

from recap.studio.environment import proxy_hops
from recap.studio.line import client_key

#: The largest request body read for any path but an upload's (a studio request is a few kilobytes).
MAX_BODY_BYTES = 1 << 20
#: The largest upload body read (gradio's ``max_file_size``, 50 MB, refuses a file before this).
MAX_UPLOAD_BYTES = 64 << 20
#: What one client may upload in any `UPLOAD_WINDOW_S` seconds (an image is a few MB at most).
UPLOAD_BUDGET_BYTES = 256 << 20
UPLOAD_WINDOW_S = 600.0
#: No upload is taken while the upload folder's disk has less free than this.
MIN_FREE_BYTES = 512 << 20
#: What a refused request is told.
TOO_LARGE = "This request is too large for the studio (at most {limit} MiB)."
UPLOADED_TOO_MUCH = (
    "You have uploaded {used} MiB in the last {minutes} minutes, and a visitor may upload {budget} MiB in"
    " that time: wait a few minutes before the next upload (the examples need none)."
)
DISK_FULL = (
    "The studio's disk is nearly full, so it takes no upload for now: try again later (the examples"
    " need none)."
)


class UploadLedger:
    """Bytes each client uploaded in the last ``window_s`` seconds (thread-safe)."""

    def __init__(self, window_s: float = UPLOAD_WINDOW_S, clock=time.monotonic) -> None:
        self.window_s, self.clock = window_s, clock
        self._spent: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def used(self, client: str) -> int:
        with self._lock:
            return sum(size for _, size in self._recent(client))

    def add(self, client: str, size: int) -> None:
        with self._lock:
            self._spent.setdefault(client, deque()).append((self.clock(), size))
            self._recent(client)

    def _recent(self, client: str) -> deque[tuple[float, int]]:
        """``client``'s uploads within the window (older ones dropped; an idle client is forgotten)."""
        entries = self._spent.get(client, deque())
        while entries and entries[0][0] < self.clock() - self.window_s:
            entries.popleft()
        if not entries:
            self._spent.pop(client, None)
        return entries


def disk_free(folder: str) -> int:
    """Free bytes on the disk that holds ``folder`` (or the nearest existing folder above it)."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over its path's bound gets 413 with a one-line
    message, and the app never sees it; an upload over its client's budget 429, one while the disk is
    nearly full 503 (see the module docstring)."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES, upload_limit: int = MAX_UPLOAD_BYTES) -> None:
        self.app, self.limit, self.upload_limit = app, limit, upload_limit
        self.uploads = UploadLedger()
        self.hops = proxy_hops()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        upload = scope.get("method") == "POST" and scope.get("path", "").rstrip("/").endswith("/upload")
        limit = self.upload_limit if upload else self.limit
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, 413, TOO_LARGE.format(limit=limit >> 20))
            return
        client = client_key(Request(scope), self.hops) if upload else ""
        if upload:
            used = self.uploads.used(client)
            if used + (declared or 0) > UPLOAD_BUDGET_BYTES:
                minutes, budget = round(self.uploads.window_s / 60), UPLOAD_BUDGET_BYTES >> 20
                message = UPLOADED_TOO_MUCH.format(used=used >> 20, minutes=minutes, budget=budget)
                await _refuse(send, 429, message)
                return
            if disk_free(get_upload_folder()) < MIN_FREE_BYTES:
                await _refuse(send, 503, DISK_FULL)
                return
        received, started, refused = 0, False, False

        async def bounded_receive() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # answered here; the app is told the client left
                    refused = True
                    if not started:
                        await _refuse(send, 413, TOO_LARGE.format(limit=limit >> 20))
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: dict) -> None:
            nonlocal started
            if refused:  # (what the app says after its client "left" goes nowhere)
                return
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, watched_send)
        finally:
            if upload:
                self.uploads.add(client, received)


def _content_length(scope: dict) -> int | None:
    """The request's declared body length (None: not declared, or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Any, status: int, message: str) -> None:
    """Answer ``status`` with ``message`` as plain text (gradio's page shows an upload's refusal as
    ``HTTP <status>: <body>``)."""
    body = message.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

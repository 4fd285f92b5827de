"""A bound on what one HTTP request may make the server read: `BodyLimit`, an ASGI middleware.

gradio reads a request's whole JSON body into memory before any studio check runs (and queues an event
whose prompt is 300 MB as readily as one of 30 characters): one client posting bodies of a few hundred
megabytes at a time could take the server's memory from every visitor. No studio request needs more
than a few hundred kilobytes (a prompt is at most 8000 characters; images and traces come as uploads),
so a body over `MAX_BODY_BYTES` is answered 413 before it is read (its ``Content-Length``) or as soon as
it passes the bound (a body sent in chunks, without one). Uploads (paths ending in ``/upload``) have
gradio's own bound, ``launch(max_file_size=...)``; they get `MAX_UPLOAD_BYTES`, above it, as a second
bound. `StudioBlocks.launch` installs the middleware, so every server the studio starts has it.
"""

from __future__ import annotations

import json
from typing import Any

#: The largest request body read for any path but an upload's (a studio request is a few kilobytes).
MAX_BODY_BYTES = 1 << 20
#: The largest upload body read (gradio's ``max_file_size``, 50 MB, refuses a file before this).
MAX_UPLOAD_BYTES = 64 << 20
#: What a refused request is told.
TOO_LARGE = "This request is too large for the studio (at most {limit} MiB)."


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over its path's bound gets 413 with a one-line
    JSON message (``{"error": ...}``), and the app never sees it (see the module docstring)."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES, upload_limit: int = MAX_UPLOAD_BYTES) -> None:
        self.app, self.limit, self.upload_limit = app, limit, upload_limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        limit = self.upload_limit if scope.get("path", "").rstrip("/").endswith("/upload") else self.limit
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, limit)
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
                        await _refuse(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: dict) -> None:
            nonlocal started
            if refused:  # (what the app says after its client "left" goes nowhere)
                return
            started = started or message.get("type") == "http.response.start"
            await send(message)

        await self.app(scope, bounded_receive, watched_send)


def _content_length(scope: dict) -> int | None:
    """The request's declared body length (None: not declared, or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Any, limit: int) -> None:
    body = json.dumps({"error": TOO_LARGE.format(limit=limit >> 20)}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})

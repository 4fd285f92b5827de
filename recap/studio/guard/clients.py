"""Who a request comes from: `client_key` (a visitor's address, behind the configured proxies), the
key every per-client bound of the guard counts by, and `key_hash`, the form it is logged in."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
from typing import Any

#: The client of work submitted without one (a caller outside any request).
NO_CLIENT = "-"


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

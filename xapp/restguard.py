"""What the REST server refuses before a handler runs: JSON too deep to parse safely, and connections
that hold a slot without sending a request (slowloris) or come past the connection bound.

`parse_json` is sans-IO: bytes in, a value or a `ValueError` naming the fault out. It counts nesting
before `json.loads` runs, because the stdlib parser recurses once per level and a 256 KiB body of `[`
raises RecursionError (a 500) deep inside it.

aiohttp has no request-head timeout: its keep-alive timer closes a connection that idles between
requests, but nothing bounds how long the first head may take to arrive. `ConnectionGuard` wraps the
server's protocol factory: each connection has `head_timeout_s` to finish its first request head
(the blank line after the headers) or it is answered 408 and closed; at `max_connections` a new
connection evicts the oldest one still waiting for its head, or is answered 503 when none is.
Heads after the first on a kept-alive connection are bounded by aiohttp's keep-alive timeout, which
counts from the end of the previous response and closes a connection whose next request has not
arrived by then (`start_rest` sets it).
"""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

from aiohttp import web

MAX_DEPTH = 32
_SPECIAL = re.compile(r'["\\\[\]{}]')


def nesting_exceeds(text: str, limit: int) -> int | None:
    """The offset where `text` first nests deeper than `limit` arrays/objects, or None. Brackets inside
    strings do not count; a backslash in a string hides the next character. Linear in the number of
    special characters, and recursion-free."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth, in_str, skip_to = 0, False, -1
    for m in _SPECIAL.finditer(text):
        pos = m.start()
        if pos < skip_to:
            continue
        c = m.group()
        if in_str:
            if c == "\\":
                skip_to = pos + 2
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return pos
        elif c in "]}":
            depth -= 1
    return None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(s: str) -> float:
    v = float(s)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"number {s[:40]} is out of range")
    return v


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> object:
    """A request body as JSON (UTF-8, RFC 8259): finite numbers only, at most `max_depth` levels."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"body is not UTF-8 JSON: {exc}") from None
    at = nesting_exceeds(text, max_depth)
    if at is not None:
        raise ValueError(f"body nests deeper than {max_depth} levels (at offset {at})")
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except ValueError as exc:        # JSONDecodeError, our refusals, ints past the digit limit
        raise ValueError(f"body is not JSON: {exc}") from None


class JsonErrorHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, with the errors it answers itself (a request line or header it
    cannot parse, a line past 8190 bytes: no middleware sees those) in JSON like every other error."""

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        resp = super().handle_error(request, status, exc, message)     # its logging and its checks
        why = f"malformed HTTP request: {(message or resp.reason)[:200]}" if resp.status < 500 else "internal error"
        out = web.json_response({"error": why}, status=resp.status)
        out.force_close()
        return out


_408 = b'{"error": "request head not received in time"}'
_503 = b'{"error": "too many connections"}'


def _reply(status: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


class ConnectionGuard:
    """The protocol factory handed to `loop.create_server`; `factory` is aiohttp's (`runner.server`),
    set once the runner is set up. Counters are read by `/metrics`."""

    def __init__(self, *, head_timeout_s: float = 5.0, max_connections: int = 256):
        self.factory: Callable[[], asyncio.Protocol] | None = None
        self.head_timeout_s, self.max_connections = head_timeout_s, max_connections
        self.open: dict[_Guarded, None] = {}          # insertion order = age
        self.head_timeouts = self.evicted = self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        assert self.factory is not None, "ConnectionGuard used before its runner was set up"
        return _Guarded(self, self.factory())

    def _admit(self, conn: _Guarded) -> bool:
        if len(self.open) >= self.max_connections:
            oldest = next((c for c in self.open if not c.head_done), None)
            if oldest is None:
                self.refused += 1
                return False
            self.evicted += 1
            oldest.cut(b"503 Service Unavailable", _503)
        self.open[conn] = None
        return True


class _Guarded(asyncio.Protocol):
    """Passes every event to aiohttp's protocol; watches only for the end of the first request head."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.head_done = False
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None
        self._forwarded = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.guard._admit(self):
            transport.write(_reply(b"503 Service Unavailable", _503))
            transport.close()
            return
        self._timer = asyncio.get_running_loop().call_later(self.guard.head_timeout_s, self._expire)
        self._forwarded = True
        self.inner.connection_made(transport)

    def _expire(self) -> None:
        self._timer = None
        if not self.head_done:
            self.guard.head_timeouts += 1
            self.cut(b"408 Request Timeout", _408)

    def cut(self, status: bytes, body: bytes) -> None:
        """Answer and close a connection that has not finished its head (nothing was written to it yet)."""
        self.guard.open.pop(self, None)
        self.head_done = True          # nothing more to watch
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_reply(status, body))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.head_done:
            seen = self._tail + data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self.head_done = True
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            self._tail = seen[-3:]
        if self._forwarded:
            self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self._forwarded else None

    def connection_lost(self, exc) -> None:
        self.guard.open.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._forwarded:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._forwarded:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._forwarded:
            self.inner.resume_writing()

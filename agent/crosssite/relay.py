"""Byte pipes between connected socket pairs, every pair of a process in one selector thread.

A gate, once a hello has passed, only copies bytes both ways. With a thread for each direction of each
connection, a region's Lighthouse gate (a gRPC connection per site) ran 2,000 threads at 1,000 sites, and the
handshakes of new connections waited behind them for the GIL. Here one thread per process serves every pair:
each socket is non-blocking, reads stop while the bytes it sent the other side are not yet written (at most
`MAX_PENDING` are held a direction), and a half-close passes through (EOF from one end shuts the other end's
write side once what came before it is written), so a protocol that ends a direction early still works. When
both directions have ended, or either end fails, both sockets are closed and the pair's `on_close` is called
once.
"""
from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger("weaver.gate")

CHUNK = 65536
MAX_PENDING = 4 * CHUNK


class _End:
    __slots__ = ("sock", "pair", "other", "out", "reading", "write_shut", "mask")

    def __init__(self, sock: socket.socket, pair: _Pair):
        self.sock, self.pair = sock, pair
        self.other: _End | None = None
        self.out = bytearray()       # bytes read from the other end, to be written to this one
        self.reading = True          # this end has not sent EOF
        self.write_shut = False      # this end's write side is shut (the other end's EOF passed through)
        self.mask = 0


class _Pair:
    __slots__ = ("a", "b", "on_close", "closed")

    def __init__(self, a: socket.socket, b: socket.socket, on_close: Callable[[], None] | None):
        self.a, self.b = _End(a, self), _End(b, self)
        self.a.other, self.b.other = self.b, self.a
        self.on_close, self.closed = on_close, False


class Relay:
    """One selector thread piping every spliced pair (see the module doc); `splice` from any thread."""

    def __init__(self, name: str = "relay"):
        self.name = name
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._new: deque[_Pair] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.pairs = 0               # pairs open now
        self.spliced = 0             # pairs ever spliced

    def splice(self, a: socket.socket, b: socket.socket, on_close: Callable[[], None] | None = None) -> None:
        """Pipe a <-> b until both directions end; then close both and call `on_close` (on the relay thread)."""
        try:
            a.setblocking(False)
            b.setblocking(False)
        except OSError:          # an end already closed: nothing to pipe, and the caller's slot is given back
            a.close()
            b.close()
            if on_close is not None:
                on_close()
            return
        with self._lock:
            self._new.append(_Pair(a, b, on_close))
            self.spliced += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:      # the wake-up socket is full: the thread is already due to look
            pass

    def _run(self) -> None:
        while True:
            for key, events in self._sel.select():
                end = key.data
                if end is None:
                    self._take_new()
                    continue
                if end.pair.closed:
                    continue
                try:
                    if events & selectors.EVENT_WRITE:
                        self._write(end)
                    if events & selectors.EVENT_READ and not end.pair.closed:
                        self._read(end)
                    if not end.pair.closed:
                        self._update(end.pair)
                except Exception as exc:  # noqa: BLE001 - one pair's failure must not stop every other pipe
                    log.debug("%s: %s", self.name, exc)
                    self._close(end.pair)

    def _take_new(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._lock:
                if not self._new:
                    return
                pair = self._new.popleft()
            self.pairs += 1
            try:
                self._update(pair)
            except Exception as exc:  # noqa: BLE001 - a socket its caller closed already: that pair only
                log.debug("%s: %s", self.name, exc)
                self._close(pair)

    def _read(self, end: _End) -> None:
        other = end.other
        try:
            data = end.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        if data:
            other.out += data
            self._write(other)
            return
        end.reading = False
        if not other.out:
            self._shut_write(other)

    def _write(self, end: _End) -> None:
        if end.out:
            try:
                n = end.sock.send(end.out)
            except (BlockingIOError, InterruptedError):
                return
            del end.out[:n]
        if not end.out and not end.other.reading:
            self._shut_write(end)

    def _shut_write(self, end: _End) -> None:
        if not end.write_shut:
            end.write_shut = True
            try:
                end.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _update(self, pair: _Pair) -> None:
        if pair.a.write_shut and pair.b.write_shut:
            self._close(pair)
            return
        for end in (pair.a, pair.b):
            mask = (selectors.EVENT_READ if end.reading and len(end.other.out) < MAX_PENDING else 0) \
                | (selectors.EVENT_WRITE if end.out else 0)
            if mask == end.mask:
                continue
            if end.mask == 0:
                self._sel.register(end.sock, mask, end)
            elif mask == 0:
                self._sel.unregister(end.sock)
            else:
                self._sel.modify(end.sock, mask, end)
            end.mask = mask

    def _close(self, pair: _Pair) -> None:
        if pair.closed:
            return
        pair.closed = True
        self.pairs -= 1
        for end in (pair.a, pair.b):
            if end.mask:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._sel.unregister(end.sock)
                end.mask = 0
            end.sock.close()
        if pair.on_close is not None:
            try:
                pair.on_close()
            except Exception:  # noqa: BLE001 - a caller's bookkeeping must not stop every other pipe
                log.exception("%s: on_close failed", self.name)


_SHARED: Relay | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> Relay:
    """The process's relay (started at its first splice)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Relay("gate-relay")
        return _SHARED

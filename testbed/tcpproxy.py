"""A small asyncio TCP proxy that `weaver up` puts between each agent and the lease broker.

Agents dial the proxy; every accepted connection gets its own upstream connection to the broker and two
pumps, one per direction ("down" = broker -> agent, "up" = agent -> broker). Faults act on the pumps:

- `stall(direction, seconds)`: that direction forwards nothing for `seconds` (a partition is both
  directions stalled; a slow reader is "down" stalled or trickling). The connection stays open.
- `trickle(direction, bytes_per_s, seconds)`: that direction forwards at most `bytes_per_s`.

Bounded: each pump holds at most one read (`chunk` bytes) while it waits; it stops reading from its
source until that chunk is written, so a stalled direction backs up into the sender's kernel buffers
and then into its own flow control (gRPC/HTTP2 windows), as a slow network would - the proxy itself
never queues more than `chunk` bytes per direction per connection.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("weaver.tcpproxy")

DIRECTIONS = ("up", "down")


@dataclass
class _Shape:
    stalled_until: float = 0.0      # monotonic; nothing passes before it
    rate_until: float = 0.0         # monotonic; until then at most `rate` bytes/s
    rate: float = 0.0


@dataclass
class ProxyStats:
    connections: int = 0
    bytes: dict = field(default_factory=lambda: {"up": 0, "down": 0})
    stalls: int = 0


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1", port: int = 0,
                 chunk: int = 16384, name: str = "proxy") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host, self.port = host, port
        self.chunk = chunk
        self.name = name
        self.stats = ProxyStats()
        self._shape = {d: _Shape() for d in DIRECTIONS}
        self._changed = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    # -- faults --------------------------------------------------------------------------------------

    def stall(self, direction: str, seconds: float) -> None:
        for d in self._dirs(direction):
            self._shape[d].stalled_until = time.monotonic() + seconds
        self.stats.stalls += 1
        self._changed.set()

    def trickle(self, direction: str, bytes_per_s: float, seconds: float) -> None:
        for d in self._dirs(direction):
            self._shape[d].rate, self._shape[d].rate_until = float(bytes_per_s), time.monotonic() + seconds
        self._changed.set()

    def heal(self) -> None:
        for d in DIRECTIONS:
            self._shape[d] = _Shape()
        self._changed.set()

    @staticmethod
    def _dirs(direction: str) -> tuple[str, ...]:
        if direction == "both":
            return DIRECTIONS
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be up, down or both, got {direction!r}")
        return (direction,)

    # -- pumping -------------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        self.stats.connections += 1
        try:
            try:
                ur, uw = await asyncio.open_connection(*self.upstream)
            except OSError as exc:
                log.info("%s: upstream %s:%d refused: %s", self.name, *self.upstream, exc)
                return
            pumps = [asyncio.ensure_future(self._pump(reader, uw, "up")),
                     asyncio.ensure_future(self._pump(ur, writer, "down"))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                uw.close()
        finally:
            writer.close()
            self._conns.discard(task)

    async def _wait_open(self, direction: str) -> None:
        while True:
            left = self._shape[direction].stalled_until - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: str) -> None:
        try:
            while True:
                data = await src.read(self.chunk)
                if not data:
                    return
                view = memoryview(data)
                while view:
                    await self._wait_open(direction)
                    shape = self._shape[direction]
                    n = len(view)
                    if shape.rate_until > time.monotonic():
                        n = max(1, min(n, int(shape.rate * 0.05)))  # a 50 ms slice of the rate
                    dst.write(view[:n])
                    await dst.drain()
                    self.stats.bytes[direction] += n
                    view = view[n:]
                    if shape.rate_until > time.monotonic() and view:
                        await asyncio.sleep(n / shape.rate if shape.rate > 0 else 0.05)
        except (ConnectionError, OSError):
            return

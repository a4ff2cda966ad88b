"""Per-peer send queues for the E2 termination: a peer that never accepts delays only itself.

An RMR send may have to dial its target first (up to the endpoint's connect timeout) or wait for a
slow reader to drain. Awaited in the E2T's receive loop, one frame whose `src` names a blackhole
address held up every other node and xApp for the whole timeout (issue 13). Here each send is queued
for its peer and a task per peer with something queued sends in order, so the receive loop never
awaits a peer; order per peer is kept, which is all RMR promises anyway.

Both the queue per peer and the number of peers are bounded (peers are named by what senders put
in `src`): what does not fit is dropped and counted, as a full RMR queue would drop it.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

log = logging.getLogger("weaver.ric.outbox")

Send = Callable[[], Awaitable[object]]
OnError = Callable[[Exception], None]


class PeerOutbox:
    def __init__(self, max_queued: int = 1024, max_peers: int = 256) -> None:
        self.max_queued = max_queued
        self.max_peers = max_peers
        self.dropped = 0
        self._queues: dict[str, deque[tuple[Send, OnError | None]]] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def busy(self, peer: str) -> bool:
        """Something is queued for, or being sent to, `peer`."""
        return peer in self._tasks

    def post(self, peer: str, send: Send, on_error: OnError | None = None) -> bool:
        """Queue `send()` for `peer`; `on_error(exc)` is called if it raises. False: dropped (full)."""
        q = self._queues.get(peer)
        if q is None:
            if len(self._queues) >= self.max_peers:
                self.dropped += 1
                return False
            q = self._queues[peer] = deque()
        if len(q) >= self.max_queued:
            self.dropped += 1
            return False
        q.append((send, on_error))
        if peer not in self._tasks:
            self._tasks[peer] = asyncio.ensure_future(self._drain(peer, q))
        return True

    async def _drain(self, peer: str, q: deque) -> None:
        try:
            while q:
                send, on_error = q.popleft()
                try:
                    await send()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one failed send never stops the peer's queue
                    if on_error is not None:
                        try:
                            on_error(exc)
                        except Exception:
                            log.exception("outbox: error handler for %s failed", peer)
                    else:
                        log.debug("outbox: send to %s failed: %s", peer, exc)
        finally:
            self._tasks.pop(peer, None)
            if self._queues.get(peer) is q:
                del self._queues[peer]

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queues.clear()

"""asyncio RMR endpoint: the I/O shell around `RmrFramer` and `Router` (`shared/design/rmr-wire.md` §7-§11).

One listening port; one dialled connection per endpoint *name*, opened lazily on first send, redialled on
the next send after a loss, with an exponential backoff between failed dials. Frames are read on every
socket, accepted and dialled. Outgoing frames are queued per connection and written together once the
sender yields (or a batch fills), so a burst costs one syscall, not one per message; `send` waits when the
kernel buffer is full. A send that needs no wait still yields to the loop now and then (`YIELD_EVERY` sends,
or `YIELD_AFTER_S` since the loop last ran): inbound frames are read while an application sends in a loop,
so a peer answering each message by rts does not find our socket full (issue 15). The receive queue is bounded: past `queue_size` messages (or `max_buffered` payload
bytes) the endpoint stops reading sockets until the application catches up (nothing is dropped).

Hostile peers are bounded too (issue 13): a frame announcing more than `max_frame` closes its connection
before anything is buffered; the partial frames of all connections together may hold `max_buffered` bytes,
past that the biggest holder is closed; at most `max_connections` accepted connections are kept, the least
recently active one is closed to make room; per-connection warnings are rate-limited.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import socket
import time  # wall-clock epoch in route-table requests; monotonic send pacing
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .framer import DEFAULT_MAX_FRAME, NEED_DATA, RmrFramer, check_address, encode_frame
from .message import (
    Mtype,
    RmrClosedError,
    RmrFrameError,
    RmrMessage,
    RmrSendError,
    RmrState,
    reply_message,
)
from .routes import Router

log = logging.getLogger("xapp.rmr")

FLUSH_BYTES = 256 << 10  # write at once when this much is queued on one connection
DEFAULT_MAX_BUFFERED = 256 << 20  # partial frames of all connections together (and, apart, queued payloads)
DEFAULT_MAX_CONNECTIONS = 1024  # accepted connections; dialled ones are bounded by the route table
HEALTH_IN_FLIGHT = 64  # health-check answers dial the sender's src: a flood must not pile up dials
HEALTH_OK = b"OK\n"
# A send yields to the loop after this many sends, or this long, without the loop running: C peers write
# without blocking (rmr_rts_msg fails with SENDFAILED once our socket's buffers fill), so inbound data must
# be read while the application sends. 1 ms is what bounds it (at RMR message rates a peer fills far less than
# the ~128 kB an unread socket holds); the count is a backstop. Each yield also ends the write batch, so yielding
# more often costs throughput: every 64 sends cost 0.5 us a message (2.1 -> 2.6 us), every 1 ms ~0.15 us.
YIELD_EVERY = 512
YIELD_AFTER_S = 0.001
_monotonic = time.monotonic
_HEALTH_REQ = int(Mtype.HEALTH_CHECK_REQ)  # a plain int: comparing to an enum member costs ~0.4 us per frame


def parse_port(port: int | str) -> int:
    """`4560`, `"4560"`, `"tcp:4560"`, `":4560"` as rmr_init accepts them."""
    if isinstance(port, int):
        return port
    text = port.strip()
    if text.startswith("tcp:"):
        text = text[4:]
    text = text.rsplit(":", 1)[-1]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"bad RMR port {port!r}") from None


def split_hostport(name: str) -> tuple[str, int]:
    host, sep, port = name.rpartition(":")
    if not sep or not host:
        raise RmrSendError(RmrState.BADARG, f"endpoint {name!r} is not host:port")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise RmrSendError(RmrState.BADARG, f"endpoint {name!r} has a bad port")
    return host.strip("[]"), number


@functools.lru_cache(maxsize=1)
def _local_addresses() -> tuple[str, ...]:
    found: list[str] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            found.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        found += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    found.append("127.0.0.1")
    return tuple(dict.fromkeys(found))


def local_addresses() -> list[str]:
    """This host's IPv4 addresses, the one with the default route first (no packets are sent). Looked up
    once per process: a hostname lookup can be slow where DNS is, and every endpoint needs the answer."""
    return list(_local_addresses())


@dataclass(frozen=True, slots=True)
class EndpointIdentity:
    """Who we say we are on every frame (§7), and the names routes use to mean us."""

    src: str
    srcip: str
    self_names: frozenset[str]

    @classmethod
    def build(cls, port: int, src_id: str | None, bind_if: str | None, name_only: bool) -> EndpointIdentity:
        name = src_id.rsplit(":", 1)[0] if src_id and ":" in src_id else src_id
        if not name:
            name = socket.gethostname().split(".", 1)[0]
        ips = local_addresses()
        if bind_if and bind_if not in ("0.0.0.0", "::"):
            ips.insert(0, bind_if)
        src = f"{name}:{port}"
        srcip = src if name_only else f"{ips[0]}:{port}"
        names = {src, srcip} | {f"{ip}:{port}" for ip in ips}
        return cls(src, srcip, frozenset(names))


@dataclass
class _Backoff:
    failures: int = 0
    next_try: float = 0.0


@dataclass
class EndpointStats:
    frames_in: int = 0
    frames_out: int = 0
    frame_errors: int = 0  # connections closed for malformed frames
    replies_dropped: int = 0  # call replies with no matching waiter (late, or wrong xid)
    health_checks: int = 0
    dials: int = 0
    dial_failures: int = 0
    overflow_closes: int = 0  # connections closed because all partial frames together passed max_buffered
    connections_evicted: int = 0  # accepted connections closed to stay within max_connections
    health_dropped: int = 0  # health checks not answered: HEALTH_IN_FLIGHT answers were already under way


class _LogBudget:
    """At most `burst` lines per `window_s` for one kind of per-connection warning; the next line let
    through says how many were held back. A peer that reconnects to send garbage must not flood the log."""

    def __init__(self, burst: int = 10, window_s: float = 10.0):
        self.burst, self.window_s = burst, window_s
        self._start = float("-inf")
        self._used = 0
        self.held_back = 0

    def allow(self, now: float) -> bool:
        if now - self._start >= self.window_s:
            self._start, self._used = now, 0
        self._used += 1
        if self._used <= self.burst:
            return True
        self.held_back += 1
        return False

    def take_held(self) -> str:
        held, self.held_back = self.held_back, 0
        return f" ({held} similar lines held back)" if held else ""


class _Link(asyncio.Protocol):
    """One TCP connection (accepted or dialled): a framer in, a write queue out."""

    def __init__(self, ep: RmrEndpoint, name: str | None = None, control: bool = False):
        self.ep = ep
        self.name = name  # the endpoint name we dialled; None for accepted connections
        self.control = control  # a route-manager connection: mtypes 20/21/22 are handled here, not queued
        self.framer = RmrFramer(ep.max_frame)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.peer = ""
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_pending = False
        self._writable: asyncio.Future | None = None
        self.gone: asyncio.Future = asyncio.get_running_loop().create_future()  # set by connection_lost
        self.held = 0  # bytes of this connection's partial frame, as counted in the endpoint's total
        self.last_rx = 0.0  # endpoint clock of the last bytes received (or of the connect)
        self.held_until = 0.0  # loop clock: reading this connection is paused until then (RmrEndpoint.hold)
        self.favoured = False  # the application vouched for it (RmrEndpoint.favour): its frames go first

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        ep = self.ep
        self.last_rx = ep.clock()
        if self.name is None:
            if ep._accepted >= ep.max_connections:
                ep._evict_idlest()
            ep._accepted += 1
        ep._links.add(self)
        if ep._inbox_paused:
            transport.pause_reading()  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        ep = self.ep
        dispatch = ep._dispatch_control if self.control else ep._dispatch
        framer = self.framer
        next_frame = framer.next_frame
        self.last_rx = ep.clock()
        try:
            framer.receive_data(data)
            while (msg := next_frame(self)) is not NEED_DATA:
                ep.stats.frames_in += 1
                dispatch(msg)  # type: ignore[arg-type]
        except RmrFrameError as exc:  # an oversized length is refused here, before its bytes are kept
            ep.stats.frame_errors += 1
            if ep._frame_log.allow(self.last_rx):
                log.warning("rmr: closing connection %s (%s): %s%s", self.peer, self.name or "accepted", exc,
                            ep._frame_log.take_held())
            self.abort()
        except Exception:  # a bug must not take the endpoint down; this connection goes, nothing else
            ep.stats.frame_errors += 1
            log.exception("rmr: unexpected error on connection %s; closing it", self.peer)
            self.abort()
        if self.closed:
            return
        held = framer.buffered
        if held != self.held:
            ep._buffered += held - self.held
            self.held = held
            if ep._buffered > ep.max_buffered:
                ep._shed()

    def _release(self) -> None:
        """Give back this connection's share of the endpoint's buffered bytes, and the bytes themselves."""
        self.framer.discard()
        self.ep._buffered -= self.held
        self.held = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._release()
        if self.name is None:
            self.ep._accepted -= 1
        self.ep._link_lost(self)
        if not self.gone.done():
            self.gone.set_result(None)
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- writing ------------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def write(self, frame: bytes) -> None:
        """Queue one frame. The first frame of a loop turn goes out at once (no added latency for a lone
        request or reply); frames written after it in the same turn are joined and written together when
        the turn ends or FLUSH_BYTES pile up (one syscall for a burst)."""
        if not self.usable:
            raise ConnectionResetError(f"connection to {self.name or self.peer} is closed")
        self.ep.stats.frames_out += 1
        if self._flush_pending:
            self._out.append(frame)
            self._out_bytes += len(frame)
            if self._out_bytes >= FLUSH_BYTES:
                self.flush()
        else:
            self.transport.write(frame)  # type: ignore[union-attr]
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._flush_pending = False
        self.flush()

    def flush(self) -> None:
        """Write what is queued now."""
        if not self._out:
            return
        out, self._out, self._out_bytes = self._out, [], 0
        if self.closed or self.transport is None:
            return
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def drained(self) -> None:
        """Wait while the kernel buffer and asyncio's are full (send back-pressure)."""
        while self._writable is not None and not self.closed:
            await self._writable

    def abort(self) -> None:
        self.closed = True
        self._release()
        if self.transport is not None:
            self.transport.abort()

    def hold(self, seconds: float) -> None:
        """Stop reading this connection for `seconds`: what the peer sends meanwhile waits in the kernel
        (TCP flow control pushes back on the sender) instead of costing us a parse per frame."""
        loop = asyncio.get_running_loop()
        if self.closed or self.transport is None or self.held_until > loop.time():
            return
        self.held_until = loop.time() + seconds
        self.transport.pause_reading()
        loop.call_later(seconds, self._unhold)

    def _unhold(self) -> None:
        self.held_until = 0.0
        if not self.closed and self.transport is not None and not self.ep._inbox_paused:
            self.transport.resume_reading()


class RmrEndpoint:
    """A pure-Python RMR endpoint. Build it with `await RmrEndpoint.open(...)`."""

    def __init__(self, port: int, identity: EndpointIdentity, *, queue_size: int, max_frame: int,
                 connect_timeout: float, health_check: bool, clock: Callable[[], float],
                 backoff: tuple[float, float], max_buffered: int = DEFAULT_MAX_BUFFERED,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.port = port
        self.identity = identity
        self.src = identity.src
        self.srcip = identity.srcip
        self._src_b = check_address(identity.src, "src")
        self._srcip_b = check_address(identity.srcip, "srcip")
        self.router = Router(identity.self_names)
        self.max_frame = max_frame
        self.queue_size = queue_size
        self.max_buffered = max_buffered
        self.max_connections = max_connections
        self._buffered = 0  # partial-frame bytes of all connections together
        self._inbox_bytes = 0  # payload bytes waiting in the receive queue
        self._accepted = 0
        self._health_in_flight = 0
        self._frame_log = _LogBudget()
        self.connect_timeout = connect_timeout
        self.health_check = health_check
        # None or a function returning None (healthy) or a reason: the reply is then `ERR <reason>` (§10)
        self.health_status: Callable[[], str | None] | None = None
        self.clock = clock
        self.backoff_range = backoff
        self.stats = EndpointStats()
        self.route_file: str | None = None
        self._route_stat: tuple | None = None
        self._route_read_at = float("-inf")
        self._links: set[_Link] = set()
        self._dialled: dict[str, _Link] = {}
        self._dialling: dict[str, asyncio.Future] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._inbox: collections.deque[RmrMessage] = collections.deque()
        self._inbox_first: collections.deque[RmrMessage] = collections.deque()   # from favoured links
        self._inbox_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._inbox_paused = False
        self._calls: dict[int, tuple[bytes, asyncio.Future]] = {}
        self._next_call_id = 2
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.AbstractServer | None = None
        self._control_server: asyncio.AbstractServer | None = None
        self._rtg_target: str | None = None
        self._closed = False
        self._turn_at: float | None = None  # monotonic time the current loop turn's first send saw; None: new turn
        self._turn_sends = 0

    @classmethod
    async def open(cls, port: int | str = 4560, route_table: str | os.PathLike | None = None,
                   src_id: str | None = None, bind_if: str | None = None, *, name_only: bool | None = None,
                   queue_size: int = 10000, max_frame: int = DEFAULT_MAX_FRAME,
                   max_buffered: int = DEFAULT_MAX_BUFFERED, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                   connect_timeout: float = 2.0,
                   health_check: bool = True, route_poll_s: float = 1.0, route_reread_s: float = 60.0,
                   backoff: tuple[float, float] = (0.05, 1.0), env: Mapping[str, str] | None = None,
                   clock: Callable[[], float] | None = None, rtg_svc: str | None = None) -> RmrEndpoint:
        """Listen on `port` (0 picks a free one) and load the route table.

        Arguments override the environment (`env`, default `os.environ`): `route_table` over RMR_SEED_RT,
        `src_id` over RMR_SRC_ID, `bind_if` over RMR_BIND_IF, `name_only` over RMR_SRC_NAMEONLY. The table
        file is re-read every `route_poll_s` until it commits, then whenever it changes (checked every
        `route_poll_s`) and at least every `route_reread_s`.

        `rtg_svc` (over RMR_RTG_SVC) as in C: `-1` or unset, file only; `<port>`, listen there for route-manager
        pushes (mtype 20 records, acknowledged with mtype 22); `<host:port>`, also ask that route manager for a
        table (mtype 21, every RMR_RTREQ_FREQ seconds, default 5) until one commits.

        `max_frame` bounds one frame, `max_buffered` the bytes all connections' partial frames hold together
        (and, apart, the payload bytes in the receive queue), `max_connections` the accepted connections.
        """
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        if max_buffered < max_frame or max_connections < 1:
            raise ValueError("max_buffered must be at least max_frame, max_connections at least 1")
        env = os.environ if env is None else env
        loop = asyncio.get_running_loop()
        route_table = route_table if route_table is not None else (env.get("RMR_SEED_RT") or None)
        src_id = src_id if src_id is not None else (env.get("RMR_SRC_ID") or None)
        bind_if = bind_if if bind_if is not None else (env.get("RMR_BIND_IF") or None)
        if name_only is None:
            try:
                name_only = int(env.get("RMR_SRC_NAMEONLY", "0") or 0) > 0
            except ValueError:
                name_only = False
        rtg = (rtg_svc if rtg_svc is not None else env.get("RMR_RTG_SVC", "-1")).strip() or "-1"
        try:
            rtreq_s = min(300.0, max(1.0, float(env.get("RMR_RTREQ_FREQ", "5") or 5)))
        except ValueError:
            rtreq_s = 5.0
        holder: list[RmrEndpoint] = []
        server = await loop.create_server(lambda: _Link(holder[0]), host=bind_if or "0.0.0.0",
                                          port=parse_port(port), reuse_address=True)
        real_port = server.sockets[0].getsockname()[1]
        identity = EndpointIdentity.build(real_port, src_id, bind_if, bool(name_only))
        ep = cls(real_port, identity, queue_size=queue_size, max_frame=max_frame,
                 connect_timeout=connect_timeout, health_check=health_check,
                 clock=clock or loop.time, backoff=backoff, max_buffered=max_buffered,
                 max_connections=max_connections)
        holder.append(ep)
        ep._server = server
        if route_table is not None:
            ep.route_file = os.fspath(route_table)
            ep.check_route_file()
            ep._spawn(ep._watch_route_file(route_poll_s, route_reread_s))
        if not rtg.startswith("-"):
            try:
                await ep._start_route_manager(rtg, bind_if, rtreq_s)
            except BaseException:
                await ep.close()
                raise
        return ep

    async def __aenter__(self) -> RmrEndpoint:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- route table --------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once a route table has committed (C's rmr_ready)."""
        return self.router.ready

    def load_route_table(self, text: str) -> list[str]:
        """Load a whole table from text; swapped in only if it commits. Returns log notes."""
        notes = self.router.load_text(text)
        for note in notes:
            log.warning("rmr: route table: %s", note)
        return notes

    def check_route_file(self, now: float | None = None, reread_s: float = 60.0) -> bool:
        """Re-read the route file if it changed, if nothing committed yet, or `reread_s` passed.
        Returns True if the file was read."""
        if self.route_file is None:
            return False
        now = self.clock() if now is None else now
        try:
            st = os.stat(self.route_file)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError as exc:
            if not self.ready:
                log.warning("rmr: route table %s unreadable: %s", self.route_file, exc)
            return False
        if self.ready and stamp == self._route_stat and now - self._route_read_at < reread_s:
            return False
        try:
            with open(self.route_file, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as exc:
            log.warning("rmr: route table %s unreadable: %s", self.route_file, exc)
            return False
        self._route_stat, self._route_read_at = stamp, now
        self.load_route_table(text)
        return True

    async def _watch_route_file(self, poll_s: float, reread_s: float) -> None:
        while not self._closed:
            await asyncio.sleep(poll_s)
            try:
                self.check_route_file(reread_s=reread_s)
            except Exception:
                log.exception("rmr: route table reload failed; previous table stays")

    # -- receiving ----------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes held for peers now: partial frames of every connection plus payloads in the queue."""
        return self._buffered + self._inbox_bytes

    def _shed(self) -> None:
        """All partial frames together passed `max_buffered`: close the biggest holders until under it
        (a legitimate peer's frames are small and complete; a hoarder's are big and unfinished)."""
        while self._buffered > self.max_buffered:
            link = max(self._links, key=lambda k: k.held, default=None)
            if link is None or link.held == 0:
                return
            self.stats.overflow_closes += 1
            if self._frame_log.allow(self.clock()):
                log.warning("rmr: closing connection %s: its %d-byte partial frame puts all connections over "
                            "%d buffered bytes%s", link.peer, link.held, self.max_buffered, self._frame_log.take_held())
            link.abort()

    def _evict_idlest(self) -> None:
        """`max_connections` accepted connections are open: close the one that delivered the fewest frames
        (the least recently active among those). Not simply the idlest: a burst of fresh hoarder sockets
        would then push out the live peer that last sent a period ago, and a refused newcomer would let
        hoarders lock out a peer redialling after a loss; a live peer has many frames, a hoarder few."""
        accepted = [k for k in self._links if k.name is None and not k.closed]
        if not accepted:
            return
        link = min(accepted, key=lambda k: (k.framer.frames, k.last_rx))
        self.stats.connections_evicted += 1
        if self._frame_log.allow(self.clock()):
            log.warning("rmr: %d connections open: closing %s (%d frames so far)%s", self.max_connections,
                        link.peer, link.framer.frames, self._frame_log.take_held())
        link.abort()

    def _dispatch(self, msg: RmrMessage) -> None:
        if msg.mtype == _HEALTH_REQ and self.health_check:
            self.stats.health_checks += 1
            if self._health_in_flight >= HEALTH_IN_FLIGHT:
                self.stats.health_dropped += 1
                return
            self._health_in_flight += 1
            self._spawn(self._answer_health(msg))
        elif msg.call:
            self._enqueue(msg)  # a call from a peer: the app replies by rts
        elif msg.call_id:
            waiter = self._calls.get(msg.call_id)
            if waiter is not None and waiter[0] == msg.xaction and not waiter[1].done():
                waiter[1].set_result(msg)
            else:
                self.stats.replies_dropped += 1  # late, or not ours (P3)
        else:
            self._enqueue(msg)

    def _enqueue(self, msg: RmrMessage) -> None:
        first = getattr(msg.via, "favoured", False)
        (self._inbox_first if first else self._inbox).append(msg)
        if first and self._inbox_paused and (len(self._inbox_first) >= self.queue_size // 2
                                             or self._inbox_bytes >= self.max_buffered):
            msg.via.transport.pause_reading()   # favoured or not, no connection grows the queue unbounded
        self._inbox_bytes += len(msg.payload)
        if self._inbox_waiters:
            self._wake_one()
        if (self.pending() >= self.queue_size or self._inbox_bytes >= self.max_buffered) and not self._inbox_paused:
            self._inbox_paused = True
            # a favoured link keeps being read while its own frames are few: a flood that fills the queue
            # from other connections must not hold the E2 termination's frames back in the kernel
            keep = len(self._inbox_first) < self.queue_size // 2 and self._inbox_bytes < self.max_buffered
            for link in self._links:
                if link.transport is not None and not link.closed and not (keep and link.favoured):
                    link.transport.pause_reading()

    def _dispatch_control(self, msg: RmrMessage) -> None:
        """A frame from the route manager (on the control port, or on our connection to it)."""
        if msg.mtype == Mtype.RMRRM_TABLE_DATA:
            outcomes = self.router.apply_update(msg.payload.decode("utf-8", "replace"))
            for note in self.router.update_notes:
                log.warning("rmr: route manager table: %s", note)
            for outcome in outcomes:
                self._spawn(self._ack_table(msg, outcome.state_payload()))
        elif msg.mtype == Mtype.HEALTH_CHECK_REQ:
            self._dispatch(msg)
        else:
            log.info("rmr: mtype %d on a route-manager connection ignored", msg.mtype)

    async def _ack_table(self, msg: RmrMessage, payload: bytes) -> None:
        try:
            await self.rts(msg, Mtype.RMRRM_TABLE_STATE, payload)
        except RmrSendError as exc:
            log.warning("rmr: cannot acknowledge a route table to %s: %s", msg.src, exc)

    async def _start_route_manager(self, rtg: str, bind_if: str | None, request_s: float) -> None:
        if ":" in rtg:
            split_hostport(rtg)  # refuse a malformed address now, not in the background
            self._rtg_target = rtg
            self._spawn(self._request_tables(rtg, request_s))
            return
        self._control_server = await asyncio.get_running_loop().create_server(
            lambda: _Link(self, None, True), host=bind_if or "0.0.0.0", port=parse_port(rtg), reuse_address=True)

    async def _request_tables(self, target: str, every_s: float) -> None:
        """Ask the route manager for a table until one commits (C's rtc loop for RMR_RTG_SVC=host:port)."""
        while not self._closed and not self.ready:
            try:
                link = await self._link_to(target)
                link.write(self.encode(RmrMessage(Mtype.RMRRM_REQ_TABLE, f"{self.src} ts={int(time.time())}\n".encode())))
            except (RmrSendError, RmrClosedError) as exc:
                log.info("rmr: route table request to %s failed: %s", target, exc)
            await asyncio.sleep(every_s)

    async def _answer_health(self, msg: RmrMessage) -> None:
        try:
            await self._answer_health_now(msg)
        finally:
            self._health_in_flight -= 1

    async def _answer_health_now(self, msg: RmrMessage) -> None:
        payload = HEALTH_OK
        if self.health_status is not None:
            try:
                reason = self.health_status()
            except Exception as exc:  # a failing health function is itself a health problem
                reason = f"health check raised {type(exc).__name__}"
            if reason is not None:
                payload = f"ERR {reason}\n".encode("utf-8", "replace")
        try:
            await self.rts(msg, Mtype.HEALTH_CHECK_RESP, payload)
        except RmrSendError as exc:
            log.info("rmr: health check reply to %s failed: %s", msg.src, exc)

    def _wake_one(self) -> None:
        while self._inbox_waiters:
            w = self._inbox_waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    async def receive(self, timeout: float | None = None) -> RmrMessage:
        """The next message. Raises `TimeoutError` after `timeout` seconds, `RmrClosedError` once closed.
        Several tasks may wait at once; each message goes to exactly one of them."""
        if not self._inbox and not self._inbox_first:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while not self._inbox and not self._inbox_first:
                if self._closed:
                    raise RmrClosedError("endpoint closed")
                w = loop.create_future()
                self._inbox_waiters.append(w)
                try:
                    if deadline is None:
                        await w
                    else:
                        left = deadline - loop.time()
                        if left <= 0:
                            raise TimeoutError(f"no message within {timeout}s")
                        await asyncio.wait_for(w, left)
                finally:
                    try:
                        self._inbox_waiters.remove(w)
                    except ValueError:
                        pass
                    if (self._inbox or self._inbox_first) and self._inbox_waiters:  # woken, then cancelled
                        self._wake_one()
        msg = self._inbox_first.popleft() if self._inbox_first else self._inbox.popleft()
        self._inbox_bytes -= len(msg.payload)
        if self._inbox_paused and self.pending() <= self.queue_size // 2 and \
                self._inbox_bytes <= self.max_buffered // 2:
            self._inbox_paused = False
            now = asyncio.get_running_loop().time()
            for link in self._links:
                if link.transport is not None and not link.closed and link.held_until <= now:
                    link.transport.resume_reading()
        return msg

    def favour(self, via: object, on: bool = True) -> None:
        """Let the messages of the connection `via` came on jump the receive queue (or stop that). The
        application decides whom it trusts - a connection that delivered valid frames and no bad ones -
        so that a flood on other connections queues behind, not ahead of, them."""
        if isinstance(via, _Link) and via.favoured != on:
            via.favoured = on
            if on:   # its frames already queued move with it, in order (a later one must not overtake them)
                mine = [m for m in self._inbox if m.via is via]
                if mine:
                    self._inbox = collections.deque(m for m in self._inbox if m.via is not via)
                    self._inbox_first.extend(mine)

    def hold(self, via: object, seconds: float) -> bool:
        """Stop reading the connection a received message came on (its `via`) for `seconds`; False when
        it did not come on one of ours (the native backend, or a connection already gone)."""
        if isinstance(via, _Link) and via in self._links:
            via.hold(seconds)
            return True
        return False

    def pending(self) -> int:
        """Messages waiting in the receive queue."""
        return len(self._inbox) + len(self._inbox_first)

    # -- connections --------------------------------------------------------------------------------

    def connected(self, name: str) -> bool:
        link = self._dialled.get(name)
        return link is not None and not link.closed

    def _link_lost(self, link: _Link) -> None:
        self._links.discard(link)
        if link.name is not None and self._dialled.get(link.name) is link:
            del self._dialled[link.name]

    async def _link_to(self, name: str) -> _Link:
        link = self._dialled.get(name)
        if link is not None and link.usable:
            return link
        if self._closed:
            raise RmrClosedError("endpoint closed")
        pending = self._dialling.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        b = self._backoff.get(name)
        now = self.clock()
        if b is not None and now < b.next_try:
            raise RmrSendError(RmrState.RETRY, f"{name}: redial backoff, next try in {b.next_try - now:.3f}s")
        fut = asyncio.ensure_future(self._dial(name))
        self._dialling[name] = fut
        try:
            return await asyncio.shield(fut)
        finally:
            if self._dialling.get(name) is fut:
                del self._dialling[name]

    async def _dial(self, name: str) -> _Link:
        host, port = split_hostport(name)
        self.stats.dials += 1
        loop = asyncio.get_running_loop()
        try:
            _, link = await asyncio.wait_for(
                loop.create_connection(lambda: _Link(self, name, name == self._rtg_target), host, port),
                self.connect_timeout)
        except (TimeoutError, OSError, ValueError, OverflowError) as exc:  # ValueError: bad IDNA names
            self.stats.dial_failures += 1
            if len(self._backoff) >= 1024:  # peers choose the names rts dials: keep this bounded
                now = self.clock()
                self._backoff = {k: v for k, v in self._backoff.items() if v.next_try > now}
            b = self._backoff.setdefault(name, _Backoff())
            first, cap = self.backoff_range
            b.next_try = self.clock() + min(cap, first * (2 ** b.failures))
            b.failures += 1
            raise RmrSendError(RmrState.SENDFAILED, f"cannot connect to {name}: {exc or 'timeout'}") from None
        self._backoff.pop(name, None)
        if self._closed:
            link.abort()
            raise RmrClosedError("endpoint closed")
        self._dialled[name] = link
        return link

    # -- sending ------------------------------------------------------------------------------------

    def encode(self, msg: RmrMessage) -> bytes:
        return encode_frame(msg, self._src_b, self._srcip_b)

    async def _write_to(self, name: str, frame: bytes) -> _Link:
        link = self._dialled.get(name)
        if link is None or not link.usable:
            link = await self._link_to(name)
        try:
            link.write(frame)
        except ConnectionError as exc:
            raise RmrSendError(RmrState.SENDFAILED, f"{name}: {exc}") from None
        return link

    async def _send_routed(self, msg: RmrMessage, targets: list[str] | None = None) -> int:
        if targets is None:
            targets = self.router.targets(msg.mtype, msg.sub_id, msg.meid)
        frame = self.encode(msg)
        if len(targets) == 1:
            link = await self._write_to(targets[0], frame)
            if link._writable is not None:
                await link.drained()
            return 1
        delivered = 0
        failures: list[RmrSendError] = []
        links = []
        for name in targets:  # one clone per group; a failing group does not stop the others
            try:
                links.append(await self._write_to(name, frame))
                delivered += 1
            except RmrSendError as exc:
                failures.append(exc)
        if not delivered:
            raise RmrSendError(failures[0].state if len(failures) == 1 else RmrState.SENDFAILED,
                               "; ".join(str(f) for f in failures))
        for link in links:
            await link.drained()
        return delivered

    async def send(self, msg: RmrMessage) -> int:
        """Send by the route table (one endpoint per group). Returns how many endpoints got it.

        Raises `RmrSendError`: NOENDPT (no route), SENDFAILED (no group could be reached), RETRY (the
        only endpoint is in redial backoff). A plain send is never a call: flag 0x04 and d1[0] are cleared (P3).
        """
        if self._closed:
            raise RmrClosedError("endpoint closed")
        if msg.call or msg.call_id:
            msg = msg.replace(call=False, call_id=0)
        targets = self.router.targets(msg.mtype, msg.sub_id, msg.meid)
        if len(targets) == 1:  # the hot path: an open connection, nothing to wait for
            link = self._dialled.get(targets[0])
            if link is not None and link._writable is None and link.usable:
                link.write(encode_frame(msg, self._src_b, self._srcip_b))
                at = self._turn_at  # _due_yield inlined: this path is ~2 us a message, the call ~0.1
                if at is None:
                    self._begin_turn()
                else:
                    n = self._turn_sends = self._turn_sends + 1
                    if n >= YIELD_EVERY or _monotonic() - at >= YIELD_AFTER_S:
                        await self._yield_turn()
                return 1
        delivered = await self._send_routed(msg, targets)
        if self._due_yield():
            await self._yield_turn()
        return delivered

    def _due_yield(self) -> bool:
        """Count a send that did not wait; True when the loop has not run for YIELD_EVERY of them or for
        YIELD_AFTER_S (a send that waited for a connection or for drain yielded already, and is cheap to count)."""
        if self._turn_at is None:
            self._begin_turn()
            return False
        self._turn_sends += 1
        return self._turn_sends >= YIELD_EVERY or _monotonic() - self._turn_at >= YIELD_AFTER_S

    def _begin_turn(self) -> None:
        self._turn_at, self._turn_sends = _monotonic(), 0
        asyncio.get_running_loop().call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._turn_at = None  # the loop ran: readers had their chance

    async def _yield_turn(self) -> None:
        """Let the loop read sockets and flush joined writes. The application's work until the next send
        counts against the turn that starts now, so a send after long work yields at once."""
        await asyncio.sleep(0)
        if self._turn_at is None:
            self._begin_turn()

    async def wormhole_send(self, target: str, msg: RmrMessage) -> None:
        """Send straight to `host:port`, bypassing the route table (rmr_wh_open + rmr_wh_send_msg)."""
        if self._closed:
            raise RmrClosedError("endpoint closed")
        if msg.call or msg.call_id:
            msg = msg.replace(call=False, call_id=0)
        link = await self._write_to(target, self.encode(msg))
        await link.drained()
        if self._due_yield():
            await self._yield_turn()

    async def rts(self, received: RmrMessage, mtype: int | None = None, payload: bytes | None = None) -> None:
        """Return to sender (§7): dial `src`; else the socket it arrived on; else `srcip`; else NOENDPT.
        Keeps xid, meid, sub_id, trace and call-id; clears the call flag; writes our own src/srcip."""
        if self._closed:
            raise RmrClosedError("endpoint closed")
        frame = self.encode(reply_message(received, mtype, payload))
        if self._due_yield():  # an app answering a backlog in a loop keeps reading too
            await self._yield_turn()
        tried = []
        if received.src:
            try:
                link = await self._write_to(received.src, frame)
                await link.drained()
                return
            except RmrSendError as exc:
                tried.append(str(exc))
        via = received.via
        if isinstance(via, _Link) and via.usable:
            via.write(frame)
            await via.drained()
            return
        tried.append("arriving connection is gone")
        if received.srcip and received.srcip != received.src:
            try:
                link = await self._write_to(received.srcip, frame)
                await link.drained()
                return
            except RmrSendError as exc:
                tried.append(str(exc))
        raise RmrSendError(RmrState.NOENDPT, "rts: " + "; ".join(tried or ["message has no src"]))

    async def call(self, msg: RmrMessage, timeout: float = 5.0) -> RmrMessage:
        """rmr_mt_call: send by route with a fresh call-id (2..255) and wait for the reply with the same
        call-id and 32-byte xid (an all-zero xid is replaced by a random one). Raises `RmrSendError`
        (TIMEOUT, or CALLFAILED when 254 calls are already outstanding)."""
        if self._closed:
            raise RmrClosedError("endpoint closed")
        cid = self._free_call_id()
        xid = msg.xaction if any(msg.xaction) else os.urandom(16).hex().encode()
        fut = asyncio.get_running_loop().create_future()
        self._calls[cid] = (xid, fut)
        try:
            await self._send_routed(msg.replace(call=True, call_id=cid, xaction=xid))
            try:
                return await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                raise RmrSendError(RmrState.TIMEOUT, f"no reply to call {cid} within {timeout}s") from None
        finally:
            self._calls.pop(cid, None)

    def _free_call_id(self) -> int:
        for _ in range(254):
            cid = self._next_call_id
            self._next_call_id = 2 if cid >= 255 else cid + 1
            if cid not in self._calls:
                return cid
        raise RmrSendError(RmrState.CALLFAILED, "254 calls outstanding: no free call-id")

    # -- lifecycle ----------------------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, linger: float = 2.0) -> None:
        """Stop listening, flush and close every connection (waiting up to `linger` seconds for queued
        frames to leave, then aborting), fail waiting calls and wake receivers with `RmrClosedError`."""
        if self._closed:
            return
        self._closed = True
        for server in (self._server, self._control_server):
            if server is not None:
                server.close()
        for task in list(self._tasks):
            task.cancel()
        links = list(self._links)
        for link in links:
            link.flush()
            if link.transport is not None:
                link.transport.close()
        for _, fut in self._calls.values():
            if not fut.done():
                fut.set_exception(RmrClosedError("endpoint closed"))
        while self._inbox_waiters:
            self._wake_one()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        gone = [link.gone for link in links if not link.gone.done()]
        if gone:
            await asyncio.wait(gone, timeout=linger)
        for link in links:
            if not link.gone.done():
                link.abort()  # the peer stopped reading: do not hang on it
        for server in (self._server, self._control_server):
            if server is not None:
                await server.wait_closed()

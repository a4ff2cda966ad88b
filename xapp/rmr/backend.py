"""The `rmr.backend: python | native` switch: one small interface the xApp codes against.

`python` is `RmrEndpoint` (this package, default). `native` drives the reference C library through
ricxappframe's ctypes binding (`ricxappframe.rmr.rmr`, which loads `librmr_si.so` when imported); it is
imported only when asked for, so the python backend works where the library is missing.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import threading
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from .endpoint import RmrEndpoint, parse_port
from .framer import meid_from_wire
from .message import Mtype, RmrClosedError, RmrError, RmrMessage, RmrSendError, RmrState

BACKENDS = ("python", "native")


@runtime_checkable
class RmrBackend(Protocol):
    """What the xApp and the testbed use, whatever carries the frames."""

    port: int
    src: str

    async def send(self, msg: RmrMessage) -> int: ...
    async def rts(self, received: RmrMessage, mtype: int | None = None, payload: bytes | None = None) -> None: ...
    async def wormhole_send(self, target: str, msg: RmrMessage) -> None: ...
    async def receive(self, timeout: float | None = None) -> RmrMessage: ...
    async def close(self) -> None: ...


class NativeUnavailable(RmrError):
    """The native backend was asked for but `librmr_si.so` (or ricxappframe) cannot be loaded."""


def native_status() -> tuple[bool, str]:
    """(True, "") when ricxappframe's binding loads `librmr_si.so`, else (False, why)."""
    try:
        import ricxappframe.rmr.rmr  # noqa: F401  (loads the shared library)
    except (ImportError, OSError) as exc:
        return False, f"native RMR unavailable: {exc}"
    return True, ""


async def open_backend(kind: str = "python", port: int | str = 4560, route_table: str | None = None, *,
                       src_id: str | None = None, bind_if: str | None = None,
                       env: Mapping[str, str] | None = None, **python_options) -> RmrBackend:
    """Open an RMR endpoint with the chosen backend. Raises `NativeUnavailable` or `ValueError`."""
    if kind == "python":
        return await RmrEndpoint.open(port, route_table, src_id, bind_if, env=env, **python_options)
    if kind == "native":
        ok, why = native_status()
        if not ok:
            raise NativeUnavailable(why)
        return await NativeRmrEndpoint.open(port, route_table, src_id, bind_if)
    raise ValueError(f"unknown RMR backend {kind!r}; choose one of {', '.join(BACKENDS)}")


class _NativeBuf:
    """Owns one C message buffer until Python forgets the message it came with (then frees it)."""

    def __init__(self, rmr, ptr):
        self.rmr, self.ptr = rmr, ptr

    def take(self):
        ptr, self.ptr = self.ptr, None
        return ptr

    def __del__(self):
        if self.ptr is not None:
            try:
                self.rmr.rmr_free_msg(self.ptr)
            except Exception:
                pass


class NativeRmrEndpoint:
    """RmrBackend over the C library. Blocking C calls run in a thread; one thread receives and answers
    health checks (as ricxappframe's RMRXapp does); `RMR_*` environment variables drive the C side, with the
    constructor arguments written into them first."""

    POLL_MS = 100
    SEND_TRIES = 5
    MAX_SIZE = 65536  # initial buffer size; the C library grows buffers for bigger payloads

    def __init__(self, rmr, ctx, port: int, loop: asyncio.AbstractEventLoop):
        self._rmr, self._ctx, self.port, self._loop = rmr, ctx, port, loop
        self.src = ""
        self._queue: asyncio.Queue[RmrMessage] = asyncio.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the C context is used from the receive thread and senders
        self._wormholes: dict[str, int] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._receive_loop, name=f"rmr-native-{port}", daemon=True)

    @classmethod
    async def open(cls, port: int | str = 4560, route_table: str | None = None, src_id: str | None = None,
                   bind_if: str | None = None, ready_timeout: float = 10.0) -> NativeRmrEndpoint:
        from ricxappframe.rmr import rmr  # deferred: loads librmr_si.so

        for key, value in (("RMR_SEED_RT", route_table), ("RMR_SRC_ID", src_id), ("RMR_BIND_IF", bind_if)):
            if value is not None:
                os.environ[key] = os.fspath(value)
        os.environ.setdefault("RMR_RTG_SVC", "-1")
        p = parse_port(port)
        ctx = await asyncio.to_thread(rmr.rmr_init, f"tcp:{p}".encode(), cls.MAX_SIZE, 0x00)
        if not ctx:
            raise RmrSendError(RmrState.INITFAILED, f"rmr_init failed on port {p}")
        loop = asyncio.get_running_loop()
        ep = cls(rmr, ctx, p, loop)
        deadline = loop.time() + ready_timeout
        while rmr.rmr_ready(ctx) == 0 and loop.time() < deadline and route_table is not None:
            await asyncio.sleep(0.05)
        ep._thread.start()
        return ep

    # -- conversion ---------------------------------------------------------------------------------

    def _to_message(self, ptr) -> RmrMessage:
        rmr = self._rmr
        c = ptr.contents
        # Raw reads: the xid is 32 opaque bytes (P2), and a truncated message still has its in-frame bytes.
        payload = ctypes.string_at(c.payload, c.len) if c.len > 0 else b""
        meid = meid_from_wire(rmr.rmr_get_meid(ptr).ljust(32, b"\0"))
        return RmrMessage(
            mtype=c.mtype, payload=payload, sub_id=c.sub_id, meid=meid,
            xaction=ctypes.string_at(c.xaction, 32), src=rmr.get_src(ptr), truncated=c.state == RmrState.TRUNC,
            via=_NativeBuf(rmr, ptr))

    def _fill(self, ptr, msg: RmrMessage):
        rmr = self._rmr
        rmr.set_payload_and_length(msg.payload, ptr)
        ptr.contents.mtype = msg.mtype
        ptr.contents.sub_id = msg.sub_id
        rmr.rmr_set_meid(ptr, msg.meid.encode("ascii"))
        ctypes.memmove(ptr.contents.xaction, msg.xaction, 32)
        return ptr

    def _check(self, ptr, what: str) -> None:
        state = ptr.contents.state
        self._rmr.rmr_free_msg(ptr)
        if state != RmrState.OK:
            raise RmrSendError(RmrState(state) if state in RmrState._value2member_map_ else RmrState.SENDFAILED,
                               f"{what} (native)")

    # -- the RmrBackend interface -------------------------------------------------------------------

    def _send_blocking(self, msg: RmrMessage) -> int:
        with self._lock:
            ptr = self._fill(self._rmr.rmr_alloc_msg(self._ctx, max(len(msg.payload), 1)), msg)
            for _ in range(self.SEND_TRIES):  # RETRY means "not now" (a full socket), as RMRXapp treats it
                ptr = self._rmr.rmr_send_msg(self._ctx, ptr)
                if ptr.contents.state != RmrState.RETRY:
                    break
            self._check(ptr, f"send mtype {msg.mtype}")
        return 1

    async def send(self, msg: RmrMessage) -> int:
        if self._closed:
            raise RmrClosedError("endpoint closed")
        return await asyncio.to_thread(self._send_blocking, msg)

    def _rts_blocking(self, received: RmrMessage, mtype: int | None, payload: bytes | None) -> None:
        buf = received.via
        if not isinstance(buf, _NativeBuf) or buf.ptr is None:
            raise RmrSendError(RmrState.BADARG, "rts needs a message received by this native endpoint, once")
        with self._lock:
            ptr = buf.take()
            if payload is not None:  # ricxappframe's rmr_rts_msg skips an empty payload: set it here
                self._rmr.set_payload_and_length(payload, ptr)
            if mtype is not None:
                ptr.contents.mtype = mtype
            ptr = self._rmr.rmr_rts_msg(self._ctx, ptr)
            self._check(ptr, "rts")

    async def rts(self, received: RmrMessage, mtype: int | None = None, payload: bytes | None = None) -> None:
        if self._closed:
            raise RmrClosedError("endpoint closed")
        await asyncio.to_thread(self._rts_blocking, received, mtype, payload)

    def _wormhole_blocking(self, target: str, msg: RmrMessage) -> None:
        rmr = self._rmr
        with self._lock:
            whid = self._wormholes.get(target)
            if whid is None or whid < 0:
                whid = rmr.rmr_wh_open(self._ctx, target.encode())
                if whid < 0:
                    raise RmrSendError(RmrState.NOWHOPEN, f"cannot open wormhole to {target}")
                self._wormholes[target] = whid
            ptr = self._fill(rmr.rmr_alloc_msg(self._ctx, max(len(msg.payload), 1)), msg)
            ptr = rmr.rmr_wh_send_msg(self._ctx, whid, ptr)
            self._check(ptr, f"wormhole send to {target}")

    async def wormhole_send(self, target: str, msg: RmrMessage) -> None:
        if self._closed:
            raise RmrClosedError("endpoint closed")
        await asyncio.to_thread(self._wormhole_blocking, target, msg)

    async def receive(self, timeout: float | None = None) -> RmrMessage:
        if self._closed and self._queue.empty():
            raise RmrClosedError("endpoint closed")
        return await asyncio.wait_for(self._queue.get(), timeout)

    def _receive_loop(self) -> None:
        rmr = self._rmr
        while not self._stop.is_set():
            ptr = rmr.rmr_torcv_msg(self._ctx, None, self.POLL_MS)
            if self._stop.is_set():
                break
            if not ptr or ptr.contents.state == RmrState.TIMEOUT:
                if ptr:
                    rmr.rmr_free_msg(ptr)
                continue
            if ptr.contents.state not in (RmrState.OK, RmrState.TRUNC):
                rmr.rmr_free_msg(ptr)
                continue
            msg = self._to_message(ptr)
            if msg.mtype == Mtype.HEALTH_CHECK_REQ:
                try:
                    self._rts_blocking(msg, Mtype.HEALTH_CHECK_RESP, b"OK\n")
                except RmrSendError:
                    pass
                continue
            self._loop.call_soon_threadsafe(self._queue.put_nowait, msg)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 2 * self.POLL_MS / 1000 + 1)
        self._rmr.rmr_close(self._ctx)

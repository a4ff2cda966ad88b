"""Sans-IO RMR framing: SI95 transport header + RMR header v3 (`shared/design/rmr-wire.md` §2-§6).

`RmrFramer` is fed bytes with `receive_data` and hands out whole messages with `next_frame` (or the
sentinel `NEED_DATA`), like `h11.Connection`. A bad frame raises `RmrFrameError` and leaves the framer
broken for good: the owner closes that connection and nothing else. `encode_frame` turns a message into
the bytes C would send, with our own src/srcip.
"""
from __future__ import annotations

import struct

from .message import (
    INT32_MAX,
    SRC_MAX,
    XID_LEN,
    RmrEncodeError,
    RmrFrameError,
    RmrMessage,
)

TRANSPORT_LEN = 50
HDR_V3_LEN = 280
D1_LEN = 4
MIN_FRAME = TRANSPORT_LEN + HDR_V3_LEN  # a frame with no d1 at all is still well formed
DEFAULT_MAX_FRAME = 64 << 20
FLAG_CALL = 0x04


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()

# Everything from frame byte 4 to the end of the v3 header, big-endian. flags is the one host-order (LE)
# field (P4): it is written here as the BE integer whose bytes equal le32(flags).
_HEADER = struct.Struct(">I c 41x iii 32s 32x 64s 32s 4x 16x I iiiii 64s")
_LE32 = struct.Struct("<I")
# Decoding: header from frame byte 50, fixed offsets (C ignores len0 for these).
_DECODE = struct.Struct(">iii 32s 32x 64s 32s 4x 16x I iiiii 64s")  # flags read BE: test _CALL_FLAG_BE
_CALL_FLAG_BE = 0x04000000  # le32(0x04) read as BE


# A connection carries few distinct src/srcip/meid values: decode each once (bounded, so garbage from a
# peer cannot grow it without limit).
_TEXT_CACHE: dict[bytes, str] = {}
_MEID_CACHE: dict[bytes, str] = {}
_CACHE_MAX = 4096
_new = object.__new__
_set = object.__setattr__


def _cstr(raw: bytes) -> str:
    # Addresses are ASCII up to the first NUL; never fail on a peer's garbage.
    text = _TEXT_CACHE.get(raw)
    if text is None:
        text = raw.split(b"\0", 1)[0].decode("ascii", "replace")
        if len(_TEXT_CACHE) >= _CACHE_MAX:
            _TEXT_CACHE.clear()
        _TEXT_CACHE[raw] = text
    return text


def meid_from_wire(raw: bytes) -> str:
    # Keep the RmrMessage invariant (<= 31 ASCII chars) whatever a peer sent, so an rts never fails on it.
    text = _MEID_CACHE.get(raw)
    if text is None:
        cut = raw.split(b"\0", 1)[0][:31]
        text = cut.decode("ascii") if cut.isascii() else bytes(b if b < 128 else 63 for b in cut).decode("ascii")
        if len(_MEID_CACHE) >= _CACHE_MAX:
            _MEID_CACHE.clear()
        _MEID_CACHE[raw] = text
    return text


def check_address(addr: str, what: str) -> bytes:
    raw = addr.encode("ascii", "strict") if addr.isascii() else b""
    if not raw and addr:
        raise RmrEncodeError(f"{what} {addr!r} is not ASCII")
    if len(raw) > SRC_MAX or b"\0" in raw:
        raise RmrEncodeError(f"{what} {addr!r} is longer than {SRC_MAX} chars or holds a NUL")
    return raw


def encode_frame(msg: RmrMessage, src: bytes, srcip: bytes) -> bytes:
    """Bytes of one frame (§5). `src`/`srcip` are *this* process's addresses, already checked ASCII bytes
    (see `check_address`): every frame, RTS included, carries the sender's own return address."""
    payload = msg.payload
    trace = msg.trace
    plen = len(payload)
    length = TRANSPORT_LEN + HDR_V3_LEN + len(trace) + D1_LEN + plen
    if length > INT32_MAX:
        raise RmrEncodeError(f"frame of {length} bytes does not fit C's signed 32-bit length (P5)")
    head = _HEADER.pack(length, b"$", msg.mtype, plen, 3, msg.xaction, src, msg.meid.encode("ascii"),
                        _CALL_FLAG_BE if msg.call else 0, HDR_V3_LEN, len(trace), D1_LEN, 0, msg.sub_id, srcip)
    d1 = bytes((msg.call_id, 0, 0, 0))
    return b"".join((_LE32.pack(length), head, trace, d1, payload))


def decode_frame(frame: bytes | bytearray | memoryview, via: object = None) -> RmrMessage:
    """Decode exactly one whole frame (its first 4 bytes give its length). Raises `RmrFrameError`."""
    framer = RmrFramer(max_frame=max(len(frame), MIN_FRAME))
    framer.receive_data(bytes(frame))
    msg = framer.next_frame(via)
    if msg is NEED_DATA:
        raise RmrFrameError(f"incomplete frame: {len(frame)} bytes")
    if framer.buffered:
        raise RmrFrameError(f"{framer.buffered} bytes after the frame")
    return msg  # type: ignore[return-value]


class RmrFramer:
    """Reassembles frames from one byte stream (one per socket, accepted and dialled alike).

    Args:
        max_frame: longest frame accepted; C has no limit, so the default is generous (64 MiB).
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        if max_frame < MIN_FRAME:
            raise ValueError(f"max_frame must be at least {MIN_FRAME}")
        self.max_frame = min(max_frame, INT32_MAX)
        # Unconsumed input is _buf[_off:] followed by _parts. Slicing immutable bytes copies a payload once
        # (a bytearray would copy twice); a frame longer than what is buffered collects its chunks in
        # _parts and joins them once, so a 64 MiB frame in 64 KiB reads stays linear, not quadratic.
        self._buf = b""
        self._off = 0
        self._parts: list[bytes] = []
        self._parts_len = 0
        self._need = 0  # length of the frame _parts are collected for (0: not collecting)
        self.error: RmrFrameError | None = None
        self.frames = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as a message."""
        return len(self._buf) - self._off + self._parts_len

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the socket (any split; call `next_frame` until NEED_DATA after each).
        Raises the stored `RmrFrameError` once the framer is broken."""
        if self.error is not None:
            raise self.error
        if self._need:
            self._parts.append(bytes(data))
            self._parts_len += len(data)
        elif self._off >= len(self._buf):
            self._buf = bytes(data)  # the common case: everything before was consumed, no copy
            self._off = 0
        else:
            self._buf = self._buf[self._off:] + data  # a partial frame (< one read) plus the new chunk
            self._off = 0

    def discard(self) -> int:
        """Drop everything buffered (the connection is closing); returns how many bytes that was. A
        half-received 4 MiB frame must not outlive its socket in a message's `via` reference."""
        dropped = self.buffered
        self._buf, self._off, self._parts, self._parts_len, self._need = b"", 0, [], 0, 0
        return dropped

    def encode(self, msg: RmrMessage, src: str, srcip: str) -> bytes:
        """`encode_frame` with the addresses checked (ASCII, <= 63 chars); raises `RmrEncodeError`."""
        return encode_frame(msg, check_address(src, "src"), check_address(srcip, "srcip"))

    def _fail(self, why: str) -> RmrFrameError:
        self.error = RmrFrameError(f"{why} (frame {self.frames + 1} on this connection)")
        return self.error

    def _length_error(self, length: int) -> RmrFrameError:
        if length >= 1 << 31:
            return self._fail(f"frame length {length} is >= 2**31 (P5)")
        if length < MIN_FRAME:
            return self._fail(f"frame length {length} is below the {MIN_FRAME}-byte minimum")
        return self._fail(f"frame length {length} exceeds max_frame {self.max_frame}")

    def next_frame(self, via: object = None) -> RmrMessage | _NeedData:
        """The next whole message, or `NEED_DATA`. Raises `RmrFrameError` (and stays broken) on a bad frame.
        `via` is stored in the message (the endpoint passes the connection, for rts)."""
        if self.error is not None:
            raise self.error
        if self._need:
            if self.buffered < self._need:
                return NEED_DATA
            self._buf = b"".join([self._buf[self._off:], *self._parts])
            self._off, self._parts, self._parts_len, self._need = 0, [], 0, 0
        buf = self._buf
        off = self._off
        avail = len(buf) - off
        if avail < 4:
            return NEED_DATA
        (length,) = _LE32.unpack_from(buf, off)  # LE word decides on LE hosts, whatever BE/'$' say (§2)
        if length < MIN_FRAME or length > self.max_frame:  # max_frame < 2**31 (P5)
            raise self._length_error(length)
        if avail < length:
            self._need = length
            return NEED_DATA
        (mtype, plen, _ver, xid, src, meid, flags_be, len0, len1, len2, len3, sub_id, srcip) = _DECODE.unpack_from(
            buf, off + TRANSPORT_LEN)
        if len0 < HDR_V3_LEN or (len1 | len2 | len3) < 0:  # an OR of ints is negative iff one of them is
            raise self._fail(f"bad header lengths len0={len0} len1={len1} len2={len2} len3={len3}")
        poff = TRANSPORT_LEN + len0 + len1 + len2 + len3
        if poff > length or plen < 0:
            raise self._fail(f"header lengths end at {poff} (frame length {length}), payload length {plen}")
        base = off + TRANSPORT_LEN + len0
        truncated = poff + plen > length
        if truncated:
            plen = length - poff  # deliver only in-frame bytes, never read past L (§6, P6)
        self._off = off + length
        self.frames += 1
        # new_message() inlined: this runs once per frame
        m = _new(RmrMessage)
        _set(m, "__dict__", {
            "mtype": mtype, "payload": buf[off + poff: off + poff + plen], "sub_id": sub_id,
            "meid": meid_from_wire(meid), "xaction": xid, "src": _cstr(src), "srcip": _cstr(srcip),
            "trace": buf[base: base + len1] if len1 else b"", "call_id": buf[base + len1] if len2 else 0,
            "call": bool(flags_be & _CALL_FLAG_BE), "truncated": truncated, "via": via})
        return m


assert _HEADER.size == TRANSPORT_LEN - 4 + HDR_V3_LEN, _HEADER.size
assert XID_LEN == 32

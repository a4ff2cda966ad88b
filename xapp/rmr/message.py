"""The RMR message as an xApp sees it, the RMR state codes and the errors of this package.

Field meanings follow `shared/design/rmr-wire.md` §3: `xaction` is the 32 raw xid bytes (garbage after a
NUL is kept and echoed, P2), `src`/`srcip` are the return addresses the sender wrote, `call_id`/`call`
are d1[0] and flag 0x04 (§8). A message is validated when built, so one that cannot be framed cannot exist.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

XID_LEN = 32
MEID_MAX = 31  # 32 bytes on the wire including the NUL (P9)
SRC_MAX = 63  # 64 bytes on the wire including the NUL
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


class RmrState(enum.IntEnum):
    """RMR state codes (`rmr_get_consts()`, §12); carried by `RmrSendError.state`."""

    OK = 0
    BADARG = 1
    NOENDPT = 2
    EMPTY = 3
    NOHDR = 4
    SENDFAILED = 5
    CALLFAILED = 6
    NOWHOPEN = 7
    WHID = 8
    OVERFLOW = 9
    RETRY = 10
    RCVFAILED = 11
    TIMEOUT = 12
    UNSET = 13
    TRUNC = 14
    INITFAILED = 15


_CONST_KEYS = ("RMR_MAX_XID", "RMR_MAX_SID", "RMR_MAX_MEID", "RMR_MAX_SRC", "RMR_MAX_RCV_BYTES", "RMRFL_NONE",
               "RMRFL_AUTO_ALLOC", "RMRFL_MTCALL", "RMR_DEF_SIZE", "RMR_VOID_MSGTYPE", "RMR_VOID_SUBID")
_CONST_VALUES = (32, 32, 32, 64, 2048, 0, 3, 2, 0, -1, -1)


def rmr_consts_json() -> str:
    """The string C's `rmr_get_consts()` returns (§12): keys in its order, `"K": v` joined by `,`.
    RMR_ERR_NOTSUPP (16) is not part of it."""
    pairs = list(zip(_CONST_KEYS, _CONST_VALUES, strict=True)) + [
        ("RMR_OK" if s == RmrState.OK else f"RMR_ERR_{s.name}", int(s)) for s in RmrState]
    return "{ " + ",".join(f'"{k}": {v}' for k, v in pairs) + " }"


class Mtype(enum.IntEnum):
    """RIC message types used in Weaver (`RIC_message_types.h`, §13)."""

    RMRRM_TABLE_DATA = 20
    RMRRM_REQ_TABLE = 21
    RMRRM_TABLE_STATE = 22
    HEALTH_CHECK_REQ = 100
    HEALTH_CHECK_RESP = 101
    E2_SETUP_REQ = 12001
    E2_SETUP_RESP = 12002
    E2_SETUP_FAILURE = 12003
    SUB_REQ = 12010
    SUB_RESP = 12011
    SUB_FAILURE = 12012
    SUB_DEL_REQ = 12020
    SUB_DEL_RESP = 12021
    CONTROL_REQ = 12040
    CONTROL_ACK = 12041
    CONTROL_FAILURE = 12042
    INDICATION = 12050
    ERROR_INDICATION = 10030


class RmrError(Exception):
    """Base of every error this package raises."""


class RmrFrameError(RmrError, ValueError):
    """Malformed bytes from a peer; the connection they came on must be closed (and nothing else)."""


class RmrEncodeError(RmrError, ValueError):
    """A message or address that cannot be put on the wire (too long, out of range)."""


class RmrSendError(RmrError):
    """A send, rts, wormhole send or call that delivered nothing; `state` is the RMR state code."""

    def __init__(self, state: RmrState, detail: str):
        self.state = RmrState(state)
        super().__init__(f"{self.state.name} ({int(self.state)}): {detail}")


class RmrClosedError(RmrError):
    """The endpoint was closed."""


@dataclass(frozen=True)  # no slots: the decoder fills __dict__ in one step (2-3x faster than slots)
class RmrMessage:
    """One RMR message. `via` is set by the endpoint on received messages (the connection it arrived on,
    used by `rts` as its fallback); it is opaque, not compared and not printed."""

    mtype: int
    payload: bytes = b""
    sub_id: int = -1
    meid: str = ""
    xaction: bytes = bytes(XID_LEN)
    src: str = ""
    srcip: str = ""
    trace: bytes = b""
    call_id: int = 0
    call: bool = False
    truncated: bool = False
    via: object = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not INT32_MIN <= self.mtype <= INT32_MAX:
            raise RmrEncodeError(f"mtype {self.mtype} is not a signed 32-bit integer")
        if not INT32_MIN <= self.sub_id <= INT32_MAX:
            raise RmrEncodeError(f"sub_id {self.sub_id} is not a signed 32-bit integer")
        if not isinstance(self.payload, bytes):
            object.__setattr__(self, "payload", bytes(self.payload))
        if len(self.xaction) != XID_LEN:
            if len(self.xaction) > XID_LEN:
                raise RmrEncodeError(f"xaction is {len(self.xaction)} bytes; at most {XID_LEN}")
            object.__setattr__(self, "xaction", bytes(self.xaction).ljust(XID_LEN, b"\0"))
        if len(self.meid) > MEID_MAX or not self.meid.isascii() or "\0" in self.meid:
            raise RmrEncodeError(f"meid {self.meid!r} must be at most {MEID_MAX} ASCII chars, no NUL")
        if not 0 <= self.call_id <= 255:
            raise RmrEncodeError(f"call_id {self.call_id} is not in 0..255")
        if len(self.trace) >= 1 << 24:
            raise RmrEncodeError("trace too long")

    @property
    def xid(self) -> bytes:
        """The xid for display: the raw 32 bytes cut at the first NUL."""
        return self.xaction.split(b"\0", 1)[0]

    def replace(self, **changes) -> RmrMessage:
        return replace(self, **changes)


_set = object.__setattr__


def new_message(mtype: int, payload: bytes, sub_id: int, meid: str, xaction: bytes, src: str, srcip: str,
                trace: bytes, call_id: int, call: bool, truncated: bool, via: object) -> RmrMessage:
    """Build a message from fields a decoder has already checked, skipping validation (hot path)."""
    m = object.__new__(RmrMessage)
    _set(m, "__dict__", {"mtype": mtype, "payload": payload, "sub_id": sub_id, "meid": meid, "xaction": xaction,
                         "src": src, "srcip": srcip, "trace": trace, "call_id": call_id, "call": call,
                         "truncated": truncated, "via": via})
    return m


def reply_message(received: RmrMessage, mtype: int | None = None, payload: bytes | None = None) -> RmrMessage:
    """The message an rts of `received` sends (§7): xid, meid, sub_id, trace and call-id kept, call flag
    cleared, mtype/payload replaced when given. Checks only the new fields (the rest are already valid)."""
    if mtype is None:
        mtype = received.mtype
    elif not INT32_MIN <= mtype <= INT32_MAX:
        raise RmrEncodeError(f"mtype {mtype} is not a signed 32-bit integer")
    if payload is None:
        payload = received.payload
    elif not isinstance(payload, bytes):
        payload = bytes(payload)
    return new_message(mtype, payload, received.sub_id, received.meid, received.xaction, received.src,
                       received.srcip, received.trace, received.call_id, False, False, None)

"""The supervisor <-> worker link: length-prefixed JSON frames over a local socket pair (sans-IO).

Nothing read from the other end is executed: a frame is a 4-byte big-endian length and a UTF-8 JSON
object with a string `t` (its type); protobuf messages travel as base64 of their wire bytes and are
parsed with their own message class. A frame over MAX_FRAME, bad JSON, or a message without a known
`t` is a LinkError (the supervisor then stops the worker: it does not guess).

Supervisor -> worker: connected, disconnected, lease, revoke, cross_site (the lease stream's events, as
agent.lease_client emits them), checkpoint (a request), stop.
Worker -> supervisor: hello (device, mode and why, job, parameters: once, after the job is built), or
refused (the job or config is bad: the one line the operator sees), usage,
release, transfer, round (what the worker would send the broker), mode (a switch), snapshot (status,
lease history and the /metrics exposition, for the supervisor's inspection service), checkpoint_done.
"""
from __future__ import annotations

import base64
import json
import struct
from dataclasses import asdict, fields

from agent.enforcer import LeaseTerms

MAX_FRAME = 8 << 20
_LEN = struct.Struct(">I")
TO_WORKER = ("connected", "disconnected", "lease", "revoke", "cross_site", "checkpoint", "stop")
TO_SUPERVISOR = ("hello", "refused", "usage", "release", "transfer", "round", "mode", "snapshot", "checkpoint_done")


class LinkError(ValueError):
    """A frame the other end must not have sent."""


def encode(msg: dict) -> bytes:
    body = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME:
        raise LinkError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    """Bytes in, messages out; `kinds` is what this end accepts."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        out = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise LinkError(f"frame of {n} bytes exceeds {MAX_FRAME}")
            if len(self._buf) < _LEN.size + n:
                break
            body = bytes(self._buf[_LEN.size:_LEN.size + n])
            del self._buf[:_LEN.size + n]
            try:
                msg = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise LinkError(f"bad JSON frame: {exc}") from None
            if not isinstance(msg, dict) or msg.get("t") not in self.kinds:
                raise LinkError(f"unexpected message {str(msg)[:80]!r}")
            out.append(msg)
        return out


def read_frames(sock, dec: FrameDecoder, on_message) -> None:
    """Feed `on_message` every message read from `sock` until it closes (the one read loop of both ends;
    OSError and LinkError are the caller's)."""
    while data := sock.recv(1 << 16):
        for msg in dec.feed(data):
            on_message(msg)


def pb(msg) -> str:
    return base64.b64encode(msg.SerializeToString()).decode()


def unpb(cls, text):
    """`cls` parsed from base64 wire bytes (LinkError when they are not)."""
    if not isinstance(text, str):
        raise LinkError(f"expected base64 {cls.__name__}, got {type(text).__name__}")
    try:
        out = cls()
        out.ParseFromString(base64.b64decode(text, validate=True))
    except Exception as exc:  # noqa: BLE001 - binascii and protobuf decode errors alike
        raise LinkError(f"bad {cls.__name__}: {exc}") from None
    return out


_TERMS = {f.name for f in fields(LeaseTerms)}


def terms_to_json(t: LeaseTerms) -> dict:
    return asdict(t)


def terms_from_json(d) -> LeaseTerms:
    if not isinstance(d, dict) or set(d) != _TERMS:
        raise LinkError(f"lease terms need exactly {sorted(_TERMS)}")
    try:
        return LeaseTerms(**d)
    except (TypeError, ValueError) as exc:
        raise LinkError(f"bad lease terms: {exc}") from None

"""The two errors every E2 codec raises.

Decoders of untrusted bytes raise only `E2DecodeError`; encoders refuse values with `E2EncodeError`.
Both are `ValueError`s so a caller that only knows "bad value" still catches them. `where` names the
IE path or byte offset of the failure when the codec knows it.
"""
from __future__ import annotations


class E2DecodeError(ValueError):
    """Bytes that do not decode: message names what failed and where."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(f"{message} (at {where})" if where else message)
        self.where = where


class E2EncodeError(ValueError):
    """A value that cannot be encoded (out of range, wrong type, too long)."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(f"{message} (at {where})" if where else message)
        self.where = where

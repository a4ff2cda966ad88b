"""Hand-written APER reader and writer for the hot E2AP messages (X.691 aligned PER, v2 IEs): RICindication
(read and written) and RICcontrolRequest (written: the xApp sends one whenever a site's envelope or quota
changes; through pycrate it was two fifths of a 1,000-site tick, `weaver bench scale`).

Every E2 node sends one RICindication per subscription per reporting period, so `decode_e2ap` reads them
here without pycrate (and without pycrate's lock). The reader accepts exactly the canonical encoding of the
v2 RICindication: octet-aligned fields, zero padding bits, minimal length determinants, no extension
additions, every open type consumed exactly, the whole input consumed. Anything else - a fragmented
(>= 16 kB) field, an unknown or repeated IE, an extension bit, a truncation - raises `Unsupported`, and the
caller decodes the same bytes with the pycrate reference path, which either returns the value or raises
E2DecodeError. So the two paths can only differ if this reader accepts bytes and returns a different value,
which tests/e2sm/test_fast_e2ap.py checks against the reference on generated and mutated messages.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from e2sm.e2ap import RicControlRequest, RicIndication, RicRequestId

__all__ = ["Invalid", "Unsupported", "decode_ric_indication", "encode_control_request", "encode_ric_indication"]


class Unsupported(Exception):
    """The fast reader does not handle these bytes; decode them on the reference path."""


class Invalid(Unsupported):
    """The fast reader is sure the reference path refuses these bytes too (it read every field as the
    reference would, then found a truncation, trailing data or a violated constraint)."""


# RICcontrolRequest IE ids (E2AP v2 section 9.1.1.8)
_CTRL_HEADER, _CTRL_MESSAGE, _CTRL_ACK = 22, 23, 21

# RICindication IE ids (E2AP v2 section 9.1.1.7) and the ones that must be present.
_REQUEST_ID, _FUNCTION_ID, _ACTION_ID, _SN, _TYPE, _HEADER, _MESSAGE, _CALL_PROCESS_ID = 29, 5, 15, 27, 28, 25, 26, 20
_MANDATORY_BITS = sum(1 << ie for ie in (_REQUEST_ID, _FUNCTION_ID, _ACTION_ID, _TYPE, _HEADER, _MESSAGE))


_PLAIN: dict[type, tuple[str, ...]] = {}    # classes whose fields are these names, kept in an instance __dict__


def _plain(cls: type, names: tuple[str, ...]) -> bool:
    """Whether `cls`'s fields are `names`, in that order, kept in an instance __dict__ (no __slots__)."""
    slotted = any("__slots__" in vars(k) for k in cls.__mro__[:-1])
    if slotted or tuple(f.name for f in dataclasses.fields(cls)) != names:
        return False
    _PLAIN[cls] = names
    return True


def build_unchecked(cls: type, names: tuple[str, ...], values: tuple) -> Any:
    """A frozen dataclass built without its __post_init__ checks, for a reader that has enforced the same
    constraints while parsing (re-checking them cost a third of a decode). Falls back to the checked
    constructor if the class's fields are not `names`, in that order (a field added or renamed), or live
    in slots. One dict update, not a frozen-safe object.__setattr__ a field (which cost more than the checks)."""
    if _PLAIN.get(cls) is not names and not _plain(cls, names):
        return cls(*values)
    obj = object.__new__(cls)
    obj.__dict__.update(zip(names, values, strict=True))
    return obj


_REQUEST_ID_FIELDS = ("requestor", "instance")
_INDICATION_FIELDS = ("request_id", "ran_function_id", "action_id", "header", "message", "sn", "indication_type",
                      "call_process_id")


def _length(data: bytes, i: int) -> tuple[int, int]:
    """Unconstrained length determinant (X.691 11.9.3.6-8) at octet i -> (length, next offset).
    Fragmented lengths (>= 16384) are left to the reference path; non-minimal forms too."""
    b = data[i]
    if b < 0x80:
        return b, i + 1
    if b < 0xC0:
        n = ((b & 0x3F) << 8) | data[i + 1]
        if n < 0x80:
            raise Unsupported("non-minimal length determinant")
        return n, i + 2
    raise Unsupported("fragmented length")


def decode_ric_indication(data: bytes) -> RicIndication:
    """Decode a complete E2AP-PDU holding a RICindication, or raise Unsupported."""
    try:
        return _decode(data)
    except IndexError:
        raise Unsupported("truncated") from None


def _decode(data: bytes) -> RicIndication:  # noqa: C901 - one straight pass over the IEs
    # E2AP-PDU: CHOICE (ext bit 0, index 0 initiatingMessage) + pad, procedureCode 5, criticality ignore + pad
    if data[0] != 0x00 or data[1] != 0x05 or data[2] != 0x40:
        raise Unsupported("not a RICindication initiatingMessage")
    length, i = _length(data, 3)
    if i + length != len(data):
        raise Unsupported("open type length does not match the PDU")
    # RICindication SEQUENCE: ext bit 0 + pad; protocolIEs SIZE(0..65535) count as 16 aligned bits
    if data[i] != 0x00:
        raise Unsupported("RICindication extension bit or padding set")
    count = (data[i + 1] << 8) | data[i + 2]
    i += 3
    request_id = function_id = action_id = sn = ind_type = header = message = call_process_id = None
    size = len(data)
    seen = 0                                   # a bit per IE id (all below 64)
    for _ in range(count):
        ie_id = (data[i] << 8) | data[i + 1]
        if ie_id >= 64 or seen >> ie_id & 1:
            raise Unsupported(f"IE {ie_id} unknown or repeated")
        seen |= 1 << ie_id
        if data[i + 2] not in (0x00, 0x40, 0x80):     # criticality reject / ignore / notify, padding bits zero
            raise Unsupported("IE criticality")
        n = data[i + 3]                            # the open type's length: one octet below 128 (inline)
        j = i + 4
        if n >= 0x80:
            n, j = _length(data, i + 3)
        end = j + n
        if end > size:
            raise Unsupported("IE runs past the PDU")
        if ie_id == _HEADER or ie_id == _MESSAGE or ie_id == _CALL_PROCESS_ID:
            octets = data[j]
            k = j + 1
            if octets >= 0x80:
                octets, k = _length(data, j)
            if k + octets != end:
                raise Unsupported("OCTET STRING does not fill its IE")
            if ie_id == _HEADER:
                header = data[k:end]
            elif ie_id == _MESSAGE:
                message = data[k:end]
            else:
                call_process_id = data[k:end]
        elif ie_id == _REQUEST_ID:
            # RICrequestID SEQUENCE {ricRequestorID 0..65535, ricInstanceID 0..65535, ...}
            if n != 5 or data[j] != 0x00:
                raise Unsupported("RICrequestID shape")
            request_id = build_unchecked(RicRequestId, _REQUEST_ID_FIELDS,
                                         ((data[j + 1] << 8) | data[j + 2], (data[j + 3] << 8) | data[j + 4]))
        elif ie_id == _FUNCTION_ID:
            if n != 2:
                raise Unsupported("RANfunctionID shape")
            function_id = (data[j] << 8) | data[j + 1]
            if function_id > 4095:
                raise Unsupported("RANfunctionID range")
        elif ie_id == _ACTION_ID:
            if n != 1:
                raise Unsupported("RICactionID shape")
            action_id = data[j]
        elif ie_id == _SN:
            if n != 2:
                raise Unsupported("RICindicationSN shape")
            sn = (data[j] << 8) | data[j + 1]
        elif ie_id == _TYPE:
            # ENUMERATED {report, insert, ...}: ext bit, 1 index bit, 6 zero pad bits
            if n != 1 or data[j] not in (0x00, 0x40):
                raise Unsupported("RICindicationType shape")
            ind_type = "report" if data[j] == 0x00 else "insert"
        else:
            raise Unsupported(f"IE {ie_id}")
        i = end
    if i != size or seen & _MANDATORY_BITS != _MANDATORY_BITS:
        raise Unsupported("trailing bytes or a mandatory IE missing")
    # every field's constraint was met above: two-octet ids, RANfunctionID <= 4095, one-octet action id,
    # a known type, bytes for the octet strings
    return build_unchecked(RicIndication, _INDICATION_FIELDS, (request_id, function_id, action_id, header, message,
                                                               sn, ind_type, call_process_id))


# ---- encoder -------------------------------------------------------------------------------------------
def _put_length(n: int) -> bytes:
    """Unconstrained length determinant for n < 16384 (longer fields need fragments: reference path)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes((0x80 | n >> 8, n & 0xFF))
    raise Unsupported("fragmented length")


def _ie(ie_id: int, value: bytes) -> bytes:
    # id (2 octets), criticality reject (+ pad), open type length, value
    return bytes((ie_id >> 8, ie_id & 0xFF, 0x00)) + _put_length(len(value)) + value


def encode_ric_indication(msg: RicIndication) -> bytes:
    """The APER bytes pycrate writes for `msg` (the dataclass has validated every range), or Unsupported
    when a field needs length fragments (>= 16 kB), which the pycrate path handles."""
    ies = [
        _ie(_REQUEST_ID, _request_id(msg.request_id)),
        _ie(_FUNCTION_ID, msg.ran_function_id.to_bytes(2, "big")),
        _ie(_ACTION_ID, bytes((msg.action_id,))),
    ]
    if msg.sn is not None:
        ies.append(_ie(_SN, msg.sn.to_bytes(2, "big")))
    ies.append(_ie(_TYPE, b"\x00" if msg.indication_type == "report" else b"\x40"))
    ies.append(_ie(_HEADER, _put_length(len(msg.header)) + msg.header))
    ies.append(_ie(_MESSAGE, _put_length(len(msg.message)) + msg.message))
    if msg.call_process_id is not None:
        ies.append(_ie(_CALL_PROCESS_ID, _put_length(len(msg.call_process_id)) + msg.call_process_id))
    body = b"\x00" + len(ies).to_bytes(2, "big") + b"".join(ies)
    return b"\x00\x05\x40" + _put_length(len(body)) + body


def _request_id(r: RicRequestId) -> bytes:
    return bytes((0, r.requestor >> 8, r.requestor & 0xFF, r.instance >> 8, r.instance & 0xFF))


def encode_control_request(msg: RicControlRequest) -> bytes:
    """The APER bytes pycrate writes for `msg` (the dataclass has validated every range), or Unsupported
    when a field needs length fragments (>= 16 kB). IEs in the order `e2sm.e2ap` gives them, each with
    criticality reject; RICcontrolAckRequest is the extensible ENUMERATED {noAck, ack, ...}."""
    ies = [_ie(_REQUEST_ID, _request_id(msg.request_id)), _ie(_FUNCTION_ID, msg.ran_function_id.to_bytes(2, "big"))]
    if msg.call_process_id is not None:
        ies.append(_ie(_CALL_PROCESS_ID, _put_length(len(msg.call_process_id)) + msg.call_process_id))
    ies.append(_ie(_CTRL_HEADER, _put_length(len(msg.header)) + msg.header))
    ies.append(_ie(_CTRL_MESSAGE, _put_length(len(msg.message)) + msg.message))
    if msg.ack_request is not None:
        ies.append(_ie(_CTRL_ACK, b"\x40" if msg.ack_request else b"\x00"))
    body = b"\x00" + len(ies).to_bytes(2, "big") + b"".join(ies)
    return b"\x00\x04\x00" + _put_length(len(body)) + body

"""Hand-written APER readers and writers for the hot E2SM-KPM payloads: indication header format 1 and
indication message format 1 (v02.03 and v03.00 modules; X.691 aligned PER, X.690 REAL contents).

The readers return the same `e2sm.kpm` dataclasses as the asn1tools reference path, for exactly the
encodings they recognise: root values only (every extension bit 0), zero padding bits, minimal lengths, no
fragmentation, the labels Weaver models (noLabel, sliceID), every constraint met, the whole input consumed.
For anything else they raise `Unsupported`, and `e2sm.kpm` decodes the bytes with asn1tools under
`check_constraints=True`, which returns the value or raises E2DecodeError; so bad input behaves the same on
both paths by construction. `Invalid` (a subclass) says more: the parse went as far as asn1tools' would,
field for field, and found what makes `e2sm.kpm` refuse the bytes (too short or too long, a size or range
outside its constraint, a non-PrintableString character), so a caller may raise E2DecodeError without
asking asn1tools. tests/e2sm/test_fast_kpm.py checks both claims against the reference.

The writers produce asn1tools' exact bytes for values `e2sm.kpm` has validated, or raise `Unsupported`.

Bit layout reminders (X.691): a constrained whole number with range <= 255 is a bit-field, 256 is one
aligned octet, <= 64K two aligned octets, above that a 2-bit octet count then aligned octets; a length with
an upper bound >= 64K is an aligned general length determinant; PrintableString characters take 8 bits and
are aligned unless the string is empty; NULL takes no bits, so a noValue leaves the next item mid-octet.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from asn1tools.codecs import ber as _ber

from e2sm import _asn1, _kpm_kernel
from e2sm._fast import Invalid, Unsupported, build_unchecked
from e2sm.kpm import (
    IndicationMessageFormat1,
    KpmIndicationHeader,
    KpmVersion,
    MeasInfo,
    MeasLabel,
    Snssai,
)

__all__ = ["Invalid", "Unsupported", "decode_indication_header", "decode_indication_message",
           "declined", "encode_indication_header", "encode_indication_message", "reads_as_v2_header"]

_PRINTABLE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?")
_NO_LABEL = MeasLabel()
_U32 = (1 << 32) - 1
# LabelInfoItem extension bit, MeasurementLabel extension bit, its 21 OPTIONAL presence bits: 23 bits
# that are 0 except one presence bit for the two labels Weaver models (noLabel first, sliceID third).
_ONLY_NO_LABEL = 1 << 20
_ONLY_SLICE_ID = 1 << 18


@contextlib.contextmanager
def declined() -> Iterator[None]:
    """Every fast reader here declines (the v2.03 check answers "ask asn1tools"), so `e2sm.kpm` decodes on
    its reference path alone: for the tests that compare the two paths and `bench xapp`'s reference arm. The
    one list of this module's readers, so a reader added here cannot be missed by a caller. It swaps this
    module's attributes: not for use while another thread decodes."""
    def decline(*_args: object) -> Any:
        raise Unsupported("declined: the reference path decides")

    swapped = {"decode_indication_header": decline, "decode_indication_message": decline,
               "reads_as_v2_header": lambda _data: None}
    module = globals()
    saved = {name: module[name] for name in swapped}
    module.update(swapped)
    try:
        yield
    finally:
        module.update(saved)


def _bits(buf: bytes, pos: int, n: int) -> int:
    """n (<= 17) bits at bit position pos; `buf` carries 3 zero guard octets (bounds are checked by callers)."""
    i = pos >> 3
    w = (buf[i] << 16) | (buf[i + 1] << 8) | buf[i + 2]
    return (w >> (24 - (pos & 7) - n)) & ((1 << n) - 1)


def _align(buf: bytes, pos: int) -> int:
    """Skip to the next octet boundary; the padding bits must be zero."""
    r = pos & 7
    if r:
        if buf[pos >> 3] & (0xFF >> r):
            raise Unsupported("non-zero padding")
        pos += 8 - r
    return pos


def _length(buf: bytes, pos: int) -> tuple[int, int]:
    """Aligned general length determinant at an octet boundary (no fragments, minimal form)."""
    i = pos >> 3
    b = buf[i]
    if b < 0x80:
        return b, pos + 8
    if b < 0xC0:
        n = ((b & 0x3F) << 8) | buf[i + 1]
        if n < 0x80:
            raise Unsupported("non-minimal length")
        return n, pos + 16
    raise Unsupported("fragmented length")


def _string(buf: bytes, pos: int, n: int) -> tuple[str, int]:
    """n PrintableString characters (8 bits each, octet-aligned when n > 0)."""
    if n == 0:
        return "", pos
    pos = _align(buf, pos)
    i = pos >> 3
    raw = buf[i:i + n]
    if not _PRINTABLE.issuperset(raw):
        raise Invalid("not a PrintableString")
    return raw.decode("ascii"), pos + 8 * n


def _as_bytes(data: object) -> bytes:
    """The readers slice, concatenate and hash their input, which needs `bytes` itself."""
    if type(data) is bytes:
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise Unsupported("not bytes")    # the reference path names the type in its E2DecodeError


def _real(raw: bytes) -> float:
    """X.690 8.5 REAL contents, evaluated exactly as asn1tools 0.169 does (binary base 2 with a 1- or
    2-octet exponent, or an ISO 6093 decimal form); specials and other forms go to the reference."""
    if not raw:
        return 0.0
    control = raw[0]
    if control in (0x80, 0xC0):
        exponent = raw[1] - 0x100 if raw[1] & 0x80 else raw[1]
        offset = 2
    elif control in (0x81, 0xC1):
        exponent = (raw[1] << 8) | raw[2]
        if exponent & 0x8000:
            exponent -= 0x10000
        offset = 3
    elif control & 0xC0 == 0:
        value = float(raw[1:].replace(b",", b"."))
        if value != value:
            raise Unsupported("NaN")
        return value
    else:
        raise Unsupported("REAL form")
    if len(raw) <= offset:
        raise Unsupported("REAL without mantissa")
    value = float(int.from_bytes(raw[offset:], "big") * 2 ** exponent)
    return -value if control & 0x40 else value


def decode_indication_header(data: bytes, version: KpmVersion) -> KpmIndicationHeader:
    """E2SM-KPM-IndicationHeader format 1 (TimeStamp of 4 octets in v2.03, 8 in v3.00), or Unsupported
    (`_strings` turns the parse's own errors into Invalid or Unsupported)."""
    return _header(_as_bytes(data), version.timestamp_octets)


def _skip_pad(buf: bytes, pos: int) -> tuple[int, bool]:
    """Next octet boundary, and whether the skipped padding bits were non-zero."""
    r = pos & 7
    if not r:
        return pos, False
    return pos + 8 - r, bool(buf[pos >> 3] & (0xFF >> r))


def _header(data: bytes, ts_octets: int) -> KpmIndicationHeader:
    """The header, with the strings' parse remembered (`_strings`)."""
    strings = _strings(data, ts_octets)
    if isinstance(strings, Unsupported):
        raise type(strings)(*strings.args)
    return _header_value(int.from_bytes(data[1:1 + ts_octets], "big"), strings)


def _strings(data: bytes, ts_octets: int) -> tuple | Unsupported:
    """The header's strings, or the refusal as a value (raising it costs more than the lookup). A node sends
    the same strings in every indication and only its TimeStamp octets change, which this reader takes as an
    opaque integer, so the parse (its strings or its refusal) is a function of the other octets alone."""
    if not 0 < len(data) <= _asn1.MAX_PAYLOAD:
        return Invalid("size")
    end = 1 + ts_octets
    if len(data) < end:         # shorter than its fixed-size TimeStamp (and the key below would not show it)
        return Invalid("truncated")
    key = (ts_octets, data[:1], data[end:])
    strings = _HEADER_STRINGS.get(key)
    if strings is None:
        try:
            strings = _header_strings(data, ts_octets)
        except Unsupported as exc:
            strings = exc
        except IndexError:
            strings = Invalid("truncated")
        except (ValueError, OverflowError):
            strings = Unsupported("shape")
        if len(_HEADER_STRINGS) >= _HEADER_STRINGS_MAX:
            _HEADER_STRINGS.clear()
        _HEADER_STRINGS[key] = strings
    return strings


def reads_as_v2_header(data: bytes) -> bool | None:
    """Whether these bytes are also a v2.03 header: True (this reader returns one; every 4-octet TimeStamp
    is plausible), False (Invalid: the reference refuses them too), None (Unsupported: ask the reference).
    The question `e2sm.kpm` asks of every v3.00 header, answered without raising."""
    strings = _strings(_as_bytes(data), 4)
    if isinstance(strings, Invalid):
        return False
    return None if isinstance(strings, Unsupported) else True


_HEADER_STRINGS: dict[tuple, tuple | Unsupported] = {}
_HEADER_STRINGS_MAX = 16384   # entries: a node repeats ~10 (its strings, the TimeStamp fraction of each 100 ms period), a region 1,000 nodes; cleared when full


def _header_strings(data: bytes, ts_octets: int) -> tuple:
    # Padding bits are read leniently here (asn1tools ignores their values, so the parse stays the
    # same) and only decide between a value and Unsupported at the end. That keeps Invalid available
    # for the common question "are these v3.00 bytes also a valid v2.03 header?", whose TimeStamp
    # fraction octets land in padding positions.
    if not 0 < len(data) <= _asn1.MAX_PAYLOAD:
        raise Invalid("size")
    nbits = 8 * len(data)
    buf = data + b"\0\0\0"
    # 3 extension bits (message, formats CHOICE, format 1), 4 presence bits, 1 pad bit
    head = buf[0]
    if head & 0xE0:
        raise Unsupported("extension bit")
    dirty = bool(head & 1)
    present = head >> 1
    i = 1 + ts_octets
    collect = int.from_bytes(buf[1:i], "big")
    pos = 8 * i
    strings: list[str | None] = [None, None, None, None]
    # (presence bit, length bits or 0 for the aligned 2-octet form, upper bound) per PrintableString
    for k, (bit, len_bits, ub) in enumerate(((8, 4, 15), (4, 0, 400), (2, 4, 8), (1, 6, 32))):
        if not present & bit:
            continue
        if _bits(buf, pos, 1):      # asn1tools 0.169 cannot decode string size extensions at all
            raise Invalid("string size extension")
        pos += 1
        if len_bits:
            n = _bits(buf, pos, len_bits)
            pos += len_bits
        else:
            pos, pad = _skip_pad(buf, pos)
            dirty |= pad
            n = (buf[pos >> 3] << 8) | buf[(pos >> 3) + 1]
            pos += 16
        if n > ub:
            raise Invalid("string length")
        if n:
            pos, pad = _skip_pad(buf, pos)
            dirty |= pad
            raw = buf[pos >> 3:(pos >> 3) + n]
            if not _PRINTABLE.issuperset(raw):
                raise Invalid("not a PrintableString")
            strings[k] = raw.decode("ascii")
            pos += 8 * n
        else:
            strings[k] = ""
    end, pad = _skip_pad(buf, pos)
    if pos > nbits or end != nbits:
        raise Invalid("trailing or missing bits")
    if dirty or pad:
        raise Unsupported("non-zero padding")
    del collect                  # read only to walk the same octets as asn1tools; _header takes it again
    return tuple(strings)


_HEADER_FIELDS = ("collect_start_time", "file_format_version", "sender_name", "sender_type", "vendor_name")


def _header_value(collect: int, strings: tuple) -> Any:
    """The KpmIndicationHeader, unchecked: the reader has checked every string (PrintableString, its size
    bound) and the TimeStamp is at most 8 octets."""
    return build_unchecked(KpmIndicationHeader, _HEADER_FIELDS, (collect, *strings))


def decode_indication_message(data: bytes, version: KpmVersion) -> IndicationMessageFormat1:
    """E2SM-KPM-IndicationMessage format 1 (the same bytes in v2.03 and v3.00), or Unsupported."""
    try:
        return _message(_as_bytes(data))
    except IndexError:
        raise Invalid("truncated") from None
    except (ValueError, OverflowError):
        raise Unsupported("shape") from None


def _message(data: bytes) -> IndicationMessageFormat1:  # noqa: C901 - one pass over the PER fields
    if not 0 < len(data) <= _asn1.MAX_PAYLOAD:
        raise Invalid("size")
    nbits = 8 * len(data)
    buf = data + b"\0\0\0"
    # ext(message) ext(formats) index(1 bit: format 1) ext(format 1) measInfoList? granulPeriod? + 2 pad
    head = buf[0]
    if head & 0xF3:
        raise Unsupported("not a root format 1 message")
    has_info, has_period = head & 0x08, head & 0x04
    count = ((buf[1] << 8) | buf[2]) + 1               # MeasurementData SIZE(1..65535)
    if count > 65535:
        raise Invalid("MeasurementData size")
    walked = _records_compiled(buf, nbits, count) if _kpm_kernel.walk_records is not None else None
    records, incomplete, pos = walked if walked is not None else _records(buf, nbits, count)
    # A node repeats the same measInfoList and granulPeriod in every indication: remember the decoded
    # tail by its exact bytes (the MeasInfo objects are immutable, so sharing them is safe).
    # The key holds the presence bits, the bit offset and every byte from the current one on.
    key = (head & 0x0C, pos & 7, data[pos >> 3:])
    cached = _TAILS.get(key)
    if cached is not None:
        meas_info, period = cached
    else:
        meas_info, period = _tail(buf, pos, nbits, has_info, has_period)
        if len(key[2]) <= _TAIL_MAX_BYTES:
            if len(_TAILS) >= _TAILS_MAX:
                _TAILS.clear()
            _TAILS[key] = (meas_info, period)
    return _message_f1(tuple(records), meas_info, period, tuple(incomplete))


def _records(buf: bytes, nbits: int, count: int) -> tuple[list, list, int]:  # noqa: C901 - one pass
    """The MeasurementData items from bit 24 on: (records, indexes of incomplete ones, bit position after)."""
    pos = 24
    records = []
    incomplete = []
    for r in range(count):
        # MeasurementDataItem: ext bit, incompleteFlag presence bit; then MeasurementRecord SIZE(1..2^31-1)
        # as an aligned plain count (one octet below 128, the common case read inline)
        i = pos >> 3
        if not pos & 7 and not buf[i] & 0x3F and buf[i + 1] < 0x80:
            flags = buf[i] >> 6
            n = buf[i + 1]
            pos += 16
        else:
            flags = _bits(buf, pos, 2)
            pos = _align(buf, pos + 2)
            n, pos = _length(buf, pos)
        if flags & 2:
            raise Unsupported("MeasurementDataItem extension")
        if n == 0:
            raise Invalid("empty record")
        record = []
        append = record.append
        for _ in range(n):
            if not pos & 7:                             # item starts on an octet: the common case
                i = pos >> 3
                b = buf[i]
                if b < 0x20:                            # integer: ext 0, index 00, octet count - 1, 3 pad
                    if b & 7:
                        raise Unsupported("non-zero padding")
                    k = (b >> 3) + 1
                    if k > 1 and not buf[i + 1]:
                        raise Unsupported("non-minimal integer")
                    append(buf[i + 1] if k == 1 else int.from_bytes(buf[i + 1:i + 1 + k], "big"))
                    pos += 8 + 8 * k
                    continue
                if b == 0x20 and buf[i + 1] < 0x80:    # real with a short length
                    size = buf[i + 1]
                    if size > 2 and buf[i + 2] == 0x80:  # binary, base 2, 1-octet exponent: what encoders write
                        e = buf[i + 3]
                        # the exact expression asn1tools evaluates (so rounding and overflow agree)
                        append(float(int.from_bytes(buf[i + 4:i + 2 + size], "big") * 2 ** (e - 256 if e & 0x80 else e)))
                    else:
                        append(_real(buf[i + 2:i + 2 + size]))
                    pos += 16 + 8 * size
                    continue
            choice = _bits(buf, pos, 3)
            if choice == 0:
                k = _bits(buf, pos + 3, 2) + 1
                pos = _align(buf, pos + 5)
                i = pos >> 3
                if k > 1 and buf[i] == 0:
                    raise Unsupported("non-minimal integer")
                append(int.from_bytes(buf[i:i + k], "big"))
                pos += 8 * k
            elif choice == 1:                           # real: aligned length + X.690 contents
                pos = _align(buf, pos + 3)
                size, pos = _length(buf, pos)
                i = pos >> 3
                append(_real(buf[i:i + size]))
                pos += 8 * size
            elif choice == 2:                           # noValue NULL: no bits
                append(None)
                pos += 3
            else:
                raise Unsupported("MeasurementRecordItem extension")
        if pos > nbits:
            raise Invalid("truncated")
        if flags & 1:                                   # incompleteFlag ENUMERATED {true, ...}: ext bit
            if _bits(buf, pos, 1):
                raise Unsupported("incompleteFlag extension")
            pos += 1
            incomplete.append(r)
        records.append(tuple(record))
    return records, incomplete, pos


def _records_compiled(buf: bytes, nbits: int, count: int) -> tuple[list, list, int] | None:
    """`_records` through the compiled kernel, or None where it does not take these bytes (then the
    Python walk above reads them, and decides every error)."""
    cap = nbits // 3 + 1                    # a noValue item is 3 bits: no message holds more items
    scratch = _scratch(cap, count)
    ints, reals, special, lens, incomplete, counts = scratch
    pos = _kpm_kernel.walk_records(np.frombuffer(buf, np.uint8), nbits, count, *scratch)
    if pos < 0:
        return None
    total, n_special, n_incomplete = counts.tolist()
    values = ints[:total].tolist()
    if n_special:                           # REALs and noValues (NaN) take their slots
        for j, v in zip(special[:n_special].tolist(), reals[:n_special].tolist(), strict=True):
            values[j] = None if v != v else v
    records = []
    start = 0
    for n in lens[:count].tolist():
        records.append(tuple(values[start:start + n]))
        start += n
    return records, incomplete[:n_incomplete].tolist(), pos


_SCRATCH = threading.local()


def _scratch(items: int, records: int) -> tuple:
    """This thread's output arrays for the kernel, grown to fit (reused: allocating six arrays cost more
    than the walk itself)."""
    arrays = getattr(_SCRATCH, "arrays", None)
    if arrays is None or arrays[0].shape[0] < items or arrays[3].shape[0] < records:
        items = max(items, 4096)
        records = max(records, 256)
        arrays = (np.empty(items, np.int64), np.empty(items, np.float64), np.empty(items, np.int64),
                  np.empty(records, np.int64), np.empty(records, np.int64), np.empty(3, np.int64))
        _SCRATCH.arrays = arrays
    return arrays


_TAILS: dict[tuple, tuple] = {}
_TAILS_MAX = 1024         # entries; cleared when full
_TAIL_MAX_BYTES = 4096    # bounds the cache at 4 MiB


def _tail(buf: bytes, pos: int, nbits: int, has_info: int, has_period: int) -> tuple:
    """measInfoList and granulPeriod of a format-1 message, which must end the input exactly."""
    meas_info = None
    if has_info:
        pos = _align(buf, pos)
        i = pos >> 3
        n_info = ((buf[i] << 8) | buf[i + 1]) + 1       # MeasurementInfoList SIZE(1..65535)
        if n_info > 65535:
            raise Invalid("MeasurementInfoList size")
        pos += 16
        infos = []
        for _ in range(n_info):
            # MeasurementInfoItem ext, MeasurementType ext, index (measName 0 / measID 1)
            head3 = _bits(buf, pos, 3)
            if head3 & 6:
                raise Unsupported("MeasurementInfoItem extension")
            pos += 3
            if head3 == 0:                              # measName PrintableString (SIZE(1..150, ...))
                w = _bits(buf, pos, 9)
                if w & 0x100:           # asn1tools 0.169 cannot decode string size extensions at all
                    raise Invalid("measName size extension")
                size = (w & 0xFF) + 1
                if size > 150:
                    raise Invalid("measName length")
                name, pos = _string(buf, pos + 9, size)
            else:                                       # measID INTEGER (1..65536, ...): ext bit, 2 octets
                if _bits(buf, pos, 1):
                    raise Unsupported("measID extension")
                pos = _align(buf, pos + 1)
                i = pos >> 3
                name = ((buf[i] << 8) | buf[i + 1]) + 1
                pos += 16
            pos = _align(buf, pos)
            n_labels, pos = _length(buf, pos)           # LabelInfoList SIZE(1..2^31-1): plain count
            if n_labels == 0:
                raise Invalid("empty label list")
            labels = []
            for _ in range(n_labels):
                w = (_bits(buf, pos, 12) << 11) | _bits(buf, pos + 12, 11)
                pos += 23
                if w == _ONLY_NO_LABEL:
                    if _bits(buf, pos, 1):              # noLabel ENUMERATED {true, ...}: ext bit only
                        raise Unsupported("noLabel extension")
                    pos += 1
                    labels.append(_NO_LABEL)
                elif w == _ONLY_SLICE_ID:
                    # S-NSSAI: ext bit, sD presence, sST 1 octet (a bit-field), sD 3 aligned octets
                    s = _bits(buf, pos, 10)
                    if s & 0x200:
                        raise Unsupported("S-NSSAI extension")
                    pos += 10
                    sd = None
                    if s & 0x100:
                        pos = _align(buf, pos)
                        i = pos >> 3
                        sd = (buf[i] << 16) | (buf[i + 1] << 8) | buf[i + 2]
                        pos += 24
                    labels.append(MeasLabel(Snssai(s & 0xFF, sd)))
                else:
                    raise Unsupported("label kind")
            infos.append(MeasInfo(name, tuple(labels)))
            if pos > nbits:
                raise Invalid("truncated")
        meas_info = tuple(infos)
    period = None
    if has_period:                                      # GranularityPeriod INTEGER (1..2^32-1)
        k = _bits(buf, pos, 2) + 1
        pos = _align(buf, pos + 2)
        i = pos >> 3
        if k > 1 and buf[i] == 0:
            raise Unsupported("non-minimal integer")
        period = int.from_bytes(buf[i:i + k], "big") + 1
        pos += 8 * k
        if period > _U32:
            raise Invalid("granulPeriod range")
    if pos > nbits or _align(buf, pos) != nbits:
        raise Invalid("trailing or missing bits")
    return meas_info, period


_F1_FIELDS = ("records", "meas_info", "granul_period_ms", "incomplete")


def _message_f1(records: tuple, meas_info: tuple | None, period: int | None, incomplete: tuple) -> Any:
    """The IndicationMessageFormat1, unchecked: the reader above has enforced the same constraints while
    parsing, and re-checking 100 values costs a third of the decode."""
    return build_unchecked(IndicationMessageFormat1, _F1_FIELDS, (records, meas_info, period, incomplete))




# ---- writers -------------------------------------------------------------------------------------------
class _Bits:
    """Aligned-PER bit writer: whole octets go to `out`, the last partial octet waits in `cur`."""

    __slots__ = ("out", "cur", "n")

    def __init__(self) -> None:
        self.out = bytearray()
        self.cur = 0
        self.n = 0

    def put(self, value: int, nbits: int) -> None:
        cur = (self.cur << nbits) | value
        n = self.n + nbits
        out = self.out
        while n >= 8:
            n -= 8
            out.append((cur >> n) & 0xFF)
        self.cur = cur & ((1 << n) - 1)
        self.n = n

    def align(self) -> None:
        if self.n:
            self.out.append((self.cur << (8 - self.n)) & 0xFF)
            self.cur = self.n = 0

    def octets(self, data: bytes) -> None:
        """Append octets at an octet boundary (callers align first)."""
        self.out += data

    def length(self, n: int) -> None:
        """Aligned general length determinant, without fragments."""
        self.align()
        if n < 0x80:
            self.out.append(n)
        elif n < 0x4000:
            self.out += bytes((0x80 | n >> 8, n & 0xFF))
        else:
            raise Unsupported("fragmented length")

    def getvalue(self) -> bytes:
        self.align()
        return bytes(self.out)


def _octets_for(value: int) -> int:
    return max(1, (value.bit_length() + 7) >> 3)


def encode_indication_header(header: KpmIndicationHeader, version: KpmVersion) -> bytes:
    """The bytes asn1tools writes for `header` (already validated and judged plausible by e2sm.kpm)."""
    strings = (header.file_format_version, header.sender_name, header.sender_type, header.vendor_name)
    w = _Bits()
    present = 0
    for s in strings:
        present = (present << 1) | (s is not None)
    w.put(present, 8 - 1)                                   # 3 extension bits (0) + 4 presence bits, then pad
    w.align()
    try:
        w.octets(header.collect_start_time.to_bytes(version.timestamp_octets, "big"))
    except OverflowError:
        raise Unsupported("TimeStamp size") from None
    for s, len_bits in zip(strings, (4, 0, 4, 6), strict=True):
        if s is None:
            continue
        w.put(0, 1)                                         # size-extension bit
        if len_bits:
            w.put(len(s), len_bits)
        else:
            w.align()
            w.octets(len(s).to_bytes(2, "big"))
        if s:
            w.align()
            w.octets(s.encode("ascii"))
    return w.getvalue()


def _put_record_item(w: _Bits, x: int | float | None) -> None:
    if x is None:
        w.put(0b010, 3)                                     # noValue: NULL carries no bits
    elif type(x) is int:
        k = _octets_for(x)
        w.put(k - 1, 5)                                     # ext 0, index 00, octet count - 1
        w.align()
        w.octets(x.to_bytes(k, "big"))
    else:
        if x != x or x in (float("inf"), float("-inf")):
            raise Unsupported("non-finite REAL")
        w.put(0b001, 3)
        contents = _ber.encode_real(x)                      # the same function asn1tools uses
        w.length(len(contents))
        w.octets(bytes(contents))


def _put_meas_info(w: _Bits, info: MeasInfo) -> None:
    name = info.name
    if type(name) is int:
        w.put(0b0010, 4)                                    # item ext, type ext, measID, value ext
        w.align()
        w.octets((name - 1).to_bytes(2, "big"))
    else:
        w.put(0, 4)                                         # item ext, type ext, measName, size ext
        w.put(len(name) - 1, 8)
        w.align()
        w.octets(name.encode("ascii"))
    w.length(len(info.labels))
    for label in info.labels:
        if label.other:
            raise Unsupported("label components other than noLabel/sliceID")
        if label.snssai is None:
            w.put(_ONLY_NO_LABEL << 1, 24)                  # 23 bits + the noLabel extension bit
        else:
            sd = label.snssai.sd
            w.put(_ONLY_SLICE_ID, 23)
            w.put((sd is not None) << 8 | label.snssai.sst, 10)   # S-NSSAI ext, sD present, sST octet
            if sd is not None:
                w.align()
                w.octets(sd.to_bytes(3, "big"))


def encode_indication_message(message: IndicationMessageFormat1, version: KpmVersion) -> bytes:
    """The bytes asn1tools writes for a validated format-1 message, or Unsupported (other formats, label
    kinds Weaver does not model, sizes that need length fragments)."""
    if type(message) is not IndicationMessageFormat1:
        raise Unsupported("not format 1")
    records, info, period = message.records, message.meas_info, message.granul_period_ms
    if not 0 < len(records) <= 65535 or (info is not None and not 0 < len(info) <= 65535):
        raise Unsupported("list size")
    w = _Bits()
    # ext, ext, format 1, ext, measInfoList?, granulPeriod?
    w.put(((info is not None) << 1) | (period is not None), 6)
    w.align()
    w.octets((len(records) - 1).to_bytes(2, "big"))
    incomplete = set(message.incomplete)
    for r, record in enumerate(records):
        flagged = r in incomplete
        w.put(flagged, 2)                                   # ext, incompleteFlag present
        w.length(len(record))
        for x in record:
            _put_record_item(w, x)
        if flagged:
            w.put(0, 1)                                     # ENUMERATED {true, ...}: extension bit
    if info is not None:
        w.align()
        w.octets((len(info) - 1).to_bytes(2, "big"))
        for item in info:
            _put_meas_info(w, item)
    if period is not None:
        k = _octets_for(period - 1)
        w.put(k - 1, 2)
        w.align()
        w.octets((period - 1).to_bytes(k, "big"))
    return w.getvalue()

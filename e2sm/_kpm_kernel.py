"""The MeasurementData walk of a KPM indication message format 1, compiled with numba where it is installed.

This is the hot part of `e2sm._fast_kpm._message`: 100 record items an indication, each a few bits of
CHOICE and an integer or a REAL. The kernel takes only the shapes encoders write (root values, zero
padding, minimal lengths, REALs in the binary base-2 form with a 1-octet exponent and a mantissa below
2**53) and, for anything else, truncation included, answers "not mine" (-1). The caller then walks the same
bytes with the Python reader, so every refusal, Invalid and Unsupported keep coming from one place and the
kernel can only ever produce a value the Python reader produces too (tests/e2sm/test_kpm_kernel.py compares
them on every message the reader tests generate).

Exactness: an integer is at most 4 octets (int64 holds it); a REAL is m * 2**e with m < 2**53 and
-128 <= e <= 127, so float(m) is exact and one IEEE multiplication by the exact double 2.0**e rounds as
Python's `float(m * 2 ** e)` does (exact for e >= 0, one rounding of a float product for e < 0).

Without numba, `walk_records` is None and the Python reader does all the work.
"""
from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - the xApp extra installs numba; exercised only without it
    njit = None

_MAX_MANTISSA_OCTETS = 7


def _bits(buf, pos, n):
    """n (<= 17) bits at bit position pos (the 3 guard octets keep the reads in bounds)."""
    i = pos >> 3
    w = (np.int64(buf[i]) << 16) | (np.int64(buf[i + 1]) << 8) | np.int64(buf[i + 2])
    return (w >> (24 - (pos & 7) - n)) & ((1 << n) - 1)


def _align(buf, pos):
    """The next octet boundary from pos, or -1 where the skipped padding bits are not zero."""
    rem = pos & 7
    if rem == 0:
        return pos
    if buf[pos >> 3] & (0xFF >> rem):
        return -1
    return pos + 8 - rem


def _uint(buf, i, k):
    """k (<= 7) octets from octet i, big-endian."""
    v = np.int64(0)
    for t in range(k):
        v = (v << 8) | np.int64(buf[i + t])
    return v


def _real(buf, nbits, pos, reals, k):
    """A REAL's length octet and contents at octet position pos into reals[k]: the binary base-2 form with
    a 1-octet exponent and a mantissa below 2**53 only. Returns the bit position after it, or -1."""
    i = pos >> 3
    size = np.int64(buf[i])
    if size >= 0x80 or size < 3 or size - 2 > _MAX_MANTISSA_OCTETS:
        return -1
    if pos + 8 + 8 * size > nbits or buf[i + 1] != 0x80:
        return -1
    e = np.int64(buf[i + 2])
    if e & 0x80:
        e -= 256
    m = _uint(buf, i + 3, size - 2)
    if m >> 53:
        return -1
    reals[k] = np.float64(m) * (2.0 ** e)
    return pos + 8 + 8 * size


def _walk(buf, nbits, count, ints, reals, special, lens, incomplete, counts):  # noqa: C901 - one pass over the PER fields
    """Walk `count` MeasurementDataItems from bit 24 of `buf` (which ends in 3 zero guard octets).
    Every integer item j is ints[j]; the k-th REAL or noValue is item special[k], its value reals[k] (NaN
    for a noValue: a binary REAL is never NaN). lens[r] is record r's item count, `incomplete` lists the
    records with an incompleteFlag; counts = (items, specials, incompletes). Returns the bit position
    after the last item, or -1 for anything the kernel does not take."""
    cap = ints.shape[0]
    pos = 24
    j = 0
    ns = 0
    ni = 0
    for r in range(count):
        # MeasurementDataItem: ext bit, incompleteFlag presence bit, then the record's aligned length
        flags = _bits(buf, pos, 2)
        pos = _align(buf, pos + 2)
        if pos < 0:
            return -1
        i = pos >> 3
        b = np.int64(buf[i])
        if b < 0x80:
            n = b
            pos += 8
        elif b < 0xC0:
            n = ((b & 0x3F) << 8) | np.int64(buf[i + 1])
            if n < 0x80:
                return -1
            pos += 16
        else:
            return -1
        if flags & 2 or n == 0 or j + n > cap:
            return -1
        for _ in range(n):
            if pos + 3 > nbits:
                return -1
            # one path for aligned and unaligned items: the Python walk's octet shortcuts gain nothing compiled
            choice = _bits(buf, pos, 3)
            if choice == 0:
                k = _bits(buf, pos + 3, 2) + 1
                pos = _align(buf, pos + 5)
                if pos < 0:
                    return -1
                i = pos >> 3
                if pos + 8 * k > nbits or (k > 1 and buf[i] == 0):
                    return -1
                ints[j] = _uint(buf, i, k)
                j += 1
                pos += 8 * k
            elif choice == 2:
                reals[ns] = np.nan
                special[ns] = j
                ns += 1
                j += 1
                pos += 3
            elif choice == 1:
                pos = _align(buf, pos + 3)
                if pos < 0:
                    return -1
                end = _real(buf, nbits, pos, reals, ns)
                if end < 0:
                    return -1
                special[ns] = j
                ns += 1
                j += 1
                pos = end
            else:                                       # a record item extension: not here
                return -1
        if pos > nbits:
            return -1
        lens[r] = n
        if flags & 1:
            if _bits(buf, pos, 1):
                return -1
            pos += 1
            incomplete[ni] = r
            ni += 1
    counts[0] = j
    counts[1] = ns
    counts[2] = ni
    return pos


if njit is not None:
    _bits = njit(cache=True, nogil=True)(_bits)
    _align = njit(cache=True, nogil=True)(_align)
    _uint = njit(cache=True, nogil=True)(_uint)
    _real = njit(cache=True, nogil=True)(_real)
    walk_records = njit(cache=True, nogil=True)(_walk)
else:  # pragma: no cover
    walk_records = None

python_walk = _walk   # the same function, interpreted (tests run both)


def warm() -> None:
    """Compile the kernel (or load it from numba's cache) now, so that the first indication a process
    decodes does not wait for it: the xApp's ingest calls this when it is built."""
    if walk_records is None:
        return
    one_record = np.frombuffer(bytes((0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x07, 0, 0, 0)), np.uint8)
    cap = 32
    walk_records(one_record, 7 * 8, 1, np.empty(cap, np.int64), np.empty(cap, np.float64),
                 np.empty(cap, np.int64), np.empty(1, np.int64), np.empty(1, np.int64), np.empty(3, np.int64))

"""The compiled MeasurementData walk (e2sm._kpm_kernel) against the Python walk it shortcuts.

The kernel may decline any bytes (the Python walk then reads them and decides every error); where it
takes them, it must give exactly the Python walk's records, incomplete flags and end position. Checked on
generated messages, on every truncation and on mutated bytes; and the kernel must actually take the
messages encoders write, or the xApp's ingest runs the slow walk without anyone noticing.
Also here: the header reader's memo of its strings' parse, keyed without the TimeStamp octets.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2sm import _fast_kpm, _kpm_kernel, bench, kpm
from e2sm._fast import Invalid, Unsupported
from e2sm.kpm import IndicationMessageFormat1, KpmIndicationHeader, KpmVersion
from tests.e2sm.test_fast_kpm import check_same, messages

pytestmark = pytest.mark.skipif(_kpm_kernel.walk_records is None, reason="numba is not installed")


def _python(data: bytes):
    buf = data + b"\0\0\0"
    count = ((buf[1] << 8) | buf[2]) + 1
    try:
        records, incomplete, pos = _fast_kpm._records(buf, 8 * len(data), count)
    except (Unsupported, IndexError, ValueError):
        return "refused"
    return [tuple(r) for r in records], list(incomplete), pos


def _compiled(data: bytes):
    buf = data + b"\0\0\0"
    count = ((buf[1] << 8) | buf[2]) + 1
    out = _fast_kpm._records_compiled(buf, 8 * len(data), count)
    return None if out is None else ([tuple(r) for r in out[0]], list(out[1]), out[2])


def agree(data: bytes) -> bool:
    """The kernel declines or matches the Python walk exactly (repr: 1 and 1.0 differ). True if it took them."""
    if len(data) < 3:
        return False
    got = _compiled(data)
    if got is None:
        return False
    assert repr(got) == repr(_python(data)), data.hex()
    return True


@settings(max_examples=200, deadline=None)
@given(msg=messages())
def test_generated_messages_agree(msg):
    agree(kpm.encode_indication_message(msg, KpmVersion.V3_00))


def test_the_kernel_takes_what_encoders_write():
    for ind in bench.realistic_stream(8):
        assert agree(ind.ric.message)
    mixed = IndicationMessageFormat1(((1, None, 2.5, 70000, None, 0.125), (None, None, 3, 1e-10, 4294967295, 0)),
                                     None, 100, (1,))
    raw = kpm.encode_indication_message(mixed, KpmVersion.V3_00)
    assert agree(raw)
    assert kpm.decode_indication_message(raw, KpmVersion.V3_00) == mixed


def test_truncations_and_mutations_agree():
    rng = random.Random(5)
    samples = [ind.ric.message for ind in bench.realistic_stream(4)]
    taken = 0
    for raw in samples:
        for n in range(3, len(raw)):
            assert not agree(raw[:n]) or _python(raw[:n]) != "refused"
    for _ in range(400):
        raw = bytearray(rng.choice(samples))
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        taken += agree(bytes(raw))
        check_same("decode_indication_message", bytes(raw), KpmVersion.V3_00)
    assert taken > 0


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=3, max_size=200))
def test_random_bytes_agree(raw):
    agree(raw)


def test_interpreted_and_compiled_kernels_are_the_same_function():
    raw = bench.realistic_indication(3).ric.message
    outs = []
    for walk in (_kpm_kernel.walk_records, _kpm_kernel.python_walk):
        buf = np.frombuffer(raw + b"\0\0\0", np.uint8)
        count = ((raw[1] << 8) | raw[2]) + 1
        cap = 8 * len(raw) // 3 + 1
        arrays = (np.zeros(cap, np.int64), np.zeros(cap, np.float64), np.zeros(cap, np.int64),
                  np.zeros(count, np.int64), np.zeros(count, np.int64), np.zeros(3, np.int64))
        pos = walk(buf, 8 * len(raw), count, *arrays)
        outs.append((int(pos), [a.tolist() for a in arrays]))
    assert outs[0][0] > 0
    assert repr(outs[0]) == repr(outs[1])


# ---- the header's memo --------------------------------------------------------------------------------
def test_header_memo_keeps_each_timestamp():
    v = KpmVersion.V3_00
    for t in (1, (3_973_000_000 << 32) | 0x1234, (3_973_000_001 << 32) | 0xFFFF_FFFF):
        hdr = KpmIndicationHeader(t, None, "gnb-sim-1", "gNB-DU", "weaver")
        assert _fast_kpm.decode_indication_header(kpm.encode_indication_header(hdr, v), v) == hdr


def test_header_memo_does_not_confuse_a_truncated_timestamp_with_a_bare_header():
    v = KpmVersion.V3_00
    bare = kpm.encode_indication_header(KpmIndicationHeader(3_973_000_000 << 32), v)
    assert len(bare) == 9
    for n in range(1, 9):
        with pytest.raises(Invalid):
            _fast_kpm.decode_indication_header(bare[:n], v)
    assert _fast_kpm.decode_indication_header(bare, v) == KpmIndicationHeader(3_973_000_000 << 32)


def test_header_memo_repeats_a_refusal():
    v = KpmVersion.V3_00
    raw = bytearray(kpm.encode_indication_header(KpmIndicationHeader(5, None, "gnb"), v))
    raw[0] |= 0x80        # an extension bit
    for _ in range(2):
        with pytest.raises(Unsupported) as info:
            _fast_kpm.decode_indication_header(bytes(raw), v)
        assert type(info.value) is Unsupported


@settings(max_examples=100, deadline=None)
@given(msg=messages())
def test_the_reader_without_numba_gives_the_same_values(msg):
    """Where numba is absent (`walk_records` None) the Python walk alone reads every message."""
    raw = kpm.encode_indication_message(msg, KpmVersion.V3_00)
    with_kernel = repr(_fast_kpm.decode_indication_message(raw, KpmVersion.V3_00))
    saved, _kpm_kernel.walk_records = _kpm_kernel.walk_records, None
    try:
        assert repr(_fast_kpm.decode_indication_message(raw, KpmVersion.V3_00)) == with_kernel
    finally:
        _kpm_kernel.walk_records = saved

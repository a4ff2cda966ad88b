"""The pycrate-free RICindication reader (e2sm._fast) against the pycrate reference path.

Invariant: whenever the fast reader returns a value, the reference returns an equal value (same repr, so
no int/float or bytes/str drift); when it declines (`Unsupported`), `decode_e2ap` falls back and so behaves
exactly like the reference. Checked on generated indications, on the vector, on every truncation and on
mutated bytes.
"""
from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2sm import _fast
from e2sm.e2ap import (
    RicControlRequest,
    RicIndication,
    RicRequestId,
    decode_e2ap,
    decode_e2ap_reference,
    encode_e2ap,
    encode_e2ap_reference,
)
from e2sm.errors import E2DecodeError

indications = st.builds(
    RicIndication, st.builds(RicRequestId, st.integers(0, 65535), st.integers(0, 65535)), st.integers(0, 4095),
    st.integers(0, 255), st.binary(max_size=300), st.binary(max_size=3000), st.none() | st.integers(0, 65535),
    st.sampled_from(["report", "insert"]), st.none() | st.binary(max_size=40))


controls = st.builds(
    RicControlRequest, st.builds(RicRequestId, st.integers(0, 65535), st.integers(0, 65535)), st.integers(0, 4095),
    st.binary(max_size=300) | st.binary(min_size=16370, max_size=16400), st.binary(max_size=3000),
    st.sampled_from([None, True, False]), st.none() | st.binary(max_size=200))


def _reference_outcome(raw: bytes):
    try:
        return repr(decode_e2ap_reference(raw))
    except E2DecodeError:
        return E2DecodeError


def _check_same(raw: bytes) -> str:
    """Assert the fast/public path agrees with the reference on `raw`; returns how the fast reader fared."""
    expected = _reference_outcome(raw)
    try:
        fast = _fast.decode_ric_indication(raw)
    except _fast.Unsupported:
        verdict = "declined"
    else:
        assert repr(fast) == expected, raw.hex()
        verdict = "accepted"
    try:
        got = repr(decode_e2ap(raw))
    except E2DecodeError:
        got = E2DecodeError
    assert got == expected, raw.hex()
    return verdict


@settings(max_examples=150, deadline=None)
@given(indications)
def test_fast_writer_writes_the_bytes_pycrate_writes(msg):
    assert _fast.encode_ric_indication(msg) == encode_e2ap_reference(msg)


@settings(max_examples=200, deadline=None)
@given(controls)
def test_fast_control_writer_writes_the_bytes_pycrate_writes(msg):
    """What the xApp sends (xapp.actuate) comes from the fast writer; a field needing fragments goes to pycrate."""
    try:
        fast = _fast.encode_control_request(msg)
    except _fast.Unsupported:
        assert len(msg.header) + 2 > 16383
        fast = None
    reference = encode_e2ap_reference(msg)
    assert encode_e2ap(msg) == reference
    assert fast in (None, reference)
    assert repr(decode_e2ap(reference)) == repr(msg)


@settings(max_examples=150, deadline=None)
@given(indications)
def test_fast_reader_equals_reference_on_every_canonical_indication(msg):
    raw = encode_e2ap_reference(msg)
    fast = _fast.decode_ric_indication(raw)    # must not decline what pycrate produces
    assert fast == msg
    assert repr(fast) == repr(decode_e2ap_reference(raw))


def test_vector_takes_the_fast_path(vectors_dir):
    raw = bytes.fromhex(json.loads((vectors_dir / "e2ap_ric_indication.json").read_text())["hex"])
    assert _check_same(raw) == "accepted"
    assert decode_e2ap(bytearray(raw)) == decode_e2ap(memoryview(raw)) == decode_e2ap_reference(raw)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 128, 129, 254, 255, 256, 15000])
def test_length_boundaries_take_the_fast_path(size):
    msg = RicIndication(RicRequestId(7, 9), 4095, 255, bytes(size), bytes(range(256)) * 4, sn=65535,
                        indication_type="insert", call_process_id=bytes(size % 200))
    raw = encode_e2ap_reference(msg)
    assert _fast.encode_ric_indication(msg) == raw
    assert _check_same(raw) == "accepted"


@pytest.mark.parametrize("size", [16360, 16383, 16384, 20000])
def test_fragmented_fields_are_declined_and_still_decode(size):
    msg = RicIndication(RicRequestId(1, 2), 2, 1, b"h", bytes(size), call_process_id=b"x")
    raw = encode_e2ap(msg)
    assert raw == encode_e2ap_reference(msg)
    with pytest.raises(_fast.Unsupported):
        _fast.decode_ric_indication(raw)
    with pytest.raises(_fast.Unsupported):
        _fast.encode_ric_indication(msg)
    assert decode_e2ap(raw) == msg


def test_every_truncation_is_declined_and_is_an_e2_decode_error(vectors_dir):
    raw = bytes.fromhex(json.loads((vectors_dir / "e2ap_ric_indication.json").read_text())["hex"])
    for n in range(len(raw)):
        with pytest.raises(_fast.Unsupported):
            _fast.decode_ric_indication(raw[:n])
        with pytest.raises(E2DecodeError):
            decode_e2ap(raw[:n])


def test_ie_order_unknown_and_repeated_ies_behave_like_the_reference():
    msg = RicIndication(RicRequestId(1, 2), 2, 1, b"hdr", b"msg", sn=3)
    raw = bytearray(encode_e2ap(msg))
    # IE 29 starts right after the 3-octet SEQUENCE preamble: rename it to an unknown id (reject)
    start = raw.index(b"\x00\x1d\x00\x05")
    for new_id in (b"\x00\x1e", b"\x00\x05", b"\xff\xff"):
        mutated = bytes(raw[:start]) + new_id + bytes(raw[start + 2:])
        assert _check_same(mutated) == "declined"


def test_mutated_bytes_agree_with_the_reference(vectors_dir):
    rng = random.Random(20261129)
    seeds = [bytes.fromhex(json.loads((vectors_dir / "e2ap_ric_indication.json").read_text())["hex"])]
    seeds.append(encode_e2ap(RicIndication(RicRequestId(1, 2), 3, 4, bytes(150), bytes(range(200)), sn=9,
                                           call_process_id=b"cp")))
    verdicts = {"accepted": 0, "declined": 0}
    for _ in range(400):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            i = rng.randrange(len(raw))
            if op < 0.6:
                raw[i] ^= 1 << rng.randrange(8)
            elif op < 0.8:
                raw[i] = rng.randrange(256)
            elif op < 0.9:
                del raw[i]
            else:
                raw.insert(i, rng.randrange(256))
        verdicts[_check_same(bytes(raw))] += 1
    # bit flips inside the opaque header/message bytes keep the PDU valid: both outcomes must occur
    assert verdicts["accepted"] > 0 and verdicts["declined"] > 0


def test_unchecked_build_equals_the_checked_one_and_falls_back_when_it_cannot():
    values = (RicRequestId(7, 9), 3, 1, b"h", b"m", 5, "report", None)
    built = _fast.build_unchecked(RicIndication, _fast._INDICATION_FIELDS, values)
    assert type(built) is RicIndication
    assert built == RicIndication(*values) and hash(built) == hash(RicIndication(*values))
    assert repr(built) == repr(RicIndication(*values))
    with pytest.raises(AttributeError):          # still frozen
        built.sn = 6
    # names that are not the class's fields, or a slotted class: the checked constructor runs (and checks)
    with pytest.raises((ValueError, TypeError)):
        _fast.build_unchecked(RicRequestId, ("instance", "requestor"), (70000, 1))

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    assert _fast.build_unchecked(Slotted, ("a",), (1,)) == Slotted(1)
    with pytest.raises(ValueError):
        _fast.build_unchecked(Slotted, ("a",), (-1,))
